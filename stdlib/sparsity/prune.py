"""Magnitude pruning to the structured-sparsity pattern of each operand type.

``prune_2_4`` keeps the two largest magnitudes of every 4 consecutive elements along ``axis``;
``prune_1_2`` (tf32) the larger of every 2; ``prune_4_8_pairs`` (e2m1) the two 2-element pairs
with the largest L1 magnitude |a|+|b| of every 8 elements (PTX ISA 9.7.16.10.8.1-3).

Ties are broken deterministically: between equal magnitudes the element (pair) with the lower
index along ``axis`` is kept. NaN counts as larger than every number (its magnitude bits are).
A trailing partial group (length along ``axis`` not a multiple of the group) is pruned as if it
were padded with zeros.

Inputs are numpy arrays or anything :func:`as_host_array` accepts; results are new numpy arrays
of the input's dtype (the ``prune_mask_*`` forms return the boolean keep mask instead). The
operand dtypes (float16, bfloat16, float32 for 1:2, the 8-bit types, float4_e2m1fn for pairs) run
through bit-parallel kernels; other numeric dtypes go through a direct comparison of magnitudes
with the same rule.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .blocks import checked_workers, for_blocks
from .chunkops import keep_element_mask
from .dtypes import (
    PATTERN_1_2,
    PATTERN_2_4,
    PATTERN_4_8_PAIRS,
    OperandType,
    Pattern,
    operand_type,
    operand_type_of_array,
)
from .errors import SP_BAD_INPUT, SparsityError
from .hostarray import as_host_array, require_numeric
from .swar import Workspace


def keep_mask_reference(keys: np.ndarray, keep: int) -> np.ndarray:
    """Boolean mask over the last axis of ``keys``: True for the ``keep`` largest keys, ties to the
    lower index. Unit i is dropped iff at least ``keep`` others beat it, where j beats i when
    key_j > key_i, or key_j == key_i and j < i. (The straightforward rule the kernels implement.)"""
    n = keys.shape[-1]
    beaten = np.zeros(keys.shape, dtype=np.int8)
    for i in range(n):
        for j in range(n):
            if i != j:
                beats = keys[..., j] >= keys[..., i] if j < i else keys[..., j] > keys[..., i]
                beaten[..., i] += beats
    return beaten < keep


def _fast_operand(dtype: np.dtype, pattern: Pattern) -> OperandType | None:
    """The operand type whose bit-parallel kernel implements ``pattern`` for host ``dtype``."""
    op = operand_type_of_array(np.empty(0, dtype))
    if op is None or op.pattern != pattern:
        return None
    return op


def integer_magnitudes(array: np.ndarray) -> np.ndarray:
    """|x| of a bool or integer array, exact, as uint64: |int64 min| = 2**63 and uint64 values from
    2**63 up, which an int64 |x| wrapped to negative numbers (pruned as the smallest)."""
    if array.dtype.kind == "u":
        return array.astype(np.uint64)
    return np.abs(array.astype(np.int64)).view(np.uint64)  # (|-2**63| wraps to -2**63: as uint64, 2**63)


def unit_keys(array: np.ndarray, unit: int) -> np.ndarray:
    """Ranking keys of the units (``unit`` consecutive elements along the last axis) of ``array``, in
    the order pruning keeps them: |x| (or |a|+|b| of a pair) with NaN above every number, +inf
    included, as the operand kernels' magnitude bits order them. Integers give exact uint64 sums
    (Python integers where a sum could pass 2**64); floats the raw bits of the float64 magnitude
    (monotone in |x|; NaN's bits lie above inf's), a pair holding a NaN the largest NaN key of its
    elements; a float wider than float64 (``np.longdouble``) the rank of its own-precision
    magnitude among the units (:func:`_wide_float_keys`)."""
    shape = (*array.shape[:-1], array.shape[-1] // unit, unit)
    if array.dtype.kind in "biu":
        mags = integer_magnitudes(array).reshape(shape)
        if unit == 1:
            return mags[..., 0]
        if mags.size and int(mags.max()) >= 2 ** 64 // unit:  # (a uint64 sum would wrap)
            return mags.astype(object).sum(axis=-1)
        return mags.sum(axis=-1, dtype=np.uint64)
    if is_wide_float(array.dtype):
        return _wide_float_keys(array.reshape(shape))
    mags = np.abs(array.astype(np.float64)).reshape(shape)
    bits = mags.view(np.uint64) & np.uint64(0x7FFFFFFFFFFFFFFF)
    if unit == 1:
        return bits[..., 0]
    nan = np.isnan(mags)
    sums = np.where(nan, np.inf, mags).sum(axis=-1).view(np.uint64)
    return np.where(nan.any(axis=-1), np.where(nan, bits, np.uint64(0)).max(axis=-1), sums)


def is_wide_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a float wider than float64 (``np.longdouble`` on x86: 80-bit extended),
    whose magnitudes float64 would round together, or overflow to inf past 1.8e308."""
    return dtype.kind == "f" and dtype.itemsize > 8 and np.finfo(dtype).nmant > np.finfo(np.float64).nmant


