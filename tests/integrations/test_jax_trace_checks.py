"""sparsile.jax checks that belong to trace time: what a traced program cannot run is refused while
jax traces it, with a sparsile diagnostic (code, message, the user's line), not at run time inside
XLA (SP0936) or as an exception from jax's internals; and the SP0934 help names an idiom that works."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import sparsile as sp  # noqa: E402
from sparsile.integrations.jax import JaxCallError, SparseLinear, call, sparse_linear  # noqa: E402
from sparsile.tests.integrations.test_jax_call import scale_add  # noqa: E402

N = 300
OUT = jax.ShapeDtypeStruct((N,), jnp.float32)


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return (rng.uniform(0.5, 2.0, N) * rng.choice([-1, 1], N)).astype(np.float32), \
        (rng.uniform(0.5, 2.0, N) * rng.choice([-1, 1], N)).astype(np.float32)


def _scale_add(a: jax.Array, b: jax.Array, alpha: float = 1.5) -> jax.Array:
    return call(scale_add, (-(-N // 128),), a, b, out_shapes=OUT, n=N, alpha=alpha)


def _close(got: jax.Array, x: np.ndarray, y: np.ndarray, alpha: float) -> bool:
    """alpha * x + y against float64: two f32 roundings (the product, the sum) of at most half an
    ulp of |alpha x| + |y| each."""
    want = alpha * x.astype(np.float64) + y.astype(np.float64)
    bound = 2.0**-23 * (np.abs(alpha * x.astype(np.float64)) + np.abs(y.astype(np.float64)))
    return bool((np.abs(np.asarray(got, np.float64) - want) <= bound).all())


def _located(err: Exception, code: str, message: str) -> None:
    assert getattr(err, "code", None) == code, err
    assert err.message.startswith(message), err.message
    assert "(at test_jax_trace_checks.py:" in err.message, err.message


# -- a float scalar that overflows its parameter type: SP0709 while tracing ---------------------------

def test_an_overflowing_float_scalar_is_refused_while_tracing() -> None:
    x, y = _inputs()
    # a first trace with an ordinary alpha: the kernel's specialization for a float alpha is then
    # memoized, and the range check that specialization made must still run for every later value
    assert _close(jax.jit(lambda a, b: _scale_add(a, b, alpha=1.5))(x, y), x, y, 1.5)
    lowered = []
    with pytest.raises(sp.LaunchError) as info:  # lowering alone runs nothing: the check is at trace time
        lowered.append(jax.jit(lambda a, b: _scale_add(a, b, alpha=1e40)).lower(x, y))
    assert not lowered
    assert info.value.code == "SP0709"
    assert info.value.message == "argument `alpha` = 1e+40 overflows f32", info.value.message
    assert "SP0936" not in str(info.value)
    # eagerly too: the error is the launch check itself, not the XLA runtime error wrapping it
    with pytest.raises(sp.LaunchError) as eager:
        _scale_add(x, y, alpha=-2.0**200)
    assert eager.value.code == "SP0709" and "SP0936" not in str(eager.value)
    # the largest finite f32, infinities and NaN pass as they do on every launch path, and are run
    big = float(np.finfo(np.float32).max)
    half = np.full(N, 0.5, np.float32)
    assert _close(jax.jit(lambda a, b: _scale_add(a, b, alpha=big))(half, -y), half, -y, big)
    assert np.isinf(np.asarray(_scale_add(x, y, alpha=float("inf")))).all()


# -- symbolic (shape-polymorphic) dimensions: SP0932 while tracing --------------------------------------

with contextlib.suppress(ImportError):  # (jax 0.4.36 imports jax.export only when asked, and it needs absl-py,
    importlib.import_module("jax.export")  # which that jax does not install)
_NO_CHECK = [jax.export.DisabledSafetyCheck.custom_call("sparsile_call")] if hasattr(jax, "export") else []


@pytest.mark.skipif(not hasattr(jax, "export"), reason="no jax.export (jax 0.4.36 without absl-py)")
def test_a_symbolic_dimension_of_a_call_is_sp0932() -> None:
    n = jax.export.symbolic_shape("n")
    struct = jax.ShapeDtypeStruct(n, jnp.float32)
    fn = jax.jit(lambda a, b: call(scale_add, (3,), a, b, n=N, alpha=1.0,
                                   out_shapes=jax.ShapeDtypeStruct(a.shape, a.dtype)))
    with pytest.raises(JaxCallError) as info:
        jax.export.export(fn, disabled_checks=_NO_CHECK)(struct, struct)
    _located(info.value, "SP0932", "`x` has the symbolic shape (n,)")
    assert "concrete shapes" in info.value.help
    # an output of symbolic shape (the inputs concrete) is refused the same way
    x, y = _inputs()
    out = jax.jit(lambda s: call(scale_add, (3,), x, y, n=N, alpha=1.0,
                                 out_shapes={"out": jax.ShapeDtypeStruct(s.shape, s.dtype)}))
    with pytest.raises(JaxCallError) as out_info:
        jax.export.export(out, disabled_checks=_NO_CHECK)(struct)
    _located(out_info.value, "SP0932", "`out` has the symbolic shape (n,)")
    # with concrete shapes the exported program runs (in this process, which traced its plan)
    fixed = jax.ShapeDtypeStruct((N,), jnp.float32)
    exported = jax.export.export(fn, disabled_checks=_NO_CHECK)(fixed, fixed)
    assert _close(exported.call(x, y), x, y, 1.0)


def _layer() -> SparseLinear:
    rng = np.random.default_rng(3)
    w = rng.uniform(0.25, 1.0, (32, 64)) * rng.choice([-1, 1], (32, 64))
    return SparseLinear.from_dense(w, "bf16", bias=rng.standard_normal(32))


@pytest.mark.skipif(not hasattr(jax, "export"), reason="no jax.export (jax 0.4.36 without absl-py)")
@pytest.mark.parametrize("where", ["tokens", "features"])
def test_a_symbolic_dimension_of_sparse_linear_is_sp0932(where: str) -> None:
    layer = _layer()
    (d,) = jax.export.symbolic_shape("d")
    shape = (d, 64) if where == "tokens" else (4, d)
    for fn in (jax.jit(layer), jax.jit(lambda x: sparse_linear(x, layer.values, layer.meta, layer.bias))):
        with pytest.raises(JaxCallError) as info:
            jax.export.export(fn, disabled_checks=_NO_CHECK)(jax.ShapeDtypeStruct(shape, jnp.float32))
        _located(info.value, "SP0932", f"`x` has the symbolic shape {shape}".replace("'", ""))
    rng = np.random.default_rng(4)
    x = (rng.uniform(0.25, 1.0, (4, 64)) * rng.choice([-1, 1], (4, 64))).astype(np.float32)
    exported = jax.export.export(jax.jit(layer), disabled_checks=_NO_CHECK)(jax.ShapeDtypeStruct((4, 64), jnp.float32))
    xq = np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).astype(np.float64)
    ref = xq @ layer.dense().astype(np.float64).T + np.asarray(layer.bias, np.float64)
    got = np.asarray(exported.call(x), np.float64)
    mag = np.abs(xq) @ np.abs(layer.dense().astype(np.float64)).T
    assert (np.abs(got - ref) <= 64 * 2.0**-24 * mag + 2.0**-24 * (1 + np.abs(ref))).all()


# -- SP0934's help: the idiom it names works -----------------------------------------------------------

def test_the_sp0934_help_names_an_idiom_that_works() -> None:
    x, y = _inputs()
    # a stop_gradient of the call's result does not keep jax from differentiating the call itself
    with pytest.raises(JaxCallError) as info:
        jax.grad(lambda a: (a * jax.lax.stop_gradient(_scale_add(a, y))).sum())(x)
    _located(info.value, "SP0934", "a sparsile kernel call cannot be differentiated")
    help = info.value.help
    assert "stop_gradient" in help and "inputs" in help and "result" in help, help
    # what the help says: stop the gradient at the call's array inputs; d/da sum(a * (1.5 a + y)) with
    # the call's output constant is that output
    assert _close(jax.grad(lambda a: (a * _scale_add(jax.lax.stop_gradient(a), y)).sum())(x), x, y, 1.5)
