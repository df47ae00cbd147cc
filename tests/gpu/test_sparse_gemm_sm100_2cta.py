"""The 2-CTA Blackwell sparse GEMM (stdlib/kernels/sparse_gemm_sm100_2cta.spk): M = 256 per CTA
pair, tcgen05.mma.sp.cta_group::2, B split over the pair, TMA bytes counted on the even CTA's
barrier, commits multicast to both CTAs.

The interpreter runs the kernel's clusters with their CTAs concurrent (frontend/ops/cluster.py)
against a float64 reference (random 2:4 operands, never all zero; NaN-poisoned outputs; ragged
M, N, K, including a last pair whose odd CTA lies wholly below M); these tests always run. The
``gpu`` tests run it on a Blackwell GPU and skip elsewhere: none was available when they were
written, so they have never run (docs/blackwell.md §7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S
from sparsile.tests.support.foreign_arch import blackwell as blackwell  # a fixture

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
DTYPES = ("f16", "bf16", "e4m3", "i8")


@pytest.fixture(scope="module")
def pair():
    return sp.load(KERNELS / "sparse_gemm_sm100_2cta.spk")


def operands(dtype: str, m: int, n: int, k: int, seed: int):
    import ml_dtypes

    host = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}
    rng = np.random.default_rng(seed)
    if dtype == "i8":
        a, b = rng.integers(-90, 90, (m, k)).astype(np.int8), rng.integers(-90, 90, (n, k)).astype(np.int8)
    else:
        a = rng.standard_normal((m, k)).astype(np.float32).astype(host[dtype])
        b = rng.standard_normal((n, k)).astype(np.float32).astype(host[dtype])
    dt = {"i8": "s8"}.get(dtype, dtype)
    w = S.prune(a, dt)
    vals, idx = S.compress(w, dt)
    meta = S.encode_metadata(idx, "tcgen05", dt, k=k)
    ref = S.sparse_matmul_reference(vals, meta, b.T)
    assert np.abs(ref).max() > 0
    return vals, np.asarray(meta.data).reshape(-1, 4), b, ref


def run(mod, dtype: str, m: int, n: int, k: int, seed: int = 0, interpret: bool = True, **cfg):
    vals, meta, b, ref = operands(dtype, m, n, k, seed)
    c = np.full((m, n), 0x7EADBEEF if dtype == "i8" else np.nan, np.int32 if dtype == "i8" else np.float16)
    bn = cfg.get("BN", 256)
    grid = (2 * ((m + 255) // 256) * ((n + bn - 1) // bn),)
    kern = getattr(mod, f"sparse_gemm_{dtype}")
    (kern.interpret if interpret else kern)[grid](vals, meta, b, c, m, n, k, **cfg)
    return c, ref


def check(dtype: str, c: np.ndarray, ref: np.ndarray, k: int) -> None:
    if dtype == "i8":
        assert (c.astype(np.int64) == ref.astype(np.int64)).all()
        return
    assert not np.isnan(c).any(), "unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = 2.0 ** -10 * np.abs(ref) + 1e-3 * np.sqrt(k)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_pair_interpreter_matches_reference(pair, dtype):
    m, n, k = 300, 296, 320  # 2 pairs (the second pair's odd CTA is below M), 2 N tiles, a partial K step
    c, ref = run(pair, dtype, m, n, k, seed=11)
    check(dtype, c, ref, k)


@pytest.mark.parametrize("cfg", [dict(BN=128, STAGES=2), dict(BN=64, STAGES=3, GROUP_M=1)])
def test_pair_interpreter_configurations(pair, cfg):
    c, ref = run(pair, "f16", 520, 200, 640, seed=5, **cfg)  # 5 K steps through the ring, 3 pairs in M
    check("f16", c, ref, 640)


def test_each_cta_reads_its_own_b_half(pair):
    """B's halves scaled differently: reading one half twice, or the halves swapped, would show."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((256, 128)).astype(np.float32).astype(np.float16)
    b = rng.standard_normal((256, 128)).astype(np.float32)
    b[128:] *= 8
    b = b.astype(np.float16)
    vals, idx = S.compress(S.prune(a, "f16"), "f16")
    meta = S.encode_metadata(idx, "tcgen05", "f16", k=128)
    ref = S.sparse_matmul_reference(vals, meta, b.T)
    c = np.full((256, 256), np.nan, np.float16)
    pair.sparse_gemm_f16.interpret[(2,)](vals, np.asarray(meta.data).reshape(-1, 4), b, c, 256, 256, 128)
    check("f16", c, ref, 128)
    swapped = S.sparse_matmul_reference(vals, meta, np.concatenate([b[128:], b[:128]]).T)
    assert not np.allclose(swapped[:, :128], ref[:, :128], rtol=0.1)


# ------------------------------------------------------------------------------------------------
# On a Blackwell GPU (never run: no such GPU was available)
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("f16", 256, 256, 128), ("f16", 1000, 1000, 1024), ("bf16", 1000, 600, 768),
                                         ("e4m3", 1000, 600, 1024), ("f16", 4096, 4096, 4096)])
def test_pair_gemm_on_blackwell(blackwell, pair, dtype, m, n, k):
    c, ref = run(pair, dtype, m, n, k, seed=m + n + k, interpret=False)
    check(dtype, c, ref, k)


@pytest.mark.gpu
def test_pair_gemm_i8_on_blackwell(blackwell, pair):
    from sparsile.backend import runtime

    if runtime.current_device().compute_capability == (10, 3):
        pytest.skip("kind::i8 does not exist on sm_103")
    c, ref = run(pair, "i8", 1000, 700, 1024, seed=9, interpret=False)
    check("i8", c, ref, 1024)
