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

This module is the loader, :func:`load_sparse24_checkpoint`: the layers it builds are
layer_checkpoint.py's, its plain tensors (tied ones included) plain_checkpoint.py's. The writer,
:func:`save_sparse24_checkpoint`, is save_checkpoint.py's (importable from here too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ..errors import (
    SP_CHECKPOINT_CONFIG,
    SP_CHECKPOINT_LAYER,
    SP_CHECKPOINT_MODULE,
    IntegrationError,
    attribute_path,
)
from ..safetensors import load_file
from ..sparse24 import check_index, checked_shape, read_config, shards
from ..vllm_match import warn_vllm_matching
from .atomic import restore_modules, swap_modules
from .conv1d_checkpoint import checked_conv1d_target, conv1d_layout
from .fuse import checked_flag
from .layer_args import checked_model, host_to_torch
from .layer_checkpoint import ZERO_POINTS, linear_layers, module_classes, sparse_layer
from .linear import SparseLinear
from .plain_checkpoint import check_scaled_weights, plain_load, retie, same_array, tensors_back, tied_keys
from .save_checkpoint import checked_path, save_sparse24_checkpoint
from .sparsify import TiedTensors, own_behaviour
from .trainable_checkpoint import check_trainable_target, checked_trainable, loads_trainable
from .training import SemiSparseLinear

_PARTS = ("compressed", "bitmask", "shape")
STORED_TYPES = {"bfloat16": "bf16", "float16": "f16"}
"""The layer type (``weight_dtype``) of 16-bit stored values kept as they are."""


@dataclass
class LoadReport:
    """What :func:`load_sparse24_checkpoint` did: the names it put its layers under (a module
    registered under several names: each), the plain tensors the model lacks (``unexpected``)
    or the checkpoint lacks (``missing``), and the layers whose values it converted (``converted``)."""

    sparse: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    converted: list[str] = field(default_factory=list)
    """The checkpoint's layers whose stored values (F32, F64, or the other 16-bit type than the
    model's) were converted to the model's 16-bit type (docs/torch.md, "The layer's type")."""


def _layer_groups(names: set[str]) -> dict[str, str]:
    """module name -> tensor prefix, for every prefix with a ``.compressed`` tensor; SP0913 for a
    layer under both of its prefixes (``<name>`` and ``<name>.weight``: before, the second was
    loaded and the first left to load_state_dict, unexpected)."""
    groups: dict[str, str] = {}
    for name in sorted(names):
        if name.endswith(".compressed"):
            prefix = name[:-len(".compressed")]
            missing = [p for p in _PARTS if f"{prefix}.{p}" not in names]
            if missing:
                raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {prefix}: the checkpoint has {prefix}.compressed "
                                       f"but no {', '.join(f'{prefix}.{p}' for p in missing)}",
                                       help="write compressed, bitmask and shape for every sparse layer")
            layer = prefix.removesuffix(".weight") if prefix.endswith(".weight") else prefix
            other = groups.setdefault(layer, prefix)
            if other != prefix:
                both = " and as ".join(", ".join(f"{p}.{part}" for part in _PARTS) for p in (other, prefix))
                raise IntegrationError(SP_CHECKPOINT_LAYER, f"layer {layer}: the checkpoint holds it twice, as {both}",
                                       help="write each sparse layer once (compressed-tensors names them "
                                            "<layer>.compressed)")
    return groups


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


