"""Compression of a structured-sparse matrix into (values, logical indices), and back.

The logical format (the brief's decision, documented in docs/sparse-metadata.md):

* ``values``: shape (M, K/2), the operand's host dtype; the kept elements of each chunk in order.
* ``indices``: shape (M, K/G, S), uint8, G = chunk size (4; 2 for tf32; 8 for e2m1) and S kept
  per chunk (2; 1 for tf32; 2 pairs for e2m1); within a chunk idx0 < idx1. For e2m1 an index
  names a 2-element pair (0-3) of the 8-element chunk.

Chunks with fewer nonzeros than slots follow the CUTLASS compressor (docs/hardware.md §3), see
:mod:`.chunkops`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .blocks import checked_workers, chunk_blocks, for_blocks
from .chunkops import (
    compress_block,
    decompress_block,
    nibbles_to_index_array,
    nonzero_count,
    pack_nibbles,
    prune_compress_block,
    unit_dtype,
    values_word_dtype,
)
from .dtypes import OperandType, operand_type, operand_type_of_array
from .errors import SP_BAD_INPUT, SP_NOT_SPARSE, SP_VALUES_MISMATCH, SparsityError
from .hostarray import as_host_array, checked_flag, checked_size, complex_refusal, require_numeric
from .indexrules import check_index_values, require_index_shape, require_index_type
from .swar import Workspace


def _resolve_operand(array: np.ndarray, dtype: str | OperandType | None) -> OperandType:
    if dtype is not None:
        return operand_type(dtype)
    op = operand_type_of_array(array)
    if op is None:
        raise SparsityError(
            SP_BAD_INPUT,
            f"cannot tell the sparse operand type of an array of {array.dtype}",
            help="pass dtype= (one of f16, bf16, tf32, e4m3, e5m2, s8, u8, e2m1); the array is cast to it",
        )
    return op


def as_operand_matrix(w: Any, dtype: str | OperandType | None, what: str = "w") -> tuple[np.ndarray, OperandType]:
    """``w`` as a C-contiguous 2-D array of the operand's host dtype, and the operand type."""
    array = as_host_array(w, what)
    require_numeric(array, what)
    if array.ndim != 2:
        raise SparsityError(SP_BAD_INPUT, f"{what} must be a 2-D (M, K) matrix, got shape {array.shape}",
                            help="reshape to (M, K) with K the axis the sparsity runs along")
    op = _resolve_operand(array, dtype)
    if array.dtype != op.host_dtype:
        array = cast_to_operand(array, op, what)
    return np.ascontiguousarray(array), op


def _caller_level() -> int:
    """``stacklevel`` of the first frame outside the sparsile stdlib (the user's call)."""
    import os
    import sys

    stdlib = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(stdlib):
        frame, level = frame.f_back, level + 1
    return level


class SaturationWarning(UserWarning):
    """Values beyond the largest finite value of an operand type were saturated by a cast."""


class OverflowWarning(UserWarning):
    """Finite values beyond the range of an operand type became ±inf in a cast (f16, bf16, e5m2)."""


def warn_overflowed(count: int, op: OperandType, what: str) -> None:
    """The :class:`OverflowWarning` of ``count`` finite values of ``what`` that became ±inf as ``op``."""
    import warnings

    top = float(np.finfo(np.dtype(op.host_dtype)).max)
    warnings.warn(f"{count} values of {what} lie beyond ±{top:g}, the largest finite {op.name} value: they "
                  f"became ±inf (scale the weight into the {op.name} range, or compress it for a wider type)",
                  OverflowWarning, stacklevel=_caller_level())


def warn_saturated(count: int, what: str) -> None:
    """The :class:`SaturationWarning` of ``count`` values of ``what`` saturated to ±448 (e4m3)."""
    import warnings

    warnings.warn(f"{count} values of {what} lie beyond ±448, the largest finite e4m3 value: saturated to ±448 "
                  "(a plain cast would make them NaN)", SaturationWarning, stacklevel=_caller_level())


