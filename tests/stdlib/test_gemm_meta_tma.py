"""The Hopper sparse GEMM with its metadata streamed by TMA (stdlib/kernels/sparse_gemm_sm90_mt.spk):
the kernels in the interpreter against float64 with a poisoned C (odd and even K-step counts, a
tile's last odd step whose metadata box reaches past K, persistent and CTA-pair grids, e4m3's one
box per step), and the compile for sm_90a: the two K steps' metadata words are one 16-byte shared
load per thread, and no metadata is read from global memory. The H200 runs are in
tests/gpu/test_sparse_gemm_sm90.py."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S
from sparsile.tests.support import compile_stdlib

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}


@pytest.fixture(scope="module")
def mod():
    return sp.load(KERNELS / "sparse_gemm_sm90_mt.spk")


def operands(m: int, n: int, k: int, seed: int, dtype: str):
    """Random non-zero 2:4 operands (values; metadata words padded to a multiple of 4 columns, as
    the TMA's 16-byte row stride needs; b) and the float64 product and sum |a||b|."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (m, k)) * rng.choice((-1.0, 1.0), (m, k))  # no zeros
    w = S.prune_2_4(dense.astype(np.float32)).astype(HOST[dtype])
    vals, idx = S.compress(w, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data)
    meta = np.pad(meta, ((0, 0), (0, -meta.shape[1] % 4)), constant_values=0x44444444)
    b = (rng.uniform(0.5, 2.0, (n, k)) * rng.choice((-1.0, 1.0), (n, k))).astype(HOST[dtype])
    a64, b64 = w.astype(np.float64), b.astype(np.float64)
    return vals, meta, b, a64 @ b64.T, np.abs(a64) @ np.abs(b64).T


def check(c: np.ndarray, ref: np.ndarray, abs_products: np.ndarray, k: int, dtype: str) -> None:
    """f16 rounding of C (2^-11 relative) plus f32 accumulation (K·2^-23·Σ|ab|); e4m3 adds Hopper's
    ~14-bit accumulator ((K/64 + 1)·2^-13·Σ|ab|, as tests/stdlib/test_gemm_api.py)."""
    assert not np.isnan(c.astype(np.float64)).any(), "unwritten output elements"
    acc = k * 2.0 ** -23 * abs_products
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * abs_products
    err = np.abs(c.astype(np.float64) - ref)
    bound = acc + 2.0 ** -11 * (np.abs(ref) + acc) + 2.0 ** -24
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_bf16_mt", 200, 130, 192, 4, 64),   # 2 x 3 tiles on 4 CTAs; 3 K steps: the last box reaches past K
    ("sparse_gemm_bf16_mt", 130, 40, 64, 1, 32),     # one K step only (its box's second half unused); 2 tiles, 1 CTA
    ("sparse_gemm_bf16_mt", 70, 70, 256, 2, 64),     # 4 K steps: two boxes of two steps
    ("sparse_gemm_f16_pair_mt", 300, 70, 320, 2, 64),  # a pair over 2 x 2 double tiles; 5 K steps
    ("sparse_gemm_bf16_pair_mt", 520, 40, 128, 4, 32),  # two pairs; the last pair's second half below M
    ("sparse_gemm_e4m3_pair_mt", 260, 40, 384, 2, 64),  # BK 128: one box per step, 3 steps
])
def test_kernel_matches_float64(mod, kernel, m, n, k, programs, bn):
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    getattr(mod, kernel).interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BN=bn)
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16_pair_mt", "sparse_gemm_e4m3_pair_mt"])
def test_metadata_comes_from_shared_memory(kernel):
    """No metadata load from global memory is left in the consumers; bf16 reads both K steps'
    words of its row in one 16-byte shared load (the two slices of the box, merged)."""
    ptx = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a").ptx
    assert not re.search(r"ld\.global", ptx)
    if kernel.startswith("sparse_gemm_bf16"):
        assert re.search(r"ld\.shared\.v4\.b32", ptx)
    assert "wgmma.mma_async.sp" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,m,n,k,programs", [
    ("sparse_gemm_bf16_pair_mt", 1000, 2000, 1024, None),   # a CTA pair per double tile
    ("sparse_gemm_bf16_pair_mt", 4096, 4096, 4160, 132),    # persistent pairs; 65 K steps: the last box past K
    ("sparse_gemm_f16_pair_mt", 2000, 1000, 1984, 132),     # 31 K steps, ragged M and N
    ("sparse_gemm_bf16_mt", 1000, 600, 768, None),          # one CTA per tile
    ("sparse_gemm_bf16_mt", 4096, 4096, 4096, 132),         # persistent
    ("sparse_gemm_e4m3_pair_mt", 1000, 600, 1024, None),    # one box per K step
])
def test_kernel_on_the_gpu_matches_float64(mod, kernel, m, n, k, programs):
    """On the H200 (the tensor maps of the metadata encoded by the launcher), C poisoned with NaN."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    pair = "_pair" in kernel
    tiles = -(-m // (256 if pair else 128)) * -(-n // 256) * (2 if pair else 1)
    getattr(mod, kernel)[(programs or tiles,)](vals, meta, b, c, m, n, k, meta.shape[1], n)
    check(c, ref, absp, k, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,split", [("bf16", 1000, 128, 4096, 5), ("e4m3", 700, 64, 4224, 3)])
def test_split_k_shares_at_odd_steps_on_the_gpu(dtype, m, n, k, split):
    """Split-K through sparse_matmul with shares of an odd number of K steps (bf16: 64 steps, 13
    per share, so shares start at odd steps and their two-step metadata boxes at 8-byte offsets into
    a row; e4m3: 33 steps, 11 per share): the TMA coordinates, not the addresses, carry the offset."""
    import torch

    from sparsile.stdlib.kernels import plan_sparse_matmul

    vals, meta, b, ref, absp = operands(m, n, k, m + k, dtype)
    tdt = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
    ints = torch.int16 if dtype == "bf16" else torch.uint8
    tv = torch.from_numpy(vals.view(np.int16 if dtype == "bf16" else np.uint8)).cuda().view(ints).view(tdt)
    tb = torch.from_numpy(b.view(np.int16 if dtype == "bf16" else np.uint8)).cuda().view(ints).view(tdt)
    tm = torch.from_numpy(meta.view(np.int32)).cuda()
    plan = plan_sparse_matmul(tv, tm, tb, split_k=split)
    assert plan.kernel.name == f"sparse_gemm_{dtype}_splitk_mt" and plan.grid[1] == split
    c = plan.run()
    torch.cuda.synchronize()
    check(c.cpu().numpy(), ref, absp, k, dtype)
