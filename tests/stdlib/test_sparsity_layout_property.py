"""The toolkit reads an array's values, whatever its layout: pruning a Fortran-order, reversed,
strided, byte-swapped, read-only, ``np.matrix`` or unmasked masked array gives the mask and values
of its C-contiguous copy, bit for bit; and ``decompress(compress(prune(w)))`` is ``w`` where the
mask keeps it (bit for bit but for a kept -0.0, which may come back as +0.0) and zero elsewhere
(NaN and inf included: both rank above every number), with the
metadata words themselves passed in each layout to ``validate_metadata`` and ``decompress``."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import (
    compress,
    decompress,
    encode_metadata,
    prune,
    prune_mask,
    validate_metadata,
)

HOSTS = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "u8": np.uint8, "e2m1": ml_dtypes.float4_e2m1fn}


def _strided(a: np.ndarray) -> np.ndarray:
    """``a``'s values in every other row and column of a larger array."""
    big = np.zeros((2 * a.shape[0], 2 * a.shape[1]), a.dtype)
    view = big[::2, ::2]
    view[...] = a
    return view


def _reversed(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a view with negative strides."""
    return a[::-1, ::-1].copy()[::-1, ::-1]


def _read_only(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.setflags(write=False)
    return b


def _byte_swapped(a: np.ndarray) -> np.ndarray:
    """``a``'s values stored in the other byte order (the same array for one-byte and ml_dtypes types,
    which have none)."""
    if a.dtype.itemsize == 1 or a.dtype.kind == "V":
        return a
    return a.astype(a.dtype.newbyteorder("S"))


LAYOUTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "fortran": np.asfortranarray, "reversed": _reversed, "strided": _strided, "read-only": _read_only,
    "byte-swapped": _byte_swapped, "matrix": np.asmatrix, "masked-nothing": lambda a: np.ma.masked_array(a, mask=False),
}


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a.view(np.ndarray))
    return a.view(f"u{a.dtype.itemsize}")


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # (np.matrix)
@settings(max_examples=80)
@given(dtype=st.sampled_from(sorted(HOSTS)), rows=st.integers(1, 6), k=st.integers(1, 40),
       layout=st.sampled_from(sorted(LAYOUTS)), seed=st.integers(0, 2**32 - 1))
def test_every_layout_prunes_and_round_trips_as_its_c_copy(dtype: str, rows: int, k: int, layout: str,
                                                            seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, k)) * 4
    if HOSTS[dtype] not in (np.int8, np.uint8, ml_dtypes.float4_e2m1fn):
        specials = rng.random((rows, k))
        values[specials < 0.08] = np.nan
        values[(specials >= 0.08) & (specials < 0.16)] = np.inf
    if HOSTS[dtype] is np.uint8:
        values = np.abs(values)
    w = values.astype(np.float32).astype(HOSTS[dtype])  # (e4m3: inf becomes NaN)
    given_w = LAYOUTS[layout](w)
    mask = prune_mask(w, dtype)
    np.testing.assert_array_equal(prune_mask(given_w, dtype), mask)
    pruned = prune(given_w, dtype)
    assert type(pruned) is np.ndarray and pruned.dtype == w.dtype
    np.testing.assert_array_equal(_bits(pruned), np.where(mask, _bits(w), 0))
    kept, indices = compress(pruned, dtype)
    fused_kept, fused_indices = compress(given_w, dtype, prune=True)
    np.testing.assert_array_equal(fused_indices, indices)
    np.testing.assert_array_equal(_bits(fused_kept), _bits(kept))
    for fmt in ("logical", "tcgen05") + (("sm90",) if dtype != "e2m1" else ()):  # (no 4-bit sm90 format)
        meta = encode_metadata(LAYOUTS[layout](indices) if fmt == "logical" and indices.ndim == 2 else indices, fmt,
                               dtype, k=k)
        words = np.asarray(meta.data)
        given_words = LAYOUTS[layout](words) if words.ndim == 2 else words
        checked = validate_metadata(given_words, fmt, dtype, rows, k)
        dense = decompress(LAYOUTS[layout](kept), checked)
        assert dense.shape == (rows, k)
        # (a kept -0.0 may come back as +0.0: compression stores zeros by the CUTLASS table,
        # docs/sparse-metadata.md; every other kept element, NaN payloads included, bit for bit)
        expected = np.where(mask, w.astype(np.float64), 0.0)
        np.testing.assert_array_equal(dense.astype(np.float64), expected)
        nonzero = expected != 0
        np.testing.assert_array_equal(_bits(dense)[nonzero], _bits(w)[nonzero])
