"""SP0370 (frontend/legality/wgmma_inflight.py): sparse wgmma groups may stay in flight
(``hopper.wgmma_wait(n > 0)``) as long as no register that one of them reads as metadata is written
before the wait that retires it.

Each accepted program here keeps a sparse group in flight (``wgmma_wait(n > 0)`` right after a
sparse wgmma: the blanket SP0370 rule it replaces rejected all of them, which
:func:`old_rule_rejects` checks); each rejected one gives exactly the listed diagnostics. Both are
checked again on the PTX LLVM makes of them, by an independent analysis of the PTX's
control-flow graph (backend/toolchain/ptx_inflight.py): no hazard in the accepted programs, and a real
write of an in-flight metadata register in each rejected one, compiled with the rule switched off.
The accepted programs also assemble with ptxas where it is installed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import sparsile as sp
from sparsile.backend.toolchain.ptx_inflight import metadata_hazards
from sparsile.frontend.diagnostics import CompileError, Severity
from sparsile.frontend.ir.core import Function
from sparsile.frontend.legality import wgmma_inflight
from sparsile.tests.support import compile_src, signature

HEAD = """\
@kernel(num_warps=4)
def k(E: ptr[u32], C: ptr[f32], n: i32):
    a = smem.alloc(f16, (64, 32), swizzle=64)
    b = smem.alloc(f16, (64, 64), swizzle=128)
    rows = arange(0, 64)
    at = E + rows[:, None] * 2 + arange(0, 2)[None, :]
    acc = zeros((64, 64), f32)
{body}
    acc = hopper.wgmma_wait(0, acc)
    store(C + rows[:, None] * 64 + arange(0, 64)[None, :], acc)
"""
FIRST = 8
"""The line of the body's first statement."""

ACCEPTED = {
    # three metadata sets, the loop unrolled by three: each set is reloaded right after the wait
    # that retires the MMA reading it (the scheme of sparse_gemm_sm90.spk's INFLIGHT = 1)
    "three sets": """\
    ma = load(at)
    mb = load(at + 128)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=ma)
        acc = hopper.wgmma_wait(1, acc)
        mc = load(at + (3 * kk + 2) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=mb)
        acc = hopper.wgmma_wait(1, acc)
        ma = load(at + (3 * kk + 3) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=mc)
        acc = hopper.wgmma_wait(1, acc)
        mb = load(at + (3 * kk + 4) * 128)""",
    # two sets, each loaded only after the wait that retired the MMA reading its previous value
    "two sets, loaded after the retiring wait": """\
    me = load(at)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=me)
        acc = hopper.wgmma_wait(1, acc)
        mo = load(at + (2 * kk + 1) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=mo)
        acc = hopper.wgmma_wait(1, acc)
        me = load(at + (2 * kk + 2) * 128)""",
    "straight-line code": """\
    m0 = load(at)
    m1 = load(at + 128)
    acc = hopper.wgmma(a, b, acc, a_meta=m0)
    acc = hopper.wgmma(a, b, acc, a_meta=m1)
    acc = hopper.wgmma_wait(1, acc)
    m2 = load(at + 256)
    acc = hopper.wgmma(a, b, acc, a_meta=m2)
    acc = hopper.wgmma_wait(2, acc)""",
    "metadata loaded once": """\
    m = load(at)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)""",
    # an `if` chooses the metadata before any MMA is in flight
    "metadata chosen by an if": """\
    if n > 4:
        m = load(at)
    else:
        m = load(at + 128)
    acc = hopper.wgmma(a, b, acc, a_meta=m)
    acc = hopper.wgmma_wait(1, acc)
    acc = hopper.wgmma(a, b, acc, a_meta=m)
    acc = hopper.wgmma_wait(1, acc)""",
    # a dense group committed after a sparse one counts: wait(2) then retires the first sparse one
    "a dense group between sparse ones": """\
    a2 = smem.alloc(f16, (64, 64), swizzle=128)
    m0 = load(at)
    m = load(at + 128)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma(a2, b, acc)
        acc = hopper.wgmma(a, b, acc, a_meta=m0)
        acc = hopper.wgmma_wait(2, acc)
        m = load(at + kk * 128)""",
}

