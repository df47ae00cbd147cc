"""Trainable layers and sparse-24-bitmask checkpoints (docs/training.md, "Checkpoints").

Writing: a :class:`~.training.SemiSparseLinear` is written as its inference form,
:meth:`~.training.SemiSparseLinear.to_sparse_linear` (the compression of ``weight * mask`` in its
compute type): the same tensors a model whose trainable layers were converted first writes, which
vLLM and transformers read. The master weight itself is not in the file (a sparse-24-bitmask
checkpoint holds the pruned weight); resume training from the model's own ``state_dict``.

Reading with ``trainable``: the checkpoint's layer becomes a SemiSparseLinear whose master weight is
the checkpoint's dense pruned weight (zeros where it keeps nothing) and whose mask is the
checkpoint's bitmask (:func:`trainable_mask`): a trainable mask keeps at most two of every four along
rows *and* columns (x's gradient runs on the transposed weight).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch import nn

from ..errors import (
    SP_CHECKPOINT_LAYER,
    SP_SPARSIFY_ARGUMENTS,
    SP_TRAIN_LAYER,
    SP_TRAIN_MASK,
    IntegrationError,
    attribute_path,
)
from ._kernels import OUT_DTYPES
from .linear import SparseLinear
from .training import SemiSparseLinear

GROUP = 4
EXACT_MASTER = (torch.float32, torch.float64)
"""Master weight types that hold every bf16 and f16 value exactly."""


def written_layers(found: dict[str, nn.Module]) -> dict[str, SparseLinear]:
    """The layers ``save_sparse24_checkpoint`` writes, by name: each SparseLinear itself, each
    SemiSparseLinear as :meth:`~.training.SemiSparseLinear.to_sparse_linear` (compressed first where
    its master weight changed since; one conversion for a module registered under several names)."""
    converted: dict[int, SparseLinear] = {}
    layers = {}
    for name, module in found.items():
        if isinstance(module, SemiSparseLinear):
            if id(module) not in converted:
                converted[id(module)] = module.to_sparse_linear()
            layers[name] = converted[id(module)]
        else:
            layers[name] = module
    return layers


def checked_trainable(trainable: Any) -> None:
    """SP0907 unless ``trainable`` is None, True or False."""
    if trainable is not None and not isinstance(trainable, bool):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"load_sparse24_checkpoint: trainable must be None, True or "
                               f"False, got {trainable!r}",
                               help="None (default): each layer trainable where the model's is a SemiSparseLinear; "
                                    "True: every sparse layer a SemiSparseLinear; False: every one a SparseLinear")


def loads_trainable(module: nn.Module, trainable: bool | None) -> bool:
    """Whether the checkpoint's layer for the model's ``module`` becomes a SemiSparseLinear."""
    return trainable if trainable is not None else isinstance(module, SemiSparseLinear)


def check_trainable_target(module: nn.Module, name: str) -> None:
    """SP0916 (as ``SparseLinear.from_dense(..., trainable=True)`` with them) for a SparseLinear
    target whose fused activation or output type a SemiSparseLinear (which has neither) would drop."""
    if isinstance(module, SparseLinear) and (module.activation is not None or module.out_dtype is not None):
        what = f"activation={module.activation!r}" if module.activation is not None else \
            f"out_dtype={module.out_dtype}"
        raise IntegrationError(SP_TRAIN_LAYER, f"layer {name} of the model is a SparseLinear with {what}, "
                               "which a trainable SemiSparseLinear in its place would not compute",
                               help="load it for inference (trainable=False), or apply the activation / cast after "
                                    "the layer in the model's forward")


def trainable_mask(dense: np.ndarray, kept: np.ndarray, name: str) -> np.ndarray:
    """The mask (out, in) of a trainable layer of the checkpoint's weight ``dense`` whose bitmask
    keeps ``kept``: ``kept`` itself where every group of four along a column (one input, outputs
    4g..4g+3) keeps at most two; where one keeps more, its kept positions holding zero are dropped
    (the first ones in row order stay) down to two, the product unchanged (a writer keeps two
    positions per row group even where the weight is zero there). SP0918 where such a group holds
    more than two nonzero weights: no trainable mask keeps them all."""
    rows, cols = dense.shape
    pad = -rows % GROUP
    nonzero = np.zeros((rows + pad, cols), dtype=bool)
    nonzero[:rows] = dense != 0
    mask = np.zeros((rows + pad, cols), dtype=bool)
    mask[:rows] = kept
    nonzero = nonzero.reshape(-1, GROUP, cols)
    mask = mask.reshape(-1, GROUP, cols)
    counts = nonzero.sum(axis=1)
    if (counts > 2).any():
        group, column = (int(i) for i in np.argwhere(counts > 2)[0])
        first = GROUP * group
        raise IntegrationError(SP_TRAIN_MASK, f"layer {name}: the checkpoint's weight cannot be trained with its 2:4 "
                               f"mask: input {column} has {int(counts[group, column])} nonzero weights among outputs "
                               f"{first}..{min(first + GROUP, rows) - 1}; a trainable layer keeps at most 2 of every 4 "
                               "along rows and columns (x's gradient runs on the transposed weight)",
                               help=_retrain_help(name))
    zeros = mask & ~nonzero
    room = 2 - counts  # (zero-valued kept positions each column group may keep)
    mask = nonzero | (zeros & (np.cumsum(zeros, axis=1) <= room[:, None, :]))
    return mask.reshape(rows + pad, cols)[:rows]


def _retrain_help(name: str) -> str:
    at = attribute_path("model", name)
    return (f"load it for inference (trainable=False); to train it, prune it again to a transposable mask (which "
            f"drops some of the checkpoint's weights): load with trainable=False, then {at} = "
            f"SemiSparseLinear.from_dense({at}.to_linear())")


def master_dtype(module: nn.Module, values: np.dtype) -> torch.dtype:
    """The master weight's type of a trainable layer of 16-bit checkpoint ``values`` in place of the
    model's ``module``: the module's own weight type (a SemiSparseLinear's master weight, an
    nn.Linear's or Conv1D's weight) where it holds the values exactly (float32, float64, or the values'
    type), else the values' type; float32 for a SparseLinear (mixed precision)."""
    ckpt = torch.bfloat16 if values == ml_dtypes.bfloat16 else torch.float16
    weight = None if isinstance(module, SparseLinear) else getattr(module, "weight", None)
    own = weight.dtype if isinstance(weight, torch.Tensor) else torch.float32
    return own if own in EXACT_MASTER or own == ckpt else ckpt


