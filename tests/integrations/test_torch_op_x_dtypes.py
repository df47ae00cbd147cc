"""``torch.ops.sparsile.sparse_linear`` takes x of another floating dtype than its 16-bit weight
(bf16, f16 or float32 x) and casts it inside, as ``sparse_linear_e4m3`` quantizes inside: a traced
bf16 / f16 ``SparseLinear`` (torch.compile, torch.export) given a float32 x passes x uncast, so that
x's gradient is the eager layer's, float32 (before, the trace cast x to the weight's dtype before the
op, and x's gradient was rounded to bf16, about 2^-8 of it off the eager one; docs/torch.md, "Gradients")."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import activation_fn, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

_PRE_GRAD = {"silu": lambda p: torch.sigmoid(p) * (1 + p * (1 - torch.sigmoid(p)))}


def _reference(layer, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, dx) in float64 of the documented formulas: y = act(x_w @ Wᵀ + bias) for x_w, x rounded to the
    weight's dtype (the kernel's operand), dx = (g * act'(pre)) @ W in x's precision (no rounding of dx to
    the weight's dtype)."""
    w = layer.to_dense().double()
    pre = x.detach().to(layer.values.dtype).double() @ w.T + layer.bias.double()
    y = activation_fn(layer.activation, pre)
    d_pre = g.double() if layer.activation is None else g.double() * _PRE_GRAD[layer.activation](pre)
    return y, d_pre @ w


