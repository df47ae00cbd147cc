"""Property tests (hypothesis) of ``sparsile.jax.sparse_linear`` / ``SparseLinear`` on the CPU (the
Hopper kernels in the interpreter, through the FFI handler or a host callback) against float64.

Drawn: the weight type (f16, bf16, e4m3 with its scale_w; metadata words uint32 or int32), ragged
shapes (N_out and K not multiples of 16 or 64), x's leading shape (1-D x, T = 0 and 1, N-D, an
empty middle axis), x's type (the weight's, another 16-bit type, f32, f64 as numpy (float32 to jax
without x64), e4m3 and e5m2 for 16-bit weights, e4m3 with scale_x for e4m3 weights), numpy or jax
arrays, bias (absent, f32, f16, bf16, f64, int32), scale_w and scale_x as Python numbers, weak-typed
jax scalars, one-element arrays, one per output feature / token in every shape the API takes, the
activation, out_dtype (a name, a jnp type, a numpy type), split_k, ``interpret=True``, and the call
itself: eager, under ``jax.jit`` (the layer an argument or a closure).

Transforms: ``jax.vmap`` one or two deep with in_axes / out_axes on any token axis (x and a
per-token or per-member scale_x batched with it, or an unbatched one), ``jax.lax.scan`` and
``jax.lax.fori_loop`` bodies, donated x; ``jax.vmap`` over two weights (values, meta, scale_w in any
mix); ``jax.grad`` / ``jax.vjp`` of x (and the bias) against float64
``(dy * act'(pre) * scales) @ W_pruned``, under jit and vmap.

The reference and its bound are tests/support/linear_reference.assert_matches (x as the kernel
multiplies it: as jax holds it, then cast to the weight's type). Illegal inputs must raise a sparsile
diagnostic (SPxxxx) while tracing, never an internal exception and never numbers."""

from __future__ import annotations

import math
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import SparsileError
from sparsile.stdlib.kernels import prune_and_compress
from sparsile.stdlib.sparsity.formats import decompress
from sparsile.tests.integrations.test_jax_grad import _dact
from sparsile.tests.support.linear_reference import (
    BAD_SPLIT_K,
    HALF_ULP,
    HOST,
    SMALLEST,
    as_vector,
    assert_matches,
)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from sparsile.integrations.jax import SparseLinear, sparse_linear  # noqa: E402

SETTINGS = settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LEADS = ((), (0,), (1,), (3,), (1, 1), (2, 3), (2, 0, 3), (1, 33), (17,), (40,))
ACTS = (None, "relu", "silu", "gelu_tanh")
OUT_DTYPES = {None: None, "float16": "float16", "jnp.bfloat16": jnp.bfloat16, "np.float32": np.float32,
              "float32": "float32"}


# ------------------------------------------------------------------------------------------------
# drawing and building a call


@st.composite
def jax_call(draw: st.DrawFn, grad: bool = False) -> dict[str, Any]:
    dtype = draw(st.sampled_from(("f16", "bf16") if grad else ("f16", "bf16", "e4m3")))
    if dtype == "e4m3":
        x_dtype = "float8_e4m3fn"
    else:
        own = np.dtype(HOST[dtype]).name
        x_dtype = draw(st.sampled_from((own, own, "float16", "bfloat16", "float32", "float64")
                                       + (() if grad else ("float8_e4m3fn", "float8_e5m2"))))
    sx_modes = (None, "number", "int", "weak", "one", "token", "flat", "column")
    return dict(
        dtype=dtype, x_dtype=x_dtype, act=draw(st.sampled_from(ACTS)),
        m=draw(st.one_of(st.integers(1, 130), st.sampled_from((16, 64, 128)))),
        k=draw(st.one_of(st.integers(1, 200), st.sampled_from((64, 128, 192, 256)))),
        lead=draw(st.sampled_from(LEADS)), x_kind=draw(st.sampled_from(("numpy", "jax"))),
        bias=draw(st.sampled_from((None, "float32", "float16", "bfloat16", "float64", "int32"))),
        sw=draw(st.sampled_from((None, "number", "weak", "one", "channel", "column"))),
        sx=draw(st.sampled_from(sx_modes[:1] + sx_modes[3:] if x_dtype == "float8_e4m3fn" else sx_modes)),
        out_dtype=draw(st.sampled_from(tuple(OUT_DTYPES))), split=draw(st.sampled_from((None, None, 1, 2, 3))),
        meta=draw(st.sampled_from(("uint32", "int32"))), mode=draw(st.sampled_from(("eager", "jit", "layer"))),
        interpret=draw(st.sampled_from((False, False, False, True))), seed=draw(st.integers(0, 2 ** 16)))


