"""Write a model with ``SparseLinear`` layers as a compressed-tensors ``sparse-24-bitmask`` checkpoint.

:func:`save_sparse24_checkpoint` writes the folder checkpoint.py reads (its docstring describes the
format): ``model.safetensors`` (:data:`WEIGHTS`), each sparse layer compressed as compressed-tensors
writes it (a Conv1D-made layer in GPT-2's layout: conv1d_checkpoint.py; a trainable layer as its
inference form: trainable_checkpoint.py), and ``config.json`` with the sparsity_config and, for fp8
layers, the quantization scheme (:func:`_quantization_scheme`). :func:`checked_path` checks the
folder argument of the writer and of the loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from ...stdlib.sparsity import as_host_array, decode_metadata
from ..errors import (
    SP_CHECKPOINT_CONFIG,
    SP_CHECKPOINT_WRITE,
    SP_SPARSIFY_ARGUMENTS,
    IntegrationError,
    attribute_path,
)
from ..safetensors import save_file
from ..sparse24 import CONFIG, FORMAT, INDEX, bitmask_layout, conv1d_bitmask_layout
from ..vllm_match import warn_vllm_matching
from ..vllm_shapes import dense_in_place, warn_vllm_layout, warn_vllm_shapes
from .conv1d import is_conv1d
from .conv1d_checkpoint import check_conv1d_writes
from .layer_args import checked_model
from .layer_checkpoint import linear_layers
from .linear import SparseLinear
from .trainable_checkpoint import written_layers
from .training import SemiSparseLinear

WEIGHTS = "model.safetensors"
FLOAT_QUANTIZED = "float-quantized"  # compressed-tensors' format of fp8 weights and activations
STALE_SCHEME = ("config_groups", "ignore", "format", "quantization_status", "kv_cache_scheme")
"""The keys of a given config's quantization_config that the writer drops: the scheme of the model the
config came from, not of the layers written (an fp8 one is written anew). Dropped too: the same keys at
the top level where it holds ``config_groups``, any ``sparsity_config`` or nested ``quantization_config``
outside the written one, and ``compression_config`` (:func:`_without_schemes`)."""


def checked_path(path: Any, caller: str) -> Path:
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
    ``config.to_dict()`` when it has one, every scheme it declares dropped (:data:`STALE_SCHEME`),
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
    path = checked_path(path, "save_sparse24_checkpoint")
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
    base, quant = _without_schemes(base)
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
    warn_vllm_matching(base, linear_layers(model, set(layers)), saving=True)
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
            tensors[_key(name, "weight_scale")] = as_host_array(layer.scale_w.detach(), "scale_w").reshape(-1, 1)
            if name in static:  # (compressed-tensors' static per-tensor input scale, (1,))
                tensors[_key(name, "input_scale")] = as_host_array(layer.input_scale.detach(), "input_scale").reshape(1)
        tensors.update({f"{prefix}.compressed": compressed, f"{prefix}.bitmask": bitmask,
                        f"{prefix}.shape": shape.reshape(-1, 1)})
        if layer.bias is not None:
            tensors[_key(name, "bias")] = as_host_array(layer.bias.detach(), "bias")
    save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(base, indent=2, sort_keys=True, default=str))
    return path


def _without_schemes(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the given ``config`` without any compression scheme, its quantization_config without one):
    every place a reader takes a scheme or sparsity_config from (sparse24.py's holders: the top
    level, ``quantization_config``, ``compression_config`` and a ``quantization_config`` inside
    either) emptied of them, so that the written config holds one scheme, the one the weights have,
    under ``quantization_config``. ``compression_config`` (compressed-tensors' older name for that
    holder: nothing in it describes the weights written) is dropped whole; the top level loses its
    ``sparsity_config`` and, where it holds ``config_groups``, the :data:`STALE_SCHEME` keys (other
    top-level keys are the model's own). Before, only quantization_config's scheme was dropped: a
    stale one at the top level (which the loader reads first) or under compression_config was kept."""
    base = {k: v for k, v in config.items() if k not in ("compression_config", "sparsity_config")}
    if isinstance(base.get("config_groups"), dict):
        base = {k: v for k, v in base.items() if k not in STALE_SCHEME}
    quant = base.get("quantization_config")
    quant = {k: v for k, v in quant.items() if k not in (*STALE_SCHEME, "sparsity_config", "quantization_config")} \
        if isinstance(quant, dict) else {}
    return base, quant


def _key(name: str, part: str) -> str:
    """The state-dict key of tensor ``part`` of layer ``name``: ``<name>.<part>``, or ``part`` for the
    root module (name ""), as the layer's own ``state_dict()`` and compressed-tensors name a root
    module's tensors (before: ``.bias``, which no reader maps to the layer)."""
    return f"{name}.{part}" if name else part


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
