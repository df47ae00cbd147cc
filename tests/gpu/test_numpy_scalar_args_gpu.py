"""On the GPU: a NumPy scalar argument is a kernel parameter of its own type (docs/language.md,
"Specialization and launching"), as tests/frontend/test_jit_numpy_launch.py checks in the
interpreter and the executed PTX."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.tests.frontend.test_jit_numpy_launch import N, constant, run_time

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("kernel", [run_time, constant], ids=["run-time", "constexpr"])
@pytest.mark.parametrize("value", [np.int8(100), 100, np.int16(300), np.uint8(200), np.float16(1.1),
                                   np.float32(1.1), np.int8(100), ml_dtypes.bfloat16(1.1)], ids=repr)
def test_a_numpy_scalar_argument_computes_in_its_type_on_the_gpu(kernel, value) -> None:
    x = np.random.default_rng(61).uniform(-4.0, 4.0, N).astype(np.float32)
    out = np.full(N, np.nan, np.float32)
    kernel[(1,)](x, out, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        c = float(value * value + value)
    ref = x.astype(np.float64) + c
    tol = 2 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))
    if type(value) is float:
        tol = tol + 4 * np.finfo(np.float32).eps * abs(c)
    assert np.all(np.abs(out - ref) <= tol), (out[:4], ref[:4])
