"""``jax.disable_jit()`` (the debugging switch that runs jitted functions op by op): a sparsile call
still runs, through its own compiled custom call. Its eager implementation compiled the primitive
with ``jax.jit``, which under ``disable_jit`` called the primitive again: RecursionError."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import SparseLinear, call  # noqa: E402


@sp.jit
def axpy(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, alpha: sp.f32,
         BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, alpha * sp.load(x + offs, mask=mask) + sp.load(y + offs, mask=mask), mask=mask)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_a_call_runs_under_disable_jit(interpret: bool) -> None:
    rng = np.random.default_rng(0)
    n = 150
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    f = jax.jit(lambda a, b: call(axpy, (3,), a, b, n=n, alpha=0.5, interpret=interpret,
                                  out_shapes=jax.ShapeDtypeStruct((n,), jnp.float32)))
    with jax.disable_jit():
        got = np.asarray(f(x, y), np.float64)
    want = 0.5 * x.astype(np.float64) + y
    np.testing.assert_allclose(got, want, rtol=0, atol=2**-22 * np.abs(want).max())


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_a_layer_and_its_gradient_run_under_disable_jit(interpret: bool) -> None:
    rng = np.random.default_rng(1)
    w = (rng.uniform(0.25, 1.0, (16, 64)) * rng.choice([-1, 1], (16, 64))).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    layer = SparseLinear.from_dense(w, "f16", bias=b, interpret=interpret)
    x = (rng.uniform(0.25, 1.0, (3, 64)) * rng.choice([-1, 1], (3, 64))).astype(np.float32)
    ct = rng.standard_normal((3, 16)).astype(np.float32)
    with jax.disable_jit():
        y = np.asarray(jax.jit(layer)(x), np.float64)
        dx = np.asarray(jax.grad(lambda x: (layer(x) * ct).sum())(x), np.float64)
    dense = layer.dense().astype(np.float64)
    want = x.astype(np.float16).astype(np.float64) @ dense.T + b  # (x rounded to the f16 operand)
    np.testing.assert_allclose(y, want, rtol=0, atol=64 * 2**-24 * np.abs(want).max())
    want_dx = ct.astype(np.float64) @ dense  # (straight-through: the rounding of x counts as the identity)
    np.testing.assert_allclose(dx, want_dx, rtol=0, atol=64 * 2**-24 * np.abs(want_dx).max())


@sp.jit
def root(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 64):
    offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
    mask = offs < n
    sp.store(out + offs, sp.sqrt(sp.load(x + offs, mask=mask)), mask=mask)


def _root(x: object, interpret: bool) -> object:
    return call(root, (1,), x, n=64, interpret=interpret, out_shapes=jax.ShapeDtypeStruct((64,), jnp.float32))


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_debug_nans_names_the_call(interpret: bool) -> None:
    """``jax_debug_nans``: a NaN a kernel writes is jax's FloatingPointError naming the call. jax
    re-runs a jitted function whose output has a NaN "de-optimized" (op by op), which ran the
    call's eager implementation, itself jitted and checked: it re-ran again, a RecursionError."""
    x = np.linspace(1.0, 4.0, 64).astype(np.float32)
    with jax.debug_nans(True):
        got = np.asarray(jax.jit(lambda x: _root(x, interpret) * 2)(x), np.float64)  # (no NaN: runs)
        np.testing.assert_allclose(got, 2 * np.sqrt(x.astype(np.float64)), rtol=2**-22)
        x[5] = -1.0
        # (jax 0.4.36 re-runs the jitted function with the checks off, so it names no primitive, its own
        # sqrt neither: the jitted call is then worded as jax words a jitted jnp.sqrt)
        with pytest.raises(FloatingPointError) as own:
            jax.jit(lambda x: jnp.sqrt(x) * 2)(x)
        names = str(own.value).startswith("invalid value (nan) encountered in sqrt")
        for run, jitted in ((jax.jit(lambda x: _root(x, interpret) * 2), True), (lambda x: _root(x, interpret), False)):
            with pytest.raises(FloatingPointError) as info:
                run(x)
            if names or not jitted:
                assert str(info.value).startswith("invalid value (nan) encountered in sparsile_call"), str(info.value)
            else:
                assert str(info.value) == str(own.value), str(info.value)


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "callback"])
def test_debug_nans_and_infs_name_an_eager_sparse_linear(interpret: bool) -> None:
    """An eager sparse_linear (SparseLinear) with ``jax_debug_nans`` / ``jax_debug_infs``: a NaN or
    an infinity in y is jax's FloatingPointError naming sparsile_call (the kernel call, as for
    sparsile.jax.call). jax runs the body of a jax.custom_batching.custom_vmap function (the layer's
    batching wrapper) with jax_debug_nans off, so the kernel call's own check saw no NaN and y came
    back with NaNs, silently (infinities it saw: jax_debug_infs stays on there)."""
    rng = np.random.default_rng(2)
    w = (rng.uniform(0.25, 1.0, (16, 64)) * rng.choice([-1, 1], (16, 64))).astype(np.float32)
    layer = SparseLinear.from_dense(w, "f16", bias=rng.standard_normal(16).astype(np.float32), interpret=interpret)
    x = (rng.uniform(0.25, 1.0, (3, 64)) * rng.choice([-1, 1], (3, 64))).astype(np.float32)
    with jax.debug_nans(True):
        got = np.asarray(layer(x), np.float64)  # (no NaN: runs, and equals the unchecked call)
        np.testing.assert_array_equal(got, np.asarray(jax.jit(layer)(x), np.float64))
        bad = x.copy()
        bad[1, 7] = np.nan
        with pytest.raises(FloatingPointError) as info:
            layer(bad)
        assert str(info.value) == "invalid value (nan) encountered in sparsile_call"
        with pytest.raises(FloatingPointError):  # (jitted: jax's own check of the jitted function's output)
            jax.jit(layer)(bad)
    with jax.debug_infs(True):
        with pytest.raises(FloatingPointError) as info:  # f16 overflows: |y| ~ 1e4 * 64 > 65504
            SparseLinear(layer.values, layer.meta, out_dtype="float16", interpret=interpret)(x * 1e4)
        assert str(info.value) == "invalid value (inf) encountered in sparsile_call"
    assert not np.isfinite(np.asarray(layer(bad))).all()  # (checks off: the NaN comes back)
