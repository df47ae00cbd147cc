"""Where every metadata nibble lives in each format: padding, shapes, and the word permutations.

A metadata nibble describes one chunk (row m, chunk c) of the sparse operand. All three formats are
computed from the same "nibble grid" (M, K/G) of uint8 nibbles:

* "logical": no nibbles at all, the (M, K/G, S) uint8 index array.
* "sm90" (docs/hardware.md §4.2 and §3): uint32 words, Mp = M rounded up to 16, Kp = K rounded
  up to the instruction K. 8-bit: word [m, j] = the 8 nibbles of row m for chunks 8j..8j+7 (chunk
  8j+i at bits 4i), i.e. K [32j, +32). 16-bit and tf32: word [L, kb] with
  ``L = 16·(m//16) + 8·h + m%8`` holds chunks 8kb+4h .. +3 of row m (m%16 < 8) in bits [15:0] and
  the same chunks of row m+8 in bits [31:16]: one MMA instruction's 8 chunks are split into two
  halves h, and a thread of the selected pair loads the word of its half (K [32kb+16h, +16) for
  16-bit, [16kb+8h, +8) for tf32). This equals CUTLASS's word index ``kb + NumK·((m%8) + 8h +
  16(m/16))``. 4-bit operands have no sm90 format.
* "tcgen05" (docs/hardware.md §1.4): the TMEM image that TMA and ``tcgen05.cp.128x128b`` load
  unchanged. The cell (lane, column) of a 128-row M tile holds the sm90-style word of that lane
  and column (16-bit, tf32: one column per instruction; 8-bit: lane = m, column c = K [32c, +32);
  4-bit: lane = m, column c = 8 nibbles of 8-element chunks, K [64c, +64)). An atom is 128 lanes x
  4 columns = 2 KB (lane r = bytes [16r, +16), column c = word c of the row), covering K = 128
  (16-bit), 64 (tf32), 128 (8-bit) or 256 (4-bit). The array has shape (Kp/atomK, Mp/128, 128,
  4), C order, so the M atom index varies fastest ("M first, then K"); Mp = M rounded up to 128.

Padding (rows beyond M, chunks beyond K/G) is filled with zero-valued chunks, nibble 0x4.
"""

from __future__ import annotations

import numpy as np

from .chunkops import pack_nibbles, unpack_nibbles
from .dtypes import OperandType
from .errors import SP_FORMAT_UNSUPPORTED, SP_UNKNOWN_FORMAT, SparsityError
from .hostarray import checked_size

FORMATS = ("tcgen05", "sm90", "logical")
"""Every metadata format name."""

PAD_NIBBLE = 0x4
"""Nibble of a padding chunk: (0,1) with zero values (docs/hardware.md §3: never 0x0)."""

TMEM_LANES = 128
ATOM_COLUMNS = 4
NIBBLES_PER_WORD = 8


def check_format(fmt: object) -> str:
    """``fmt`` if it names a format, else SP0802."""
    if isinstance(fmt, str) and fmt in FORMATS:
        return fmt
    raise SparsityError(SP_UNKNOWN_FORMAT, f"unknown metadata format {fmt!r}",
                        help="use one of " + ", ".join(repr(f) for f in FORMATS))


def check_supported(fmt: str, op: OperandType) -> None:
    """SP0811 for the one combination that does not exist: 4-bit operands in the sm90 format."""
    if fmt == "sm90" and op.width_class == "4-bit":
        raise SparsityError(SP_FORMAT_UNSUPPORTED,
                            f"{op.name} has no sm90 metadata format: Hopper's wgmma.sp has no 4-bit kind",
                            help="use fmt='tcgen05' (sparse kind::mxf4 on sm_100a) or fmt='logical'")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pad_sizes(fmt: str, op: OperandType, m: int, k: int) -> tuple[int, int]:
    """(Mp, Kp): the logical sizes after the padding a format needs.

    logical: (M, K rounded up to G); sm90: (M rounded up to 16, K rounded up to the instruction K);
    tcgen05: (M rounded up to 128, K rounded up to the atom K).
    """
    check_format(fmt)
    check_supported(fmt, op)
    if fmt == "logical":
        return m, _round_up(k, op.group)
    if fmt == "sm90":
        return _round_up(m, 16), _round_up(k, op.instr_k)
    return _round_up(m, TMEM_LANES), _round_up(k, op.atom_k)


def metadata_shape(fmt: str, op: OperandType, m: int, k: int) -> tuple[int, ...]:
    """Shape of the metadata array of an (m, k) operand in format ``fmt``."""
    mp, kp = pad_sizes(fmt, op, m, k)
    chunks = kp // op.group
    if fmt == "logical":
        return m, chunks, 1 if op.width_class == "tf32" else 2
    if fmt == "sm90":
        return mp, chunks // NIBBLES_PER_WORD
    return kp // op.atom_k, mp // TMEM_LANES, TMEM_LANES, ATOM_COLUMNS


