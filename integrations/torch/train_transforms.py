"""How a ``SemiSparseLinear`` call stands to torch's tracers and to torch.func's transforms
(docs/training.md, "Transforms and tracers").

The layer's forward compresses its master weight again when it changed (the eager safety net of
docs/training.md): everywhere but under a *tracer* (torch.compile, torch.export, make_fx, a fake
tensor mode, torch.jit.trace), whose graph would hold the compression's host work. Before, the
forward took for a tracer anything that was not a plain ``torch.Tensor`` x, any dispatch mode and
any torch.func transform: an ``nn.Parameter`` x (a trained soft prompt), ``torch.vmap`` and a
``FlopCounterMode`` computed with the compressions of the weight from before an optimizer step.

Some calls the layer cannot compute, and refuses (SP0916) instead of computing another function:
forward-mode AD (a dual tensor of ``torch.autograd.forward_ad``; ``torch.func.jvp``, ``jacfwd``),
which gave no tangent or a zero one; and a weight or mask batched by ``torch.vmap``
(``torch.func.functional_call`` of stacked parameters) without compressions batched with it, which
the kernel ignored for the layer's own compressions. torch.func's grad transforms (``grad``,
``vjp``, ``jacrev``) run (the op's Autograd kernel, training._TrainFormula); a weight they wrap is compressed from the
plain tensor under the wrappers (:func:`grad_unwrapped`, :func:`outside_transforms`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.autograd.forward_ad as fwad
from torch._C._functorch import TransformType, get_unwrapped, is_functorch_wrapped_tensor, maybe_get_level
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters, temporarily_clear_interpreter_stack
from torch._subclasses.fake_tensor import is_fake

from ..errors import SP_TRAIN_LAYER, IntegrationError

_TRACING_MODES = tuple(torch._C._TorchDispatchModeKey.__members__.values())
"""The dispatch modes that trace (fake, proxy, functional): torch.compile's, torch.export's, make_fx's."""


def transforms_of(t: Any) -> set[Any]:
    """The torch.func transforms (``TransformType``) whose wrappers ``t`` is wrapped in (none for a
    plain tensor, or with no transform on)."""
    levels = set()
    while isinstance(t, torch.Tensor) and is_functorch_wrapped_tensor(t):
        levels.add(maybe_get_level(t))
        t = get_unwrapped(t)
    if not levels:
        return set()
    return {i.key() for i in retrieve_all_functorch_interpreters() if i.level() in levels}


