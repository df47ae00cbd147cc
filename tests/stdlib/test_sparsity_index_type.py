"""Logical indices of a non-integer element type: one rule and one code (SP0806) at every entry point.

encode_metadata refused a float index array with SP0813 ("bad logical indices") while
validate_metadata, decode_metadata and decompress refused the same array with SP0806 ("metadata
element type"), each with its own wording. Integer-valued floats (2.0) and bools are not indices
either: every entry point refuses them the same way.
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

HELP = "pass integer positions within a chunk (the uint8 indices compress() returns)"


def _indices(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, logical uint8 indices) of a random 2:4-sparse f16 16 x 32 matrix (no zero kept)."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (16, 32)).astype(np.float16)
    keep = np.zeros((16, 8, 4), bool)
    for row in range(16):
        for chunk in range(8):
            keep[row, chunk, rng.choice(4, 2, replace=False)] = True
    dense[~keep.reshape(16, 32)] = 0
    values, indices = compress(dense, "f16")
    return values, indices


ENTRY_POINTS: dict[str, Callable[[np.ndarray, np.ndarray], object]] = {
    "encode sm90": lambda values, idx: encode_metadata(idx, "sm90", "f16"),
    "encode tcgen05": lambda values, idx: encode_metadata(idx, "tcgen05", "f16"),
    "encode logical": lambda values, idx: encode_metadata(idx, "logical", "f16"),
    "validate": lambda values, idx: validate_metadata(idx, "logical", "f16"),
    "validate buffer": lambda values, idx: validate_metadata(MetadataBuffer(idx, "logical", "f16", 16, 32)),
    "decode": lambda values, idx: decode_metadata(idx, "logical", "f16"),
    "decompress": lambda values, idx: decompress(values, idx, "logical", "f16"),
}

BAD_TYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bool": np.bool_,
    "complex64": np.complex64,
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("type_name", sorted(BAD_TYPES))
def test_non_integer_indices_one_code_and_message(entry: str, type_name: str) -> None:
    values, indices = _indices(7)
    ENTRY_POINTS[entry](values, indices)  # the uint8 indices pass
    bad = indices.astype(BAD_TYPES[type_name])  # integer-valued (0.0 .. 3.0, or False/True)
    with pytest.raises(SparsityError) as info:
        ENTRY_POINTS[entry](values, bad)
    err = info.value
    assert (err.code, err.message, err.help) == (
        "SP0806", f"logical indices must be integers, found {type_name}", HELP)
    assert err.span == UNKNOWN_SPAN


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_integer_valued_float_list_is_refused_too(entry: str) -> None:
    """A nested list of 2.0-like floats (what ``tolist()`` of a float array gives) is refused; the
    same list of ints is accepted and means what the uint8 array means."""
    values, indices = _indices(11)
    as_floats = indices.astype(np.float64).tolist()
    with pytest.raises(SparsityError) as info:
        ENTRY_POINTS[entry](values, as_floats)
    assert (info.value.code, info.value.message) == ("SP0806", "logical indices must be integers, found float64")
    as_ints = indices.astype(np.int64).tolist()
    np.testing.assert_array_equal(decode_metadata(encode_metadata(as_ints, "sm90", "f16")), indices)
    ENTRY_POINTS[entry](values, as_ints)
