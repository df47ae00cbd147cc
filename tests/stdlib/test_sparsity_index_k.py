"""Logical indices that do not fit the operand's k (or m): one code, message and help everywhere.

encode_metadata(indices, fmt, dtype, k=K) with a K the indices' groups cannot hold said SP0812
("k = 100 does not match indices with 8 groups of 4") while validate_metadata, decode_metadata and
decompress said SP0805 ("logical indices for a 16x100 f16 operand must have shape ...") for the
same indices and K. Every entry point now says SP0805 in one wording, with a help line naming the
sizes the indices do fit (:mod:`sparsile.stdlib.sparsity.indexrules`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from sparsile.frontend.spans import UNKNOWN_SPAN
from sparsile.stdlib.sparsity import (
    MetadataBuffer,
    SparsityError,
    compress,
    decode_metadata,
    decompress,
    encode_metadata,
    validate_metadata,
)

ROWS = 16


def _operand(seed: int, dtype: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, logical indices) of a random rows x k ``dtype`` matrix pruned to its pattern (no zero kept)."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (ROWS, k)).astype(np.float32)
    return compress(dense, dtype, prune=True)


def _entry_points(dtype: str, m: int, k: int) -> dict[str, Callable[[np.ndarray, np.ndarray], object]]:
    """Every entry point that reads logical indices together with the operand's m and k."""
    points: dict[str, Callable[[np.ndarray, np.ndarray], object]] = {
        "encode logical": lambda values, idx: encode_metadata(idx, "logical", dtype, k=k),
        "encode tcgen05": lambda values, idx: encode_metadata(idx, "tcgen05", dtype, k=k),
        "validate": lambda values, idx: validate_metadata(idx, "logical", dtype, m, k),
        "validate buffer": lambda values, idx: validate_metadata(MetadataBuffer(idx, "logical", dtype, m, k)),
        "decode": lambda values, idx: decode_metadata(idx, "logical", dtype, m=m, k=k),
        "decompress": lambda values, idx: decompress(values, idx, "logical", dtype, m=m, k=k),
    }
    if dtype != "e2m1":
        points["encode sm90"] = lambda values, idx: encode_metadata(idx, "sm90", dtype, k=k)
    return points


def _refused(entry: str, dtype: str, m: int, k: int, values: np.ndarray, indices: np.ndarray) -> SparsityError:
    with pytest.raises(SparsityError) as info:
        _entry_points(dtype, m, k)[entry](values, indices)
    assert info.value.span == UNKNOWN_SPAN
    return info.value


ENTRIES = sorted(_entry_points("f16", ROWS, 32))


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype, k, fits", [("f16", 29, "29..32"), ("f16", 32, "29..32"),
                                            ("tf32", 31, "31..32"), ("e2m1", 25, "25..32")])
def test_a_k_the_indices_hold_passes_everywhere(entry: str, dtype: str, k: int, fits: str) -> None:
    if entry == "encode sm90" and dtype == "e2m1":
        pytest.skip("e2m1 has no sm90 format")
    values, indices = _operand(1, dtype, 32)
    _entry_points(dtype, ROWS, k)[entry](values, indices)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("dtype, k, expected, fits", [
    ("f16", 100, "(16, 25, 2)", "29..32"),   # too many groups
    ("f16", 28, "(16, 7, 2)", "29..32"),     # one group short
    ("f16", 33, "(16, 9, 2)", "29..32"),     # one element over
    ("f16", 0, "(16, 0, 2)", "29..32"),
    ("tf32", 30, "(16, 15, 1)", "31..32"),
    ("e2m1", 24, "(16, 3, 2)", "25..32"),
])
def test_a_k_the_indices_do_not_hold_is_sp0805_everywhere(entry: str, dtype: str, k: int, expected: str,
                                                         fits: str) -> None:
    if entry == "encode sm90" and dtype == "e2m1":
        pytest.skip("e2m1 has no sm90 format")
    values, indices = _operand(2, dtype, 32)
    err = _refused(entry, dtype, ROWS, k, values, indices)
    assert (err.code, err.message, err.help) == (
        "SP0805", f"logical indices for a 16x{k} {dtype} operand must have shape {expected}, found "
        f"{indices.shape}",
        f"pass the indices compress(w, dtype={dtype!r}) returns for this operand; these indices are those of a "
        f"16 x K operand with K in {fits}")


@pytest.mark.parametrize("entry", ["validate", "validate buffer", "decode", "decompress"])
def test_an_m_the_indices_do_not_hold_is_sp0805_everywhere(entry: str) -> None:
    values, indices = _operand(3, "f16", 32)
    err = _refused(entry, "f16", 17, 32, values, indices)
    assert (err.code, err.message, err.help) == (
        "SP0805", "logical indices for a 17x32 f16 operand must have shape (17, 8, 2), found (16, 8, 2)",
        "pass the indices compress(w, dtype='f16') returns for this operand; these indices are those of a "
        "16 x K operand with K in 29..32")


def test_empty_indices_fit_only_k_zero() -> None:
    indices = np.zeros((4, 0, 2), np.uint8)
    assert encode_metadata(indices, "sm90", "f16", k=0).k == 0
    err = _refused("encode sm90", "f16", 4, 3, np.zeros((4, 0), np.float16), indices)
    assert (err.code, err.message, err.help) == (
        "SP0805", "logical indices for a 4x3 f16 operand must have shape (4, 1, 2), found (4, 0, 2)",
        "pass the indices compress(w, dtype='f16') returns for this operand; these indices are those of a "
        "4 x K operand with K = 0")


@pytest.mark.parametrize("entry", ["encode logical", "encode sm90", "validate", "decode"])
def test_the_shape_is_checked_before_the_values(entry: str) -> None:
    """An index out of range in indices that do not fit k: the shape (SP0805) at every entry point,
    as validate_metadata checks it first (encode said SP0813, having read the values first)."""
    values, indices = _operand(4, "f16", 32)
    bad = indices.copy()
    bad[0, 0, 1] = 9
    assert _refused(entry, "f16", ROWS, 100, values, bad).code == "SP0805"


def test_encode_k_default_and_its_range_still_encode() -> None:
    values, indices = _operand(5, "f16", 32)
    for k in (None, 29, 30, 31, 32):
        meta = encode_metadata(indices, "sm90", "f16", k=k)
        assert meta.k == (32 if k is None else k)
        dense = decompress(values, meta)
        assert dense.shape == (ROWS, meta.k)
        assert np.array_equal(decode_metadata(meta), indices)
