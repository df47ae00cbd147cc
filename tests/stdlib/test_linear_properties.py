"""Property tests (hypothesis) of sparse_linear and sparse_matmul against float64: the whole argument
space drawn at once, in the CPU interpreter.

Drawn: the weight type (f16, bf16, e4m3 with per-channel / per-tensor scale_w), ragged shapes
(N_out and K not multiples of 16 or 64, K = 0, T = 0 and 1), x's type (the weight's, another 16-bit
or f32 type that is cast; for e4m3 weights an e4m3 x with its scale_x, or a 16-bit x that the decode
kernel quantizes itself), x's layout (transposed views, sliced columns, a storage offset, stride-0
rows, reversed rows and columns), numpy or torch CPU arrays, bias (absent, f32, y's type, another
type), the activation (gated ones where the decode kernel runs), out_dtype, ``out=`` (absent, or
poisoned with NaN, contiguous or a strided view), the kernel ("gemm", "decode", the default) and
split_k.

The reference and its bound are tests/support/linear_reference.py's (float64 from the pruned dense
weight and x as the kernel multiplies it: cast to the weight's type, or quantized per token as
``quantize_per_token_e4m3`` documents; f32 accumulation, the epilogue's roundings, the activation's
slope, half an ulp of y's type).

Illegal combinations must raise a sparsile diagnostic (a SparsileError with an SPxxxx code), never
an internal TypeError / IndexError / AssertionError."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import SparsileError
from sparsile.stdlib.kernels import prune_and_compress, sparse_linear, sparse_matmul
from sparsile.stdlib.kernels.linear_args import GATED_ACTIVATIONS
from sparsile.tests.support.linear_reference import (
    BAD_SPLIT_K,
    HALF_ULP,
    HOST,
    NP,
    as_vector,
    assert_matches,
    host64,
    quantize_e4m3_model,
)

torch = pytest.importorskip("torch")

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
         "float8_e4m3fn": torch.float8_e4m3fn}
SETTINGS = settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------------------------------------------
# arrays of a drawn layout


def laid_out(a: np.ndarray, layout: str) -> np.ndarray:
    """A numpy view with ``a``'s values (T, K) in the given layout."""
    t, k = a.shape
    if layout == "transposed":
        return np.ascontiguousarray(a.T).T
    if layout == "columns":  # every other column of a wider array
        wide = np.zeros((t, 2 * k + 1), a.dtype)
        wide[:, 1::2] = a
        return wide[:, 1::2]
    if layout == "offset":  # a storage offset of one element, rows padded
        buf = np.zeros(t * (k + 3) + 1, a.dtype)
        view = buf[1:].reshape(t, k + 3)[:, :k] if t else buf[1:1].reshape(0, k)
        view[...] = a
        return view
    if layout == "reversed":  # negative strides both ways
        return np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1]
    if layout == "broadcast":  # stride-0 rows: every row the first
        return np.broadcast_to(a[:1], a.shape) if t else a
    return np.ascontiguousarray(a)


def torch_laid_out(a: np.ndarray, layout: str) -> Any:
    """A torch CPU tensor with ``a``'s values in the given layout (no negative strides in torch:
    "reversed" is a flip, a copy)."""
    base = torch.from_numpy(np.ascontiguousarray(a).view(f"u{a.itemsize}").astype(
        {1: np.uint8, 2: np.int16, 4: np.int32}[a.itemsize], copy=False)).view(TORCH[a.dtype.name])
    t, k = a.shape
    if layout == "transposed":
        return base.t().contiguous().t()
    if layout == "columns":
        wide = torch.zeros((t, 2 * k + 1), dtype=base.dtype)
        wide[:, 1::2] = base
        return wide[:, 1::2]
    if layout == "offset":
        buf = torch.zeros(t * (k + 3) + 1, dtype=base.dtype)
        view = buf[1:].view(t, k + 3)[:, :k]
        view.copy_(base)
        return view
    if layout == "broadcast":
        return base[:1].expand(t, k) if t else base
    return base


def host_bits(a: Any) -> np.ndarray:
    """The host values of a numpy array or torch CPU tensor, in the numpy dtype."""
    if isinstance(a, torch.Tensor):
        name = str(a.dtype).removeprefix("torch.")
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
        return a.contiguous().view(ints).numpy().view(NP[name])
    return np.asarray(a)


# ------------------------------------------------------------------------------------------------
# drawing a call


LAYOUTS = ("contiguous", "transposed", "columns", "offset", "reversed", "broadcast")


