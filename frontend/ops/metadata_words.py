"""The bridge from tile-level sparse metadata to the sparsity toolkit.

A metadata tile is a block of the word matrix ``W`` of ``docs/sparse-metadata.md`` ("sm90"
arrangement): rows of 16-bit and tf32 operands are permuted within each 16-row group, 8-bit rows are
plain. Decoding is the toolkit's, so the interpreter and the host tools can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir import types as T

_TOOLKIT_NAMES = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2",
                  "i8": "s8", "u8": "u8"}


def toolkit_dtype(t: T.ScalarType) -> str:
    return _TOOLKIT_NAMES[t.name]


def decompress_tile(values: np.ndarray, meta: np.ndarray, elem: T.ScalarType) -> np.ndarray:
    """The dense (M, K) A tile from compressed values (M, K/2) and metadata words (:func:`sparse_tile`)."""
    return sparse_tile(values, meta, elem)[0]


def sparse_tile(values: np.ndarray, meta: np.ndarray,
                elem: T.ScalarType) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
    """(the dense (M, K) A tile from compressed values (M, K/2) and metadata words, a function that
    gives the (M, K) bool mask of the positions the metadata names): the MMA multiplies B's elements
    at those positions only (the sparse tensor cores select them by the metadata; ``mma_reference``'s
    ``stored``, which asks for the mask only where B holds a NaN or an inf).

    A tile read past the end of the metadata (out-of-bounds rows or K groups read as zero words)
    has undefined nibbles 0x0 where its values are zero too: such a chunk contributes zero whatever
    the hardware makes of its metadata, so those words are read as the canonical 0x44444444. An
    undefined nibble next to a nonzero value is still an error."""
    from ...stdlib.sparsity import decompress

    m, kh = values.shape
    words = np.ascontiguousarray(meta).astype(np.uint32).copy()
    if elem.bits == 8 and words.shape[1] % 2:
        # an 8-bit tile of K = 32 (one word a row, as sema asks): the toolkit's format pads K to the
        # instruction's 64, so decode it with a padding word (0x4 chunks) over zero values
        dense, stored = sparse_tile(np.concatenate([values, np.zeros((m, 16), values.dtype)], axis=1),
                                    np.concatenate([words, np.full((m, 1), 0x44444444, np.uint32)], axis=1), elem)
        return dense[:, :2 * kh], lambda: stored()[:, :2 * kh]
    zero_words = words == 0
    if zero_words.any():
        words[zero_words] = 0x44444444
    values = np.ascontiguousarray(values)
    dense = decompress(values, words, "sm90", toolkit_dtype(elem), m=m, k=2 * kh)
    dense = np.asarray(dense).astype(values.dtype)
    if zero_words.any():
        _check_zero_words_cover_zero_values(values, zero_words, elem)

    def stored() -> np.ndarray:
        ones = np.ones(values.shape, values.dtype)
        return np.asarray(decompress(ones, words, "sm90", toolkit_dtype(elem), m=m, k=2 * kh)) != 0

    return dense, stored


def _check_zero_words_cover_zero_values(values: np.ndarray, zero_words: np.ndarray, elem: T.ScalarType) -> None:
    """Every compressed value governed by an all-zero metadata word must be zero."""
    from ...stdlib.sparsity import SparsityError

    m, kh = values.shape
    per_word = 16 if elem.name in ("tf32", "f32") else 32
    # word (L, c) of the sm90 format governs: 16-bit/tf32 rows r, r+8 of its 16-row group, K half h;
    # 8-bit row L; its compressed columns are [c*per_word/2, (c+1)*per_word/2)
    for L, c in zip(*np.nonzero(zero_words), strict=True):
        cols = slice(c * per_word // 2, min(kh, (c + 1) * per_word // 2))
        if elem.bits == 8:
            rows = [L]
            sub = values[L, cols]
        else:
            base, h, lo = 16 * (L // 16), (L % 16) // 8, L % 8
            rows = [base + lo, base + lo + 8]
            half = per_word // 4
            c0 = c * per_word // 2 + h * half
            sub = values[[r for r in rows if r < m], c0:c0 + half] if any(r < m for r in rows) else values[:0, :0]
        if np.any(np.asarray(sub, dtype=np.float64) != 0):
            raise SparsityError("SP0818", f"metadata word ({L}, {c}) is 0 (undefined nibbles) but governs nonzero "
                                "values", help="encode the metadata with sparsile.stdlib.sparsity.encode_metadata")
