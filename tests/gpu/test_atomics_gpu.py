"""The atomic builtins on the GPU (docs/language.md §"Atomics"): a histogram whose bins collide
within and across CTAs, with a replicated layout (a 16-element tile on 4 warps) that must update
each element once, and a split-K style accumulation of f32 partial products into one output, both
against numpy / float64 on random non-zero inputs with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu

SRC = '''
@kernel(num_warps=4)
def histogram(x: ptr[i32], bins: ptr[i32], old: ptr[i32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    b = load(x + offs, mask=m)
    o = atomic_add(bins + b, 1, mask=m, sem="relaxed")
    store(old + offs, o, mask=m)

@kernel(num_warps=4)
def splitk(a: ptr[f32], b: ptr[f32], c: ptr[f32], M: i32, K: i32, BM: constexpr, BK: constexpr):
    rows = program_id(0) * BM + arange(0, BM)
    ks = program_id(1) * BK + arange(0, BK)
    m = (rows[:, None] < M) & (ks[None, :] < K)
    part = sum(load(a + rows[:, None] * K + ks[None, :], mask=m) * load(b + ks[None, :], mask=ks[None, :] < K), axis=1)
    atomic_add(c + rows, part, mask=rows < M)

@kernel(num_warps=4)
def tickets(counter: ptr[i32], out: ptr[i32]):
    t = atomic_add(counter, 1)
    store(out + program_id(0), t)
'''


@pytest.fixture(scope="module")
def mod():
    return sp.loads(SRC, "atomics_gpu.spk")


@pytest.mark.parametrize("block", [16, 256])
def test_histogram_with_colliding_bins(mod, block: int) -> None:
    rng = np.random.default_rng(block)
    n, nbins = 5000, 13
    x = rng.integers(0, nbins, n).astype(np.int32)
    bins = rng.integers(1, 100, nbins).astype(np.int32)  # non-zero start
    start = bins.copy()
    old = np.full(n, -12345, np.int32)  # poisoned
    mod.histogram[((n + block - 1) // block,)](x, bins, old, n, BLOCK=block)
    assert np.array_equal(bins, start + np.bincount(x, minlength=nbins))
    # each old value is the bin's count before that increment: per bin, a permutation of the counts
    for b in range(nbins):
        got = np.sort(old[x == b])
        assert np.array_equal(got, start[b] + np.arange(np.count_nonzero(x == b))), b


def test_split_k_accumulation(mod) -> None:
    rng = np.random.default_rng(5)
    M, K = 100, 1000
    a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, K).astype(np.float32)
    c0 = rng.uniform(1, 2, M).astype(np.float32)
    c = c0.copy()
    mod.splitk[((M + 31) // 32, (K + 63) // 64)](a, b, c, M, K, BM=32, BK=64)
    want = c0.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-4)


def test_scalar_counter_hands_out_distinct_tickets(mod) -> None:
    counter = np.array([7], np.int32)
    out = np.full(300, -1, np.int32)
    mod.tickets[(300,)](counter, out)
    assert counter[0] == 307 and np.array_equal(np.sort(out), 7 + np.arange(300))