def build(case: dict[str, Any]) -> dict[str, Any]:
    """The arrays of a drawn call, and what the kernel multiplies (xk, float64 (T, K))."""
    rng = np.random.default_rng(case["seed"])
    dtype, m, k, lead = case["dtype"], case["m"], case["k"], case["lead"]
    t = math.prod(lead)
    w = rng.standard_normal((m, k)).astype(np.float32) * np.float32(2 / np.sqrt(k))
    if dtype == "e4m3":
        w = w * 64
    weight = prune_and_compress(w, dtype)
    values = jnp.asarray(weight.values)
    meta = jnp.asarray(weight.meta.data.view(np.uint32))
    if case["meta"] == "int32":
        meta = jax.lax.bitcast_convert_type(meta, jnp.int32)
    x32 = rng.standard_normal((*lead, k)).astype(np.float32)
    if case["x_dtype"] == "float8_e4m3fn":  # per-token amax at 448, as quantize_per_token_e4m3 leaves it
        x32 = x32 / np.maximum(np.abs(x32).max(axis=-1, keepdims=True), 1e-30) * 448
    x_host = x32.astype(np.float64) * (1 + 2.0 ** -30) if case["x_dtype"] == "float64" else x32
    x_host = x_host.astype(HOST.get(case["x_dtype"], np.dtype(case["x_dtype"]).type)
                           if case["x_dtype"] != "bfloat16" else ml_dtypes.bfloat16)
    x = x_host if case["x_kind"] == "numpy" else jnp.asarray(x_host)
    # what the kernel multiplies: x as jax holds it (f64 -> f32 without x64), cast to the weight's type
    xk = np.asarray(jnp.asarray(x_host)).reshape(t, k).astype(HOST[dtype]).astype(np.float64)

    def scale(mode: str | None, shape: tuple[int, ...], unit: float) -> Any:
        if mode is None:
            return None
        v = (rng.uniform(0.5, 2.0, shape) * unit).astype(np.float32)
        if mode == "number":
            return float(v.flat[0]) if v.size else unit
        if mode == "int":
            return int(rng.integers(1, 4))
        if mode == "weak":
            return jnp.asarray(float(v.flat[0]) if v.size else unit)  # a weak-typed f32 scalar
        if mode == "one":
            return jnp.asarray(v.reshape(-1)[:1]) if v.size else jnp.full((1,), unit, jnp.float32)
        if mode in ("flat",):
            return jnp.asarray(v.reshape(-1))
        if mode == "column":
            return v.reshape(*shape, 1)
        return jnp.asarray(v)  # "token", "channel"

    sw_unit = 1 / 64 if dtype == "e4m3" else 1.0
    sx_unit = 3 / 448 if case["x_dtype"] == "float8_e4m3fn" else 1.0
    sw = scale(case["sw"], (m,), sw_unit)
    sx = scale(case["sx"], lead, sx_unit)
    bias = None
    if case["bias"] is not None:
        b = rng.standard_normal(m) * (3 if case["bias"] == "int32" else 1)
        bias = b.astype(HOST.get(case["bias"], np.dtype(case["bias"]).type) if case["bias"] != "bfloat16"
                        else ml_dtypes.bfloat16)
        if case["x_kind"] == "jax" and case["bias"] != "float64":
            bias = jnp.asarray(bias)
    x_name = case["x_dtype"]
    y_dtype = (np.dtype(OUT_DTYPES[case["out_dtype"]]).name if case["out_dtype"] else
               "float32" if x_name == "float64" else x_name if x_name in HALF_ULP else "bfloat16")
    return dict(weight=weight, values=values, meta=meta, x=x, xk=xk, t=t, sw=sw, sx=sx, bias=bias, y_dtype=y_dtype)


