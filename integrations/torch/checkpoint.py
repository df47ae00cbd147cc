"""Read and write compressed-tensors ``sparse-24-bitmask`` checkpoints with ``SparseLinear`` layers.

A checkpoint is a folder: ``config.json`` whose ``sparsity_config`` (at the top level, or under
``quantization_config`` / ``compression_config``) has ``format = "sparse-24-bitmask"``, and
safetensors files (``model.safetensors``, or the shards named by ``model.safetensors.index.json``).
Each sparse layer ``<name>`` has ``<name>.compressed``, ``.bitmask`` and ``.shape`` (2, 1), as
compressed-tensors writes them (:mod:`sparsile.integrations.sparse24`; ``<name>.weight.compressed``
etc. and a ``.shape`` of (2,), which sparsile wrote before, are read too), its ``<name>.bias`` and,
for fp8 weights (``compressed`` F8_E4M3, or int8 bits as sparsile wrote them before),
``<name>.weight_scale`` (out, 1). Every other tensor is a plain parameter or buffer of the model.
A layer made from a transformers Conv1D (GPT-2) is stored in its layout, (in, out)
(conv1d_checkpoint.py). docs/torch.md has an example.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch import nn

from ...stdlib.sparsity import as_host_array, compress, decode_metadata
from ..errors import (
    SP_CHECKPOINT_CONFIG,
    SP_CHECKPOINT_LAYER,
    SP_CHECKPOINT_MODULE,
    SP_CHECKPOINT_WRITE,
    SP_SPARSIFY_ARGUMENTS,
    IntegrationError,
    attribute_path,
)
from ..safetensors import load_file, save_file
from ..sparse24 import (
    CONFIG,
    FORMAT,
    INDEX,
    LINEAR_CLASSES,
    bitmask_layout,
    checked_shape,
    conv1d_bitmask_layout,
    declared_weight_types,
    dense_from_bitmask,
    dynamic_input_group,
    mask_from_bitmask,
    read_config,
    shards,
    static_input_group,
    weight_only_group,
)
from ..vllm_match import warn_vllm_matching
from ..vllm_shapes import dense_in_place, warn_vllm_layout, warn_vllm_shapes
from .atomic import own_tensors, refused_tensors, restore_modules, swap_modules
from .conv1d import CONV1D_ORIGIN, is_conv1d
from .conv1d_checkpoint import check_conv1d_writes, checked_conv1d_target, conv1d_layout
from .fuse import checked_flag
from .layer_args import checked_model, host_to_torch
from .linear import SparseLinear
from .sparsify import TiedTensors, class_names, own_behaviour
from .trainable_checkpoint import (
    check_trainable_target,
    checked_trainable,
    loads_trainable,
    trainable_layer,
    written_layers,
)
from .training import SemiSparseLinear

WEIGHTS = "model.safetensors"
FLOAT_QUANTIZED = "float-quantized"  # compressed-tensors' format of fp8 weights and activations
_PARTS = ("compressed", "bitmask", "shape")
STALE_SCHEME = ("config_groups", "ignore", "format", "quantization_status", "kv_cache_scheme")
"""The keys of a given config's quantization_config that the writer drops: the scheme of the model the
config came from, not of the layers written (an fp8 one is written anew)."""


@dataclass
class LoadReport:
    """What :func:`load_sparse24_checkpoint` did: the names it put its layers under (a module
    registered under several names: each), and the plain tensors the model lacks (``unexpected``)
    or the checkpoint lacks (``missing``)."""

    sparse: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def _layer_groups(names: set[str]) -> dict[str, str]:
    """module name -> tensor prefix, for every prefix with a ``.compressed`` tensor."""
    groups = {}
    for name in sorted(names):
        if name.endswith(".compressed"):
            prefix = name[:-len(".compressed")]
            missing = [p for p in _PARTS if f"{prefix}.{p}" not in names]
            if missing:
                raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {prefix}: the checkpoint has {prefix}.compressed "
                                       f"but no {', '.join(f'{prefix}.{p}' for p in missing)}",
                                       help="write compressed, bitmask and shape for every sparse layer")
            groups[prefix.removesuffix(".weight") if prefix.endswith(".weight") else prefix] = prefix
    return groups


def _checked_path(path: Any, caller: str) -> Path:
    """``path`` as a Path; SP0912 where it is a file (the checkpoint's model.safetensors or config.json
    given instead of its folder), before anything is read or written."""
    if not isinstance(path, str | os.PathLike):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"{caller}: path must be a folder (str or os.PathLike), got "
                               f"{type(path).__name__}", help="pass the checkpoint's folder")
    path = Path(path)
    if path.exists() and not path.is_dir():
        help = (f"pass the folder that holds config.json and the .safetensors files ({path.parent})"
                if caller.startswith("load") else
                f"pass the folder to write {CONFIG} and {WEIGHTS} into (created if missing)")
        raise IntegrationError(SP_CHECKPOINT_CONFIG, f"{path} is a file; a checkpoint is a folder", help=help)
    return path


def _target_module(model: nn.Module, name: str, shape: tuple[int, int]) -> nn.Module:
    try:
        module = model.get_submodule(name) if name else model
    except AttributeError:
        module = None
    if name and module is not None and conv1d_layout(module):  # (stored (in, out): conv1d_checkpoint.py)
        return checked_conv1d_target(module, name, shape)
    if not isinstance(module, nn.Linear | SparseLinear | SemiSparseLinear) or not name:
        what = "no module" if module is None else (type(module).__name__ if name else "the root module")
        help = ("build the model from the checkpoint's config (an nn.Linear there), or load into a model of the "
                "same architecture")
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint's sparse layer {name or '<root>'} is {what} "
                               "of the model", help=help)
    if (module.out_features, module.in_features) != shape:
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"layer {name} is {module.out_features} x {module.in_features} "
                               f"in the model but {shape[0]} x {shape[1]} in the checkpoint",
                               help="load into a model built from the checkpoint's config")
    own = own_behaviour(module, next((c for c in (SparseLinear, SemiSparseLinear) if isinstance(module, c)),
                                     nn.Linear))
    if own is not None:  # (the new layer replacing it would not run its hooks or its own forward)
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"layer {name} of the model cannot be replaced by the "
                               f"checkpoint's: {own}", help="load the checkpoint first, then register the hooks "
                               "(or wrap the layer) on the SparseLinear it puts there")
    return module


def _device_of(module: nn.Module) -> torch.device:
    tensor = module.values if isinstance(module, SparseLinear) else module.weight
    return torch.device("cpu") if tensor.device.type == "meta" else tensor.device


def _layer_dtype(module: nn.Module) -> np.dtype:
    """The 16-bit type wider (F32, F64) compressed values are converted to: the model's module's
    weight type where it is bf16 or f16 (a SparseLinear's or SemiSparseLinear's values: its compute
    type), else bf16 (sparsile's default), as compressed-tensors' decompressor leaves the stored
    type and loading copies it into the model's parameter (nn.Linear's load_state_dict: a cast,
    rounded to nearest even)."""
    weight = module.values if isinstance(module, SparseLinear | SemiSparseLinear) else module.weight
    return np.dtype(np.float16) if weight.dtype == torch.float16 else np.dtype(ml_dtypes.bfloat16)


def _narrowed(compressed: np.ndarray, name: str, module: nn.Module) -> np.ndarray:
    """F32 / F64 ``compressed`` values in the layer's 16-bit type (:func:`_layer_dtype`); SP0913 where
    f16 would make finite values inf."""
    want = _layer_dtype(module)
    with np.errstate(over="ignore"):
        narrowed = compressed.astype(want)
    big = int((np.isinf(narrowed) & np.isfinite(compressed)).sum())
    if big:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: the compressed values are {compressed.dtype}, "
                               f"{big} of them beyond ±65504: as the model's f16 they would be inf",
                               help="build the model in bf16 (torch_dtype=torch.bfloat16): wider values are "
                                    "converted to the model's dtype, and bf16 keeps float32's range")
    return narrowed


def module_classes(module: nn.Module) -> tuple[str, ...]:
    """The class names compressed-tensors matches a class target against for the model's layer
    ``module``: those of its class's MRO that are modules (a subclass of nn.Linear of the producer's
    model: its own name, then ``Linear``, ``Module``; a transformers ``Conv1D``: ``Conv1D``,
    ``Module``); a SparseLinear or SemiSparseLinear stands where the producer had the module it
    replaced: that module's classes (``source_classes``, which ``sparsify_`` and the loader keep),
    else an nn.Linear's (:data:`~sparsile.integrations.sparse24.LINEAR_CLASSES`). Before, a layer
    made from a ``FalconLinear`` or a ``Conv1D`` was matched as an nn.Linear: a group targeting
    ``FalconLinear`` missed it in a sparsified model, and ``Linear`` claimed a sparsified GPT-2's
    projections, which it does not name in the dense model compressed-tensors reads."""
    if isinstance(module, SparseLinear | SemiSparseLinear):
        return module.source_classes or LINEAR_CLASSES
    return class_names(module)


def _linear_layers(model: nn.Module, sparse: set[str]) -> dict[str, tuple[tuple[str, ...], bool]]:
    """name -> (its classes, whether it is in ``sparse``) of every linear layer (nn.Linear,
    SparseLinear, SemiSparseLinear, a transformers Conv1D: vLLM builds GPT-2's as its linear classes)
    of ``model``, under each of its names: what vLLM's matching is checked on."""
    return {name: (module_classes(m), name in sparse) for name, m in model.named_modules(remove_duplicate=False)
            if name and (isinstance(m, nn.Linear | SparseLinear | SemiSparseLinear) or is_conv1d(m))}


def _input_scale(tensors: dict[str, np.ndarray], name: str, config: dict[str, Any],
                 classes: tuple[str, ...]) -> np.ndarray | None:
    """The static per-tensor activation scale ``<name>.input_scale`` of an fp8 layer (compressed-tensors'
    ``input_activations: {dynamic: false, strategy: tensor}``), as one float32, or None; SP0913 for
    one of several elements, or not a positive finite number, and for none where config.json declares
    the layer's input activations static (x would be quantized per token instead, unseen). Where the
    group compressed-tensors applies declares them dynamic, a stored input_scale is none of the layer's
    (compressed-tensors registers none for a dynamic scheme, nor does vLLM): None, the tensor left to
    load_state_dict (unexpected)."""
    scale = tensors.get(f"{name}.input_scale")
    if scale is not None and dynamic_input_group(config, name, classes) is not None:
        return None
    if scale is None:
        static = static_input_group(config, name, classes)
        if static is not None:
            group, said = static
            how = "dynamic false" if said else "without dynamic, which compressed-tensors takes as false"
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: config.json declares static input "
                                   f"activations for it (config group {group!r}: input_activations {how}), "
                                   f"but the checkpoint has no {name}.input_scale; x would be quantized per token "
                                   "instead of with the calibrated scale",
                                   help=f"write {name}.input_scale (x's calibrated amax / 448, one float32), or "
                                        f"declare dynamic: true for {name}'s input_activations (per-token scales)")
        return None
    scale = np.asarray(scale).astype(np.float32).reshape(-1)
    if scale.size != 1:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: input_scale has {scale.size} elements; a static "
                               "input scale is per tensor (one element)",
                               help="sparsile reads input activations of strategy 'tensor' (one scale) or dynamic "
                                    f"per-token ones (no {name}.input_scale)")
    if not (np.isfinite(scale[0]) and scale[0] > 0):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: input_scale is {float(scale[0])!r}; a static "
                               "input scale is a positive finite number",
                               help=f"write {name}.input_scale as x's calibrated amax / 448, or leave it out to "
                                    "quantize x per token")
    return scale


