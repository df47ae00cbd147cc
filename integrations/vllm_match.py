"""Where vLLM gives a layer of a compressed-tensors checkpoint another meaning than compressed-tensors.

A checkpoint means what compressed-tensors (its producer's library) makes of it:
:func:`~sparsile.integrations.sparse24.scheme_group` picks a layer's config group, and a layer is
sparse where the file holds its ``compressed`` tensors. vLLM reads the same config.json with rules of
its own (docs/torch.md, "Which config group applies to a layer"), written again here from their
description to tell the two apart. They are those of vLLM main from PR #28878 (merged November 2025:
the ``ignore`` check moved into ``get_scheme_dict``) up to PR #36799 (merged March 2026), which removed
vLLM's 2:4 scheme (vLLM 0.19.1 and later serve no 2:4 checkpoint, and later vLLM refuses any
``sparsity_config`` with targets when it reads the config); later changes to vLLM's matching (a layer
no target names left unquantized, PR #41965; fused members tried before the class, PR #49483) are
changes of a vLLM that no longer reads these checkpoints, and are not followed here:

* the targets of ``config_groups`` in the config's order (a target listed twice keeps its first place
  and takes the last group's scheme), tried in three steps, each giving the first target that fits:
  one whose name or ``re:`` pattern (``re.match``) names the layer, else one contained,
  case-insensitively, in vLLM's class name (taken here as ``Linear``, the end of every vLLM linear
  class: ``Linear`` matches, ``Module`` and subclass names do not), else, for a fused layer, the target
  of its first member where every member is named by one; a step whose target is the empty string
  ``""`` (contained in every class name) gives nothing, as vLLM chains the steps with ``or``, and the
  next step is tried; no target at all: vLLM stops;
* fused layers: q/k/v are one ``qkv_proj``, gate/up one ``gate_up_proj``; one scheme for all members;
* ``ignore``: names and patterns only (no class names); an ignored layer is not quantized, and is
  still 2:4 sparse where the ``sparsity_config`` names it (the check is in ``get_scheme_dict``, the
  quantization's, since PR #28878); a fused layer whose members disagree: vLLM stops;
* ``lm_head`` is an embedding class in vLLM: dense and not quantized there (:data:`NOT_LINEAR`);
* ``sparsity_config``: its ``targets`` less the strings its ``ignore`` lists (a string difference:
  an ``ignore`` entry that is not itself one of the targets takes nothing away), matched as above;
  a matched layer is sparse where its scheme suits vLLM's 2:4 kernel (not quantized, or 8-bit
  weights per tensor or channel with 8-bit inputs per tensor or token).

:func:`warn_vllm_matching` warns (:class:`VLLMMatchWarning`) naming the layers whose meaning differs.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .sparse24 import scheme_group, target_names_module

FUSED: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                     "gate_up_proj": ("gate_proj", "up_proj")}
"""vLLM's fused linear (last name component) -> the checkpoint's layers it holds, in order."""

VLLM_CLASS = "Linear"
"""The part of vLLM's linear class names (RowParallelLinear, QKVParallelLinear, ...) a class target
is compared with."""

NOT_LINEAR = ("lm_head",)
"""Layers (last name component) vLLM builds as no linear class (``lm_head``: ParallelLMHead, an
embedding class): compressed-tensors' linear schemes never reach them, so vLLM reads them dense and not
quantized, whatever the config says."""

SHOWN = 8
"""How many of the layers the warning names (then how many more there are)."""

SPARSE_FORMATS = ("dense", "sparse-24-bitmask")
"""The sparsity formats vLLM's 2:4 scheme takes (``dense``: a 2:4 weight stored dense)."""


class VLLMMatchWarning(UserWarning):
    """A checkpoint was loaded with compressed-tensors' meaning where vLLM's matching of its config
    gives some layers another one (another group's scheme, quantized or not, sparse or dense) or
    stops (no target for a layer, fused members ignored apart)."""


@dataclass(frozen=True)
class Meaning:
    """What a reader makes of one layer: sparse or dense, and its quantization (None: not quantized;
    else the weights' and inputs' (type, bits, strategy, dynamic), None for inputs not quantized)."""

    sparse: bool
    scheme: tuple[Any, Any] | None

    def __str__(self) -> str:
        shape = "2:4 sparse" if self.sparse else "dense"
        if self.scheme is None:
            return f"{shape}, not quantized"
        weights, inputs = self.scheme
        told = f"{shape}, weights {_told(weights)}"
        return told + (f", inputs {_told(inputs)}" if inputs is not None else ", inputs not quantized")


