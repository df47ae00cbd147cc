"""sparse_matmul_reference against a float64 dense product on random data, every dtype and format."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sparsile.stdlib.sparsity import (
    SparsityError,
    compress,
    encode_metadata,
    operand_type,
    prune,
    sparse_matmul_reference,
)

ALL = ["f16", "bf16", "tf32", "e4m3", "e5m2", "s8", "u8", "e2m1"]


CASES = [(d, f) for d in ALL for f in ("logical", "sm90", "tcgen05") if (d, f) != ("e2m1", "sm90")]


@pytest.mark.parametrize("dtype, fmt", CASES)
def test_reference_equals_dense_product(dtype, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{fmt}".encode()))
    m, k, n = 24, 200, 7
    scale = 30 if dtype in ("s8", "u8") else 2
    dense = rng.standard_normal((m, k)) * scale
    if dtype == "u8":
        dense = np.abs(dense)
    host = operand_type(dtype).host_dtype
    a = prune(dense.astype(np.float32).astype(host) if host.kind == "V" else dense.astype(host), dtype)
    b = rng.standard_normal((k, n))
    values, indices = compress(a, dtype)
    meta = encode_metadata(indices, fmt, dtype, k=k)
    got = sparse_matmul_reference(values, meta, b)
    expected = a.astype(np.float64) @ b
    assert got.dtype == np.float64 and got.shape == (m, n)
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    # a vector B gives a vector
    np.testing.assert_allclose(sparse_matmul_reference(values, meta, b[:, 0]), expected[:, 0], rtol=1e-12)


def test_reference_with_raw_metadata():
    rng = np.random.default_rng(0)
    a = prune(rng.standard_normal((16, 64)).astype(np.float16), "f16")
    values, indices = compress(a)
    raw = encode_metadata(indices, "tcgen05", "f16").data
    b = rng.standard_normal((64, 3))
    np.testing.assert_allclose(sparse_matmul_reference(values, raw, b, "tcgen05", "f16"),
                               a.astype(np.float64) @ b, rtol=1e-12)


def test_reference_rejects_wrong_b():
    values, indices = compress(np.zeros((4, 8), np.float16))
    meta = encode_metadata(indices, "sm90", "f16")
    with pytest.raises(SparsityError) as info:
        sparse_matmul_reference(values, meta, np.ones((7, 2)))
    assert info.value.code == "SP0815"


def test_values_must_match_metadata():
    values, indices = compress(np.zeros((4, 8), np.float16))
    meta = encode_metadata(indices, "sm90", "f16")
    with pytest.raises(SparsityError) as info:
        sparse_matmul_reference(values[:, :2], meta, np.ones((8, 2)))
    assert info.value.code == "SP0814"
    with pytest.raises(SparsityError) as info:
        sparse_matmul_reference(values.astype(np.float32), meta, np.ones((8, 2)))
    assert info.value.code == "SP0814"