def _check_scale_size(scale: np.ndarray, rows: int, name: str) -> None:
    """SP0913 unless ``scale`` (a weight_scale) holds one value, or one per output channel (``rows``)."""
    if scale.size not in (1, rows):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: weight_scale has {scale.size} elements for "
                               f"{rows} output channels", help="one scale per output channel")


def _dequantized(dense: np.ndarray, scale: np.ndarray, name: str, module: nn.Module) -> np.ndarray:
    """The 16-bit weight W_q * s_w of a weight-only fp8 layer (W8A16), as compressed-tensors'
    decompression makes it: the product in the scale's type (bf16 or f16: rounded once; float32:
    float32's product), then the layer's 16-bit type (:func:`_layer_dtype`)."""
    _check_scale_size(scale, dense.shape[0], name)
    wide = np.result_type(np.float32, scale.dtype)
    product = dense.astype(wide) * scale.reshape(-1, 1).astype(wide)
    if scale.dtype.itemsize == 2:  # (exact in float32: at most 4 + 11 significant bits; one rounding)
        with np.errstate(over="ignore"):
            rounded = product.astype(scale.dtype)
        big = int((np.isinf(rounded) & np.isfinite(product)).sum())
        if big:  # (f16 scales: the product beyond f16's range, inf in compressed-tensors' decompression too)
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: W_q * weight_scale (its weight-only fp8 "
                                   f"values dequantized in the scale's {scale.dtype}) is beyond ±65504 for {big} "
                                   "weights: they would be inf",
                                   help="store the weight_scale in bfloat16 or float32 (the product is taken in the "
                                        "scale's type)")
        product = rounded.astype(np.float32)
    want = _layer_dtype(module)
    return product.astype(want) if product.dtype == want else _narrowed(product, name, module)


