"""Magnitude pruning: hand examples, the tie rule, invariants, every operand dtype, axes, inputs."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import (
    PATTERN_1_2,
    PATTERN_2_4,
    PATTERN_4_8_PAIRS,
    SparsityError,
    prune,
    prune_1_2,
    prune_2_4,
    prune_4_8_pairs,
    prune_mask,
    prune_mask_1_2,
    prune_mask_2_4,
    prune_mask_4_8_pairs,
)
from sparsile.stdlib.sparsity.prune import keep_mask_reference, keep_mask_total_order, prune_rows, unit_keys

prune_module = importlib.import_module("sparsile.stdlib.sparsity.prune")

HOST = {
    "f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "u8": np.uint8, "e2m1": ml_dtypes.float4_e2m1fn,
}


def definition_mask(values: np.ndarray, group: int, unit: int, keep: int) -> np.ndarray:
    """Row by row, group by group: rank units by (larger |sum| first, lower index first)."""
    mags = np.abs(values.astype(np.float64))
    out = np.zeros(values.shape, dtype=bool)
    for r in range(values.shape[0]):
        for g0 in range(0, values.shape[1], group):
            units = [mags[r, g0 + u * unit:g0 + (u + 1) * unit].sum() for u in range(group // unit)]
            order = sorted(range(len(units)), key=lambda i: (-units[i], i))
            for u in order[:keep]:
                out[r, g0 + u * unit:g0 + (u + 1) * unit] = True
    return out


def test_prune_2_4_hand_example():
    w = np.array([[1.0, -3.0, 2.0, 0.5, 0.0, 0.0, 0.0, -7.0]], dtype=np.float16)
    assert prune_2_4(w).tolist() == [[0.0, -3.0, 2.0, 0.0, 0.0, 0.0, 0.0, -7.0]]
    assert prune_mask_2_4(w).tolist() == [[False, True, True, False, True, False, False, True]]


def test_prune_2_4_ties_keep_lower_index():
    w = np.array([[5, 5, 5, 5], [1, 2, 2, 2], [-2, 2, 1, 1], [0, 0, 0, 0]], dtype=np.float16)
    assert prune_mask_2_4(w).tolist() == [
        [True, True, False, False],
        [False, True, True, False],
        [True, True, False, False],
        [True, True, False, False],
    ]


def test_prune_1_2_hand_example_and_ties():
    w = np.array([[1.0, -2.0, 3.0, 3.0, -0.0, 0.0]], dtype=np.float32)
    assert prune_1_2(w).tolist() == [[0.0, -2.0, 3.0, 0.0, -0.0, 0.0]]
    assert prune_mask_1_2(w).tolist() == [[False, True, True, False, True, False]]


def test_prune_4_8_pairs_hand_example():
    w = np.array([[1, 1, 0, 3, -2, -2, 0.5, 0]], dtype=ml_dtypes.float4_e2m1fn)
    # pair magnitudes 2, 3, 4, 0.5 -> keep pairs 1 and 2
    assert prune_mask_4_8_pairs(w).tolist() == [[False, False, True, True, True, True, False, False]]
    assert prune_4_8_pairs(w).astype(np.float32).tolist() == [[0, 0, 0, 3, -2, -2, 0, 0]]


def test_nan_counts_as_largest():
    w = np.array([[np.nan, 1.0, 2.0, 3.0]], dtype=np.float16)
    assert prune_mask_2_4(w).tolist() == [[True, False, False, True]]
    assert prune_mask_2_4(w.astype(np.float64)).tolist() == [[True, False, False, True]]


def test_s8_minus_128_is_the_largest_magnitude():
    w = np.array([[127, -128, 0, 1]], dtype=np.int8)
    assert prune_2_4(w).tolist() == [[127, -128, 0, 0]]


def test_sign_is_preserved_and_result_is_new_array():
    w = np.array([[-1.0, -4.0, -3.0, -2.0]], dtype=ml_dtypes.bfloat16)
    out = prune_2_4(w)
    assert out.dtype == w.dtype
    assert out.astype(np.float32).tolist() == [[0.0, -4.0, -3.0, 0.0]]
    assert not np.shares_memory(out, w)


@pytest.mark.parametrize("dtype", sorted(HOST))
def test_every_operand_dtype_matches_definition(dtype):
    rng = np.random.default_rng(7)
    values = rng.standard_normal((9, 64)) * 2
    values[rng.random(values.shape) < 0.3] = 0
    values[:, 5] = values[:, 6]  # ties
    w = values.astype(HOST[dtype])
    mask = prune_mask(w, dtype)
    group, unit, keep = {"tf32": (2, 1, 1), "e2m1": (8, 2, 2)}.get(dtype, (4, 1, 2))
    assert np.array_equal(mask, definition_mask(w, group, unit, keep))
    pruned = prune(w, dtype)
    assert np.array_equal(pruned.astype(np.float64), np.where(mask, w.astype(np.float64), 0))


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 6), groups=st.integers(1, 10), seed=st.integers(0, 2**32 - 1),
       alphabet=st.sampled_from([None, (0.0, 1.0, -1.0), (0.0, -0.0), (2.0, 3.0)]))
def test_f16_fast_path_equals_definition(rows, groups, seed, alphabet):
    rng = np.random.default_rng(seed)
    if alphabet is None:
        values = rng.standard_normal((rows, 4 * groups))
    else:
        values = rng.choice(alphabet, size=(rows, 4 * groups))
    w = values.astype(np.float16)
    mask = prune_mask_2_4(w)
    assert np.array_equal(mask, definition_mask(w, 4, 1, 2))
    assert np.array_equal(mask, prune_mask_2_4(w.astype(np.float64)))  # reference path agrees
    assert (mask.reshape(rows, groups, 4).sum(-1) == 2).all()


def test_keep_mask_reference_counts():
    keys = np.array([[[3, 1, 3, 2]]])
    assert keep_mask_reference(keys, 2).tolist() == [[[True, False, True, False]]]
    assert keep_mask_reference(keys, 1).tolist() == [[[True, False, False, False]]]


def test_axis_and_partial_group():
    w = np.array([[1.0, 4.0], [2.0, 3.0], [5.0, 0.0], [6.0, 7.0], [1.0, 1.0]], dtype=np.float32)
    # along axis 0 the columns have length 5: one full group of 4 and a partial group of 1
    out = prune_2_4(w, axis=0)
    assert out.tolist() == [[0.0, 4.0], [0.0, 0.0], [5.0, 0.0], [6.0, 7.0], [1.0, 1.0]]
    assert np.array_equal(prune_2_4(w.T, axis=-1), out.T)


def test_batched_input_prunes_last_axis():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 3, 8)).astype(np.float16)
    out = prune_2_4(w)
    assert out.shape == w.shape
    assert np.array_equal(out[1], prune_2_4(w[1]))


def test_accepts_lists_and_dlpack_objects():
    assert prune_2_4([[1, 2, 3, 4]]).tolist() == [[0, 0, 3, 4]]

    class Producer:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    w = np.array([[4, 3, 2, 1]], dtype=np.float16)
    assert prune_2_4(Producer(w)).tolist() == [[4, 3, 0, 0]]


def test_rows_are_processed_in_blocks_with_threads():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((300, 4096)).astype(np.float16)
    single = prune_rows(w, PATTERN_2_4, False, workers=1)
    threaded = prune_rows(w, PATTERN_2_4, False, workers=2)
    assert np.array_equal(single.view(np.uint16), threaded.view(np.uint16))
    assert np.array_equal(single, prune_2_4(w))


@pytest.mark.parametrize("bad, code", [
    (np.float16(3.0), "SP0804"),
    (np.array(["a", "b", "c", "d"]), "SP0804"),
    (np.array([object(), 1, 2, 3], dtype=object), "SP0804"),
])
def test_bad_inputs(bad, code):
    with pytest.raises(SparsityError) as info:
        prune_2_4(bad)
    assert info.value.code == code
    assert "help:" in str(info.value)


def test_bad_axis_and_dtype_name():
    with pytest.raises(SparsityError) as info:
        prune_2_4(np.ones((4, 4)), axis=2)
    assert info.value.code == "SP0804"
    with pytest.raises(SparsityError) as info:
        prune(np.ones((4, 4)), "f64")
    assert info.value.code == "SP0801"


@pytest.mark.parametrize("axis", ["a", None, 1.5, True])
def test_axis_must_be_an_integer(axis: object) -> None:
    # a non-integer axis used to escape as TypeError from the range check or from numpy
    w = np.random.default_rng(5).standard_normal((4, 8))
    for fn in (lambda: prune_2_4(w, axis=axis), lambda: prune(w, "f16", axis=axis)):
        with pytest.raises(SparsityError) as info:
            fn()
        assert (info.value.code, info.value.message) == ("SP0804", f"axis must be an integer, got {axis!r}")


def test_nan_above_inf_in_every_precision():
    """NaN ranks above +-inf in w's own precision too (float32/float64 pruned to 2:4 take the
    reference path), as in the operand kernels: a chunk [inf, -inf, NaN, 1] keeps inf and NaN."""
    chunk = [np.inf, -np.inf, np.nan, 1.0]
    want = [True, False, True, False]
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64):
        assert prune_mask_2_4(np.array([chunk], dtype=dtype)).tolist() == [want], dtype
    assert prune_mask_4_8_pairs(np.array([[np.inf, 0, 1, 1, np.nan, 0, np.inf, 1]])).tolist() == [
        [True, True, False, False, True, True, False, False]]


_F16_SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 6.0e-8, -65504.0, 1.0], np.float16)


@settings(max_examples=100)
@given(st.lists(st.integers(0, len(_F16_SPECIALS) - 1), min_size=4, max_size=32))
def test_own_precision_prune_matches_the_operand_kernel(picks: list[int]):
    """Values exact in f16 order the same in float32 and float64: the masks of w and of w cast to
    f16 (the bit-parallel kernel) agree, ties, zeros, infinities and NaN included."""
    w16 = _F16_SPECIALS[picks][None, :]
    want = prune_mask_2_4(w16)
    for wide in (np.float32, np.float64):
        np.testing.assert_array_equal(prune_mask_2_4(w16.astype(wide)), want)


_SPECIAL_FLOATS = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.0, 1e-40, 3.4e38]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint16]),
       st.sampled_from([PATTERN_2_4, PATTERN_1_2, PATTERN_4_8_PAIRS]),
       st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31), st.sampled_from([1, 2]))
def test_comparison_path_in_blocks_equals_the_rule_on_the_whole_array(dtype, pattern, rows, groups, seed, workers):
    """Host dtypes without a bit-parallel kernel are pruned block by block (whole groups, float32
    from its own magnitude bits, each pair of units compared once): the same mask as
    ``keep_mask_reference`` over the whole array's ``unit_keys``, with blocks of a few groups
    across row ends, specials and ties included."""
    rng = np.random.default_rng(seed)
    k = groups * pattern.group
    if np.dtype(dtype).kind == "f":
        w = np.where(rng.random((rows, k)) < 0.3, rng.choice(_SPECIAL_FLOATS, (rows, k)),
                     rng.integers(-3, 4, (rows, k)) * rng.choice([1.0, 0.5], (rows, k))).astype(dtype)
    else:
        info = np.iinfo(dtype)
        w = rng.choice([info.min, info.max, 0, 1, 2, 3, -1 if info.min < 0 else 5], (rows, k)).astype(dtype)
    keys = unit_keys(w, pattern.unit).reshape(rows, groups, pattern.units)
    want = np.repeat(keep_mask_reference(keys, pattern.keep), pattern.unit, axis=-1).reshape(rows, k)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prune_module, "REFERENCE_BLOCK_GROUPS", 3)
        mask = prune_rows(w, pattern, True, workers=workers)
        pruned = prune_rows(w, pattern, False, workers=workers)
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(pruned.view(f"u{w.itemsize}"),
                                  np.where(want, w, np.zeros((), dtype)).view(f"u{w.itemsize}"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=2, max_size=8), st.integers(1, 3))
def test_keep_mask_total_order_is_the_reference_rule(keys: list[int], keep: int):
    """Each pair compared once gives the documented rule's mask (ties keep the lower index)."""
    array = np.array([keys, keys[::-1]], dtype=np.int64)[None]
    np.testing.assert_array_equal(keep_mask_total_order(array, keep), keep_mask_reference(array, keep))
