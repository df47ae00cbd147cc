"""The custom ops' kernels at torch's ``Negative`` dispatch key: a weight that is a neg view, resolved
once per memory.

A tensor with its negative bit set (``torch._neg_view(t)``, ``z.conj().imag``: a lazy negation, its
memory holding the values before it) reaches an op's kernel through torch's Negative fallback, which
hands the kernel a new resolved copy on every call. For x and scale_x that is what a call needs. For
the weight (values, meta, bias, scale_w) it made a new tensor each call, and the launch record the op
keys on the weight's memory and keeps while its values tensor lives (record_cache.py) was planned
again on every call (a plan, prepared launches, copies of the weight). The kernels registered here
(:func:`register`) take the op's arguments before that fallback: x and scale_x are resolved as it
would, the weight's neg views through :func:`resolved_weight`, which keeps one resolved copy per
memory while the tensor owning that memory (the view's base) lives, and copies an in-place write of
that memory (its version counter, which its views share) into the copy in place: the copy's own
counter moves, and the records that read it refresh as after any write of a weight (docs/torch.md,
"A weight written in place"). Inference tensors (no version counter), tensor subclasses (fake
tensors while tracing), meta tensors and tensors without storage are resolved per call, as by the
fallback; so is any view while a dispatch mode is on (make_fx traces real tensors under one: a kept
copy would enter its graph as a constant, not as the traced input) and, unless a kept copy is up to
date, while a CUDA graph is captured (a copy made or refreshed there is a captured kernel, run only
at the graph's replay). A copy is kept only while the storage it was made from is the view's
(``owner.data = t`` swaps the storage without a version bump, and a new storage can take the old
address), and is made outside inference mode (a normal tensor, which a later write outside it can
refresh in place).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ._kernels import capturing


@dataclass
class _Resolved:
    """The resolved copy of one neg view's memory, the tensor owning that memory, the storage the copy
    was made from (a weak reference: it keeps the storage's identity, not its memory) and the version
    of that memory the copy holds."""

    owner: weakref.ref
    storage: StorageWeakRef
    copy: torch.Tensor
    version: int

    def serves(self, base: torch.Tensor, storage: torch.UntypedStorage) -> bool:
        """The copy is of the memory a neg view of ``base`` on ``storage`` shows (at this entry's key)."""
        return self.owner() is base and not self.storage.expired() and self.storage.cdata == storage._cdata


_RESOLVED: dict[tuple, _Resolved] = {}
"""Resolved copies by the neg view's memory (device, address, shape, strides, dtype)."""

WEIGHT_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "sparse_linear": ("x", "values", "meta", "bias", "scale_x", "scale_w"),
    "sparse_linear_e4m3": ("x", "values", "meta", "bias", "scale_w", "scale_x"),
}
"""The tensor arguments of each op in schema order (positional ones may also come by name)."""
WEIGHT_NAMES = frozenset({"values", "meta", "bias", "scale_w"})


def _forget(key: tuple, owner: weakref.ref) -> None:
    """The tensor owning the memory of ``key`` died: drop its copy (a weakref callback: one atomic
    pop, only of the entry of that owner)."""
    entry = _RESOLVED.get(key)
    if entry is not None and entry.owner is owner:
        _RESOLVED.pop(key, None)


def _sweep() -> None:
    """Drop the copies whose storage is gone while the tensor that owned it lives on (its storage
    swapped, ``owner.data = t``): one atomic pop each, only of the entry seen."""
    for key, entry in tuple(_RESOLVED.items()):  # (a snapshot: weakref callbacks pop entries meanwhile)
        if entry.storage.expired() and _RESOLVED.get(key) is entry:
            _RESOLVED.pop(key, None)


def resolved_weight(t: Any) -> Any:
    """``t`` where it is not a neg view; else the values it shows as a tensor without the negative
    bit: the same tensor for every call on the same memory while that memory's tensor and storage
    live, brought up to an in-place write of it (copied in place)."""
    if not isinstance(t, torch.Tensor) or not t.is_neg():
        return t
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_inference() or t.device.type == "meta" or \
            torch._C._len_torch_dispatch_stack() > 0:  # (a dispatch mode: make_fx, FakeTensorMode: per call)
        return t.resolve_neg()
    try:
        storage = t.untyped_storage()
        key = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        version = t._version
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a functional wrapper): per call
        return t.resolve_neg()
    base = t._base if t._base is not None else t
    entry = _RESOLVED.get(key)
    fresh = entry is not None and entry.serves(base, storage)
    if capturing() and not (fresh and entry.version == version):  # (made or refreshed at replay only)
        return t.resolve_neg()
    if not fresh:
        with torch.inference_mode(False), torch.no_grad():  # (a normal tensor: a later write refreshes it)
            copy = t.detach().resolve_neg()
        _sweep()
        owner = weakref.ref(base, lambda ref, key=key: _forget(key, ref))
        _RESOLVED[key] = _Resolved(owner, StorageWeakRef(storage), copy, version)
        return copy
    if entry.version != version:  # the memory was written in place: the copy follows, in place
        with torch.inference_mode(False), torch.no_grad():
            entry.copy.copy_(t.detach())
        entry.version = version
    return entry.copy


def _resolved(t: Any) -> Any:
    return t.resolve_neg() if isinstance(t, torch.Tensor) and t.is_neg() else t


def _negative_kernel(name: str) -> Any:
    """The Negative-key kernel of ``sparsile::<name>``: its arguments resolved (the weight's by
    :func:`resolved_weight`), then the op's kernels below that key."""
    op = getattr(torch.ops.sparsile, name).default
    names = WEIGHT_ARGUMENTS[name]
    below = torch._C.DispatchKey.Negative

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(resolved_weight(a) if i < len(names) and names[i] in WEIGHT_NAMES else _resolved(a)
                     for i, a in enumerate(args))
        kwargs = {k: resolved_weight(v) if k in WEIGHT_NAMES else _resolved(v) for k, v in kwargs.items()}
        return op.redispatch((keyset & torch._C._after_autograd_keyset).remove(below), *args, **kwargs)

    return kernel


def register(library: Any) -> None:
    """Register the Negative-key kernels of ``sparsile::sparse_linear`` and ``sparse_linear_e4m3``
    (defined in ``library``)."""
    for name in WEIGHT_ARGUMENTS:
        library.impl(name, _negative_kernel(name), "Negative", with_keyset=True)
