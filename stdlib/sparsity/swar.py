"""Bit-parallel (SWAR) kernels on 64-bit words that hold one sparsity chunk each.

A chunk of G units is viewed as one ``uint64`` word with G lanes of W = 64 / G bits: four 16-bit
lanes (f16/bf16 elements; 8-bit elements and e2m1 pairs after widening their keys to 16 bits) or
two 32-bit lanes (tf32 elements). Every function here works on a flat run of such words with a
fixed, short sequence of numpy integer operations, so a 16384 x 16384 matrix is pruned and
compressed without a Python loop over rows or groups.

Lane keys must be below 2**(W-1): the top bit of every lane is free, which lets one subtraction
compare all lanes at once without borrows crossing lanes.

Temporaries live in a :class:`Workspace` and every step writes with ``out=``: allocating fresh
arrays for each of the ~25 steps costs more than the arithmetic (the allocator returns large
blocks to the OS and faults them in again).
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64


class Workspace:
    """Named scratch arrays of a fixed capacity, reused across blocks by one thread."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._arrays: dict[tuple[str, np.dtype], np.ndarray] = {}

    def __call__(self, name: str, size: int, dtype: object = U64) -> np.ndarray:
        """The first ``size`` elements of scratch array ``name`` (``size`` <= capacity·8/itemsize)."""
        key = (name, np.dtype(dtype))
        array = self._arrays.get(key)
        if array is None or array.size < size:
            array = np.empty(max(size, self.capacity), dtype=dtype)
            self._arrays[key] = array
        return array[:size]


