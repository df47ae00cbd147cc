"""SP0791: the interpreter reports an access that races with an asynchronous tcgen05.mma / copy
(frontend/interp/tcgen05_async.py; PTX ISA 9.7.16.6): a TMEM read with no commit after the MMA,
with a commit but no wait, with a wait on another mbarrier or without tcgen05.fence_after, and a
shared-memory operand overwritten before the MMA's commit was waited for. The correct
warp-specialized pattern (one warp issues and commits, the epilogue waits, fences, loads) runs and
computes the float64 product; so do the shipped kernels (their own tests), and a shipped kernel
with its epilogue fence removed is caught, on one CTA and on a CTA pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.interp.values import TMEM_RACE, InterpreterError

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
M, N, K = 128, 64, 64

SINGLE = """\
@kernel(num_warps=4)
def k(A: tensor[f16, 2], B: tensor[f16, 2], C: ptr[f32]):
    a_s = smem.alloc(f16, (128, 64), swizzle=128)
    b_s = smem.alloc(f16, (64, 64), swizzle=128)
    bars = mbarrier.alloc(2)
    acc = tmem.alloc(f32, (128, 64))
    mbarrier.expect(bars[0], 128 * 64 * 2 + 64 * 64 * 2)
    tma.load(A, (0, 0), a_s, bars[0])
    tma.load(B, (0, 0), b_s, bars[0])
    mbarrier.wait(bars[0], 0)
    tcgen05.mma(a_s, b_s, acc, accumulate=False)
SYNC
    c = acc.load()
    store(C + arange(0, 128)[:, None] * 64 + arange(0, 64)[None, :], c)
"""

SPECIALIZED = """\
def epilogue(C, acc, acc_bar, other):
    mbarrier.wait(WAITED, 0)
    FENCE
    c = acc.load()
    store(C + arange(0, 128)[:, None] * 64 + arange(0, 64)[None, :], c)


def issuer(A, B, a_s, b_s, load_bar, acc, acc_bar, other):
    mbarrier.expect(load_bar, 128 * 64 * 2 + 64 * 64 * 2)
    tma.load(A, (0, 0), a_s, load_bar)
    tma.load(B, (0, 0), b_s, load_bar)
    mbarrier.wait(load_bar, 0)
    tcgen05.mma(a_s, b_s, acc, accumulate=False)
    tcgen05.commit(acc_bar)
    mbarrier.arrive(other)


@kernel(num_warps=5)
def k(A: tensor[f16, 2], B: tensor[f16, 2], C: ptr[f32]):
    a_s = smem.alloc(f16, (128, 64), swizzle=128)
    b_s = smem.alloc(f16, (64, 64), swizzle=128)
    bars = mbarrier.alloc(3)
    acc = tmem.alloc(f32, (128, 64))
    warp_specialize(
        partition(epilogue, C, acc, bars[1], bars[2], warps=4),
        partition(issuer, A, B, a_s, b_s, bars[0], acc, bars[1], bars[2], warps=1),
    )
