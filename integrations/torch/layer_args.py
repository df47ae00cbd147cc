"""The checks of the sparse layers' and the custom op's arguments (SparseLinear, GatedLinear,
SemiSparseLinear, sparsify_, fuse_projections_, the checkpoint loader, ``torch.ops.sparsile``):
each turns a bad argument into its diagnostic (integrations/errors.py, docs/diagnostics.md)."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np
import torch
from torch import nn

from ...stdlib.kernels.linear_args import GATED_ACTIVATIONS, is_gated
from ...stdlib.sparsity.dtypes import spelling_hint
from ..errors import (
    SP_ACTIVATION_FN,
    SP_BAD_TENSOR,
    SP_OUT_DTYPE,
    SP_SPARSIFY_ARGUMENTS,
    SP_WEIGHT_DTYPE,
    IntegrationError,
)
from ._kernels import ACTIVATIONS, OUT_DTYPES
from .weight import NAME_OF

F16_MAX = 65504.0


def beyond_f16(weight: torch.Tensor, name: str) -> int:
    """How many weights of another type than float16 lie beyond ±65504 where ``name`` is "f16": a cast
    makes them inf (kept, as the largest of their group)."""
    if name != "f16" or weight.dtype == torch.float16:
        return 0
    return int((weight.detach().abs() > F16_MAX).sum())


WEIGHT_DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16", "e4m3": "e4m3",
                      "float8_e4m3fn": "e4m3"}
"""The names of a weight type that SparseLinear, SemiSparseLinear and sparsify_ take (any case), as
:func:`~sparsile.stdlib.kernels.compress_weight.prune_and_compress` and the sparsity toolkit take them;
the torch dtypes (torch.bfloat16, torch.float16, torch.float8_e4m3fn) too."""
WEIGHT_DTYPE_HELP = ("pass dtype='bf16', 'f16' or 'e4m3' (fp8 weights with per-channel scales); 'bfloat16', "
                     "'float16', 'float8_e4m3fn' and torch.bfloat16, torch.float16, torch.float8_e4m3fn work too")


def weight_dtype_name(dtype: Any, default: torch.dtype | None = None) -> str:
    """The operand name ("bf16", "f16", "e4m3") of ``dtype`` (a name of :data:`WEIGHT_DTYPE_NAMES` or a
    torch dtype; None: ``default``); SP0903 for any other, with the name meant for a near one ('fp16')."""
    given = default if dtype is None else dtype
    if isinstance(given, torch.dtype) and given in NAME_OF:
        return NAME_OF[given]
    if isinstance(given, str) and given.strip().lower() in WEIGHT_DTYPE_NAMES:
        return WEIGHT_DTYPE_NAMES[given.strip().lower()]
    hint = spelling_hint(given)
    if hint is not None:  # 'fp16' has a kernel under another name: "has no kernel" would mislead
        raise IntegrationError(SP_WEIGHT_DTYPE, f"unknown weight dtype {given!r}", help=f"{hint}; {WEIGHT_DTYPE_HELP}")
    what = "the linear's weight dtype" if dtype is None else "dtype"
    raise IntegrationError(SP_WEIGHT_DTYPE, f"{what} {given} has no 2:4 sparse linear kernel", help=WEIGHT_DTYPE_HELP)


def checked_activation(activation: Any, allowed: tuple[str | None, ...] = ACTIVATIONS) -> str | None:
    """``activation`` when it is one of ``allowed`` (default: a layer's own, :data:`ACTIVATIONS`),
    else SP0904; a gated activation ("swiglu", "geglu") outside ``allowed`` gets a message of its
    own: it joins two projections, so a layer cannot apply it to its own outputs."""
    if activation in allowed:
        return activation
    if isinstance(activation, str) and is_gated(activation):  # (a dict lookup: an unhashable one is SP0904 below)
        raise IntegrationError(SP_ACTIVATION_FN, f"a SparseLinear cannot apply {activation!r} to its own outputs: "
                               f"it multiplies {GATED_ACTIVATIONS[activation]}(gate) by up, "
                               "the outputs of two projections",
                               help="keep gate_proj and up_proj as SparseLinear layers without an activation and "
                                    "call sparsile.torch.fuse_projections_(model, glu=True): it fuses the gated "
                                    "activation into a Llama- or Gemma-style MLP (docs/torch.md, 'Fusing the gated "
                                    "activation (SwiGLU, GeGLU)')")
    raise IntegrationError(SP_ACTIVATION_FN, f"unknown activation {activation!r}",
                           help="use " + ", ".join(repr(a) for a in allowed[:-1]) + f" or {allowed[-1]!r}")


def checked_features(in_features: Any, out_features: Any, layer: str, code: str) -> tuple[int, int]:
    """``(in_features, out_features)`` as ints when both are positive integers (numpy's too, not
    bools), else ``code`` for ``layer``."""
    if not all(isinstance(f, numbers.Integral) and not isinstance(f, bool) and f > 0
               for f in (in_features, out_features)):
        raise IntegrationError(code, f"a {layer} needs positive in/out features, got "
                               f"{in_features!r} x {out_features!r}", help="keep empty layers dense")
    return int(in_features), int(out_features)


def dense_weight(linear: Any, code: str) -> torch.Tensor:
    """The weight of ``linear`` when it is an ``nn.Linear`` with materialized weights, else
    ``code`` (what ``from_dense`` of both sparse layers takes)."""
    if not isinstance(linear, nn.Linear):
        raise IntegrationError(code, f"from_dense takes an nn.Linear, got {type(linear).__name__}",
                               help="pass the nn.Linear module itself")
    if linear.weight.device.type == "meta":
        raise IntegrationError(code, "the linear's weight is on the meta device (no values)",
                               help="materialize the weights (to_empty + load) before sparsifying")
    return linear.weight


def checked_model(model: Any, caller: str) -> nn.Module:
    """``model`` when it is an ``nn.Module``, else SP0907 for ``caller`` (sparsify_, fuse_projections_,
    save_sparse24_checkpoint)."""
    if not isinstance(model, nn.Module):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"{caller} takes an nn.Module, got {type(model).__name__}",
                               help="pass the model itself (its layers are found by named_modules())")
    return model


def checked_out_dtype(out_dtype: Any) -> torch.dtype | None:
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype in OUT_DTYPES):
        raise IntegrationError(SP_OUT_DTYPE, f"out_dtype {out_dtype} is not one the kernel stores",
                               help="use torch.bfloat16, torch.float16 or torch.float32 (or None: x's dtype)")
    return out_dtype


def host_to_torch(array: np.ndarray, device: Any = None) -> torch.Tensor:
    """A torch copy of a host array, bf16 / float8 included (through an integer view)."""
    array = np.ascontiguousarray(array)
    bits = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[array.itemsize]
    name = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn"}.get(array.dtype.name, array.dtype.name)
    return torch.from_numpy(array.view(bits).copy()).view(getattr(torch, name)).to(device)


DENSE_X_HELP = ("pass a dense x (x.to_dense()); for a nested tensor, run the layer on its packed tokens, "
                "layer(x.values()) for the jagged layout, then torch.nested.nested_tensor_from_jagged(y, x.offsets()), "
                "or on each tensor of x.unbind()")


def not_dense(x: torch.Tensor, layer: str) -> IntegrationError | None:
    """SP0901 for an ``x`` that is no dense (strided) tensor (a nested tensor, a sparse or mkldnn layout),
    whose memory the kernel cannot read as a (T, K) array (``nn.Linear`` computes with them), else None."""
    if x.is_nested:
        what = f"nested tensor (layout {x.layout})"
    elif x.layout != torch.strided:
        what = f"tensor of layout {x.layout}"
    else:
        return None
    return IntegrationError(SP_BAD_TENSOR, f"x is a {what}; {layer} takes a dense (strided) x", help=DENSE_X_HELP)


def check_input(x: Any, in_features: int, device: torch.device, layer: str) -> None:
    """SP0901 unless ``x`` is a dense bf16 / f16 / f32 tensor of shape (..., in_features) on ``device``."""
    if not isinstance(x, torch.Tensor):
        raise IntegrationError(SP_BAD_TENSOR, f"{layer} takes a torch.Tensor, got {type(x).__name__}",
                               help="pass x of shape (..., in_features)")
    error = not_dense(x, layer)
    if error is not None:
        raise error
    if x.dim() == 0 or x.shape[-1] != in_features:
        # (operator.index: a dynamic size under torch.compile left a symbolic message, which dynamo cannot hand
        # to traced_errors.py as text; index() specializes it, on this failing path only)
        shape = tuple(operator.index(d) for d in x.shape)
        raise IntegrationError(SP_BAD_TENSOR, f"x has shape {shape}; this layer takes (..., {in_features})",
                               help="the last dimension of x is the in_features")
    if x.dtype not in OUT_DTYPES:
        raise IntegrationError(SP_BAD_TENSOR, f"x has dtype {x.dtype}; {layer} takes bfloat16, float16 "
                               "or float32 x", help="cast x first")
    if x.device != device:
        raise IntegrationError(SP_BAD_TENSOR, f"x is on {x.device} but the layer's weight is on {device}",
                               help="move the module or x to the same device")


def check_devices(values: torch.Tensor, tensors: tuple[tuple[str, torch.Tensor | None], ...]) -> None:
    """SP0901 unless each named tensor of ``tensors`` (None: absent) is on the device of the layer's
    ``values`` (one put in without ``setattr`` or ``.to()``: ``layer._buffers["bias"] = t``,
    ``layer.bias.data = t``, a ``load_state_dict(assign=True)`` of part of the layer from another
    device; a launch would read it there: on the CPU SP0804, the interpreter cannot read it on the
    host; on a GPU, host memory)."""
    where = values.device
    for name, t in tensors:
        if t is not None and t.device != where:
            raise IntegrationError(SP_BAD_TENSOR, f"{name} is on {t.device} but the layer's values are on {where}",
                                   help=f"move the module (.to(device)) or assign {name} on the values' device: "
                                        f"layer.{name} = {name}.to(layer.values.device)")
