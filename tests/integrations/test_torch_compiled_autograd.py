"""The backward of a frozen sparse layer's call under torch.compile's compiled autograd
(``torch._dynamo.compiled_autograd``), on the CPU: dynamo traces the autograd graph's Python
backward functions, ``LayerWithInputGrad``'s included. Its weight version check (weight_versions.py)
read ``t._version``, an unbacked SymInt to dynamo: with ``fullgraph=True`` the backward stopped at
torch's "Could not guard on data-dependent expression" (it ran before the check was added)."""

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