def _told(args: tuple[Any, ...]) -> str:
    kind, bits, strategy, dynamic = args
    return f"{kind}{bits} per {strategy}{' dynamic' if dynamic else ''}"


def _args(args: Any) -> tuple[Any, ...] | None:
    """A group's ``weights`` / ``input_activations`` as (type, bits, strategy, dynamic), with
    compressed-tensors' defaults (int, 8, tensor, false)."""
    if not isinstance(args, dict):
        return None
    return (args.get("type", "int"), args.get("num_bits", 8), args.get("strategy") or "tensor",
            args.get("dynamic", False) is not False)


def _scheme(group: Any) -> tuple[Any, Any] | None:
    if not isinstance(group, dict):
        return None
    weights, inputs = _args(group.get("weights")), _args(group.get("input_activations"))
    return None if weights is None and inputs is None else (weights, inputs)


def _strings(value: Any) -> list[str]:
    return [t for t in value if isinstance(t, str)] if isinstance(value, list) else []


def _in_class(target: str) -> bool:
    """vLLM's class test: a pattern matching its class name, else a target contained in it."""
    return target_names_module(target, VLLM_CLASS) if target.startswith("re:") else target.lower() in VLLM_CLASS.lower()


def _target(name: str, members: tuple[str, ...], targets: list[str]) -> str | None:
    """The target vLLM picks for layer ``name`` (fused of ``members``, or none) among ``targets``: the
    first step (name, class, members) whose first fitting target is not ``""``, else None."""
    by_name = next((t for t in targets if target_names_module(t, name)), None)
    by_class = next((t for t in targets if _in_class(t)), None)
    each = [next((t for t in targets if target_names_module(t, m)), None) for m in members]
    by_members = each[0] if each and all(each) else None
    return by_name or by_class or by_members or None


def vllm_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The quantization config vLLM reads from a config.json: ``quantization_config``, else
    ``compression_config`` (a sparsity_config at the top level: none)."""
    for key in ("quantization_config", "compression_config"):
        if isinstance(config.get(key), dict):
            return config[key]
    return {}


def _ignored(name: str, members: tuple[str, ...], ignore: list[str]) -> bool | None:
    """Whether vLLM's ``ignore`` takes layer ``name`` out (None: its fused members disagree, and vLLM stops)."""
    if not members or name in ignore:
        return any(target_names_module(t, name) for t in ignore)
    each = {any(target_names_module(t, m) for t in ignore) for m in members}
    return each.pop() if len(each) == 1 else None


def _cutlass_24(scheme: tuple[Any, Any] | None) -> bool:
    """Whether vLLM's 2:4 kernel takes a scheme: none, or 8-bit weights per tensor / channel with
    8-bit inputs per tensor / token."""
    if scheme is None:
        return True
    weights, inputs = scheme
    return (weights is not None and inputs is not None and weights[2] in ("tensor", "channel")
            and inputs[2] in ("tensor", "token") and weights[1] == inputs[1] == 8)


def vllm_meaning(config: Mapping[str, Any], name: str, members: tuple[str, ...] = ()) -> Meaning | str:
    """vLLM's meaning of layer ``name`` (a fused one of the checkpoint's ``members``, or ``()``), or
    why vLLM stops there."""
    if name.rpartition(".")[2] in NOT_LINEAR:  # no compressed-tensors scheme reaches it in vLLM
        return Meaning(False, None)
    quant = vllm_view(config)
    ignored = _ignored(name, members, _strings(quant.get("ignore")))
    if ignored is None:
        return f"its members {', '.join(members)} are not all in ignore or all out of it"
    groups = quant.get("config_groups") if isinstance(quant.get("config_groups"), dict) else {}
    schemes: dict[str, tuple[Any, Any] | None] = {}
    for group in groups.values():
        for target in _strings(group.get("targets") if isinstance(group, dict) else None):
            schemes[target] = _scheme(group)
    scheme = None
    if schemes and not ignored:  # (an ignored layer is not quantized; its sparsity is read below)
        found = _target(name, members, list(schemes))
        if found is None:
            return "no target of config_groups names it"
        scheme = schemes[found]
    sparsity = quant.get("sparsity_config")
    if isinstance(sparsity, dict):
        left_out = set(_strings(sparsity.get("ignore")))
        targets = [t for t in _strings(sparsity.get("targets")) if t not in left_out]
        if (_target(name, members, targets) is not None and sparsity.get("sparsity_structure") == "2:4"
                and sparsity.get("format") in SPARSE_FORMATS and _cutlass_24(scheme)):
            return Meaning(sparsity.get("format") != "dense", scheme)
    return Meaning(False, scheme)


