"""Programmatic dependent launch in the language (frontend/ops/grid_dependency.py, its legality rule
and lowering): the PTX of `pdl.wait()` / `pdl.launch_dependents()` on sm_90a and sm_100a, loads kept
after the wait, SP0602 on older targets, SP0590 for a `pdl=True` kernel that never waits (code,
message, span), and the interpreter's no-op semantics."""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.diagnostics import CompileError
from sparsile.target.targets import get_target

SIG = {"X": sp.ptr[sp.f32], "Y": sp.ptr[sp.f32], "N": sp.i32}

ADD_ONE = """
@kernel(num_warps=4{options})
def k(X: ptr[f32], Y: ptr[f32], N: i32):
    pdl.launch_dependents()
    offs = program_id(0) * 128 + arange(0, 128)
    pdl.wait()
    store(Y + offs, load(X + offs, mask=offs < N) + 1.0, mask=offs < N)
"""


def compile_ptx(src: str, target: str):
    return sp.loads(src, "case.spk").k.compile(SIG, target=target, stop_after="ptx")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("options", ["", ", pdl=True"])
def test_ptx_has_griddepcontrol_before_the_loads(target, options):
    text = compile_ptx(ADD_ONE.format(options=options), target).ptx
    lines = text.splitlines()
    launch = [i for i, ln in enumerate(lines) if "griddepcontrol.launch_dependents;" in ln]
    wait = [i for i, ln in enumerate(lines) if "griddepcontrol.wait;" in ln]
    loads = [i for i, ln in enumerate(lines) if re.search(r"\bld\.global", ln)]
    stores = [i for i, ln in enumerate(lines) if re.search(r"\bst\.global", ln)]
    assert len(launch) == 1 and len(wait) == 1 and loads and stores
    assert launch[0] < wait[0] < min(loads) and wait[0] < min(stores)  # nothing moved above the wait
    if ptxas_available():
        proc = assemble_with_ptxas(text, get_target(target))
        assert proc.returncode == 0, proc.stderr


def test_older_targets_refuse_the_builtins_at_their_line():
    with pytest.raises(CompileError) as info:
        compile_ptx(ADD_ONE.format(options=""), "sm_80")
    diags = info.value.diagnostics
    assert [d.code for d in diags] == ["SP0602", "SP0602"]
    assert "`pdl.launch_dependents` (programmatic dependent launch)" in diags[0].message
    assert "sm_80" in diags[0].message
    assert (diags[0].span.line, diags[0].span.col) == (4, 5)
    assert (diags[1].span.line, diags[1].span.col) == (6, 5)


def test_a_pdl_kernel_that_never_waits_is_sp0590():
    src = ADD_ONE.format(options=", pdl=True").replace("    pdl.wait()\n", "")
    with pytest.raises(CompileError) as info:
        compile_ptx(src, "sm_90a")
    (d,) = info.value.diagnostics
    assert d.code == "SP0590"
    assert d.message.startswith("`k` is compiled with pdl=True, so it may start before the previous kernel")
    assert "never calls pdl.wait()" in d.message
    assert (d.span.line, d.span.col) == (3, 1)  # the kernel's `def`
    assert "call pdl.wait() before" in d.help


def test_a_wait_in_a_branch_counts():
    src = ADD_ONE.format(options=", pdl=True").replace("    pdl.wait()\n", "    if N > 0:\n        pdl.wait()\n")
    assert "griddepcontrol.wait;" in compile_ptx(src, "sm_90a").ptx


def test_a_pdl_kernel_needs_sm90():
    with pytest.raises(CompileError) as info:
        compile_ptx(ADD_ONE.format(options=", pdl=True").replace("    pdl.launch_dependents()\n", "")
                    .replace("    pdl.wait()\n", ""), "sm_80")
    codes = [d.code for d in info.value.diagnostics]
    assert codes == ["SP0602"]
    assert "a kernel compiled with pdl=True" in info.value.diagnostics[0].message


def test_without_pdl_a_kernel_may_still_wait():
    """No pdl=True: griddepcontrol.wait returns at once on the GPU; the kernel compiles unchanged."""
    text = compile_ptx(ADD_ONE.format(options=""), "sm_90a").ptx
    assert "griddepcontrol.wait;" in text


def test_interpreter_runs_them_as_no_ops():
    k = sp.loads(ADD_ONE.format(options=""), "case.spk").k
    rng = np.random.default_rng(3)
    x = rng.standard_normal(300).astype(np.float32)
    y = np.full(300, np.nan, np.float32)
    k.interpret[(3,)](x, y, 300)
    np.testing.assert_array_equal(y, x + np.float32(1))


HELPER = """
def body(X, Y, N, WAIT: constexpr):
    offs = program_id(0) * 128 + arange(0, 128)
    if WAIT:
        pdl.wait()
    store(Y + offs, load(X + offs, mask=offs < N) + 1.0, mask=offs < N)


@kernel(num_warps=4, pdl=True)
def k(X: ptr[f32], Y: ptr[f32], N: i32, WAIT: constexpr = 1):
    body(X, Y, N, WAIT)
"""

PARTITIONS = """
def producer(X, N):
    pdl.wait()


def consumer(X, Y, N):
    offs = arange(0, 128)
    store(Y + offs, load(X + offs, mask=offs < N), mask=offs < N)


@kernel(num_warps=5, pdl=True)
def k(X: ptr[f32], Y: ptr[f32], N: i32):
    warp_specialize(partition(consumer, X, Y, N, warps=4), partition(producer, X, N, warps=1))
"""


def sp0590_span(src: str, sig: dict) -> tuple[int, int]:
    with pytest.raises(CompileError) as info:
        sp.loads(src, "case.spk").k.compile(sig, target="sm_90a", stop_after="ptx")
    (d,) = info.value.diagnostics
    assert d.code == "SP0590" and "never calls pdl.wait()" in d.message
    return d.span.line, d.span.col


def test_a_wait_in_a_helper_counts_unless_a_constexpr_drops_it():
    """The rule reads the kernel's IR, helpers inlined: a wait in a helper counts; one under a
    constexpr branch that is not taken (the decode kernel's `if PDL:`) is not there."""
    kernel = sp.loads(HELPER, "case.spk").k
    assert "griddepcontrol.wait;" in kernel.compile(SIG, target="sm_90a", stop_after="ptx").ptx
    assert sp0590_span(HELPER, {**SIG, "WAIT": 0}) == (10, 1)  # the kernel's def


def test_a_wait_in_one_warp_specialize_partition_counts():
    assert "griddepcontrol.wait;" in sp.loads(PARTITIONS, "case.spk").k.compile(
        SIG, target="sm_90a", stop_after="ptx").ptx
    assert sp0590_span(PARTITIONS.replace("    pdl.wait()\n", "    pass\n"), SIG) == (12, 1)  # the kernel's def
