"""Tile-level ``dot`` / ``sparse_dot`` through warp-level MMAs (backend/lower/mma.py) on the GPU
against float64 references, random operands, ragged shapes, poisoned outputs.

Two builds run on an H200: ``target="sm_90"`` (plain sm_90 has no wgmma, so it takes this path;
its cubin runs natively) and ``target="sm_80"`` loaded as *PTX* that the driver JIT-compiles (a
cubin runs only on its own major architecture: an sm_80 cubin does not load on sm_90, but sm_80
PTX does). On an sm_8x GPU the sm_80 cubin itself would run.

The same kernels and harness run in the interpreter (the CPU tests below), so a GPU failure points
at the lowering, not at the test."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S
from sparsile.tests.support import KERNELS
from sparsile.tests.support.foreign_arch import ptx_when_foreign_arch
from sparsile.tests.support.mma_harness import TOOLKIT, make_kernel, mma_hooks, operands, padded_meta


def run(dtype: str, sparse: bool, m: int, n: int, k: int, seed: int = 0, interpret: bool = False,
        target: str = "sm_80", bm: int = 64, bn: int = 64, bk: int = 64, anchored: bool = False,
        acc: str | None = None):
    """Launch the kernel; returns (C, float64 reference, sum |a||b| per element)."""
    a, b = operands(dtype, m, n, k, seed)
    dt = TOOLKIT.get(dtype, dtype)
    if sparse:
        a = S.prune(a, dt)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    absprod = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    out_t = np.int32 if dtype == "i8" else (np.float16 if acc == "f16" else np.float32)
    c = np.full((m, n), -(2**31) + 7 if dtype == "i8" else np.nan, out_t)
    kern = make_kernel(dtype, sparse, anchored, acc)
    grid = (-(-m // bm), -(-n // bn))
    launch = kern.interpret[grid] if interpret else kern[grid]
    opts = {} if interpret else {"target": target}
    cfg = {"BM": bm, "BN": bn, "BK": bk}
    args = (a, b, c)
    if sparse:
        vals, idx = S.compress(a, dt)
        meta = np.asarray(S.encode_metadata(idx, "sm90", dt).data)
        args = (vals, padded_meta(meta, m, k, bm, bk, 16 if dtype == "tf32" else 32), b, c)
    if interpret:
        launch(*args, **cfg)
    else:
        with ptx_when_foreign_arch(target), mma_hooks(anchored):
            launch(*args, **cfg, **opts)
    return c, ref, absprod


def check(dtype: str, c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, k: int) -> None:
    """i8 exactly; floats: f32 accumulation, each of the (at most K/8) sequential MMAs may round
    (or truncate) the running sum by 2^-23 of sum |a||b| (doubled for margin), plus, for tf32,
    operands rounded to 10 mantissa bits; fp8 MMAs may keep fewer accumulator bits (Hopper: about
    14, DeepSeek-V3 §3.3.2), so their bound is looser. One wrong product (|a||b| ~ 1) still
    exceeds the bound at K = 1024 (about 0.02 there)."""
    if dtype == "i8":
        assert (c.astype(np.int64) == ref.astype(np.int64)).all(), \
            f"{int((c.astype(np.int64) != ref).sum())} wrong elements"
        return
    assert not np.isnan(c).any(), f"{int(np.isnan(c).sum())} unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = (k // 8 + 1) * 2.0 ** -22 * absprod + 1e-6
    if dtype == "tf32":
        bound += 2.0 ** -9 * absprod
    if dtype in ("e4m3", "e5m2"):
        bound += (k // 32 + 1) * 2.0 ** -13 * absprod
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


# ------------------------------------------------------------------------------------------ CPU
@pytest.mark.parametrize("dtype", ["f16", "i8", "tf32"])
@pytest.mark.parametrize("sparse", [False, True])
def test_harness_in_interpreter(dtype, sparse):
    """The kernels and references agree in the interpreter (ragged M, N and K)."""
    m, n, k = 80, 72, 160 if dtype != "tf32" else 96
    c, ref, absprod = run(dtype, sparse, m, n, k, seed=1, interpret=True)
    check(dtype, c, ref, absprod, k)


def check_f16_acc(c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, k: int, bk: int = 64) -> None:
    """An f16 accumulator is rounded to f16 after every ``dot`` (K/BK times): 2^-11 of the
    partial sum (<= sum |a||b|) each time."""
    assert not np.isnan(c).any(), f"{int(np.isnan(c).sum())} unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = (k // bk + 1) * 2.0 ** -11 * absprod + 1e-3
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("sparse", [False, True])
def test_f16_accumulator_harness_in_interpreter(sparse):
    c, ref, absprod = run("f16", sparse, 80, 72, 192, seed=2, interpret=True, acc="f16")
    check_f16_acc(c, ref, absprod, 192)


# ------------------------------------------------------------------------------------------ GPU
SHAPES = [(64, 64, 64), (200, 100, 192), (130, 70, 320), (1000, 1000, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32", "i8"])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("anchored", [False, True], ids=["smem_acc", "anchored_acc"])
def test_warp_mma_on_gpu(anchored, target, sparse, dtype, m, n, k):
    c, ref, absprod = run(dtype, sparse, m, n, k, seed=3, target=target, anchored=anchored)
    check(dtype, c, ref, absprod, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("target", ["sm_90", "sm_89"])
@pytest.mark.parametrize("anchored", [False, True], ids=["smem_acc", "anchored_acc"])
def test_fp8_warp_mma_on_gpu(anchored, target, sparse, dtype):
    c, ref, absprod = run(dtype, sparse, 200, 136, 320, seed=4, target=target, anchored=anchored)
    check(dtype, c, ref, absprod, 320)


@pytest.mark.gpu
@pytest.mark.parametrize("bm,bn,bk", [(128, 128, 64), (64, 128, 128), (32, 64, 32), (16, 32, 64)])
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("anchored", [False, True], ids=["smem_acc", "anchored_acc"])
def test_tile_configurations_on_gpu(anchored, target, bm, bn, bk):
    """Other warp splits: 2 row tiles per warp, 16 column tiles per warp, warps split over N."""
    for sparse in (True, False):
        c, ref, absprod = run("f16", sparse, 150, 190, 256, seed=5, target=target, bm=bm, bn=bn, bk=bk,
                              anchored=anchored)
        check("f16", c, ref, absprod, 256)


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
def test_stdlib_sparse_gemm_tile_on_gpu(target):
    """The shipped tile kernel (f16 out) through warp-level mma.sp."""
    kern = sp.load(KERNELS / "sparse_gemm_tile.spk").sparse_gemm_tile
    m, n, k = 200, 100, 192
    rng = np.random.default_rng(6)
    w = S.prune_2_4(rng.standard_normal((m, k)).astype(np.float16))
    vals, idx = S.compress(w)
    meta = padded_meta(np.asarray(S.encode_metadata(idx, "sm90", "f16").data), m, k, 64, 64, 32)
    b = rng.standard_normal((n, k)).astype(np.float16)
    ref = w.astype(np.float64) @ b.astype(np.float64).T
    c = np.full((m, n), np.nan, np.float16)
    with ptx_when_foreign_arch(target):
        kern[((m + 63) // 64, (n + 63) // 64)](vals, meta, b, c, target=target)
    assert not np.isnan(c).any()
    assert np.abs(c.astype(np.float64) - ref).max() <= 2.0 ** -10 * np.abs(ref).max() + 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("target", ["sm_90", "sm_80"])
@pytest.mark.parametrize("anchored", [False, True], ids=["smem_acc", "anchored_acc"])
def test_f16_accumulator_on_gpu(anchored, target, sparse):
    """An f16 ``acc``: carried as f32 through the MMAs of one ``dot``, rounded to f16 after it."""
    c, ref, absprod = run("f16", sparse, 200, 100, 320, seed=7, target=target, anchored=anchored, acc="f16")
    check_f16_acc(c, ref, absprod, 320)
