"""The PTX of quantize.spk's e4m3 quantizers as the torch layer launches them (16-byte aligned rows of
bf16 or f32 x, K a multiple of 16; no GPU needed): 64-bit row offsets (T x K passes 2^31 for a
prefill beyond RECORD_QUANTIZE_MAX_T tokens: 40000 x 57344, whose y the GEMM accepts), still 16-byte
loads and stores; the static quantizer's IEEE reciprocal and product (no flush of subnormals, which
would change a subnormal x's or scale's bits against torch's) and the saturating e4m3 conversion."""

from __future__ import annotations

import re

import pytest

from sparsile.driver.compile_pool import Specialization
from sparsile.driver.compiler import compile_cached
from sparsile.stdlib.kernels.quantize_e4m3 import quantize_module, quantize_options, static_options
from sparsile.target.targets import get_target

torch = pytest.importorskip("torch")


def _ptx(name: str, target: str, dtype: torch.dtype, k: int) -> str:
    kernel = getattr(quantize_module(), name)
    x = torch.zeros((3, k), dtype=dtype)
    xq = torch.zeros((3, k), dtype=torch.float8_e4m3fn)
    if name == "quantize_e4m3_static":
        args, options = (x, xq, torch.ones(4)[:1], k, k, k), static_options(k)
    else:
        args, options = (x, xq, torch.ones(4), k, k, k), quantize_options(k)
    spec = Specialization.of_launch(kernel, args, {**options, "TRIGGER": 1})
    return compile_cached(spec.kernel, spec.bindings, spec.key, get_target(target), spec.options,
                          stop_after="ptx").ptx


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name, k", [("quantize_e4m3_static", 57344), ("quantize_e4m3_per_token", 4096),
                                     ("quantize_e4m3_per_token", 57344)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_are_addressed_in_64_bits_with_16_byte_accesses(target, name, k, dtype):
    ptx = _ptx(name, target, dtype, k)
    # the row offset t * ldx: t = %ctaid.x widened, then a 64-bit product (it was mul.lo.s32, wrapping
    # past 2^31 elements: a store below the row's start, or a fault)
    assert not re.search(r"mul\.lo\.s32", ptx), ptx
    assert re.search(r"(mul|mad)\.lo\.s64", ptx)
    assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx  # (16-byte vectors, not one element)
    assert "griddepcontrol.launch_dependents" in ptx and "griddepcontrol.wait" not in ptx
    assert ".ftz" not in ptx
    if name == "quantize_e4m3_static":
        assert re.findall(r"rcp\.[a-z.0-9]+", ptx) == ["rcp.rn.f32"]  # (IEEE: not rcp.approx)
        assert set(re.findall(r"mul\.[a-z]+\.f32", ptx)) == {"mul.rn.f32"}
        assert set(re.findall(r"cvt\.[a-z.]*e4m3x2\.f32", ptx)) == {"cvt.rn.satfinite.e4m3x2.f32"}