def run(case: dict[str, Any], a: dict[str, Any], x: Any = None, fn: Any = None) -> Any:
    """The drawn call of ``a``'s arrays (``x`` instead of a["x"] if given), made as case["mode"] says
    (``fn`` wraps the call: a transform)."""
    statics = dict(activation=case["act"], out_dtype=OUT_DTYPES[case["out_dtype"]], interpret=case["interpret"])
    x = a["x"] if x is None else x
    if case["mode"] == "layer":  # the layer a pytree argument of jax.jit; the split is the plan's own
        layer = SparseLinear(a["values"], a["meta"], a["bias"], a["sw"], **statics)
        def of_layer(layer: SparseLinear, x: Any, sx: Any) -> Any:
            return layer(x, scale_x=sx)
        return jax.jit(fn(of_layer) if fn else of_layer)(layer, x, a["sx"])

    def call(x: Any, sx: Any) -> Any:
        return sparse_linear(x, a["values"], a["meta"], a["bias"], scale_x=sx, scale_w=a["sw"],
                             split_k=case["split"], **statics)

    wrapped = fn(call) if fn else call
    return (jax.jit(wrapped) if case["mode"] == "jit" else wrapped)(x, a["sx"])


def check(case: dict[str, Any], a: dict[str, Any], y: Any, order: np.ndarray | None = None) -> None:
    """y (any leading shape; its tokens are those of ``order``, else x's in order) against float64."""
    m, t = case["m"], a["t"]
    assert str(y.dtype) == a["y_dtype"], (y.dtype, a["y_dtype"])
    flat = np.asarray(y).reshape(-1, m)
    assert flat.shape[0] == t
    xk, sx = a["xk"], as_vector(a["sx"], t)
    if order is not None:
        xk, sx = xk[order], None if sx is None else sx[order]
    assert_matches(flat, a["weight"].dense().astype(np.float64), xk, sx, as_vector(a["sw"], m),
                   as_vector(a["bias"], m), case["act"] or "none", a["y_dtype"], case["dtype"] == "e4m3")


@SETTINGS
@given(case=jax_call())
def test_sparse_linear_matches_float64(case: dict[str, Any]) -> None:
    a = build(case)
    y = run(case, a)
    assert tuple(y.shape) == (*case["lead"], case["m"])
    check(case, a, y)


# ------------------------------------------------------------------------------------------------
# transforms: vmap (any axes, nested), scan, fori_loop, donation


def token_order(lead: tuple[int, ...], vmapped: Any) -> np.ndarray:
    """Which of x's tokens (in order) each token of a transformed result is: the same transform
    applied to the tokens' numbers."""
    ids = jnp.arange(math.prod(lead), dtype=jnp.int32).reshape(*lead, 1)
    return np.asarray(vmapped(lambda i, s: i)(ids, None)).reshape(-1)


@st.composite
def transform_call(draw: st.DrawFn) -> dict[str, Any]:
    case = draw(jax_call())
    lead = draw(st.sampled_from(((2, 3), (3, 1, 2), (1, 4), (2, 0, 3), (4,), (2, 2, 2))))
    transform = draw(st.sampled_from(("vmap", "vmap", "vmap2", "scan", "fori", "donate")))
    if transform == "vmap2" and len(lead) < 2:
        transform = "vmap"
    n_axes = {"vmap": 1, "vmap2": 2}.get(transform, 0)
    axes = []
    rank = len(lead)
    for _ in range(n_axes):  # an in_axis among the token axes (rank - 1 is x's feature axis: never)
        axes.append((draw(st.integers(0, rank - 1)), draw(st.integers(0, rank - 1))))
        rank -= 1
    sx_kind = draw(st.sampled_from((None, "token", "member", "unbatched")))
    case.update(lead=lead, transform=transform, axes=axes, sx=None if sx_kind is None else "token",
                sx_kind=sx_kind if transform.startswith("vmap") else None,
                mode="jit" if transform != "donate" else "eager", split=None)
    if case["x_dtype"] == "float64":
        case["x_dtype"] = "float32"
    if case["sx_kind"] in ("member", "unbatched"):
        case["sx"] = "number"  # replaced by build_transform
    return case


