"""jax.vmap of sparsile.jax.sparse_linear over the weight (values, meta, scale_w: a stack of layers,
as the experts of a mixture or the layers of a stack): integrations/jax/linear.py's batching rule
runs one kernel call per member. Each member's result equals its layer called alone (bit for bit:
the same kernel, plan and tokens) and a float64 reference, with x batched or shared, any in_axes /
out_axes, nested, under jax.jit, the host callback, jax.grad (x and bias) and jax.lax.scan, and for
every mix of batched weight parts (values without meta, meta without values, scale_w alone). These
were SP0935 before."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import SparseLinear, sparse_linear  # noqa: E402

N, K = 24, 48  # N_out, K: small (the kernels run in the interpreter), K padded to no multiple of 64
MEMBERS = 3


def _rand(shape: tuple[int, ...], seed: int, low: float = 0.25) -> np.ndarray:
    """Random float32, never zero: magnitudes in [low, 1), random signs."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(low, 1.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def _layers(count: int = MEMBERS, seed: int = 0, n: int = N, k: int = K, dtype: str = "bf16",
            **options) -> list[SparseLinear]:
    """``count`` different layers (weights, biases and per-feature scale_w all differ)."""
    out = []
    for i in range(count):
        layer = SparseLinear.from_dense(_rand((n, k), seed + 10 * i), dtype, bias=_rand((n,), seed + 10 * i + 1),
                                        **options)
        out.append(SparseLinear(layer.values, layer.meta, layer.bias, jnp.asarray(_rand((n,), seed + 10 * i + 2,
                                                                                        low=0.5)),
                                **options, in_features=layer.in_features))
    return out


def _stacked(layers: list[SparseLinear]) -> SparseLinear:
    return jax.tree_util.tree_map(lambda *a: jnp.stack(a), *layers)


def _silu(p: np.ndarray) -> np.ndarray:
    return p / (1 + np.exp(-p))


def _reference(values, meta, bias, scale_w, x: np.ndarray, act: str | None = None,
               scale_x=None) -> tuple[np.ndarray, np.ndarray]:
    """(y, bound) of one member in float64: its weight decoded on the host, x rounded to the operand
    type (what the kernel multiplies), the f32 sums' error (K ulps of the magnitudes, the scale's and
    the bias's roundings), the activation moving it at most by its slope (<= 1.1)."""
    w = SparseLinear(jnp.asarray(values), jnp.asarray(meta)).dense().astype(np.float64)[:, :x.shape[-1]]
    xq = np.asarray(jnp.asarray(x).astype(jnp.asarray(values).dtype)).astype(np.float64)
    sw = 1.0 if scale_w is None else np.asarray(scale_w, np.float64)
    if scale_x is not None:  # one per token
        sw = sw * np.asarray(scale_x, np.float64)[..., None]
    b = 0.0 if bias is None else np.asarray(bias, np.float64)
    pre = (xq @ w.T) * sw + b
    mag = (np.abs(xq) @ np.abs(w).T) * np.abs(sw) + np.abs(b)
    bound = 1.1 * (2 * x.shape[-1] * 2.0**-24 * mag + 2.0**-22 * np.abs(pre)) + 1e-30
    return (_silu(pre) if act == "silu" else pre), bound


