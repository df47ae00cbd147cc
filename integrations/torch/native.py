"""The native launch of the eager launch record (on by default; ``SPARSILE_TORCH_NATIVE=0`` turns it
off; docs/torch.md).

An eager call of the launch record (``_kernels.LaunchRecord``) spends most of its host time in
its prepared launches' Python: the argument writers, the tensor-map lookup and ``cuLaunchKernel``
through ctypes, about 12 µs per launch (twice that for a split-K plan whose partial sums are added
by a second launch). Unless ``SPARSILE_TORCH_NATIVE=0`` (read when a record is built) the record
packs each launch once into a native *record* (``PreparedLaunch.native_record``: the bytes the
prepared launch passes, with x, y and the per-token scale as sources 0, 1 and 2) and each launch
of a call is one ctypes call into machine code JIT-compiled by llvmlite
(backend/runtime/native_launch.py, the launch the JAX integration's native handler uses too): it
copies the packed parameters onto its stack, writes x's, y's and scale_x's addresses (checking the
16-byte alignment the kernel was specialized for), re-encodes the tensor map of a buffer at a new
address and calls ``cuLaunchKernel`` from libcuda.

A launch it does not make (a misaligned buffer, a failed encode) goes, with the launches after it,
to the prepared launches (the ones made natively are not repeated); after a failed launch the
record keeps to its prepared launches for good. Never while a CUDA graph is being captured, never
for a record without prepared launches. Measured on the H200
(benchmarks/RESULTS.md, ninth session): 15–20 µs less host time per call than the prepared
launch's Python, the same bits; hence on by default.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

ENV = "SPARSILE_TORCH_NATIVE"
"""``SPARSILE_TORCH_NATIVE=0`` (or anything but "1"): eager calls keep to the prepared
launches' Python; unset or "1": they launch natively (read when a record is built)."""

_lock = threading.Lock()
_launcher: Any = None  # the RecordLauncher, built on first use (False: it could not be built)
_RETRY: set[int] = set()  # the CUresults a launch retries after making its context current (filled once)
_ALL_OF_ONE = (0, 1)  # NativeLaunch.launch's result for a record of one launch, all launched
ENTRY_POINTS: tuple[int, int, int] | None = None
"""libcuda's launch and encode entry points for the launcher (None: libcuda's own; tests set fakes
before the first record is built, and call :func:`reset`)."""


def enabled() -> bool:
    """Whether the native launch is on: ``SPARSILE_TORCH_NATIVE`` unset or "1"."""
    return os.environ.get(ENV, "1") == "1"


def requested() -> bool:
    """Whether the user asked for it explicitly (``SPARSILE_TORCH_NATIVE=1``): only then is a missing
    launcher worth a warning; by default the prepared launches take over silently."""
    return os.environ.get(ENV) == "1"


def launcher() -> Any:
    """The compiled record launcher (backend/runtime/native_launch.py), or None when it cannot be
    built here (no llvmlite, no libcuda: warned once where ``SPARSILE_TORCH_NATIVE=1`` asked for it;
    the records keep to their prepared launches)."""
    global _launcher
    if _launcher is None:
        with _lock:
            if _launcher is None:
                from ...backend.runtime.native_launch import RecordLauncher, shared_launcher

                try:
                    _launcher = RecordLauncher(ENTRY_POINTS) if ENTRY_POINTS else shared_launcher()
                except Exception as exc:  # the prepared launches keep working
                    _launcher = False
                    if requested():
                        warnings.warn(f"sparsile.torch: {ENV}=1, but the native launcher is unavailable "
                                      f"({type(exc).__name__}: {exc}); calls use the prepared launches",
                                      RuntimeWarning, stacklevel=2)
    return _launcher or None


def reset() -> None:
    """Forget the launcher (tests; records built with it keep theirs alive)."""
    global _launcher
    _launcher = None


def counts() -> dict[str, int]:
    """The native launcher's counters: ``launched``, ``declined`` (not launched: the prepared launch
    ran the call) and ``launch_failures`` (zeros before it is built)."""
    return _launcher.counts() if _launcher else {"launched": 0, "declined": 0, "launch_failures": 0}


def report_failure(status: int) -> None:
    """Warn that a record's native launch failed with CUresult ``status`` (the record keeps to its
    prepared launch from then on)."""
    warnings.warn(f"sparsile.torch: a native launch failed with CUresult {status}; this launch record keeps to "
                  f"its prepared launch ({ENV}, docs/torch.md)", RuntimeWarning, stacklevel=3)


