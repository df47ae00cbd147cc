"""Pruning and transposable masks of ``np.longdouble`` (x86's 80-bit extended) arrays rank by the
values' own magnitudes. The ranking keys went through float64: magnitudes 2**-63 apart tied (the
lower index kept, not the larger), and finite magnitudes past float64's 1.8e308 became inf, so
1e400, 2e400 and 3e400 tied and 3e400 was pruned, silently."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.sparsity import (
    prune_2_4,
    prune_mask_1_2,
    prune_mask_2_4,
    prune_mask_4_8_pairs,
    prune_transposable_2_4,
    transposable_mask_2_4,
)
from sparsile.stdlib.sparsity.transposable import PATTERNS

pytestmark = pytest.mark.skipif(np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant,
                                reason="np.longdouble is float64 on this platform")

LD = np.longdouble
EPS = np.finfo(np.longdouble).eps


def test_magnitudes_past_float64s_range_are_ranked() -> None:
    w = np.array([[LD("1e400"), LD("-3e400"), LD("2e400"), LD(0)]])
    np.testing.assert_array_equal(prune_mask_2_4(w), [[False, True, True, False]])
    pruned = prune_2_4(w)
    assert pruned.dtype == np.longdouble
    np.testing.assert_array_equal(pruned, [[0, LD("-3e400"), LD("2e400"), 0]])
    assert prune_mask_1_2(w).tolist() == [[False, True, True, False]]


def test_magnitudes_closer_than_float64s_resolution_are_ranked() -> None:
    one = LD(1)
    w = np.array([[one, one + 2 * EPS, -(one + EPS), one]])
    assert w[0, 1] != -w[0, 2] != w[0, 0] and float(w[0, 1]) == float(-w[0, 2]) == 1.0
    np.testing.assert_array_equal(prune_mask_2_4(w), [[False, True, True, False]])
    np.testing.assert_array_equal(prune_mask_1_2(w), [[False, True, True, False]])


def test_pairs_are_ranked_by_their_exact_sum() -> None:
    one = LD(1)
    w = np.array([[one, 0, one, EPS, 0, 0, one, 2 * EPS]])
    np.testing.assert_array_equal(prune_mask_4_8_pairs(w), [[False, False, True, True, False, False, True, True]])
    big = np.array([[LD("1e400"), 0, LD("2e400"), 0, LD("1e400"), LD("1e400"), 0, 0]])
    np.testing.assert_array_equal(prune_mask_4_8_pairs(big), [[False, False, True, True, True, True, False, False]])


def test_nan_and_inf_still_rank_above_every_number() -> None:
    w = np.array([[LD("1e400"), LD(np.nan), LD(np.inf), LD("2e400")]])
    np.testing.assert_array_equal(prune_mask_2_4(w), [[False, True, True, False]])
    w = np.array([[LD(np.inf), LD(np.nan), LD("1e400"), LD(1)]])
    np.testing.assert_array_equal(prune_mask_2_4(w), [[True, True, False, False]])


@pytest.mark.parametrize("scale", [LD(1), LD("1e400")], ids=["near-one", "past-float64"])
def test_a_transposable_mask_ranks_by_the_longdouble_sums(scale: np.longdouble) -> None:
    """Each block's best pattern is the one whose elements are a little larger; in float64 every
    pattern summed alike (or to inf) and the first won."""
    for index in (17, 89):
        bump = PATTERNS[index].reshape(4, 4)
        w = scale * (LD(1) + 4 * EPS * bump)
        w = np.vstack([w, -w])
        expected = np.vstack([bump, bump])
        np.testing.assert_array_equal(transposable_mask_2_4(w), expected)
        np.testing.assert_array_equal(prune_transposable_2_4(w), np.where(expected, w, 0))
