"""SP0370 on the generated PTX (backend/toolchain/ptx_inflight.py): programs whose IR keeps every
in-flight metadata value apart, but whose PTX LLVM builds with one register for an in-flight
metadata value and another value (a phi it makes when it sinks an op both branches of an ``if``
share, a value it coalesces with one computed from it unchanged, a constant it re-materializes in
a loop). The IR rule (frontend/legality/wgmma_inflight.py) accepts them; the compile reports SP0370
at the first ``hopper.wgmma_wait(n > 0)``. Each was found by a review on the PTX (an H200 runs such
code with wrong results: benchmarks/RESULTS.md, second session)."""

from __future__ import annotations

import pytest

from sparsile.backend.toolchain import ptx_inflight
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.legality import wgmma_inflight
from sparsile.tests.frontend.test_legality_wgmma_inflight import ACCEPTED, FIRST, HEAD, REJECTED, kernel_ir
from sparsile.tests.support import compile_src

SHARED_BY_LLVM = {
    # LLVM sinks the store both branches share behind a phi of (v, the new load): the load in the
    # else branch writes v's register while the first MMA still reads it
    "a store both branches share": """\
    v = load(at)
    acc = hopper.wgmma(a, b, acc, a_meta=v)
    acc = hopper.wgmma_wait(1, acc)
    if n > 4:
        store(at + 512, v)
    else:
        store(at + 512, load(at + 256))""",
    "an op both branches share": """\
    v = load(at)
    acc = hopper.wgmma(a, b, acc, a_meta=v)
    acc = hopper.wgmma_wait(1, acc)
    if n > 4:
        w = v ^ 5
    else:
        w = load(at + 128) ^ 5
    store(at + 512, w)""",
    "a value passed on unchanged in one branch": """\
    v = load(at)
    acc = hopper.wgmma(a, b, acc, a_meta=v)
    acc = hopper.wgmma_wait(1, acc)
    if n > 4:
        r = v + 0
    else:
        r = load(at + 128)
    acc = hopper.wgmma(a, b, acc, a_meta=r)
    acc = hopper.wgmma_wait(1, acc)""",
    "constant metadata in a loop": """\
    m = full((64, 2), 0x44444444, u32)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)""",
}


