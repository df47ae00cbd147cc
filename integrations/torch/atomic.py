"""All or nothing: the edits sparsile makes to a user's model either happen whole or leave the model
as it was when they raise (a diagnostic the user can fix and retry), never half done.

* :func:`swap_modules` / :func:`restore_modules`: the module swaps of ``sparsify_`` and
  ``load_sparse24_checkpoint``, undone when a later step of the call raises.
* :func:`refused_tensors` / :func:`withhold_refused`: a sparse layer's ``_load_from_state_dict``
  copies all of its tensors or none (torch copies each tensor that fits and reports the others, so a
  ``values`` of another shape left the layer with the new ``meta`` and its old values: a weight of
  neither state dict).
* :func:`strict_key_errors`: a layer's own ``load_state_dict(strict=True)`` refuses missing or
  unexpected keys before it copies anything (torch copies first, then raises).
* :func:`in_own_types`: ``load_state_dict(assign=True)`` gives a layer's typed tensors (compressed
  values, metadata, scales, masks) the types a copy gives them, not the state dict's.
* :func:`restoring_tensors`: a layer's ``_apply`` (``.to``, ``.cuda``, ``.half``) that raises midway
  (a device out of memory) puts back the tensors it had converted.
* :func:`copy_all`: new tensor values computed whole (every trainable layer's mask and compressions
  of W and Wᵀ, for ``reprune_`` and ``SemiSparseLinear.refresh``) before the first is copied in place
  (a device out of memory at the third layer left the first two re-pruned), the destinations the same
  tensor objects at the same addresses (launch records and CUDA graphs hold them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def swap_modules(model: nn.Module, swaps: Iterable[tuple[str, nn.Module]]) -> list[tuple[nn.Module, str, nn.Module]]:
    """Register each ``(fqn, module)`` of ``swaps`` under its name in ``model``, in the train / eval mode
    of the module it replaces (a new module is in training mode: a model in eval mode had its sparse layers
    in training mode); the undo list for :func:`restore_modules` ((parent, child name, the module it held),
    in order)."""
    undo: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for fqn, module in swaps:
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name)
            old = parent._modules[child]
            undo.append((parent, child, old))
            if old is not None and module.training != old.training:
                module.train(old.training)
            setattr(parent, child, module)
    except BaseException:
        restore_modules(undo)
        raise
    return undo


def restore_modules(undo: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Put back the modules :func:`swap_modules` replaced (last swapped first)."""
    for parent, child, module in reversed(undo):
        setattr(parent, child, module)


def own_tensors(module: nn.Module) -> dict[str, Any]:
    """The parameters and persistent buffers a module loads itself (torch's ``local_state``)."""
    buffers = {k: v for k, v in module._buffers.items() if k not in module._non_persistent_buffers_set}
    return {k: v for k, v in {**module._parameters, **buffers}.items() if v is not None}


def refused_tensors(module: nn.Module, state_dict: Any, prefix: str) -> list[str]:
    """torch's messages for the tensors of ``state_dict`` that ``nn.Module._load_from_state_dict``
    would not copy into ``module``'s own (not a tensor, another shape), in its words; [] when it
    would copy every one present."""
    refused = []
    for name, own in own_tensors(module).items():
        key = prefix + name
        if key not in state_dict:
            continue
        given = state_dict[key]
        if not torch.overrides.is_tensor_like(given):
            refused.append(f'While copying the parameter named "{key}", expected torch.Tensor or Tensor-like object '
                           f"from checkpoint but received {type(given)}")
            continue
        if nn.parameter.is_lazy(own):
            continue
        shape = given.shape
        if len(own.shape) == 0 and len(shape) == 1 and shape[0] == 1:  # (torch loads a (1,) tensor into a scalar)
            continue
        if shape != own.shape:
            refused.append(f"size mismatch for {key}: copying a param with shape {shape} from checkpoint, the shape "
                           f"in current model is {own.shape}.")
    return refused