def vmap_of(case: dict[str, Any], sx_axes: Any) -> Any:
    """A function of ``call`` (x, sx) -> y, vmapped as drawn: the innermost vmap first."""
    def wrap(call: Any) -> Any:
        f = call
        for depth, (ia, oa) in reversed(list(enumerate(case["axes"]))):
            f = jax.vmap(f, in_axes=(ia, sx_axes(depth, ia)), out_axes=oa)
        return f
    return wrap


@SETTINGS
@given(case=transform_call())
def test_transforms_match_float64(case: dict[str, Any]) -> None:
    a = build(case)
    lead, m = case["lead"], case["m"]
    order = None
    if case["transform"] in ("vmap", "vmap2"):
        kind = case["sx_kind"]
        if kind == "member":  # one scale per member of the outermost vmap, spread over its tokens
            ia = case["axes"][0][0]
            s = np.random.default_rng(case["seed"] + 1).uniform(0.5, 2.0, lead[ia]).astype(np.float32)
            a["sx"] = jnp.asarray(s)
            shape = [1] * len(lead)
            shape[ia] = lead[ia]
            per_token = np.broadcast_to(s.reshape(shape), lead)
        elif kind == "unbatched":  # one scale for all, closed over by no vmap
            per_token = None
        wrap = vmap_of(case, lambda depth, ia: (ia if kind == "token" else 0 if kind == "member" and depth == 0
                                                else None))
        y = run(case, a, fn=wrap)
        order = token_order(lead, vmap_of(case, lambda depth, ia: None))
        if kind == "member":
            a["sx"] = per_token.reshape(-1).astype(np.float32)  # (the reference's view: one per token)
    elif case["transform"] == "scan":  # the layer in a scan body over x's first axis, and a carry
        def fn(call: Any) -> Any:
            def scanned(x: Any, sx: Any) -> Any:
                def body(c: Any, xs: Any) -> Any:
                    y = call(xs[0], xs[1])
                    return c + jnp.sum(y.astype(jnp.float32)), y
                total, ys = jax.lax.scan(body, jnp.float32(0), (x, sx))
                return ys, total
            return scanned
        y, total = run(case, a, fn=fn)
        ys = np.asarray(y, np.float64)
        if np.isfinite(ys).all():  # the carry saw every step's y
            assert abs(float(total) - ys.sum()) <= 2.0 ** -20 * ys.size * (np.abs(ys).sum() + 1)
    elif case["transform"] == "fori":  # the layer in a fori_loop writing one slice per step
        def fn(call: Any) -> Any:
            def looped(x: Any, sx: Any) -> Any:
                y0 = jnp.zeros((*lead, m), a["y_dtype"])

                def body(i: Any, y: Any) -> Any:
                    xi = jax.lax.dynamic_index_in_dim(x, i, keepdims=False)
                    si = None if sx is None else jax.lax.dynamic_index_in_dim(sx, i, keepdims=False)
                    return jax.lax.dynamic_update_index_in_dim(y, call(xi, si), i, 0)
                return jax.lax.fori_loop(0, lead[0], body, y0)
            return looped
        y = run(case, a, fn=fn)
    else:  # donate x: XLA may give its buffer to y or another temporary
        x = jnp.asarray(a["x"])
        f = jax.jit(lambda x, sx: sparse_linear(x, a["values"], a["meta"], a["bias"], scale_x=sx, scale_w=a["sw"],
                                                activation=case["act"], out_dtype=OUT_DTYPES[case["out_dtype"]]),
                    donate_argnums=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ("Some donated buffers were not usable")
            y = f(x, a["sx"])
    check(case, a, y, order)


@SETTINGS
@given(case=jax_call(), batched=st.sampled_from(("values", "meta", "scale_w", "values meta", "values meta scale_w",
                                                  "values scale_w")))
def test_vmap_over_the_weight_matches_float64(case: dict[str, Any], batched: str) -> None:
    """jax.vmap over two weights (the drawn one and another of the same shapes; any mix of values,
    meta and scale_w batched, the others the first weight's; nothing batched where the draw has no scale_w
    to batch) with x, the bias and scale_x shared: each member against float64 of its own weight, decoded
    from the values and meta it was given."""
    a = build(case)
    other = build(dict(case, seed=case["seed"] + 1))
    parts = batched.split()
    statics = dict(activation=case["act"], out_dtype=OUT_DTYPES[case["out_dtype"]], interpret=case["interpret"],
                   split_k=case["split"])
    args, axes = [], []
    for what in ("values", "meta", "sw"):
        first, second = a[what], other[what]
        if (what if what != "sw" else "scale_w") in parts and first is not None:
            args.append(jnp.stack([jnp.asarray(first, jnp.float32) if what == "sw" else first,
                                   jnp.asarray(second, jnp.float32) if what == "sw" else second]))
            axes.append(0)
        else:
            args.append(first)
            axes.append(None)

    def call(v: Any, e: Any, sw: Any) -> Any:
        return sparse_linear(a["x"], v, e, a["bias"], scale_x=a["sx"], scale_w=sw, **statics)

    f = jax.vmap(call, in_axes=tuple(axes), axis_size=2)  # (the size for a draw that batches nothing: no scale_w)
    y = (f if case["mode"] == "eager" else jax.jit(f))(*args)
    assert tuple(y.shape) == (2, *case["lead"], case["m"])
    op = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}[str(a["values"].dtype)]
    for i in range(2):
        v, e, sw = (arg[i] if axis == 0 else arg for arg, axis in zip(args, axes))
        dense = decompress(np.asarray(v), np.asarray(e).view(np.uint32), "sm90", op)[:, :case["k"]]
        assert str(y.dtype) == a["y_dtype"], (y.dtype, a["y_dtype"])
        assert_matches(np.asarray(y[i]).reshape(-1, case["m"]), dense.astype(np.float64), a["xk"],
                       as_vector(a["sx"], a["t"]), as_vector(sw, case["m"]),
                       as_vector(a["bias"], case["m"]), case["act"] or "none", a["y_dtype"], op == "e4m3")


