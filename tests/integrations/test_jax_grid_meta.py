"""What a grid function sees of an array in ``sparsile.jax.call``: a stand-in (the arrays are traced)
that answers what a numpy or jax array answers about its shape: ``shape``, ``dtype``, ``ndim``,
``size``, ``itemsize``, ``nbytes`` and ``len()``. ``size`` (the idiom of a flat kernel's grid,
``cdiv(meta["x"].size, BLOCK)``), ``len()`` and ``nbytes`` were an AttributeError or TypeError of a
private class, where ``kernel[grid]`` with numpy arrays ran."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import call  # noqa: E402


@sp.jit
def double(x, out, n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.load(x + offs, mask=mask) * 2, mask=mask)


GRIDS = {
    "size": lambda m: (sp.cdiv(m["x"].size, m["BLOCK"]),),
    "len": lambda m: (sp.cdiv(len(m["x"]) * m["x"].shape[1], m["BLOCK"]),),
    "nbytes": lambda m: (sp.cdiv(m["out"].nbytes // m["out"].itemsize, m["BLOCK"]),),
    "ndim": lambda m: (sp.cdiv(m["x"].shape[m["x"].ndim - 1] * m["x"].shape[0], m["BLOCK"]),),
}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_a_grid_function_reads_an_array_as_numpy_s(grid: str, dtype: str) -> None:
    x = (np.arange(300).reshape(10, 30) % 50 - 25).astype(dtype)
    want = np.empty_like(x)  # the same grid function on the numpy launch path
    double.interpret[GRIDS[grid]](x, want, 300)
    np.testing.assert_array_equal(want, x * 2)
    f = jax.jit(lambda x: call(double, GRIDS[grid], x, n=300, out_shapes=jax.ShapeDtypeStruct(x.shape, x.dtype)))
    got = np.asarray(f(jnp.asarray(x)))
    np.testing.assert_array_equal(got, x * 2)


def test_the_stand_in_of_a_0_d_array_has_no_len() -> None:
    """As numpy's: ``len()`` of a 0-d array is a TypeError (the user's grid function raised it)."""
    seen = {}

    def grid(meta: dict) -> tuple[int]:
        seen.update(size=meta["s"].size, ndim=meta["s"].ndim, nbytes=meta["s"].nbytes)
        with pytest.raises(TypeError, match="len\\(\\) of unsized object"):
            len(meta["s"])
        return (1,)

    @sp.jit
    def read0(s: sp.ptr[sp.f32], out, BLOCK: sp.constexpr = 16):
        sp.store(out + sp.arange(0, BLOCK), sp.load(s) + sp.zeros((BLOCK,), sp.f32))

    out = call(read0, grid, jnp.float32(2.5).reshape(()), out_shapes=jax.ShapeDtypeStruct((16,), jnp.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full(16, 2.5, np.float32))
    assert seen == {"size": 1, "ndim": 0, "nbytes": 4}