def word_position(fmt: str, op: OperandType, row: int, chunk: int) -> tuple[tuple[int, ...], int]:
    """(index of the uint32 word in the metadata array, nibble slot 0-7 in that word) of the nibble
    of (row, chunk); the nibble occupies bits [4·slot, 4·slot + 4). Not for "logical"."""
    row, chunk = checked_size(row, "row"), checked_size(chunk, "chunk")
    column, slot = divmod(chunk, NIBBLES_PER_WORD)
    lane = row
    if op.interleaved:
        half, j = divmod(slot, 4)
        lane = 16 * (row // 16) + 8 * half + row % 8
        slot = 4 * ((row // 8) % 2) + j
    if fmt == "sm90":
        return (lane, column), slot
    return (column // ATOM_COLUMNS, lane // TMEM_LANES, lane % TMEM_LANES, column % ATOM_COLUMNS), slot


def _interleave_rows(words: np.ndarray) -> np.ndarray:
    """Row-major words (Mp, C) -> 16-bit/tf32 words: [L = 16a + 8h + r, c] = half h of row 16a+r
    in bits [15:0] and half h of row 16a+8+r in bits [31:16]."""
    mp, cols = words.shape
    halves = words.view(np.uint16).reshape(mp // 16, 2, 8, cols, 2)  # (a, b, r, c, h)
    merged = halves[:, 0].astype(np.uint32)
    merged |= halves[:, 1].astype(np.uint32) << np.uint32(16)  # (a, r, c, h)
    return np.ascontiguousarray(merged.transpose(0, 3, 1, 2)).reshape(mp, cols)


def _deinterleave_rows(words: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_interleave_rows`."""
    mp, cols = words.shape
    by_half = words.reshape(mp // 16, 2, 8, cols).transpose(0, 2, 3, 1)  # (a, r, c, h)
    halves = np.empty((mp // 16, 2, 8, cols, 2), dtype=np.uint16)
    halves[:, 0] = by_half & np.uint32(0xFFFF)
    halves[:, 1] = by_half >> np.uint32(16)
    return halves.reshape(mp, cols * 2).view(np.uint32)


_LANE_ROW = np.dtype("V16")
"""One TMEM lane's 4 columns (16 bytes) as a single element, so atom transposes move 16-byte units."""


def _to_atoms(words: np.ndarray) -> np.ndarray:
    """(Mp, Cw) words -> (Cw/4, Mp/128, 128, 4): atom (ka, ma) holds lanes 128ma.. and columns 4ka.."""
    mp, cols = words.shape
    lanes = np.ascontiguousarray(words).view(_LANE_ROW).reshape(mp, cols // ATOM_COLUMNS)
    atoms = np.ascontiguousarray(lanes.T).reshape(cols // ATOM_COLUMNS, mp // TMEM_LANES, TMEM_LANES)
    return atoms.view(np.uint32).reshape(cols // ATOM_COLUMNS, mp // TMEM_LANES, TMEM_LANES, ATOM_COLUMNS)


def _from_atoms(data: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_to_atoms`."""
    katoms, matoms = data.shape[0], data.shape[1]
    lanes = np.ascontiguousarray(data).view(_LANE_ROW).reshape(katoms, matoms * TMEM_LANES)
    return np.ascontiguousarray(lanes.T).view(np.uint32).reshape(matoms * TMEM_LANES, katoms * ATOM_COLUMNS)


def words_from_packed(packed: np.ndarray, fmt: str, op: OperandType, k: int) -> np.ndarray:
    """The uint32 metadata array of format ``fmt`` ("sm90" or "tcgen05") from nibbles packed two
    per byte, (M, ceil(ceil(k/G)/2)); padding rows and chunks get the nibble 0x4."""
    m = packed.shape[0]
    mp, kp = pad_sizes(fmt, op, m, k)
    width = kp // op.group // 2
    if packed.shape != (mp, width):
        grid = np.full((mp, width), PAD_NIBBLE * 0x11, dtype=np.uint8)
        grid[:m, :packed.shape[1]] = packed
        chunks = -(-k // op.group)
        if chunks % 2 and chunks < 2 * width:  # the high nibble of an odd row's last byte is padding
            grid[:m, chunks // 2] = (grid[:m, chunks // 2] & np.uint8(0xF)) | np.uint8(PAD_NIBBLE << 4)
        packed = grid
    words = np.ascontiguousarray(packed).view("<u4").astype(np.uint32, copy=False)
    if op.interleaved:
        words = _interleave_rows(words)
    return words if fmt == "sm90" else _to_atoms(words)


def words_from_nibbles(nibbles: np.ndarray, fmt: str, op: OperandType, k: int) -> np.ndarray:
    """:func:`words_from_packed` from an (M, ceil(k/G)) nibble grid."""
    return words_from_packed(pack_nibbles(nibbles), fmt, op, k)


def nibbles_from_words(data: np.ndarray, fmt: str, op: OperandType) -> np.ndarray:
    """The full padded nibble grid (Mp, Kp/G) of an "sm90" or "tcgen05" array (shape already checked)."""
    words = np.asarray(data, dtype=np.uint32)
    if fmt == "tcgen05":
        words = _from_atoms(words)
    if op.interleaved:
        words = _deinterleave_rows(np.ascontiguousarray(words))
    return unpack_nibbles(np.ascontiguousarray(words, dtype="<u4").view(np.uint8))
