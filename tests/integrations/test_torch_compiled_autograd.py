"""The backward of a frozen sparse layer's call under torch.compile's compiled autograd
(``torch._dynamo.compiled_autograd``), on the CPU: dynamo traces the autograd graph's Python
backward functions, ``LayerWithInputGrad``'s included. Its weight version check (weight_versions.py)
read ``t._version``, an unbacked SymInt to dynamo: with ``fullgraph=True`` the backward stopped at
torch's "Could not guard on data-dependent expression" (it ran before the check was added). The
ops' formulas (``_SingleLevelFunction``s) had no ``_compiled_autograd_key``: torch's AttributeError
for any backward through an op called directly."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")


def _x_grad(forward, x0, g, compiled: bool, fullgraph: bool = True):
    """x's gradient of ``(forward(x).float() * g).sum()``, the backward eager or under compiled autograd."""
    x = x0.clone().requires_grad_()
    loss = (forward(x).float() * g).sum()
    if compiled:
        with compiled_autograd._enable(torch.compile(backend="eager", fullgraph=fullgraph)):
            loss.backward()
    else:
        loss.backward()
    return x.grad


@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_compiled_autograd_fullgraph_backward_gives_the_eager_gradient(weight):
    """x's gradient through a SparseLinear without an activation, the backward compiled with
    fullgraph=True, equals the eager backward's (the same formula: dy @ W in float32), and both
    match a float64 reference within the rounding of dx to bf16."""
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=3), weight)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(4, 32, generator=gen)

    eager = _x_grad(layer, x0, g, False)
    compiled = _x_grad(layer, x0, g, True)  # (x.grad starts as None: a backward that wrote nothing fails below)
    assert torch.equal(compiled, eager)
    ref = g.double() @ layer.to_dense().double()
    err = (compiled.double() - ref).abs().max().item()
    assert err <= 1.5 * 2.0 ** -8 * ref.abs().max().item(), err


def _activation64(activation: str | None, pre: torch.Tensor) -> torch.Tensor:
    """The activation in float64 (the gated ones: act(gate) * up of pre = [gate, up])."""
    acts = {None: lambda t: t, "relu": torch.relu, "silu": torch.nn.functional.silu,
            "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    if activation in acts:
        return acts[activation](pre)
    f = pre.shape[1] // 2
    return acts["silu" if activation == "swiglu" else "gelu_tanh"](pre[:, :f]) * pre[:, f:]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize(("weight", "activation"), [
    ("bf16", None), ("bf16", "relu"), ("bf16", "silu"), ("bf16", "gelu_tanh"), ("bf16", "swiglu"), ("bf16", "geglu"),
    ("e4m3", None), ("e4m3", "silu")])
def test_the_op_called_directly_under_compiled_autograd_gives_the_eager_gradient(weight, activation, fullgraph):
    """The op's Autograd formula is a ``_SingleLevelFunction``, which had no
    ``_compiled_autograd_key``: a backward through it under compiled autograd stopped at torch's
    AttributeError. Then its backward was disabled for dynamo, a graph break: ``fullgraph=True`` stopped
    at torch's "Skip calling `torch.compiler.disable()`d function". Now dynamo traces the formula into
    the compiled backward (an activation's derivative by the aten kernels torch's autograd runs: its
    ``torch.autograd.grad`` stopped a fullgraph trace too), and the gradient is the eager backward's."""
    torch._dynamo.reset()
    n = 64 if activation in ("swiglu", "geglu") else 32
    layer = spt.SparseLinear.from_dense(linear(n, 64, seed=5), weight)
    gen = torch.Generator().manual_seed(6)
    x0 = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(4, n // 2 if activation in ("swiglu", "geglu") else n, generator=gen)
    e4m3 = weight == "e4m3"

    def op(x: torch.Tensor, **kw) -> torch.Tensor:
        if e4m3:
            return torch.ops.sparsile.sparse_linear_e4m3(x, layer.values, layer.meta, layer.bias, layer.scale_w, **kw)
        return torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, **kw)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return op(x, activation=activation)

    eager = _x_grad(forward, x0, g, False)
    compiled = _x_grad(forward, x0, g, True, fullgraph)  # (x.grad starts as None: a no-op backward fails below)
    assert torch.equal(compiled, eager)
    pre = op(x0, out_dtype=torch.float32).double().requires_grad_()
    (d_pre,) = torch.autograd.grad(_activation64(activation, pre), pre, g.double())
    ref = d_pre @ layer.to_dense().double()
    err = (compiled.double() - ref).abs().max().item()
    assert err <= 1.5 * 2.0 ** -8 * ref.abs().max().item(), err


@pytest.mark.parametrize("activation", ["relu", "silu", "gelu_tanh"])
def test_a_layer_with_an_activation_under_fullgraph_compiled_autograd_gives_the_eager_gradient(activation):
    """The eager layer's backward (``LayerWithInputGrad``) differentiates its activation with
    ``torch.autograd.grad``, which stopped a ``fullgraph=True`` compiled backward; now the aten kernels."""
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=9), "bf16", activation=activation)
    gen = torch.Generator().manual_seed(10)
    x0 = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(4, 32, generator=gen)

    eager = _x_grad(layer, x0, g, False)
    compiled = _x_grad(layer, x0, g, True)
    assert torch.equal(compiled, eager)
    with torch.no_grad():
        layer.activation, layer.out_dtype = None, torch.float32  # (the float32 pre-activations)
        pre = layer(x0).double().requires_grad_()
        layer.activation, layer.out_dtype = activation, None
    (d_pre,) = torch.autograd.grad(_activation64(activation, pre), pre, g.double())
    ref = d_pre @ layer.to_dense().double()
    err = (compiled.double() - ref).abs().max().item()
    assert err <= 1.5 * 2.0 ** -8 * ref.abs().max().item(), err


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("through", ["sparse_linear", "quantizer"])
def test_an_fp8_x_s_gradient_under_compiled_autograd_is_sp0922(through, fullgraph):
    """The fp8 x of quantize_per_token_e4m3 has no gradient: SP0922 under compiled autograd as in
    eager (before, torch's AttributeError: the formulas had no ``_compiled_autograd_key``), whether
    the backward reaches sparse_linear's formula or the quantizer's. With ``fullgraph=True`` dynamo's
    error caused by it, as for the layers' errors (traced_errors.py; before, sparse_linear's formula was
    a graph break there: "Skip calling `torch.compiler.disable()`d function")."""
    from sparsile.integrations.errors import IntegrationError

    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=7), "e4m3")
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16).requires_grad_()
    xq, sx = torch.ops.sparsile.quantize_per_token_e4m3(x)
    if through == "sparse_linear":
        out = torch.ops.sparsile.sparse_linear(xq, layer.values, layer.meta, layer.bias, sx, layer.scale_w)
        said = "sparse_linear has no gradient for an fp8 x"
    else:
        out = xq.float() * sx[:, None]
        said = "sparse_linear has no gradient for x through quantize_per_token_e4m3"
    with pytest.raises(Exception) as info, compiled_autograd._enable(torch.compile(backend="eager",
                                                                                 fullgraph=fullgraph)):
        out.float().sum().backward()
    ours = info.value.__cause__ if fullgraph else info.value
    assert isinstance(ours, IntegrationError) and ours.code == "SP0922"
    assert said in str(ours) and said in str(info.value)
    assert x.grad is None