FOR_LOOP = "is reassigned at the end of each iteration of this loop while a sparse wgmma that reads it as metadata " \
           "may still be in flight"
REDEFINES = "this redefines the metadata of a sparse wgmma that may still be in flight"


def shares(name: str | None, what: str = "this value") -> str:
    held = f"`{name}`, the metadata" if name else "the metadata"
    return (f"{what} may share a register with {held} of a sparse wgmma that may still be in flight (one register "
            "may hold the values a loop or an `if` assigns to one variable, and a value and one it passes on "
            "unchanged)")


# name -> (body, [(line in the body from 0, column, message), ...] in source order)
REJECTED = {
    # the rotation measured on the H200: `meta` is reassigned at the back edge while its MMA runs
    "rotation": ("""\
    meta = load(at)
    for kk in range(0, n):
        meta_next = load(at + (kk + 1) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=meta)
        acc = hopper.wgmma_wait(1, acc)
        meta = meta_next""", [(1, 5, f"`meta` {FOR_LOOP}"), (2, 21, shares("meta"))]),
    # a value defined in the loop body, read by an MMA that stays in flight into the next iteration
    "body value in flight across the back edge": ("""\
    for kk in range(0, n):
        m = load(at + kk * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)""", [(1, 13, REDEFINES)]),
    # two sets, each reloaded before the wait that retires the MMA reading it
    "reload before the retiring wait": ("""\
    me = load(at)
    mo = load(at + 128)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=me)
        acc = hopper.wgmma_wait(1, acc)
        me = load(at + (2 * kk + 2) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=mo)
        acc = hopper.wgmma_wait(1, acc)
        mo = load(at + (2 * kk + 3) * 128)""",
        [(2, 5, f"`mo` {FOR_LOOP}"), (5, 14, shares("me")), (8, 14, shares("mo"))]),
    # the two-set scheme above, accepted with wait(1), leaves two groups in flight with wait(2)
    "wait(2) with two sets": ("""\
    me = load(at)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=me)
        acc = hopper.wgmma_wait(2, acc)
        mo = load(at + (2 * kk + 1) * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=mo)
        acc = hopper.wgmma_wait(2, acc)
        me = load(at + (2 * kk + 2) * 128)""",
        [(1, 5, f"`me` {FOR_LOOP}"), (4, 14, REDEFINES), (7, 14, shares("me"))]),
    # chained sparse MMAs without a wait in the loop: every one is in flight when the next
    # iteration redefines the metadata (the old rule, which looked only at waits, let this pass)
    "no wait in the loop": ("""\
    for kk in range(0, n):
        m = load(at + kk * 128)
        acc = hopper.wgmma(a, b, acc, a_meta=m)""", [(1, 13, REDEFINES)]),
    "an if reloads the metadata of an MMA in flight": ("""\
    m = load(at)
    for kk in range(0, n):
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)
        if kk % 2 == 0:
            m = load(at + kk * 128)""", [(1, 5, f"`m` {FOR_LOOP}"),
                                         (4, 9, shares("m", "the value assigned at the end of this `if`")),
                                         (5, 17, shares("m"))]),
    # `m` may be `raw`'s register (LLVM folds `raw + 0`), which the next iteration's load rewrites
    # while the MMA reading `m` still runs
    "metadata passed on from a value reloaded in flight": ("""\
    for kk in range(0, n):
        raw = load(at + kk * 128)
        acc = hopper.wgmma_wait(0, acc)
        m = raw + 0
        acc = hopper.wgmma(a, b, acc, a_meta=m)
        acc = hopper.wgmma_wait(1, acc)""", [(1, 15, shares(None))]),
    "a while loop": ("""\
    meta = load(at)
    kk = 0
    while kk < n:
        acc = hopper.wgmma(a, b, acc, a_meta=meta)
        acc = hopper.wgmma_wait(1, acc)
        meta = load(at + kk * 128)
        kk = kk + 1""", [(2, 5, f"`meta` {FOR_LOOP}"), (5, 16, shares("meta"))]),
}


def kernel_ir(body: str) -> Function:
    kern = sp.loads(HEAD.format(body=body), "case.spk").kernels["k"]
    bindings, _ = kern.signature_bindings(signature(kern))
    return kern.fresh_ir(bindings)