def _close(y, want: np.ndarray, bound: np.ndarray, name: str = "") -> None:
    got = np.asarray(y, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert (np.abs(got - want) <= bound).all(), (name, float((np.abs(got - want) / bound).max()))


def _check_members(y, layers: list[SparseLinear], xs: list[np.ndarray], name: str) -> None:
    """Member i of y is layers[i](xs[i]) bit for bit and its float64 reference."""
    assert y.shape[0] == len(layers), (name, y.shape)
    for i, (layer, x) in enumerate(zip(layers, xs)):
        alone = np.asarray(jax.jit(layer)(x))
        np.testing.assert_array_equal(np.asarray(y[i]), alone, err_msg=f"{name}: member {i}")
        _close(y[i], *_reference(layer.values, layer.meta, layer.bias, layer.scale_w, x, layer.activation),
               f"{name}: member {i}")


# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("interpret", [False, True], ids=["ffi", "host_callback"])
def test_vmap_over_a_stack_of_layers(interpret: bool) -> None:
    """A stack of SparseLinear layers (with an activation), x batched with them or shared, jitted or
    not: one call per member, each equal to the layer alone and float64."""
    layers = _layers(activation="silu", interpret=interpret)
    stack = _stacked(layers)
    x = _rand((MEMBERS, 2, 3, K), 100)
    run = jax.vmap(lambda layer, x: layer(x))
    for name, f in (("vmap", run), ("jit(vmap)", jax.jit(run))):
        _check_members(f(stack, x), layers, list(x), f"{name}, x batched")
    shared = jax.jit(jax.vmap(lambda layer: layer(x[0])))(stack)
    _check_members(shared, layers, [x[0]] * MEMBERS, "x shared")


def test_any_axes_and_nesting() -> None:
    """in_axes / out_axes other than 0, vmap over the layers of a vmap over x (and the other way
    round), and a 2 x 2 grid of layers under a nested vmap."""
    layers = _layers()
    stack = _stacked(layers)
    x = _rand((MEMBERS, 2, 4, K), 101)  # (member, B, T, K)
    per_member = [x[i] for i in range(MEMBERS)]

    def fn(v, e, b, sw, x):
        return sparse_linear(x, v, e, b, scale_w=sw)

    moved = (jnp.moveaxis(stack.values, 0, 1), jnp.moveaxis(stack.meta, 0, -1), stack.bias, stack.scale_w,
             np.moveaxis(x, 0, 2))
    y = jax.jit(jax.vmap(fn, in_axes=(1, -1, 0, 0, 2), out_axes=-2))(*moved)  # (B, T, member, N)
    _check_members(jnp.moveaxis(y, -2, 0), layers, per_member, "in_axes / out_axes")

    # the layers outside, x's B inside (folded into the tokens, then one call per layer)
    outer = jax.jit(jax.vmap(lambda layer, xa: jax.vmap(layer)(xa)))(stack, x)
    _check_members(outer, layers, per_member, "vmap(layers) of vmap(x)")
    # x's B outside, the layers inside: (B, member, T, N)
    inner = jax.jit(jax.vmap(lambda xb: jax.vmap(lambda layer, xm: layer(xm))(stack, xb), in_axes=1))(x)
    _check_members(jnp.swapaxes(inner, 0, 1), layers, per_member, "vmap(x) of vmap(layers)")

    grid = _layers(4, seed=50)
    stack2 = jax.tree_util.tree_map(lambda a: a.reshape(2, 2, *a.shape[1:]), _stacked(grid))
    x2 = _rand((2, 2, 3, K), 102)
    y2 = jax.jit(jax.vmap(jax.vmap(lambda layer, x: layer(x))))(stack2, x2)
    _check_members(y2.reshape(4, 3, N), grid, list(x2.reshape(4, 3, K)), "2 x 2 grid")
    y3 = jax.vmap(jax.vmap(lambda layer: layer(x2[0, 0])))(stack2)
    _check_members(y3.reshape(4, 3, N), grid, [x2[0, 0]] * 4, "2 x 2 grid, x shared")


def test_mixed_batching() -> None:
    """Every part of the weight batched on its own is well defined: values with one shared meta (the
    same kept positions, other numbers), meta with shared values (other kept positions), scale_w
    alone, scale_w with the bias; with x batched or shared and a per-token scale_x."""
    base = _layers(1, seed=200)[0]
    x = _rand((MEMBERS, 5, K), 201)
    sx = _rand((MEMBERS, 5), 202, low=0.5)
    factors = _rand((MEMBERS, 1, 1), 203, low=0.5)
    values = (base.values.astype(jnp.float32)[None] * factors).astype(base.values.dtype)  # (member, N, K/2)
    metas = jnp.stack([layer.meta for layer in _layers(MEMBERS, seed=210)])
    scales = jnp.asarray(_rand((MEMBERS, N), 204, low=0.5))
    biases = jnp.asarray(_rand((MEMBERS, N), 205))
    cases = {  # name: (in_axes of (x, values, meta, bias, scale_x, scale_w), the member's operands)
        "values": ((0, 0, None, None, None, None), lambda i: (x[i], values[i], base.meta, base.bias, None, None)),
        "values, x shared": ((None, 0, None, None, None, None),
                             lambda i: (x[0], values[i], base.meta, base.bias, None, None)),
        "meta": ((0, None, 0, None, 0, None), lambda i: (x[i], base.values, metas[i], base.bias, sx[i], None)),
        "scale_w": ((0, None, None, None, None, 0), lambda i: (x[i], base.values, base.meta, None, None, scales[i])),
        "scale_w and bias, x shared": ((None, None, None, 0, None, 0),
                                       lambda i: (x[0], base.values, base.meta, biases[i], None, scales[i])),
    }
    full = (x, values, metas, biases, sx, scales)
    for name, (axes, member) in cases.items():
        args = [full[j] if a == 0 else member(0)[j] for j, a in enumerate(axes)]

        def fn(x, v, e, b, s, sw):
            return sparse_linear(x, v, e, b, scale_x=s, scale_w=sw)

        y = jax.jit(jax.vmap(fn, in_axes=axes))(*args)
        for i in range(MEMBERS):
            xi, vi, ei, bi, si, swi = member(i)
            alone = np.asarray(jax.jit(fn)(xi, vi, ei, bi, si, swi))
            np.testing.assert_array_equal(np.asarray(y[i]), alone, err_msg=f"{name}: member {i}")
            want, bound = _reference(vi, ei, bi, swi, xi, scale_x=si)
            _close(y[i], want, bound, f"{name}: member {i}")
        # the batched weight parts really differ per member (the test would not see a shared one)
        assert not np.array_equal(np.asarray(y[0]), np.asarray(y[1])), name


def test_grad_with_batched_weights() -> None:
    """jax.grad with respect to x and the biases through a vmap over a stack of layers: each member's
    gradients equal its own layer's (a few f32 ulps: XLA's batched dense GEMM of the rule may round
    otherwise) and float64 (no activation: d pre = g, dx = (g * scale_w) @ W, d bias = sum of g)."""
    layers = _layers(seed=300)
    stack = _stacked(layers)
    x = _rand((MEMBERS, 4, K), 301)
    g = _rand((MEMBERS, 4, N), 302)

    def loss(x, bias, g):
        return jnp.sum(jax.vmap(lambda layer, b, x: sparse_linear(x, layer.values, layer.meta, b,
                                                                   scale_w=layer.scale_w))(stack, bias, x) * g)

    dx, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, stack.bias, g)
    for i, layer in enumerate(layers):
        def alone_loss(x, b, layer=layer, g=g[i]):
            return jnp.sum(sparse_linear(x, layer.values, layer.meta, b, scale_w=layer.scale_w) * g)

        one = jax.grad(alone_loss, argnums=(0, 1))(x[i], layer.bias)
        for got, alone in ((dx[i], one[0]), (db[i], one[1])):
            np.testing.assert_allclose(np.asarray(got), np.asarray(alone), rtol=2.0**-21,
                                       atol=2.0**-21 * float(np.abs(alone).max()))
        w = layer.dense().astype(np.float64)
        gs = g[i].astype(np.float64) * np.asarray(layer.scale_w, np.float64)
        _close(dx[i], gs @ w, (N + 2) * 2.0**-23 * (np.abs(gs) @ np.abs(w)) + 1e-30, f"dx {i}")
        _close(db[i], g[i].astype(np.float64).sum(0), 4 * 2.0**-23 * np.abs(g[i]).sum(0) + 1e-30, f"d bias {i}")


