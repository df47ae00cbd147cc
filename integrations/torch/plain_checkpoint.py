"""The plain tensors of a sparse-24-bitmask checkpoint (every tensor but a sparse layer's) as
``load_sparse24_checkpoint`` loads them.

:func:`plain_load` finds, before anything changes, what ``load_state_dict`` will meet once the
checkpoint's layers replace the model's (refused shapes, missing and unexpected keys);
:func:`tied_keys` finds the model's keys that name one tensor (tied parameters, a module under
several names), which :func:`retie` ties again after a load that assigns; :func:`tensors_back`
gives the model its own tensors back where a load fails. :func:`same_array` compares two of the
checkpoint's tensors bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import SP_CHECKPOINT_MODULE, IntegrationError
from ..safetensors import dtype_name
from .atomic import own_tensors, refused_tensors


def same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Whether two of the checkpoint's tensors are the same bits (both absent included)."""
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

def tied_keys(model: nn.Module, plain: set[str], replaced: tuple[str, ...], tensors: dict[str, np.ndarray],
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
        differ = next((k for k in present[1:] if not same_array(tensors[present[0]], tensors[k])), None)
        if differ is not None:
            build = ("build it from the checkpoint's config (tie_word_embeddings = false), or "
                     if config.get("tie_word_embeddings") is False else "")
            raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint holds different values for {present[0]} "
                                   f"and {differ}, which are one tensor of the model (tied)",
                                   help=f"load into a model where they are two tensors: {build}give one of them a "
                                        "copy of its own before loading")
    return groups


def retie(model: nn.Module, keys: list[str], source: str) -> None:
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


def plain_load(model: nn.Module, swapped: dict[str, nn.Module], plain: dict[str, torch.Tensor]) -> tuple[
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


def check_scaled_weights(tensors: dict[str, np.ndarray], plain: set[str], unexpected: list[str]) -> None:
    """SP0914 for a plain 8-bit ``<name>.weight`` (fp8, int8: a layer quantized but not sparse, as
    llm-compressor writes a layer its quantization scheme names and its sparsity does not) whose
    ``<name>.weight_scale`` the model has no tensor for (``unexpected``, from :func:`plain_load`):
    load_state_dict would copy the quantized values into the model's weight without their scale.
    Refused under either ``strict``: before, ``strict=False`` loaded W_q for W_q * s_w, the scale
    only reported unexpected."""
    for key in unexpected:
        if not key.endswith(".weight_scale"):
            continue
        weight = key.removesuffix("_scale")
        stored = tensors.get(weight)
        if weight not in plain or weight in unexpected or stored is None or np.asarray(stored).dtype.itemsize != 1 \
                or np.asarray(stored).dtype == np.bool_:
            continue
        name = weight.removesuffix(".weight")
        raise IntegrationError(SP_CHECKPOINT_MODULE, f"the checkpoint's {weight} is {dtype_name(stored.dtype)} with "
                               f"a {key} (a quantized layer stored dense), and {name} of the model has no "
                               "weight_scale: loading would copy the quantized values into its weight without "
                               "their scale",
                               help=f"sparsile loads quantized weights as sparse layers only: write {name} as a "
                                    f"sparse layer, or its weight dequantized ({weight} * {key}, in the model's "
                                    "type) without a weight_scale; strict=False does not skip it")


def tensors_back(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    """Give every key of ``before`` (a ``state_dict(keep_vars=True)``) its tensor again, where a load
    with ``assign`` (a model on the meta device) or ``retie`` put another there."""
    for key, tensor in before.items():
        _put_tensor(model, key, tensor)
