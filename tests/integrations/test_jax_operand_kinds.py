"""Operands of ``sparse_linear`` / ``SparseLinear`` that JAX cannot take as values (another library's
tensor, a ``jax.ShapeDtypeStruct``, a memoryview, a string for an array): SP0938 while tracing,
naming the operand and its type, where they failed inside jax's ``custom_jvp`` ("Error interpreting
argument to custom_jvp_call as a JAX value") or as numpy's TypeError of a torch dtype."""

from __future__ import annotations

import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear, sparse_linear  # noqa: E402


def _layer() -> SparseLinear:
    rng = np.random.default_rng(0)
    w = (rng.uniform(0.25, 1.0, (16, 64)) * rng.choice([-1, 1], (16, 64))).astype(np.float32)
    return SparseLinear.from_dense(w, "bf16")


class _Foreign:
    """An array-like of another library: shape and dtype, no jax type."""

    shape, dtype = (2, 64), "float32"


def _expect(call: object, message: str, help: str) -> None:
    line = sys._getframe(1).f_lineno
    with pytest.raises(JaxCallError) as info:
        call()  # type: ignore[operator]
    e = info.value
    assert (e.code, e.message, e.help) == ("SP0938", f"{message} (at test_jax_operand_kinds.py:{line})", help)


HELP = "convert it first: jax.numpy.asarray(value)"


def test_foreign_operands_are_sp0938() -> None:
    layer = _layer()
    v, m = layer.values, layer.meta
    x = jnp.ones((2, 64), jnp.float32)
    name = f"{__name__}._Foreign"
    _expect(lambda: sparse_linear(_Foreign(), v, m), f"x must be a jax or numpy array, got {name}", HELP)
    _expect(lambda: sparse_linear(x, v, m, _Foreign()), f"bias must be a number or a jax or numpy array, got {name}",
            HELP)
    _expect(lambda: sparse_linear(x, v, m, scale_w=_Foreign()),
            f"scale_w must be a number or a jax or numpy array, got {name}", HELP)
    _expect(lambda: sparse_linear(x, v, m, scale_x=_Foreign()),
            f"scale_x must be a number or a jax or numpy array, got {name}", HELP)
    _expect(lambda: sparse_linear(x, v, memoryview(np.asarray(m))), "meta must be a jax or numpy array, got "
            "builtins.memoryview", HELP)
    _expect(lambda: sparse_linear("x", v, m), "x must be a jax or numpy array, got builtins.str", HELP)
    _expect(lambda: SparseLinear(_Foreign(), m)(x), f"values must be a jax or numpy array, got {name}", HELP)
    _expect(lambda: jax.jit(lambda x: sparse_linear(x, v, m, _Foreign()))(x),
            f"bias must be a number or a jax or numpy array, got {name}", HELP)


def test_a_shape_struct_operand_is_sp0938() -> None:
    layer = _layer()
    struct = jax.ShapeDtypeStruct((2, 64), jnp.float32)
    _expect(lambda: layer(struct), "x got a jax.ShapeDtypeStruct, which describes an array but holds no data",
            "pass a jax or numpy array; jax.eval_shape(f, struct) gives the result's shape and dtype without "
            "running it")
    # (jax.eval_shape itself takes structs: the layer's result, not run)
    out = jax.eval_shape(layer, struct)
    assert (out.shape, out.dtype) == ((2, 16), jnp.float32)


def test_torch_tensors_are_sp0938() -> None:
    torch = pytest.importorskip("torch")
    layer = _layer()
    x = jnp.ones((2, 64), jnp.float32)
    _expect(lambda: layer(torch.ones(2, 64)), "x must be a jax or numpy array, got torch.Tensor", HELP)
    _expect(lambda: sparse_linear(x, layer.values, layer.meta, torch.ones(16)),
            "bias must be a number or a jax or numpy array, got torch.Tensor", HELP)
    _expect(lambda: sparse_linear(x, layer.values, layer.meta, scale_w=torch.tensor(2.0)),
            "scale_w must be a number or a jax or numpy array, got torch.Tensor", HELP)


FROM_DENSE_HELP = ("make the layer once, outside the transformed function, from a concrete weight, and pass it in "
                   "as an argument (it is a pytree); gradients flow to x and the bias, not to the frozen weight")


@pytest.mark.parametrize("transform", ["jit", "grad", "vmap"])
def test_from_dense_of_a_traced_weight_is_sp0932(transform: str) -> None:
    """``SparseLinear.from_dense`` prunes and compresses on the host: a weight traced by jax.jit,
    jax.grad or jax.vmap failed inside it as jax's TracerArrayConversionError."""
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((16, 64)), jnp.float32)
    x = jnp.ones((2, 64), jnp.float32)

    def f(w: object) -> object:
        return SparseLinear.from_dense(w, "bf16")(x).sum()

    run = {"jit": jax.jit(f), "grad": jax.grad(f), "vmap": jax.vmap(f)}[transform]
    line = f.__code__.co_firstlineno + 1
    with pytest.raises(JaxCallError) as info:
        run(jnp.stack([w, w]) if transform == "vmap" else w)
    e = info.value
    assert (e.code, e.message, e.help) == (
        "SP0932", "SparseLinear.from_dense prunes and compresses the weight on the host, but got a traced weight "
                  f"(at test_jax_operand_kinds.py:{line})", FROM_DENSE_HELP)


def test_dense_of_a_traced_layer_is_sp0932() -> None:
    """``SparseLinear.dense()`` decodes the weight on the host: inside jax.jit (the layer a jitted
    function's argument) it failed as jax's TracerArrayConversionError."""
    layer = _layer()
    want = layer.dense()

    def f(layer: SparseLinear) -> object:
        return layer.dense()

    line = f.__code__.co_firstlineno + 1
    with pytest.raises(JaxCallError) as info:
        jax.jit(f)(layer)
    e = info.value
    assert (e.code, e.message, e.help) == (
        "SP0932", f"SparseLinear.dense() decodes the weight on the host, but the layer's values or meta are traced "
                  f"(at test_jax_operand_kinds.py:{line})",
        "call it outside the transformed function (on a concrete layer), or decode on the device with "
        "sparsile.integrations.jax.grad.dense_weight(values, meta, in_features)")
    assert np.array_equal(f(layer), want)  # (concrete: the host's decode, as before)