def test_experts_under_scan() -> None:
    """The typical use: a stack of layers under jax.lax.scan, each a stack of experts under jax.vmap
    (every expert sees its own activations): equal to the loops written out, and float64 per step."""
    steps, experts, width = 2, 2, 32
    grid = _layers(steps * experts, seed=400, n=width, k=width)
    stack = jax.tree_util.tree_map(lambda a: a.reshape(steps, experts, *a.shape[1:]), _stacked(grid))
    x = _rand((experts, 3, width), 401)

    def step(h, layer):
        y = jax.vmap(lambda expert, h: expert(h))(layer, h)
        return y, y

    out, trail = jax.jit(lambda x: jax.lax.scan(step, x, stack))(x)
    h = x
    for s in range(steps):
        members = grid[s * experts:(s + 1) * experts]
        _check_members(trail[s], members, list(h), f"step {s}")
        h = np.stack([np.asarray(jax.jit(m)(hi)) for m, hi in zip(members, h)])
    np.testing.assert_array_equal(np.asarray(out), h)


def test_cond_with_a_batched_predicate_runs_per_member() -> None:
    """jax.vmap of a jax.lax.cond whose predicate is batched batches every operand of its branches,
    the layers' weights too (this was SP0935): each member gets its branch's layer; jnp.where of
    both layers gives the same."""
    a, b = _layers(2, seed=500)
    x = _rand((4, 3, K), 501)
    pred = jnp.asarray([True, False, True, False])
    want = np.stack([np.asarray((a if bool(pred[i]) else b)(x[i])) for i in range(4)])
    got = jax.jit(jax.vmap(lambda p, xi: jax.lax.cond(p, a, b, xi)))(pred, x)
    np.testing.assert_array_equal(np.asarray(got), want)
    where = jax.jit(jax.vmap(lambda p, xi: jnp.where(p, a(xi), b(xi))))(pred, x)
    np.testing.assert_array_equal(np.asarray(where), want)
