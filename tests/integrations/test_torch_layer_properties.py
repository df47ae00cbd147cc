"""Property tests (hypothesis) of sparsile.torch's SparseLinear on the CPU (the kernels in the
interpreter) against float64.

Drawn: the weight type (bf16, f16, e4m3 with its per-channel scales) and the linear's own dtype,
ragged shapes (N and K not multiples of 16 or 64), x's dtype (bf16, f16, f32), N-D x (..., K) with
T = 0 and 1 among the token counts, x's layout (a transposed view, sliced columns, a storage offset,
one row of a wider tensor as ``hidden[:, -1, :]`` gives it, stride-0 rows), bias present or not, the
activation, out_dtype, the kernel (decode, or the tiled kernels with SPARSILE_DECODE_KERNEL=0), and x
with or without requires_grad (the autograd path).

The reference is float64 from the layer's own pruned dense weight (``to_dense()``) and x as the
kernel multiplies it: cast to the weight's type, or for e4m3 quantized per token as docs/torch.md
says (tests/support/linear_reference.quantize_e4m3_model); the bound is that module's."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.tests.support.linear_reference import assert_matches, quantize_e4m3_model

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
LAYOUTS = ("contiguous", "transposed", "columns", "offset", "last_row", "broadcast")


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A view with ``x``'s values (..., K) in ``layout``."""
    k = x.shape[-1]
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "columns":
        wide = torch.zeros((*x.shape[:-1], 2 * k + 1), dtype=x.dtype)
        wide[..., 1::2] = x
        return wide[..., 1::2]
    if layout == "offset":
        buf = torch.zeros(x.numel() + x.numel() // max(k, 1) * 3 + 1, dtype=x.dtype)
        view = buf[1:1 + x.numel() // max(k, 1) * (k + 3)].view(*x.shape[:-1], k + 3)[..., :k]
        view.copy_(x)
        return view
    if layout == "last_row" and x.dim() >= 2:  # x[..., t, :] of a (..., t + 2, K) tensor: a row stride of (t+2)K
        wide = torch.zeros((*x.shape[:-2], x.shape[-2] + 2, k), dtype=x.dtype)
        wide[..., 2:, :] = x
        return wide[..., 2:, :]
    return x


@st.composite
def layer_call(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(("bf16", "f16", "e4m3")))
    linear_dtype = draw(st.sampled_from(("bf16", "f16", "f32"))) if dtype == "e4m3" else draw(
        st.sampled_from((dtype, "f32")))
    k = draw(st.one_of(st.integers(1, 160), st.sampled_from((64, 128, 256))))
    n = draw(st.integers(1, 100))
    lead = draw(st.sampled_from(((), (0,), (1,), (3,), (1, 1), (2, 3), (4, 1), (2, 0, 3), (1, 33), (2, 17))))
    return dict(dtype=dtype, linear_dtype=linear_dtype, k=k, n=n, lead=lead,
                x_dtype=draw(st.sampled_from(("bf16", "f16", "f32"))),
                layout=draw(st.sampled_from(LAYOUTS)), bias=draw(st.booleans()),
                act=draw(st.sampled_from((None, "relu", "silu", "gelu_tanh"))),
                out_dtype=draw(st.sampled_from((None, "bf16", "f16", "f32"))),
                tiled=draw(st.booleans()), grad=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


def run_layer_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0" if case["tiled"] else "1")
    gen = torch.Generator().manual_seed(case["seed"])
    k, n = case["k"], case["n"]
    dense = torch.nn.Linear(k, n, bias=case["bias"])
    with torch.no_grad():
        dense.weight.copy_(torch.randn(n, k, generator=gen) * (2 / k ** 0.5))
        if case["bias"]:
            dense.bias.copy_(torch.randn(n, generator=gen))
    dense = dense.to(DTYPES[case["linear_dtype"]])
    out_dtype = DTYPES[case["out_dtype"]] if case["out_dtype"] else None
    dtype = None if case["dtype"] == case["linear_dtype"] else case["dtype"]
    layer = spt.SparseLinear.from_dense(dense, dtype, activation=case["act"], out_dtype=out_dtype)
    x_dtype = DTYPES[case["x_dtype"]]
    x = torch.randn(*case["lead"], k, generator=gen).to(x_dtype)
    if case["layout"] == "broadcast" and x.dim() >= 2 and x.shape[-2]:
        x = x[..., :1, :].expand(x.shape)  # stride-0 rows
    else:
        x = laid_out(x, case["layout"])
    if case["grad"]:
        x.requires_grad_(True)
    y = layer(x)
    want_dtype = out_dtype or x_dtype
    assert y.dtype == want_dtype and y.shape == (*case["lead"], n)
    x2 = x.detach().reshape(-1, k).to(torch.float64).numpy()
    if case["dtype"] == "e4m3":
        xk, sx = quantize_e4m3_model(x.detach().reshape(-1, k).float().numpy())
    else:
        xk, sx = x.detach().reshape(-1, k).to(DTYPES[case["dtype"]]).double().numpy(), None
    assert x2.shape == xk.shape
    w = layer.to_dense().double().numpy()
    bias = None if layer.bias is None else layer.bias.double().numpy()
    assert_matches(y.detach().reshape(-1, n), w, xk, sx, None, bias, case["act"] or "none", NAMES[want_dtype],
                   case["dtype"] == "e4m3")
    if case["grad"] and y.numel():
        y.float().sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=layer_call())
def test_sparse_linear_layer_matches_float64(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    run_layer_case(case, monkeypatch)
