"""Which stream handles a launch record may name to the driver after the call that noted them
(``LaunchRecord.streams``; docs/torch.md, "Streams a launch record notes").

A record notes each stream it launched on by its raw ``CUstream`` handle, and later code asks about
them or waits for them, on any thread (stream_waits.py, graph_life.py): two kinds of handle do not
mean the same stream then.

* **The per-thread default stream** (``CU_STREAM_PER_THREAD``, handle 2: torch's current stream where
  it is ``torch.cuda.ExternalStream(2)``, as CuPy's ``Stream.ptds`` gives): the driver resolves it per
  *calling* thread, so asked on another thread (a write's wait, a finalizer on the garbage collector's
  thread) it names that thread's stream, not the one the launch used, and no driver call turns it into
  a handle valid everywhere (``cuStreamGetId`` gives an id, not a handle). Every per-thread default
  stream is a *blocking* stream: the legacy default stream waits for the work queued so far on each
  of them (CUDA's "Stream synchronization behavior"), so where that work must be complete the legacy
  stream stands for it (:func:`waited_as`: a synchronize of the legacy stream; graph_pools.used_on:
  torch's allocator records its free events there). A capture on a blocking stream refuses that
  synchronize (``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``), as it refuses the legacy stream's own
  (backend/runtime/capture_mode.py); torch's capture streams are non-blocking.
* **A stream somebody else owns** (``torch.cuda.ExternalStream`` of a cuda-python or CuPy stream):
  its owner may destroy it once the call returns, and a destroyed handle given to the driver is
  undefined behaviour (a crash, or a stream created since under the same handle). Holding the torch
  stream object would not help: an ``ExternalStream`` does not own its stream. So the handles a
  record may name later are only those that live as long as the process (:func:`lasting`): the
  legacy stream (0, 1), the per-thread one (2), and the streams torch created (its pool streams, the
  capture streams of ``torch.cuda.graph``: torch never destroys them; their stream ids are odd,
  c10/cuda/CUDAStream.cpp, "StreamId assignment"). Any other is *foreign*: named only while it is
  the calling thread's current stream (in use right now, so alive), never from a note.

A foreign stream's handle names no stream for good: once its owner destroys it, the driver may give
the same handle value to a stream created later. Where a record owns scratch for one stream (a split-K
workspace, an e4m3 record's quantized x: capture_keys.py) the handle alone would let the new stream
find the old stream's record and share its scratch with work the old stream may still run. So such a
record is kept under the driver's id of its stream as well (:func:`stream_id`, ``cuStreamGetId``:
unique for the life of the program), asked of the call's own stream only (the calling thread's
current one: alive), never during a capture. Lasting streams are never asked: their handles are
never freed, so never reused. Marks and waits stay by handle: torch's allocator records a free's event
on whichever stream has the handle then, and a PDL record's waits name only lasting streams and the
current one (a write queued on a new stream under an old handle shows in the weight's version counters).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from cuda.bindings import driver

from ...backend.runtime.capture_mode import LEGACY_HANDLES, PER_THREAD_HANDLE

LEGACY_STREAM = 0
"""The legacy default stream's handle (torch's default stream); CU_STREAM_LEGACY's (1) names the same stream."""


def _torch_created(stream: int, ordinal: int) -> bool:
    """Whether ``stream`` is torch's current stream on CUDA device ``ordinal`` and torch created it
    (an odd stream id: a pool stream, a capture stream; an external stream's id is its even handle)."""
    try:
        current = torch.cuda.current_stream(ordinal)
    except Exception:  # (no CUDA here)
        return False
    return current.cuda_stream == stream and current.stream_id % 2 == 1


_TORCH_CREATED: Callable[[int, int], bool] = _torch_created
"""(stream handle, device ordinal) -> torch created it; tests stand in for it (their streams are small ints)."""


def lasting(stream: int | None, ordinal: int) -> bool:
    """Whether ``stream`` (a handle a launch on CUDA device ``ordinal`` used, torch's current stream
    there at the time) lives as long as the process, so that it may be named to the driver later:
    the legacy and per-thread default streams and torch's own streams. None (off CUDA) too: nothing
    is ever asked of it. Asked once per stream a record launches on (not per call)."""
    if stream is None or stream in LEGACY_HANDLES or stream == PER_THREAD_HANDLE:
        return True
    return _TORCH_CREATED(stream, ordinal)


def waited_as(stream: int) -> int:
    """The handle whose synchronize waits for the work queued so far on ``stream``, whichever thread
    asks: the legacy stream for itself (0, 1) and for the per-thread default stream (2: a blocking
    stream, which the legacy stream waits for, whichever thread queued the work); ``stream`` itself
    otherwise."""
    return LEGACY_STREAM if stream in LEGACY_HANDLES or stream == PER_THREAD_HANDLE else stream


def _cuda_stream_id(stream: int) -> int | None:
    """``cuStreamGetId`` of the handle ``stream``; None where the driver gives none (a driver or
    binding before CUDA 12, no driver library, an error)."""
    try:
        err, sid = driver.cuStreamGetId(driver.CUstream(stream))
    except Exception:
        return None
    return int(sid) if err == driver.CUresult.CUDA_SUCCESS else None


_STREAM_ID: Callable[[int], int | None] = _cuda_stream_id
"""stream handle -> the driver's id of that stream, or None; tests stand in for it (their streams are small ints)."""


def stream_id(stream: int) -> int | None:
    """The driver's id of the stream ``stream`` names now (unique for the life of the program, so a
    stream created under a destroyed stream's handle has another), or None where the driver does not
    say (the caller then goes by the handle alone, as before). Ask only of a live stream that is not
    capturing: the calling thread's current stream outside a capture (a destroyed handle given to the
    driver is undefined behaviour; a capturing stream refuses the question). One driver call, no
    cache: nothing tells when a handle's stream is destroyed."""
    return _STREAM_ID(stream)
