"""A trainable layer's backward (``SemiSparseLinear``, the op ``sparsile::sparse_linear_train``) under
torch.compile's compiled autograd (``torch._dynamo.compiled_autograd``), on the CPU: x's, the master
weight's and the bias's gradients are the eager backward's, bit for bit, and match a float64 reference.

History: the op's formula (``training._TrainFormula``, a ``_SingleLevelFunction``) had no
``_compiled_autograd_key``, which compiled autograd keys a node's backward by: any backward through a
``SemiSparseLinear`` under compiled autograd stopped at torch's ``AttributeError: type object
'_TrainFormula' has no attribute '_compiled_autograd_key'`` (the inference ops' formulas got theirs in
tests/integrations/test_torch_compiled_autograd.py)."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("mask_grad", [True, False])
def test_a_trainable_layers_gradients_under_compiled_autograd_are_the_eager_ones(fullgraph, mask_grad):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(56)
    x0 = torch.randn(4, 64, generator=gen)
    g = torch.randn(4, 32, generator=gen)

    def grads(compiled: bool) -> dict[str, torch.Tensor]:
        layer = spt.SemiSparseLinear.from_dense(linear(32, 64, torch.float32, seed=5), "bf16")
        layer.mask_grad = mask_grad
        x = x0.clone().requires_grad_()
        loss = (layer(x).float() * g).sum()
        for p in layer.parameters():
            p.grad = None
        if compiled:
            with compiled_autograd._enable(torch.compile(backend="eager", fullgraph=fullgraph)):
                loss.backward()
        else:
            loss.backward()
        return {"x": x.grad, "weight": layer.weight.grad, "bias": layer.bias.grad, "layer": layer}

    eager = grads(False)
    compiled = grads(True)  # (each gradient starts as None: a backward that wrote none fails below)
    for name in ("x", "weight", "bias"):
        assert compiled[name] is not None and torch.equal(compiled[name], eager[name]), name
    layer = compiled["layer"]
    w, gk, xk = masked_weight(layer), bf16(g), bf16(x0)
    within(compiled["x"], gk @ w, gk.abs() @ w.abs(), 32, torch.bfloat16)
    dw = gk.T @ xk
    keep = layer.mask.double() if mask_grad else torch.ones_like(dw)
    within(compiled["weight"], dw * keep, (gk.abs().T @ xk.abs()) * keep, 4, torch.bfloat16)  # (a bf16 GEMM)
    within(compiled["bias"], g.double().sum(0), g.double().abs().sum(0), 4, torch.float32)