def hazards_without_checks(body: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The PTX hazards of ``body`` compiled with both SP0370 checks switched off."""
    monkeypatch.setattr(wgmma_inflight, "sparse_metadata_diagnostics", lambda func: [])
    monkeypatch.setattr(ptx_inflight, "check_ptx", lambda *args: None)
    return ptx_inflight.metadata_hazards(compile_src(HEAD.format(body=body), stop_after="ptx",
                                                           cache=False).ptx)


@pytest.mark.parametrize("name", list(SHARED_BY_LLVM))
def test_registers_llvm_shares_are_sp0370_at_the_wait(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    body = SHARED_BY_LLVM[name]
    if name != "constant metadata in a loop":  # (the IR rule sees no write of a constant)
        assert wgmma_inflight.sparse_metadata_diagnostics(kernel_ir(body)) == []  # the IR rule accepts it
    with pytest.raises(CompileError) as info:
        compile_src(HEAD.format(body=body), stop_after="ptx", cache=False)
    d = info.value.diagnostics[0]
    assert d.code == "SP0370" and len(info.value.diagnostics) == 1
    assert d.message.startswith("the PTX generated for `k` writes a register that a sparse wgmma in flight reads as "
                                "metadata, before the wait that retires it: line ")
    assert d.message.endswith("LLVM gave that register to another value too")
    wait_line, text = next((i, ln) for i, ln in enumerate(body.splitlines()) if "wgmma_wait(1" in ln)
    # the first wait that keeps a group in flight
    assert (d.span.line - FIRST, d.span.col) == (wait_line, text.index("hopper.wgmma_wait") + 1)
    assert d.help == wgmma_inflight.HELP
    assert hazards_without_checks(body, monkeypatch)  # a real write: not a false alarm


@pytest.mark.parametrize("name", list(REJECTED))
def test_what_the_ir_rule_rejects_the_ptx_check_rejects_too(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the IR rule off, every program it rejects is still SP0370, from the PTX."""
    monkeypatch.setattr(wgmma_inflight, "sparse_metadata_diagnostics", lambda func: [])
    with pytest.raises(CompileError) as info:
        compile_src(HEAD.format(body=REJECTED[name][0]), stop_after="ptx", cache=False)
    assert info.value.code == "SP0370" and "the PTX generated for `k`" in info.value.message


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_accepted_programs_pass_the_ptx_check(name: str) -> None:
    ptx = compile_src(HEAD.format(body=ACCEPTED[name]), stop_after="ptx").ptx
    assert ptx_inflight.has_sparse_wgmma(ptx)
    ptx_inflight.check_ptx(ptx, "k")  # raises nothing


def test_the_loop_counter_is_written_at_each_back_edge() -> None:
    """A `for` loop's induction variable is stepped at each back edge: metadata built from it,
    in flight across the back edge, is SP0370 from the IR rule, at the loop."""
    body = """\
    for kk in range(0, n):
        acc = hopper.wgmma_wait(0, acc)
        m = full((64, 2), kk, u32)
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)"""
    diags = wgmma_inflight.sparse_metadata_diagnostics(kernel_ir(body))
    assert [(d.code, d.span.line - FIRST, d.span.col, d.message) for d in diags] == [
        ("SP0370", 0, 5, "the loop's counter is stepped at the end of each iteration of this loop and may share a "
                         "register with the metadata of a sparse wgmma that may still be in flight")]


def test_only_ptx_with_sparse_wgmma_is_looked_at() -> None:
    assert not ptx_inflight.has_sparse_wgmma("wgmma.mma_async.sync.aligned ...;\n"
                                                           "wgmma.wait_group.sync.aligned 1;")
    assert ptx_inflight.has_sparse_wgmma("wgmma.mma_async.sp.sync.aligned ...;\n"
                                                       "wgmma.wait_group.sync.aligned 1;")


LOOP_EXIT_CASES = {
    # a fixed trip count: LLVM puts the loop's exit (wait_group 0) right after the latch's guarded
    # branch, unlabelled; the back edge must carry the state at the branch, not after the exit
    "constant metadata, fixed trip count": """\
    m = full((64, 2), 0x44444444, u32)
    for kk in range(0, 61):
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)""",
}


@pytest.mark.parametrize("name", list(LOOP_EXIT_CASES))
def test_a_loop_exit_after_the_latch_is_its_own_block(name: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_src(HEAD.format(body=LOOP_EXIT_CASES[name]), stop_after="ptx", cache=False)
    assert info.value.code == "SP0370" and "the PTX generated for `k`" in info.value.message


def test_an_mma_after_a_loop_does_not_flow_back_into_it() -> None:
    """A sparse wgmma after a loop, left in flight, is not in flight at the loop's head (found in
    review: its state reached the head through the latch's block, and the loop's load was reported)."""
    body = """\
    m = load(at)
    for kk in range(0, 61):
        m = load(at + kk * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(0, acc)
    acc = hopper.wgmma(a, b, acc, a_meta=m)
    acc = hopper.wgmma_wait(1, acc)
    if n > 4:
        store(at + 512, m)"""
    assert wgmma_inflight.sparse_metadata_diagnostics(kernel_ir(body)) == []
    ptx = compile_src(HEAD.format(body=body), stop_after="ptx", cache=False).ptx
    assert ptx_inflight.metadata_hazards(ptx) == []


def test_statements_across_lines_and_inline_asm_blocks() -> None:
    """A statement spanning lines, and an inline asm block with its braces on lines of their own,
    are read whole; the body ends at the brace that closes the entry."""
    ptx = """\
.visible .entry k(
)
{
\t.reg .b32 %r<9>;
\tld.global.b32 %r1, [%rd1];
\twgmma.mma_async.sp.sync.aligned.m64n64k32.f32.f16.f16
\t\t{%f1, %f2}, %rd2, %rd3,
\t\t%r1, 0, 1, 1, 1, 1, 1;
\twgmma.commit_group.sync.aligned;
\twgmma.wait_group.sync.aligned 1;
\t{
\t.reg .pred p;
\tsetp.ne.b32 p, %r2, 0;
\t}
\tmov.b32 %r1, 7;
\twgmma.wait_group.sync.aligned 0;
\tret;
}
"""
    (hazard,) = ptx_inflight.metadata_hazards(ptx)
    assert hazard.startswith("line 15: mov.b32 %r1, 7 writes %r1 (metadata of the wgmma at line 8)")
