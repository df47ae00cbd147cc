"""Native launches of the call cache's replays (docs/autotune.md, "The call cache").

A replay (:class:`.call_cache.Replay`) through prepared launches still spends its host time in their
Python: the argument writers, the tensor-map update of a moved b, and ``cuLaunchKernel`` through the
CUDA bindings, per launch. Where every launch of a replay reads only the call's values, metadata
words, b, C and at most one workspace (each whole or a view into it, none zeroed: the decode kernel
at N <= 64 with or without its split-K reduction, the one-CTA-per-tile kernels, a tail split's
three launches over row blocks of the weight and C), a :class:`NativePlan` launches them from
native code instead, as the torch layer's eager calls do
(integrations/torch/native.py): per weight (the addresses of its values and words) each launch is
prepared once with only b, C and the workspace per call and packed into a record
(``PreparedLaunch.native_record``, driver/prepared.py); a call is then one ctypes call per launch into
the record launcher of backend/runtime/native_launch.py, which writes those three addresses (its
sources 0, 1, 2), re-encodes b's tensor map where b moved and calls ``cuLaunchKernel``. A launch that reads a
view of b, C or the workspace at an offset (a tail split's reduction writes C's tail rows) is passed
that array's address plus the view's byte offset, which the call's key fixes (the same shapes and
strides every call); the weight's views are fixed per weight, in its record.

The records are keyed by the weight's addresses, not its tensors: a launch reads its operands by
address, and the call's key (call_cache.py) fixes their shapes, strides and element types, so a
record made for one tensor is right for any tensor of that key at that address (and a record keeps
no weight alive: its prepared launches drop the values and words they were prepared with). A
CUDA-graph capture, a misaligned b or C (the launcher declines) and a failed native launch (warned
once; the weight then keeps to the prepared launches) take the prepared launches, from the first
launch not made natively on: none runs twice. ``SPARSILE_CALL_CACHE_NATIVE`` (read when a call is
recorded): unset or "all", every qualifying replay is native, of one launch or of several (the
decode kernel's split-K partial sums and their reduction; on the H200 since the twenty-sixth session,
docs/autotune.md); "1", replays of one launch only; "0", none.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from ...driver.recording import mark_unreplayable
from .call_cache import ArrayRef, viewed

ENV = "SPARSILE_CALL_CACHE_NATIVE"
MAX_RECORDS = 256
"""Native records per replay (one per weight of that key: the layers of one shape). A weight met when
they are all made keeps to the prepared launch: none is dropped for it (weights of one key called in
turn, more than this, would otherwise build a record on every call, several times a prepared launch)."""

_lock = threading.Lock()
_launcher: Any = None  # the RecordLauncher, built on first use (False: it could not be built)
_RETRY: set[int] = set()  # the CUresults a launch retries after making its context current
counts = {"launched": 0, "declined": 0}
"""Replays whose launches were all made natively; native launches declined or failed (the prepared
launches made those and the rest)."""


def _leave(restore: Any) -> None:
    """Restore the thread's context a launch switched from (backend/runtime/devices.py)."""
    from ...backend.runtime.devices import leave

    leave(restore)


def launcher() -> Any:
    """The record launcher (JIT-compiled once per process), or None where it cannot be built here."""
    global _launcher
    if _launcher is None:
        with _lock:
            if _launcher is None:
                from ...backend.runtime.devices import RETRY_AFTER_CONTEXT_SWITCH
                from ...backend.runtime.native_launch import shared_launcher

                try:
                    _launcher = shared_launcher()  # (the torch layer's too)
                    _RETRY.update(int(e) for e in RETRY_AFTER_CONTEXT_SWITCH)
                except Exception:  # no llvmlite engine, no libcuda: the prepared launches replay
                    _launcher = False
    return _launcher or None


