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

The synchronizing calls of a :class:`~.memory.DeviceBuffer` (``copy_from_host``, ``copy_to_host``:
a copy on the caller's stream and ``cuStreamSynchronize`` of that stream; ``fill_byte``: a memset
and ``cuStreamSynchronize`` of the legacy default stream; ``fill_byte(value, stream=)``: a
``cuMemsetD8Async`` on that stream, no synchronize) run under :func:`thread_local_capture_mode`
too. The driver's documentation of ``cuThreadExchangeStreamCaptureMode`` makes them "potentially
unsafe" calls, which only the mode forbids: in ``THREAD_LOCAL`` mode "concurrent capture sequences in
other threads are ignored", and they touch no stream another thread captures, so they are not calls
that "necessarily conflict with stream capture" (which every mode refuses, as ``cuEventQuery`` of an
event recorded in a capture). Two limits stay, whatever the mode: synchronizing (or copying on) a
stream that another thread is capturing is such a conflict, and the legacy default stream (handle 0)
implicitly waits for every *blocking* stream of its context, so a capture on a blocking stream
refuses it (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``); torch's capture streams are non-blocking.

:func:`~.devices.synchronize` (``cuCtxSynchronize``) is not made thread-local: it waits for every
stream of the device, a capturing one included, and reports of NVIDIA's behaviour (TensorRT issue
2888, llama.cpp PR 14033, ROCm's comparison in rocm-systems PR 4508) agree that a device-wide
synchronize invalidates another thread's capture on that device whatever the modes. There is no
driver query for "a capture is under way somewhere in the process"; what can be known is whether a
stream known to have captured before is capturing now. Callers note such streams
(:func:`note_capture_stream`: the torch integration notes torch's own streams on which it saw a
capture, which torch never destroys) and :func:`captures_under_way` asks the driver
(``cuStreamIsCapturing``, legal during a capture) about each: ``synchronize`` refuses with SP0752
where one is, instead of invalidating it; a capture on a stream nobody noted is not seen. A
caller that needs only some streams' work complete synchronizes those streams instead, in
:func:`thread_local_capture_mode`, skipping any :func:`stream_capturing` says is capturing (the torch
integration's PDL records, waiting for their weight's writes: integrations/torch/stream_waits.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cuda.bindings import driver

THREAD_LOCAL = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_CAPTURE_NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
_capture_streams: dict[int, int] = {}
"""Stream handles known to have captured (:func:`note_capture_stream`) -> their device ordinal."""
LEGACY_HANDLES = (0, 1)
"""The handles of the legacy default stream: 0 (torch's default stream) and ``CU_STREAM_LEGACY``."""
PER_THREAD_HANDLE = 2
"""``CU_STREAM_PER_THREAD``: the calling thread's per-thread default stream, a different stream on each
thread that names it (integrations/torch/noted_streams.py)."""
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


def note_capture_stream(stream: int, ordinal: int) -> None:
    """Remember ``stream`` (a ``CUstream`` handle of device ``ordinal``), on which a capture was
    seen, for :func:`captures_under_way`. Only a stream that lives as long as the process may be
    noted (torch's pool and default-capture streams: torch never destroys them): the driver is
    asked about it later, and a destroyed stream's handle must not be. The legacy stream (either
    of :data:`LEGACY_HANDLES`) is not noted (asking it during another capture is an implicit
    synchronization), nor the per-thread default stream (:data:`PER_THREAD_HANDLE`: asked on
    another thread, it names that thread's stream, not the one seen capturing)."""
    if stream in LEGACY_HANDLES or stream == PER_THREAD_HANDLE:
        return
    if stream not in _capture_streams:
        _capture_streams[stream] = ordinal


def _stream_capturing(stream: int) -> bool | None:
    """Whether ``stream`` is in a capture (``cuStreamIsCapturing``): active, or invalidated by an error
    but not ended yet (the driver's documentation: the stream is unusable until ``cuStreamEndCapture``);
    None where the driver does not say."""
    try:
        err, status = driver.cuStreamIsCapturing(driver.CUstream(stream))
    except Exception:
        return None
    return status != _CAPTURE_NONE if err == driver.CUresult.CUDA_SUCCESS else None


_IS_CAPTURING: Callable[[int], bool | None] = _stream_capturing


def stream_capturing(stream: int) -> bool | None:
    """Whether ``stream`` (a ``CUstream`` handle) is in a capture now, active or invalidated but not
    ended (``cuStreamIsCapturing``, legal during any capture); None where the driver gives no answer
    (no driver library; an invalid handle, as a destroyed stream's). The legacy default stream
    (:data:`LEGACY_HANDLES`) cannot capture: False, never asked (asking it during a capture of a
    blocking stream is an implicit synchronization, which invalidates that capture). Unlike
    :func:`captures_under_way` it asks about a stream nobody noted, so the caller must know the
    handle is alive (a stream its launches run on, or whose allocations torch will free on it).
    The per-thread default stream (:data:`PER_THREAD_HANDLE`) is asked as it is: the calling
    thread's, which is the one a free of torch's on that handle from this thread goes to."""
    if stream in LEGACY_HANDLES:
        return False
    return _IS_CAPTURING(stream)


def captures_under_way(ordinal: int | None = None) -> bool:
    """Whether any stream noted by :func:`note_capture_stream` (of device ``ordinal``; None: of any
    device) is capturing now. One driver query per noted stream (there are one or two in practice:
    torch.cuda.graph's capture stream, torch.compile's), nothing where none was noted. A stream the
    driver gave no answer about is forgotten after (it counts as capturing this once)."""
    if not _capture_streams:
        return False
    busy = False
    # a snapshot taken in one step (dict.copy): other threads note streams meanwhile; iterating the dict
    # itself (tuple(d.items())) lets them in mid-iteration, at a garbage collection or on a free-threaded build
    for stream, device in _capture_streams.copy().items():
        if ordinal is not None and device != ordinal:
            continue
        capturing = _IS_CAPTURING(stream)
        if capturing is None:  # (no answer: taken as capturing, this once)
            _capture_streams.pop(stream, None)
        busy = busy or capturing is not False
    return busy