def ct_meaning(config: Mapping[str, Any], name: str, classes: tuple[str, ...], sparse: bool) -> Meaning:
    """compressed-tensors' meaning of layer ``name`` (of the classes ``classes``): sparse where the file
    holds its compressed tensors, the scheme of the group :func:`scheme_group` picks."""
    found = scheme_group(dict(config), name, classes)
    return Meaning(sparse, None if found is None else _scheme(found[1]))


def vllm_differences(config: Mapping[str, Any], layers: Mapping[str, tuple[tuple[str, ...], bool]]) -> list[str]:
    """``"name: ..."`` for each linear layer of ``layers`` (name -> (its classes, whether the
    checkpoint holds it sparse)) that vLLM reads otherwise than compressed-tensors, in order; the
    members of a fused layer (all of them in ``layers``) under the fused layer's name."""
    told, done = [], set()
    for name in layers:
        if name in done:
            continue
        parent, dot, last = name.rpartition(".")
        fused = next(((f, ms) for f, ms in FUSED.items() if last in ms
                      and all(f"{parent}{dot}{m}" in layers for m in ms)), None)
        if fused is None:
            vllm_name, members = name, ()
            names = [name]
        else:
            vllm_name, members = f"{parent}{dot}{fused[0]}", tuple(f"{parent}{dot}{m}" for m in fused[1])
            names = list(members)
        done.update(names)
        theirs = vllm_meaning(config, vllm_name, members)
        ours = {n: ct_meaning(config, n, *layers[n]) for n in names}
        if isinstance(theirs, str):
            told.append(f"{vllm_name}: vLLM stops ({theirs})")
        elif any(m != theirs for m in ours.values()):
            what = "; ".join(f"{n} {m}" for n, m in ours.items()) if members else str(ours[name])
            told.append(f"{vllm_name}: compressed-tensors reads {what}; vLLM reads {theirs}")
    return told


def warn_vllm_matching(config: Mapping[str, Any], layers: Mapping[str, tuple[tuple[str, ...], bool]],
                       stacklevel: int = 3, saving: bool = False) -> None:
    """One :class:`VLLMMatchWarning` naming the layers of ``layers`` (:func:`vllm_differences`) that
    vLLM reads otherwise than compressed-tensors, if any (``saving``: for the writer, else the loader)."""
    told = vllm_differences(config, layers)
    if not told:
        return
    more = f"; and {len(told) - SHOWN} more" if len(told) > SHOWN else ""
    head = ("save_sparse24_checkpoint: compressed-tensors and load_sparse24_checkpoint read this checkpoint as "
            "written; vLLM matches the config.json written with it" if saving else
            "load_sparse24_checkpoint: loaded as compressed-tensors reads it; vLLM matches this config.json's groups")
    warnings.warn(
        f"{head} otherwise for {len(told)} layer{'s' if len(told) != 1 else ''}: {'; '.join(told[:SHOWN])}{more}. vLLM "
        "takes the first target in the config's order, class names by substring, q/k/v and gate/up as one layer, "
        "ignore by names and patterns only (an ignored layer still 2:4 where the sparsity_config names it), and "
        "the sparsity_config's ignore as strings taken off its targets "
        f"(docs/torch.md, 'Which config group applies to a layer'); {_FOR_VLLM[saving]}", VLLMMatchWarning,
        stacklevel=stacklevel)


_FOR_VLLM = {False: "for vLLM, give such layers targets both read alike (exact names)",
             True: "for vLLM, give the members of each q/k/v and gate/up one type and one input scheme (all "
                   "static or all per token)"}
