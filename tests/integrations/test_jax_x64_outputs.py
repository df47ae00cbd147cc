"""An output declared 64-bit (float64, int64, uint64) while JAX's x64 is off: SP0931 while tracing,
on both paths. The FFI path returned a float64 array that the next jnp operation silently made
float32 (``y + 1`` is float32 without x64), and ``interpret=True`` failed inside
``jax.pure_callback`` with jax's ValueError ("result_shape_dtypes cannot specify 64-bit types")."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import JaxCallError, call  # noqa: E402


@sp.jit
def triple(x: sp.ptr[sp.f32], out, n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) * 3, mask=mask)


def _enable_x64():  # (jax.enable_x64 since 0.7; jax.experimental.enable_x64 before)
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    from jax.experimental import enable_x64

    return enable_x64()


def _triple(x: object, dtype: object, interpret: bool) -> object:
    return call(triple, (2,), x, n=100, out_shapes=jax.ShapeDtypeStruct((100,), dtype), interpret=interpret)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
@pytest.mark.parametrize("dtype", ["float64", "int64", "uint64"])
def test_a_64_bit_output_without_x64_is_sp0931(dtype: str, interpret: bool) -> None:
    assert not jax.config.jax_enable_x64
    x = jnp.asarray(np.random.default_rng(0).standard_normal(100), jnp.float32)
    narrow = {"float64": "float32", "int64": "int32", "uint64": "uint32"}[dtype]
    for run in (lambda: jax.jit(lambda x: _triple(x, dtype, interpret))(x),
                lambda: jax.eval_shape(lambda x: _triple(x, dtype, interpret), x)):
        line = _triple.__code__.co_firstlineno + 1  # (the call's line: the innermost frame outside sparsile)
        with pytest.raises(JaxCallError) as info:
            run()
        e = info.value
        assert e.code == "SP0931"
        assert e.message == (f"the output for `out` is {dtype}, but JAX without x64 has no 64-bit arrays (it holds "
                             f"them as 32-bit ones) (at test_jax_x64_outputs.py:{line})")
        assert e.help == (f"declare the output as {narrow}, or enable x64: jax.config.update(\"jax_enable_x64\", "
                          "True) (docs/jax.md)")


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_with_x64_a_64_bit_output_runs(interpret: bool) -> None:
    x = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    with _enable_x64():
        y = jax.jit(lambda x: _triple(x, "float64", interpret))(x)
        assert y.dtype == jnp.float64 and (y + 1).dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(y), np.float32(3) * x)  # (the kernel's f32 product, widened)