@st.composite
def linear_call(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(("f16", "bf16", "e4m3")))
    kind = draw(st.sampled_from(("numpy", "torch")))
    kernel = draw(st.sampled_from((None, "gemm", "decode")))
    act = draw(st.sampled_from((None, "relu", "silu", "gelu_tanh", "swiglu", "geglu")))
    gated = act in GATED_ACTIVATIONS
    m = 32 * draw(st.integers(1, 3)) if gated else draw(st.integers(1, 130))
    k = draw(st.one_of(st.integers(0, 200), st.sampled_from((64, 128, 192, 256))))
    t = draw(st.one_of(st.integers(0, 40), st.sampled_from((0, 1, 64, 65))))
    if dtype == "e4m3":
        x_dtype = draw(st.sampled_from(("float8_e4m3fn", "float8_e4m3fn", "float16", "bfloat16")))
    else:
        x_dtype = draw(st.sampled_from((np.dtype(HOST[dtype]).name,) * 2 + ("float16", "bfloat16", "float32")))
    layout = draw(st.sampled_from(LAYOUTS if kind == "numpy" else tuple(lay for lay in LAYOUTS if lay != "reversed")))
    out_dtype = draw(st.sampled_from((None, "float16", "bfloat16", "float32")))
    bias = draw(st.sampled_from((None, "f32", "out", "f16", "f64")))
    sw = draw(st.sampled_from((None, "tensor", "one", "channel")))
    sx = None
    if x_dtype == "float8_e4m3fn":
        sx = draw(st.sampled_from(("token", "column", "tensor")))
    elif dtype != "e4m3":
        sx = draw(st.sampled_from((None, None, "token", "tensor")))
    out = draw(st.sampled_from((None, "contiguous", "strided")))
    split = draw(st.sampled_from((None, None, 1, 2, 3)))
    seed = draw(st.integers(0, 2 ** 16))
    return dict(dtype=dtype, kind=kind, kernel=kernel, act=act, m=m, k=k, t=t, x_dtype=x_dtype, layout=layout,
                out_dtype=out_dtype, bias=bias, sw=sw, sx=sx, out=out, split=split, seed=seed)


def build(case: dict[str, Any]) -> dict[str, Any]:
    """The arrays of a drawn call: weight (prune_and_compress), x, bias, scales and out."""
    rng = np.random.default_rng(case["seed"])
    dtype, kind, m, k, t = case["dtype"], case["kind"], case["m"], case["k"], case["t"]
    w = rng.standard_normal((m, k)).astype(np.float32) * np.float32(2 / np.sqrt(max(k, 1)))
    if dtype == "e4m3":
        w = w * 64
    weight = prune_and_compress(torch.from_numpy(w) if kind == "torch" else w, dtype)
    x32 = rng.standard_normal((t, k)).astype(np.float32)
    if case["x_dtype"] == "float8_e4m3fn":
        amax = np.abs(x32).max(axis=1, keepdims=True) if k else np.ones((t, 1), np.float32)
        x32 = x32 / np.maximum(amax, 1e-30) * 448
    if case["layout"] == "broadcast" and t:
        x32 = np.broadcast_to(x32[:1], x32.shape).copy()
    x_host = x32.astype(NP[case["x_dtype"]])
    x = laid_out(x_host, case["layout"]) if kind == "numpy" else torch_laid_out(x_host, case["layout"])
    y_dtype = case["out_dtype"] or (case["x_dtype"] if case["x_dtype"] in HALF_ULP else "bfloat16")

    def vec(what: str | None, n: int, unit: float, dtype: str = "float32") -> Any:
        if what is None:
            return None
        if what == "tensor":
            return float(rng.uniform(0.5, 2.0)) * unit
        if what == "one":
            v = np.array([rng.uniform(0.5, 2.0) * unit], np.float32)
        elif what == "column":
            v = (rng.uniform(0.25, 2.0, (n, 1)) * unit).astype(np.float32)
        else:
            v = (rng.uniform(0.25, 2.0, n) * unit).astype(dtype)
        return torch.from_numpy(v) if kind == "torch" else v

    def bias_vec() -> Any:
        b = case["bias"]
        if b is None:
            return None
        dt = {"f32": "float32", "out": y_dtype, "f16": "float16", "f64": "float64"}[b]
        v = rng.standard_normal(m).astype(NP.get(dt, np.float64))
        if kind == "torch":
            return torch.from_numpy(v.astype(np.float32)).to(TORCH.get(dt, torch.float64))
        return v

    sw_unit = 1 / 64 if dtype == "e4m3" else 1.0
    sx_unit = 3 / 448 if case["x_dtype"] == "float8_e4m3fn" else 1.0
    out = None
    if case["out"] is not None:
        f = m // 2 if case["act"] in GATED_ACTIVATIONS else m
        if kind == "numpy":
            buf = np.full((t, f + 3), np.nan, NP[y_dtype])
            out = buf[:, :f] if case["out"] == "strided" else np.ascontiguousarray(buf[:, :f])
        else:
            buf = torch.full((t, f + 3), float("nan"), dtype=TORCH[y_dtype])
            out = buf[:, :f] if case["out"] == "strided" else buf[:, :f].contiguous()
    return dict(weight=weight, x=x, x_host=x_host, y_dtype=y_dtype, bias=bias_vec(),
                scale_w=vec(case["sw"], m, sw_unit), scale_x=vec(case["sx"], t, sx_unit), out=out)


