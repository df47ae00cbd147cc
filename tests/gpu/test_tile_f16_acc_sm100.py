"""A tile-level ``sparse_dot`` with an f16 accumulator and a 128-row tile, which runs on tcgen05 on
sm_100a with D kept in f32 (backend/lower/blackwell_tile.py): each call's f32 sum rounded to f16
once, so partial sums past 65504 inside one call stay finite.

The interpreter tests always run (against float64 references); the ``gpu`` test needs a Blackwell
GPU (sm_100 / sm_103 / sm_110) and skips elsewhere: none was available when it was written."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.stdlib import sparsity as S
from sparsile.tests.backend.test_blackwell_tile import SPARSE_F16_ACC
from sparsile.tests.support.foreign_arch import blackwell as blackwell  # a fixture

BM, BN, BK = 128, 64, 64


@pytest.fixture(scope="module")
def kernel():
    return loads(SPARSE_F16_ACC).sparse_gemm_tile


def overflow_operands(n: int = BN, k: int = 2 * BK):
    """A = 1.0 at positions 0, 1 of every group of four; in each BK call, B's first 32 K columns
    (16 kept products: one sparse f16 instruction) add 16 x 8192 = 131072 (inf in f16) to even
    output columns, the next 32 take back 16 x 8184; odd columns add 16 x 0.5 - 16 x 0.25. Per call
    128 (even) and 4 (odd) exactly: an f16 D rounded per instruction would give inf or NaN."""
    w = np.zeros((BM, k), np.float16)
    w[:, 0::4] = w[:, 1::4] = 1.0
    b = np.empty((n, k), np.float16)
    half = (np.arange(k) % BK) < BK // 2
    b[0::2] = np.where(half, 8192.0, -8184.0)
    b[1::2] = np.where(half, 0.5, -0.25)
    return w, b


def run(kern, w: np.ndarray, b: np.ndarray, interpret: bool) -> np.ndarray:
    vals, idx = S.compress(w)
    meta = np.asarray(S.encode_metadata(idx, "sm90", "f16").data)
    c = np.full((w.shape[0], b.shape[0]), np.nan, np.float16)
    launch = kern.interpret if interpret else kern
    launch[(w.shape[0] // BM, b.shape[0] // BN)](vals, meta, b, c, BM=BM, BN=BN, BK=BK)
    return c


def reference(w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The K loop of the kernel: per BK call, (f16 acc + exact products) rounded to f32, then f16."""
    acc = np.zeros((w.shape[0], b.shape[0]), np.float16)
    for k0 in range(0, w.shape[1], BK):
        part = w[:, k0:k0 + BK].astype(np.float64) @ b[:, k0:k0 + BK].astype(np.float64).T
        acc = (acc.astype(np.float64) + part).astype(np.float32).astype(np.float16)
    return acc


def random_operands(seed: int, m: int = 2 * BM, n: int = 2 * BN, k: int = 3 * BK):
    rng = np.random.default_rng(seed)
    w = S.prune_2_4(rng.standard_normal((m, k)).astype(np.float16))
    return w, rng.standard_normal((n, k)).astype(np.float16)


def test_interpreter_rounds_each_calls_f32_sum_once(kernel):
    w, b = overflow_operands()
    c = run(kernel, w, b, interpret=True)
    assert (c[:, 0::2] == 256.0).all() and (c[:, 1::2] == 8.0).all(), c
    assert (c == reference(w, b)).all()


def test_interpreter_matches_the_float64_reference(kernel):
    w, b = random_operands(7)
    c = run(kernel, w, b, interpret=True)
    assert not np.isnan(c).any()
    np.testing.assert_array_equal(c, reference(w, b))


@pytest.mark.gpu
def test_f16_accumulator_on_blackwell_matches_the_interpreter(blackwell, kernel):
    """Bit for bit on the overflow operands (exact in f32); on random ones the GPU's f32 sum may
    differ from the exact one in its last bit (the tensor core's order and internal precision,
    PTX ISA 9.7.16.10), which can move a call's f16 rounding by one f16 ulp, carried by later calls."""
    w, b = overflow_operands()
    gpu = run(kernel, w, b, interpret=False)
    assert gpu.view(np.uint16).tolist() == run(kernel, w, b, interpret=True).view(np.uint16).tolist()
    w, b = random_operands(8)
    gpu, want = run(kernel, w, b, interpret=False), reference(w, b)
    assert not np.isnan(gpu).any()
    calls = w.shape[1] // BK
    bound = calls * np.spacing(np.maximum(np.abs(gpu), np.abs(want)).astype(np.float16)).astype(np.float64)
    assert (np.abs(gpu.astype(np.float64) - want) <= bound).all()
