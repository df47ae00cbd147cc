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
:class:`~.memory.DeviceBuffer`, :func:`~.devices.synchronize`). Module loads do not drain: whether
``cuModuleLoadData`` is allowed during a capture is not established here, and a first kernel load
inside a capture must not free anything there. Explicit releases (``DeviceBuffer.free()``,
``Module.unload()``, leaving a ``with`` block) still happen at once: the caller chose the moment.

The releases run with the draining thread in ``THREAD_LOCAL`` capture mode (capture_mode.py): a
drain on one thread while another thread captures a ``torch.cuda.graph`` (global mode) would
otherwise fail its frees and invalidate that capture. A capture of the draining thread itself still
forbids them, as before.

The queue is a ``collections.deque`` without a lock: ``append`` and ``popleft`` are atomic under
the GIL, and a finalizer that runs while :func:`drain` works (a collection inside a release) only
appends, so it can neither deadlock on a lock its own thread holds nor be lost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .capture_mode import thread_local_capture_mode

_pending: deque[Callable[[], None]] = deque()


def defer(release: Callable[[], None]) -> None:
    """Queue ``release`` (a finalizer's driver call) for the next :func:`drain`. Safe from any
    thread and from inside the garbage collector: it only appends."""
    _pending.append(release)


def pending() -> int:
    """How many releases wait for the next :func:`drain`."""
    return len(_pending)


def drain() -> int:
    """Run the releases queued when it starts, oldest first; how many ran. A release queued while
    it runs waits for the next drain. Each release ignores its own driver errors
    (``devices.in_context``); any other exception of one is dropped too, so that it cannot keep the
    others from being freed. They run in ``THREAD_LOCAL`` capture mode (another thread's global
    capture is not invalidated by them); nothing queued, no driver call."""
    count = len(_pending)
    if not count:
        return 0
    with thread_local_capture_mode():
        for _ in range(count):
            try:
                release = _pending.popleft()
            except IndexError:  # another thread drained them
                break
            try:
                release()
            except Exception:
                pass
    return count