# ------------------------------------------------------------------------------------------------
# gradients with respect to x (and the bias)


@st.composite
def grad_call(draw: st.DrawFn) -> dict[str, Any]:
    case = draw(jax_call(grad=True))
    case.update(how=draw(st.sampled_from(("grad", "vjp", "jit_grad", "vmap_grad"))),
                bias=draw(st.sampled_from((None, "float32", "float16"))),
                sx=draw(st.sampled_from((None, "number", "token", "flat"))),
                lead=draw(st.sampled_from(((), (0,), (1,), (3,), (2, 3), (1, 17)))))
    if case["how"] == "vmap_grad" and not case["lead"]:
        case["lead"] = (2,)
    if case["how"] == "vmap_grad" and case["sx"] == "flat":
        case["sx"] = "token"
    return case


@SETTINGS
@given(case=grad_call())
def test_grad_of_x_matches_float64(case: dict[str, Any]) -> None:
    """dx = (dy * act'(pre) * scale_w * scale_x) @ W and d bias = sum(dy * act'(pre)) over the
    tokens, with pre from x as the kernel multiplies it (the rounding to the weight's type is a
    straight-through identity). Bound: test_jax_grad.check_grads's (f32 sums over N + K terms, act'
    moved by pre's own error), dy rounded to y's type, dx rounded to x's type."""
    a = build(case)
    lead, t, m, k = case["lead"], a["t"], case["m"], case["k"]
    x = jnp.asarray(a["x"])
    g = np.random.default_rng(case["seed"] + 7).standard_normal((*lead, m)).astype(np.float32)
    statics = dict(activation=case["act"], out_dtype=OUT_DTYPES[case["out_dtype"]], split_k=case["split"])
    sw, sx, bias = a["sw"], a["sx"], a["bias"]

    def layer(x: Any, b: Any, sx: Any = sx) -> Any:
        return sparse_linear(x, a["values"], a["meta"], b, scale_x=sx, scale_w=sw, **statics)

    def loss(x: Any, b: Any, g: Any = g, sx: Any = sx) -> Any:
        return jnp.sum(layer(x, b, sx).astype(jnp.float32) * g)

    argnums = (0, 1) if bias is not None else 0
    if case["how"] == "vjp":
        y, pull = jax.vjp(layer, x, bias)
        grads = pull(jnp.asarray(g).astype(y.dtype))
        grads = grads if bias is not None else grads[0]
    elif case["how"] == "vmap_grad":  # one gradient per member of x's first axis
        in_sx = 0 if isinstance(sx, jax.Array) and sx.ndim else None
        grads = jax.jit(jax.vmap(jax.grad(lambda x, b, g, sx: loss(x, b, g, sx), argnums=argnums),
                                 in_axes=(0, None, 0, in_sx)))(x, bias, g, sx)
        # (the bias gradient stays one per member, each rounded to the bias's type: their sum in that
        # type would round again, beyond the bound of one rounding checked below)
    else:
        f = jax.grad(loss, argnums=argnums)
        grads = (jax.jit(f) if case["how"] == "jit_grad" else f)(x, bias)
    dx, db = grads if bias is not None else (grads, None)
    assert dx.shape == x.shape and dx.dtype == x.dtype, (dx.shape, dx.dtype, x.dtype)

    y_dtype = a["y_dtype"]
    w = a["weight"].dense().astype(np.float64)
    xk = a["xk"]
    sxv, swv = as_vector(sx, t), as_vector(sw, m)
    s = np.ones((t, m)) * (1 if swv is None else swv[None, :]) * (1 if sxv is None else sxv[:, None])
    b64 = 0 if bias is None else as_vector(bias, m)[None, :]
    pre = (xk @ w.T) * s + b64
    gq = np.asarray(jnp.asarray(g).astype(y_dtype)).astype(np.float64).reshape(t, m)  # dy in y's type
    dpre = gq * _dact(case["act"], pre)
    want_dx, want_db = (dpre * s) @ w, dpre.sum(axis=0)
    pre_err = max(k, 1) * 2.0 ** -23 * (np.abs(xk) @ np.abs(w.T)) * np.abs(s) + 2.0 ** -22 * np.abs(pre)
    slack = np.abs(gq) * (2.0 ** -22 + pre_err * 2)
    if case["act"] == "relu":  # act' is a step: where pre is within its error of 0 either side may be taken
        slack = slack + np.abs(gq) * (np.abs(pre) <= pre_err)
    slack = slack + HALF_ULP[y_dtype] * np.abs(gq)  # (the f32 tangent cast to y's type and back)
    bound_dx = (m + k) * 2.0 ** -23 * (np.abs(dpre * s) @ np.abs(w)) + (slack * np.abs(s)) @ np.abs(w)
    x_name = str(dx.dtype)
    bound_dx = bound_dx + HALF_ULP.get(x_name, 0.0) * (np.abs(want_dx) + bound_dx) + SMALLEST.get(x_name, 0.0)
    got = np.asarray(dx, np.float64).reshape(t, k)
    worst = np.abs(got - want_dx) - bound_dx
    assert (worst <= 0).all(), f"dx off by {worst.max():.3g} beyond its bound"
    if db is not None and case["how"] == "vmap_grad" and lead[0] == 0:
        assert db.shape == (0, m)  # no members: no gradients
    elif db is not None:
        # vmap_grad: one bias gradient per member of x's first axis, over that member's tokens
        members = lead[0] if case["how"] == "vmap_grad" else 1
        per = t // members
        dpre_m, slack_m = dpre.reshape(members, per, m), slack.reshape(members, per, m)
        want_db = dpre_m.sum(axis=1)
        bound_db = per * 2.0 ** -23 * np.abs(dpre_m).sum(axis=1) + slack_m.sum(axis=1)
        b_name = str(db.dtype)
        bound_db = bound_db + HALF_ULP.get(b_name, 0.0) * (np.abs(want_db) + bound_db) + SMALLEST.get(b_name, 0.0)
        assert db.shape == ((members, m) if case["how"] == "vmap_grad" else (m,))
        assert (np.abs(np.asarray(db, np.float64).reshape(members, m) - want_db) <= bound_db).all()


