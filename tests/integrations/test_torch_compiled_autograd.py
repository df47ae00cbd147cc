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

    def grad(compiled: bool) -> torch.Tensor:
        x = x0.clone().requires_grad_()
        loss = (layer(x).float() * g).sum()
        if compiled:
            with compiled_autograd._enable(torch.compile(backend="eager", fullgraph=True)):
                loss.backward()
        else:
            loss.backward()
        return x.grad

    eager = grad(False)
    compiled = grad(True)  # (x.grad starts as None: a backward that wrote nothing fails below)
    assert torch.equal(compiled, eager)
    ref = g.double() @ layer.to_dense().double()
    err = (compiled.double() - ref).abs().max().item()
    assert err <= 1.5 * 2.0 ** -8 * ref.abs().max().item(), err


@pytest.mark.parametrize("activation", [None, "relu"])
def test_the_op_called_directly_under_compiled_autograd_gives_the_eager_gradient(activation):
    """The op's Autograd formula is a ``_SingleLevelFunction``, which had no
    ``_compiled_autograd_key``: a backward through it under compiled autograd stopped at torch's
    AttributeError. Now its gradient (the formula run eagerly: its backward is disabled for dynamo,
    a graph break) is the eager backward's."""
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=5))
    gen = torch.Generator().manual_seed(6)
    x0 = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    g = torch.randn(4, 32, generator=gen)

    def grad(compiled: bool) -> torch.Tensor:
        x = x0.clone().requires_grad_()
        y = torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias, activation=activation)
        loss = (y.float() * g).sum()
        if compiled:
            with compiled_autograd._enable(torch.compile(backend="eager")):
                loss.backward()
        else:
            loss.backward()
        return x.grad

    eager = grad(False)
    compiled = grad(True)
    assert torch.equal(compiled, eager)
    pre = torch.ops.sparsile.sparse_linear(x0, layer.values, layer.meta, layer.bias, out_dtype=torch.float32).double()
    d_pre = g.double() * (pre > 0) if activation == "relu" else g.double()
    ref = d_pre @ layer.to_dense().double()
    err = (compiled.double() - ref).abs().max().item()
    assert err <= 1.5 * 2.0 ** -8 * ref.abs().max().item(), err


@pytest.mark.parametrize("through", ["sparse_linear", "quantizer"])
def test_an_fp8_x_s_gradient_under_compiled_autograd_is_sp0922(through):
    """The fp8 x of quantize_per_token_e4m3 has no gradient: SP0922 under compiled autograd as in
    eager (before, torch's AttributeError: the formulas had no ``_compiled_autograd_key``), whether
    the backward reaches sparse_linear's formula or the quantizer's."""
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
    with pytest.raises(IntegrationError) as info, compiled_autograd._enable(torch.compile(backend="eager")):
        out.float().sum().backward()
    assert info.value.code == "SP0922"
    assert said in str(info.value)
    assert x.grad is None
