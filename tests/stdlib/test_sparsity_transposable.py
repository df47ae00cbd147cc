"""Transposable 2:4 masks (stdlib/sparsity/transposable.py): the 90 block patterns, validity along
rows and columns, optimality against brute force over every 4x4 mask, ties, NaN, ragged shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparsile.stdlib import sparsity as S
from sparsile.stdlib.sparsity import SparsityError
from sparsile.stdlib.sparsity.transposable import PATTERNS


def _all_valid_masks() -> np.ndarray:
    """Every 16-bit mask of a 4x4 block (all 65536) filtered by 2 per row and column: an enumeration
    independent of the module's (which builds row pairs)."""
    masks = ((np.arange(1 << 16)[:, None] >> np.arange(16)[None, :]) & 1).astype(bool)
    grids = masks.reshape(-1, 4, 4)
    return masks[(grids.sum(axis=1) == 2).all(axis=1) & (grids.sum(axis=2) == 2).all(axis=1)]


VALID = _all_valid_masks()


def brute_force_best(block: np.ndarray) -> float:
    """The largest kept |x| over every 4x4 mask with 2 per row and column."""
    return float((VALID @ np.abs(block.astype(np.float64)).reshape(16)).max())


def assert_transposable(mask: np.ndarray) -> None:
    m, k = mask.shape
    assert m % 4 == 0 and k % 4 == 0
    assert (mask.reshape(m, k // 4, 4).sum(axis=2) == 2).all(), "not 2:4 along rows"
    assert (mask.T.reshape(k, m // 4, 4).sum(axis=2) == 2).all(), "not 2:4 along columns"


def test_patterns() -> None:
    assert PATTERNS.shape == (90, 16) and len(VALID) == 90
    grids = PATTERNS.reshape(90, 4, 4)
    assert (grids.sum(axis=1) == 2).all() and (grids.sum(axis=2) == 2).all()
    assert len({p.tobytes() for p in PATTERNS}) == 90


@settings(max_examples=30, deadline=None)
@given(arrays(np.float64, (4, 4), elements=st.floats(-100, 100, allow_nan=False)))
def test_optimal_against_brute_force(block: np.ndarray) -> None:
    mask = S.transposable_mask_2_4(block)
    assert_transposable(mask)
    assert S.kept_magnitude(block, mask) == pytest.approx(brute_force_best(block), rel=1e-12, abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.integers(0, 2**16))
def test_valid_and_blockwise_optimal_on_matrices(mb: int, kb: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(-3, 4, size=(4 * mb, 4 * kb)).astype(np.float32)  # many ties
    mask = S.transposable_mask_2_4(w)
    assert_transposable(mask)
    assert S.kept_magnitude(w, mask) <= S.kept_magnitude(w, S.prune_mask_2_4(w)) + 1e-9
    block = w[:4, :4]
    assert S.kept_magnitude(block, mask[:4, :4]) == pytest.approx(brute_force_best(block))
    np.testing.assert_array_equal(S.transposable_mask_2_4(w), mask)  # deterministic


def test_ties_pick_the_first_pattern() -> None:
    mask = S.transposable_mask_2_4(np.ones((4, 4)))
    np.testing.assert_array_equal(mask.reshape(16), PATTERNS[0])
    np.testing.assert_array_equal(mask, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])


def test_nan_and_inf_are_kept_first() -> None:
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    w[0, 0], w[3, 1] = np.nan, -np.inf
    mask = S.transposable_mask_2_4(w)
    assert_transposable(mask)
    assert mask[0, 0] and mask[3, 1]
    finite = np.where(np.isfinite(w), w, 0)
    best_with_both = max(float(np.abs(finite).reshape(16)[p].sum()) for p in PATTERNS if p[0] and p[13])
    assert float(np.abs(finite)[mask].sum()) == best_with_both


def test_ragged_shape_and_prune() -> None:
    w = np.random.default_rng(2).standard_normal((10, 13)).astype(np.float16)
    mask = S.transposable_mask_2_4(w)
    assert mask.shape == (10, 13)
    padded = np.zeros((12, 16), bool)
    padded[:10, :13] = mask
    assert (padded.reshape(12, 4, 4).sum(axis=2) <= 2).all() and (padded.T.reshape(16, 3, 4).sum(axis=2) <= 2).all()
    pruned = S.prune_transposable_2_4(w)
    assert pruned.dtype == np.float16
    np.testing.assert_array_equal(pruned, np.where(mask, w, 0))
    S.compress(pruned, "f16")
    S.compress(np.ascontiguousarray(pruned[:8, :12].T), "f16")  # the transpose is 2:4 too


def test_bad_input() -> None:
    with pytest.raises(SparsityError) as err:
        S.transposable_mask_2_4(np.zeros(8))
    assert err.value.code == "SP0804" and "must be a 2-D (M, K) matrix, got shape (8,)" in err.value.message
    with pytest.raises(SparsityError) as err:
        S.transposable_mask_2_4(np.array([["a", "b"]]))
    assert err.value.code == "SP0804" and "not numeric" in err.value.message


SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -2.0, 3.0, 0.5]
"""Block elements: NaN, ±inf, ±0.0 and a few numbers whose sums are exact in float64."""


def rank_key(block: np.ndarray, keep: np.ndarray) -> tuple[int, int, float]:
    """The documented order of a kept set (docs/sparse-metadata.md §12), computed independently:
    more NaNs first, then more infinities, then the larger sum of the finite |x|."""
    kept = block.reshape(16)[keep].astype(np.float64)
    finite = np.abs(kept[np.isfinite(kept)])
    return int(np.isnan(kept).sum()), int(np.isinf(kept).sum()), float(finite.sum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(SPECIAL))), min_size=16, max_size=16),
       st.sampled_from([np.float16, np.float32, np.float64]))