"""


def operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    return a, b, np.full((M, N), np.nan, np.float32), a.astype(np.float64) @ b.astype(np.float64).T


def run(src: str) -> tuple[np.ndarray, np.ndarray]:
    a, b, c, ref = operands()
    sp.loads(src, "race.spk").k.interpret[(1,)](a, b, c)
    return c, ref


def fault(src: str, needle: str) -> InterpreterError:
    """The SP0791 the run raises, located at the line holding ``needle`` (column of its start)."""
    with pytest.raises(InterpreterError) as info:
        run(src)
    e = info.value
    assert e.code == TMEM_RACE, str(e)
    (line,) = [i + 1 for i, ln in enumerate(src.splitlines()) if needle in ln]
    assert (e.span.line, e.span.col) == (line, src.splitlines()[line - 1].index(needle) + 1), str(e)
    assert e.program == (0, 0, 0)
    return e


def single(sync: str) -> str:
    return SINGLE.replace("SYNC", "\n".join("    " + s for s in sync.splitlines()) if sync else "")


def test_read_without_commit():
    e = fault(single(""), "acc.load()")
    assert "`tcgen05.ld` reads TMEM that the `tcgen05.mma` at line 11 writes asynchronously, and no " \
           "`tcgen05.commit` has followed it" in e.message
    assert e.help.startswith("commit the MMA to an mbarrier and wait on it before reading the accumulator")
    assert str(e).startswith("error[SP0791]: race.spk:13:9: ")


def test_commit_without_wait():
    e = fault(single("tcgen05.commit(bars[1])\ntcgen05.fence_after()"), "acc.load()")
    assert "it was committed to an mbarrier at line 12 (phase 0, parity 0), but this thread has not waited for " \
           "that phase" in e.message


def test_store_into_the_accumulator_in_flight():
    e = fault(single("acc.store(zeros((128, 64), f32))\ntcgen05.commit(bars[1])"), "acc.store(")
    assert e.message.startswith("`tcgen05.st` overwrites TMEM that the `tcgen05.mma` at line 11")


def test_wait_without_fence():
    e = fault(single("tcgen05.commit(bars[1])\nmbarrier.wait(bars[1], 0)"), "acc.load()")
    assert "the wait at line 13 saw its commit's phase complete, but no `tcgen05.fence_after()` followed" in e.message


def test_operand_overwritten_before_the_wait():
    """Shared memory an MMA reads is rewritten after the commit, before the wait on its phase."""
    e = fault(single("tcgen05.commit(bars[1])\na_s.store(zeros((128, 64), f16))\nmbarrier.wait(bars[1], 0)\n"
                     "tcgen05.fence_after()"), "a_s.store(")
    assert e.message.startswith("`smem store` overwrites shared memory that the `tcgen05.mma` at line 11 reads "
                                "asynchronously; it was committed")
    assert "wait on the mbarrier the MMA (or copy) was committed to" in e.help


def test_single_thread_with_commit_wait_and_fence_is_exact():
    c, ref = run(single("tcgen05.commit(bars[1])\nmbarrier.wait(bars[1], 0)\ntcgen05.fence_after()\n"
                        "a_s.store(zeros((128, 64), f16))"))
    assert np.abs(c - ref).max() <= 1e-3 * np.abs(ref).max()


def specialized(waited: str = "acc_bar", fence: bool = True) -> str:
    fence_line = "    tcgen05.fence_after()\n" if fence else ""
    return SPECIALIZED.replace("WAITED", waited).replace("    FENCE\n", fence_line)


def test_epilogue_waiting_on_another_mbarrier():
    """The issuing warp signals `other` with a plain arrival after its commit: the epilogue that waits
    on it runs after the MMA was issued, not after it completed."""
    e = fault(specialized(waited="other"), "acc.load()")
    assert "committed to an mbarrier at line 14 (phase 0, parity 0), but this thread has not waited" in e.message
    assert "its wait at line 2 is on another mbarrier" in e.message


def test_epilogue_without_fence():
    e = fault(specialized(fence=False), "acc.load()")
    assert "the wait at line 2 saw its commit's phase complete, but no `tcgen05.fence_after()`" in e.message


def test_epilogue_waiting_on_the_commit_is_exact():
    """The normal pattern: the MMA warp commits, the epilogue partition waits, fences and loads."""
    for _ in range(3):  # partitions are threads: several interleavings
        c, ref = run(specialized())
        assert np.abs(c - ref).max() <= 1e-3 * np.abs(ref).max()


def without_epilogue_fence(name: str) -> str:
    src = (KERNELS / name).read_text()
    fence = "    mbarrier.wait(acc_full[0], 0)\n    tcgen05.fence_after()\n"
    assert src.count(fence) == 1
    return src.replace(fence, "    mbarrier.wait(acc_full[0], 0)\n")


@pytest.mark.parametrize("name,grid", [("sparse_gemm_sm100.spk", 1), ("sparse_gemm_sm100_2cta.spk", 2)])
def test_shipped_kernel_without_its_epilogue_fence_is_caught(name, grid):
    """The check engages on the shipped kernels (whose own tests run clean): with the epilogue's
    tcgen05.fence_after removed, the accumulator load is reported, for a CTA pair too."""
    from sparsile.stdlib import sparsity as S

    rows = 128 * grid
    rng = np.random.default_rng(1)
    w = S.prune(rng.standard_normal((rows, 128)).astype(np.float16), "f16")
    vals, idx = S.compress(w, "f16")
    meta = np.asarray(S.encode_metadata(idx, "tcgen05", "f16", k=128).data).reshape(-1, 4)
    b = rng.standard_normal((256, 128)).astype(np.float16)
    c = np.full((rows, 256), np.nan, np.float16)
    src = without_epilogue_fence(name)
    mod = sp.loads(src, name)
    with pytest.raises(InterpreterError) as info:
        mod.sparse_gemm_f16.interpret[(grid,)](vals, meta, b, c, rows, 256, 128, BN=256)
    assert info.value.code == TMEM_RACE, str(info.value)
    assert "no `tcgen05.fence_after()` followed that wait" in info.value.message
    assert "c = acc_t.slice(1, j * EPI_N, EPI_N).load()" in src.splitlines()[info.value.span.line - 1]