class NativeLaunch:
    """A record's launches and the launcher that launches them: ``launch(x, y, scale_x address or 0,
    stream)`` -> (status, done): status 0 all launched, < 0 one not launched, > 0 the CUresult of a
    failed launch; ``done`` how many of the launches ran (after a nonzero status the caller runs the
    rest through their prepared launches, in order, so that nothing runs twice). Both are returned,
    not kept, so that threads sharing a record do not read each other's."""

    __slots__ = ("_addresses", "_context_current", "_keep", "_run", "records")

    def __init__(self, records: list[Any], arrays: list[Any], launcher: Any,
                 context_current: Callable[..., None]):
        import ctypes

        self.records = arrays  # the int64 words the native function reads, per launch (immutable but R_ERROR)
        # the prepared launches (their launchers and modules), the cluster attributes, and the record
        # launcher: its LLVM engine owns the machine code ``_run`` calls, which reads its state array
        # (``reset`` forgets a launcher; the records built with it keep theirs)
        self._keep = (*(k for r in records for k in r.keep), launcher)
        self._addresses = tuple(ctypes.addressof(a) for a in arrays)
        self._run: Callable[..., int] = launcher.launch
        self._context_current = context_current

    def launch(self, x: int, y: int, scale_x: int, stream: int) -> tuple[int, int]:
        """Launch with these addresses on ``stream`` (an int handle), each launch in order. A launch
        failing because another context was current (torch switched devices behind sparsile's
        per-thread cache) is retried once with the kernel's context made current, as a prepared
        launch does. A launch on another GPU than the thread's current context's restores that
        context afterwards, as a torch op's device guard does (none on one GPU: no driver call)."""
        restore = self._context_current()
        try:
            if len(self._addresses) == 1:  # (most records: no loop, no enumerate, one status tuple)
                status = self._run(self._addresses[0], x, y, scale_x, stream)
                if status > 0 and status in _RETRY:
                    again = self._context_current(True)
                    restore = again if restore is None else restore
                    status = self._run(self._addresses[0], x, y, scale_x, stream)
                return (status, 0) if status else _ALL_OF_ONE
            for done, address in enumerate(self._addresses):
                status = self._run(address, x, y, scale_x, stream)
                if status > 0 and status in _RETRY:
                    again = self._context_current(True)
                    restore = again if restore is None else restore
                    status = self._run(address, x, y, scale_x, stream)
                if status:
                    return status, done
            return 0, len(self._addresses)
        finally:
            if restore is not None:
                leave_context(restore)


def leave_context(restore: Any) -> None:
    """Restore the thread's context a launch switched from (backend/runtime/devices.py)."""
    from ...backend.runtime.devices import leave

    leave(restore)


def native_launch(launches: list[Any] | None, x: Any, y: Any, scale_x: Any) -> NativeLaunch | None:
    """The native launch of a record's per-call launches ``launches`` ([(prepared run, picker)] of
    ``_kernels.LaunchRecord._prepare``) built for (x, y, scale_x), or None: not enabled, no launches,
    or one of them not replayable natively (shapes and strides of x and y are fixed per record; the
    scale must reach the kernel as a pointer only)."""
    if not enabled() or not launches:
        return None
    records = []
    for run, which in launches:
        prepared = getattr(run, "__self__", None)
        if not hasattr(prepared, "native_record"):
            return None
        sources = which((0, 1, 2))
        args = which((x, y, scale_x))
        try:
            record = prepared.native_record(args, sources, tuple(s != 2 for s in sources))
        except Exception as exc:  # an internal error of the record builder: visible, and the call still runs
            warnings.warn(f"sparsile.torch: a launch record keeps to its prepared launch ({type(exc).__name__}: "
                          f"{exc})", RuntimeWarning, stacklevel=2)
            return None
        if record is None:
            return None
        records.append(record)
    native = launcher()
    if native is None:
        return None
    if not _RETRY:
        from ...backend.runtime.devices import RETRY_AFTER_CONTEXT_SWITCH

        _RETRY.update(int(e) for e in RETRY_AFTER_CONTEXT_SWITCH)
    # one context for all: every launch of a record is on x's device
    return NativeLaunch(records, [native.record(r.words) for r in records], native, records[0].context_current)
