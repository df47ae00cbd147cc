"""Native launches of the call cache's one-launch replays (docs/autotune.md, "The call cache").

A replay (:class:`.call_cache.Replay`) of one prepared launch still spends its host time in the
prepared launch's Python: the argument writers of four arrays, the tensor-map update of a moved b,
and ``cuLaunchKernel`` through the CUDA bindings. Where that one launch reads exactly the call's
values, metadata words, b and C (each whole or viewed from its first element, no other scratch: the
decode kernel at N <= 64 and the one-CTA-per-tile kernels without split-K), a :class:`NativePlan`
launches it from native code instead, as the torch layer's eager calls do
(integrations/torch/native.py): per weight (the addresses of its values and words) the launch is
prepared once with only b and C per call and packed into a record (``PreparedLaunch.native_record``,
driver/prepared.py); a call is then one ctypes call into the record launcher of
backend/runtime/native_launch.py, which writes b's and C's addresses, re-encodes b's tensor map
where b moved and calls ``cuLaunchKernel``.

The records are keyed by the weight's addresses, not its tensors: a launch reads its operands by
address, and the call's key (call_cache.py) fixes their shapes, strides and element types, so a
record made for one tensor is right for any tensor of that key at that address (and a record keeps
no weight alive: its prepared launch drops the values and words it was prepared with). A CUDA-graph
capture, a misaligned b or C (the launcher declines) and a failed native launch (warned once; the
weight then keeps to the prepared launch) take the prepared launch. ``SPARSILE_CALL_CACHE_NATIVE=0``
turns native replays off (read when a call is recorded).
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


def launcher() -> Any:
    """The record launcher (JIT-compiled once per process), or None where it cannot be built here."""
    global _launcher
    if _launcher is None:
        with _lock:
            if _launcher is None:
                from ...backend.runtime.devices import RETRY_AFTER_CONTEXT_SWITCH
                from ...backend.runtime.native_launch import RecordLauncher

                try:
                    _launcher = RecordLauncher()
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
    """One weight's native record: its words' address, the words, what they point into."""

    address: int
    words: Any
    record: Any  # the NativeRecord (it keeps the prepared launch, and so its module, alive)
    stream: Any  # the prepared launch's stream getter: torch's current stream, as a replay launches on


_UNBUILT = object()


@dataclass(frozen=True)
class NativePlan:
    """The native launch of a one-launch replay: ``gpu_launch`` (``kernel[grid]``) with its recorded
    positional arguments ``refs`` (:class:`.call_cache.ArrayRef` for arrays) and keywords, and the
    names of its b and C parameters (the two it takes per call)."""

    gpu_launch: Any
    refs: tuple[Any, ...]
    kwargs: dict[str, Any]
    names: tuple[str, str]
    records: dict[tuple[int, int], _Native | None] = field(default_factory=dict, compare=False)
    lock: Any = field(default_factory=threading.Lock, compare=False)

    def launch(self, values: Any, words: Any, b: Any, c: Any) -> bool:
        """Launch with these arrays on torch's current stream; False where nothing was launched
        (the caller runs the prepared launch)."""
        if _capturing():
            return False
        key = (values.data_ptr(), words.data_ptr())
        native = self.records.get(key, _UNBUILT)
        if native is _UNBUILT:
            if len(self.records) >= MAX_RECORDS:
                return False
            native = self._build(key, values, words, b, c)
        if native is None:
            return False
        run = _launcher.launch
        native.record.context_current()
        status = run(native.address, b.data_ptr(), c.data_ptr(), 0, native.stream())
        if status > 0 and status in _RETRY:  # another context was current (torch switched devices)
            native.record.context_current(True)
            status = run(native.address, b.data_ptr(), c.data_ptr(), 0, native.stream())
        if status == 0:
            mark_unreplayable("a prepared launch")  # (a replay inside a recording: as the prepared launch)
            counts["launched"] += 1
            return True
        counts["declined"] += 1
        if status > 0:
            with self.lock:
                self.records[key] = None
            warnings.warn(f"sparse_matmul: a native replay failed with CUresult {status}; this weight's calls "
                          f"keep to the prepared launch ({ENV}=0 turns native replays off)", RuntimeWarning,
                          stacklevel=5)  # (at sparse_matmul's caller)
        return False

    def _build(self, key: tuple[int, int], values: Any, words: Any, b: Any, c: Any) -> _Native | None:
        """Prepare the launch for this weight with b and C per call and pack its native record (None
        where it cannot be packed: remembered, so that it is not tried per call)."""
        arrays = {("input", 0): values, ("input", 1): words, ("words", 0): words, ("input", 2): b,
                  ("input", 3): c, ("scratch", 0): c}

        def array(r: ArrayRef) -> Any:
            a = arrays[(r.kind, r.index)]
            return a if r.view is None else viewed(a, r.view)

        args = [array(r) if type(r) is ArrayRef else r for r in self.refs]
        native: _Native | None = None
        by_name = dict(zip((p.name for p in self.gpu_launch.kernel.params), args, strict=False))
        try:
            prepared = self.gpu_launch.prepare(*args, per_call=self.names, **self.kwargs)
            record = prepared.native_record(tuple(by_name[n] for n in self.names), (0, 1), (True, True))
            # the record is kept for its module and context only (it is never called): it must not
            # keep this weight's values and words alive (records are keyed by address)
            prepared._fixed.clear()
            if record is not None:
                words_array = _launcher.record(record.words)
                native = _Native(ctypes.addressof(words_array), words_array, record, prepared._default_stream)
        except Exception:  # a launch the record builder does not take: the prepared launch replays it
            native = None
        with self.lock:
            if len(self.records) < MAX_RECORDS or key in self.records:
                self.records[key] = native
        return native


def native_plan(launch: tuple[Any, tuple[Any, ...], dict[str, Any]], refs: tuple[Any, ...],
                scratch: list[tuple[tuple[int, ...], str, bool]], source: ArrayRef, arrays: tuple[Any, ...]
                ) -> NativePlan | None:
    """The :class:`NativePlan` of a replay whose only launch is ``launch`` (the recorded
    ``(kernel[grid], arguments, keywords)``, its arguments as ``refs``), or None where it does not
    qualify (module docstring): values, words, b and C each passed once, whole or as a view at
    their first element (an address the call gives), C the result (``source``) and the only
    scratch, the call's ``arrays`` (values, metadata words, b, out or None) torch CUDA tensors (a
    launch reads their ``data_ptr()``), a launcher that can be built."""
    from ...driver.launch import GpuLaunch
    from .arrays import array_kind

    gpu_launch, args, kwargs = launch
    if os.environ.get(ENV, "1") == "0" or not isinstance(gpu_launch, GpuLaunch):
        return None
    if any(a is not None and array_kind(a) != "torch" for a in arrays):  # (cupy values with torch b)
        return None
    params = gpu_launch.kernel.params
    arrays = [(j, r) for j, r in enumerate(refs) if type(r) is ArrayRef]
    if len(args) > len(params) or any(r.view is not None and r.view[3] != 0 for _, r in arrays):
        return None
    c_at = (source.kind, source.index)
    words_at = ("words", 0) if any(r.kind == "words" for _, r in arrays) else ("input", 1)
    if c_at not in (("input", 3), ("scratch", 0)) or (source.view is not None and source.view[3] != 0):
        return None
    if sorted((r.kind, r.index) for _, r in arrays) != sorted([("input", 0), words_at, ("input", 2), c_at]):
        return None  # another array (a second scratch, a view elsewhere), or one of them twice
    if scratch != ([] if c_at == ("input", 3) else [(scratch[0][0], scratch[0][1], False)]):
        return None  # zeroed scratch, or scratch besides C
    if launcher() is None:
        return None
    name = {(r.kind, r.index): params[j].name for j, r in arrays}
    return NativePlan(gpu_launch, refs, dict(kwargs), (name[("input", 2)], name[c_at]))
