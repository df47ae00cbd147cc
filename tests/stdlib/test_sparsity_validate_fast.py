"""The table-driven word check of validate_metadata agrees with the nibble-grid definition.

``validate_metadata`` first looks every 16-bit half of the words up in a 65536-entry table and
unpacks the nibble grid only when that finds a bad nibble. These tests compare it with the grid
check alone (``_check_nibbles``, the definition) on random words, bad nibbles included: the same
verdict, and for a bad buffer the same code, message (first bad position) and help.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import SparsityError, operand_type, validate_metadata
from sparsile.stdlib.sparsity.layouts import metadata_shape, nibbles_from_words
from sparsile.stdlib.sparsity.validate import (
    ORDERED_NIBBLES,
    _check_nibbles,
    _half_table,
    _words_valid,
    accepted_nibbles,
)

# (dtype, m, k): 16-bit (interleaved rows), 8-bit and tf32 operands, with padding rows and chunks
SHAPES = [("f16", 20, 64), ("bf16", 16, 96), ("e4m3", 16, 128), ("s8", 9, 64), ("tf32", 16, 40)]


def definition(words: np.ndarray, fmt: str, dtype: str, m: int, k: int, allow_unordered: bool) -> object:
    """The verdict of the nibble-grid check alone: None, or (code, message, help) of its error."""
    op = operand_type(dtype)
    try:
        _check_nibbles(nibbles_from_words(words, fmt, op), fmt, op, m, k, allow_unordered)
    except SparsityError as err:
        return err.code, err.message, err.help
    return None


def verdict(words: np.ndarray, fmt: str, dtype: str, m: int, k: int, allow_unordered: bool) -> object:
    try:
        validate_metadata(words, fmt, dtype, m, k, allow_unordered=allow_unordered)
    except SparsityError as err:
        return err.code, err.message, err.help
    return None


@given(shape=st.sampled_from(SHAPES), fmt=st.sampled_from(["sm90", "tcgen05"]), allow_unordered=st.booleans(),
       seed=st.integers(0, 2**32 - 1), bad=st.integers(0, 5), uniform=st.booleans())
def test_fast_check_agrees_with_the_nibble_grid(shape, fmt, allow_unordered, seed, bad, uniform):
    dtype, m, k = shape
    op = operand_type(dtype)
    rng = np.random.default_rng(seed)
    size = int(np.prod(metadata_shape(fmt, op, m, k)))
    if uniform:  # every nibble value, most buffers bad somewhere
        nibbles = rng.integers(0, 16, (size, 8), dtype=np.uint32)
    else:  # accepted nibbles, then `bad` random nibbles anywhere (padding included) set to any value
        accepted = np.array(sorted(accepted_nibbles(op, fmt, allow_unordered)), dtype=np.uint32)
        nibbles = accepted[rng.integers(0, accepted.size, (size, 8))]
        for _ in range(bad):
            nibbles[rng.integers(0, size), rng.integers(0, 8)] = rng.integers(0, 16)
    words = np.zeros(size, np.uint32)
    for slot in range(8):
        words |= nibbles[:, slot] << np.uint32(4 * slot)
    words = words.reshape(metadata_shape(fmt, op, m, k))
    expected = definition(words, fmt, dtype, m, k, allow_unordered)
    assert verdict(words, fmt, dtype, m, k, allow_unordered) == expected
    assert _words_valid(words, accepted_nibbles(op, fmt, allow_unordered)) == (expected is None)


@pytest.mark.parametrize("nibble", range(16))
@pytest.mark.parametrize("slot", range(4))
def test_half_table_entries(nibble, slot):
    """One nibble in an otherwise valid 16-bit half decides its entry."""
    table = _half_table(frozenset(ORDERED_NIBBLES))
    half = (0x4444 & ~(0xF << (4 * slot))) | (nibble << (4 * slot))
    assert bool(table[half]) == (nibble in ORDERED_NIBBLES)


def test_bad_nibble_past_the_first_scan_step_is_found():
    """A bad nibble in the last word of a buffer longer than one scan step (2**16 halves)."""
    m, k = 512, 4096
    words = np.full(metadata_shape("sm90", operand_type("bf16"), m, k), 0x44444444, np.uint32)
    assert words.size * 2 > 1 << 16
    validate_metadata(words, "sm90", "bf16", m, k)
    words[-1, -1] = 0x44444404
    expected = definition(words, "sm90", "bf16", m, k, False)
    assert expected is not None and expected[0] == "SP0807"
    assert verdict(words, "sm90", "bf16", m, k, False) == expected
    assert "row 503, group 1021 (K 4084..4087), word [511, 127] bits 4..7" in expected[1]


def test_non_contiguous_words_are_checked():
    """A transposed (non-contiguous) int32 view is checked word by word like a contiguous copy."""
    m, k = 16, 256
    words = np.full(metadata_shape("sm90", operand_type("f16"), m, k), 0x44444444, np.uint32)
    words[3, 1] = 0x44F44444
    strided = np.asfortranarray(words).view(np.int32)
    assert not strided.flags.c_contiguous
    assert verdict(strided, "sm90", "f16", m, k, False) == definition(words, "sm90", "f16", m, k, False)
