"""The rules logical index arrays must follow: one rule per fault, one code and one message, shared
by every entry point that reads them (``encode_metadata``, ``validate_metadata``,
``decode_metadata``, ``decompress``), checked in this order:

1. shape (SP0805): rank 3, (M, K/G, S) with S the operand's slots (2; 1 for tf32), then, where the
   operand's m and k are given (validation; encoding with ``k=``, m being the indices' rows), exactly
   (m, ceil(k/G), S), the help naming the sizes the indices do describe;
2. element type (SP0806): integers; floats (2.0 too) and bools are not indices;
3. values, within a chunk: an index out of [0, units) (SP0813), a pair naming one position twice
   (SP0807: the hardware leaves its nibble undefined), a decreasing pair (SP0808: the logical
   format, like ``mma.sp::ordered_metadata``, stores idx0 < idx1; validation may allow it).

The messages name the first faulty group in row-major order and how many groups share the fault;
an equal pair anywhere is reported before a decreasing one.
"""

from __future__ import annotations

import numpy as np

from .dtypes import OPERAND_TYPES, WIDTH_CLASSES, OperandType, class_members
from .errors import (
    SP_BAD_INDICES,
    SP_META_ELEMENT_TYPE,
    SP_META_SHAPE,
    SP_UNDEFINED_NIBBLE,
    SP_UNORDERED_PAIR,
    SparsityError,
)


def index_slots(op: OperandType) -> int:
    """S: indices per chunk of the logical format (1 for tf32, 2 otherwise)."""
    return 1 if op.width_class == "tf32" else 2


def _shape_help(op: OperandType) -> str:
    return f"pass the indices compress(w, dtype={op.name!r}) returns for this operand"


def _slot_hint(shape: tuple[int, ...], op: OperandType) -> str:
    """The width classes whose logical indices have ``shape``'s slot count, for a rank-3 array."""
    if len(shape) != 3 or shape[2] == index_slots(op):
        return ""
    others = [c for c in WIDTH_CLASSES if index_slots(OPERAND_TYPES[class_members(c)[0]]) == shape[2]]
    if not others:
        return ""
    names = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} and {others[-1]}"
    return f"; that is the shape of logical indices for {names} operands"


def require_index_shape(array: np.ndarray, op: OperandType, m: int | None = None, k: int | None = None) -> None:
    """Raise SP0805 unless ``array`` has the shape of logical indices of ``op`` operands: rank 3 with
    S slots, and (m, ceil(k/G), S) where ``m`` and ``k`` are both given."""
    slots = index_slots(op)
    shape = tuple(array.shape)
    if len(shape) != 3 or shape[2] != slots:
        raise SparsityError(SP_META_SHAPE, f"logical indices for {op.name} operands must have shape "
                            f"(M, K/{op.group}, {slots}), found {shape}{_slot_hint(shape, op)}",
                            help=_shape_help(op))
    if m is not None and k is not None:
        expected = (m, -(-k // op.group), slots)
        if shape != expected:
            raise SparsityError(SP_META_SHAPE, f"logical indices for a {m}x{k} {op.name} operand must have "
                                f"shape {expected}, found {shape}",
                                help=f"{_shape_help(op)}; {_sizes_held(shape, op)}")


def _sizes_held(shape: tuple[int, ...], op: OperandType) -> str:
    """The operand sizes rank-3 logical indices of ``shape`` describe: M rows and K in a range (the
    last group may be padding), for a message about a k or m they do not fit."""
    chunks = shape[1]
    low, high = max(0, (chunks - 1) * op.group + 1), chunks * op.group
    sizes = f"K = {high}" if low == high else f"K in {low}..{high}"
    return f"these indices are those of a {shape[0]} x K operand with {sizes}"


def require_index_type(array: np.ndarray) -> None:
    """Raise SP0806 unless ``array`` (logical indices) has an integer element type. Floats are
    refused even when integer-valued (2.0), and so are bools (a keep mask is not an index array)."""
    if array.dtype.kind not in "iu":
        raise SparsityError(SP_META_ELEMENT_TYPE, f"logical indices must be integers, found {array.dtype}",
                            help="pass integer positions within a chunk (the uint8 indices compress() returns)")


def _located(mask: np.ndarray, op: OperandType) -> tuple[int, int, str, str]:
    """(row, group, "row r, group c (K a..b)", "n groups affected") of the first True of an (M, K/G) mask."""
    hits = np.argwhere(mask)
    row, group = int(hits[0][0]), int(hits[0][1])
    g = op.group
    count = len(hits)
    affected = f"{count} group{'s' if count != 1 else ''} affected"
    return row, group, f"row {row}, group {group} (K {g * group}..{g * group + g - 1})", affected


def check_index_values(array: np.ndarray, op: OperandType, *, allow_unordered: bool = False) -> None:
    """Raise SP0813, SP0807 or SP0808 for the first bad value of integer ``array`` of a checked shape
    (see the module docstring); ``allow_unordered`` lets decreasing pairs through."""
    units = op.pattern.units
    if array.size and (array.min() < 0 or array.max() >= units):
        row, group, where, affected = _located(((array < 0) | (array >= units)).any(axis=-1), op)
        cell = array[row, group]
        value = int(cell[(cell < 0) | (cell >= units)][0])
        noun = "pairs" if op.pattern.unit == 2 else "elements"
        raise SparsityError(SP_BAD_INDICES, f"logical index {value} at {where} is out of range for {op.name}: a "
                            f"chunk has {units} {noun}, indices 0..{units - 1} ({affected})",
                            help="indices are positions within a chunk; re-create them with compress()")
    if array.shape[-1] < 2 or not array.size:
        return
    first, second = array[..., 0], array[..., 1]
    unordered = first >= second
    if not unordered.any():
        return
    equal = first == second
    if equal.any():
        row, group, where, affected = _located(equal, op)
        raise SparsityError(SP_UNDEFINED_NIBBLE, f"logical indices ({first[row, group]}, {second[row, group]}) at "
                            f"{where} name one position twice (undefined; {affected})",
                            help="each chunk keeps two different positions, stored idx0 < idx1; re-create "
                                 "the indices with compress()")
    if not allow_unordered:
        row, group, where, affected = _located(unordered, op)
        raise SparsityError(SP_UNORDERED_PAIR, f"logical indices ({first[row, group]}, {second[row, group]}) at "
                            f"{where} are a decreasing pair ({affected})",
                            help="the logical format stores idx0 < idx1: sort each pair, or re-create the "
                                 "indices with compress()")
