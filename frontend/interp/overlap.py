"""Whether an array's own elements share memory, from its shape and byte strides: the one test the
interpreter (a written argument, SP0750) and the standard library (an ``out=``, SP0804) ask. A copy
back into such an array keeps one of the values written to each shared address, silently."""

from __future__ import annotations

import numpy as np

EXACT_OVERLAP_CHECK = 1 << 22
"""Elements up to which :func:`self_overlapping` compares every element's address when the strides
alone do not show the elements apart (an ``as_strided`` view); a larger such array is taken as
overlapping (:data:`UNDECIDED`, which the diagnostics word apart)."""


def _tangled_dims(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> list[tuple[int, int]]:
    """The (stride, extent) dimensions, smallest stride first, that the strides alone do not show apart:
    empty where every stride reaches past everything the smaller ones span (any slice, transpose or
    reversal of a dense array). A largest stride that reaches past all the others' span is peeled off
    first: its copies of the rest cannot meet, so the rest overlaps exactly when the whole does."""
    dims = sorted((abs(int(st)), int(n)) for n, st in zip(shape, byte_strides, strict=True) if n > 1)
    while dims:
        reach = itemsize + sum(stride * (n - 1) for stride, n in dims[:-1])
        if dims[-1][0] < reach:
            break
        dims.pop()
    return dims


def _element_count(dims: list[tuple[int, int]]) -> float:
    return float(np.prod([n for _, n in dims], dtype=np.float64))


OVERLAP, UNDECIDED = "overlap", "may overlap"
""":func:`self_overlap`'s verdicts, as the diagnostics word them ("elements ... overlap in memory")."""

UNDECIDED_REASON = (f"its strides do not show them apart, and it has more elements than the {EXACT_OVERLAP_CHECK} "
                    "the check compares one by one")
"""Why a diagnostic's array *may* overlap (:data:`UNDECIDED`)."""


def self_overlap(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> str | None:
    """Whether two elements of an array of ``shape`` and ``byte_strides`` (any sign) share a byte:
    None where none do, :data:`OVERLAP` where two do, :data:`UNDECIDED` where the elements were not
    compared (taken as overlapping). Any array made by slicing, transposing or reversing a dense one
    is told apart by its strides alone (each stride, largest first, reaches past everything the
    smaller ones span); the dimensions left (``as_strided``) are decided element by element up to
    :data:`EXACT_OVERLAP_CHECK` elements."""
    if any(n == 0 for n in shape):
        return None
    dims = _tangled_dims(shape, byte_strides, itemsize)
    if not dims:
        return None
    if _element_count(dims) > EXACT_OVERLAP_CHECK:
        return UNDECIDED
    offsets = np.zeros(1, np.int64)
    for stride, n in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * stride).reshape(-1)
    offsets.sort()
    return OVERLAP if (np.diff(offsets) < itemsize).any() else None


def self_overlapping(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether :func:`self_overlap` takes the elements as overlapping (undecided ones included)."""
    return self_overlap(shape, byte_strides, itemsize) is not None


def overlap_undecided(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether :func:`self_overlap` is :data:`UNDECIDED`: more than :data:`EXACT_OVERLAP_CHECK`
    elements whose strides do not show them apart."""
    return self_overlap(shape, byte_strides, itemsize) == UNDECIDED
