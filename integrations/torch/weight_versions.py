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
_SHARED = "_weight_shared"
"""A layer's ``__dict__`` key: (the member paths of its ``fuse_projections_`` group, its index among them
or None for the group's fused layer), :func:`note_shared_weight`."""


def note_shared_weight(layer: Any, names: tuple[str, ...], index: int | None) -> None:
    """Note that ``layer``'s weight is one with the weights of the ``fuse_projections_`` members ``names``
    (their paths in the model): ``index`` is the layer's among them, None for the group's fused layer,
    whose buffers the members' are row views of. Views share their base's version counter, so a write to
    one member moves every member's counter and the fused layer's: :func:`check_unwritten` says so."""
    layer.__dict__[_SHARED] = (names, index)


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
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: {_whose(layer, name, t)} [{t.dtype} {list(t.shape)}] is at version {t._version}; "
                f"expected version {then} instead (written in place between the layer's forward and this backward, "
                "which would compute x's gradient with the new weight). Hint: write the weight after backward() "
                "(an optimizer step), or call the layer again after the write")


def _whose(layer: Any, name: str, t: torch.Tensor) -> str:
    """The tensor ``name`` of ``layer`` in the refusal's words: "the SparseLinear's values", or, for a
    layer of a ``fuse_projections_`` group (:func:`note_shared_weight`), the members whose weights share
    the tensor's version counter, since a write to any of them moved it (which one cannot be told)."""
    owner = getattr(layer, "_user_name", None) or type(layer).__name__
    shared = layer.__dict__.get(_SHARED)
    if shared is None:
        return f"the {owner}'s {name}"
    names, index = shared
    members = ", ".join(names)
    if index is None:  # the group's fused layer: the members' buffers are views of its own
        return (f"the {name} of the {owner} that fuse_projections_ made of {members} (their {name} are views of "
                f"it, so a write to any of them counts)")
    if not t._is_view():  # (its buffer replaced since the group was made: its own counter)
        return f"the {owner}'s {name} ({names[index]})"
    siblings = ", ".join(n for i, n in enumerate(names) if i != index)
    return (f"the {names[index]}'s {name}, a view of the weight fuse_projections_ fused of {members}, which share "
            f"one version counter (written in place there or in a sibling's: {siblings})")
