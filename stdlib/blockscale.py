"""Block-scaled (MX) operands for Blackwell ``tcgen05.mma ... kind::mxf8f6f4.block_scale``: quantize,
dequantize, the scale-factor layout of tensor memory, and a float64 reference matmul.

Pure numpy (plus ml_dtypes), independent of the compiler::

    q, s = quantize_mx(x, block=32)              # e4m3 values, UE8M0 scales (rows, ceil(K/32)) uint8
    x_again = dequantize_mx(q, s, block=32)      # float64
    atoms = encode_scales(s)                     # (Kg, Rp/128, 32, 4) uint32: the "tcgen05" scale format
    ref = scaled_matmul_reference(qa, sa, qb, sb, block=32)   # (A·SA) @ (B·SB)^T in float64

**Semantics** (PTX ISA 9.7.16.10.7 "Block Scaling"): ``D = (A * scale_A) @ (B * scale_B) + D`` where
every ``block`` consecutive K elements of a row of A (a column of B; sparsile stores B as N x K, so
a row of our B) share one UE8M0 scale ``2^(byte - 127)`` (byte 0xFF is NaN). One dense mxf8f6f4
instruction has K = 32 and one scale per row (``scale_vec::1X``, block 32). A *sparse* instruction
has logical K = 64 and still one scale per row, so its block is **64 logical K elements** (32 stored
values of the compressed A): CUTLASS's documentation says the same ("32 or 64 elements for sparse as
sparse gemm compress 2x along k-dim"). ``block`` is therefore 32 for dense and 64 for sparse.

**The "tcgen05" scale format.** A 512-byte *atom* holds the scales of 128 rows x 4 blocks: row
``m = r + 32·c`` (r < 32, c < 4) and block ``j`` (j < 4) is byte ``16·r + 4·c + j`` — 32 lines of 16
bytes, i.e. the 128x4 block-scaling-factor tiling cuBLAS and cuDNN document for MXFP8.
``tcgen05.cp.cta_group::1.32x128b.warpx4`` copies line ``r`` to TMEM lane ``r`` of each of the four
32-lane quarters ("scale factors ... need to be duplicated to all 32 lane partitions", PTX ISA
9.7.16.10.7), its 16 bytes to 4 consecutive 32-bit columns: word ``c`` to column ``c``. So TMEM
(lane ``32q + r``, column ``c``, byte ``j``) holds the scale of row ``r + 32c``, block ``j``, and
the instruction that uses block ``j`` selects byte ``j`` with its scale-factor id (idesc bits
29-30 for A, 4-5 for B; PTX ISA 9.7.16.4.2 Table 43: "SFA_ID specifies the byte offset in the
Tensor Memory word"). Atoms are ordered row tile first, then K group: atom ``(g, t)`` is element
``[g, t]`` of the (Kg, Rp/128) array, so the row tiles of one K group are consecutive (an N tile of
256 rows is 64 consecutive lines). **Derived, not run**: the PTX ISA shows the scale-factor TMEM
layout only as figures (Figs. 231 and 240); this reading agrees with CUTLASS's byte-offset scale
ids and the cuBLAS tiling, but no Blackwell GPU confirmed it (docs/blackwell.md §8).

Errors are :class:`BlockScaleError` (a ``ValueError``, code SP0830).
"""

from __future__ import annotations

import numbers
from typing import Any

import ml_dtypes
import numpy as np

from .sparsity.errors import SparsityError

SP_BLOCK_SCALE_INPUT = "SP0830"
"""Bad input to the block-scale toolkit: rank, shape, element type, block size, scale bytes."""

UE8M0_BIAS = 127
UE8M0_NAN = 0xFF
ATOM_ROWS = 128
"""Rows (of A, or N rows of B) in one scale atom."""
ATOM_BLOCKS = 4
"""K blocks in one scale atom (the 4 bytes of a 32-bit TMEM column)."""
ATOM_LINES = 32
ATOM_BYTES = 512

