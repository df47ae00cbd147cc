"""Building a fused group of ``fuse_projections_`` (fuse.py): which sibling :class:`.SparseLinear`
layers fit together (:func:`mismatch`), and the fused layer over the row-concatenation of their
buffers, whose row slices the members then hold as views (:func:`fuse_group`). Concatenating the
"sm90" metadata words of the members gives the metadata of the concatenated weight because each
block of 16 rows is encoded on its own (docs/sparse-metadata.md §4)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .glu import ROW_ALIGN
from .linear import SparseLinear
from .projection_group import BUFFER_NAMES, ProjectionGroup
from .weight_versions import note_shared_weight


def mismatch(children: Sequence[tuple[str, nn.Module]]) -> str | None:
    """Why these named children cannot be fused, or None."""
    seen: dict[int, str] = {}
    for name, m in children:
        if id(m) in seen:
            return f"{name} is the same module as {seen[id(m)]}"
        seen[id(m)] = name
        if type(m) is not SparseLinear:
            return f"{name} is a {type(m).__name__}, not a SparseLinear"
        if m.activation is not None:
            return f"{name} fuses activation {m.activation!r}"
        if m._buffers.get("input_scale") is not None:
            return (f"{name} has a static input scale (input_scale; the fused layer quantizes x per token, or with "
                    "one scale for all its rows)")
        if m.out_features % ROW_ALIGN:
            return (f"{name} has out_features = {m.out_features}, not a multiple of {ROW_ALIGN} (its metadata rows "
                    "would not be a slice of the fused layer's)")
        if "_fused" in m.__dict__:
            return f"{name} is already fused"
        if m.values.device.type == "meta":
            return f"{name} is on the meta device (no weights yet)"
        other = next((what for what in BUFFER_NAMES[1:] if getattr(m, what) is not None
                      and getattr(m, what).device != m.values.device), None)
        if other is not None:  # (a model loaded or moved in part: the concatenation would raise midway)
            return f"{name} has its {other} on {getattr(m, other).device} but its values on {m.values.device}"
        if not all(t is None or t.is_contiguous() for t in (m.values, m.meta, m.bias, m.scale_w)):
            return f"{name} has non-contiguous buffers"
        trained = [what for what in BUFFER_NAMES if getattr(m, what) is not None and getattr(m, what).requires_grad]
        if trained:
            return (f"{name}'s {trained[0]} requires grad (the fused layer's buffers are other tensors: its gradient "
                    "would not reach it)")
        made = [what for what in BUFFER_NAMES if what in m._parameters]
        if made:
            return (f"{name}'s {made[0]} is an nn.Parameter (the fused layer's buffers are other tensors: fusing "
                    "would replace it by a view of them, which a parameter cannot be)")
        for what, vector in (("bias", m.bias), ("scale_w", m.scale_w)):  # a per-tensor scale_w (1,) is no row
            if vector is not None and tuple(vector.shape) != (m.out_features,):  # slice of a concatenation
                return (f"{name} has {what} of shape {tuple(vector.shape)}, not one value per output feature "
                        f"({m.out_features},)")
    (first_name, first), rest = children[0], children[1:]
    for name, m in rest:
        for what, a, b in (("in_features", m.in_features, first.in_features),
                           ("weight dtype", m.weight_dtype, first.weight_dtype),
                           ("device", m.values.device, first.values.device),
                           ("out_dtype", m.out_dtype, first.out_dtype),
                           ("bias", m.bias is not None, first.bias is not None)):
            if a != b:
                return f"{name} has {what} {a} but {first_name} has {b}"
    return None


def counted() -> torch.inference_mode:
    """Outside ``torch.inference_mode()``, where the fused buffers and the members' views of them are made
    (:func:`fuse_group`): made inside it, they were inference tensors, which keep no version counter, so a
    write to a member's weight between two sibling calls of one x went unseen (run_stamp.counter read -1
    for every one) and the sibling was served its columns of the old weight. Normal tensors count writes
    in inference mode too (an in-place write there bumps their counter), and the code that fuses reads them
    there as it reads inference tensors (inference tensors may be read outside it: the concatenation of the
    members' is a normal tensor)."""
    return torch.inference_mode(False)


def mark_static(fused: SparseLinear) -> None:
    """The fused buffers belong to no registered module: tell torch.compile's CUDA graph trees their
    addresses are fixed (else reduce-overhead would copy the weight into the graph on every replay)."""
    for name in BUFFER_NAMES:
        if getattr(fused, name) is not None:
            torch._dynamo.mark_static_address(getattr(fused, name))


def fused_buffers(members: Sequence[SparseLinear]) -> dict[str, torch.Tensor]:
    """The row-concatenation of ``members``' buffers (values, meta, bias, scale_w where they have them):
    normal tensors, under ``torch.inference_mode()`` too (:func:`counted`)."""
    with torch.no_grad(), counted():
        return {name: torch.cat([getattr(m, name) for m in members]) for name in BUFFER_NAMES
                if getattr(members[0], name) is not None}


def fuse_group(members: Sequence[SparseLinear], traced: bool = False, names: Sequence[str] = ()) -> ProjectionGroup:
    """Fuse ``members`` (checked by :func:`mismatch`): the fused layer, the members' buffers made
    views of its buffers, the members attached. ``names``: the members' paths in the model, which the
    backward's refusal of a weight written since the forward names (weight_versions.py: the views share
    one version counter, so a write to one member counts for every member and the fused layer)."""
    first = members[0]
    n = sum(m.out_features for m in members)
    fused = SparseLinear(first.in_features, n, first.bias is not None, dtype=first.weight_dtype,
                         out_dtype=first.out_dtype, device="meta")
    buffers = fused_buffers(members)  # (the one step that allocates: before any member changes)
    with torch.no_grad(), counted():  # (the members' views of normal tensors: normal tensors, which count writes)
        for name, whole in buffers.items():
            setattr(fused, name, whole)
        start = 0
        for m in members:
            end = start + m.out_features
            for name in BUFFER_NAMES:
                whole = getattr(fused, name)
                if whole is not None:
                    setattr(m, name, whole[start:end])  # a view; SparseLinear.__setattr__ drops its launch records
            start = end
    if names:
        note_shared_weight(fused, tuple(names), None)
        for i, m in enumerate(members):
            note_shared_weight(m, tuple(names), i)
    if traced:
        mark_static(fused)
    group = ProjectionGroup(fused, members, traced)
    group.attach()
    return group

