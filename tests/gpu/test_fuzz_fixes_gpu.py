"""Fixes found by the program fuzzers, run on the GPU against the interpreter (the CPU tests compile
them: tests/backend/test_lower_memory.py, tests/backend/test_llvm_text.py, tests/frontend/test_ops_shape.py,
tests/frontend/test_jit_annotations.py): a masked ``ptr[bool]`` load with ``other=``, f16 / bf16
constants rounded once (or overflowing to infinity) as ``other=``, ``trans`` / ``reshape`` of a scalar,
a helper's constexpr default read where its ``def`` is, and a @jit kernel annotated with NumPy types."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile import constexpr, ptr

pytestmark = pytest.mark.gpu

BOOL_LOAD = """
@kernel
def k(X: ptr[bool], O: ptr[f16], n: i32):
    offs = arange(0, {n})
    x = load(X + offs, mask=offs < n, other={other})
    store(O + offs, x.to(f16))
"""


@pytest.mark.parametrize("n", [16, 128, 512])
@pytest.mark.parametrize("other", ["True", "False"])
def test_a_masked_bool_load_with_other_runs_as_interpreted(n: int, other: str) -> None:
    k = sp.loads(BOOL_LOAD.format(n=n, other=other), "bool_load.spk").k
    x = np.random.default_rng(n).integers(0, 2, n).astype(np.bool_)
    gpu, ref = np.full(n, np.nan, np.float16), np.full(n, np.nan, np.float16)
    valid = n // 2 + 3
    k[(1,)](x, gpu, np.int32(valid))
    k.interpret[(1,)](x, ref, np.int32(valid))
    want = np.concatenate([x[:valid], np.full(n - valid, other == "True")]).astype(np.float16)
    assert gpu.tolist() == want.tolist()
    assert ref.tolist() == want.tolist()


CONST_OTHER = """
@kernel
def k(X: ptr[{t}], O: ptr[{t}], n: i32):
    offs = arange(0, 16)
    store(O + offs, load(X + offs, mask=offs < n, other={other!r}))
"""

# (value, type): bf16 values next to a rounding tie, where rounding through f32 first differs from
# rounding the double once; values beyond the f16 / bf16 range (infinity)
CONSTANTS = [
    (1 + 2**-8 + 2**-40, "bf16"),
    (1 + 3 * 2**-8 - 2**-40, "bf16"),
    (2**24 + 2**16 + 1, "bf16"),
    (3.3961775e38, "bf16"),
    (-3.3961776e38, "bf16"),
    (1e30, "f16"),
    (-65520.0, "f16"),
    (65519.0, "f16"),
]


@pytest.mark.parametrize(("value", "t"), CONSTANTS)
def test_a_constant_other_is_rounded_as_the_interpreter_rounds_it(value: float, t: str) -> None:
    np_t = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}[t]
    k = sp.loads(CONST_OTHER.format(t=t, other=value), "const_other.spk").k
    x = np.random.default_rng(3).uniform(-2, 2, 16).astype(np_t)
    gpu, ref = np.full(16, np.nan, np_t), np.full(16, np.nan, np_t)
    k[(1,)](x, gpu, np.int32(5))
    k.interpret[(1,)](x, ref, np.int32(5))
    assert gpu.view(np.uint16).tolist() == ref.view(np.uint16).tolist()
    assert gpu[:5].view(np.uint16).tolist() == x[:5].view(np.uint16).tolist()


SCALAR_SHAPES = """
@kernel
def k(X: ptr[f32], O: ptr[f32]):
    s = load(X + 1)
    a = trans(s)
    b = permute(s, ())
    c = reshape(s, ())
    store(O + arange(0, 4), full((4,), a * 2.0 + b - c, f32) + arange(0, 4).to(f32))
"""


def test_trans_permute_reshape_of_a_scalar_run_as_interpreted() -> None:
    k = sp.loads(SCALAR_SHAPES, "scalar_shapes.spk").k
    x = np.array([5.0, 1.25, 7.0], np.float32)
    gpu, ref = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
    k[(1,)](x, gpu)
    k.interpret[(1,)](x, ref)
    assert gpu.tolist() == ref.tolist() == [2.5, 3.5, 4.5, 5.5]


BLOCK = 64


@sp.jit
def scale(v, BLOCK: constexpr = BLOCK):  # the Triton idiom: a default naming a module global
    return v * BLOCK


@sp.jit
def with_default(X: ptr[np.float32], O: ptr[np.uint32], n: sp.i32):
    offs = sp.arange(0, 128)
    x = sp.load(X + offs, mask=offs < n, other=1.0)
    sp.store(O + offs, scale(x).to(sp.u32), mask=offs < n)


def test_a_helper_default_and_numpy_annotations_run_on_the_gpu() -> None:
    x = np.random.default_rng(5).uniform(0, 9, 128).astype(np.float32)
    gpu, ref = np.full(128, 77, np.uint32), np.full(128, 77, np.uint32)
    with_default[(1,)](x, gpu, np.int32(100))
    with_default.interpret[(1,)](x, ref, np.int32(100))
    assert gpu.tolist() == ref.tolist()
    assert gpu[:100].tolist() == (x[:100].astype(np.float64) * 64).astype(np.uint32).tolist()
    assert (gpu[100:] == 77).all()