def _sparse_layer(tensors: dict[str, np.ndarray], name: str, prefix: str, module: nn.Module,
                  config: dict[str, Any], trainable: bool = False) -> SparseLinear | SemiSparseLinear:
    """The layer of the checkpoint's ``name`` (tensors under ``prefix``) in place of the model's
    ``module``: a SparseLinear, or with ``trainable`` a SemiSparseLinear whose mask is the
    checkpoint's (trainable_checkpoint.py); either keeps the module's classes (``source_classes``)
    and, for a Conv1D layout, ``transposed_from``."""
    compressed = tensors[f"{prefix}.compressed"]
    columns = conv1d_layout(module)  # (a transformers Conv1D's weight W (in, out): its groups down the columns)
    if columns and np.asarray(compressed).dtype.itemsize == 1:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: 8-bit compressed values for a layer stored in a "
                               "transformers Conv1D's layout (in, out): a per-channel weight_scale of that weight "
                               "scales its inputs, which the fp8 kernel's scale (per output) cannot",
                               help="load a checkpoint of bf16 or f16 weights for a Conv1D layer")
    wide = None  # (F32 / F64 values: a trainable layer's master weight keeps them where its type holds them)
    if compressed.dtype in (np.float32, np.float64):  # (as compressed-tensors' loading: cast to the model's type)
        wide, compressed = compressed, _narrowed(compressed, name, module)
    scale = tensors.get(f"{name}.weight_scale")
    if compressed.dtype == np.int8:
        if "int" in declared_weight_types(config):  # (compressed-tensors' int-quantized weights: int8 numbers)
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: the compressed values are int8 and "
                                   "config.json declares int weights (type 'int' in config_groups): int8-quantized "
                                   "weights have no 2:4 kernel here (read as fp8 bits they would be other numbers)",
                                   help="load a checkpoint of bf16, f16 or fp8 (type 'float') weights")
        if scale is None:
            raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: int8 compressed values without "
                                   f"{name}.weight_scale (int8 weights have no kernel here)",
                                   help="fp8 layers store their per-channel weight_scale next to the weight")
        compressed = compressed.view(ml_dtypes.float8_e4m3fn)
    if compressed.dtype.name not in ("bfloat16", "float16", "float8_e4m3fn"):
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: compressed values of {compressed.dtype} have no "
                               "2:4 kernel", help="store bf16, f16 or fp8 (e4m3: F8_E4M3) weights")
    dense = dense_from_bitmask(compressed, tensors[f"{prefix}.bitmask"], tensors[f"{prefix}.shape"], name, columns)
    if columns:  # (the layer's weight is W.T (out, in), compressed along K)
        dense = np.ascontiguousarray(dense.T)
    if dense.dtype == ml_dtypes.float8_e4m3fn and scale is not None \
            and weight_only_group(config, name, module_classes(module)) is not None:
        dense, scale = _dequantized(dense, np.asarray(scale), name, module), None
    bias = tensors.get(f"{name}.bias")
    if scale is not None:
        scale = np.asarray(scale).astype(np.float32)
        _check_scale_size(scale, dense.shape[0], name)
        scale = np.broadcast_to(scale.reshape(-1), (dense.shape[0],)).copy()
    if bias is not None and np.size(bias) != dense.shape[0]:
        raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {name}: bias has {np.size(bias)} elements for "
                               f"{dense.shape[0]} output channels", help="one bias per output channel")
    bias_t = None if bias is None else torch.from_numpy(np.asarray(bias).astype(np.float32))
    classes = module_classes(module)
    if trainable:
        kept = mask_from_bitmask(tensors[f"{prefix}.bitmask"], checked_shape(tensors[f"{prefix}.shape"], name), name,
                                 columns)
        if wide is not None:
            wide = dense_from_bitmask(wide, tensors[f"{prefix}.bitmask"], tensors[f"{prefix}.shape"], name, columns)
            wide = np.ascontiguousarray(wide.T) if columns else wide
        layer = trainable_layer(dense, kept.T if columns else kept, bias_t, module, name, _device_of(module), wide)
    else:
        layer = _inference_layer(tensors, name, module, config, dense, scale, bias_t)
    if columns:  # (written again in the Conv1D's layout)
        layer.transposed_from = getattr(module, "transposed_from", None) or CONV1D_ORIGIN
    if classes != LINEAR_CLASSES:  # (a config group's class targets match it as they match the module it replaces)
        layer.source_classes = classes
    return layer


