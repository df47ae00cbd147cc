"""SWAR kernels against plain-Python definitions, lane by lane."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity.swar import (
    U64,
    Workspace,
    keep_lanes,
    lookup_nibbles,
    nibble_table,
    nonzero_pattern,
    rotate_lanes,
    scatter_units,
)


def pack(lanes: np.ndarray, lane_bits: int) -> np.ndarray:
    """(n, G) lane values -> (n,) uint64 words, lane i at bits [W i, W i + W)."""
    words = np.zeros(lanes.shape[0], dtype=np.uint64)
    for i in range(lanes.shape[1]):
        words |= lanes[:, i].astype(np.uint64) << np.uint64(lane_bits * i)
    return words


def unpack(words: np.ndarray, lane_bits: int) -> np.ndarray:
    lanes = 64 // lane_bits
    mask = (1 << lane_bits) - 1
    return np.array([[(int(w) >> (lane_bits * i)) & mask for i in range(lanes)] for w in words], dtype=np.int64)


def top_keep(keys: list[int], keep: int) -> list[bool]:
    """The definition: sort by (larger key first, lower index first) and keep the first ``keep``."""
    order = sorted(range(len(keys)), key=lambda i: (-keys[i], i))
    chosen = set(order[:keep])
    return [i in chosen for i in range(len(keys))]


small_keys = st.lists(st.sampled_from([0, 1, 2, 0x7FFE, 0x7FFF]), min_size=4, max_size=4)
any_keys = st.lists(st.integers(0, 0x7FFF), min_size=4, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(small_keys, any_keys), min_size=1, max_size=40))
def test_keep_lanes_2_of_4_matches_definition(groups):
    keys = np.array(groups, dtype=np.int64)
    lanes = keep_lanes(pack(keys, 16), 16, 2, Workspace(len(groups)))
    got = unpack(lanes, 16)
    for row, key_row in zip(got, groups):
        want = top_keep(key_row, 2)
        assert [v == 0xFFFF for v in row] == want
        assert all(v in (0, 0xFFFF) for v in row)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 1, 0x7FFFFFFE, 0x7FFFFFFF, 12345]), min_size=2, max_size=2),
                min_size=1, max_size=30))
def test_keep_lanes_1_of_2_matches_definition(groups):
    lanes = keep_lanes(pack(np.array(groups, dtype=np.int64), 32), 32, 1, Workspace(len(groups)))
    for row, key_row in zip(unpack(lanes, 32), groups):
        assert [v == 0xFFFFFFFF for v in row] == top_keep(key_row, 1)


def test_keep_lanes_all_ties_keeps_the_first_lanes():
    for value in (0, 5, 0x7FFF):
        lanes = keep_lanes(pack(np.full((1, 4), value), 16), 16, 2, Workspace(1))
        assert int(lanes[0]) == 0x00000000FFFFFFFF


def test_keep_lanes_rejects_unsupported_shape():
    with pytest.raises(ValueError):
        keep_lanes(np.zeros(1, dtype=np.uint64), 8, 4, Workspace(1))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0, 1, 0x7FFF, 300]), min_size=4, max_size=4), min_size=1, max_size=30))
def test_nonzero_pattern_16(groups):
    keys = pack(np.array(groups, dtype=np.int64), 16)
    got = nonzero_pattern(keys, 16, np.empty(len(groups), dtype=np.uint64))
    for pattern, row in zip(got, groups):
        assert int(pattern) == sum(1 << i for i, v in enumerate(row) if v)


def test_nonzero_pattern_32():
    groups = np.array([[0, 0], [1, 0], [0, 0x7FFFFFFF], [7, 9]], dtype=np.int64)
    got = nonzero_pattern(pack(groups, 32), 32, np.empty(4, dtype=np.uint64))
    assert got.tolist() == [0, 1, 2, 3]


def test_nibble_table_lookup():
    table = nibble_table(4, {0: 0x4, 5: 0x8, 15: 0xA})
    got = lookup_nibbles(np.array([0, 5, 15, 3], dtype=np.uint64), table, np.empty(4, dtype=np.uint64))
    assert got.tolist() == [0x4, 0x8, 0xA, 0]


def test_rotate_lanes():
    word = np.array([0x4444333322221111], dtype=np.uint64)
    out = rotate_lanes(word, 1, 16, np.empty(1, U64), np.empty(1, U64))
    assert int(out[0]) == 0x1111444433332222


@pytest.mark.parametrize("unit_bits", [8, 16])
def test_scatter_units_places_kept_units(unit_bits):
    rng = np.random.default_rng(1)
    n = 50
    lo_hi = rng.integers(0, 1 << unit_bits, size=(n, 2))
    first = rng.integers(0, 3, size=n)
    second = first + 1 + rng.integers(0, 3 - first)
    packed = pack(lo_hi, unit_bits)
    f = first.astype(np.uint64) * U64(unit_bits)
    s = second.astype(np.uint64) * U64(unit_bits)
    back = scatter_units(packed, f, s, unit_bits, np.empty(n, U64), np.empty(n, U64))
    for i in range(n):
        lo, hi = int(lo_hi[i, 0]), int(lo_hi[i, 1])
        assert int(back[i]) == (lo << (unit_bits * int(first[i]))) | (hi << (unit_bits * int(second[i])))


def test_workspace_reuses_and_grows():
    ws = Workspace(8)
    a = ws("x", 4)
    b = ws("x", 8)
    assert np.shares_memory(a, b)
    c = ws("x", 20)
    assert c.size == 20
    assert ws("y", 3, np.uint8).dtype == np.uint8