# ------------------------------------------------------------------------------------------------
# illegal inputs: a sparsile diagnostic while tracing


MUTATIONS = ("x_k", "x_0d", "x_int", "x_complex", "x_list", "x_16bit_for_e4m3", "x_e5m2_for_e4m3", "bias_shape",
             "bias_2d", "bias_complex", "bias_str", "scale_x_shape", "scale_w_shape", "scale_x_complex", "meta_shape",
             "meta_float", "meta_int16", "values_1d", "values_f32", "values_int16", "values_dense_shape", "split_0",
             "split_65", "split_bool", "split_float", "split_traced", "interpret_str", "activation", "gated",
             "out_dtype_int8", "out_dtype_f64", "grad_values", "grad_scale_w", "grad_scale_x", "grad_e4m3")
# (jax.vmap over the weight is legal: test_vmap_over_the_weight_matches_float64)


def illegal(case: dict[str, Any], a: dict[str, Any], mutation: str) -> Any:
    """A function of nothing that traces the drawn call with one thing made illegal."""
    kw = dict(bias=a["bias"], scale_x=a["sx"], scale_w=a["sw"], activation=case["act"],
              out_dtype=OUT_DTYPES[case["out_dtype"]], split_k=case["split"])
    x, values, meta = a["x"], a["values"], a["meta"]
    lead, k, m = case["lead"], case["k"], case["m"]
    e4m3 = case["dtype"] == "e4m3"
    f16 = np.float16
    if mutation == "x_k":
        x = np.zeros((*lead, k + (4 if e4m3 else 2) + 32), f16 if not e4m3 else ml_dtypes.float8_e4m3fn)
    elif mutation == "x_0d":
        x = np.float32(1.0)
    elif mutation == "x_int":
        x = np.zeros((*lead, k), np.int8)
    elif mutation == "x_complex":
        x = np.zeros((*lead, k), np.complex64)
    elif mutation == "x_list":
        x = [[0.0] * k]
    elif mutation == "x_16bit_for_e4m3":
        if not e4m3:
            return illegal(case, a, "x_k")
        x = np.zeros((*lead, k), f16)
    elif mutation == "x_e5m2_for_e4m3":
        if not e4m3:
            return illegal(case, a, "x_int")
        x = np.zeros((*lead, k), ml_dtypes.float8_e5m2)
    elif mutation == "bias_shape":
        kw["bias"] = np.zeros(m + 1, np.float32)
    elif mutation == "bias_2d":
        kw["bias"] = np.zeros((1, m), np.float32)
    elif mutation == "bias_complex":
        kw["bias"] = np.zeros(m, np.complex64)
    elif mutation == "bias_str":
        kw["bias"] = "0"
    elif mutation == "scale_x_shape":
        kw["scale_x"] = np.ones(math.prod(lead) + 2, np.float32)
    elif mutation == "scale_w_shape":
        kw["scale_w"] = np.ones((m, 2), np.float32)
    elif mutation == "scale_x_complex":
        kw["scale_x"] = np.ones(lead, np.complex64)
    elif mutation == "meta_shape":
        meta = meta[:, :1] if meta.shape[1] > 1 else jnp.concatenate([meta, meta], axis=1)
    elif mutation == "meta_float":
        meta = jax.lax.bitcast_convert_type(meta, jnp.float32)
    elif mutation == "meta_int16":
        meta = meta.astype(jnp.int16)
    elif mutation == "values_1d":
        values = values.reshape(-1)
    elif mutation == "values_f32":
        values = values.astype(jnp.float32)
    elif mutation == "values_int16":
        values = jax.lax.bitcast_convert_type(values, jnp.int16) if not e4m3 else values.astype(jnp.int8)
    elif mutation == "values_dense_shape":
        values = jnp.zeros((m, k + 64), values.dtype)
    elif mutation in BAD_SPLIT_K:
        kw["split_k"] = BAD_SPLIT_K[mutation]
    elif mutation == "split_traced":
        return lambda: jax.jit(lambda x, s: sparse_linear(x, values, meta, split_k=s)).lower(x, 2)
    elif mutation == "interpret_str":
        kw["interpret"] = "no"
    elif mutation == "activation":
        kw["activation"] = "gelu"
    elif mutation == "gated":
        kw["activation"] = "swiglu"
    elif mutation == "out_dtype_int8":
        kw["out_dtype"] = "int8"
    elif mutation == "out_dtype_f64":
        kw["out_dtype"] = jnp.float64
    elif mutation.startswith("grad_"):
        what = mutation.removeprefix("grad_")
        if what == "e4m3" and not e4m3:
            what = "values"
        if what in ("scale_w", "scale_x"):
            kw[what] = jnp.float32(2.0)

        def loss(v: Any) -> Any:
            args = dict(kw, **({what: v} if what in ("scale_w", "scale_x") else {}))
            xx = v if what == "e4m3" else x
            vv = v if what == "values" else values
            return jnp.sum(sparse_linear(xx, vv, meta, **args).astype(jnp.float32))
        arg = {"values": values, "e4m3": jnp.asarray(x), "scale_w": kw["scale_w"], "scale_x": kw["scale_x"]}[what]
        return lambda: jax.jit(jax.grad(loss)).lower(arg)
    return lambda: jax.jit(lambda: sparse_linear(x, values, meta, **kw)).lower()


