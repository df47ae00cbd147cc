"""The calling thread's stream-capture interaction mode, for sparsile's eager driver calls.

CUDA forbids "potentially unsafe" driver calls (``cuMemAlloc``, ``cuMemFree``, ``cuModuleUnload``,
synchronizing calls, ...) during a stream capture, and which captures count depends on the calling
thread's *mode* (``cuThreadExchangeStreamCaptureMode``):

* ``GLOBAL``, every thread's default: forbidden while this thread captures (not in relaxed mode) *or
  any other thread* has a capture begun in global mode, as ``torch.cuda.graph`` begins its captures.
  The forbidden call fails and the other thread's capture is invalidated: its next call fails with
  ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`` for a reason that has nothing to do with it.
* ``THREAD_LOCAL``: forbidden only while this thread itself captures (not in relaxed mode); other
  threads' captures are ignored.
* ``RELAXED``: never forbidden (torch's caching allocator switches to it around ``cudaMalloc``).

sparsile's eager calls that allocate or release (a :class:`~.memory.DeviceBuffer`'s ``cuMemAlloc``,
:func:`~.release.drain`'s deferred ``cuMemFree`` / ``cuModuleUnload`` / ``cuGraphExecDestroy``, the
torch integration's own graph capture of a repeated call) run under :func:`thread_local_capture_mode`:
another thread's ``torch.cuda.graph`` capture is unaffected by them, while a capture of the calling
thread itself still forbids them exactly as before (relaxed mode would let a free or an allocation
happen inside the thread's own capture, unseen by the graph).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cuda.bindings import driver

THREAD_LOCAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_available = True
"""False once the driver library turned out to be absent (no driver: there is no capture to spare)."""


def _exchange(mode: object) -> object | None:
    """Set the thread's capture mode to ``mode``; the previous mode, or None where it could not be
    set (no driver library here, or the driver refused)."""
    global _available
    if not _available:
        return None
    try:
        out = driver.cuThreadExchangeStreamCaptureMode(mode)
    except Exception as exc:
        if type(exc).__name__ == "DynamicLibNotFoundError":  # (a library does not appear later)
            _available = False
        return None
    return out[1] if out[0] == driver.CUresult.CUDA_SUCCESS else None


@contextmanager
def thread_local_capture_mode() -> Iterator[None]:
    """``with thread_local_capture_mode():`` the calling thread's capture mode is ``THREAD_LOCAL``
    inside, so its driver calls neither fail nor invalidate another thread's global-mode capture;
    the thread's previous mode is restored after, also when the block raises. Without a driver,
    or where the driver refuses the exchange, the block runs in the thread's mode as it is."""
    previous = _exchange(THREAD_LOCAL)
    try:
        yield
    finally:
        if previous is not None:
            _exchange(previous)
