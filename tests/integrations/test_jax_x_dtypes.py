"""The element types of x that sparsile.jax.sparse_linear takes with 16-bit weights: every JAX
floating type (x is cast to the weight's type in XLA), against float64; anything else is SP0938."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear  # noqa: E402

NARROW = ["float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3",
          "float8_e8m0fnu", "float4_e2m1fn"]
"""Floating types narrower than 16 bits (ml_dtypes', as jax.numpy names them): each value is exact
in bfloat16 and float16 (at most 4 mantissa bits; exponents within both, e8m0's powers of two
within bfloat16's)."""


def _layer(dtype: str) -> SparseLinear:
    rng = np.random.default_rng(11)
    return SparseLinear.from_dense(rng.standard_normal((24, 64)), dtype, bias=rng.standard_normal(24),
                                   out_dtype="float32")


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize("weights", ["bf16", "f16"])
def test_a_narrow_float_x_is_cast_to_the_weight_type(name: str, weights: str) -> None:
    """All but float8_e5m2 were SP0938 "x must be floating point, got float8_e4m3fnuz" (the check
    read numpy's dtype kind, which ml_dtypes sets to "f" for e5m2 only), though x was documented
    as any floating point type and e5m2 ran."""
    dtype = getattr(jnp, name, None)
    if dtype is None:
        pytest.skip(f"this jax has no {name}")
    layer = _layer(weights)
    rng = np.random.default_rng(5)
    magnitudes = rng.uniform(0.25, 4.0, (3, 5, 64))
    signs = 1.0 if name == "float8_e8m0fnu" else rng.choice([-1.0, 1.0], (3, 5, 64))  # (e8m0 has no sign)
    x = jnp.asarray(magnitudes * signs).astype(dtype)
    y = jax.jit(layer)(x)
    assert y.dtype == jnp.float32 and y.shape == (3, 5, 24)
    xq = np.asarray(x).astype(np.float64)  # exact: the cast to the weight type loses nothing
    w = layer.dense().astype(np.float64)
    ref = xq @ w.T + np.asarray(layer.bias, np.float64)
    bound = 64 * 2.0**-23 * (np.abs(xq) @ np.abs(w).T) + 2.0**-23 * np.abs(ref)
    assert (np.abs(np.asarray(y, np.float64) - ref) <= bound).all()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "bool", "complex64"])
def test_an_x_that_is_not_floating_point_is_sp0938(dtype: str) -> None:
    layer = _layer("bf16")
    x = jnp.ones((2, 64), dtype)
    with pytest.raises(JaxCallError) as info:
        layer(x)
    assert info.value.code == "SP0938"
    assert info.value.message.startswith(f"x must be floating point, got {dtype} (at ")
    assert info.value.help == "cast x to bfloat16, float16 or float32"