ELEMENT_TYPES: dict[str, Any] = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
"""Element types of quantized operands (the mxf8f6f4 kind also takes e2m3, e3m2 and e2m1; sparsile's
language has no such types, so neither does this toolkit)."""
BLOCK_SIZES = (32, 64)
"""32: one dense mxf8f6f4 instruction (K = 32); 64: one sparse one (logical K = 64)."""


class BlockScaleError(SparsityError):
    """A user-facing error of the block-scale toolkit (SP083x): ``code``, ``message``, ``help``,
    printed as every toolkit error is (:class:`~.sparsity.errors.SparsityError`)."""

    def __init__(self, message: str, help: str | None = None, code: str = SP_BLOCK_SCALE_INPUT):
        super().__init__(code, message, help)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _count(value: Any, what: str) -> int:
    """A row/block count or index as a non-negative int."""
    if not (_is_int(value) and value >= 0):
        raise BlockScaleError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def _block(block: int) -> int:
    if not _is_int(block) or block not in BLOCK_SIZES:
        raise BlockScaleError(f"block size {block!r} is not supported",
                              "use 32 (dense kind::mxf8f6f4) or 64 (sparse: one instruction's logical K)")
    return block


def _array(x: Any, what: str) -> np.ndarray:
    """``np.asarray(x)``, refusing a masked array with masked elements (asarray drops the mask: the
    values under it would be used)."""
    if isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x):
        raise BlockScaleError(f"{what} is a masked array with {np.ma.count_masked(x)} masked elements; the "
                              "values under the mask would be used", f"pass {what}.filled(value) or {what}.data")
    return np.asarray(x)


def _matrix(x: Any, what: str) -> np.ndarray:
    arr = _array(x, what)
    if arr.ndim != 2:
        raise BlockScaleError(f"{what} must be a 2-D matrix, got shape {arr.shape}")
    if arr.dtype.kind not in "biuf" and arr.dtype not in [np.dtype(t) for t in ELEMENT_TYPES.values()]:
        raise BlockScaleError(f"{what} must hold real numbers, got element type {arr.dtype}",
                              "pass a float, integer or e4m3/e5m2 (ml_dtypes) array")
    return arr


def _element_type(dtype: str) -> Any:
    if dtype not in ELEMENT_TYPES:
        raise BlockScaleError(f"element type {dtype!r} is not supported", f"use one of {', '.join(ELEMENT_TYPES)}")
    return ELEMENT_TYPES[dtype]


def _scale_bytes(scales: Any, what: str = "scales") -> np.ndarray:
    s = _matrix(scales, what)
    if s.dtype != np.uint8:
        raise BlockScaleError(f"{what} must be UE8M0 bytes (uint8), got {s.dtype}",
                              "pass the uint8 exponents quantize_mx returns")
    return s


def n_blocks(k: int, block: int) -> int:
    """Scale blocks covering ``k`` elements (the last one may be partial)."""
    return -(-k // _block(block))


# --------------------------------------------------------------------------------------------
# UE8M0 and quantization
# --------------------------------------------------------------------------------------------
def decode_ue8m0(scales: Any) -> np.ndarray:
    """``2^(byte - 127)`` as float64 (byte 0xFF is NaN, the only special value of UE8M0)."""
    s = _array(scales, "scales")
    if s.dtype.kind not in "ui" or (s.size and not 0 <= s.min() <= s.max() <= UE8M0_NAN):
        raise BlockScaleError(f"UE8M0 scales are bytes (integers 0-255), got {s.dtype} values",
                              "pass the uint8 exponents quantize_mx returns")
    s = s.astype(np.int64)
    out = np.ldexp(1.0, s - UE8M0_BIAS)
    return np.where(s == UE8M0_NAN, np.nan, out)


def quantize_mx(x: Any, block: int = 32, dtype: str = "e4m3") -> tuple[np.ndarray, np.ndarray]:
    """Quantize a (rows, K) float matrix along K: ``(values, scales)`` with ``values`` of ``dtype``
    (rows, K) and ``scales`` UE8M0 bytes (rows, ceil(K / block)).

    The scale of a block is the smallest power of two ``2^e`` with ``amax / 2^e <= max`` of the
    element type (448 for e4m3, 57344 for e5m2), so no value saturates; values are then rounded to
    nearest even. An all-zero block gets scale 1 (byte 127); NaN / inf inputs are refused.
    """
    arr = _matrix(x, "x").astype(np.float64)
    _block(block)
    host = _element_type(dtype)
    if not np.isfinite(arr).all():
        raise BlockScaleError("x has NaN or infinite values", "quantize finite data only")
    rows, k = arr.shape
    nb = n_blocks(k, block)
    padded = np.zeros((rows, nb * block))
    padded[:, :k] = arr
    blocks = padded.reshape(rows, nb, block)
    amax = np.abs(blocks).max(axis=2)
    top = float(ml_dtypes.finfo(host).max)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / top))
    e = np.clip(e, -UE8M0_BIAS, UE8M0_BIAS).astype(np.int64)
    e = np.where(amax > 0, e, 0)
    scaled = blocks / np.ldexp(1.0, e)[:, :, None]
    scaled = np.clip(scaled, -top, top)  # only reachable when e was clipped at 2^127
    values = scaled.reshape(rows, nb * block)[:, :k].astype(host)  # one rounding, float64 -> fp8 (RNE)
    return values, (e + UE8M0_BIAS).astype(np.uint8)


