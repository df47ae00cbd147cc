"""The weight a ``sparsile.torch`` launch record reads (:class:`Weight`), how a record watches it
for in-place writes (torch's version counters: :func:`tracked_tensors`, :func:`weight_versions`),
and how it tells the weight's own memory from the copies a plan made (:func:`same_memory`,
:func:`same_bytes`, :func:`storage_key`): docs/torch.md, "A weight written in place"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...stdlib.kernels.linear_args import is_gated
from ...stdlib.sparsity import as_host_array, decompress

WEIGHT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn}
"""The weight types a SparseLinear holds, by the sparsity toolkit's operand name."""
NAME_OF = {v: k for k, v in WEIGHT_DTYPES.items()}


def host_dense(values: torch.Tensor, meta: torch.Tensor, m: int, k: int) -> np.ndarray:
    """The (m, k) weight in the values' type on the host, decompressed from values and "sm90"
    metadata words (int32 or uint32; k: the columns the values cover, or fewer)."""
    words = np.ascontiguousarray(as_host_array(meta.detach(), "meta")).view(np.uint32)
    return decompress(as_host_array(values.detach(), "values"), words, "sm90", NAME_OF[values.dtype], m=m, k=k)


@dataclass(frozen=True)
class Weight:
    """The bound (per layer) arguments of the kernel."""

    values: torch.Tensor          # (N, K/2) bf16 / f16 / float8_e4m3fn
    meta: torch.Tensor            # sm90 metadata words, int32
    bias: torch.Tensor | None     # (N,) float32
    scale_w: torch.Tensor | None  # (N,) or (1,) float32, e4m3 weights only
    activation: str | None

    @property
    def out_features(self) -> int:
        """y's columns: the weight's rows, half of them with a gated activation (gate and up rows make
        one output)."""
        rows = int(self.values.shape[0])
        return rows // 2 if is_gated(self.activation) else rows


def tracked_tensors(w: Weight) -> tuple[torch.Tensor, ...] | None:
    """The weight's tensors whose in-place writes a record watches: values, metadata, and the bias
    and scale_w where given (a plan may read converted copies of them) and not inference tensors
    (they keep no version counter); None where values or metadata keep none."""
    if w.values.is_inference() or w.meta.is_inference():  # (reading _version raises in inference_mode)
        return None
    return tuple(t for t in (w.values, w.meta, w.bias, w.scale_w) if t is not None and not t.is_inference())


def weight_versions(tracked: tuple[torch.Tensor, ...] | None) -> tuple[int, ...] | None:
    """The version counters of ``tracked`` (:func:`tracked_tensors`; in-place writes through torch
    bump them, and aliases made with ``detach()`` and views share them), None for None."""
    return None if tracked is None else tuple([t._version for t in tracked])


def same_binding(a: Weight, b: Weight) -> bool:
    """``a`` and ``b`` bind the same weight: one activation, and meta, bias and scale_w each absent
    in both or at one address (values are compared by the caller, through a record's owner)."""
    return a.activation == b.activation and all(
        (s is None) == (t is None) and (s is None or s.data_ptr() == t.data_ptr())
        for s, t in ((a.meta, b.meta), (a.bias, b.bias), (a.scale_w, b.scale_w)))


def same_memory(a: Any, t: torch.Tensor) -> bool:
    """``a`` is ``t``, or a view of the same memory, type and size (the plan may reshape x or scale_x)."""
    return a is t or (isinstance(a, torch.Tensor) and a.data_ptr() == t.data_ptr() and a.dtype == t.dtype
                      and a.numel() == t.numel())


def storage_key(t: torch.Tensor) -> tuple[torch.device, int]:
    """Where ``t``'s block of memory is (views of one block, as a fused group's weight and a
    member's rows, give the same): its device and storage address."""
    return t.device, t.untyped_storage().data_ptr()


def same_bytes(a: Any, t: torch.Tensor) -> bool:
    """``a`` is a tensor on ``t``'s bytes, of any element type (the plan reads int32 metadata words
    as uint32)."""
    return isinstance(a, torch.Tensor) and a.data_ptr() == t.data_ptr() and \
        a.numel() * a.element_size() == t.numel() * t.element_size()
