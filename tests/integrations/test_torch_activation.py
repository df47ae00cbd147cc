"""2:4 activation sparsity on the CPU: sparse24_mask against the toolkit's pruning rule (ties,
zeros, -0), sparse24_activation_linear's output and gradients against float64, and SP0919."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.stdlib.sparsity import as_host_array, prune_mask_2_4
from sparsile.tests.integrations.training_helpers import within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mask_is_the_toolkits_pruning_rule(dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-2, 3, (9, 30), generator=gen).to(dtype)  # ties and zeros everywhere; K % 4 != 0
    x[0, :4] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
    x[1, :4] = torch.tensor([float("nan"), float("inf"), 1.0, float("-inf")])
    host = prune_mask_2_4(as_host_array(x, "x"))
    assert np.array_equal(spt.sparse24_mask(x).numpy(), host)
    assert spt.sparse24_mask(x)[0, :4].tolist() == [True, True, False, False]
    assert spt.sparse24_mask(x)[1, :4].tolist() == [True, True, False, False]


@pytest.mark.parametrize(("x_dtype", "bias"), [(torch.bfloat16, True), (torch.float32, False),
                                               (torch.float32, True)])
def test_activation_linear_and_gradients_against_float64(x_dtype, bias):
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(24, 64, generator=gen).to(torch.bfloat16).requires_grad_()
    b = (torch.rand(24, generator=gen) + 0.5).requires_grad_() if bias else None
    h = torch.randn(2, 3, 64, generator=gen)
    x = (torch.relu(h) ** 2).to(x_dtype).requires_grad_()  # squared-ReLU activations: many zeros
    y = spt.sparse24_activation_linear(x, weight, b)
    assert y.shape == (2, 3, 24) and y.dtype == x_dtype and y.is_contiguous()
    g = torch.randn(y.shape, generator=gen).to(x_dtype)
    y.backward(g)
    xk = x.detach().to(torch.bfloat16).reshape(6, 64)
    mask = torch.from_numpy(prune_mask_2_4(as_host_array(xk, "x")))
    xs, w = xk.double() * mask, weight.detach().double()
    ref = xs @ w.T + (b.detach().double() if bias else 0)
    within(y.reshape(6, 24), ref, xs.abs() @ w.abs().T + (b.detach().double().abs() if bias else 0), 64, x_dtype)
    gk = g.reshape(6, 24).to(torch.bfloat16).double()
    within(x.grad.reshape(6, 64), (gk @ w) * mask, gk.abs() @ w.abs(), 24, torch.bfloat16)
    assert (x.grad.reshape(6, 64)[~mask] == 0).all()
    within(weight.grad, gk.T @ xs, gk.abs().T @ xs.abs(), 6, torch.bfloat16)
    if bias:
        gd = g.double().reshape(6, 24)
        within(b.grad, gd.sum(0), gd.abs().sum(0), 6, torch.float32)


def test_zero_tokens():
    y = spt.sparse24_activation_linear(torch.empty(0, 32), torch.ones(8, 32, dtype=torch.bfloat16))
    assert y.shape == (0, 8) and y.dtype == torch.float32


def _raises(message: str, *args) -> None:
    with pytest.raises(IntegrationError) as info:
        spt.sparse24_activation_linear(*args)
    assert info.value.code == "SP0919" and message in info.value.message, info.value.message


def test_sp0919_arguments_that_do_not_fit():
    w = torch.ones(8, 32, dtype=torch.bfloat16)
    _raises("weight must be a 2-D bfloat16 or float16 (N, K) tensor, got torch.float32 (8, 32)",
            torch.ones(2, 32), w.float())
    _raises("x must be (..., 32) bfloat16, float16 or float32 for a weight (8, 32), got torch.float32 (2, 16)",
            torch.ones(2, 16), w)
    _raises("bias must be a floating (8,) tensor, got torch.float32 (4,)", torch.ones(2, 32), w, torch.ones(4))
    _raises("takes torch tensors x and weight, got list and Tensor", [1.0], w)
    with pytest.raises(IntegrationError) as info:
        spt.sparse24_mask(torch.ones(4, 4))
    assert info.value.code == "SP0919" and "takes bfloat16 or float16 x, got torch.float32" in info.value.message


def test_documented_sp0919_trigger():
    _raises("sparse24_activation_linear: weight must be a 2-D bfloat16 or float16 (N, K) tensor, got torch.float32 "
            "(8, 32)", torch.ones(2, 32), torch.ones(8, 32))
