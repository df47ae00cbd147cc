"""Gradients through sparsile.jax.sparse_linear (integrations/jax/grad.py) on the CPU: the jnp weight
decoder against the host's decompress, dx and d bias against float64 for every activation, scales,
N-D x, jit and vmap, no tokens, and the refused gradients (the frozen weight, e4m3)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import JaxCallError, SparseLinear, sparse_linear  # noqa: E402
from sparsile.integrations.jax.grad import _deinterleave_rows, dense_weight  # noqa: E402
from sparsile.stdlib.sparsity import layouts  # noqa: E402


def _layer(n: int, k: int, dtype: str = "bf16", seed: int = 0) -> SparseLinear:
    rng = np.random.default_rng(seed)
    return SparseLinear.from_dense(rng.standard_normal((n, k)), dtype, bias=rng.standard_normal(n))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize(("n", "k"), [(40, 72), (64, 64), (130, 48), (17, 16)])
def test_dense_weight_is_the_host_decompress(dtype: str, n: int, k: int) -> None:
    """Every element, padding rows and chunks of the metadata included (N and K not multiples of
    the layout's 64 rows / 32 columns)."""
    layer = _layer(n, k, dtype, seed=n + k)
    got = np.asarray(jax.jit(dense_weight, static_argnums=2)(layer.values, layer.meta, k))
    assert got.dtype == np.float32 and got.shape == (n, k)
    np.testing.assert_array_equal(got, layer.dense().astype(np.float32)[:, :k])
    signed = jax.lax.bitcast_convert_type(layer.meta, jnp.int32)  # int32 words, as sparse_linear accepts
    np.testing.assert_array_equal(np.asarray(dense_weight(layer.values, signed, k)), got)


def test_dense_weight_is_one_computation_eagerly() -> None:
    """Called eagerly (as an un-jitted ``jax.grad`` through sparse_linear calls it), the decoder is
    one XLA compilation per new shape, not one per jnp operation (a dozen, ~0.4 s per shape on the
    CPU: most of an eager gradient's time). Counted with jax.monitoring's backend-compile events."""
    compiles: list[str] = []
    listening = [True]

    def listen(event: str, _secs: float, **_kw: object) -> None:
        if listening[0] and event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    layer = _layer(48, 88, "f16", seed=5)  # a shape no other test decodes
    values, meta = jnp.asarray(layer.values), jnp.asarray(layer.meta)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        got = dense_weight(values, meta, 88)
        counted = list(compiles)
    finally:
        listening[0] = False  # (jax 0.4.36 has no public unregister: there the listener stays, silent)
        unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
        if unregister is not None:
            unregister(listen)
    np.testing.assert_array_equal(np.asarray(got), layer.dense().astype(np.float32)[:, :88])
    assert len(counted) == 1, f"{len(counted)} XLA compilations for one eager decode"


def test_row_deinterleave_is_the_host_layouts() -> None:
    words = np.random.default_rng(3).integers(0, 2**32, (48, 6), dtype=np.uint32)
    np.testing.assert_array_equal(np.asarray(_deinterleave_rows(jnp.asarray(words))),
                                  layouts._deinterleave_rows(words))


def _dact(act: str | None, pre: np.ndarray) -> np.ndarray:
    if act is None:
        return np.ones_like(pre)
    if act == "relu":
        return (pre > 0).astype(np.float64)
    if act == "silu":
        s = 1 / (1 + np.exp(-pre))
        return s * (1 + pre * (1 - s))
    c, a = np.sqrt(2 / np.pi), 0.044715  # gelu_tanh
    t = np.tanh(c * (pre + a * pre**3))
    return 0.5 * (1 + t) + 0.5 * pre * (1 - t**2) * c * (1 + 3 * a * pre**2)


def check_grads(n: int, k: int, dtype: str, act: str | None, scaled: bool, lead: tuple[int, ...] = (2, 3)) -> None:
    """x (*lead, K) float32, y's cotangent random: dx = (g * act'(pre) * scales) @ W and d bias =
    sum(g * act'(pre)), pre from x rounded to the weight's type (the straight-through rounding).
    Bound: f32 sums over N and K terms of the products' magnitudes, and act' moved by pre's own f32
    error (|act''| <= 1.2 for these activations)."""
    rng = np.random.default_rng(7)
    t = int(np.prod(lead))
    layer = _layer(n, k, dtype)
    x = rng.uniform(-1, 1, (*lead, k)).astype(np.float32)
    g = rng.standard_normal((*lead, n)).astype(np.float32)
    sw = rng.uniform(0.5, 2.0, n).astype(np.float32) if scaled else None
    sx = rng.uniform(0.5, 2.0, lead).astype(np.float32) if scaled else None

    def loss(x: jax.Array, bias: jax.Array) -> jax.Array:
        y = sparse_linear(x, layer.values, layer.meta, bias, activation=act, scale_w=sw, scale_x=sx)
        return jnp.sum(y * g)

    dx, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, layer.bias)
    w = layer.dense().astype(np.float64)
    operand = jnp.bfloat16 if dtype == "bf16" else jnp.float16
    xq = np.asarray(jnp.asarray(x).astype(operand)).astype(np.float64).reshape(t, k)
    s = (np.ones((t, 1)) if sx is None else sx.reshape(t, 1).astype(np.float64)) * (1.0 if sw is None else sw)
    pre = (xq @ w.T) * s + np.asarray(layer.bias, np.float64)
    dpre = g.reshape(t, n) * _dact(act, pre)
    want_dx, want_db = (dpre * s) @ w, dpre.sum(axis=0)
    pre_err = k * 2.0**-23 * (np.abs(xq) @ np.abs(w.T)) * np.abs(s)
    slack = np.abs(g.reshape(t, n)) * (2.0**-22 + pre_err * 2)
    bound_dx = (n + k) * 2.0**-23 * (np.abs(dpre * s) @ np.abs(w)) + (slack * np.abs(s)) @ np.abs(w)
    assert dx.shape == x.shape and db.shape == (n,)
    assert (np.abs(np.asarray(dx, np.float64).reshape(t, k) - want_dx) <= bound_dx + 1e-30).all()
    bound_db = t * 2.0**-23 * np.abs(dpre).sum(axis=0) + slack.sum(axis=0)
    assert (np.abs(np.asarray(db, np.float64) - want_db) <= bound_db).all()
    assert np.abs(want_dx).max() > 0.1  # (not a zero gradient passing a loose test)