def _inference_layer(tensors: dict[str, np.ndarray], name: str, module: nn.Module, config: dict[str, Any],
                     dense: np.ndarray, scale: np.ndarray | None, bias_t: torch.Tensor | None) -> SparseLinear:
    """The SparseLinear of the checkpoint's layer ``name`` (its weight ``dense``; fp8 with ``scale``)
    in place of the model's ``module``."""
    values, indices = compress(dense, str(dense.dtype))
    # a SparseLinear of the model keeps its fused activation and output type (not weights: not in the file)
    options = {"activation": module.activation, "out_dtype": module.out_dtype} if isinstance(module, SparseLinear) \
        else {}
    # (a weight_scale next to 16-bit values is no scale of the layer: left to load_state_dict, unexpected)
    fp8 = dense.dtype == ml_dtypes.float8_e4m3fn  # (not a weight-only fp8 layer: dequantized above)
    # (an input_scale next to 16-bit values, too, is left to load_state_dict: unexpected)
    layer = SparseLinear.from_compressed(values, indices, dense.shape[1], bias=bias_t,
                                         scale_w=scale if fp8 else None,
                                         input_scale=_input_scale(tensors, name, config, module_classes(module))
                                         if fp8 else None,
                                         device=_device_of(module), **options)
    return layer


def _same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two of the checkpoint's tensors are the same bits (both absent included)."""
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _layer_tensors(tensors: dict[str, np.ndarray], name: str, prefix: str) -> list[np.ndarray | None]:
    """The checkpoint's tensors of sparse layer ``name`` (None for those it lacks)."""
    keys = [f"{prefix}.{p}" for p in _PARTS] + [f"{name}.bias", f"{name}.weight_scale", f"{name}.input_scale"]
    return [tensors.get(k) for k in keys]


def _untie_help(tied: TiedTensors, module: nn.Module, name: str, what: str, config: dict[str, Any]) -> str:
    head = module is tied.head
    if head and config.get("tie_word_embeddings") is False:
        text = ("the checkpoint's config.json has tie_word_embeddings = false: build the model from it, or untie the "
                "model before loading: ")
    else:
        text = "if the checkpoint's model is untied, untie the model before loading: "
    if head:
        text += ("set model.config.tie_word_embeddings = False (so that tie_weights() does not tie them again) "
                 "and ")
    at = attribute_path("model", name)
    own = f"{at}.{what} = nn.Parameter({at}.{what}.detach().clone())"
    return text + f"give {name} its own {what}, {own}"


def _targets(model: nn.Module, groups: dict[str, str], tensors: dict[str, np.ndarray],
             config: dict[str, Any]) -> dict[str, nn.Module]:
    """The model's module for each sparse layer of the checkpoint, every check made before the first
    is replaced (SP0914): a module of that name and shape without behaviour of its own, whose weight
    and bias are tied to no other module's tensor (a SparseLinear in its place would untie them), and
    the same layer in the checkpoint under every name of a module registered under several."""
    tied = TiedTensors(model)
    targets: dict[str, nn.Module] = {}
    first: dict[int, str] = {}
    for name, prefix in groups.items():
        module = _target_module(model, name, checked_shape(tensors[f"{prefix}.shape"], name))
        tie = tied.tie(module)
        if tie is not None:
            what, shown = tie
            raise IntegrationError(SP_CHECKPOINT_MODULE, f"layer {name} of the model cannot be replaced by the "
                                   f"checkpoint's: its {what} is tied to {shown}, and a SparseLinear in its place "
                                   "would untie them without a word",
                                   help=_untie_help(tied, module, name, what, config))
        other = first.setdefault(id(module), name)
        if other != name and not all(_same_array(a, b) for a, b in zip(
                _layer_tensors(tensors, other, groups[other]), _layer_tensors(tensors, name, prefix), strict=True)):
            raise IntegrationError(SP_CHECKPOINT_MODULE, f"layers {other} and {name} are one module of the model, "
                                   "but the checkpoint holds different layers for them",
                                   help="load into a model where they are two modules, or write the layer once")
        targets[name] = module
    return targets


def _tied_keys(model: nn.Module, plain: set[str], replaced: tuple[str, ...], tensors: dict[str, np.ndarray],
               config: dict[str, Any]) -> list[list[str]]:
    """The state-dict keys of the model that name one tensor (tied parameters, a module under
    several names), outside the layers to be replaced, in groups of two or more. SP0914 when the
    checkpoint holds different values for two keys of a group: loading would keep one of them."""
    by_id: dict[int, list[str]] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if not key.startswith(replaced):
            by_id.setdefault(id(t), []).append(key)
    groups = [keys for keys in by_id.values() if len(keys) > 1]
    for keys in groups:
        present = sorted(k for k in keys if k in plain)
        differ = next((k for k in present[1:] if not _same_array(tensors[present[0]], tensors[k])), None)
        if differ is not None:
            build = ("build it from the checkpoint's config (tie_word_embeddings = false), or "
                     if config.get("tie_word_embeddings") is False else "")
            raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint holds different values for {present[0]} "
                                   f"and {differ}, which are one tensor of the model (tied)",
                                   help=f"load into a model where they are two tensors: {build}give one of them a "
                                        "copy of its own before loading")
    return groups


