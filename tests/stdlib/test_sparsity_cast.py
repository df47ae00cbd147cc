"""Issue 15 item 7: ``compress(w, prune=True)`` equals ``compress(prune(w, dtype))`` when w has
another dtype (it used to cast first, then prune), and e4m3 casts saturate at ±448 with a warning
instead of producing NaN (``compress`` and ``prune_and_compress``)."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import prune_and_compress


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2", "f16", "bf16", "tf32", "e2m1"])
def test_compress_prune_is_exactly_compress_of_prune(dtype: str) -> None:
    for seed in range(30):
        rng = np.random.default_rng(seed)
        scale = (0.01, 1.0, 30.0)[seed % 3]
        w = (rng.standard_normal((8, 64)) * scale).astype(np.float32 if seed % 2 else np.float64)
        v1, i1 = S.compress(w, dtype, prune=True)
        v2, i2 = S.compress(S.prune(w, dtype), dtype)
        assert v1.dtype == v2.dtype
        np.testing.assert_array_equal(v1.view(np.uint8), v2.view(np.uint8))
        np.testing.assert_array_equal(i1, i2)


def test_e4m3_prune_order_case() -> None:
    """Three elements that round to the same e4m3 value 1.0: the two larger in float32 are kept
    (casting first made them tie, and ties keep the lower index: columns 0 and 1)."""
    w = np.array([[1.0, 1.01, 1.02, 0.0]], np.float32)
    values, indices = S.compress(w, "e4m3", prune=True)
    assert indices[0, 0].tolist() == [1, 2]
    assert values.astype(np.float64).tolist() == [[1.0, 1.0]]


def test_e4m3_values_beyond_448_saturate_with_a_warning() -> None:
    w = np.zeros((16, 8), np.float32)
    w[0, 0], w[1, 1], w[2, 4], w[3, 5], w[4, 0] = 500.0, -1e9, np.inf, 416.0, np.nan
    with pytest.warns(S.SaturationWarning, match=r"^3 values of w lie beyond ±448, the largest finite "
                      r"e4m3 value: saturated to ±448 \(a plain cast would make them NaN\)$") as record:
        weight = prune_and_compress(w, "e4m3")
    assert record[0].filename == __file__
    dense = weight.dense().astype(np.float64)
    assert dense[0, 0] == 448.0 and dense[1, 1] == -448.0 and dense[2, 4] == 448.0
    assert dense[3, 5] == 416.0 and np.isnan(dense[4, 0])
    with pytest.warns(S.SaturationWarning, match="^1 values of w lie"):
        values, _ = S.compress(np.array([[1000.0, 0, 0, 0]]), "e4m3")
    assert values.astype(np.float64).tolist() == [[448.0, 0.0]]


def test_no_warning_within_range_and_e5m2_overflows_to_inf_with_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values, _ = S.compress(np.array([[448.0, 0, -447.0, 0]], np.float32), "e4m3")
        assert values.astype(np.float64).tolist() == [[448.0, -448.0]]  # -447 rounds to the grid
    with pytest.warns(S.OverflowWarning, match="1 values of w lie beyond ±57344, the largest finite e5m2 value"):
        assert S.cast_to_operand(np.array([1e6]), S.operand_type("e5m2")).astype(np.float64)[0] == np.inf
    with pytest.warns(S.SaturationWarning):
        cast = S.cast_to_operand(np.array([1e6, -np.inf]), S.operand_type("e4m3"))
    assert cast.dtype == ml_dtypes.float8_e4m3fn and cast.astype(np.float64).tolist() == [448.0, -448.0]


@pytest.mark.parametrize(("dtype", "top"), [("f16", "65504"), ("bf16", "3.38953e+38"), ("tf32", "3.40282e+38")])
def test_finite_values_beyond_the_range_become_inf_with_our_warning_not_numpy_s(dtype: str, top: str) -> None:
    """A float64 weight beyond the f16 (bf16, tf32) range became ±inf with numpy's bare RuntimeWarning
    ("overflow encountered in cast", pointing into compress.py): now an OverflowWarning counts them
    and names the range; ±inf and NaN given are no overflow, and values within range warn nothing."""
    w = np.array([[1e300, 0.0, -1e300, 0.0], [np.inf, 0.0, np.nan, 1.0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cast = S.cast_to_operand(w, S.operand_type(dtype))
    assert [type(c.message) for c in caught] == [S.OverflowWarning]
    assert str(caught[0].message).startswith(f"2 values of w lie beyond ±{top}, the largest finite {dtype} value: "
                                             "they became ±inf")
    assert caught[0].filename == __file__  # (the user's line)
    assert cast.astype(np.float64)[0].tolist() == [np.inf, 0.0, -np.inf, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S.cast_to_operand(np.array([65504.0, -1.0]), S.operand_type(dtype))


def test_sparse_matmul_saturates_an_e4m3_b_beyond_448() -> None:
    from sparsile.stdlib.kernels import sparse_matmul

    rng = np.random.default_rng(4)
    w = S.prune(rng.standard_normal((64, 64)).astype(np.float32), "e4m3")
    weight = prune_and_compress(w, "e4m3")
    b = rng.standard_normal((16, 64)).astype(np.float32)
    b[3, 5] = 1000.0
    with pytest.warns(S.SaturationWarning, match="^1 values of b lie beyond ±448"):
        c = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    assert np.isfinite(c.astype(np.float64)).all()
    bq = np.clip(b, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ref = weight.dense().astype(np.float64) @ bq.T
    assert np.abs(c.astype(np.float64) - ref).max() <= 2.0 ** -10 * np.abs(ref).max() + 1e-2


@pytest.mark.parametrize("bad", [300.0, -129, np.nan, np.inf])
def test_an_s8_cast_of_a_value_beyond_its_range_is_refused(bad) -> None:
    """numpy's cast to int8 wraps 300 to 44 and turns NaN into 0 or -128: the product was silently
    wrong (compress of a weight, sparse_matmul's b)."""
    from sparsile.stdlib.kernels import sparse_matmul

    w = np.zeros((16, 8), np.float64)
    w[2, 1] = bad
    with pytest.raises(S.SparsityError) as info:
        S.compress(w, "s8")
    assert (info.value.code, info.value.message) == (
        "SP0804", "1 values of w are not finite or lie beyond [-128, 127], the range of s8: a cast would wrap them")
    weight = prune_and_compress(np.ones((16, 32), np.float32), "s8")
    b = np.ones((4, 32), np.float32)
    b[3, 5] = bad
    with pytest.raises(S.SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, interpret=True)
    assert info.value.code == "SP0804" and info.value.message.startswith("1 values of b are not finite")
    within = np.array([[127.0, 0, -128.0, 0]])
    assert S.compress(within, "s8")[0].tolist() == [[127, -128]]


@pytest.mark.parametrize(("values", "op"), [
    (np.array([1e5, 1.0], ml_dtypes.bfloat16), "f16"),  # bf16 -> f16: the same size, a narrower range
    (np.array([1e5, 1.0], ml_dtypes.bfloat16), "e5m2"),  # an ml_dtypes type (dtype kind "V")
    (np.array([100000, 1], np.int32), "f16"),  # integers
    (np.array([100000, 1], np.int64), "e5m2")])
def test_every_finite_value_that_became_inf_is_counted(values, op):
    """The OverflowWarning counted only float inputs (kind "f") wider than the operand type, and numpy's
    own RuntimeWarning was silenced for every cast: bf16 -> f16 and int32 -> f16 (which numpy warned of)
    and bf16 / int64 -> e5m2 became ±inf without a word."""
    with pytest.warns(S.OverflowWarning, match=r"^1 values of w lie beyond"):
        cast = S.cast_to_operand(values, S.operand_type(op))
    assert np.isinf(cast.astype(np.float32)).tolist() == [True, False]