@pytest.mark.parametrize("act", [None, "relu", "silu", "gelu_tanh"])
@pytest.mark.parametrize("scaled", [False, True])
def test_dx_and_dbias_match_float64(act: str | None, scaled: bool) -> None:
    check_grads(48, 64, "bf16", act, scaled)


def test_dx_of_f16_weights_matches_float64() -> None:
    check_grads(40, 72, "f16", "silu", False, lead=(5,))


def test_vmap_of_grad_and_no_tokens() -> None:
    layer = _layer(32, 64)
    x = np.random.default_rng(1).uniform(-1, 1, (3, 4, 64)).astype(np.float32)

    def loss(x: jax.Array) -> jax.Array:
        return jnp.sum(layer(x) ** 2)

    per_member = jax.jit(jax.vmap(jax.grad(loss)))(x)
    whole = jax.grad(lambda x: jnp.sum(jax.vmap(loss)(x)))(x)
    one_by_one = np.stack([np.asarray(jax.grad(loss)(x[i])) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(per_member), one_by_one)
    np.testing.assert_array_equal(np.asarray(whole), one_by_one)
    empty = jax.grad(loss)(x[0, :0])
    assert empty.shape == (0, 64)


def _raises(fn, message: str) -> None:
    with pytest.raises(JaxCallError) as info:
        fn()
    assert info.value.code == "SP0934"
    assert info.value.message.startswith(message), info.value.message


def test_weight_gradients_are_refused_not_zero() -> None:
    """The weight is frozen: asking for its gradient raises (a zero would train nothing silently);
    the raw kernel call keeps SP0934 too."""
    layer = _layer(32, 64)
    x = np.random.default_rng(2).uniform(-1, 1, (2, 64)).astype(np.float32)
    sw = np.ones(32, np.float32)
    _raises(lambda: jax.grad(lambda v: sparse_linear(x, v, layer.meta).astype(jnp.float32).sum())(layer.values),
            "sparse_linear's weight is frozen: values has no gradient")
    _raises(lambda: jax.grad(lambda s: sparse_linear(x, layer.values, layer.meta, scale_w=s).sum())(sw),
            "sparse_linear's weight is frozen: scale_w has no gradient")
    _raises(lambda: jax.grad(lambda s: sparse_linear(x, layer.values, layer.meta, scale_x=s).sum())(2.0),
            "sparse_linear's weight is frozen: scale_x has no gradient")
    # with stop_gradient on the weight the same function is differentiable with respect to x
    dx = jax.grad(lambda x, v: sparse_linear(x, jax.lax.stop_gradient(v), layer.meta).sum())(x, layer.values)
    w = layer.dense().astype(np.float64)
    assert (np.abs(np.asarray(dx, np.float64) - w.sum(axis=0)) <= 32 * 2.0**-24 * np.abs(w).sum(axis=0)).all()


def test_e4m3_layers_are_refused() -> None:
    from sparsile.stdlib.kernels import prune_and_compress

    w = np.random.default_rng(4).uniform(-4, 4, (64, 128)).astype(np.float32)
    values, meta = prune_and_compress(w, "e4m3")
    layer = SparseLinear(jnp.asarray(values), jnp.asarray(meta.data.view(np.uint32)), scale_w=np.ones(64, np.float32))
    x = jnp.asarray(np.random.default_rng(5).uniform(-1, 1, (2, 128)), jnp.float8_e4m3fn)
    _raises(lambda: jax.grad(lambda x: layer(x).astype(jnp.float32).sum())(x),
            "sparse_linear with float8_e4m3fn weights cannot be differentiated")