def _retie(model: nn.Module, keys: list[str], source: str) -> None:
    """Make every key of ``keys`` name the tensor ``source`` names (load_state_dict(assign=True)
    gives each key a tensor of its own)."""
    owner, _, attr = source.rpartition(".")
    tensor = getattr(model.get_submodule(owner), attr)
    for key in keys:
        _put_tensor(model, key, tensor)


def _put_tensor(model: nn.Module, key: str, tensor: torch.Tensor) -> None:
    """Register ``tensor`` under state-dict key ``key`` of ``model``, unless that key already names it."""
    owner, _, attr = key.rpartition(".")
    module = model.get_submodule(owner)
    if (module._parameters.get(attr) if attr in module._parameters else module._buffers.get(attr)) is not tensor:
        setattr(module, attr, tensor)


def _plain_load(model: nn.Module, swapped: dict[str, nn.Module], plain: dict[str, torch.Tensor]) -> tuple[
        list[str], list[str], list[str]]:
    """What ``model.load_state_dict(plain, strict=False)`` will meet once the layers of ``swapped``
    (name -> new layer) replace the model's, found before anything changes (torch's rules, in its
    order): (the tensors it would refuse, in torch's words: another shape; the model's keys plain
    lacks (missing); plain's keys no module takes (unexpected)). The checks of the model's own
    sparse layers (``_check_state_dict``: SP0902, SP0814, SP0918) raise here."""
    refused: list[str] = []
    missing: list[str] = []
    unexpected: list[str] = []

    def visit(module: nn.Module, prefix: str, keys: list[str]) -> None:
        local = {prefix + name for name in own_tensors(module)}
        sub = {k: plain[k] for k in keys}
        check = getattr(module, "_check_state_dict", None)
        if check is not None and sub:
            check(sub, prefix)
        refused.extend(refused_tensors(module, sub, prefix))
        missing.extend(k for k in local if k not in sub)
        extra = prefix + "_extra_state"
        takes_extra = getattr(type(module), "set_extra_state", nn.Module.set_extra_state) \
            is not nn.Module.set_extra_state
        if takes_extra and extra not in sub:
            missing.append(extra)
        for key in keys:
            head, dot, _ = key[len(prefix):].partition(".")
            if key == extra:
                if not takes_extra:
                    unexpected.append(key)
            elif (head not in module._modules) if dot else (key not in local):
                unexpected.append(key)
        for name, child in module._modules.items():
            if child is not None:
                path = prefix + name
                inner = f"{path}."
                visit(swapped.get(path, child), inner, [k for k in keys if k.startswith(inner)])

    visit(model, "", list(plain))
    return refused, missing, unexpected