def repeat_lanes(lane_value: int, lane_bits: int) -> int:
    """``lane_value`` copied into every lane of a 64-bit word."""
    return sum(lane_value << (lane_bits * i) for i in range(64 // lane_bits))


def _high_bits(lane_bits: int) -> U64:
    return U64(repeat_lanes(1 << (lane_bits - 1), lane_bits))


def _tie_offsets(lane_bits: int, distance: int) -> U64:
    """1 in every lane i with i + distance >= G: there the compared lane j = (i + distance) mod G
    has a lower index than i, and a lower index wins a tie."""
    lanes = 64 // lane_bits
    return U64(sum(1 << (lane_bits * i) for i in range(lanes) if i + distance >= lanes))


def rotate_lanes(words: np.ndarray, lanes: int, lane_bits: int, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """Rotate by ``lanes`` lanes towards lane 0 (lane i receives lane (i + lanes) mod G) into ``out``."""
    np.right_shift(words, U64(lanes * lane_bits), out=out)
    np.left_shift(words, U64(64 - lanes * lane_bits), out=tmp)
    out |= tmp
    return out


def _not_beaten(keys: np.ndarray, keys_high: np.ndarray, lane_bits: int, distance: int,
                out: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Top bit of lane i of ``out`` set iff lane i is not beaten by lane j = (i + distance) mod G.

    j beats i when key_j > key_i, or key_j == key_i and j < i (ties go to the lower index). It is
    (key_i | 2**(W-1)) - (key_j + [j < i]): the top bit survives iff key_i >= key_j + [j < i]. The
    lower bits of each lane are left as garbage; only the top bits are used.
    """
    rotate_lanes(keys, distance, lane_bits, a, b)
    a += _tie_offsets(lane_bits, distance)
    return np.subtract(keys_high, a, out=out)


def kept_top_bits(keys: np.ndarray, lane_bits: int, keep: int, ws: Workspace) -> np.ndarray:
    """Top bit of every lane set iff the lane is among the ``keep`` largest keys of its word, ties
    to the lower lane; all other bits zero. (A view of scratch memory.)

    Supported: four 16-bit lanes keeping 2 (2:4, 4:8 pairs) and two 32-bit lanes keeping 1 (1:2).
    For 2:4 a lane is kept iff at least two of its three comparisons say "not beaten" (a bitwise
    majority). The comparison with lane i-1 is the complement of lane i-1's comparison with lane i,
    moved up one lane, so only two subtractions are needed.
    """
    n = keys.size
    high = _high_bits(lane_bits)
    keys_high, a, b, n1 = ws("kh", n), ws("a", n), ws("b", n), ws("n1", n)
    np.bitwise_or(keys, high, out=keys_high)
    _not_beaten(keys, keys_high, lane_bits, 1, n1, a, b)
    if (lane_bits, keep) == (16, 2):
        n2 = _not_beaten(keys, keys_high, 16, 2, ws("n2", n), a, b)
        np.bitwise_xor(n1, high, out=b)
        n3 = rotate_lanes(b, 3, 16, a, keys_high)  # lane i: not beaten by lane i-1
        np.bitwise_or(n1, n2, out=b)
        b &= n3
        n1 &= n2
        n1 |= b
    elif (lane_bits, keep) != (32, 1):
        raise ValueError(f"no SWAR rule for {64 // lane_bits} lanes of {lane_bits} bits keeping {keep}")
    n1 &= high
    return n1


def fill_lanes(top_bits: np.ndarray, lane_bits: int, out: np.ndarray) -> np.ndarray:
    """Turn lanes whose top bit is set into all-ones lanes: (t << 1) - (t >> (W-1)) per lane (the
    carry out of the top lane is discarded, which is what lane 3 needs)."""
    np.left_shift(top_bits, U64(1), out=out)
    top_bits >>= U64(lane_bits - 1)
    out -= top_bits
    return out


def keep_lanes(keys: np.ndarray, lane_bits: int, keep: int, ws: Workspace) -> np.ndarray:
    """All-ones lanes for the ``keep`` largest keys of every word, ties to the lower lane."""
    top = kept_top_bits(keys, lane_bits, keep, ws)
    return fill_lanes(top, lane_bits, ws("a", keys.size))


_GATHER_MAGIC = {16: (U64((1 << 48) + (1 << 33) + (1 << 18) + (1 << 3)), U64(48)),
                 32: (U64((1 << 32) + (1 << 1)), U64(32))}
"""Multiplier and shift that move the top bit of every lane into the low bits, lane i -> bit i.
For W = 16 the terms 2**(48 - 15 i) put bit 16 i at bit 48 + i; all partial products land on
distinct bit positions, so no carries disturb bits 48..51."""


def nonzero_top_bits(keys: np.ndarray, lane_bits: int, out: np.ndarray) -> np.ndarray:
    """Top bit of every lane set iff the lane's key is nonzero (keys < 2**(W-1))."""
    np.add(keys, U64(repeat_lanes((1 << (lane_bits - 1)) - 1, lane_bits)), out=out)
    out &= _high_bits(lane_bits)
    return out


def top_bits_to_pattern(top_bits: np.ndarray, lane_bits: int) -> np.ndarray:
    """In place: lane top bits -> a G-bit pattern, lane i -> bit i."""
    magic, shift = _GATHER_MAGIC[lane_bits]
    top_bits >>= U64(lane_bits - 1)
    top_bits *= magic
    top_bits >>= shift
    return top_bits


def nonzero_pattern(keys: np.ndarray, lane_bits: int, out: np.ndarray) -> np.ndarray:
    """Bit i of ``out`` set iff lane i of the word has a nonzero key (keys < 2**(W-1))."""
    return top_bits_to_pattern(nonzero_top_bits(keys, lane_bits, out), lane_bits)


def nibble_table(pattern_bits: int, nibble_of: dict[int, int]) -> int:
    """Pack a lookup table of nibbles indexed by a ``pattern_bits``-bit pattern into one integer,
    entry p at bits [4p, 4p+4) (so that ``(table >> 4p) & 0xF`` looks it up without a gather)."""
    table = 0
    for pattern in range(1 << pattern_bits):
        table |= nibble_of.get(pattern, 0) << (4 * pattern)
    return table


def lookup_nibbles(patterns: np.ndarray, table: int, out: np.ndarray) -> np.ndarray:
    """``(table >> 4p) & 0xF`` for every pattern p, into ``out`` (which may be ``patterns``)."""
    np.left_shift(patterns, U64(2), out=out)
    np.right_shift(U64(table), out, out=out)
    out &= U64(0xF)
    return out


def scatter_units(packed: np.ndarray, first: np.ndarray, second: np.ndarray | None, unit_bits: int,
                  out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """Decompression of one chunk per word: bits [0, U) of ``packed`` go to bit offset ``first``
    and bits [U, 2U) to offset ``second`` of an otherwise zero word."""
    mask = U64((1 << unit_bits) - 1)
    np.bitwise_and(packed, mask, out=out)
    out <<= first
    if second is not None:
        np.right_shift(packed, U64(unit_bits), out=tmp)
        tmp &= mask
        tmp <<= second
        out |= tmp
    return out
