"""jax.vmap of sparsile.jax.sparse_linear at any depth (integrations/jax/linear.py's batching rule),
with any in_axes / out_axes, over x, a per-token or per-member scale_x and the bias, composed with
jax.grad both ways and with jax.jit: every result equals the unbatched calls stacked and a float64
reference. Batching the weight (values, meta, scale_w): test_jax_vmap_weight.py. Second derivatives
(jax.hessian) and the other input checks found in the same review."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear, sparse_linear  # noqa: E402

N, K = 24, 48  # N_out, K: small (the kernels run in the interpreter), K padded to no multiple of 64


def _layer(dtype: str = "bf16", seed: int = 0) -> SparseLinear:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.25, 1.0, (N, K)) * rng.choice([-1, 1], (N, K))
    return SparseLinear.from_dense(w, dtype, bias=rng.standard_normal(N).astype(np.float32))


def _rand(shape: tuple[int, ...], seed: int, low: float = 0.25) -> np.ndarray:
    """Random float32, never zero: magnitudes in [low, 1), random signs."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(low, 1.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def _silu(p: np.ndarray) -> np.ndarray:
    return p / (1 + np.exp(-p))


def _reference(layer: SparseLinear, x: np.ndarray, bias: np.ndarray | None, sx: np.ndarray | None,
               act: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(y, bound) of one unbatched call in float64: x rounded to the operand type (what the kernel
    multiplies), the f32 sums' error (K ulps of the magnitudes), the activation moving it at most
    by its slope (<= 1.1)."""
    operand = jnp.bfloat16 if layer.values.dtype == jnp.bfloat16 else jnp.float16
    xq = np.asarray(jnp.asarray(x).astype(operand)).astype(np.float64)
    w = layer.dense().astype(np.float64)
    s = 1.0 if sx is None else np.reshape(np.asarray(sx, np.float64), (*x.shape[:-1], 1))
    pre = (xq @ w.T) * s + (0.0 if bias is None else np.asarray(bias, np.float64))
    mag = (np.abs(xq) @ np.abs(w).T) * np.abs(s) + (0.0 if bias is None else np.abs(bias))
    bound = 1.1 * (2 * K * 2.0**-24 * mag + 2.0**-23 * np.abs(pre)) + 1e-30
    return (_silu(pre) if act == "silu" else pre), bound


def _close(y: jax.Array, want: np.ndarray, bound: np.ndarray) -> None:
    got = np.asarray(y, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert (np.abs(got - want) <= bound).all(), float((np.abs(got - want) / bound).max())


def _stack(f, *arrays: np.ndarray) -> np.ndarray:
    """f over the leading axis of every array, one call at a time, stacked."""
    return np.stack([np.asarray(f(*(a[i] for a in arrays))) for i in range(len(arrays[0]))])


# ------------------------------------------------------------------------------------------------
# nested vmap over x


def test_nested_vmap_over_x_any_axes() -> None:
    """vmap of vmap, of a function that vmaps itself, with in_axes / out_axes other than 0 (negative
    too), jitted or not: each equals the calls one by one, and float64."""
    layer = _layer()
    x = _rand((2, 3, 4, K), 1)  # (A, B, T, K)
    one = np.asarray(jax.jit(layer)(x[0, 0]))
    assert one.shape == (4, N)
    stacked = _stack(lambda xa: _stack(layer, xa), x)  # (A, B, T, N)
    want, bound = _reference(layer, x, layer.bias, None, None)
    cases = {
        "vmap(vmap)": (jax.vmap(jax.vmap(layer)), x, stacked),
        "vmap(f that vmaps)": (jax.vmap(lambda xa: jax.vmap(layer)(xa)), x, stacked),
        "vmap(vmap(vmap)) over T too": (jax.vmap(jax.vmap(jax.vmap(layer))), x, stacked),
        "in_axes=1 inside, 0 outside": (jax.vmap(jax.vmap(layer, in_axes=1)), np.swapaxes(x, 1, 2),
                                        stacked),
        "in_axes=2 / -2, out_axes=1 / -1": (jax.vmap(jax.vmap(layer, in_axes=-2, out_axes=-1), in_axes=2,
                                                     out_axes=1), np.transpose(x, (2, 1, 0, 3)),
                                            np.transpose(stacked, (2, 0, 3, 1))),
    }
    for name, (f, xs, out) in cases.items():
        for run in (f, jax.jit(f)):
            y = run(xs)
            np.testing.assert_array_equal(np.asarray(y), out, err_msg=name)
    _close(jax.jit(jax.vmap(jax.vmap(layer)))(x), want, bound)
    text = jax.jit(jax.vmap(jax.vmap(layer))).lower(x).as_text()
    assert text.count("sparsile_call") == 1  # both batches folded into the tokens: one launch


def test_nested_vmap_through_the_host_callback() -> None:
    layer = _layer("f16", seed=2)
    x = _rand((2, 2, 3, K), 3)
    f = jax.vmap(jax.vmap(lambda x: sparse_linear(x, layer.values, layer.meta, layer.bias, interpret=True)))
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), np.asarray(jax.jit(layer)(x)))


def test_nested_vmap_with_scale_x() -> None:
    """A per-token scale_x batched with x (also in the flattened (T,) form one call accepts for
    x's (T1, T2) tokens), one per member of the outer batch, or unbatched per-token over a batched x."""
    layer = _layer()
    x = _rand((2, 3, 2, 2, K), 4)  # (A, B, T1, T2, K)
    per_token = _rand((2, 3, 2, 2), 5, low=0.5)
    call = jax.jit(lambda x, s: layer(x, scale_x=s))

    # per token, batched at both levels, as (T1, T2) and flattened (T1 * T2,)
    for s in (per_token, per_token.reshape(2, 3, 4)):
        y = jax.jit(jax.vmap(jax.vmap(call)))(x, s)
        np.testing.assert_array_equal(np.asarray(y), _stack(lambda xa, sa: _stack(call, xa, sa), x, s))
        _close(y, *_reference(layer, x, layer.bias, per_token, None))
    # one scale per outer member, shared by its inner members' tokens
    outer = np.array([0.5, 3.0], np.float32)
    y = jax.vmap(lambda xa, s: jax.vmap(lambda xb: call(xb, s))(xa))(x, outer)
    np.testing.assert_array_equal(np.asarray(y), _stack(lambda xa, s: _stack(lambda xb: call(xb, s), xa), x, outer))
    _close(y, *_reference(layer, x, layer.bias, np.broadcast_to(outer[:, None, None, None], (2, 3, 2, 2)), None))
    # an unbatched per-token scale over a batched x (nested), and a batched scale over an unbatched x
    y = jax.vmap(jax.vmap(lambda xb: call(xb, per_token[0, 0])))(x)
    _close(y, *_reference(layer, x, layer.bias, np.broadcast_to(per_token[0, 0], (2, 3, 2, 2)), None))
    y = jax.vmap(jax.vmap(lambda s: call(x[0, 0], s)))(per_token)
    _close(y, *_reference(layer, np.broadcast_to(x[0, 0], x.shape), layer.bias, per_token, None))


def test_vmap_over_the_bias() -> None:
    """One bias per member (the kernel adds one bias vector to all its tokens: one launch per
    member), with x batched or not, nested, with an activation."""
    layer = _layer()
    x = _rand((2, 3, 4, K), 6)
    biases = _rand((2, 3, N), 7)
    call = jax.jit(lambda x, b: sparse_linear(x, layer.values, layer.meta, b, activation="silu"))
    y = jax.jit(jax.vmap(jax.vmap(call)))(x, biases)
    np.testing.assert_array_equal(np.asarray(y), _stack(lambda xa, ba: _stack(call, xa, ba), x, biases))
    want, bound = _reference(layer, x, biases[:, :, None, :], None, "silu")
    _close(y, want, bound)
    y = jax.vmap(jax.vmap(lambda b: call(x[0, 0], b)))(biases)
    np.testing.assert_array_equal(np.asarray(y), _stack(lambda ba: _stack(lambda b: call(x[0, 0], b), ba), biases))
    y = jax.vmap(lambda b, xa: jax.vmap(lambda xb: call(xb, b))(xa), in_axes=(0, 1), out_axes=1)(biases[0], x)
    np.testing.assert_array_equal(np.asarray(y), np.swapaxes(
        _stack(lambda b, xa: _stack(lambda xb: call(xb, b), xa), biases[0], np.swapaxes(x, 0, 1)), 0, 1))


# ------------------------------------------------------------------------------------------------
# with jax.grad


def _grad_reference(layer: SparseLinear, x: np.ndarray, bias: np.ndarray, g: np.ndarray) -> tuple:
    """(dx, its bound, dpre, its bound) of sum(silu(pre) * g), tokens on x's leading axes, in
    float64: dpre per token (d bias sums it over the tokens that share the bias, up to 16 terms).
    The bounds: f32 sums over N and K terms, and silu' moved by pre's own f32 error."""
    xq = np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).astype(np.float64)
    w = layer.dense().astype(np.float64)
    pre = xq @ w.T + bias
    s = 1 / (1 + np.exp(-pre))
    dpre = g * s * (1 + pre * (1 - s))
    pre_err = 2 * K * 2.0**-24 * (np.abs(xq) @ np.abs(w).T) + 2.0**-23 * np.abs(pre)
    slack = np.abs(g) * (2.0**-22 + 1.2 * pre_err)
    bound_dx = (N + K) * 2.0**-23 * (np.abs(dpre) @ np.abs(w)) + slack @ np.abs(w) + 1e-30
    return dpre @ w, bound_dx, dpre, slack + 16 * 2.0**-23 * np.abs(dpre) + 1e-30


def test_vmap_and_grad_compose_at_any_depth() -> None:
    """Per-member gradients with respect to x and the bias (each member its own bias): vmap(vmap(grad)),
    vmap(grad(vmap)), grad(vmap(vmap)) of the summed loss, as one member at a time (to a few f32 ulps:
    the rule's dense math in XLA) and float64."""
    layer = _layer()
    x = _rand((2, 2, 3, K), 10)  # (A, B, T, K)
    biases = _rand((2, 2, N), 11)
    g = _rand((2, 2, 3, N), 12)

    def loss(x: jax.Array, b: jax.Array, g: jax.Array) -> jax.Array:
        return jnp.sum(sparse_linear(x, layer.values, layer.meta, b, activation="silu") * g)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ones = [[grad(x[i, j], biases[i, j], g[i, j]) for j in range(2)] for i in range(2)]
    dx1, db1 = (np.stack([np.stack([np.asarray(d[w]) for d in row]) for row in ones]) for w in (0, 1))
    dx_ref, bdx, db_ref, bdb = _grad_reference(layer, x, biases[:, :, None, :], g)
    db_ref, bdb = db_ref.sum(axis=2), bdb.sum(axis=2)  # (the member's tokens)
    _close(jnp.asarray(dx1), dx_ref, bdx)
    _close(jnp.asarray(db1), db_ref, bdb)

    per_member = jax.jit(jax.vmap(jax.vmap(jax.grad(loss, argnums=(0, 1)))))(x, biases, g)
    inner_vmapped = jax.jit(jax.vmap(jax.grad(lambda x, b, g: jnp.sum(jax.vmap(loss)(x, b, g)), argnums=(0, 1))))(
        x, biases, g)
    whole = jax.jit(jax.grad(lambda x, b: jnp.sum(jax.vmap(jax.vmap(loss))(x, b, g)), argnums=(0, 1)))(x, biases)
    moved = jax.jit(jax.vmap(jax.vmap(jax.grad(loss, argnums=(0, 1)), in_axes=(1, 0, 1), out_axes=(1, 0))))(
        np.swapaxes(x, 1, 2), biases, np.swapaxes(g, 1, 2))
    for name, (dx, db) in {"vmap(vmap(grad))": per_member, "vmap(grad(vmap))": inner_vmapped,
                           "grad(vmap(vmap))": whole, "in/out axes": (np.swapaxes(moved[0], 1, 2), moved[1])}.items():
        # (the kernel's outputs are the same bits; XLA's dense GEMM and token sum of the rule, batched,
        # may round differently from one member's: a few f32 ulps)
        for got, one, want, bound in ((dx, dx1, dx_ref, bdx), (db, db1, db_ref, bdb)):
            _close(got, want, bound)
            np.testing.assert_allclose(np.asarray(got), one, rtol=2.0**-21, atol=2.0**-21 * np.abs(one).max(),
                                       err_msg=name)
    # one bias shared by every member: its gradient sums theirs
    shared = jax.jit(jax.grad(lambda b: jnp.sum(jax.vmap(jax.vmap(loss, in_axes=(0, None, 0)),
                                                         in_axes=(0, None, 0))(x, b, g))))(biases[0, 0])
    _close(shared, *(a.sum(axis=(0, 1, 2)) for a in _grad_reference(layer, x, biases[0, 0], g)[2:]))


def test_second_derivatives() -> None:
    """jax.hessian with respect to x (the JVP rule's own forward and pre-activation calls are
    differentiable again): it was SP0934 "a sparsile kernel call cannot be differentiated"."""
    layer = _layer()
    x = _rand((K,), 13)
    g = _rand((N,), 14)
    w = layer.dense().astype(np.float64)
    xq = np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).astype(np.float64)

    h = jax.jit(jax.hessian(lambda x: 0.5 * jnp.sum(sparse_linear(x, layer.values, layer.meta) ** 2)))(x)
    want = w.T @ w  # y is linear in x (the rounding to bf16 passes the gradient straight through)
    assert (np.abs(np.asarray(h, np.float64) - want) <= 2 * N * 2.0**-23 * (np.abs(w).T @ np.abs(w)) + 1e-30).all()

    h = jax.jit(jax.hessian(lambda x: jnp.sum(sparse_linear(x, layer.values, layer.meta, layer.bias,
                                                            activation="silu") * g)))(x)
    pre = xq @ w.T + np.asarray(layer.bias, np.float64)
    s = 1 / (1 + np.exp(-pre))
    d2 = s * (1 - s) * (2 + pre * (1 - 2 * s))  # silu''
    want = (w.T * (g * d2)) @ w
    scale = (np.abs(w.T) * np.abs(g)) @ np.abs(w)
    assert (np.abs(np.asarray(h, np.float64) - want) <= 1e-4 * scale).all()