def legal(case: dict[str, Any]) -> str | None:
    """None where the call is legal, else the SP code it must raise."""
    t = case["t"]
    decode = case["kernel"] != "gemm" and 1 <= t <= 64 and not (case["split"] or 0) > 64
    if case["dtype"] == "e4m3" and case["x_dtype"] != "float8_e4m3fn" and not decode:
        return "SP0852"
    if case["act"] in GATED_ACTIVATIONS and t and not decode:
        return "SP0860"
    return None


def run_case(case: dict[str, Any]) -> None:
    a = build(case)
    weight = a["weight"]
    kw = dict(bias=a["bias"], activation=case["act"], scale_x=a["scale_x"], scale_w=a["scale_w"],
              out_dtype=case["out_dtype"], out=a["out"], interpret=True, split_k=case["split"], kernel=case["kernel"])
    want_error = legal(case)
    try:
        y = sparse_linear(weight.values, weight.meta, a["x"], **kw)
    except SparsileError as e:
        assert want_error is not None and e.code == want_error, f"unexpected {e.code}: {e}"
        return
    assert want_error is None, f"no {want_error} raised"
    if a["out"] is not None:
        assert y is a["out"]
    assert str(y.dtype).removeprefix("torch.") == a["y_dtype"]
    kind = "torch" if isinstance(a["x"], torch.Tensor) else "numpy"
    assert (isinstance(y, torch.Tensor)) == (kind == "torch")
    dense = weight.dense().astype(np.float64)
    e4m3 = case["dtype"] == "e4m3"
    sx = as_vector(a["scale_x"], case["t"])
    if e4m3 and case["x_dtype"] != "float8_e4m3fn":
        xk, sx = quantize_e4m3_model(a["x_host"])
    else:
        xk = a["x_host"].astype(HOST[case["dtype"]]).astype(np.float64)
    assert_matches(y, dense, xk, sx, as_vector(a["scale_w"], case["m"]), as_vector(a["bias"], case["m"]),
                   case["act"] or "none", a["y_dtype"], e4m3)


@SETTINGS
@given(case=linear_call())
def test_sparse_linear_matches_float64(case: dict[str, Any]) -> None:
    run_case(case)


@pytest.mark.parametrize("api", ["sparse_linear", "sparse_matmul"])
@pytest.mark.parametrize("split", [2, 3])
def test_no_tokens_with_an_explicit_split_k_gives_an_empty_result(api: str, split: int) -> None:
    """T = 0 with split_k > 1 (found by the property test): the split-K workspace check built its
    help, the largest split that fits, by dividing by T x N_out = 0 (a ZeroDivisionError) before
    deciding the (empty) workspace fits."""
    weight = prune_and_compress(np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32), "f16")
    x = np.zeros((0, 64), np.float16)
    if api == "sparse_linear":
        y = sparse_linear(weight.values, weight.meta, x, interpret=True, kernel="gemm", split_k=split)
        assert y.shape == (0, 32)
    else:
        assert sparse_matmul(weight.values, weight.meta, x, interpret=True, split_k=split).shape == (32, 0)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("api,kernel", [("sparse_linear", "gemm"), ("sparse_linear", "decode"),
                                        ("sparse_matmul", None)])
def test_one_row_of_a_wider_array_is_a_legal_x(kind: str, api: str, kernel: str | None) -> None:
    """x (1, K) whose row stride is not K (a row of a wider array; numpy and torch call it contiguous),
    K a multiple of the kernel's alignment so that no column is padded (found by the property test):
    the interpreter built x's tensor map from that row stride, 262 bytes, and refused it (SP0714)
    instead of computing y; on the GPU a numpy x was copied with those strides alike."""
    rng = np.random.default_rng(1)
    k, m = 128, 40
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), "bf16")
    wide = rng.standard_normal((3, k + 3)).astype(ml_dtypes.bfloat16)
    x = wide[1:2, :k] if kind == "numpy" else torch_laid_out(wide, "contiguous")[1:2, :k]
    ref = host64(x) @ weight.dense().astype(np.float64).T
    if api == "sparse_linear":
        y = host64(sparse_linear(weight.values, weight.meta, x, interpret=True, kernel=kernel, out_dtype="float32"))
    else:
        y = host64(sparse_matmul(weight.values, weight.meta, x, interpret=True)).T
    np.testing.assert_allclose(y, ref, rtol=2 ** -7, atol=1e-3 * np.abs(ref).max())


