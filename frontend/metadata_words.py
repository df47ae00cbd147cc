"""The bridge from tile-level sparse metadata to the sparsity toolkit.

A metadata tile is a block of the word matrix ``W`` of ``docs/sparse-metadata.md`` ("sm90"
arrangement): rows of 16-bit and tf32 operands are permuted within each 16-row group, 8-bit rows are
plain. Decoding is the toolkit's, so the interpreter and the host tools can never disagree.
"""

from __future__ import annotations

import numpy as np

from . import types as T

_TOOLKIT_NAMES = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2",
                  "i8": "s8", "u8": "u8"}


def toolkit_dtype(t: T.ScalarType) -> str:
    return _TOOLKIT_NAMES[t.name]


def decompress_tile(values: np.ndarray, meta: np.ndarray, elem: T.ScalarType) -> np.ndarray:
    """The dense (M, K) A tile from compressed values (M, K/2) and metadata words."""
    from ..stdlib.sparsity import decompress

    m, kh = values.shape
    dense = decompress(np.ascontiguousarray(values), np.ascontiguousarray(meta).astype(np.uint32), "sm90",
                       toolkit_dtype(elem), m=m, k=2 * kh)
    return np.asarray(dense).astype(values.dtype)
