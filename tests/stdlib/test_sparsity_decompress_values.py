"""SP0814 of ``decompress`` says the rule it applies: values need the metadata's rows and at least
its K/2 columns, and the columns past those are not read. It said "values must have shape (16, 16)"
while it accepted (and needs to accept: integrations/torch/weight.py) wider values."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.sparsity import (
    SparsityError,
    compress,
    decompress,
    encode_metadata,
    prune,
    sparse_matmul_reference,
)


def _operands(m: int = 16, k: int = 32):
    rng = np.random.default_rng(5)
    a = prune(rng.uniform(-4, 4, (m, k)).astype(np.float16), "f16")
    values, indices = compress(a)
    return a, values, encode_metadata(indices, "sm90", "f16")


@pytest.mark.parametrize("shape", [(16, 8), (16, 15), (15, 16), (17, 20)])
def test_values_too_narrow_or_of_other_rows_say_the_rule(shape: tuple[int, int]) -> None:
    meta = _operands()[2]
    bad = np.random.default_rng(6).uniform(-1, 1, shape).astype(np.float16)
    with pytest.raises(SparsityError) as info:
        decompress(bad, meta)
    assert (info.value.code, info.value.message, info.value.help) == (
        "SP0814", "values must have 16 rows and at least 16 columns for this metadata (columns past 16 are not "
        f"read), got shape {shape}", "pass the values returned by compress() together with its metadata")


def test_a_one_dimensional_values_array_says_the_rule() -> None:
    _, values, meta = _operands()
    with pytest.raises(SparsityError) as info:
        decompress(values.reshape(-1), meta)
    assert info.value.message == ("values must have 16 rows and at least 16 columns for this metadata (columns past 16 "
                                  "are not read), got shape (256,)")


@pytest.mark.parametrize("extra", [1, 8])
def test_wider_values_are_read_up_to_the_metadata_columns(extra: int) -> None:
    """What the message promises: the columns past K/2 are not read (NaN there reaches nothing)."""
    a, values, meta = _operands()
    wide = np.concatenate([values, np.full((16, extra), np.nan, np.float16)], axis=1)
    got = decompress(wide, meta)
    assert got.shape == a.shape and not np.isnan(got).any()
    assert np.array_equal(got.view(np.uint16), a.view(np.uint16))
    b = np.random.default_rng(7).standard_normal((32, 3))
    np.testing.assert_allclose(sparse_matmul_reference(wide, meta, b), a.astype(np.float64) @ b, rtol=1e-12)
