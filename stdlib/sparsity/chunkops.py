"""Per-width-class chunk operations built on the SWAR kernels: keys, keep masks, compaction.

Every function takes raw element bits (the operand's unsigned storage type) forming whole chunks (a
flat run of chunks of a matrix whose K is padded to a multiple of the chunk size) and returns one
value per chunk. The nibble rules are the ones of docs/hardware.md §3:

* 2:4 and 4:8-in-pairs: nibble = idx0 | idx1 << 2 with idx0 < idx1 (0x4 0x8 0xC 0x9 0xD 0xE).
* 1:2 (tf32): 0x4 keeps element 0, 0xE keeps element 1.
* Fewer nonzeros than kept slots (CUTLASS compressor rule, §3): an all-zero chunk is (0,1) = 0x4
  (never the undefined 0x0); one nonzero at position i < 3 is (i,3); one nonzero at position 3 is
  (0,3) with an explicit zero in the first slot. For 1:2 an all-zero chunk keeps element 0.
* Negative zero counts as zero (the sign bit is ignored).
"""

from __future__ import annotations

import sys

import numpy as np

from .dtypes import OperandType
from .swar import (
    U64,
    Workspace,
    fill_lanes,
    keep_lanes,
    kept_top_bits,
    lookup_nibbles,
    nibble_table,
    nonzero_pattern,
    nonzero_top_bits,
    scatter_units,
    top_bits_to_pattern,
)

if sys.byteorder != "little":  # pragma: no cover - every CUDA host is little-endian
    raise ImportError("sparsile.stdlib.sparsity assumes a little-endian host (as the GPU is)")

NIBBLE_OF_PATTERN_2_4: dict[int, int] = {
    0b0000: 0x4,  # all zero -> (0,1)
    0b0001: 0xC, 0b0010: 0xD, 0b0100: 0xE,  # one nonzero at i < 3 -> (i,3)
    0b1000: 0xC,  # one nonzero at 3 -> (0,3)
    0b0011: 0x4, 0b0101: 0x8, 0b1001: 0xC, 0b0110: 0x9, 0b1010: 0xD, 0b1100: 0xE,
}
"""Nonzero pattern of a 4-unit chunk (bit i = unit i nonzero) -> nibble; missing = not 2:4."""

NIBBLE_OF_PATTERN_1_2: dict[int, int] = {0b00: 0x4, 0b01: 0x4, 0b10: 0xE}
"""Nonzero pattern of a 2-element tf32 chunk -> nibble; 0b11 (two nonzeros) is not 1:2."""

_TABLE_2_4 = nibble_table(4, NIBBLE_OF_PATTERN_2_4)
_TABLE_1_2 = nibble_table(2, NIBBLE_OF_PATTERN_1_2)

_E2M1_TWICE_MAGNITUDE = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.uint8)
"""2·|x| of the eight e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0-7): exact small integers."""

_E2M1_MAGNITUDE_BITS = U64(0x0707070707070707)


def key_words(bits: np.ndarray, op: OperandType, ordered: bool, ws: Workspace) -> tuple[np.ndarray, int]:
    """One uint64 word per chunk whose lanes are the units' magnitude keys, and the lane width.

    ``bits`` is a flat run of whole chunks. With ``ordered`` the keys order the units by magnitude
    (pruning); without, they only tell zero from nonzero (compression), which is cheaper for e2m1.
    """
    n = bits.size // op.group
    keys = ws("keys", n)
    if op.width_class == "16-bit":
        return np.bitwise_and(bits.view(U64), U64(0x7FFF7FFF7FFF7FFF), out=keys), 16
    if op.width_class == "tf32":
        return np.bitwise_and(bits.view(U64), U64(0x7FFFFFFF7FFFFFFF), out=keys), 32
    wide = keys.view(np.uint16)
    if op.width_class == "8-bit":
        if op.magnitude == "sign-magnitude":
            np.bitwise_and(bits, np.uint8(op.magnitude_mask), out=wide, dtype=np.uint16)
        elif op.magnitude == "twos-complement":
            np.abs(bits.view(np.int8).astype(np.int16), out=wide.view(np.int16))  # |-128| = 128
        else:
            np.copyto(wide, bits)
        return keys, 16
    if not ordered:
        return np.bitwise_and(bits.view(U64), _E2M1_MAGNITUDE_BITS, out=keys), 16
    twice = _E2M1_TWICE_MAGNITUDE[bits & np.uint8(7)]
    np.add(twice[0::2], twice[1::2], out=wide, dtype=np.uint16)
    return keys, 16