# ------------------------------------------------------------------------------------------------
# found in the same review of the jax integration


def _error(fn) -> JaxCallError:
    from sparsile.stdlib.sparsity import SparsityError

    with pytest.raises(SparsityError) as info:
        fn()
    return info.value


def test_no_tokens_still_checks_the_scales() -> None:
    """An x with no tokens returned zeros before the scales were looked at: a scale_x or scale_w of
    the wrong shape passed (and failed once the same program saw a token)."""
    layer = _layer()
    v, m = layer.values, layer.meta
    e = _error(lambda: sparse_linear(np.zeros((0, K), np.float32), v, m, scale_x=np.ones(5, np.float32)))
    assert (e.code, e.message.split(" (at ")[0]) == ("SP0938", "scale_x must be a number or of shape (0,), got "
                                                               "shape (5,)")
    e = _error(lambda: sparse_linear(np.zeros((2, 0, K), np.float32), v, m, scale_w=np.ones(3, np.float32)))
    assert (e.code, e.message.split(" (at ")[0]) == ("SP0938", f"scale_w must be a number or of shape ({N},), "
                                                               "got shape (3,)")
    y = jax.jit(lambda x: sparse_linear(x, v, m, scale_x=jnp.ones(x.shape[:-1])))(np.zeros((2, 0, K), np.float32))
    assert y.shape == (2, 0, N)


