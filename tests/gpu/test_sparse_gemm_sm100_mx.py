"""The block-scaled sparse GEMM (stdlib/kernels/sparse_gemm_sm100_mx.spk, kind::mxf8f6f4).

The interpreter runs the kernel against the float64 ``scaled_matmul_reference`` of
stdlib/blockscale.py: random non-zero operands whose 64-element blocks span 2^-4..2^4 (kept small so that C fits f16; a
misplaced, ignored or wrongly ordered scale changes the result by orders of magnitude), NaN-poisoned
C, ragged M, N, K, one and several K steps, 2 and 3 stages. These tests always run. The ``gpu`` test
runs the same kernel on a Blackwell GPU and skips elsewhere: none was available when it was
written, so it has never run (docs/blackwell.md §8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import blockscale as BS
from sparsile.stdlib import sparsity as S

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


@pytest.fixture(scope="module")
def mx():
    return sp.load(KERNELS / "sparse_gemm_sm100_mx.spk")


def operands(m: int, n: int, k: int, seed: int, spread: int = 4):
    """A (pruned 2:4, quantized per 64 logical K), B (quantized per 64 K), their encoded scales and
    metadata as the kernel's TMA reads them, the float64 reference and |A|·|B| (for the bound)."""
    rng = np.random.default_rng(seed)
    nb = -(-k // 64)

    def spread_rows(rows: int) -> np.ndarray:
        mag = np.exp2(rng.integers(-spread, spread + 1, (rows, nb)).astype(np.float64))
        return rng.standard_normal((rows, k)) * np.repeat(mag, 64, axis=1)[:, :k]

    qa, sa = BS.quantize_mx(S.prune_2_4(spread_rows(m)), 64)
    qb, sb = BS.quantize_mx(spread_rows(n), 64)
    vals, idx = S.compress(qa, "e4m3")
    meta = S.encode_metadata(idx, "tcgen05", "e4m3", k=k)
    ref = BS.scaled_matmul_reference(vals, sa, qb, sb, block=64, a_meta=meta)
    absprod = np.abs(BS.dequantize_mx(qa, sa, 64)) @ np.abs(BS.dequantize_mx(qb, sb, 64)).T
    return (vals, np.asarray(meta.data).reshape(-1, 4), BS.encode_scales(sa).reshape(-1, 4), qb,
            BS.encode_scales(sb).reshape(-1, 4)), ref, absprod


def check(c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, gpu: bool = False) -> None:
    """f16 output rounding (relative 2^-11, and f16's subnormal step for tiny results) plus f32
    accumulation; on a GPU the MMA's internal accumulation precision is not documented, so the
    bound there adds 2^-13 of the absolute sum per 64-element block."""
    assert not np.isnan(c).any(), "unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    bound = 2.0 ** -11 * np.abs(ref) + 2.0 ** -24 + 2.0 ** -20 * absprod
    if gpu:
        bound += 2.0 ** -13 * absprod
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


def run(mod, m: int, n: int, k: int, seed: int = 0, interpret: bool = True, spread: int = 4, **cfg):
    args, ref, absprod = operands(m, n, k, seed, spread)
    vals, meta, sa, b, sb = args
    c = np.full((m, n), np.nan, np.float16)
    bn = cfg.get("BN", 128)
    grid = (((m + 127) // 128) * ((n + bn - 1) // bn),)
    kern = mod.sparse_gemm_mxf8
    launch = kern.interpret[grid] if interpret else kern[grid]
    launch(vals, meta, sa, b, sb, c, m, n, k, **cfg)
    return c, ref, absprod


@pytest.mark.parametrize("m,n,k,cfg", [
    (128, 128, 256, {}),                                  # one tile, one K step (4 scale blocks)
    (200, 296, 576, {"STAGES": 2}),                       # ragged M, N, K: 3 K steps, the last partial
    (256, 256, 1024, {"BN": 256, "STAGES": 2}),           # 4 K steps through 2 stages, two B atoms per step
    (96, 136, 320, {"STAGES": 3, "GROUP_M": 1}),          # smaller than one tile everywhere
])
def test_interpreter_matches_the_scaled_reference(mx, m, n, k, cfg):
    c, ref, absprod = run(mx, m, n, k, seed=m + n + k, **cfg)
    check(c, ref, absprod)


def test_the_scales_are_what_makes_it_right(mx):
    """Replacing the A scales by 1.0 (byte 127) breaks agreement: the check above is not blind to
    the scales."""
    args, ref, absprod = operands(128, 128, 512, seed=7)
    vals, meta, sa, b, sb = args
    c = np.full((128, 128), np.nan, np.float16)
    mx.sparse_gemm_mxf8.interpret[(1,)](vals, meta, np.full_like(sa, 0x7F7F7F7F), b, sb, c, 128, 128, 512)
    with pytest.raises(AssertionError):
        check(c, ref, absprod)


@pytest.mark.gpu
def test_on_a_blackwell_gpu(mx):
    from sparsile.backend import runtime

    major = runtime.current_device().compute_capability[0]
    if major not in (10, 11):
        pytest.skip(f"needs a Blackwell GPU (sm_100/103/110), this one is sm_{major}x")
    c, ref, absprod = run(mx, 512, 384, 1024, seed=1, interpret=False, spread=4)
    check(c, ref, absprod, gpu=True)