def dequantize_mx(values: Any, scales: Any, block: int = 32) -> np.ndarray:
    """``values · 2^(scale - 127)`` per block, in float64 (exact: every e4m3/e5m2 value times a
    power of two in [2^-127, 2^127] is a float64)."""
    v = _matrix(values, "values")
    s = _scale_bytes(scales)
    rows, k = v.shape
    nb = n_blocks(k, block)
    if s.shape != (rows, nb):
        raise BlockScaleError(f"scales must be (rows, ceil(K / {block})) = ({rows}, {nb}), got {s.shape}")
    factor = np.repeat(decode_ue8m0(s), block, axis=1)[:, :k]
    return v.astype(np.float64) * factor


# --------------------------------------------------------------------------------------------
# The "tcgen05" scale-factor format (atoms of 128 rows x 4 blocks)
# --------------------------------------------------------------------------------------------
def scale_atoms_shape(rows: int, blocks: int) -> tuple[int, int, int, int]:
    """(K groups, row tiles, 32 lines, 4 words) of the encoded scales of a (rows, blocks) matrix."""
    rows, blocks = _count(rows, "rows"), _count(blocks, "blocks")
    return (-(-blocks // ATOM_BLOCKS), -(-rows // ATOM_ROWS), ATOM_LINES, ATOM_BLOCKS)


def atom_position(row: int, block: int, row_tiles: int) -> tuple[int, int, int]:
    """Where scale (row, block) lives in the encoded array viewed as 2-D ``(-1, 4)`` u32 words:
    (line, word, byte). Line ``(g·row_tiles + t)·32 + r`` with g = block // 4, t = row // 128,
    r = row % 32; word ``(row % 128) // 32``; byte ``block % 4``."""
    row, block, row_tiles = _count(row, "row"), _count(block, "block"), _count(row_tiles, "row_tiles")
    g, j = divmod(block, ATOM_BLOCKS)
    t, m = divmod(row, ATOM_ROWS)
    c, r = divmod(m, ATOM_LINES)
    return (g * row_tiles + t) * ATOM_LINES + r, c, j


def tmem_scale_position(row: int, block: int, row_tiles: int) -> tuple[tuple[int, ...], int, int]:
    """Where scale (row, block) lands in TMEM after ``tcgen05.cp.32x128b.warpx4`` of the encoded
    atoms, atom ``i`` (in array order) to columns ``4i..4i+3``: (the four lanes holding it, column,
    byte = the instruction's scale-factor id)."""
    line, word, byte = atom_position(row, block, row_tiles)
    atom, r = divmod(line, ATOM_LINES)
    return tuple(32 * q + r for q in range(4)), 4 * atom + word, byte


def encode_scales(scales: Any, *, pad_value: int = UE8M0_BIAS) -> np.ndarray:
    """UE8M0 scales (rows, blocks) uint8 -> the "tcgen05" scale format, (Kg, Rp/128, 32, 4) uint32
    (rows padded to 128, blocks to 4 with ``pad_value``, 1.0 by default). Pass it to a kernel as
    ``atoms.reshape(-1, 4)``; TMA moves whole atoms (32 lines of 16 bytes)."""
    s = _scale_bytes(scales)
    if not (_is_int(pad_value) and 0 <= pad_value <= 0xFF):
        raise BlockScaleError(f"pad_value {pad_value!r} is not a byte",
                              "pass an int from 0 to 255 (127 is a scale of 1.0)")
    rows, nb = s.shape
    kg, rt, _, _ = scale_atoms_shape(rows, nb)
    full = np.full((rt * ATOM_ROWS, kg * ATOM_BLOCKS), pad_value, np.uint8)
    full[:rows, :nb] = s
    # [t, c, r] rows, [g, j] blocks -> [g, t, r, c, j]
    b = full.reshape(rt, 4, ATOM_LINES, kg, ATOM_BLOCKS).transpose(3, 0, 2, 1, 4)
    return np.ascontiguousarray(b).view("<u4").reshape(kg, rt, ATOM_LINES, 4).astype(np.uint32)


def decode_scales(atoms: Any, rows: int, blocks: int) -> np.ndarray:
    """Inverse of :func:`encode_scales`: the (rows, blocks) uint8 scales."""
    a = _array(atoms, "atoms")
    rows, blocks = _count(rows, "rows"), _count(blocks, "blocks")
    want = scale_atoms_shape(rows, blocks)
    if a.dtype != np.uint32 or a.size != int(np.prod(want)):
        raise BlockScaleError(f"encoded scales for ({rows}, {blocks}) are {int(np.prod(want))} uint32 words "
                              f"shaped {want}, got {a.dtype} of shape {a.shape}")
    kg, rt, _, _ = want
    b = np.ascontiguousarray(a.reshape(want).astype("<u4")).view(np.uint8).reshape(kg, rt, ATOM_LINES, 4, ATOM_BLOCKS)
    full = b.transpose(1, 3, 2, 0, 4).reshape(rt * ATOM_ROWS, kg * ATOM_BLOCKS)
    return np.ascontiguousarray(full[:rows, :blocks])


# --------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------
def scaled_matmul_reference(a: Any, a_scales: Any, b: Any, b_scales: Any, *, block: int = 32,
                            a_meta: Any = None, dtype: str = "e4m3") -> np.ndarray:
    """``(A·SA) @ (B·SB)^T`` in float64, both operands K-major: A (M, K), B (N, K), scales (M, ceil(K /
    block)) and (N, ceil(K / block)) UE8M0 bytes. With ``a_meta``, ``a`` is the compressed (M, K/2)
    values of a 2:4-sparse A and ``a_meta`` its metadata (any format of the sparsity toolkit); the
    scales then cover logical K (``block`` = 64 for a sparse mxf8f6f4 MMA)."""
    if a_meta is not None:
        from .sparsity import decompress

        a = np.asarray(decompress(a, a_meta, None, dtype))
    da = dequantize_mx(a, a_scales, block)
    db = dequantize_mx(b, b_scales, block)
    if da.shape[1] != db.shape[1]:
        raise BlockScaleError(f"A has K = {da.shape[1]} but B has K = {db.shape[1]}", "store B as N x K")
    return da @ db.T


__all__ = [
    "ATOM_BLOCKS", "ATOM_BYTES", "ATOM_LINES", "ATOM_ROWS", "BLOCK_SIZES", "ELEMENT_TYPES", "SP_BLOCK_SCALE_INPUT",
    "UE8M0_BIAS", "UE8M0_NAN", "BlockScaleError", "atom_position", "decode_scales", "decode_ue8m0",
    "dequantize_mx", "encode_scales", "n_blocks", "quantize_mx", "scale_atoms_shape", "scaled_matmul_reference",
    "tmem_scale_position",
]
