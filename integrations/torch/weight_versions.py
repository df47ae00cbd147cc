"""The version counters of a frozen sparse layer's weight between its forward and its backward.

``autograd.LayerWithInputGrad`` does not save the layer's weight (values, meta, scale_w) for the
backward: a saved-tensor hook (CPU offload, activation checkpointing) would copy the whole weight per
call. It notes their version counters instead, and its backward refuses a weight written in place
since the forward with torch's own RuntimeError, as torch refuses a saved tensor written in place
(``nn.Linear``'s weight, the custom op's saved tensors): x's gradient would be the new weight's.

Not while dynamo traces the backward (torch.compile's compiled autograd): a version counter is an
unbacked SymInt to it, and comparing one stopped a ``fullgraph=True`` compiled backward at torch's
"Could not guard on data-dependent expression" (functionalization drops version reads from the
graph, so no runtime check could be traced either). There, as before the check existed, a weight
written between the forward and the backward is not detected (docs/torch.md, "Gradients").
"""

from __future__ import annotations

from typing import Any

import torch

_WEIGHT_NAMES = ("values", "meta", "scale_w")


def weight_versions(weight: tuple[torch.Tensor | None, ...]) -> tuple[int | None, ...]:
    """The version counters of a layer's (values, meta, scale_w) at its forward (None: no tensor,
    or an inference tensor, which keeps none)."""
    return tuple(None if t is None or t.is_inference() else t._version for t in weight)


def check_unwritten(layer: Any, weight: tuple[torch.Tensor | None, ...], versions: tuple[int | None, ...]) -> None:
    """torch's RuntimeError, in its words, where one of ``weight`` (values, meta, scale_w) was written in
    place since its forward (``versions``: :func:`weight_versions`): the backward would compute x's
    gradient with the new weight. Nothing while dynamo traces (see the module docstring)."""
    if torch.compiler.is_compiling():
        return
    for name, t, then in zip(_WEIGHT_NAMES, weight, versions, strict=True):
        if then is not None and t._version != then:
            owner = getattr(layer, "_user_name", None) or type(layer).__name__
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: the {owner}'s {name} [{t.dtype} {list(t.shape)}] is at version {t._version}; expected "
                f"version {then} instead (written in place between the layer's forward and this backward, which "
                "would compute x's gradient with the new weight). Hint: write the weight after backward() (an "
                "optimizer step), or call the layer again after the write")