@SETTINGS
@given(case=jax_call(), mutation=st.sampled_from(MUTATIONS))
def test_illegal_inputs_raise_a_sparsile_diagnostic_while_tracing(case: dict[str, Any], mutation: str) -> None:
    a = build(case)
    trace = illegal(case, a, mutation)
    try:
        trace()
    except SparsileError as e:
        assert e.code.startswith("SP"), e
        return
    pytest.fail(f"{mutation}: no diagnostic")


# ------------------------------------------------------------------------------------------------
# explicit examples of defects the properties found


def test_grad_with_per_token_scale_x_and_no_tokens() -> None:
    """T = 0 with a per-token scale_x of shape (0,): the forward gave (0, N), but the gradient's
    rule took the empty scale for one number and broadcast (0,) against (0, N): a ValueError from
    jax.numpy inside grad.py."""
    layer = SparseLinear.from_dense(np.ones((32, 64)), "f16")
    x = np.zeros((0, 64), np.float32)
    sx = np.ones(0, np.float32)
    dx = jax.grad(lambda x: jnp.sum(layer(x, scale_x=sx).astype(jnp.float32)))(x)
    assert dx.shape == (0, 64)
    one = np.full((1, 64), 0.5, np.float32)  # and T = 1 (a per-token scale of one element) still scales
    dx = jax.grad(lambda x: jnp.sum(layer(x, scale_x=np.array([3.0], np.float32)).astype(jnp.float32)))(one)
    np.testing.assert_allclose(np.asarray(dx), 3 * layer.dense().astype(np.float32).sum(axis=0, keepdims=True))