def _layer_tensors(tensors: dict[str, np.ndarray], name: str, prefix: str) -> list[np.ndarray | None]:
    """The checkpoint's tensors of sparse layer ``name`` (None for those it lacks)."""
    keys = [f"{prefix}.{p}" for p in _PARTS] + [f"{name}.bias", f"{name}.weight_scale", f"{name}.input_scale"] + [
        f"{name}.{part}" for part in ZERO_POINTS]
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
        if other != name and not all(same_array(a, b) for a, b in zip(
                _layer_tensors(tensors, other, groups[other]), _layer_tensors(tensors, name, prefix), strict=True)):
            raise IntegrationError(SP_CHECKPOINT_MODULE, f"layers {other} and {name} are one module of the model, "
                                   "but the checkpoint holds different layers for them",
                                   help="load into a model where they are two modules, or write the layer once")
        targets[name] = module
    return targets


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
    A layer computes in the model's module's type where that is bf16 or f16, values of another type
    (F32, F64, the other 16-bit type) converted to it as transformers' load_state_dict casts them
    (``report.converted`` names those layers; before, f16 values in a bf16 model kept f16 and cast x
    to it: inf beyond ±65504); a float32 or e4m3 module's: the stored 16-bit type, or bf16.
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
    path = checked_path(path, "load_sparse24_checkpoint")
    config = read_config(path)
    tensors: dict[str, np.ndarray] = {}
    origin: dict[str, Path] = {}
    for shard in shards(path):
        for key, tensor in load_file(shard).items():
            if key in tensors:  # (not a silent choice of one of the two values)
                raise IntegrationError(SP_CHECKPOINT_CONFIG, f"tensor {key!r} is in both {origin[key].name} and "
                                       f"{shard.name}", help="keep one copy of each tensor: remove the stale "
                                       "file from the folder, or rewrite the shards")
            tensors[key], origin[key] = tensor, shard
    check_index(path, origin)  # (SP0912: the index places a tensor in a file that lacks it)
    groups = _layer_groups(set(tensors))
    paths: dict[int, list[str]] = {}  # a module registered under several names: replaced under each
    for fqn, module in model.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(fqn)
    targets = _targets(model, groups, tensors, config)
    # (compressed-tensors' meaning is loaded; where vLLM's matching of the config differs: one warning, before
    # anything changes, so that an "error" warnings filter refuses the load)
    warn_vllm_matching(config, linear_layers(model, set(groups)))
    replaced = list(dict.fromkeys(fqn for module in targets.values() for fqn in paths[id(module)]))
    replaced_keys = tuple(f"{fqn}." for fqn in replaced)
    used: set[str] = set()
    for name, prefix in groups.items():
        used |= {f"{prefix}.{p}" for p in _PARTS} | {f"{name}.bias"}
    ties = tied_keys(model, set(tensors) - used, replaced_keys, tensors, config)
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
            layer = layers[id(module)] = sparse_layer(tensors, name, prefix, module, config, trains)
        stored = tensors[f"{prefix}.compressed"].dtype
        if stored.itemsize > 1 and STORED_TYPES.get(stored.name) != layer.weight_dtype:
            report.converted.append(name)
        # (else a weight_scale of 16-bit values is left to load_state_dict: unexpected; a weight-only fp8 layer's
        # went into its dequantized values)
        if getattr(layer, "scale_w", None) is not None or (layer.weight_dtype != "e4m3"
                                                           and tensors[f"{prefix}.compressed"].dtype.itemsize == 1):
            used.add(f"{name}.weight_scale")
        if getattr(layer, "input_scale", None) is not None:
            used.add(f"{name}.input_scale")
        if tensors[f"{prefix}.compressed"].dtype.itemsize == 1:  # (all zero: sparse_layer refuses others, SP0913)
            used |= {f"{name}.{part}" for part in ZERO_POINTS}
    # every layer built (SP0913 leaves the model as it was), and the other tensors checked against the model
    # as it will be (a size mismatch, strict's missing or unexpected keys), before anything changes
    swaps = [(fqn, layer) for module_id, layer in layers.items() for fqn in paths[module_id]]
    plain = {key: host_to_torch(np.asarray(t)) for key, t in tensors.items() if key not in used}
    refused, missing, unexpected = plain_load(model, dict(swaps), plain)
    if refused:
        _differ("; ".join(refused))
    check_scaled_weights(tensors, set(plain), unexpected)  # (an 8-bit dense weight whose scale has no place)
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
                retie(model, keys, present[0])
        report.missing = bias_missing + [k for k in result.missing_keys
                                         if not k.startswith(replaced_keys) and k not in loaded_by_tie]
        report.unexpected = bias_unexpected + list(result.unexpected_keys)
        if strict:
            _check_keys(report)
    except BaseException:  # (a failure inside torch's load: the model's own modules and tensors back; tensors
        restore_modules(undo)  # it had copied in place keep the checkpoint's values)
        tensors_back(model, before)
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


__all__ = ["LoadReport", "load_sparse24_checkpoint", "module_classes", "save_sparse24_checkpoint"]
