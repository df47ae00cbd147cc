"""The explicit-level Blackwell GEMMs (stdlib/kernels/sparse_gemm_sm100.spk and its dense twin).

The interpreter runs every kernel and kind against a float64 reference (random 2:4 / 1:2 operands,
ragged M, N, K, several configurations); these tests always run. The ``gpu`` tests run the same
kernels on a Blackwell GPU (sm_100 / sm_103 / sm_110) and skip elsewhere: none was available when
they were written, so they have never run (docs/blackwell.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S
from sparsile.tests.support.foreign_arch import blackwell as blackwell  # a fixture
from sparsile.tests.support.mma_harness import operands

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
TOOLKIT = {"i8": "s8"}
BN = {"f16": 128, "bf16": 128, "tf32": 128, "e4m3": 256, "i8": 256}
DENSE_BN = {"f16": 256, "bf16": 256, "tf32": 128, "e4m3": 256, "i8": 256}


@pytest.fixture(scope="module")
def sparse():
    return sp.load(KERNELS / "sparse_gemm_sm100.spk")


@pytest.fixture(scope="module")
def dense():
    return sp.load(KERNELS / "dense_gemm_sm100.spk")


def sparse_operands(dtype: str, m: int, n: int, k: int, seed: int):
    """Compressed A values (M, K/2), metadata in the "tcgen05" format as the 2-D view the kernel's
    TMA reads, B (N x K), and the float64 reference (with |A||B| for the accumulation bound)."""
    a, b = operands(dtype, m, n, k, seed)
    dt = TOOLKIT.get(dtype, dtype)
    w = S.prune(a, dt)
    vals, idx = S.compress(w, dt)
    meta = S.encode_metadata(idx, "tcgen05", dt, k=k)
    ref = S.sparse_matmul_reference(vals, meta, b.T)
    absprod = np.abs(w.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    return vals, np.asarray(meta.data).reshape(-1, 4), b, ref, absprod


def check(dtype: str, c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, k: int, gpu: bool = False) -> None:
    """Integers exactly. Floats: output rounding to f16 plus accumulation error; tf32 inputs are
    rounded to 10 mantissa bits (2^-10 of each |a||b|); on a GPU fp8 MMAs may keep fewer
    accumulator bits (Hopper keeps about 14; Blackwell's is not documented), so the bound there is
    looser."""
    if dtype == "i8":
        assert (c.astype(np.int64) == ref.astype(np.int64)).all()
        return
    assert not np.isnan(c).any(), "unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = 2.0 ** -10 * np.abs(ref) + 1e-3 * np.sqrt(k)
    if dtype == "tf32":
        bound += 2.0 ** -9 * absprod
    if gpu and dtype == "e4m3":
        bound += (k // 64) * 2.0 ** -13 * absprod
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


def run_sparse(mod, dtype: str, m: int, n: int, k: int, seed: int = 0, interpret: bool = True, **cfg):
    vals, meta, b, ref, absprod = sparse_operands(dtype, m, n, k, seed)
    c = np.full((m, n), 0 if dtype == "i8" else np.nan, np.int32 if dtype == "i8" else np.float16)
    bn = cfg.get("BN", BN[dtype])
    grid = (((m + 127) // 128) * ((n + bn - 1) // bn),)
    kern = getattr(mod, f"sparse_gemm_{dtype}")
    (kern.interpret if interpret else kern)[grid](vals, meta, b, c, m, n, k, **cfg)
    return c, ref, absprod


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32", "e4m3", "i8"])
def test_sparse_interpreter_matches_reference(sparse, dtype):
    # ragged: partial M, N and K tiles (TMA fills zeros, metadata is padded); rows of whole 16-byte
    # units, as every TMA map needs (SP0714: N = 296, not 300)
    m, n, k = 200, 296, 320
    c, ref, absprod = run_sparse(sparse, dtype, m, n, k, seed=1)
    check(dtype, c, ref, absprod, k)


@pytest.mark.parametrize("cfg", [dict(BN=256, STAGES=2), dict(BN=64, STAGES=3, GROUP_M=2)])
def test_sparse_interpreter_configurations(sparse, cfg):
    c, ref, absprod = run_sparse(sparse, "f16", 300, 264, 640, seed=2, **cfg)  # K = 5 steps through the ring
    check("f16", c, ref, absprod, 640)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32", "e4m3", "i8"])
def test_dense_interpreter_matches_reference(dense, dtype):
    m, n, k = 150, 264, 208  # ragged, in rows of whole 16-byte units (TMA)
    a, b = operands(dtype, m, n, k, 3)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    absprod = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    c = np.full((m, n), 0 if dtype == "i8" else np.nan, np.int32 if dtype == "i8" else np.float16)
    grid = (((m + 127) // 128) * ((n + DENSE_BN[dtype] - 1) // DENSE_BN[dtype]),)
    getattr(dense, f"dense_gemm_{dtype}").interpret[grid](a, b, c, m, n, k)
    check(dtype, c, ref, absprod, k)


# ------------------------------------------------------------------------------------------------
# On a Blackwell GPU (never run: no such GPU was available)
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("f16", 128, 128, 128), ("f16", 1000, 1000, 1024), ("bf16", 1000, 600, 768),
                                         ("tf32", 500, 300, 512), ("e4m3", 1000, 600, 1024), ("f16", 4096, 4096, 4096)])
def test_sparse_gemm_on_blackwell(blackwell, sparse, dtype, m, n, k):
    c, ref, absprod = run_sparse(sparse, dtype, m, n, k, seed=m + n + k, interpret=False)
    check(dtype, c, ref, absprod, k, gpu=True)


@pytest.mark.gpu
def test_sparse_gemm_i8_on_blackwell(blackwell, sparse):
    from sparsile.backend import runtime

    if runtime.current_device().compute_capability == (10, 3):
        pytest.skip("kind::i8 does not exist on sm_103")
    c, ref, absprod = run_sparse(sparse, "i8", 1000, 700, 1024, seed=9, interpret=False)
    check("i8", c, ref, absprod, 1024, gpu=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "e4m3"])
def test_dense_gemm_on_blackwell(blackwell, dense, dtype):
    m, n, k = 1000, 700, 1024
    a, b = operands(dtype, m, n, k, 4)
    c = np.full((m, n), np.nan, np.float16)
    grid = (((m + 127) // 128) * ((n + 255) // 256),)
    getattr(dense, f"dense_gemm_{dtype}")[grid](a, b, c, m, n, k)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    check(dtype, c, ref, np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T, k, gpu=True)