def test_call_specializes_numpy_arrays_as_jax_holds_them() -> None:
    """A numpy float64 / int64 array given to ``call`` outside a jit trace (or closed over inside
    one) reaches the kernel as the 32-bit buffer JAX makes of it without jax_enable_x64, but the
    kernel was specialized (and on a GPU compiled) for the 64-bit type: an annotated ptr[f32]
    refused it (SP0703) where the same array as a jit argument ran, and an unannotated pointer was
    compiled to read 8-byte elements of a 4-byte buffer (read past its end on the GPU; on the CPU
    the interpreter re-specialized at run time: an SP0936 run-time error instead of the trace-time
    diagnostic)."""
    import sparsile as sp
    from sparsile.integrations.jax import call, ffi

    if jax.config.jax_enable_x64:
        pytest.skip("64-bit arrays stay 64-bit with jax_enable_x64")

    @sp.jit
    def scaled(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], BLOCK: sp.constexpr = 8):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs) * 3.0)

    @sp.jit
    def copy(x, out, BLOCK: sp.constexpr = 8):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs))

    x = np.arange(8, dtype=np.float64) + 0.5
    out = jax.ShapeDtypeStruct((8,), jnp.float32)
    eager = call(scaled, (1,), x, out_shapes=out)
    jitted = jax.jit(lambda x: call(scaled, (1,), x, out_shapes=out))(x)
    np.testing.assert_array_equal(np.asarray(eager), 3 * x.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))
    plans = []
    add_plan = ffi.add_plan
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ffi, "add_plan", lambda plan, *rest: plans.append(plan) or add_plan(plan, *rest))
        for a in (x, np.arange(8, dtype=np.int64)):
            y = call(copy, (1,), a, out_shapes=jax.ShapeDtypeStruct((8,), jnp.asarray(a).dtype))
            np.testing.assert_array_equal(np.asarray(y), a)
    assert [str(p.bindings["x"].type) for p in plans] == ["ptr[f32]", "ptr[i32]"]
