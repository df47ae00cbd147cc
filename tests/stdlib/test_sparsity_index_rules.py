"""Bad logical indices: one rule per fault, one code and one message at every entry point.

encode_metadata refused every bad index array with SP0813 ("bad logical indices") while
validate_metadata, decode_metadata and decompress refused the same arrays with SP0805 (wrong
shape), SP0807 (an index named twice) and SP0808 (a decreasing pair), each with its own wording.
Now every entry point says SP0805 for the shape, SP0807 for an equal pair, SP0808 for a decreasing
pair and SP0813 for an index out of range, with the same message and help (as SP0806 for the
element type, tests/stdlib/test_sparsity_index_type.py).
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


def _operand(seed: int, dtype: str = "f16", rows: int = 16, k: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(values, logical uint8 indices) of a random structured-sparse rows x k matrix (no zero kept)."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (rows, k)).astype(np.float32)
    group, keep_units, unit = {"f16": (4, 2, 1), "tf32": (2, 1, 1), "e2m1": (8, 2, 2)}[dtype]
    keep = np.zeros((rows, k // group, group // unit), bool)
    for row in range(rows):
        for chunk in range(k // group):
            keep[row, chunk, rng.choice(group // unit, keep_units, replace=False)] = True
    dense[~np.repeat(keep, unit, axis=-1).reshape(rows, k)] = 0
    return compress(dense, dtype)


def _entry_points(dtype: str, m: int, k: int) -> dict[str, Callable[[np.ndarray, np.ndarray], object]]:
    points: dict[str, Callable[[np.ndarray, np.ndarray], object]] = {
        "encode tcgen05": lambda values, idx: encode_metadata(idx, "tcgen05", dtype),
        "encode logical": lambda values, idx: encode_metadata(idx, "logical", dtype),
        "validate": lambda values, idx: validate_metadata(idx, "logical", dtype),
        "validate sized": lambda values, idx: validate_metadata(idx, "logical", dtype, m, k),
        "validate buffer": lambda values, idx: validate_metadata(MetadataBuffer(idx, "logical", dtype, m, k)),
        "decode": lambda values, idx: decode_metadata(idx, "logical", dtype),
        "decompress": lambda values, idx: decompress(values, idx, "logical", dtype),
    }
    if dtype != "e2m1":
        points["encode sm90"] = lambda values, idx: encode_metadata(idx, "sm90", dtype)
    return points


ENTRIES = sorted(_entry_points("f16", 16, 32))


def _refused(entry: str, values: np.ndarray, bad: object, dtype: str = "f16") -> SparsityError:
    with pytest.raises(SparsityError) as info:
        _entry_points(dtype, 16, 32)[entry](values, bad)
    assert info.value.span == UNKNOWN_SPAN
    return info.value


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_good_indices_pass_everywhere(entry: str) -> None:
    values, indices = _operand(1)
    _entry_points("f16", 16, 32)[entry](values, indices)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("shape_of, found, hint", [
    (lambda idx: idx[..., 0], "(16, 8)", ""),
    (lambda idx: idx[..., :1], "(16, 8, 1)", "; that is the shape of logical indices for tf32 operands"),
    (lambda idx: idx.reshape(16, 16), "(16, 16)", ""),
    (lambda idx: idx[None], "(1, 16, 8, 2)", ""),
])
def test_wrong_shape_is_sp0805_everywhere(entry: str, shape_of: Callable[[np.ndarray], np.ndarray],
                                          found: str, hint: str) -> None:
    values, indices = _operand(2)
    err = _refused(entry, values, np.ascontiguousarray(shape_of(indices)))
    assert (err.code, err.message, err.help) == (
        "SP0805", f"logical indices for f16 operands must have shape (M, K/4, 2), found {found}{hint}",
        "pass the indices compress(w, dtype='f16') returns for this operand")


@pytest.mark.parametrize("entry", ENTRIES)
def test_equal_pair_is_sp0807_everywhere(entry: str) -> None:
    values, indices = _operand(3)
    bad = indices.copy()
    bad[3, 5] = (2, 2)
    bad[9, 1] = (0, 0)
    err = _refused(entry, values, bad)
    assert (err.code, err.message, err.help) == (
        "SP0807", "logical indices (2, 2) at row 3, group 5 (K 20..23) name one position twice "
        "(undefined; 2 groups affected)",
        "each chunk keeps two different positions, stored idx0 < idx1; re-create the indices with compress()")


@pytest.mark.parametrize("entry", ENTRIES)
def test_decreasing_pair_is_sp0808_everywhere(entry: str) -> None:
    values, indices = _operand(4)
    bad = indices.copy()
    bad[7, 2] = (3, 1)
    err = _refused(entry, values, bad)
    assert (err.code, err.message, err.help) == (
        "SP0808", "logical indices (3, 1) at row 7, group 2 (K 8..11) are a decreasing pair (1 group affected)",
        "the logical format stores idx0 < idx1: sort each pair, or re-create the indices with compress()")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("value, index_type", [(4, np.uint8), (7, np.uint8), (-1, np.int16), (300, np.int64)])
def test_out_of_range_is_sp0813_everywhere(entry: str, value: int, index_type: type) -> None:
    values, indices = _operand(5)
    bad = indices.astype(index_type)
    bad[11, 6, 1] = value
    err = _refused(entry, values, bad)
    assert (err.code, err.message, err.help) == (
        "SP0813", f"logical index {value} at row 11, group 6 (K 24..27) is out of range for f16: a chunk "
        "has 4 elements, indices 0..3 (1 group affected)",
        "indices are positions within a chunk; re-create them with compress()")


@pytest.mark.parametrize("entry", ENTRIES)
def test_an_equal_pair_is_named_before_an_earlier_decreasing_one(entry: str) -> None:
    """Every entry point looks for the undefined pair first (one rule, one order)."""
    values, indices = _operand(6)
    bad = indices.copy()
    bad[0, 0] = (3, 1)
    bad[15, 7] = (1, 1)
    assert _refused(entry, values, bad).code == "SP0807"


@pytest.mark.parametrize("entry", ENTRIES)
def test_shape_is_checked_before_element_type_and_values(entry: str) -> None:
    values, _ = _operand(8)
    err = _refused(entry, values, np.full((16, 8), 9.0))
    assert err.code == "SP0805"
    err = _refused(entry, values, np.full((16, 8, 2), 9.0))
    assert err.code == "SP0806"


@pytest.mark.parametrize("dtype, slots, group, hint", [
    ("tf32", 1, 2, "; that is the shape of logical indices for 16-bit, 8-bit and 4-bit operands"),
    ("e2m1", 2, 8, "; that is the shape of logical indices for tf32 operands"),
])
def test_other_operand_types_share_the_rules(dtype: str, slots: int, group: int, hint: str) -> None:
    values, indices = _operand(9, dtype)
    points = _entry_points(dtype, 16, 32)
    wrong = np.concatenate([indices, indices], axis=-1)[..., :3 - slots]  # the other slot count
    units = group if dtype == "tf32" else group // 2
    for entry, call in sorted(points.items()):
        call(values, indices)
        with pytest.raises(SparsityError) as info:
            call(values, wrong)
        assert (info.value.code, info.value.message) == (
            "SP0805", f"logical indices for {dtype} operands must have shape (M, K/{group}, {slots}), found "
            f"{wrong.shape}{hint}"), entry
        bad = indices.copy()
        bad[2, 3, 0] = units
        with pytest.raises(SparsityError) as info:
            call(values, bad)
        noun = "pairs" if dtype == "e2m1" else "elements"
        assert (info.value.code, info.value.message) == (
            "SP0813", f"logical index {units} at row 2, group 3 (K {3 * group}..{4 * group - 1}) is out of "
            f"range for {dtype}: a chunk has {units} {noun}, indices 0..{units - 1} (1 group affected)"), entry


def test_sized_validation_names_the_expected_shape() -> None:
    """Given m and k, a rank-3 array of other sizes is SP0805 with the concrete shape (the rank and
    slot rule above comes first, with the same wording at every entry point)."""
    _, indices = _operand(10)
    with pytest.raises(SparsityError) as info:
        validate_metadata(indices, "logical", "f16", 16, 40)
    assert (info.value.code, info.value.message) == (
        "SP0805", "logical indices for a 16x40 f16 operand must have shape (16, 10, 2), found (16, 8, 2)")


def test_unordered_pairs_still_pass_where_allowed() -> None:
    """allow_unordered=True lets a decreasing pair through validate, decode and decompress (not an
    equal pair); decompress places each value at the position its index names."""
    values, indices = _operand(11)
    swapped = indices[..., ::-1].copy()
    validate_metadata(swapped, "logical", "f16", allow_unordered=True)
    np.testing.assert_array_equal(decode_metadata(swapped, "logical", "f16", allow_unordered=True), swapped)
    want = np.full((16, 32), np.nan)
    for row in range(16):
        for chunk in range(8):
            for slot in range(2):
                want[row, 4 * chunk + swapped[row, chunk, slot]] = values[row, 2 * chunk + slot]
    want[np.isnan(want)] = 0
    dense = decompress(values, swapped, "logical", "f16", allow_unordered=True)
    np.testing.assert_array_equal(dense.astype(np.float64), want)
    equal = indices.copy()
    equal[0, 0] = (1, 1)
    with pytest.raises(SparsityError) as info:
        validate_metadata(equal, "logical", "f16", allow_unordered=True)
    assert info.value.code == "SP0807"
