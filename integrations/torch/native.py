"""The native launch of the eager launch record (on by default; ``SPARSILE_TORCH_NATIVE=0`` turns it
off; docs/torch.md).

An eager call of the launch record (``_kernels.LaunchRecord``) whose launch is one prepared launch
(the one-launch eager variant of split-K, or a plan of one launch) spends most of its host time in
the prepared launch's Python: the argument writers, the tensor-map lookup and ``cuLaunchKernel``
through ctypes. Unless ``SPARSILE_TORCH_NATIVE=0`` (read when a record is built) the record packs
that launch once into a native *record* (``PreparedLaunch.native_record``: the bytes the prepared
launch passes, with x, y and the per-token scale as sources 0, 1 and 2) and each call is one ctypes
call into machine code JIT-compiled by llvmlite (backend/runtime/native_launch.py, the launch the
JAX integration's native handler uses too): it copies the packed parameters onto its stack, writes
x's, y's and scale_x's addresses (checking the 16-byte alignment the kernel was specialized for),
re-encodes the tensor map of a buffer at a new address and calls ``cuLaunchKernel`` from libcuda.

A call it does not launch (a misaligned buffer, a failed encode) goes to the prepared launch; after
a failed launch the record keeps to the prepared launch for good. Never while a CUDA graph is being
captured, never for a plan of two launches or one without prepared launches. Measured on the H200
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
"""``SPARSILE_TORCH_NATIVE=0`` (or anything but "1"): eager one-launch calls keep to the prepared
launch's Python; unset or "1": they launch natively (read when a record is built)."""

_lock = threading.Lock()
_launcher: Any = None  # the RecordLauncher, built on first use (False: it could not be built)
_RETRY: set[int] = set()  # the CUresults a launch retries after making its context current (filled once)
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
                from ...backend.runtime.native_launch import RecordLauncher

                try:
                    _launcher = RecordLauncher(ENTRY_POINTS)
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
    """One record and the launcher that launches it: ``launch(x, y, scale_x address or 0, stream)``
    -> 0 launched, < 0 not launched, > 0 the CUresult of a failed launch."""

    __slots__ = ("_address", "_context_current", "_keep", "_run", "record")

    def __init__(self, record: Any, array: Any, launcher: Any, context_current: Callable[..., None]):
        import ctypes

        self.record = array  # the int64 words the native function reads (immutable but R_ERROR)
        # the prepared launch (its launcher and module), the cluster attribute, and the record
        # launcher: its LLVM engine owns the machine code ``_run`` calls, which reads its state array
        # (``reset`` forgets a launcher; the records built with it keep theirs)
        self._keep = (*record.keep, launcher)
        self._address = ctypes.addressof(array)
        self._run: Callable[..., int] = launcher.launch
        self._context_current = context_current

    def launch(self, x: int, y: int, scale_x: int, stream: int) -> int:
        """Launch with these addresses on ``stream`` (an int handle). A launch failing because
        another context was current (torch switched devices behind sparsile's per-thread cache)
        is retried once with the kernel's context made current, as a prepared launch does."""
        self._context_current()
        status = self._run(self._address, x, y, scale_x, stream)
        if status > 0 and status in _RETRY:
            self._context_current(True)
            status = self._run(self._address, x, y, scale_x, stream)
        return status


def native_launch(launches: list[Any] | None, x: Any, y: Any, scale_x: Any) -> NativeLaunch | None:
    """The native launch of a record's per-call launches ``launches`` ([(prepared run, picker)] of
    ``_kernels.LaunchRecord._prepare``) built for (x, y, scale_x), or None: not enabled, not one
    launch, or not replayable natively (shapes and strides of x and y are fixed per record; the
    scale must reach the kernel as a pointer only)."""
    if not enabled() or launches is None or len(launches) != 1:
        return None
    run, which = launches[0]
    prepared = getattr(run, "__self__", None)
    if not hasattr(prepared, "native_record"):
        return None
    sources = which((0, 1, 2))
    args = which((x, y, scale_x))
    try:
        record = prepared.native_record(args, sources, tuple(s != 2 for s in sources))
    except Exception as exc:  # an internal error of the record builder: visible, and the call still runs
        warnings.warn(f"sparsile.torch: a launch record keeps to its prepared launch ({type(exc).__name__}: {exc})",
                      RuntimeWarning, stacklevel=2)
        return None
    native = launcher() if record is not None else None
    if native is None:
        return None
    if not _RETRY:
        from ...backend.runtime.devices import RETRY_AFTER_CONTEXT_SWITCH

        _RETRY.update(int(e) for e in RETRY_AFTER_CONTEXT_SWITCH)
    return NativeLaunch(record, native.record(record.words), native, record.context_current)