def out_of_range(count: int, op: OperandType, what: str) -> SparsityError:
    """SP0804 for ``count`` values of ``what`` that integer type ``op`` cannot hold (a cast would wrap them)."""
    info = np.iinfo(op.host_dtype)
    return SparsityError(SP_BAD_INPUT, f"{count} values of {what} are not finite or lie beyond "
                         f"[{info.min}, {info.max}], the range of {op.name}: a cast would wrap them",
                         help=f"clip or quantize them to the {op.name} range first")


def cast_to_operand(array: np.ndarray, op: OperandType, what: str = "w") -> np.ndarray:
    """``array`` cast to the host dtype of ``op``, rounding once to nearest even. e4m3 has no
    infinity: a cast would turn |x| >= 464 into NaN, so values beyond ±448 (infinities included)
    are saturated to ±448 instead, with a :class:`SaturationWarning` saying how many (NaN stays
    NaN). Other types round as ml_dtypes / numpy do (finite values beyond an f16, bf16 or e5m2 range
    become ±inf, with an :class:`OverflowWarning` saying how many; integer types truncate), but values
    an integer type cannot hold (NaN, ±inf, beyond its range: numpy would wrap them) are SP0804, and so
    are complex values (hostarray.complex_refusal: a cast would drop the imaginary parts)."""
    if array.dtype.kind == "c":
        raise complex_refusal(what, array.dtype.name)
    if op.name == "e4m3":
        wide = array.astype(np.float64)
        over = np.abs(wide) > 448.0
        if over.any():
            warn_saturated(int(over.sum()), what)
            wide = np.clip(wide, -448.0, 448.0)
        return wide.astype(op.host_dtype)
    host = np.dtype(op.host_dtype)
    if host.kind in "iu" and array.dtype != host and array.dtype != np.bool_:
        info = np.iinfo(host)
        # numpy wraps what lies beyond the range (300 -> 44) and makes NaN/inf arbitrary: refused
        whole = array if array.dtype.kind in "iu" else np.trunc(array.astype(np.float64))
        bad = ~((whole >= info.min) & (whole <= info.max))
        if bad.any():
            raise out_of_range(int(bad.sum()), op, what)
        return array.astype(op.host_dtype)
    with np.errstate(over="ignore", invalid="ignore"):  # numpy's RuntimeWarning: ours counts them
        cast = array.astype(op.host_dtype)
    # any input type: a float wider than op, one as wide with more range (bf16 -> f16), an ml_dtypes
    # type (kind "V"), integers (int32 -> f16); one pass over the cast, the input read where it is inf
    inf = np.isinf(cast)
    if inf.any():
        overflowed = int(np.isfinite(array[inf]).sum())
        if overflowed:
            warn_overflowed(overflowed, op, what)
    return cast