def _runs(layer, x: torch.Tensor, g: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(y, x.grad) of the eager layer, torch.compile(fullgraph, aot_eager) and torch.export's module."""
    model = torch.nn.Sequential(layer)  # (an exported root module's buffer "meta" meets GraphModule.meta)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    exported = torch.export.export(model, (x.detach().clone().requires_grad_(),)).module()
    out = {}
    for name, model in (("eager", layer), ("compiled", compiled), ("exported", exported)):
        xi = x.detach().clone().requires_grad_()
        y = model(xi)
        y.backward(g)
        out[name] = (y.detach(), xi.grad)
    return out


@pytest.mark.parametrize("weight", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_a_float32_x_gets_the_same_float32_gradient_eager_compiled_and_exported(weight, activation):
    gen = torch.Generator().manual_seed(11)
    layer = spt.SparseLinear.from_dense(linear(48, 64, dtype=weight, seed=12), activation=activation,
                                        out_dtype=torch.float32)
    x = torch.randn(2, 3, 64, generator=gen)
    g = torch.randn(2, 3, 48, generator=gen)
    want_y, want_dx = _reference(layer, x, g)
    runs = _runs(layer, x, g)
    eager_y, eager_dx = runs["eager"]
    for name, (y, dx) in runs.items():
        assert y.dtype == torch.float32 and dx.dtype == torch.float32, name
        assert torch.equal(y, eager_y), name  # the forward's values as the eager call's
        assert torch.equal(dx, eager_dx), name  # (before: compiled and exported dx rounded to the weight's dtype)
        scale = want_dx.abs().max().item()
        # float32 accumulation of K = 64 products (a bf16 dx is 2^-9 off: far outside)
        assert torch.allclose(dx.double(), want_dx, rtol=2 ** -16, atol=2 ** -16 * scale), name
        assert torch.allclose(y.double(), want_y, rtol=2 ** -16, atol=2 ** -16 * want_y.abs().max().item()), name


def test_the_op_casts_a_float32_x_inside_with_the_values_of_the_cast_x():
    """sparse_linear(x float32) = sparse_linear(x.to(bf16)) bit for bit (out_dtype given or x's: float32),
    real and fake; x's gradient float32; opcheck passes for the float32 x."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=13), activation="relu")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(14))
    args = (layer.values, layer.meta, layer.bias)
    for out in (None, torch.float32, torch.bfloat16):
        want = torch.ops.sparsile.sparse_linear(x.to(torch.bfloat16), *args, activation="relu",
                                                out_dtype=out or torch.float32)
        got = torch.ops.sparsile.sparse_linear(x, *args, activation="relu", out_dtype=out)
        assert got.dtype == (out or torch.float32) and torch.equal(got, want)
    with FakeTensorMode(allow_non_fake_inputs=True):
        y = torch.ops.sparsile.sparse_linear(torch.empty(4, 64, dtype=torch.float16), *args)
        assert (y.shape, y.dtype) == ((4, 32), torch.float16)
    xg = x.clone().requires_grad_()
    torch.ops.sparsile.sparse_linear(xg, *args).sum().backward()
    assert xg.grad.dtype == torch.float32
    want = layer.to_dense().double().sum(0).expand(3, -1)
    assert torch.allclose(xg.grad.double(), want, rtol=2 ** -16, atol=2 ** -16 * want.abs().max().item())
    for xo in (x, x.clone().requires_grad_()):
        torch.library.opcheck(torch.ops.sparsile.sparse_linear.default, (xo, *args), {"activation": "relu"})


def test_x_of_another_dtype_is_still_refused_where_it_has_no_meaning():
    """fp8 x for a 16-bit weight, a 16-bit or float32 x for e4m3 values, an integer or float64 x: SP0901."""
    bf16 = spt.SparseLinear.from_dense(linear(32, 64, seed=15))
    fp8 = spt.SparseLinear.from_dense(linear(32, 64, seed=15), "e4m3")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(16))
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    cases = [
        ((xq, bf16.values, bf16.meta), {}, "x has dtype torch.float8_e4m3fn but the weight is torch.bfloat16: x is "
         "bfloat16, float16 or float32, cast to the weight's type inside"),
        ((x.double(), bf16.values, bf16.meta), {}, "x has dtype torch.float64 but the weight is torch.bfloat16: x "
         "is bfloat16, float16 or float32, cast to the weight's type inside"),
        ((x.to(torch.int32), bf16.values, bf16.meta), {}, "x has dtype torch.int32 but the weight is "
         "torch.bfloat16: x is bfloat16, float16 or float32, cast to the weight's type inside"),
        ((x, fp8.values, fp8.meta), {"scale_x": sx, "scale_w": fp8.scale_w}, "x has dtype torch.float32 but the "
         "weight is torch.float8_e4m3fn: x is float8_e4m3fn, quantized with its scale_x"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(Exception) as caught:
            torch.ops.sparsile.sparse_linear(*args, **kwargs)
        assert caught.value.code == "SP0901"
        assert caught.value.message == f"sparsile.sparse_linear: {message}"


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("static", [False, True])
def test_an_e4m3_model_exported_with_an_x_without_grad_gives_x_its_gradient_later(strict, static):
    """torch.export's program runs under autograd whatever the example x required at export time (aten
    ops are recorded, not their gradients): an e4m3 layer exported traces ``sparse_linear_e4m3`` whether
    or not x requires grad (as torch.fx.symbolic_trace does), so the program later run with an x that
    requires grad gives it the eager straight-through gradient (before, an x without grad at export time
    left quantize_per_token_e4m3 then sparse_linear in the program: SP0922 at backward()), and an x
    without grad the same y as before, bit for bit."""
    gen = torch.Generator().manual_seed(27)
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=28), "e4m3", activation="relu")
    if static:
        layer.input_scale = torch.full((1,), 0.02)
    model = torch.nn.Sequential(layer)
    x = torch.randn(2, 3, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(2, 3, 48, generator=gen).to(torch.bfloat16)
    program = torch.export.export(model, (x,), strict=strict)
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "sparsile.sparse_linear_e4m3.default" in targets and "sparsile.quantize_per_token_e4m3.default" \
        not in targets
    exported = program.module()
    assert torch.equal(exported(x), model(x))  # (the two ops' numbers)
    grads = []
    for run in (model, exported):
        xi = x.clone().requires_grad_()
        run(xi).backward(g)
        grads.append(xi.grad)
    assert grads[0].dtype == torch.bfloat16 and torch.equal(grads[1], grads[0])
