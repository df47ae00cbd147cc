"""Waiting for the writes to a PDL record's weight on the streams its kernels launch on, without a
device-wide synchronize (``LaunchRecord.weight_written``; docs/torch.md, "Programmatic dependent launch").

A record launched with programmatic dependent launch (``RecordCache(pdl=True)``) reads the weight
before its ``griddepcontrol.wait``: a write to the weight by the kernel just before it *on the same
stream* may still be running then. A write queued on another stream reaches the launch stream only
through an event wait (``cuStreamWaitEvent``), a full dependency (PDL relaxes only the edge to the
immediately preceding kernel of the same stream), or not at all (the user's race, PDL or not). So
what must be complete is the work queued so far on the streams the record's kernels launch on: the
calling thread's current stream (where a call launches, and where ``load_state_dict`` or
``SemiSparseLinear.refresh`` queued the write) and each stream the record launched on before
(``LaunchRecord.streams``: it may launch there again). :func:`wait_for_streams` synchronizes each
(``cuStreamSynchronize``), not the device: ``torch.cuda.synchronize`` (``cuCtxSynchronize``) would
wait for every stream of the device, unrelated work included, and would invalidate a CUDA graph
capture under way on another thread (backend/runtime/capture_mode.py).

The stream synchronizes run in ``THREAD_LOCAL`` capture mode (:func:`thread_local_capture_mode`): a
``torch.cuda.graph`` capture (global mode) under way on another thread neither refuses them nor is
invalidated by them. Skipped:

* every stream, where the calling thread's current stream is capturing (the caller asks:
  ``capturing()``): inside the thread's own capture a synchronize is refused in every mode but
  relaxed, and the capture is invalidated. A write captured into a graph runs only when the graph
  is replayed; no wait now could cover it (the rule of docs/torch.md: the weight is not written
  while a call may run).
* a stream capturing right now (``cuStreamIsCapturing``, legal during any capture), another thread's:
  synchronizing it conflicts with that capture in every mode. Safe to skip: what was queued on it
  since its capture began is recorded into a graph, not run (a write there is a replay's, as
  above), and what was queued before has completed, since ``torch.cuda.graph`` synchronizes the
  device before it begins a capture (torch.compile's CUDA graph trees capture through it). A capture
  begun by other means (``CUDAGraph.capture_begin`` or ``cuStreamBeginCapture`` directly) right after
  a write queued on its stream leaves that write unwaited-for where the record's next launch on that
  stream follows the capture's end with no kernel between.
* a stream the driver gives no answer about: nothing is launched on it any more, and what it still
  runs reaches other streams only through event waits. (A destroyed stream's handle is never given:
  the caller names a stream somebody else owns only while it is the calling thread's current one,
  noted_streams.py; ``LaunchRecord.weight_written`` forgets the others and waits for each at the
  record's next launch there.)

The legacy default stream (handle 0, torch's default stream; ``CU_STREAM_LEGACY``, 1, names it too)
cannot capture and is never asked (asking it during a capture of a blocking stream is an implicit
synchronization): it is synchronized with its device current. It waits for every *blocking* stream of
the context too, so a capture on a blocking stream refuses it; torch's streams, its capture streams
included, are non-blocking. The per-thread default stream (``CU_STREAM_PER_THREAD``, 2) is waited for
as the legacy stream too, never asked nor synchronized by its own handle: on the calling thread that
handle names the calling thread's per-thread stream, not the one a launch on another thread used, and
every per-thread stream is a blocking one, which the legacy stream waits for (noted_streams.py).

A capture that begins on a stream between the question and the synchronize (another thread, a
window of microseconds) is invalidated, as any synchronize of a capturing stream; the synchronize
then fails with SP0715 (``cuStreamSynchronize`` and the driver's error).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from cuda.bindings import driver

from ...backend.runtime.capture_mode import stream_capturing, thread_local_capture_mode
from ...backend.runtime.devices import check
from .noted_streams import LEGACY_STREAM, waited_as


def _cuda_stream_synchronize(stream: int, ordinal: int) -> None:
    """``cuStreamSynchronize`` of ``stream`` with device ``ordinal`` current (the legacy default stream
    is the current context's); a failure raises ``CudaError`` (SP0715) naming the call."""
    with torch.cuda.device(ordinal):
        check("cuStreamSynchronize", driver.cuStreamSynchronize(driver.CUstream(stream)))


_SYNCHRONIZE: Callable[[int, int], None] = _cuda_stream_synchronize
"""Synchronize (stream handle, device ordinal); tests stand in for it (their streams are no CUstream)."""
_CAPTURING: Callable[[int], bool | None] = stream_capturing
"""Whether a stream (not the legacy one) is capturing now, None where the driver does not say."""


def wait_for_streams(streams: Iterable[int | None], ordinal: int) -> list[int]:
    """Wait until the work queued so far on each of ``streams`` (``CUstream`` handles of device
    ``ordinal``, repeats and None, off CUDA, allowed) is complete, each stream synchronized once, in
    ``THREAD_LOCAL`` capture mode; a stream capturing now, or that the driver gives no answer about,
    is skipped (module docstring). The caller has checked that its own current stream is not
    capturing, and names only streams alive now (noted_streams.lasting, or its current stream).
    Returns the handles synchronized, in increasing order (the legacy stream as 0, standing for the
    per-thread default stream too)."""
    handles = sorted({waited_as(s) for s in streams if s is not None})
    if not handles:
        return []
    synchronized = []
    with thread_local_capture_mode():
        for stream in handles:
            if stream != LEGACY_STREAM and _CAPTURING(stream) is not False:
                continue  # capturing (another thread's capture), or unknown
            _SYNCHRONIZE(stream, ordinal)
            synchronized.append(stream)
    return synchronized