def _lanes_as_elements(lanes: np.ndarray, op: OperandType) -> np.ndarray:
    """All-ones keep lanes viewed as one all-ones-or-zero value per element (storage type)."""
    if op.width_class == "16-bit":
        return lanes.view(np.uint16)
    if op.width_class == "tf32":
        return lanes.view(np.uint32)
    if op.width_class == "8-bit":
        return lanes.view(np.uint8)[0::2]  # low byte of each 16-bit lane
    return lanes.view(np.uint8)  # a 16-bit pair lane covers both bytes of its pair


def keep_element_mask(bits: np.ndarray, op: OperandType, ws: Workspace) -> np.ndarray:
    """All-ones (in the storage type) for the elements a magnitude prune keeps, zero elsewhere.

    The result is a view of scratch memory: use it before the next call with the same ``ws``.
    """
    keys, lane_bits = key_words(bits, op, True, ws)
    return _lanes_as_elements(keep_lanes(keys, lane_bits, op.pattern.keep, ws), op)


def _element_words(bits: np.ndarray, op: OperandType, ws: Workspace) -> tuple[np.ndarray, int]:
    """One uint64 word per chunk holding the chunk's raw elements, and the unit width in bits."""
    if op.width_class == "8-bit":
        words = ws("elements", bits.size // 4)
        np.copyto(words, bits.view(np.uint32))
        return words, 8
    return bits.view(U64), {"16-bit": 16, "tf32": 32, "4-bit": 16}[op.width_class]


UNIT_BITS = {"16-bit": 16, "tf32": 32, "8-bit": 8, "4-bit": 16}
"""Width of one metadata index unit in the raw bits: an element, or an e2m1 pair (2 x 8 bits)."""


def values_word_dtype(op: OperandType) -> np.dtype:
    """The unsigned type that holds the kept half of one chunk (two units, or one tf32 element)."""
    return np.dtype(np.uint16) if op.width_class == "8-bit" else np.dtype(np.uint32)


def unit_dtype(op: OperandType) -> np.dtype:
    """The unsigned type of one index unit's raw bits: an element, or an e2m1 pair (2 bytes)."""
    return np.dtype(f"u{UNIT_BITS[op.width_class] // 8}")


def _unit_offsets(nibbles: np.ndarray, op: OperandType, ws: Workspace,
                  index_out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Bit offsets (index · unit bits) of the kept units of every chunk; with ``index_out`` (a
    flat uint8 array of S entries per chunk) also the logical indices."""
    n = nibbles.size
    first = ws("first", n)
    if op.width_class == "tf32":  # 0x4 -> element 0, 0xE -> element 1
        np.right_shift(nibbles, U64(3), out=first)
        if index_out is not None:
            np.copyto(index_out, first, casting="unsafe")
        first <<= U64(5)
        return first, None
    second = ws("second", n)
    np.bitwise_and(nibbles, U64(3), out=first)
    np.right_shift(nibbles, U64(2), out=second)
    if index_out is not None:
        np.copyto(index_out[0::2], first, casting="unsafe")
        np.copyto(index_out[1::2], second, casting="unsafe")
    shift = U64(UNIT_BITS[op.width_class].bit_length() - 1)
    first <<= shift
    second <<= shift
    return first, second


def _emit(bits: np.ndarray, nibbles: np.ndarray, op: OperandType, ws: Workspace, values_out: np.ndarray,
          index_out: np.ndarray) -> int:
    """Shared tail of compression: nibbles -> indices and kept units; returns the bad-chunk count.

    Casting a shifted word to the unit type keeps exactly the unit's bits, so the kept units are
    extracted with one shift and one narrowing copy each.
    """
    n = nibbles.size
    bad = n - int(np.count_nonzero(nibbles))
    first, second = _unit_offsets(nibbles, op, ws, index_out)
    words, _ = _element_words(bits, op, ws)
    unit = ws("unit", n)
    np.right_shift(words, first, out=unit)
    if second is None:
        np.copyto(values_out, unit, casting="unsafe")
        return bad
    np.copyto(values_out[0::2], unit, casting="unsafe")
    np.right_shift(words, second, out=unit)
    np.copyto(values_out[1::2], unit, casting="unsafe")
    return bad


def _table(op: OperandType) -> int:
    return _TABLE_1_2 if op.width_class == "tf32" else _TABLE_2_4


def compress_block(bits: np.ndarray, op: OperandType, ws: Workspace, values_out: np.ndarray,
                   index_out: np.ndarray) -> int:
    """Compress a flat run of whole chunks: the kept units, in order, into ``values_out`` (flat,
    :func:`unit_dtype`, S per chunk) and the logical indices into ``index_out`` (flat uint8, S per
    chunk). Returns the number of chunks with too many nonzeros (their outputs are junk).
    """
    n = bits.size // op.group
    keys, lane_bits = key_words(bits, op, False, ws)
    nibbles = nonzero_pattern(keys, lane_bits, ws("nibbles", n))
    lookup_nibbles(nibbles, _table(op), nibbles)
    return _emit(bits, nibbles, op, ws, values_out, index_out)


def prune_compress_block(bits: np.ndarray, op: OperandType, ws: Workspace, values_out: np.ndarray,
                         index_out: np.ndarray) -> None:
    """:func:`compress_block` of the magnitude-pruned chunks, without writing the pruned matrix.

    The nonzero pattern of a pruned chunk is (kept lanes) AND (nonzero lanes); from there the
    CUTLASS rules apply as in ``compress_block(prune(bits))``. Units are read from the pruned bits
    (dropped elements cleared), so even the sign of an explicit zero matches bit for bit.
    """
    n = bits.size // op.group
    keys, lane_bits = key_words(bits, op, True, ws)
    kept = kept_top_bits(keys, lane_bits, op.pattern.keep, ws)
    nibbles = nonzero_top_bits(keys, lane_bits, ws("nibbles", n))
    nibbles &= kept
    top_bits_to_pattern(nibbles, lane_bits)
    lookup_nibbles(nibbles, _table(op), nibbles)
    lanes = fill_lanes(kept, lane_bits, ws("lanes", n))
    pruned = ws("pruned", bits.size, bits.dtype)
    np.bitwise_and(bits, _lanes_as_elements(lanes, op), out=pruned)
    _emit(pruned, nibbles, op, ws, values_out, index_out)


def chunk_nibbles(bits: np.ndarray, op: OperandType) -> np.ndarray:
    """Nibble per chunk (0 where the chunk breaks the pattern) of a flat run of whole chunks."""
    ws = Workspace(bits.size // op.group)
    keys, lane_bits = key_words(bits, op, False, ws)
    nibbles = nonzero_pattern(keys, lane_bits, ws("nibbles", keys.size))
    return lookup_nibbles(nibbles, _table(op), nibbles).copy()


def nonzero_count(bits: np.ndarray, op: OperandType) -> np.ndarray:
    """Nonzero units (elements; pairs for e2m1) per chunk of a flat run of whole chunks."""
    ws = Workspace(bits.size // op.group)
    keys, lane_bits = key_words(bits, op, False, ws)
    patterns = nonzero_pattern(keys, lane_bits, ws("nibbles", keys.size))
    counts = np.zeros(patterns.shape, dtype=np.int64)
    for lane in range(64 // lane_bits):
        counts += ((patterns >> U64(lane)) & U64(1)).astype(np.int64)
    return counts


def decompress_block(packed: np.ndarray, nibbles: np.ndarray, op: OperandType) -> np.ndarray:
    """Flat raw element bits from packed values per chunk and valid nibbles per chunk."""
    n = nibbles.size
    ws = Workspace(n)
    first, second = _unit_offsets(nibbles.astype(U64).reshape(-1), op, ws, None)
    words = scatter_units(packed.astype(U64).reshape(-1), first, second, UNIT_BITS[op.width_class],
                          ws("words", n), ws("tmp", n))
    if op.width_class == "8-bit":
        return words.astype(np.uint32).view(np.uint8)
    return words.view(op.storage_dtype).copy()


def nibbles_to_index_array(nibbles: np.ndarray, op: OperandType) -> np.ndarray:
    """Logical indices (..., S) uint8 from nibbles of any shape (..., chunks)."""
    flat = nibbles.astype(U64).reshape(-1)
    slots = 1 if op.width_class == "tf32" else 2
    out = np.empty(flat.size * slots, dtype=np.uint8)
    _unit_offsets(flat, op, Workspace(flat.size), out)
    return out.reshape(*nibbles.shape, slots)


def pack_nibbles(nibbles: np.ndarray) -> np.ndarray:
    """(M, C) nibbles -> (M, ceil(C/2)) bytes, chunk 2i in the low nibble of byte i; an odd last
    chunk is paired with the padding nibble 0x4."""
    rows, chunks = nibbles.shape
    if chunks % 2:
        nibbles = np.concatenate([nibbles, np.full((rows, 1), 0x4, dtype=np.uint8)], axis=1)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << np.uint8(4))


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_nibbles` (keeping a padding nibble of an odd row length)."""
    nibbles = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    nibbles[:, 0::2] = packed & np.uint8(0xF)
    nibbles[:, 1::2] = packed >> np.uint8(4)
    return nibbles