def wide_master(param_dtype: torch.dtype, wide: np.dtype) -> bool:
    """Whether a master weight of ``param_dtype`` holds every value of the checkpoint's ``wide`` type
    (F32, F64) exactly (float32 holds F32's, float64 both), so that it takes them rather than their
    rounding to the compute type."""
    return param_dtype in EXACT_MASTER and torch.finfo(param_dtype).bits >= 8 * wide.itemsize


def _check_bias_range(bias: torch.Tensor | None, param_dtype: torch.dtype, name: str) -> None:
    """SP0913 where the checkpoint's (float32) ``bias`` has finite values that the master type
    ``param_dtype`` (the trainable layer's bias type, as nn.Linear's load_state_dict casts) makes inf."""
    if bias is None:
        return
    big = int((torch.isinf(bias.to(param_dtype)) & torch.isfinite(bias)).sum())
    if big:
        kind = OUT_DTYPES.get(param_dtype, param_dtype)
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: its bias has {big} value{'s' if big > 1 else ''} "
                               f"beyond ±{torch.finfo(param_dtype).max:.0f}: as the {kind} master's bias it "
                               "would be inf",
                               help="build the model in bf16 (torch_dtype=torch.bfloat16), or load it for inference "
                                    "(trainable=False), which keeps the bias in float32")


def trainable_layer(dense: np.ndarray, kept: np.ndarray, bias: torch.Tensor | None, module: nn.Module, name: str,
                    device: torch.device, wide: np.ndarray | None = None) -> SemiSparseLinear:
    """A SemiSparseLinear of the checkpoint's dense pruned weight ``dense`` (out, in; bf16 or f16,
    the compute type) with the mask :func:`trainable_mask` of its bitmask ``kept``, ``bias``, in
    place of the model's ``module`` (a SemiSparseLinear's ``mask_grad`` kept; the master type
    :func:`master_dtype`), compressed. ``wide``: the same weight as the checkpoint stores it where
    that is F32 or F64 (``dense`` its rounding): the master weight where its type holds it
    (:func:`wide_master`; before, it held the rounding, and training resumed from other weights than
    the checkpoint's). SP0916 for fp8 values (sparse training computes in bf16 or f16)."""
    if dense.dtype not in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)):
        raise IntegrationError(SP_TRAIN_LAYER, f"layer {name}: the checkpoint's weights are {dense.dtype}; sparse "
                               "training computes in bf16 or f16", help="load it for inference (trainable=False)")
    rows, cols = dense.shape
    param_dtype = master_dtype(module, dense.dtype)
    master = wide if wide is not None and wide_master(param_dtype, wide.dtype) else dense
    _check_bias_range(bias, param_dtype, name)
    mask = trainable_mask(master, kept, name)
    layer = SemiSparseLinear(cols, rows, bias is not None, dtype="bf16" if dense.dtype == ml_dtypes.bfloat16 else "f16",
                             mask_grad=getattr(module, "mask_grad", True), device=device, param_dtype=param_dtype)
    with torch.no_grad():  # (float64 holds every value of master exactly; the cast to param_dtype too)
        layer.weight.copy_(torch.from_numpy(np.where(mask, master, 0).astype(np.float64)).to(param_dtype))
        layer.mask.copy_(torch.from_numpy(mask))
        if bias is not None:
            layer.bias.copy_(bias)
    layer.refresh()
    return layer
