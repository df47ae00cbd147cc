"""Transposable 2:4 masks: 2:4 along the rows *and* the columns, so that both W and Wᵀ are 2:4
(the backward pass dX = dY·W can then use the sparse kernel with the transposed weight too).

Method: exact per 4x4 block. A mask is 2:4 along rows and columns iff every aligned 4x4 block
keeps exactly 2 elements in each of its rows and columns; the blocks are independent, so the best
transposable mask is the best of the 90 such 4x4 patterns in every block. The 90 patterns are
enumerated once; the kept magnitude of every block under every pattern is summed in float64 in
the GPU kernel's order (:func:`_pattern_sums`: each row's pair, then the rows in order), so both
round alike, and the best pattern is its arg-max. Ties go to the first pattern in
:data:`PATTERNS` order (the rows' index pairs in lexicographic order), so the result is
deterministic. Special values rank as :func:`prune_2_4` ranks them (:func:`~.prune.element_ranks`,
read from pruning's own keys): a pattern keeping more NaNs wins, then one keeping more infinities,
then the larger finite sum.

Measured kept magnitude against the row-only 2:4 mask (which keeps the most magnitude possible for
any 2:4 mask, transposable or not) is in docs/sparse-metadata.md ("Transposable masks").
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .blocks import chunk_blocks
from .errors import SP_BAD_INPUT, SparsityError
from .hostarray import as_host_array, require_numeric
from .prune import element_ranks


def _patterns() -> np.ndarray:
    """The 90 4x4 boolean masks with two True in every row and every column, as (90, 16)."""
    pairs = list(itertools.combinations(range(4), 2))
    found = []
    for rows in itertools.product(pairs, repeat=4):
        mask = np.zeros((4, 4), dtype=bool)
        for r, (a, b) in enumerate(rows):
            mask[r, a] = mask[r, b] = True
        if (mask.sum(axis=0) == 2).all():
            found.append(mask.reshape(16))
    return np.array(found)


PATTERNS: np.ndarray = _patterns()
"""Every transposable 2:4 pattern of a 4x4 block, (90, 16) bool, row-major within the block."""

SPECIAL_WEIGHTS = np.array([0.0, 1.0, 16.0])
"""What a kept number, inf and NaN (:func:`~.prune.element_ranks`' classes) add to a pattern's
special count: a NaN outweighs the 8 infinities a pattern can keep at most, so the count orders
patterns by their NaNs first, then by their infinities (the GPU kernel weighs them alike)."""

BLOCKS_PER_STEP = 1 << 16
"""4x4 blocks scored per step (a (blocks, 90) float64 score array of ~47 MB)."""

ROW_PAIRS: tuple[tuple[int, int], ...] = tuple(itertools.combinations(range(4), 2))
"""The 6 ways to keep 2 of a block row's 4 elements (the kernel's ``PAIRS``)."""

PATTERN_PAIRS: np.ndarray = np.array([[ROW_PAIRS.index(tuple(np.flatnonzero(p.reshape(4, 4)[r]))) for r in range(4)]
                                      for p in PATTERNS])
"""(90, 4): the index in :data:`ROW_PAIRS` of the pair each pattern keeps in block rows 0-3."""


def _pattern_sums(values: np.ndarray) -> np.ndarray:
    """(90, blocks) kept sums of (blocks, 16) ``values``, added in the GPU kernel's order: each
    row's pair ``x[a] + x[b]``, then ``((row0 + row1) + row2) + row3``. The float64 sums are then
    rounded alike on both sides, so the host and ``prune_transposable_gpu`` pick the same pattern
    even where rounding decides (bf16, f32: magnitudes 2**45 apart in one block). Blocks run along
    the last axis, so that every gather below copies whole rows."""
    columns = np.ascontiguousarray(values.T)  # (16, blocks)
    pairs = np.stack([columns[4 * r + a] + columns[4 * r + b] for r in range(4) for a, b in ROW_PAIRS])
    total = pairs[PATTERN_PAIRS[:, 0]] + pairs[6 + PATTERN_PAIRS[:, 1]]
    total += pairs[12 + PATTERN_PAIRS[:, 2]]
    total += pairs[18 + PATTERN_PAIRS[:, 3]]
    return total


def transposable_mask_2_4(w: Any) -> np.ndarray:
    """The boolean keep mask of the (M, K) matrix ``w`` that is 2:4 along every row and every column
    and keeps the largest total magnitude (exact, per aligned 4x4 block; ties to the first pattern
    of :data:`PATTERNS`). M and K that are not multiples of 4 are handled as if ``w`` were padded
    with zeros (the mask is cut back to (M, K)); the last partial block is then 2:4 only as a part
    of the padded one."""
    array = as_host_array(w, "w")
    require_numeric(array, "w")
    if array.ndim != 2:
        raise SparsityError(SP_BAD_INPUT, f"w must be a 2-D (M, K) matrix, got shape {array.shape}",
                            help="a transposable mask is 2:4 along both axes of a matrix")
    rows, cols = array.shape
    mp, kp = -(-rows // 4) * 4, -(-cols // 4) * 4
    element_classes, element_mags = element_ranks(array)  # |x| of numbers; NaN, ±inf by class
    mags = np.zeros((mp, kp), dtype=element_mags.dtype)  # (float64; np.longdouble's own or Python ints, exact)
    classes = np.zeros((mp, kp), dtype=np.int8)
    classes[:rows, :cols], mags[:rows, :cols] = element_classes, element_mags
    blocks = mags.reshape(mp // 4, 4, kp // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 16)
    special = bool(classes.any())
    block_classes = classes.reshape(mp // 4, 4, kp // 4, 4).transpose(0, 2, 1, 3).reshape(-1, 16) if special else None
    best = np.empty(blocks.shape[0], dtype=np.intp)
    for part in chunk_blocks(blocks.shape[0], BLOCKS_PER_STEP):
        # rank by the kept NaNs first, then the kept infinities (one weighted count), then the finite sum
        scores = _pattern_sums(blocks[part])
        if block_classes is not None and block_classes[part].any():
            count = _pattern_sums(SPECIAL_WEIGHTS[block_classes[part]])
            scores[count < count.max(axis=0, keepdims=True)] = -1.0
        best[part] = np.argmax(scores, axis=0)
    mask = PATTERNS[best].reshape(mp // 4, kp // 4, 4, 4).transpose(0, 2, 1, 3).reshape(mp, kp)
    return np.ascontiguousarray(mask[:rows, :cols])


def prune_transposable_2_4(w: Any) -> np.ndarray:
    """``w`` with every element outside :func:`transposable_mask_2_4` set to zero (same dtype)."""
    array = as_host_array(w, "w")
    mask = transposable_mask_2_4(array)
    return np.where(mask, array, np.zeros((), array.dtype))


def kept_magnitude(w: Any, mask: Any) -> float:
    """The sum of |w| over the kept elements (float64), to compare masks. ``mask`` is a boolean
    array of w's shape (SP0804 otherwise: an integer 0/1 array would index rows, silently)."""
    array = as_host_array(w, "w")
    keep = as_host_array(mask, "mask")
    if keep.dtype != np.bool_:
        raise SparsityError(SP_BAD_INPUT, f"mask must be a boolean array, got {keep.dtype}",
                            help="pass the mask as bools (e.g. mask.astype(bool)), as transposable_mask_2_4 returns it")
    if keep.shape != array.shape:
        raise SparsityError(SP_BAD_INPUT, f"mask has shape {keep.shape}, but w has shape {array.shape}",
                            help="pass one keep flag per element of w")
    return float(np.abs(array.astype(np.float64))[keep].sum())