def _wide_float_keys(units: np.ndarray) -> np.ndarray:
    """:func:`unit_keys` of a wide float's units (``(..., n, unit)``): the rank of each unit's |x|
    (or |a|+|b|), summed in its own precision, among all the units, NaN above every one (inf
    included); NaN payloads are not ordered."""
    mags = np.abs(units)
    nan = np.isnan(mags)
    sums = np.where(nan, np.inf, mags).sum(axis=-1)
    ranks = np.unique(sums, return_inverse=True)[1].reshape(sums.shape).astype(np.uint64)
    return np.where(nan.any(axis=-1), np.uint64(sums.size), ranks)


INF_KEY = np.array(np.inf).view(np.uint64)[()]
"""The :func:`unit_keys` key of ±inf: a NaN's key is larger, a number's smaller."""

NUMBER, INFINITE, NAN = 0, 1, 2
"""The classes of :func:`element_ranks`, in the order pruning keeps them."""


def element_ranks(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(class, magnitude) of every element of ``array``, read from its :func:`unit_keys` (the one
    rule pruning keeps elements by, so that other rankings, such as the transposable masks', agree
    with it): class :data:`NAN` above :data:`INFINITE` (±inf) above :data:`NUMBER` (int8; integers
    are numbers), and |x| as float64 for numbers (in the array's own type for a float wider than
    float64, :func:`is_wide_float`; Python ints where an integer passes 2**53; 0.0 for NaN and
    ±inf; -0.0 is 0.0). Only NaN
    payloads, which pruning also orders among NaNs, are not kept."""
    if is_wide_float(array.dtype):  # (magnitudes in their own precision: float64 would round them together)
        nan, inf = np.isnan(array), np.isinf(array)
        return nan.astype(np.int8) * 2 + inf, np.where(nan | inf, 0, np.abs(array))
    keys = np.ascontiguousarray(unit_keys(array, 1))
    if array.dtype.kind in "biu":  # (Python ints past 2**53, where float64 would round magnitudes together)
        exact = keys.size and int(keys.max()) > 2**53
        return np.zeros(array.shape, np.int8), keys.astype(object if exact else np.float64)
    special = keys >= INF_KEY
    if not special.any():  # (the common case: one pass, the keys' bits are |x|)
        return np.zeros(array.shape, np.int8), keys.view(np.float64)
    classes = special.astype(np.int8) + (keys > INF_KEY)
    return classes, np.where(special, 0.0, keys.view(np.float64))


REFERENCE_BLOCK_GROUPS = 8192
"""Groups per block of the comparison path: its float64 keys and masks stay in cache."""


def keep_mask_total_order(keys: np.ndarray, keep: int) -> np.ndarray:
    """:func:`keep_mask_reference` for keys of a total order (integers: :func:`unit_keys`' types),
    where "j does not beat i" is "i beats j", so each pair of units is compared once."""
    n = keys.shape[-1]
    columns = [np.ascontiguousarray(keys[..., i]) for i in range(n)]
    beaten = [np.zeros(columns[0].shape, dtype=np.int8) for _ in range(n)]
    for j in range(n):
        for i in range(j + 1, n):
            j_beats_i = columns[j] >= columns[i]
            beaten[i] += j_beats_i
            beaten[j] += ~j_beats_i
    return np.stack([count < keep for count in beaten], axis=-1)


def _block_keys(groups: np.ndarray, unit: int) -> np.ndarray:
    """:func:`unit_keys` of a block of groups; float32 elements give the same order from their own
    magnitude bits (|x| as uint32 is monotone, NaN above inf), half the bytes of float64's."""
    if unit == 1 and groups.dtype == np.float32:
        return groups.view(np.uint32) & np.uint32(0x7FFFFFFF)
    return unit_keys(groups, unit)


def _prune_rows_by_comparison(array: np.ndarray, pattern: Pattern, want_mask: bool,
                              workers: int | None) -> np.ndarray:
    """:func:`prune_rows` for host dtypes without a bit-parallel kernel (float32 / float64 and
    integers at 2:4, ...): the comparison rule on blocks of whole groups, spread over threads as the
    kernels are (a whole 14336 x 4096 float32 weight at once was 3-5x slower: every temporary a
    fresh gigabyte)."""
    rows, k = array.shape
    group = pattern.group
    groups = array.reshape(-1, group)
    out = np.empty((rows, k), dtype=bool if want_mask else array.dtype)
    out_groups = out.reshape(-1, group)
    zero = np.zeros((), array.dtype)

    def work(block: slice, ws: Workspace) -> None:
        keep_units = keep_mask_total_order(_block_keys(groups[block], pattern.unit), pattern.keep)
        keep = np.repeat(keep_units, pattern.unit, axis=-1) if pattern.unit > 1 else keep_units
        if want_mask:
            out_groups[block] = keep
        else:
            np.copyto(out_groups[block], zero)
            np.copyto(out_groups[block], groups[block], where=keep)

    for_blocks(rows * k // group, work, workers, block=REFERENCE_BLOCK_GROUPS)
    return out


def prune_rows(array: np.ndarray, pattern: Pattern, want_mask: bool,
               workers: int | None = None) -> np.ndarray:
    """Prune a C-contiguous 2-D array whose row length is a multiple of ``pattern.group``.

    Returns the pruned array (same dtype) or, with ``want_mask``, the boolean keep mask.
    """
    rows, k = array.shape
    op = _fast_operand(array.dtype, pattern)
    if op is None:
        return _prune_rows_by_comparison(array, pattern, want_mask, workers)
    group = pattern.group
    bits = array.view(op.storage_dtype).reshape(-1)
    out = np.empty((rows, k), dtype=bool if want_mask else array.dtype)
    out_flat = out.reshape(-1) if want_mask else out.view(op.storage_dtype).reshape(-1)

    def work(chunks: slice, ws: Workspace) -> None:
        elements = slice(chunks.start * group, chunks.stop * group)
        mask = keep_element_mask(bits[elements], op, ws)
        if want_mask:
            np.not_equal(mask, 0, out=out_flat[elements])
        else:
            np.bitwise_and(bits[elements], mask, out=out_flat[elements])

    for_blocks(rows * k // group, work, workers)
    return out


def _prune(w: Any, pattern: Pattern, axis: int, want_mask: bool, workers: int | None = None) -> np.ndarray:
    array = as_host_array(w, "w")
    require_numeric(array, "w")
    if array.ndim == 0:
        raise SparsityError(SP_BAD_INPUT, "w is a scalar; pruning needs at least one axis",
                            help="pass an array with the K axis to prune along")
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool):
        raise SparsityError(SP_BAD_INPUT, f"axis must be an integer, got {axis!r}",
                            help="pass the index of the K axis to prune along, e.g. axis=-1")
    if not -array.ndim <= axis < array.ndim:
        raise SparsityError(SP_BAD_INPUT, f"axis {axis} is out of range for w with {array.ndim} dimensions",
                            help=f"use an axis in [-{array.ndim}, {array.ndim - 1}]")
    moved = np.moveaxis(array, axis, -1)
    lead, k = moved.shape[:-1], moved.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    group = pattern.group
    padded_k = -(-k // group) * group
    flat = moved.reshape(rows, k)
    if padded_k != k:
        flat = np.concatenate([flat, np.zeros((rows, padded_k - k), dtype=array.dtype)], axis=1)
    result = prune_rows(np.ascontiguousarray(flat), pattern, want_mask, workers)[:, :k]
    return np.moveaxis(result.reshape(*lead, k), -1, axis)


def prune_2_4(w: Any, axis: int = -1) -> np.ndarray:
    """Keep the 2 largest-magnitude elements of every 4 consecutive ones along ``axis`` (2:4;
    f16, bf16 and the 8-bit types). Ties keep the lower index."""
    return _prune(w, PATTERN_2_4, axis, want_mask=False)


def prune_1_2(w: Any, axis: int = -1) -> np.ndarray:
    """Keep the larger-magnitude element of every 2 consecutive ones along ``axis`` (1:2; tf32).
    A tie keeps the first."""
    return _prune(w, PATTERN_1_2, axis, want_mask=False)


def prune_4_8_pairs(w: Any, axis: int = -1) -> np.ndarray:
    """Keep the 2 pairs with the largest |a|+|b| among the 4 pairs of every 8 consecutive elements
    along ``axis`` (4:8 in pairs; e2m1). Ties keep the lower pair."""
    return _prune(w, PATTERN_4_8_PAIRS, axis, want_mask=False)


def prune_mask_2_4(w: Any, axis: int = -1) -> np.ndarray:
    """The boolean keep mask of :func:`prune_2_4` (exactly 2 True per group of 4)."""
    return _prune(w, PATTERN_2_4, axis, want_mask=True)


def prune_mask_1_2(w: Any, axis: int = -1) -> np.ndarray:
    """The boolean keep mask of :func:`prune_1_2` (exactly 1 True per pair)."""
    return _prune(w, PATTERN_1_2, axis, want_mask=True)


def prune_mask_4_8_pairs(w: Any, axis: int = -1) -> np.ndarray:
    """The boolean keep mask of :func:`prune_4_8_pairs` (exactly 4 True per group of 8, in pairs)."""
    return _prune(w, PATTERN_4_8_PAIRS, axis, want_mask=True)


def pattern_for(dtype: str | OperandType) -> Pattern:
    """The sparsity pattern an operand type needs (2:4, 1:2 or 4:8 in pairs)."""
    return operand_type(dtype).pattern


def prune(w: Any, dtype: str | OperandType, axis: int = -1, *, workers: int | None = None) -> np.ndarray:
    """Prune ``w`` with the pattern of operand type ``dtype`` (no cast: the result keeps w's dtype).
    ``workers`` = 1 keeps large inputs on the calling thread (default: a small thread pool)."""
    return _prune(w, pattern_for(dtype), axis, want_mask=False, workers=checked_workers(workers))


def prune_mask(w: Any, dtype: str | OperandType, axis: int = -1) -> np.ndarray:
    """The keep mask of :func:`prune` for operand type ``dtype``."""
    return _prune(w, pattern_for(dtype), axis, want_mask=True)
