"""The interpreter's casts to fp8 saturate as the GPU's ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` does
(issue 15: e4m3 values above 448 used to become NaN, e5m2 ones above 57344 infinity)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp

SOURCE = """
@kernel
def k(xp: ptr[f32], a: ptr[e4m3], b: ptr[e5m2], BLOCK: constexpr = 8):
    offs = arange(0, BLOCK)
    x = load(xp + offs)
    store(a + offs, x.to(e4m3))
    store(b + offs, x.to(e5m2))
"""


def test_fp8_casts_saturate_and_keep_nan() -> None:
    x = np.array([500.0, -1e9, np.inf, -np.inf, np.nan, 416.0, 1e5, -3.0], np.float32)
    a = np.full(8, np.nan, ml_dtypes.float8_e4m3fn)
    b = np.full(8, np.nan, ml_dtypes.float8_e5m2)
    sp.loads(SOURCE, "fp8.spk").kernels["k"].interpret[(1,)](x, a, b)
    got_a = a.astype(np.float64)
    assert got_a[[0, 1, 2, 3, 5, 6, 7]].tolist() == [448.0, -448.0, 448.0, -448.0, 416.0, 448.0, -3.0]
    assert np.isnan(got_a[4])
    got_b = b.astype(np.float64)
    assert got_b[[0, 1, 2, 3, 5, 6, 7]].tolist() == [512.0, -57344.0, 57344.0, -57344.0, 384.0, 57344.0, -3.0]
    assert np.isnan(got_b[4])


@pytest.mark.gpu
def test_gpu_fp8_casts_match_the_interpreter() -> None:
    x = np.array([500.0, -1e9, np.inf, -np.inf, np.nan, 416.0, 1e5, -3.0], np.float32)
    k = sp.loads(SOURCE, "fp8.spk").kernels["k"]
    want_a, want_b = np.zeros(8, ml_dtypes.float8_e4m3fn), np.zeros(8, ml_dtypes.float8_e5m2)
    k.interpret[(1,)](x, want_a, want_b)
    a = np.full(8, np.nan, ml_dtypes.float8_e4m3fn)
    b = np.full(8, np.nan, ml_dtypes.float8_e5m2)
    k[(1,)](x, a, b)
    for got, want in ((a, want_a), (b, want_b)):
        np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32)))
    finite = ~np.isnan(x)
    np.testing.assert_array_equal(a.view(np.uint8)[finite], want_a.view(np.uint8)[finite])
    np.testing.assert_array_equal(b.view(np.uint8)[finite], want_b.view(np.uint8)[finite])
