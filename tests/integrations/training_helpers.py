"""Shared pieces of the sparse-training tests (CPU and GPU): a float64 comparison with an error
bound, and the masked weight as the kernel sees it."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import EPS

torch = pytest.importorskip("torch")

U = 2.0 ** -23
"""f32 accumulation, per term."""


def within(got: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor, terms: int, dtype: torch.dtype) -> None:
    """|got - ref| <= rounding to ``dtype`` + f32 accumulation of ``terms`` products (``magnitude``
    is the product of the absolute values)."""
    assert got.shape == ref.shape and torch.isfinite(got).all()
    bound = EPS[dtype] * ref.abs() + 1.2 * terms * U * magnitude + 1e-6
    err = (got.double() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3f}"


def bf16(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16, as float64."""
    return t.detach().to(torch.bfloat16).double()


def masked_weight(layer) -> torch.Tensor:
    """weight * mask of a SemiSparseLinear as the kernel sees it (cast to the compute dtype), float64."""
    return layer.weight.detach().to(layer.values.dtype).double() * layer.mask


class DenseMasked(torch.nn.Module):
    """Dense training with a fixed mask: F.linear in bf16 of (weight * mask), the bias added in f32,
    master weights in their own dtype (the reference of the loss-equality tests)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor):
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(bias.clone())
        self.register_buffer("mask", mask.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = (self.weight * self.mask).to(torch.bfloat16)
        return torch.nn.functional.linear(x.to(torch.bfloat16), w).float() + self.bias


class Mlp(torch.nn.Module):
    """b(relu(a(x)))."""

    def __init__(self, a: torch.nn.Module, b: torch.nn.Module):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def train_pair(sparse: torch.nn.Module, dense: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int,
               lr: float) -> tuple[list[float], list[float]]:
    """Losses of ``steps`` SGD (momentum 0.9) steps of both models on the mean squared error; the
    sparse model's compressions follow its optimizer through a SparseTrainer."""
    import sparsile.torch as spt

    opt_s = torch.optim.SGD(sparse.parameters(), lr=lr, momentum=0.9)
    opt_d = torch.optim.SGD(dense.parameters(), lr=lr, momentum=0.9)
    trainer = spt.SparseTrainer(sparse, opt_s)
    losses: tuple[list[float], list[float]] = ([], [])
    for _ in range(steps):
        for model, opt, out in ((sparse, opt_s, losses[0]), (dense, opt_d, losses[1])):
            opt.zero_grad()
            loss = ((model(x) - target) ** 2).mean()
            loss.backward()
            opt.step()
            out.append(loss.item())
    trainer.remove()
    return losses