# ------------------------------------------------------------------------------------------------
# sparse_matmul: C (M, N) = W @ b.T, also through the call cache's replays (its interpreter switch on)


@st.composite
def matmul_call(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(("f16", "bf16", "e4m3")))
    kind = draw(st.sampled_from(("numpy", "torch")))
    b_dtype = draw(st.sampled_from((np.dtype(HOST[dtype]).name,) * 2 + ("float16", "float32")))
    layouts = LAYOUTS if kind == "numpy" else tuple(lay for lay in LAYOUTS if lay != "reversed")
    return dict(dtype=dtype, kind=kind, m=draw(st.integers(1, 130)), n=draw(st.one_of(st.integers(0, 40),
                st.sampled_from((1, 64, 65)))), k=draw(st.one_of(st.integers(1, 200), st.sampled_from((64, 128, 256)))),
                b_dtype=b_dtype, layout=draw(st.sampled_from(layouts)),
                out_dtype=draw(st.sampled_from((None, "bfloat16", "float32"))),
                out=draw(st.sampled_from((None, "contiguous", "strided"))),
                kernel=draw(st.sampled_from((None, "gemm", "decode"))), split=draw(st.sampled_from((None, 1, 2, 3))),
                cached=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


def run_matmul_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsile.stdlib.kernels import call_cache

    monkeypatch.setattr(call_cache, "INTERPRET", case["cached"])
    rng = np.random.default_rng(case["seed"])
    dtype, kind, m, n, k = case["dtype"], case["kind"], case["m"], case["n"], case["k"]
    w = rng.standard_normal((m, k)).astype(np.float32) * np.float32(2 / np.sqrt(k))
    weight = prune_and_compress(torch.from_numpy(w) if kind == "torch" else w, dtype)
    dense = weight.dense().astype(np.float64)
    c_dtype = case["out_dtype"] or "float16"
    for _call in range(2 if case["cached"] else 1):  # (a second call of the same key replays the first)
        b32 = rng.standard_normal((n, k)).astype(np.float32) * (8 if dtype == "e4m3" else 1)
        if case["layout"] == "broadcast" and n:
            b32 = np.broadcast_to(b32[:1], b32.shape).copy()
        b_host = b32.astype(NP[case["b_dtype"]])
        b = laid_out(b_host, case["layout"]) if kind == "numpy" else torch_laid_out(b_host, case["layout"])
        out = None
        if case["out"] is not None:
            if kind == "numpy":
                buf = np.full((m, n + 3), np.nan, NP[c_dtype])
                out = buf[:, :n] if case["out"] == "strided" else np.ascontiguousarray(buf[:, :n])
            else:
                buf = torch.full((m, n + 3), float("nan"), dtype=TORCH[c_dtype])
                out = buf[:, :n] if case["out"] == "strided" else buf[:, :n].contiguous()
        with np.errstate(over="ignore"):
            c = sparse_matmul(weight.values, weight.meta, b, out=out, out_dtype=case["out_dtype"], interpret=True,
                              split_k=case["split"], kernel=case["kernel"])
        if out is not None:
            assert c is out
        assert str(c.dtype).removeprefix("torch.") == c_dtype and tuple(c.shape) == (m, n)
        bk = b_host.astype(HOST[dtype]).astype(np.float64)
        assert_matches(host64(c).T, dense, bk, None, None, None, "none", c_dtype, dtype == "e4m3")


@SETTINGS
@given(case=matmul_call())
def test_sparse_matmul_matches_float64(case: dict[str, Any]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        run_matmul_case(case, mp)


# ------------------------------------------------------------------------------------------------
# illegal arguments: a sparsile diagnostic, never an internal exception


MUTATIONS = ("x_k", "x_1d", "x_3d", "x_complex", "x_list", "bias_shape", "bias_int", "scale_x_shape", "scale_w_shape",
             "out_shape", "out_dtype_of_out", "out_read_only", "out_overlapping", "split_0", "split_65", "split_bool",
             "split_float", "kernel", "activation", "out_dtype", "e4m3_x_for_16_bit_with_scale", "gated_rows",
             "meta_words", "values_shape")


def mutated(case: dict[str, Any], a: dict[str, Any], mutation: str) -> dict[str, Any]:
    """sparse_linear's keyword arguments for ``case`` with one thing made illegal."""
    t, m, k = case["t"], case["m"], case["k"]
    kind = case["kind"]
    x = a["x"]

    def arr(v: np.ndarray) -> Any:
        return torch.from_numpy(v) if kind == "torch" else v

    kw = dict(values=a["weight"].values, meta=a["weight"].meta, x=x, bias=a["bias"], activation=case["act"],
              scale_x=a["scale_x"], scale_w=a["scale_w"], out_dtype=case["out_dtype"], out=a["out"],
              split_k=case["split"], kernel=case["kernel"])
    y_shape = (t, m // 2 if case["act"] in GATED_ACTIVATIONS else m)
    if mutation == "x_k":
        kw["x"] = arr(np.zeros((t, k + 4), np.float16))
    elif mutation == "x_1d":
        kw["x"] = arr(np.zeros(k, np.float16))
    elif mutation == "x_3d":
        kw["x"] = arr(np.zeros((1, t, k), np.float16))
    elif mutation == "x_complex":
        kw["x"] = arr(np.zeros((t, k), np.complex64))
    elif mutation == "x_list":
        kw["x"] = [[0.0] * k] * t
    elif mutation == "bias_shape":
        kw["bias"] = arr(np.zeros(m + 1, np.float32))
    elif mutation == "bias_int":
        kw["bias"] = arr(np.zeros(m, np.int32))
    elif mutation == "scale_x_shape":
        kw["scale_x"] = arr(np.ones(t + 2, np.float32))
    elif mutation == "scale_w_shape":
        kw["scale_w"] = arr(np.ones((m, 2), np.float32))
    elif mutation == "out_shape":
        kw["out"] = arr(np.zeros((y_shape[0] + 1, y_shape[1]), np.float32))
        kw["out_dtype"] = "float32"
    elif mutation == "out_dtype_of_out":
        kw["out"] = arr(np.zeros(y_shape, np.float64))
    elif mutation == "out_read_only":
        if kind == "torch":
            return mutated(case, a, "out_shape")
        kw["out"] = np.zeros(y_shape, np.float32)
        kw["out"].flags.writeable = False
        kw["out_dtype"] = "float32"
    elif mutation == "out_overlapping":  # rows sharing memory (stride 0)
        if t < 2 or y_shape[1] == 0:
            return mutated(case, a, "out_shape")
        kw["out"] = (np.zeros((1, y_shape[1]), np.float32) if kind == "numpy" else torch.zeros((1, y_shape[1])))
        kw["out"] = np.broadcast_to(kw["out"], y_shape) if kind == "numpy" else kw["out"].expand(y_shape)
        kw["out_dtype"] = "float32"
    elif mutation in BAD_SPLIT_K:
        kw["split_k"] = BAD_SPLIT_K[mutation]
    elif mutation == "kernel":
        kw["kernel"] = "tiled"
    elif mutation == "activation":
        kw["activation"] = "gelu"
    elif mutation == "out_dtype":
        kw["out_dtype"] = "int8"
    elif mutation == "e4m3_x_for_16_bit_with_scale":
        if case["dtype"] != "e4m3":
            return mutated(case, a, "x_k")
        kw["x"] = arr(np.zeros((t, k), np.float16))
        kw["scale_x"] = 1.0
    elif mutation == "gated_rows":  # a gated activation over rows that do not split into 16-row halves
        if m % 32 == 0 or not t:
            return mutated(case, a, "activation")
        kw["activation"] = "swiglu"
        kw["out"] = None
    elif mutation == "meta_words":  # raw words of the wrong shape
        kw["meta"] = np.zeros((3, 5), np.uint32)
    elif mutation == "values_shape":  # values of the dense weight's shape, not the compressed one
        kw["values"] = arr(np.zeros((m, k + 8), np.float16))
    return kw


@SETTINGS
@given(case=linear_call(), mutation=st.sampled_from(MUTATIONS))
def test_illegal_arguments_raise_a_sparsile_diagnostic(case: dict[str, Any], mutation: str) -> None:
    a = build(case)
    kw = mutated(case, a, mutation)
    try:
        sparse_linear(kw.pop("values"), kw.pop("meta"), kw.pop("x"), interpret=True, **kw)
    except SparsileError as e:
        assert e.code.startswith("SP"), e
        return
    pytest.fail(f"{mutation}: no diagnostic")
