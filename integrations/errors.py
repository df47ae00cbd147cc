"""The diagnostics of the integrations (the SP09xx codes of docs/diagnostics.md).

:class:`IntegrationError` is a :class:`~sparsile.stdlib.sparsity.SparsityError` (so a ``ValueError``)
with a code, a message and a help line, rendered ``error[SP09xx]: message`` / `` = help: ...``.
"""

from __future__ import annotations

from ..stdlib.sparsity.errors import SparsityError

SP_TORCH_MISSING = "SP0900"
"""``sparsile.torch`` was imported but PyTorch is not installed."""
SP_BAD_TENSOR = "SP0901"
"""An input tensor of a sparse linear layer or op has the wrong type, shape, dtype or device."""
SP_CANNOT_SPARSIFY = "SP0902"
"""A module or weight that cannot become a ``SparseLinear`` (not an ``nn.Linear``, no features, meta device)."""
SP_WEIGHT_DTYPE = "SP0903"
"""A weight type with no 2:4 sparse linear kernel (``dtype=`` other than bf16, f16, e4m3)."""
SP_ACTIVATION_FN = "SP0904"
"""An ``activation=`` name other than None, "relu", "silu", "gelu_tanh"."""
SP_OUT_DTYPE = "SP0905"
"""An ``out_dtype=`` other than bf16, f16, f32."""
SP_OP_ARGUMENTS = "SP0906"
"""Arguments of ``torch.ops.sparsile.sparse_linear`` that do not fit together (values, meta, bias, scales)."""
SP_SPARSIFY_ARGUMENTS = "SP0907"
"""A model that is not an ``nn.Module`` (``sparsify_``, ``fuse_projections_``, ``save_sparse24_checkpoint``,
``load_sparse24_checkpoint``), or options of the wrong kind: ``sparsify_``'s ``filter_fn`` that is not callable
or ``min_features`` that is not a non-negative integer, ``save_sparse24_checkpoint``'s ``config`` that is not a
dict, a checkpoint path that is not a str or ``os.PathLike``."""
SP_TORCH_VERSION = "SP0908"
"""``sparsile.torch`` was imported with a PyTorch older than the oldest supported release
(``integrations/torch_version.py``)."""
SP_SAFETENSORS_FILE = "SP0910"
"""A safetensors file that cannot be read: truncated, a bad header, offsets outside the data."""
SP_SAFETENSORS_DTYPE = "SP0911"
"""A safetensors dtype (or a numpy array type to write) outside BOOL, U8, I8, I16, I32, I64, F16, BF16,
F32, F64, F8_E4M3, F8_E5M2."""
SP_CHECKPOINT_CONFIG = "SP0912"
"""A checkpoint folder without a readable config.json whose sparsity_config is ``sparse-24-bitmask``, a bad
shard index, a tensor in two of its files."""
SP_CHECKPOINT_LAYER = "SP0913"
"""A ``sparse-24-bitmask`` layer whose compressed / bitmask / shape tensors do not fit together."""
SP_CHECKPOINT_MODULE = "SP0914"
"""A checkpoint layer the model has no ``nn.Linear`` / ``SparseLinear`` for (or of other features), a
plain tensor of another shape than the model's, or (strict) tensors only one side has."""
SP_CHECKPOINT_WRITE = "SP0915"
"""A layer the ``sparse-24-bitmask`` format cannot hold (in_features not a multiple of 4)."""
SP_TRAIN_LAYER = "SP0916"
"""A trainable sparse layer that cannot be built (e4m3 weights, a fused activation or out_dtype) or cannot compute a
call: a second derivative through x's gradient, forward-mode AD, torch.func's grad transforms, a weight or mask
batched by vmap without its compressions (docs/training.md), ``torch.fx.symbolic_trace`` with the layer as the
traced root (it is recorded as a ``call_module`` node)."""
SP_TRAIN_SETUP = "SP0917"
"""``SparseTrainer`` / ``recompress_`` / ``reprune_`` arguments: no trainable sparse layer, a bad ``reprune_every``,
a re-prune of a layer whose mask is parametrized (``torch.nn.utils.parametrize``)."""
SP_TRAIN_MASK = "SP0918"
"""A trainable layer's mask (loaded or assigned) that is not transposable 2:4 or not of the weight's shape."""
SP_ACT_SPARSE = "SP0919"
"""``sparse24_activation_linear`` arguments that do not fit together (x, weight, bias)."""
SP_STALE_CAPTURE = "SP0920"
"""A CUDA graph capture of a launch record that reads padded copies of a weight written in place since
no call outside a capture saw the write: the graph would replay the old copies."""
SP_TRANSFORMERS = "SP0921"
"""``use_gqa_decode_attention`` without a transformers that has ``AttentionInterface`` and
``AttentionMaskInterface`` (4.48 and later)."""
SP_FROZEN_WEIGHT = "SP0922"
"""A gradient asked of a frozen sparse layer's weight (values, meta, scale_w, an fp8 x): ``SparseLinear``
and ``torch.ops.sparsile.sparse_linear`` give x's gradient only (and a trainable bias's)."""
SP_WARM_UP = "SP0923"
"""``sparsile.torch.warm_up`` arguments of the wrong kind: a model that is not an ``nn.Module``, token counts
that are not positive integers, ``jobs`` that is not a positive integer, an x dtype with no kernel, an unknown
target."""
SP_WARM_UP_TIMEOUT = "SP0924"
"""A ``sparsile.torch.warm_up`` worker process that did not finish compiling a kernel within ``timeout``
seconds: it was killed; the message names the kernel, its constexprs and target."""
SP_PARAMETRIZE = "SP0925"
"""``torch.nn.utils.parametrize.register_parametrization`` of a sparse layer's tensor it cannot take: a
layer's ``values`` (``ModuleDict.values`` takes the name), a ``SemiSparseLinear``'s compressions (written in
place by each re-compression); refused before torch changes the layer (``torch/parametrize_guard.py``)."""
SP_FUSE_GROUPS = "SP0944"
"""``fuse_projections_(groups=...)`` that is not a sequence of tuples of two or more distinct child names."""


class IntegrationError(SparsityError):
    """A user-facing error of the integrations: ``code`` (SP09xx), ``message`` and ``help``."""


def attribute_path(root: str, name: str) -> str:
    """Python for the submodule ``name`` (a dotted module name such as ``transformer.h.0.attn``) of the
    object ``root``, as a help text's statement can use it: numeric parts become indexing
    (``model.transformer.h[0].attn``: ``model.transformer.h.0`` is no Python); ``name`` empty: ``root``."""
    path = root
    for part in name.split(".") if name else ():
        path += f"[{part}]" if part.isdigit() else f".{part}"
    return path
