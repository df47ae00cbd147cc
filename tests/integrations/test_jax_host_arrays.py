"""JAX arrays given to sparsile's host (non-JAX) APIs: a bfloat16 or float8 JAX array is read on the
host as numpy reads it (``__array__``), as its float32 twin is through DLPack. numpy's DLPack has no
bfloat16, and the reader then said it could not read the array "on the host ... copy the tensor to
host memory first" (SP0804) of an array that is in host memory: ``prune_and_compress`` of a JAX
model's bf16 weight was refused."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.stdlib import sparsity as S  # noqa: E402
from sparsile.stdlib.kernels import prune_and_compress  # noqa: E402
from sparsile.stdlib.kernels import sparse_linear as host_sparse_linear  # noqa: E402


def _weight(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.25, 1.0, shape) * rng.choice([-1, 1], shape)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_prune_and_compress_reads_a_16_bit_jax_array(dtype: str) -> None:
    host_type = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    w = _weight((64, 96)).astype(host_type)
    want_values, want_meta = prune_and_compress(w, dtype)
    values, meta = prune_and_compress(jnp.asarray(w), dtype)
    assert np.asarray(values).dtype == np.dtype(host_type)
    assert (np.asarray(values).view(np.uint16) == np.asarray(want_values).view(np.uint16)).all()
    assert (np.asarray(meta.data).view(np.uint32) == np.asarray(want_meta.data).view(np.uint32)).all()


def test_as_host_array_reads_narrow_float_jax_arrays_by_value() -> None:
    w = _weight((8, 16))
    for host_type in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        x = w.astype(host_type)
        got = S.as_host_array(jnp.asarray(x), "x")
        assert got.dtype == np.dtype(host_type) and got.shape == x.shape
        assert (got.view(np.uint8) == x.view(np.uint8)).all()


def test_the_host_sparse_linear_takes_jax_bf16_arrays() -> None:
    w = _weight((64, 96)).astype(ml_dtypes.bfloat16)
    values, meta = prune_and_compress(w, "bf16")
    x = _weight((3, 96), seed=1).astype(ml_dtypes.bfloat16)
    bias = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    y = host_sparse_linear(jnp.asarray(values), meta, jnp.asarray(x), bias=jnp.asarray(bias), out_dtype="float32",
                           interpret=True)
    dense = S.decompress(np.asarray(values), np.asarray(meta.data).view(np.uint32), "sm90", "bf16").astype(np.float64)
    xd = x.astype(np.float64)
    ref = xd @ dense.T + bias
    bound = 96 * 2.0**-24 * (np.abs(xd) @ np.abs(dense).T) + 2.0**-24 * (1 + np.abs(ref))
    assert (np.abs(np.asarray(y, np.float64) - ref) <= bound).all()
