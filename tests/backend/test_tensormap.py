"""CPU tests of tensor-map description and validation (docs/hardware.md §5.4); the encoding itself
needs the driver and is tested on the GPU in test_runtime_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.backend import runtime
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime.tensormap import (
    Interleave,
    L2Promotion,
    OobFill,
    Swizzle,
    TensorMapParam,
    TensorMapSpec,
    TmaDataType,
    driver_call_arguments,
    encode_tensor_map,
)
from sparsile.frontend.diagnostics import LaunchError

ALIGNED = 0x7F00_0000_0000


def f16_spec(**changes):
    fields = {"dtype": "f16", "global_shape": (128, 128), "global_strides": (256, 2), "box_shape": (64, 64)}
    fields.update(changes)
    return TensorMapSpec(**fields)


def test_enums_match_the_driver():
    pairs = ((TmaDataType, driver.CUtensorMapDataType), (Swizzle, driver.CUtensorMapSwizzle),
             (Interleave, driver.CUtensorMapInterleave), (L2Promotion, driver.CUtensorMapL2promotion),
             (OobFill, driver.CUtensorMapFloatOOBfill))
    for ours, theirs in pairs:
        assert len(ours) == len(theirs)
        for member, driver_member in zip(ours, theirs):
            assert int(member) == driver_member.value


def test_valid_spec_and_driver_order():
    spec = f16_spec()
    assert spec.problems(ALIGNED) == []
    args = spec.driver_arguments(ALIGNED)
    assert args["tensorDataType"] == 6 and args["tensorRank"] == 2
    assert args["globalDim"] == [128, 128] and args["globalStrides"] == [256] and args["boxDim"] == [64, 64]
    rect = TensorMapSpec("f32", (3, 40, 96), (40 * 96 * 4, 96 * 4, 4), (1, 8, 32), element_strides=(1, 2, 1))
    assert rect.problems(ALIGNED) == []
    rargs = rect.driver_arguments(ALIGNED)
    assert rargs["globalDim"] == [96, 40, 3] and rargs["globalStrides"] == [384, 15360]
    assert rargs["boxDim"] == [32, 8, 1] and rargs["elementStrides"] == [1, 2, 1]
    assert spec.box_bytes == 64 * 64 * 2 and spec.inner_box_bytes == 128
    assert rect.box_bytes == 1 * 4 * 32 * 4  # ceil(8 / 2) rows of the strided dimension


def test_dtype_mapping():
    assert f16_spec(dtype="e4m3", global_strides=(128, 1), box_shape=(64, 64)).dtype == TmaDataType.UINT8
    assert f16_spec(dtype="bf16").dtype == TmaDataType.BFLOAT16
    assert f16_spec(dtype=TmaDataType.FLOAT16).dtype == TmaDataType.FLOAT16
    with pytest.raises(LaunchError) as exc:
        f16_spec(dtype="complex64")
    assert exc.value.code == A.TENSOR_MAP


@pytest.mark.parametrize("changes,address,text", [
    ({"global_shape": (), "global_strides": (), "box_shape": ()}, ALIGNED, "rank 0 is outside 1..5"),
    ({"global_shape": (2,) * 6, "global_strides": (2,) * 6, "box_shape": (1,) * 6}, ALIGNED, "rank 6"),
    ({"box_shape": (64,)}, ALIGNED, "box_shape has 1 entries for a rank-2 tensor"),
    ({}, ALIGNED + 8, "is not 16-byte aligned"),
    ({"global_shape": (0, 128)}, ALIGNED, "global dimension 0 = 0"),
    ({"global_shape": (2**32 + 1, 128)}, ALIGNED, "outside 1..2^32"),
    ({"global_strides": (264, 2)}, ALIGNED, "stride of dimension 0 = 264 bytes is not a multiple of 16"),
    ({"global_strides": (2**40, 2)}, ALIGNED, "below 2^40"),
    ({"global_strides": (256, 4)}, ALIGNED, "innermost stride is 4 bytes"),
    ({"box_shape": (0, 64)}, ALIGNED, "box dimension 0 = 0"),
    ({"box_shape": (257, 64)}, ALIGNED, "outside 1..256"),
    ({"box_shape": (64, 12)}, ALIGNED, "inner box dimension is 24 bytes, not a multiple of 16"),
    ({"swizzle": Swizzle.B128, "box_shape": (64, 128)}, ALIGNED, "more than the 128-byte swizzle span"),
    ({"swizzle": Swizzle.B64, "box_shape": (64, 40)}, ALIGNED, "more than the 64-byte swizzle span"),
    ({"swizzle": Swizzle.B32, "box_shape": (64, 32)}, ALIGNED, "more than the 32-byte swizzle span"),
    ({"element_strides": (0, 1)}, ALIGNED, "element stride of dimension 0 = 0"),
    ({"element_strides": (9, 1)}, ALIGNED, "outside 1..8"),
    ({"interleave": Interleave.B16}, ALIGNED, "interleaved layouts need rank >= 3"),
    ({"dtype": "i32", "global_strides": (512, 4), "oob_fill": OobFill.NAN_REQUEST_ZERO_FMA}, ALIGNED,
     "NaN out-of-bounds fill needs a floating-point type"),
])
def test_each_rule(changes, address, text):
    problems = f16_spec(**changes).problems(address)
    assert any(text in p for p in problems), problems


def test_interleave_32b_rules():
    spec = TensorMapSpec("f16", (4, 8, 16), (256, 32, 2), (1, 8, 16), interleave=Interleave.B32,
                         swizzle=Swizzle.NONE)
    problems = spec.problems(ALIGNED + 16)
    assert any("32-byte interleave requires swizzle B32" in p for p in problems)
    assert any("not 32-byte aligned" in p for p in problems)
    ok = TensorMapSpec("f16", (4, 8, 16), (256, 32, 2), (1, 8, 16), interleave=Interleave.B32,
                       swizzle=Swizzle.B32)
    assert ok.problems(ALIGNED) == []


def test_packed_type_rules():
    good = TensorMapSpec(TmaDataType.U4X16_ALIGN16B, (64, 256), (256, 1), (32, 128), swizzle=Swizzle.B128)
    assert good.problems(ALIGNED) == []
    bad = TensorMapSpec(TmaDataType.U4X16_ALIGN16B, (64, 200), (272, 1), (32, 64), swizzle=Swizzle.B64)
    problems = " | ".join(bad.problems(ALIGNED + 16))
    for text in ("32-byte aligned", "multiple of 128, got 200", "innermost box of 128, got 64",
                 "does not support swizzle B64", "not a multiple of 32"):
        assert text in problems
    odd = TensorMapSpec(TmaDataType.U4X16_ALIGN8B, (4, 33), (32, 1), (4, 32))
    assert any("even innermost dimension" in p for p in odd.problems(ALIGNED))


def test_validate_reports_every_problem_at_once():
    spec = f16_spec(box_shape=(300, 12))
    with pytest.raises(LaunchError) as exc:
        spec.validate(ALIGNED + 2)
    message = str(exc.value)
    assert exc.value.code == A.TENSOR_MAP
    assert "16-byte aligned" in message and "outside 1..256" in message and "24 bytes" in message


@settings(max_examples=100, deadline=None)
@given(dtype=st.sampled_from(["f16", "bf16", "f32", "e4m3", "i32"]),
       rows=st.integers(1, 4096), cols_16b=st.integers(1, 64), swizzle=st.sampled_from(list(Swizzle)[:4]),
       box_rows=st.integers(1, 256), data=st.data())
def test_generated_valid_specs_have_no_problems(dtype, rows, cols_16b, swizzle, box_rows, data):
    itemsize = A.DTYPES[dtype].itemsize
    cols = cols_16b * 16 // itemsize
    span = swizzle.span or 256 * itemsize
    max_inner_16b = max(1, min(span, 256 * itemsize) // 16)
    inner_bytes = 16 * data.draw(st.integers(1, max_inner_16b))
    box = (box_rows, inner_bytes // itemsize)
    spec = TensorMapSpec(dtype, (rows, cols), (cols * itemsize, itemsize), box, swizzle=swizzle)
    assert spec.problems(ALIGNED) == []
    # Break exactly one rule: the address.
    assert len(spec.problems(ALIGNED + itemsize)) == (1 if itemsize % 16 else 0)


def test_tensor_map_param_spec_for_an_array():
    param = TensorMapParam("a", "bf16", (64, 64), swizzle=Swizzle.B128)
    assert param.kind == "tensormap" and param.slot == (128, 64) and param.rank == 2
    info = A.describe_array(np.zeros((256, 512), dtype=A.numpy_dtype("bf16")))
    spec = param.spec_for(info)
    assert spec.global_shape == (256, 512) and spec.global_strides == (1024, 2)
    assert spec.swizzle == Swizzle.B128 and spec.dtype == TmaDataType.BFLOAT16
    with pytest.raises(LaunchError) as exc:
        param.spec_for(A.describe_array(np.zeros(8, dtype=A.numpy_dtype("bf16"))))
    assert exc.value.code == A.ARG_SHAPE and "rank 1" in str(exc.value)


@pytest.mark.skipif(runtime.has_gpu(), reason="checks the no-GPU error")
def test_encode_without_a_gpu_is_a_clear_error():
    with pytest.raises(LaunchError) as exc:
        encode_tensor_map(f16_spec(), ALIGNED)
    assert exc.value.code == A.NO_GPU


@pytest.mark.skipif(runtime.has_gpu(), reason="relies on the driver library being absent")
@pytest.mark.parametrize("spec", [f16_spec(), TensorMapSpec("f32", (100,), (4,), (32,)),
                                  TensorMapSpec("bf16", (2, 3, 64, 64), (3 * 8192, 8192, 128, 2), (1, 1, 8, 64))])
def test_driver_accepts_our_argument_types(spec):
    # cuda-python converts every argument before it loads libcuda, so without a driver a call
    # with well-typed arguments fails on the missing library, never with a TypeError.
    with pytest.raises(Exception) as exc:
        driver.cuTensorMapEncodeTiled(*driver_call_arguments(spec, ALIGNED))
    assert type(exc.value).__name__ == "DynamicLibNotFoundError", exc.value


def test_encode_validates_before_touching_the_driver():
    with pytest.raises(LaunchError) as exc:
        encode_tensor_map(f16_spec(box_shape=(64, 12)), ALIGNED)
    assert exc.value.code == A.TENSOR_MAP


def test_a_dimension_of_size_one_gets_the_packed_stride():
    """One row of any row stride (torch calls ``big[1:2, :512]`` contiguous): the row stride is never
    used, and 516 or 513 elements of bf16 break the 16-byte rule of outer strides (the layer's replay
    of such an x was SP0714 on the H100)."""
    from sparsile.backend.runtime.tensormap import TensorMapSpec

    for row_stride in (516, 513, 2560):
        spec = TensorMapSpec.for_array("bf16", (1, 512), (row_stride, 1), (8, 64))
        assert spec.global_strides == (1024, 2)
        spec.validate()
    assert TensorMapSpec.for_array("bf16", (2, 512), (516, 1), (8, 64)).global_strides == (1032, 2)
    assert TensorMapSpec.for_array("f16", (1, 1, 64), (7, 3, 1), (1, 1, 64)).global_strides == (128, 128, 2)

