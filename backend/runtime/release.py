"""Releasing driver resources that garbage collection dropped: later, at a point that is safe.

A :class:`~.memory.DeviceBuffer` or a :class:`~.module.Module` that nobody references any more is
found by Python's garbage collector at an arbitrary moment, possibly in the middle of a CUDA graph
capture (torch no longer runs ``gc.collect()`` before ``torch.cuda.graph`` starts capturing). In the
default ("global") capture mode ``cuMemFree`` and ``cuModuleUnload`` are forbidden while any thread
captures: the driver refuses the call *and invalidates the capture*, so the user's next launch fails
with ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` for a reason that has nothing to do with it
(docs/architecture.md, "Freeing device memory").

So a collected resource is not released on the spot: its release is queued here, and the queue is
drained at the next call that is itself illegal during a capture anyway (a ``cuMemAlloc`` of a new
:class:`~.memory.DeviceBuffer`, a ``cuModuleLoadData``, :func:`~.devices.synchronize`). Explicit
releases (``DeviceBuffer.free()``, ``Module.unload()``, leaving a ``with`` block) still happen at
once: the caller chose the moment.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_pending: list[Callable[[], None]] = []
_lock = threading.Lock()


def defer(release: Callable[[], None]) -> None:
    """Queue ``release`` (a finalizer's driver call) for the next :func:`drain`. Safe from any
    thread and from inside the garbage collector: it only appends to a list."""
    with _lock:
        _pending.append(release)


def pending() -> int:
    """How many releases wait for the next :func:`drain`."""
    return len(_pending)


def drain() -> int:
    """Run the queued releases, oldest first; how many ran. Each release ignores its own driver
    errors (``devices.in_context``), so one stale handle cannot keep the others from being freed."""
    with _lock:
        if not _pending:
            return 0
        todo = _pending[:]
        del _pending[:]
    for release in todo:
        release()
    return len(todo)