def test_static_options_traced_by_jit() -> None:
    """split_k and interpret are static: traced by jax.jit (not named in static_argnames) they were
    "split_k must be an integer from 1 to 64, got JitTracer(~int32[])"; now SP0932 says to mark them
    static. A numpy integer split_k (np.int64(2), from a config array) was refused as no integer."""
    layer = _layer()
    x = _rand((3, K), 15)
    v, m = layer.values, layer.meta
    for name, value in (("split_k", 2), ("interpret", True)):
        e = _error(lambda name=name, value=value: jax.jit(sparse_linear)(x, v, m, **{name: value}))
        assert e.code == "SP0932" and e.message.startswith(f"{name} of sparse_linear is static, but got a traced "
                                                           "value"), e.message
        assert f"static_argnames=('{name}',)" in e.help, e.help
    jitted = jax.jit(sparse_linear, static_argnames=("activation", "split_k", "interpret"))
    want = np.asarray(sparse_linear(x, v, m, layer.bias, split_k=2))
    np.testing.assert_array_equal(np.asarray(jitted(x, v, m, layer.bias, split_k=np.int64(2))), want)
    np.testing.assert_array_equal(np.asarray(jitted(x, v, m, layer.bias, split_k=2, interpret=True)), want)


def test_float64_x_gives_float32_y() -> None:
    """With jax_enable_x64 a float64 x gave a bfloat16 y (the default for x of no output type),
    while the same numpy x without x64 is float32 and gave float32: float64 x now gives float32,
    the kernels' widest output."""
    layer = _layer()
    x = _rand((3, K), 16).astype(np.float64)
    if hasattr(jax, "enable_x64"):
        enable_x64 = jax.enable_x64
    else:  # jax 0.5.3 and before (docs/jax.md, "Install") have only the experimental one
        from jax.experimental import enable_x64
    with enable_x64(True):
        y = jax.jit(layer)(x)
        dx = jax.grad(lambda x: jnp.sum(layer(x)))(x)
    assert y.dtype == jnp.float32 and dx.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jax.jit(layer)(x.astype(np.float32))))
    _close(y, *_reference(layer, x, layer.bias, None, None))


def test_out_dtype_refused_by_its_name() -> None:
    """out_dtype=np.float64 (a type, not a name) was refused as "sparse_linear has no <class
    'numpy.float64'> output"; the message names the type as a dtype name, as for "int8"."""
    layer = _layer()
    for out_dtype in (np.float64, jnp.int8, "int8"):
        e = _error(lambda out_dtype=out_dtype: sparse_linear(_rand((2, K), 17), layer.values, layer.meta,
                                                             out_dtype=out_dtype))
        name = np.dtype(out_dtype).name
        assert (e.code, e.message) == ("SP0850", f"sparse_linear has no {name} output"), e.message
