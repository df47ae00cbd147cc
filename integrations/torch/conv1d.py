"""transformers' ``Conv1D`` (GPT-2, GPT-1, ImageGPT, Decision Transformer, CLVP): a linear layer
whose weight is stored transposed, ``y = x @ W + b`` with ``W`` of shape (in, out). ``sparsify_``
swaps it like an ``nn.Linear`` of weight ``W.T`` (out, in): pruned 2:4 along the input dimension
(K), its bias kept. :func:`linear_of` gives the ``nn.Linear`` it equals, which the skip checks and
``SparseLinear.from_dense`` take.

Only the class ``transformers.pytorch_utils.Conv1D`` itself counts (found in ``sys.modules``, so
that sparsile never imports transformers): a subclass's own forward, hooks or a forward replaced on
the instance are reasons to keep it dense (``sparsify.own_behaviour`` with Conv1D as the base).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

CONV1D_MODULE = "transformers.pytorch_utils"
CONV1D_ORIGIN = "transformers Conv1D"
"""The ``transposed_from`` of a SparseLinear or SemiSparseLinear that ``sparsify_`` made from a Conv1D."""


def conv1d_class() -> type | None:
    """transformers' ``Conv1D`` class where transformers is imported, else None."""
    module = sys.modules.get(CONV1D_MODULE)
    cls = getattr(module, "Conv1D", None)
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def is_conv1d(module: nn.Module) -> bool:
    """``module`` is a transformers ``Conv1D`` (or an instance of a subclass) with a 2-D weight."""
    cls = conv1d_class()
    return cls is not None and isinstance(module, cls) and isinstance(getattr(module, "weight", None), torch.Tensor) \
        and module.weight.dim() == 2


def conv1d_reason(module: nn.Module) -> str | None:
    """Why the Conv1D ``module`` cannot be read as a linear layer (no bias tensor, or a bias of
    another length than its outputs: its forward would fail or broadcast), or None."""
    n = module.weight.shape[1]
    bias = getattr(module, "bias", None)
    if not isinstance(bias, torch.Tensor):
        return "this Conv1D has no bias tensor (its forward, torch.addmm(bias, x, weight), needs one)"
    if tuple(bias.shape) != (n,):
        return f"this Conv1D's bias has shape {tuple(bias.shape)}, not one value per output feature ({n},)"
    return None


def linear_of(module: nn.Module, contiguous: bool = False) -> nn.Linear:
    """An ``nn.Linear`` computing what the Conv1D ``module`` computes: weight ``module.weight.T``
    (a view of it, or a contiguous copy with ``contiguous=True``), the same bias tensor. Not part
    of the model: the skip checks read it, ``SparseLinear.from_dense`` prunes it."""
    k, n = module.weight.shape
    linear = nn.Linear(k, n, bias=True, device="meta")
    weight = module.weight.detach().t()
    linear.weight = nn.Parameter(weight.contiguous() if contiguous else weight, requires_grad=False)
    linear.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
    return linear