def _pad_k(array: np.ndarray, group: int) -> np.ndarray:
    rows, k = array.shape
    padded_k = -(-k // group) * group
    if padded_k == k:
        return array
    out = np.zeros((rows, padded_k), dtype=array.dtype)
    out[:, :k] = array
    return out


def _not_sparse_error(bits: np.ndarray, op: OperandType, total_bad: int, inferred: bool = False) -> SparsityError:
    """SP0803 naming the first chunk (row-major) with too many nonzeros; ``inferred``: the operand
    type was taken from w's dtype (a float32 w is tf32, 1:2, which a 2:4-pruned w breaks)."""
    rows, k = bits.shape
    for block in chunk_blocks(rows, max(1, (1 << 16) // max(1, k))):
        counts = nonzero_count(bits[block].reshape(-1), op).reshape(-1, k // op.group)
        if (counts > op.pattern.keep).any():
            row, group = (int(i) for i in np.argwhere(counts > op.pattern.keep)[0])
            count = int(counts[row, group])
            row += block.start
            break
    g = op.group
    unit = "nonzero pairs" if op.pattern.unit == 2 else "nonzero elements"
    others = f" ({total_bad - 1} more groups also break it)" if total_bad > 1 else ""
    prune_name = {"2:4": "prune_2_4", "1:2": "prune_1_2"}.get(op.pattern.name, "prune_4_8_pairs")
    return SparsityError(
        SP_NOT_SPARSE,
        f"w is not {op.pattern.name} sparse for {op.name}: row {row}, group {group} "
        f"(columns {g * group}..{g * group + g - 1}) has {count} {unit}, at most {op.pattern.keep} "
        f"allowed{others}",
        help=_not_sparse_help(prune_name, inferred and op.name == "tf32"),
    )


def _not_sparse_help(prune_name: str, float32_as_tf32: bool) -> str:
    """SP0803's help: how to make w sparse, after why a float32 w was taken for tf32 where it was."""
    fix = f"prune first with {prune_name}(w), or call compress(w, prune=True) to keep the largest magnitudes"
    if float32_as_tf32:
        return ("w is float32, which compress takes as a tf32 operand (1:2): pass dtype='f16' or 'bf16' for a 2:4 "
                f"one; else {fix}")
    return fix


def compress(w: Any, dtype: str | OperandType | None = None, *, prune: bool = False,
             workers: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split a structured-sparse (M, K) matrix into ``(values, indices)``.

    ``dtype`` names the operand type (inferred from ``w``'s dtype when None: float16 -> f16,
    float32 -> tf32, ...); ``w`` is cast to its host dtype. K is padded with zeros up to a multiple
    of the chunk size G (zeros are trivially sparse), so ``values`` is (M, Kg/2) and ``indices``
    (M, Kg/G, S) with Kg = K rounded up to G. A matrix that breaks the pattern raises SP0803 naming
    the first offending row and group; with ``prune=True`` it is magnitude-pruned first (in the
    same pass, giving exactly ``compress(prune(w, dtype))``: a ``w`` of another dtype is pruned in its
    own precision before the cast). e4m3 values beyond ±448 are saturated to ±448 with a
    :class:`SaturationWarning` (``cast_to_operand``), not turned into NaN.
    """
    workers = checked_workers(workers)
    prune = checked_flag(prune, "prune")
    if prune and dtype is not None:
        host = as_host_array(w, "w")
        if host.ndim == 2 and host.dtype != operand_type(dtype).host_dtype:
            # prune in w's own precision, then cast: rounding first could tie or zero magnitudes
            # and keep other elements than prune(w, dtype) does
            from .prune import prune as prune_matrix

            w, prune = prune_matrix(host, dtype, workers=workers), False
    array, op = as_operand_matrix(w, dtype)
    array = _pad_k(array, op.group)
    rows, k = array.shape
    chunks = k // op.group
    bits = array.view(op.storage_dtype).reshape(-1)
    values = np.empty((rows, k // 2), dtype=op.host_dtype)
    indices = np.empty(index_shape(op, rows, k), dtype=np.uint8)
    index_flat = indices.reshape(-1)
    units = values.view(np.uint8).view(unit_dtype(op)).reshape(-1)
    slots = indices.shape[2]
    kernel = prune_compress_block if prune else compress_block

    def work(block: slice, ws: Workspace) -> int | None:
        elements = bits[block.start * op.group:block.stop * op.group]
        return kernel(elements, op, ws, units[block.start * slots:block.stop * slots],
                      index_flat[block.start * slots:block.stop * slots])

    bad_counts = for_blocks(rows * chunks, work, workers)
    if not prune and any(bad_counts):
        raise _not_sparse_error(bits.reshape(rows, k), op, sum(bad_counts), inferred=dtype is None)
    return values, indices


def index_shape(dtype: str | OperandType, rows: int, k: int) -> tuple[int, int, int]:
    """Shape of the logical index array for an (rows, k) operand: (rows, ceil(k/G), S)."""
    op = operand_type(dtype)
    rows, k = checked_size(rows, "rows"), checked_size(k, "k")
    return rows, -(-k // op.group), 1 if op.width_class == "tf32" else 2


def checked_indices(indices: Any, op: OperandType) -> np.ndarray:
    """Logical indices as a C-contiguous uint8 (M, K/G, S) array, checked by the rules every entry
    point shares (:mod:`.indexrules`: SP0805 shape, SP0806 element type, SP0813 out of range,
    SP0807 an equal pair, SP0808 a decreasing pair)."""
    array = as_host_array(indices, "indices")
    require_index_shape(array, op)
    require_index_type(array)
    check_index_values(array, op)
    return np.ascontiguousarray(array, dtype=np.uint8)


def indices_to_nibbles(indices: Any, op: OperandType) -> np.ndarray:
    """Nibble per chunk, uint8 (M, K/G), from logical indices (checked as :func:`checked_indices`)."""
    array = checked_indices(indices, op)
    if op.width_class == "tf32":
        return (np.uint8(4) + np.uint8(10) * array[:, :, 0]).astype(np.uint8)
    return array[:, :, 0] | (array[:, :, 1] << np.uint8(2))


_PACK_MAGIC = np.uint32((1 << 24) + (1 << 18) + (1 << 12) + (1 << 6))
"""Multiplier that moves the four 2-bit indices of two chunks (bytes 0-3 of a uint32) to bits
24-31 as ``idx0a | idx1a << 2 | idx0b << 4 | idx1b << 6``: the partial products land on distinct,
non-overlapping 2-bit fields, so no carry reaches bits 24-31."""


def pack_checked_indices(array: np.ndarray, op: OperandType, workers: int | None = None) -> np.ndarray:
    """Nibbles packed two per byte (chunk 2i in the low nibble), (M, ceil(K/G / 2)) uint8, from
    indices already passed through :func:`checked_indices`.

    For 2-index operands with an even number of chunks per row this runs one multiply per pair of
    chunks; otherwise it packs :func:`indices_to_nibbles`.
    """
    rows, chunks, slots = array.shape
    if slots != 2 or chunks % 2:
        return pack_nibbles(indices_to_nibbles(array, op))
    words = array.reshape(-1).view(np.uint32)
    packed = np.empty((rows, chunks // 2), dtype=np.uint8)
    out = packed.reshape(-1)

    def work(block: slice, ws: Workspace) -> None:
        tmp = ws("pack", block.stop - block.start, np.uint32)
        np.bitwise_and(words[block], np.uint32(0x03030303), out=tmp)
        tmp *= _PACK_MAGIC
        tmp >>= np.uint32(24)
        np.copyto(out[block], tmp, casting="unsafe")

    for_blocks(words.size, work, workers)
    return packed


def nibbles_to_indices(nibbles: np.ndarray, op: OperandType) -> np.ndarray:
    """Logical uint8 indices (M, K/G, S) from a uint8 nibble array (M, K/G)."""
    return nibbles_to_index_array(nibbles, op)


def decompress_nibbles(values: Any, nibbles: np.ndarray, op: OperandType) -> np.ndarray:
    """Dense (M, K/G·G) matrix from values (M, ≥ K/G·G/2) and valid nibbles (M, K/G). Values wider
    than the metadata needs are accepted, their columns past K/G·G/2 not read (a layer's values
    cover its padded K, and its weight is asked for the logical k: integrations/torch/weight.py);
    SP0814 says so."""
    array = as_host_array(values, "values")
    rows, chunks = nibbles.shape
    expected = (rows, chunks * op.group // 2)
    if array.ndim != 2 or array.shape[0] != rows or array.shape[1] < expected[1]:
        raise SparsityError(SP_VALUES_MISMATCH,
                            f"values must have {rows} rows and at least {expected[1]} columns for this metadata "
                            f"(columns past {expected[1]} are not read), got shape {array.shape}",
                            help="pass the values returned by compress() together with its metadata")
    if array.dtype != op.host_dtype:
        raise SparsityError(SP_VALUES_MISMATCH,
                            f"values have element type {array.dtype}, but {op.name} operands are {op.host_dtype}",
                            help=f"pass values of dtype {op.host_dtype} or give the right dtype=")
    packed = np.ascontiguousarray(array[:, :expected[1]]).view(np.uint8).view(values_word_dtype(op))
    dense_bits = decompress_block(packed.reshape(-1), nibbles.reshape(-1), op)
    return dense_bits.reshape(rows, chunks * op.group).view(op.host_dtype)