def withhold_refused(module: nn.Module, state_dict: Any, prefix: str, local_metadata: Any, missing_keys: list[str],
                     unexpected_keys: list[str], error_msgs: list[str], also: Sequence[str] = ()) -> bool:
    """For a layer's ``_load_from_state_dict``: when torch would refuse one of its tensors
    (:func:`refused_tensors`), or the layer refuses the state dict itself (``also``: its messages),
    report them as torch does (``error_msgs``, raised by ``load_state_dict`` at its end), copy none
    of the others, keep torch's missing and unexpected keys, and return True; else False (the
    caller loads them)."""
    refused = [*also, *refused_tensors(module, state_dict, prefix)]
    if not refused:
        return False
    error_msgs.extend(refused)
    own = {prefix + name for name in own_tensors(module)}
    withheld = {k: v for k, v in state_dict.items() if k not in own}
    start = len(missing_keys)
    nn.Module._load_from_state_dict(module, withheld, prefix, local_metadata, True, missing_keys, unexpected_keys,
                                    error_msgs)  # (its pre-hooks, unexpected keys, extra state: nothing of ours)
    missing_keys[start:] = [k for k in missing_keys[start:] if k not in state_dict]  # (present, withheld)
    return True


def strict_key_errors(module: nn.Module, state_dict: Any) -> str | None:
    """torch's message for ``module.load_state_dict(state_dict, strict=True)`` when keys are missing
    or unexpected (with the size mismatches it would also report), or None: the layer's own
    ``load_state_dict`` raises it before copying anything (torch raises it after the copy)."""
    if not isinstance(state_dict, Mapping):  # (torch's TypeError, from its load_state_dict)
        return None
    expected = module.state_dict(keep_vars=True)
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if not (missing or unexpected):
        return None
    msgs = []
    if missing:
        msgs.append("Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
    if unexpected:
        msgs.append("Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in unexpected)))
    for name, sub in module.named_modules():
        msgs += refused_tensors(sub, state_dict, f"{name}." if name else "")
    return "Error(s) in loading state_dict for {}:\n\t{}".format(type(module).__name__, "\n\t".join(msgs))


def in_own_types(module: nn.Module, state_dict: Any, prefix: str, names: Iterable[str]) -> Any:
    """``state_dict`` with the tensors of ``module``'s own ``names`` converted to the types of the
    tensors they replace, for ``load_state_dict(assign=True)``: torch assigns the state dict's
    tensors as they are where a copy (``copy_``) casts them, and a sparse layer's compressed values,
    metadata words, scales and masks have one type each, which its kernels and checks take (float32
    values left a bf16 layer without a kernel, SP0804; int64 metadata words were SP0806 at the next
    call). ``.to`` casts as ``copy_`` does, so an assigned load gives the layer a copied one gives.
    The caller has refused what a copy would not carry over (fp8 values into a 16-bit layer)."""
    own = own_tensors(module)
    convert = {}
    for name in names:
        incoming, current = state_dict.get(prefix + name), own.get(name)
        if isinstance(incoming, torch.Tensor) and current is not None and incoming.dtype != current.dtype:
            convert[prefix + name] = incoming.to(current.dtype)
    return {**state_dict, **convert} if convert else state_dict


@contextmanager
def restoring_tensors(module: nn.Module) -> Iterator[None]:
    """Put back every parameter (its data and gradient) and buffer of ``module`` and its submodules
    when the block raises: for ``_apply``, which converts them one at a time (a ``.cuda()`` out of
    memory at the third tensor left two on the GPU and the others on the CPU)."""
    saved = []
    for m in module.modules():
        params = {k: (p, p.data, p.grad, None if p.grad is None else p.grad.data)
                  for k, p in m._parameters.items() if p is not None}
        saved.append((m, dict(m._parameters), dict(m._buffers), params))
    try:
        yield
    except BaseException:
        for m, parameters, buffers, params in saved:
            m._parameters.update(parameters)  # (in place: a fused group holds these dicts)
            m._buffers.update(buffers)
            for p, data, grad, grad_data in params.values():
                p.data = data
                if grad is not None:
                    grad.data = grad_data
                if p.grad is not grad:
                    p.grad = grad
        raise


def copy_all(writes: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``destination.copy_(source)`` for each pair of ``writes``, every pair checked first (the same
    shape: ``copy_`` would broadcast or refuse another) so that none raises after some were copied.
    The destinations keep their objects and addresses. The caller computes every source before
    (the step that allocates, and can run out of memory), so that a failure writes nothing."""
    writes = list(writes)
    for destination, source in writes:
        if destination.shape != source.shape:
            raise ValueError(f"copy_all: a {tuple(source.shape)} tensor for a {tuple(destination.shape)} one "
                             "(nothing copied)")
    with torch.no_grad():
        for destination, source in writes:
            destination.copy_(source)
