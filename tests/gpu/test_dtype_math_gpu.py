"""The GPU and the interpreter agree exactly (NaN for NaN, the sign of zero) on the f64 math
builtins (``sqrt``, ``rsqrt``, ``abs``, ``floor``, ``ceil``: IEEE-exact f64 instructions,
docs/language.md rule 10) and on fp8 ``.to(bool)`` (a test of the bits, docs/language.md rule 8),
on random and special inputs."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu

F64_SRC = """
@kernel
def k(X: ptr[f64], Y: ptr[f64], n: i32):
    i = program_id(0) * 256 + arange(0, 256)
    m = i < n
    x = load(X + i, mask=m)
    store(Y + i, sqrt(x), mask=m)
    store(Y + n + i, rsqrt(x), mask=m)
    store(Y + 2 * n + i, abs(x), mask=m)
    store(Y + 3 * n + i, floor(x), mask=m)
    store(Y + 4 * n + i, ceil(x), mask=m)
"""

FP8_BOOL_SRC = """
@kernel
def k(X: ptr[{t}], Y: ptr[i32]):
    i = arange(0, 256)
    store(Y + i, load(X + i).to(bool).to(i32))
"""


def test_f64_math_matches_the_interpreter() -> None:
    rng = np.random.default_rng(11)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.0**25 + 0.5, -(2.0**52) - 0.5,
                        1.0, 2.0, 0.1, 1e308, -1e-300])
    x = np.concatenate([special, rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)])
    n = len(x)
    kern = sp.loads(F64_SRC, "case.spk").kernels["k"]
    gpu, ref = np.full(5 * n, 7.0), np.full(5 * n, 7.0)
    kern[(sp.cdiv(n, 256),)](x, gpu, n)
    kern.interpret[(sp.cdiv(n, 256),)](x, ref, n)
    np.testing.assert_array_equal(gpu, ref)  # NaN where NaN (its bits are the GPU's canonical NaN)
    np.testing.assert_array_equal(np.signbit(gpu[~np.isnan(gpu)]), np.signbit(ref[~np.isnan(ref)]))


@pytest.mark.parametrize("t", ["e4m3", "e5m2"])
def test_fp8_to_bool_matches_the_interpreter(t: str) -> None:
    bits = np.arange(256, dtype=np.uint8)
    dt = sp.e4m3.numpy_dtype if t == "e4m3" else sp.e5m2.numpy_dtype
    kern = sp.loads(FP8_BOOL_SRC.format(t=t), "case.spk").kernels["k"]
    gpu, ref = np.full(256, -1, np.int32), np.full(256, -1, np.int32)
    kern[(1,)](bits.view(dt), gpu)
    kern.interpret[(1,)](bits.view(dt), ref)
    np.testing.assert_array_equal(gpu, ref)
    np.testing.assert_array_equal(ref, ((bits & 0x7F) != 0).astype(np.int32))
