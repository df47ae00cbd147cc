"""Golden sm_90a PTX of the shipped Hopper kernels (stdlib/kernels/sparse_gemm_sm90.spk, its ``_mt``
twins in sparse_gemm_sm90_mt.spk and dense_gemm_sm90.spk), next to the sm_100a snapshots: every
kind of the sparse GEMM, its split-K, CTA-pair and sparse_linear (with an epilogue) variants, the
CTA-pair and sparse_linear kernels with the metadata by TMA, the split-K reduction, and the dense GEMM.
A change of the generated code shows as a diff here; regenerate deliberately with
``SPARSILE_UPDATE_GOLDEN=1 python -m pytest tests/backend/test_golden_sm90.py``.

The PTX holds no path and no cache-dependent text: the compile cache keys an entry by a hash of
the compiler's own code (backend/cache.py), so a cached build is the build of this compiler."""

from __future__ import annotations

import pytest

import sparsile as sp
from sparsile.tests.golden_ptx import check_golden
from sparsile.tests.support import compile_stdlib

# kernel -> (file, constexprs and run-time types the source leaves open)
EPILOGUE = {"Y": sp.ptr[sp.bf16], "Bias": sp.ptr[sp.f32], "SW": sp.ptr[sp.f32], "SX": sp.ptr[sp.f32],
            "BIAS": 1, "ACT": "gelu_tanh", "SCALE_W": 2, "SCALE_X": 1}
CASES: dict[str, tuple[str, dict]] = {
    "sparse_gemm_f16": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_bf16": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_e4m3": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_s8": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_tf32": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_f16_splitk": ("sparse_gemm_sm90.spk", {}),
    "sparse_gemm_f16_pair": ("sparse_gemm_sm90.spk", {}),
    "sparse_linear_bf16": ("sparse_gemm_sm90.spk", EPILOGUE),
    "sparse_gemm_bf16_pair_mt": ("sparse_gemm_sm90_mt.spk", {}),   # the metadata by TMA (META_TMA)
    "sparse_linear_bf16_mt": ("sparse_gemm_sm90_mt.spk", EPILOGUE),
    "splitk_reduce": ("sparse_gemm_sm90.spk", {"W": sp.ptr[sp.f32], "C": sp.ptr[sp.f16], "SPLIT_K": 2}),
    "dense_gemm_f16": ("dense_gemm_sm90.spk", {}),
}


@pytest.mark.parametrize("kernel", list(CASES))
def test_sm90a_ptx_matches_the_golden_snapshot(kernel: str) -> None:
    spk, extra = CASES[kernel]
    ptx = compile_stdlib(spk, kernel, "sm_90a", stop_after="ptx", **extra).ptx
    assert ".target sm_90a" in ptx and f".entry {kernel}(" in ptx
    check_golden(ptx, f"{kernel}.sm_90a.ptx")


def test_the_linear_epilogue_loads_each_bias_and_scale_once_per_row() -> None:
    """The epilogue's per-feature bias and scale (a (BM, 1) slice of the MMA accumulator's layout,
    whose register bases along the tokens repeat elements) are loaded once per distinct row a thread
    holds, not once per accumulator register (masked loads are inline asm, which LLVM does not
    merge): a consumer thread holds 2 rows (r and r + 8 of its warp's 16), so 2 loads of the bias, 2
    of SW (per feature) and 1 of SX (one value)."""
    ptx = compile_stdlib("sparse_gemm_sm90.spk", "sparse_linear_bf16", "sm_90a", stop_after="ptx", **EPILOGUE).ptx
    assert ptx.count("ld.global.b32") == 2 * 2 + 1
