"""Projections that ``sparsify_`` does not swap because they are no ``nn.Linear``: stacked expert
weights (transformers 5's MoE ``*Experts`` modules: one 3-D parameter per projection, a matrix per
expert), and a module named ``Conv1D`` from transformers that is not ``pytorch_utils.Conv1D`` (that
one is swapped: conv1d.py). Listed in the report with what they are and what the user can do, so
that a model whose projections are of such a kind does not come back as "0 swapped" and nothing
more."""

from __future__ import annotations

import torch
from torch import nn

from .conv1d import is_conv1d

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _is_transformers_conv1d(module: nn.Module) -> bool:
    """A transformers ``Conv1D`` (``pytorch_utils.Conv1D``: x @ W + b with W stored (in, out))."""
    cls = type(module)
    weight = getattr(module, "weight", None)
    return (cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")
            and isinstance(weight, torch.Tensor) and weight.dim() == 2)


def _stacked_weights(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The floating-point parameters of 3 or more dimensions ``module`` holds itself (not a
    convolution's kernel): stacked per-expert projection weights."""
    if isinstance(module, CONVOLUTIONS):
        return []
    return [(name, p) for name, p in module.named_parameters(recurse=False)
            if p is not None and p.dim() >= 3 and p.is_floating_point()]


def not_linear_reason(module: nn.Module) -> str | None:
    """Why ``module``, a projection of a kind ``sparsify_`` does not swap, stays dense; None for any
    other module."""
    if isinstance(module, nn.Linear) or is_conv1d(module):  # (a Conv1D is swapped, or skipped with a reason)
        return None
    if _is_transformers_conv1d(module):
        k, n = module.weight.shape
        return (f"{type(module).__module__}.Conv1D ({k} in, {n} out; its weight stored (in, out)) is not "
                "transformers.pytorch_utils.Conv1D, the class sparsify_ swaps (it stays dense)")
    stacked = _stacked_weights(module)
    if stacked:
        shapes = ", ".join(f"{name} {' x '.join(str(d) for d in p.shape)}" for name, p in stacked)
        return (f"{type(module).__name__} holds its projections as stacked {stacked[0][1].dim()}-D weights "
                f"({shapes}: one matrix per expert), not nn.Linear modules, and sparsile has no grouped (per-expert) "
                "kernel: they stay dense, the nn.Linear modules around them are treated as usual (to sparsify the "
                "experts, replace the module by one holding an nn.Linear per expert and projection, weight = the "
                "expert's matrix, with the same routing, then call sparsify_ again)")
    return None


def not_linear_projections(model: nn.Module) -> dict[str, str]:
    """Every projection of ``model`` that is no ``nn.Linear`` (by name), with why it stays dense."""
    found: dict[str, str] = {}
    for fqn, module in model.named_modules():
        reason = not_linear_reason(module)
        if reason is not None:
            found[fqn] = reason
    return found
