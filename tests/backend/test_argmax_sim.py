"""``argmax`` / ``argmin`` kernels run whole on the CPU by the warp simulator
(tests/support/warp_sim.py): every thread of the CTA executes the kernel's LLVM IR, with
``shfl.sync.bfly`` and ``bar.sync`` modelled and shared memory checked for races. The indices must
be the interpreter's: the three stages of backend/lower/reduce.py (registers, lane butterflies,
warps through shared memory) together, for the case table of tests/support/argmax_cases.py and the
kernels of tests/support/argmax_patterns.py (several reductions, a loop, 3-D, warp_specialize,
interleaved and broadcast blocked layouts). The IR runs as generated and after the O3 pipeline
that the PTX path runs (tests marked ``o3``), so an optimizer rewrite on the GPU's path runs here too.

The simulator is not the GPU: NVPTX instruction selection, the fp8 ``cvt`` itself (modelled with
ml_dtypes here) and the hardware's scheduling are tests/gpu/test_argmax_gpu.py's.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from sparsile.tests.support import warp_fibers, warp_sim
from sparsile.tests.support.argmax_cases import CASES, FP8_CASES, Case, inputs, reference
from sparsile.tests.support.argmax_patterns import PATTERNS, Pattern

pytestmark = pytest.mark.skipif(not warp_fibers.SUPPORTED, reason="the warp simulator runs on Linux/glibc, "
                                                                 "x86_64 or aarch64")


def _llvm(kernel: object, consts: dict[str, int], num_warps: int) -> tuple[str, int]:
    """The kernel's LLVM IR for sm_90a (uncached: the compile itself is part of what runs here) and
    its shared memory bytes."""
    ck = kernel.compile(consts, target="sm_90a", stop_after="llvm", num_warps=num_warps,  # type: ignore[attr-defined]
                        cache=False)
    return ck.llvm, ck.smem_bytes


@functools.cache
def _case_llvm(case: Case) -> tuple[str, int]:
    """:func:`_llvm` of a case, compiled once for its as-generated and its O3 test (the text is a
    string: neither test can change what the other runs)."""
    return _llvm(case.kernel(), case.consts(), case.num_warps)


@functools.cache
def _pattern_llvm(name: str) -> tuple[str, int]:
    """:func:`_llvm` of the pattern of PATTERNS named ``name`` (names are unique: they are the test
    ids), compiled once for its as-generated and its O3 test."""
    (pattern,) = [p for p in PATTERNS if p.name == name]
    return _llvm(pattern.kernel(), pattern.consts, pattern.num_warps)


def _run_case(case: Case, seed: int, o3: bool, edit: object = None) -> tuple[np.ndarray, np.ndarray]:
    text, smem = _case_llvm(case)
    if o3:
        text = warp_sim.nvptx_optimized(text)
    if callable(edit):
        text = edit(text)
    x = inputs(case, seed)
    got = np.full(case.out_numel(), -1, np.int32)
    warp_sim.run_cta(text, smem, case.num_warps, [x, got])
    return got, reference(case, x)


# every element type, shape, axis, warps and broadcast row among them; fp8 with its cvt modelled (the
# whole table, both ways, took 200 s on two cores: run it with SOME = CASES + FP8_CASES when the
# lowering changes)
SOME = CASES[::8] + FP8_CASES[::2]
SOME += [c for c in CASES if c.dtype not in {s.dtype for s in SOME} and c.num_warps == 8]  # across warps


@pytest.mark.parametrize("o3", [False, True], ids=["as-generated", "o3"])
@pytest.mark.parametrize("case", SOME, ids=lambda c: c.id)
def test_argmax_kernel_on_the_simulator_is_the_interpreters(case: Case, o3: bool) -> None:
    got, want = _run_case(case, 0, o3)
    assert np.array_equal(got, want), f"{case.id}: got {got[:16]} want {want[:16]}"


@pytest.mark.parametrize("o3", [False, True], ids=["as-generated", "o3"])
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_argmax_pattern_on_the_simulator_is_the_interpreters(pattern: Pattern, o3: bool) -> None:
    text, smem = _pattern_llvm(pattern.name)
    x = pattern.inputs(1)
    got = np.full(pattern.out, -1, np.int32)
    warp_sim.run_cta(warp_sim.nvptx_optimized(text) if o3 else text, smem, pattern.num_warps, [x, got])
    want = pattern.reference(x)
    assert np.array_equal(got, want), f"{pattern.name}: got {got[:16]} want {want[:16]}"


# ------------------------------------------------------------------------------------------------
# the simulator can fail: a broken shuffle, a missing barrier, a flipped tie-break

WARPS = Case("f32", (4, 1024), 1, 8)  # registers, all five lane bits and three warp bits along the axis


def test_a_wrong_butterfly_partner_gives_wrong_indices() -> None:
    """Lane bit 0 never combined: warps store different partial results to one slot (a race the
    simulator reports), or, where they agree, the index is wrong."""
    try:
        got, want = _run_case(WARPS, 0, False, lambda t: t.replace("i32 1, i32 31)", "i32 2, i32 31)"))
    except AssertionError as e:
        assert "race" in str(e)
        return
    assert not np.array_equal(got, want)


def test_a_missing_barrier_is_a_race() -> None:
    with pytest.raises(AssertionError, match=r"which no thread wrote|race"):
        _run_case(WARPS, 0, False, lambda t: t.replace("call void @llvm.nvvm.barrier0() #1", ""))


_LOOP = """@kernel
def k(X: ptr[f32], Y: ptr[i32], R: constexpr, C: constexpr, N: constexpr):
    for i in range(0, N):
        x = load(X + i * R * C + arange(0, R)[:, None] * C + arange(0, C)[None, :])
        store(Y + i * C + arange(0, C), argmax(x, axis=0))
"""


def test_a_shared_buffer_reused_without_a_barrier_is_a_race() -> None:
    """A reduction in a loop reuses its buffer every iteration: without the barrier before the
    stores, a fast warp overwrites what a slow one has still to read. With it, no race."""
    loop = Pattern("loop1", _LOOP, (3, 64, 32), 3 * 32, 4, {"R": 64, "C": 32, "N": 3})
    text, smem = _llvm(loop.kernel(), loop.consts, loop.num_warps)
    call = "call void @llvm.nvvm.barrier0() #1"
    assert text.count(call) == 2
    x = loop.inputs(0)
    got = np.full(loop.out, -1, np.int32)
    warp_sim.run_cta(text, smem, loop.num_warps, [x, got])
    assert np.array_equal(got, loop.reference(x))
    with pytest.raises(AssertionError, match="race"):
        warp_sim.run_cta(text.replace(call, "", 1), smem, loop.num_warps, [x, got])


def test_a_flipped_tie_break_gives_a_later_index() -> None:
    case = Case("f32", (32, 64), 1, 4)
    got, want = _run_case(case, 0, False, lambda t: re.sub(r"icmp slt i32", "icmp sgt i32", t, count=1))
    assert not np.array_equal(got, want)