def test_special_values_rank_as_pruning_ranks_them(picks: list[int], dtype: type) -> None:
    """NaN ranks above inf above every number, as prune_2_4 ranks them (both from prune.unit_keys);
    the transposable mask counted NaN and inf alike, so between them the first pattern decided.
    The mask is the first pattern (PATTERNS order) of the largest (NaNs, infs, finite sum)."""
    block = np.array([SPECIAL[i] for i in picks], dtype=dtype).reshape(4, 4)
    mask = S.transposable_mask_2_4(block)
    assert_transposable(mask)
    keys = [rank_key(block, p) for p in PATTERNS]
    best = max(keys)
    assert rank_key(block, mask.reshape(16)) == best
    np.testing.assert_array_equal(mask.reshape(16), PATTERNS[keys.index(best)])


def test_nan_beats_inf_in_a_column_as_in_pruning_along_it() -> None:
    """Column 0 holds two infinities and a NaN below them and keeps 2: the NaN and the first inf, as
    prune_mask_2_4 along the columns keeps them (the first pattern, rows 0 and 1, kept both
    infinities)."""
    w = np.ones((4, 4), np.float32)
    w[0, 0], w[1, 0], w[3, 0] = np.inf, -np.inf, np.nan
    mask = S.transposable_mask_2_4(w)
    assert_transposable(mask)
    np.testing.assert_array_equal(mask[:, 0], S.prune_mask_2_4(w, axis=0)[:, 0])
    np.testing.assert_array_equal(mask[:, 0], [True, False, False, True])


def test_kept_magnitude_reads_the_mask_as_a_mask() -> None:
    """An integer 0/1 mask was used as numpy's fancy index (rows 0 and 1, repeated): 288 for a
    mask keeping 68, silently; a mask of another shape or a float mask stopped at numpy's
    IndexError. A boolean mask of w's shape is required (SP0804); a list of bools or a torch bool
    tensor is read as a mask."""
    w = np.arange(16, dtype=np.float32).reshape(4, 4) + 1
    mask = S.transposable_mask_2_4(w)
    expected = float(np.abs(w.astype(np.float64))[mask].sum())
    assert S.kept_magnitude(w, mask) == S.kept_magnitude(w, mask.tolist()) == expected
    for bad, message in [(mask.astype(np.int64), "mask must be a boolean array, got int64"),
                         (mask.astype(np.float32), "mask must be a boolean array, got float32"),
                         (mask[:2], "mask has shape (2, 4), but w has shape (4, 4)"),
                         (mask[:, :3], "mask has shape (4, 3), but w has shape (4, 4)")]:
        with pytest.raises(S.SparsityError) as info:
            S.kept_magnitude(w, bad)
        assert info.value.code == "SP0804"
        assert info.value.message == message
    torch = pytest.importorskip("torch")
    assert S.kept_magnitude(torch.tensor(w), torch.tensor(mask)) == expected


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_a_transposable_mask_ranks_large_integers_exactly(dtype: type) -> None:
    """Integer magnitudes past 2**53 were ranked as float64 (2**60 and 2**60 + 1 alike), so every
    pattern summed alike and the first won; pruning ranks them exactly (as uint64), and so do
    transposable masks now."""
    for index in (17, 89):
        bump = PATTERNS[index].reshape(4, 4)
        w = np.full((4, 4), 2**60, dtype) + bump.astype(dtype)
        expected = bump
        if dtype is np.int64:
            w, expected = np.vstack([w, -w]), np.vstack([bump, bump])
        np.testing.assert_array_equal(S.transposable_mask_2_4(w), expected)
        np.testing.assert_array_equal(S.prune_transposable_2_4(w), np.where(expected, w, 0))