def _capturing() -> bool:
    """torch's current stream is capturing a CUDA graph (b is a CUDA tensor: torch is initialized)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch._C._cuda_isCurrentStreamCapturing())


@dataclass(frozen=True)
class _Native:
    """One launch's native record for one weight: its words' address, the words, what they point into."""

    address: int
    words: Any
    record: Any  # the NativeRecord (it keeps the prepared launch, and so its module, alive)
    stream: Any  # the prepared launch's stream getter: torch's current stream, as a replay launches on
    offsets: tuple[int, int, int] = (0, 0, 0)  # bytes into b, C and the workspace of the views it reads


@dataclass(frozen=True)
class NativeLaunch:
    """One launch of a :class:`NativePlan`: ``gpu_launch`` (``kernel[grid]``) with its recorded
    positional arguments ``refs`` (:class:`.call_cache.ArrayRef` for arrays) and keywords, the names
    of the parameters it takes per call and the source (0 b, 1 C, 2 the workspace) of each."""

    gpu_launch: Any
    refs: tuple[Any, ...]
    kwargs: dict[str, Any]
    names: tuple[str, ...]
    sources: tuple[int, ...]


_UNBUILT = object()
Slot = tuple[str, int]
"""Where an array of the call comes from: (ArrayRef kind, index)."""


@dataclass(frozen=True)
class NativePlan:
    """The native launches of a replay (module docstring), and where C (``c_at``) and the workspace
    (``w_at``, None without one) come from: the call's out or the replay's scratch."""

    launches: tuple[NativeLaunch, ...]
    c_at: Slot
    w_at: Slot | None = None
    records: dict[tuple[int, int], tuple[_Native, ...] | None] = field(default_factory=dict, compare=False)
    lock: Any = field(default_factory=threading.Lock, compare=False)

    def launch(self, values: Any, words: Any, b: Any, c: Any, w: Any = None) -> int:
        """Launch with these arrays on torch's current stream, in order; how many launches were
        made (the caller runs the rest through their prepared launches: 0, all of them)."""
        if _capturing():
            return 0
        key = (values.data_ptr(), words.data_ptr())
        natives = self.records.get(key, _UNBUILT)
        if natives is _UNBUILT:
            if len(self.records) >= MAX_RECORDS:
                return 0
            natives = self._build(key, values, words, b, c, w)
        if natives is None:
            return 0
        run = _launcher.launch
        at_b, at_c, at_w = b.data_ptr(), c.data_ptr(), 0 if w is None else w.data_ptr()
        restore = None  # the thread's context, when a launch made another current (None on one GPU)
        try:
            for done, native in enumerate(natives):
                switched = native.record.context_current()
                restore = switched if restore is None else restore
                ob, oc, ow = native.offsets
                # (no workspace: address 0, which the launcher declines for a launch that reads one)
                addresses = (at_b + ob, at_c + oc, at_w and at_w + ow)
                status = run(native.address, *addresses, native.stream())
                if status > 0 and status in _RETRY:  # another context was current (torch switched devices)
                    switched = native.record.context_current(True)
                    restore = switched if restore is None else restore
                    status = run(native.address, *addresses, native.stream())
                if status:
                    self._failed(key, status)
                    if done:
                        mark_unreplayable("a prepared launch")
                    return done
        finally:
            if restore is not None:  # another GPU's launches: the thread's own context again
                _leave(restore)
        mark_unreplayable("a prepared launch")  # (a replay inside a recording: as the prepared launches)
        counts["launched"] += 1
        return len(natives)

    def _failed(self, key: tuple[int, int], status: int) -> None:
        """A launch not made: declined (status < 0: this call only), or failed with a CUresult (the
        weight keeps to the prepared launches, warned at sparse_matmul's caller)."""
        counts["declined"] += 1
        if status > 0:
            with self.lock:
                self.records[key] = None
            warnings.warn(f"sparse_matmul: a native replay failed with CUresult {status}; this weight's calls "
                          f"keep to the prepared launch ({ENV}=0 turns native replays off)", RuntimeWarning,
                          stacklevel=6)  # (at sparse_matmul's caller)

    def _build(self, key: tuple[int, int], values: Any, words: Any, b: Any, c: Any, w: Any
               ) -> tuple[_Native, ...] | None:
        """Prepare each launch for this weight with b, C and the workspace per call and pack its
        native record (None where one cannot be packed: remembered, so that it is not tried per call)."""
        arrays = {("input", 0): values, ("input", 1): words, ("words", 0): words, ("input", 2): b, self.c_at: c}
        if self.w_at is not None:
            arrays[self.w_at] = w
        sources = {slot: i for i, slot in enumerate(_per_call(self.c_at, self.w_at)) if slot is not None}

        def array(r: ArrayRef) -> Any:
            a = arrays[(r.kind, r.index)]
            return a if r.view is None else viewed(a, r.view)

        natives: list[_Native] | None = []
        try:
            for launch in self.launches:
                args = [array(r) if type(r) is ArrayRef else r for r in launch.refs]
                offsets = _offsets(launch.refs, args, arrays, sources)
                if offsets is None:
                    natives = None
                    break
                by_name = dict(zip((p.name for p in launch.gpu_launch.kernel.params), args, strict=False))
                prepared = launch.gpu_launch.prepare(*args, per_call=launch.names, **launch.kwargs)
                record = prepared.native_record(tuple(by_name[n] for n in launch.names), launch.sources,
                                                (True,) * len(launch.names))
                # the record is kept for its module and context only (it is never called): it must not
                # keep this weight's values and words alive (records are keyed by address)
                prepared._fixed.clear()
                if record is None:
                    natives = None
                    break
                words_array = _launcher.record(record.words)
                natives.append(_Native(ctypes.addressof(words_array), words_array, record, prepared._default_stream,
                                       offsets))
        except Exception:  # a launch the record builder does not take: the prepared launches replay it
            natives = None
        built = None if natives is None else tuple(natives)
        with self.lock:
            if len(self.records) < MAX_RECORDS or key in self.records:
                self.records[key] = built
        return built


def _per_call(c_at: Slot, w_at: Slot | None) -> tuple[Slot, Slot, Slot | None]:
    """Where the arrays a call passes come from, in the launcher's source order: b, C, the workspace."""
    return ("input", 2), c_at, w_at


def _offsets(refs: tuple[Any, ...], args: list[Any], arrays: dict[Slot, Any], sources: dict[Slot, int]
             ) -> tuple[int, int, int] | None:
    """The byte offsets into b, C and the workspace of the views one launch reads (``args``, made
    from ``refs`` over ``arrays``), or None where it reads two different views of one of them (one
    address per source and launch)."""
    offsets: list[int | None] = [None, None, None]
    for r, a in zip(refs, args, strict=True):
        if type(r) is not ArrayRef or (r.kind, r.index) not in sources:
            continue
        source = sources[(r.kind, r.index)]
        offset = a.data_ptr() - arrays[(r.kind, r.index)].data_ptr()
        if offsets[source] is not None and offsets[source] != offset:
            return None
        offsets[source] = offset
    return tuple(o or 0 for o in offsets)


def native_plan(launches: tuple[tuple[Any, tuple[Any, ...], dict[str, Any]], ...],
                refs: tuple[tuple[Any, ...], ...], scratch: list[tuple[tuple[int, ...], str, bool]],
                source: ArrayRef, arrays: tuple[Any, ...]) -> NativePlan | None:
    """The :class:`NativePlan` of a replay of ``launches`` (each the recorded ``(kernel[grid],
    arguments, keywords)``, its arguments as ``refs[i]``), or None where it does not qualify (module
    docstring): every array a launch reads is the call's values, words or b, C (the result,
    ``source``: out or scratch) or one more scratch array (the workspace), each whole or a view
    into it (at an offset the call's key fixes: :func:`_offsets`); no scratch is zeroed; the call's ``arrays``
    (values, metadata words, b, out or None) are torch CUDA tensors (a launch reads their
    ``data_ptr()``); a launcher can be built."""
    from ...driver.launch import GpuLaunch
    from .arrays import array_kind

    setting = os.environ.get(ENV, "all")
    if setting == "0" or not launches or (len(launches) > 1 and setting == "1"):
        return None
    if any(a is not None and array_kind(a) != "torch" for a in arrays):  # (cupy values with torch b)
        return None
    c_at = (source.kind, source.index)
    if c_at not in (("input", 3), ("scratch", 0), ("scratch", 1)) or (source.view is not None and source.view[3]):
        return None
    if any(zero for _, _, zero in scratch) or len(scratch) > 2 or (c_at == ("input", 3) and len(scratch) > 1):
        return None  # zeroed scratch (a replay fills it first), or more arrays than three sources
    w_at = next((("scratch", i) for i in range(len(scratch)) if ("scratch", i) != c_at), None)
    per_call = _per_call(c_at, w_at)
    planned = []
    for (gpu_launch, args, kwargs), launch_refs in zip(launches, refs, strict=True):
        if not isinstance(gpu_launch, GpuLaunch) or len(args) > len(gpu_launch.kernel.params):
            return None
        names, sources = [], []
        for j, r in enumerate(launch_refs):
            if type(r) is not ArrayRef:
                continue
            at = (r.kind, r.index)
            if at in per_call:
                names.append(gpu_launch.kernel.params[j].name)
                sources.append(per_call.index(at))
            elif at not in (("input", 0), ("input", 1), ("words", 0)):
                return None  # another array
        planned.append(NativeLaunch(gpu_launch, tuple(launch_refs), dict(kwargs), tuple(names), tuple(sources)))
    if launcher() is None:
        return None
    return NativePlan(tuple(planned), c_at, w_at)