def old_rule_rejects(func: Function) -> bool:
    """The blanket SP0370 of the `hopper.wgmma_wait` builtin: any wait with pending > 0 of a sparse
    wgmma's accumulator."""
    for op in func.walk():
        if op.name == "hopper.wgmma_wait" and op.attrs["pending"] > 0:
            src = op.operands[0].owner
            if src is not None and src.name == "hopper.wgmma" and src.attrs.get("sparse"):
                return True
    return False


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_accepted(name: str) -> None:
    body = ACCEPTED[name]
    assert old_rule_rejects(kernel_ir(body)), "the blanket rule accepted it already: not a test of the analysis"
    assert wgmma_inflight.sparse_metadata_diagnostics(kernel_ir(body)) == []
    ptx = compile_src(HEAD.format(body=body), stop_after="ptx").ptx
    assert "wgmma.mma_async.sp" in ptx and "wgmma.wait_group.sync.aligned 0;" in ptx
    assert any(f"wgmma.wait_group.sync.aligned {n};" in ptx for n in (1, 2))
    assert metadata_hazards(ptx) == []


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="no ptxas on this machine")
@pytest.mark.parametrize("name", ["three sets", "two sets, loaded after the retiring wait"])
def test_accepted_assembles(name: str, tmp_path) -> None:
    path = tmp_path / "k.ptx"
    path.write_text(compile_src(HEAD.format(body=ACCEPTED[name]), stop_after="ptx").ptx)
    out = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(path), "-o", str(tmp_path / "k.cubin")],
                         capture_output=True, text=True, check=True)
    assert "0 bytes spill stores" in out.stderr


@pytest.mark.parametrize("name", list(REJECTED))
def test_rejected(name: str) -> None:
    body, want = REJECTED[name]
    with pytest.raises(CompileError) as info:
        compile_src(HEAD.format(body=body), stop_after="ir")
    errs = [d for d in info.value.diagnostics if d.severity is Severity.ERROR]
    got = [(d.code, d.span.line - FIRST, d.span.col, d.message) for d in errs]
    assert got == [("SP0370", line, col, msg) for line, col, msg in want], info.value.render()
    for d in errs:
        assert d.help and "hopper.wgmma_wait(0, acc)" in d.help and "its own metadata variable" in d.help
        assert d.labels[0].message == "the sparse wgmma reading that metadata"
        wgmma_line = body.splitlines()[d.labels[0].span.line - FIRST]
        assert "hopper.wgmma(a, b, acc, a_meta=" in wgmma_line


@pytest.mark.parametrize("name", list(REJECTED))
def test_rejected_programs_do_overwrite_metadata_in_flight(name: str, monkeypatch) -> None:
    """With the rule switched off, LLVM's PTX of each rejected program writes a register that a
    sparse wgmma in flight reads as metadata: the diagnostics are not false alarms here."""
    from sparsile.backend.toolchain import ptx_inflight

    monkeypatch.setattr(wgmma_inflight, "sparse_metadata_diagnostics", lambda func: [])
    monkeypatch.setattr(ptx_inflight, "check_ptx", lambda *args: None)  # (the compiler's own PTX check)
    ptx = compile_src(HEAD.format(body=REJECTED[name][0]), stop_after="ptx", cache=False).ptx
    assert metadata_hazards(ptx)


def test_the_wait_that_leaves_it_in_flight_is_labelled() -> None:
    body = REJECTED["body value in flight across the back edge"][0]
    with pytest.raises(CompileError) as info:
        compile_src(HEAD.format(body=body), stop_after="ir")
    d = info.value.diagnostics[0]
    assert [(lab.span.line - FIRST, lab.message) for lab in d.labels] == [
        (2, "the sparse wgmma reading that metadata"),
        (3, "this `hopper.wgmma_wait(1, ...)` leaves it in flight")]
    assert d.notes and "wgmma.wait_group that retires it" in d.notes[0]


def test_the_builtin_no_longer_rejects_pending_sparse_groups() -> None:
    """`hopper.wgmma_wait(1, ...)` after a sparse wgmma passes sema (the interpreter runs it); the
    legality pass decides (it accepts this straight-line program)."""
    body = ACCEPTED["straight-line code"]
    assert compile_src(HEAD.format(body=body), stop_after="ir")