def grad_unwrapped(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` without the wrappers of torch.func's grad transforms (``grad``, ``vjp``, ``jacrev``:
    GradTrackingTensors), the plain tensor whose values they carry; ``t`` itself when nothing wraps
    it; None where another transform wraps it (a BatchedTensor of vmap: one value per member)."""
    if (torch.compiler.is_compiling() or not torch._C._are_functorch_transforms_active()
            or not is_functorch_wrapped_tensor(t)):  # (dynamo: is_compiling is True, the rest not traced)
        return t
    kinds = {i.level(): i.key() for i in retrieve_all_functorch_interpreters()}
    while is_functorch_wrapped_tensor(t):
        if kinds.get(maybe_get_level(t)) != TransformType.Grad:
            return None
        t = get_unwrapped(t)
    return t


def grad_tracked(t: torch.Tensor) -> bool:
    """``t`` requires grad at some level: torch.autograd's, or a torch.func grad transform's whose
    GradTrackingTensor wraps it. Seen from inside an inner level (its backward, under a ``jacrev``
    of a ``grad``), ``t`` is that level's wrapper, ``requires_grad`` False, around the outer level's,
    which requires grad: the outer level differentiates through it."""
    while True:
        if t.requires_grad:
            return True
        if not is_functorch_wrapped_tensor(t):
            return False
        t = get_unwrapped(t)


@contextlib.contextmanager
def outside_transforms() -> Iterator[None]:
    """Run the block with torch.func's transforms set aside (their interpreter stack emptied, then
    restored): under them every operation's result is wrapped at the innermost level, a tensor
    without storage that the host compression cannot read. For host work on plain tensors only
    (:func:`grad_unwrapped`'s)."""
    if not torch._C._are_functorch_transforms_active():
        yield
        return
    with temporarily_clear_interpreter_stack():
        yield


def traced(x: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """The call is traced (torch.compile, torch.export, make_fx, a fake tensor mode, torch.jit.trace),
    or one of x and ``tensors`` (the weight and mask a refresh reads) is fake or wrapped by a
    torch.func transform: the forward's re-compression must not run."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or (torch._C._len_torch_dispatch_stack() > 0
                and any(torch._C._get_dispatch_mode(key) is not None for key in _TRACING_MODES))):
        return True
    if type(x) is not torch.Tensor and is_fake(x):
        return True
    return any(is_fake(t) or is_functorch_wrapped_tensor(t) for t in tensors)


@torch.compiler.assume_constant_result
def forward_grad_enabled() -> bool:
    """Forward-mode AD is on (``torch._C._is_fwd_grad_enabled``). Read for real where dynamo traces (a
    constant of the trace, like ``fwad._current_level``, which it guards on): dynamo cannot put the
    flag in a graph (its "torch.* op returned non-Tensor", an ``Unsupported`` in place of SP0916 under a
    compiled ``torch.func.jvp``). Eagerly a plain call (the decorator only marks the function)."""
    return torch._C._is_fwd_grad_enabled()


def forward_mode_error() -> IntegrationError:
    return IntegrationError(SP_TRAIN_LAYER, "a trainable sparse layer has no forward-mode derivative (torch.func.jvp, "
                            "jacfwd, hessian; torch.autograd.forward_ad's dual tensors): its kernel has no tangent "
                            "formula", help="use reverse mode: backward() or torch.autograd.grad")


def check_transformed_call(x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor | None,
                           values: torch.Tensor) -> None:
    """SP0916 for a call the layer cannot compute: forward mode (x, weight or bias dual), a weight or
    mask batched by vmap whose compressions (``values``) are not. Nothing to do (two flags read)
    without forward AD or a transform on."""
    tensors = (x, weight, bias)
    if fwad._current_level >= 0 and forward_grad_enabled() and any(
            t is not None and fwad.unpack_dual(t).tangent is not None for t in tensors):
        raise forward_mode_error()
    # (dynamo cannot trace the wrappers' introspection, a graph break: under torch.compile the op's vmap rule
    # refuses a batched weight, vmap_rules.train_call_vmap, and forward mode has no formula there either)
    if torch.compiler.is_compiling() or not torch._C._are_functorch_transforms_active():
        return
    kinds = {name: transforms_of(t) for name, t in (("x", x), ("weight", weight), ("mask", mask), ("bias", bias))}
    if any(TransformType.Jvp in k for k in kinds.values()):
        raise forward_mode_error()
    batched = TransformType.Vmap in transforms_of(values)
    for name in ("weight", "mask"):
        if TransformType.Vmap in kinds[name] and not batched:
            raise batched_without_compressions(name)


def batched_without_compressions(name: str) -> IntegrationError:
    """SP0916: the layer's ``name`` (weight or mask) is batched by vmap, its compressions are not (the layer's
    eager check above; under torch.compile, where dynamo cannot look at the wrappers, the op's vmap rule's)."""
    return IntegrationError(SP_TRAIN_LAYER, f"a SemiSparseLinear cannot compute this call: its {name} is batched by "
                            "torch.vmap, but its compressions are not (values, meta, values_t, meta_t: the kernel "
                            "multiplies by those, made from the layer's own weight and mask)",
                            help="stack the layers' buffers with their parameters (torch.func.stack_module_state) "
                                 "and pass both to functional_call, after spt.recompress_ of each layer")