def _tensors_back(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Give every key of ``before`` (a ``state_dict(keep_vars=True)``) its tensor again, where a load
    with ``assign`` (a model on the meta device) or ``_retie`` put another there."""
    for key, tensor in before.items():
        _put_tensor(model, key, tensor)


def load_sparse24_checkpoint(model: nn.Module, path: str | Path, *, strict: bool = True,
                             trainable: bool | None = None) -> LoadReport:
    """Load checkpoint folder ``path`` into ``model``: each sparse layer replaces the model's
    ``nn.Linear`` (or ``SparseLinear``, whose activation and out_dtype the new layer keeps, or
    ``SemiSparseLinear``) of that name (or a transformers ``Conv1D``, or a sparse layer made from one:
    the layer stored (in, out), conv1d_checkpoint.py) by a ``SparseLinear`` (its metadata encoded
    from the bitmask; groups with fewer than two nonzeros, all-zero groups and -0.0 included; fp8
    values under a config group of weights only, W8A16, as 16-bit W_q * s_w, as compressed-tensors
    decompresses them),
    on that module's device (the CPU for the meta device), under every name of that module; the
    other tensors load with ``load_state_dict`` (assigned, for a model built on the meta device).
    ``strict``: raise SP0914 when the model lacks a tensor of the checkpoint or the checkpoint lacks
    one of the model's. A layer to replace that has hooks or its own forward
    (:func:`~.sparsify.own_behaviour`), or whose weight or bias is tied to another module's tensor
    (:class:`~.sparsify.TiedTensors`: the new layer would untie them), is SP0914 too, before any
    layer is replaced. The config groups apply as compressed-tensors applies them; where vLLM's
    matching gives a layer another meaning, one :class:`~sparsile.integrations.vllm_match.VLLMMatchWarning`
    names them, before anything changes (docs/torch.md, "Which config group applies to a layer").
    Tied tensors stay tied: a key of the model whose tensor the checkpoint loads
    under another key is not missing, and two keys of one tensor with different values in the
    checkpoint are SP0914. All or nothing: every layer is built and the other tensors checked (a
    shape, ``strict``'s keys: SP0914) before anything changes; a failure inside torch's load puts the
    model's modules back (docs/torch.md, "When a call raises").

    ``trainable``: None (default) makes a layer a trainable
    :class:`~.training.SemiSparseLinear` where the model's module is one (a model that
    ``sparsify_(model, trainable=True)`` made), else a SparseLinear; True makes every sparse layer
    of the checkpoint trainable (to fine-tune it from a dense or inference model), False none. A
    trainable layer's master weight is the checkpoint's pruned weight and its mask the checkpoint's
    bitmask (trainable_checkpoint.py: SP0918 where the checkpoint's nonzero weights keep more than 2
    of 4 along a column, SP0916 for fp8 values); its master type is the model's module's weight type
    where that holds the values exactly (float32: mixed precision), else the values' type."""
    checked_model(model, "load_sparse24_checkpoint")
    checked_flag(strict, "strict", "load_sparse24_checkpoint")
    checked_trainable(trainable)
    path = _checked_path(path, "load_sparse24_checkpoint")
    config = read_config(path)
    tensors: dict[str, np.ndarray] = {}
    origin: dict[str, str] = {}
    for shard in shards(path):
        for key, tensor in load_file(shard).items():
            if key in tensors:  # (not a silent choice of one of the two values)
                raise IntegrationError(SP_CHECKPOINT_CONFIG, f"tensor {key!r} is in both {origin[key]} and "
                                       f"{shard.name}", help="keep one copy of each tensor: remove the stale "
                                       "file from the folder, or rewrite the shards")
            tensors[key], origin[key] = tensor, shard.name
    groups = _layer_groups(set(tensors))
    paths: dict[int, list[str]] = {}  # a module registered under several names: replaced under each
    for fqn, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(fqn)
    targets = _targets(model, groups, tensors, config)
    # (compressed-tensors' meaning is loaded; where vLLM's matching of the config differs: one warning, before
    # anything changes, so that an "error" warnings filter refuses the load)
    warn_vllm_matching(config, _linear_layers(model, set(groups)))
    replaced = list(dict.fromkeys(fqn for module in targets.values() for fqn in paths[id(module)]))
    replaced_keys = tuple(f"{fqn}." for fqn in replaced)
    used: set[str] = set()
    for name, prefix in groups.items():
        used |= {f"{prefix}.{p}" for p in _PARTS} | {f"{name}.bias"}
    ties = _tied_keys(model, set(tensors) - used, replaced_keys, tensors, config)
    report = LoadReport(sparse=replaced)
    bias_missing, bias_unexpected = [], []  # a bias of the model's linear the checkpoint lacks, or the reverse
    layers: dict[int, SparseLinear | SemiSparseLinear] = {}
    for name, prefix in groups.items():
        module = targets[name]
        has_bias = getattr(module, "bias", None) is not None
        if has_bias != (f"{name}.bias" in tensors):
            (bias_missing if has_bias else bias_unexpected).append(f"{name}.bias")
        layer = layers.get(id(module))
        if layer is None:
            trains = loads_trainable(module, trainable)
            if trains:
                check_trainable_target(module, name)
            layer = layers[id(module)] = _sparse_layer(tensors, name, prefix, module, config, trains)
        # (else a weight_scale of 16-bit values is left to load_state_dict: unexpected; a weight-only fp8 layer's
        # went into its dequantized values)
        if getattr(layer, "scale_w", None) is not None or (layer.weight_dtype != "e4m3"
                                                           and tensors[f"{prefix}.compressed"].dtype.itemsize == 1):
            used.add(f"{name}.weight_scale")
        if getattr(layer, "input_scale", None) is not None:
            used.add(f"{name}.input_scale")
    # every layer built (SP0913 leaves the model as it was), and the other tensors checked against the model
    # as it will be (a size mismatch, strict's missing or unexpected keys), before anything changes
    swaps = [(fqn, layer) for module_id, layer in layers.items() for fqn in paths[module_id]]
    plain = {key: host_to_torch(np.asarray(t)) for key, t in tensors.items() if key not in used}
    refused, missing, unexpected = _plain_load(model, dict(swaps), plain)
    if refused:
        _differ("; ".join(refused))
    loaded_by_tie = {k for keys in ties if any(k in plain for k in keys) for k in keys}
    report.missing = bias_missing + [k for k in missing if not k.startswith(replaced_keys) and k not in loaded_by_tie]
    report.unexpected = bias_unexpected + unexpected
    if strict:
        _check_keys(report)
    before = model.state_dict(keep_vars=True)  # (the tensors themselves: a load on the meta device assigns)
    undo = swap_modules(model, swaps)
    try:
        # a model built on the meta device (its tensors outside the layers just replaced)
        on_meta = any(t.is_meta for k, t in before.items() if not k.startswith(replaced_keys))
        try:
            result = model.load_state_dict(plain, strict=False, assign=on_meta)
        except RuntimeError as exc:  # torch's "Error(s) in loading state_dict": a tensor not copied
            if not str(exc).startswith("Error(s) in loading state_dict"):
                raise
            _differ("; ".join(line.strip() for line in str(exc).splitlines()[1:] if line.strip()))
        for keys in ties:
            present = [k for k in keys if k in plain]
            if present:
                _retie(model, keys, present[0])
        report.missing = bias_missing + [k for k in result.missing_keys
                                         if not k.startswith(replaced_keys) and k not in loaded_by_tie]
        report.unexpected = bias_unexpected + list(result.unexpected_keys)
        if strict:
            _check_keys(report)
    except BaseException:  # (a failure inside torch's load: the model's own modules and tensors back; tensors
        restore_modules(undo)  # it had copied in place keep the checkpoint's values)
        _tensors_back(model, before)
        raise
    return report


def _differ(details: str) -> None:
    raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint and the model differ: {details}",
                           help="load into a model built from the checkpoint's config") from None


def _check_keys(report: LoadReport) -> None:
    """SP0914 for strict loading when the checkpoint and the model do not have the same tensors."""
    if report.missing or report.unexpected:
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint and the model differ: missing "
                               f"{report.missing[:5]}, unexpected {report.unexpected[:5]}",
                               help="load into a model of the checkpoint's architecture, or pass strict=False")


