"""The checkpoint layout of a layer made from a transformers ``Conv1D`` (GPT-2's projections).

A Conv1D stores its weight W as (in, out) (``y = x @ W + b``); ``sparsify_`` swaps it for the
SparseLinear of W.T (``transposed_from``). ``save_sparse24_checkpoint`` writes such a layer in
GPT-2's own layout: the sparse-24-bitmask tensors of W, shape (in, out), its 2:4 groups down the
columns (:func:`~sparsile.integrations.sparse24.conv1d_bitmask_layout`), so that a reader that
decompresses the bitmask into the Conv1D's weight (compressed-tensors inside transformers) gets W.
The loader reads that layout back for a target that is a Conv1D (a dense GPT-2) or a SparseLinear
made from one. A square layer's (out, in) cannot be told from its (in, out): the writer's layout is
the contract, and an (out, in) shape of a non-square Conv1D target is SP0914.
"""

from __future__ import annotations

from torch import nn

from ..errors import SP_CHECKPOINT_MODULE, SP_CHECKPOINT_WRITE, IntegrationError
from .conv1d import CONV1D_ORIGIN, conv1d_class, is_conv1d
from .linear import SparseLinear
from .sparsify import own_behaviour
from .training import SemiSparseLinear


def conv1d_layout(module: nn.Module) -> bool:
    """Whether ``module``'s sparse layer is stored in a Conv1D's layout (in, out): a transformers
    Conv1D, or a SparseLinear or SemiSparseLinear made from one (``transposed_from``)."""
    return is_conv1d(module) or (isinstance(module, SparseLinear | SemiSparseLinear)
                                 and module.transposed_from is not None)


def checked_conv1d_target(module: nn.Module, name: str, shape: tuple[int, int]) -> nn.Module:
    """``module`` (see :func:`conv1d_layout`) as the target of the checkpoint's layer ``name`` of
    stored ``shape``; SP0914 where the shape is not its (in, out), or where a Conv1D has behaviour of
    its own (hooks, a subclass's forward: the SparseLinear in its place would not run them)."""
    conv = is_conv1d(module)
    k, n = tuple(module.weight.shape) if conv else (module.in_features, module.out_features)
    if shape != (k, n):
        what = f"is a {CONV1D_ORIGIN}" if conv else f"was made from a {module.transposed_from}"
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"layer {name} {what} of {k} inputs and {n} outputs, stored "
                               f"(in, out) = ({k}, {n}), but the checkpoint's shape is [{shape[0]}, {shape[1]}]",
                               help="a Conv1D's sparse layer is written in GPT-2's layout (in, out) "
                                    "(save_sparse24_checkpoint of a model sparsified with sparsify_); a checkpoint "
                                    "holding it as (out, in) is an nn.Linear's: load it into a model of that "
                                    "architecture, or write it again from the model it came from")
    own = own_behaviour(module, conv1d_class() if conv else type(module) if type(module) in (
        SparseLinear, SemiSparseLinear) else SparseLinear)
    if own is not None:
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"layer {name} of the model cannot be replaced by the "
                               f"checkpoint's: {own.replace('x @ W.T + b', 'x @ W + b') if conv else own}",
                               help="load the checkpoint first, then register the hooks (or wrap the layer) on the "
                                    "SparseLinear it puts there")
    return module


def check_conv1d_writes(layers: dict[str, SparseLinear]) -> list[str]:
    """The names of ``layers`` made from a Conv1D, in order; SP0915 for one that cannot be written in
    its layout: an e4m3 layer (compressed-tensors scales a weight per channel along its first
    dimension, the inputs of a Conv1D's (in, out), while the layer's scale is per output), or an odd
    out_features (compressed values (in, out / 2))."""
    names = []
    for name, layer in layers.items():
        if layer.transposed_from is None:
            continue
        if layer.weight_dtype == "e4m3":
            raise IntegrationError(SP_CHECKPOINT_WRITE, f"layer {name}: an e4m3 layer made from a "
                                   f"{layer.transposed_from} cannot be written; its weight is stored (in, out), along "
                                   "which compressed-tensors' per-channel weight_scale would scale the inputs, not "
                                   "the outputs",
                                   help="sparsify the model with dtype='bf16' or 'f16' to write it, or keep the layer "
                                        f"dense: sparsify_ with a filter_fn that leaves {name} out")
        if layer.out_features % 2:
            raise IntegrationError(SP_CHECKPOINT_WRITE, f"layer {name}: out_features = {layer.out_features} is odd; "
                                   f"a {layer.transposed_from}'s sparse layer is stored (in, out) with compressed "
                                   "values (in, out / 2)",
                                   help=f"keep it dense: sparsify_ with a filter_fn that leaves {name} out")
        names.append(name)
    return names