def _check_no_other_weights(path: Path) -> None:
    """SP0912 when folder ``path`` already holds weights the loader would read instead of, or with, the
    new ``model.safetensors``: a shard index (its shards are read, the new file ignored: the old
    checkpoint loaded without a word) or another .safetensors file. Checked before anything is written."""
    if not path.is_dir():
        return
    other = sorted(f.name for f in path.iterdir() if f.name == INDEX or (f.suffix == ".safetensors"
                                                                        and f.name != WEIGHTS))
    if other:
        raise IntegrationError(SP_CHECKPOINT_CONFIG, f"{path} already holds {other[0]}"
                               + (f" (and {len(other) - 1} more)" if len(other) > 1 else "")
                               + f", which load_sparse24_checkpoint would read instead of or with the new {WEIGHTS}",
                               help="save into an empty folder, or remove the old checkpoint's weights first")


def save_sparse24_checkpoint(model: nn.Module, path: str | Path, *, config: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to folder ``path`` as a sparse-24-bitmask checkpoint: its ``SparseLinear``
    layers compressed as compressed-tensors writes them (``<name>.compressed``, ``.bitmask``,
    ``.shape`` (2, 1); bias in float32; fp8 values as F8_E4M3 with ``weight_scale`` (out, 1), and
    ``input_scale`` (1,) where the layer has a static one), every other tensor of its state dict as
    is (an ``nn.Linear``: a dense ``.weight``), and config.json (``config``, else the model's
    ``config.to_dict()`` when it has one, its quantization_config's scheme dropped (:data:`STALE_SCHEME`),
    plus the sparsity_config and, for fp8 layers, the
    quantization scheme: per-channel weights, inputs per token or static per tensor, the model's other
    linear layers in its ``ignore``). A SparseLinear whose in_features is not a multiple of 4 cannot be
    written sparse (SP0915): ``layer.to_linear()`` in its place writes it dense. Layers whose in_features
    or out_features is no multiple of 8 are written, with one ``VLLMShapeWarning`` naming them (vLLM's
    2:4 scheme cannot load them; vllm_shapes.py), and one ``VLLMMatchWarning`` naming the layers vLLM's
    matching of the written config reads otherwise than compressed-tensors (vllm_match.py), both before
    anything is written. A SparseLinear made from a transformers Conv1D (``transposed_from``) is
    written in GPT-2's layout: the tensors of its weight W (in, out) (conv1d_checkpoint.py), which
    transformers reads; one ``VLLMLayoutWarning`` names such layers (vLLM reads them (out, in)); an
    e4m3 one, or one of odd out_features, is SP0915. A trainable ``SemiSparseLinear`` is written as
    its ``to_sparse_linear()`` (its pruned weight in its compute type, compressed first where stale:
    the same bytes as a model converted first; trainable_checkpoint.py). Returns the folder."""
    checked_model(model, "save_sparse24_checkpoint")
    if config is not None and not isinstance(config, dict):
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, f"config must be a dict (config.json's contents), got "
                               f"{type(config).__name__}", help="pass model.config.to_dict() or leave it unset")
    path = _checked_path(path, "save_sparse24_checkpoint")
    # (every name of a layer registered under several, as its state dict names it)
    found = {name: m for name, m in model.named_modules(remove_duplicate=False)
             if isinstance(m, SparseLinear | SemiSparseLinear)}
    if not found:
        raise IntegrationError(SP_SPARSIFY_ARGUMENTS, "save_sparse24_checkpoint: the model has no SparseLinear layer "
                               "(nothing to write as sparse-24-bitmask)",
                               help="sparsify_(model, dtype=...) first, or save a dense model with "
                                    "safetensors.torch.save_model")
    narrow = next((name for name, m in found.items() if m.in_features % 4), None)
    if narrow is not None:  # (before anything is written)
        raise IntegrationError(SP_CHECKPOINT_WRITE, f"layer {narrow}: in_features = {found[narrow].in_features} is "
                               "not a multiple of 4; sparse-24-bitmask stores whole groups of 4",
                               help=_dense_help(narrow, found[narrow]))
    # a trainable layer as its inference form (its pruned weight in its compute type: what vLLM and transformers
    # read), the tensors a model whose layers were converted with to_sparse_linear() writes
    layers = written_layers(found)
    conv1d = check_conv1d_writes(layers)  # (SP0915 for a Conv1D-origin layer of e4m3 or an odd out_features)
    _check_no_other_weights(path)
    static = {name for name, m in layers.items() if m.weight_dtype == "e4m3" and m.input_scale is not None}
    base = dict(config) if config is not None else (model.config.to_dict() if hasattr(getattr(model, "config", None),
                                                                                       "to_dict") else {})
    # (a scheme the given config declares is another model's: its groups would claim the layers written here)
    quant = {k: v for k, v in (base.get("quantization_config") or {}).items() if k not in STALE_SCHEME}
    quant.update({"quant_method": "compressed-tensors", "sparsity_config": {
        "format": FORMAT, "sparsity_structure": "2:4", "targets": sorted(layers), "ignore": [],
        "registry_requires_subclass": False}})
    if any(m.weight_dtype == "e4m3" for m in layers.values()):
        quant.update(_quantization_scheme(model, layers, static))
    base["quantization_config"] = quant
    # (written all the same: compressed-tensors and this package read them; before anything is written, so that
    # an "error" warnings filter refuses the save)
    warn_vllm_shapes(layers)
    warn_vllm_layout(conv1d, [n for n in conv1d if layers[n].in_features == layers[n].out_features])
    warn_vllm_matching(base, _linear_layers(model, set(layers)), saving=True)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # (a file where a folder of the path should be, no permission)
        raise IntegrationError(SP_CHECKPOINT_CONFIG, f"cannot create {path}: {exc.strerror or exc}",
                               help="pass a folder that can be created, or an existing one") from None
    tensors: dict[str, np.ndarray] = {}
    for key, value in model.state_dict().items():
        if not _in_layers(key, layers):
            tensors[key] = np.ascontiguousarray(as_host_array(value.detach(), key))
    for name, layer in layers.items():
        # as compressed-tensors' Sparse24BitMaskTensor.dict names and shapes them (its reader, and vLLM's, take
        # nothing else): <name>.compressed (fp8 as F8_E4M3), .bitmask, .shape (2, 1) int64
        prefix = name or "weight"
        words = np.ascontiguousarray(as_host_array(layer.meta.detach(), "meta")).view(np.uint32)
        indices = decode_metadata(words, "sm90", layer.weight_dtype, m=layer.out_features, k=layer.in_features)
        values = as_host_array(layer.values.detach(), "values")
        # (a layer made from a transformers Conv1D: its weight W (in, out) in GPT-2's layout, conv1d_checkpoint.py)
        layout = bitmask_layout if layer.transposed_from is None else conv1d_bitmask_layout
        compressed, bitmask, shape = layout(values, indices, layer.in_features, name)
        if layer.weight_dtype == "e4m3":
            tensors[f"{name}.weight_scale"] = as_host_array(layer.scale_w.detach(), "scale_w").reshape(-1, 1)
            if name in static:  # (compressed-tensors' static per-tensor input scale, (1,))
                tensors[f"{name}.input_scale"] = as_host_array(layer.input_scale.detach(), "input_scale").reshape(1)
        tensors.update({f"{prefix}.compressed": compressed, f"{prefix}.bitmask": bitmask,
                        f"{prefix}.shape": shape.reshape(-1, 1)})
        if layer.bias is not None:
            tensors[f"{name}.bias"] = as_host_array(layer.bias.detach(), "bias")
    save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(base, indent=2, sort_keys=True, default=str))
    return path


def _in_layers(key: str, layers: dict[str, SparseLinear]) -> bool:
    """Whether state-dict ``key`` is a tensor of one of ``layers`` (written sparse, by name): its own,
    or one under it (a parametrized weight's ``<name>.parametrizations.weight.original``, the unpruned
    master weight of a SemiSparseLinear, which went into the file next to the sparse layer before)."""
    return "" in layers or any(key.startswith(f"{name}.") for name in layers)


def _dense_help(name: str, layer: SparseLinear | SemiSparseLinear) -> str:
    """SP0915's help for layer ``name`` of in_features no multiple of 4: a dense layer in its place
    (an nn.Linear; a transformers Conv1D for a layer made from one, whose weight transformers reads
    (in, out) under its name); a trainable layer's through its inference form, ``to_sparse_linear()``."""
    if isinstance(layer, SemiSparseLinear):
        at = attribute_path("model", name)
        return _dense_help(name, layer.to_sparse_linear()).replace(f"{at}.to_linear()",
                                                                   f"{at}.to_sparse_linear().to_linear()")
    if layer.transposed_from is None:
        return (f"write it dense: put an nn.Linear in its place before saving ({dense_in_place(name, layer)}; "
                f"save_sparse24_checkpoint writes an nn.Linear as a plain {name}.weight)")
    return (f"write it dense: put a {layer.transposed_from} back in its place before saving, not an nn.Linear, whose "
            f"weight (out, in) transformers would read transposed under a Conv1D's name "
            f"({dense_in_place(name, layer)}); save_sparse24_checkpoint writes it as a plain {name}.weight (in, out), "
            "as transformers reads a Conv1D's")


def _quantization_scheme(model: nn.Module, layers: dict[str, SparseLinear], static: set[str]) -> dict[str, Any]:
    """config_groups and ignore of an fp8 checkpoint (compressed-tensors' scheme, as vLLM reads it):
    e4m3 weights per channel; inputs per token (dynamic), or per tensor with the layer's static
    ``input_scale`` (one group of each where both occur, each naming its layers); every other linear
    layer of the model (an nn.Linear written dense, a 16-bit sparse layer, a dense transformers Conv1D,
    which vLLM builds as a linear class that ``Linear`` matches) ignored, so that a reader does not take
    it for fp8; the format ``float-quantized`` (at the top and in each group) and the status
    ``compressed``, as compressed-tensors writes fp8 W8A8."""
    fp8 = sorted(name for name, m in layers.items() if m.weight_dtype == "e4m3")
    weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
    modes = {"token": [n for n in fp8 if n not in static], "tensor": [n for n in fp8 if n in static]}
    groups = {}
    for strategy, names in modes.items():
        if names:
            inputs = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True,
                      "dynamic": strategy == "token"}
            targets = ["Linear"] if len(names) == len(fp8) else names
            groups[f"group_{len(groups)}"] = {"targets": targets, "weights": weights, "input_activations": inputs,
                                              "format": FLOAT_QUANTIZED}
    # (a dense transformers Conv1D too: no "Linear" for compressed-tensors, but a linear class in vLLM, which the
    # target "Linear" would quantize)
    ignore = sorted(name for name, m in model.named_modules(remove_duplicate=False)
                    if name and (isinstance(m, nn.Linear) or is_conv1d(m) or (name in layers and name not in fp8)))
    # (without a format, compressed-tensors' QuantizationConfig reads "fakequant", which names no compressor:
    # its ModelCompressor, which vLLM's 2:4 scheme builds from this config, raised KeyError)
    return {"config_groups": groups, "ignore": ignore, "format": FLOAT_QUANTIZED, "quantization_status": "compressed"}
