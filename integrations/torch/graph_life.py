"""Launch records that live as long as the CUDA graph whose capture planned them (docs/torch.md,
"Scratch per stream and per CUDA-graph capture").

A record planned inside a capture for that capture alone (one with scratch, stored under the
capture's id: capture_keys.py; one whose copies of the weight only that graph's replay fills,
``unfilled``) is used by that graph only. The cache cannot see a graph deleted, so before it kept
such records while their weight lived: a process capturing the same layer again and again kept one
per capture, with its buffers (and the graph pool memory they pin). Now each is tied to its graph
with a driver user object (backend/runtime/graph_objects.py): once the graph and its executables
are destroyed, their launches complete, the driver's callback marks it, and the cache's next call
outside a capture drops it (:meth:`~.record_cache.RecordCache.graphs_released`), its tensors going
back to torch's allocator: nothing can read them any more. Where no user object can be made (no
llvmlite engine, no driver support, an error, a capture whose graph cannot be read) the record is
kept as before; past :data:`UNTIED_WARN` such records in a cache, one warning per process.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ...backend.runtime.capture_mode import captures_under_way, note_capture_stream, stream_capturing
from ...backend.runtime.graph_objects import GraphReleases, graph_releases
from ._kernels import cuda_capture_info

UNTIED_WARN = 256
"""Records planned for one capture each, kept in a cache without a tie to their graph, beyond which
one warning (per process) says that they accumulate."""

_warned: list[bool] = []


def _cuda_capture_graph(stream: int) -> int | None:
    """The ``CUgraph`` the capture on ``stream`` builds (:func:`~._kernels.cuda_capture_info`), or None."""
    info = cuda_capture_info(stream)
    return None if info is None else info[1] or None


def _torch_allocator_backend() -> str:
    """torch's CUDA allocator backend ("native", "cudaMallocAsync"); "native" where torch cannot say
    (a build without CUDA)."""
    try:
        return str(torch.cuda.get_allocator_backend())
    except Exception:
        return "native"


def _torch_native_stream(device: int) -> int | None:
    """torch's current stream on CUDA device ``device`` as a handle where torch created it (a pool
    stream, torch.cuda.graph's capture stream: torch never destroys those; their stream ids are odd,
    c10/cuda/CUDAStream.cpp, "StreamId assignment"), else None (an external stream, whose handle may
    be destroyed by its owner; the legacy default stream)."""
    try:
        current = torch.cuda.current_stream(device)
    except Exception:  # (no CUDA here)
        return None
    return current.cuda_stream if current.stream_id % 2 and current.cuda_stream else None


_CAPTURE_GRAPH: Callable[[int], int | None] = _cuda_capture_graph
_RELEASES: Callable[[], GraphReleases | None] = graph_releases
_ALLOCATOR_BACKEND: Callable[[], str] = _torch_allocator_backend
_NATIVE_STREAM: Callable[[int], int | None] = _torch_native_stream


def saw_capture(device: int) -> None:
    """A call on CUDA device ``device`` runs inside a capture: note torch's current stream there,
    where torch owns it, as a capture stream (backend/runtime/capture_mode.py): the records planned
    in this capture have their tensors allocated on it, a later capture (another thread's) on it is
    then seen by :func:`may_drop_records`, and ``runtime.synchronize`` refuses while it captures.
    Called only inside captures (one torch call and a dict look, never on the eager fast path). Noted
    again at each call: capture_mode forgets a stream the driver gave no answer about, and torch's own
    streams live on, so the next capture there notes it anew (no set of its own here that would keep
    it from being noted again)."""
    stream = _NATIVE_STREAM(device)
    if stream is not None:
        note_capture_stream(stream, device)


def may_drop_records(in_capture: bool) -> bool:
    """Whether a record planned in a capture may be freed now (capture_frees.must_wait asks, whatever
    let go of it: a destroyed graph's collect, a collected weight, cache or layer), on a thread
    whose current stream captures (``in_capture``) or not. With torch's native allocator always
    (:func:`frees_in_capture`). With ``cudaMallocAsync`` only while no capture is under way in the
    process, as far as sparsile can know (the calling thread's, and the captures on streams it saw
    capture: :func:`saw_capture`): torch allows one capture at a time there, and while it lasts a
    freed allocation of an earlier capture is ``cudaFreeAsync``-ed on the stream it was allocated on
    (torch.cuda.graph's capture stream, shared by its graphs) and that stream joined into the capture
    at its end. So an eager collect on thread A while thread B captured on that stream put the free
    into B's graph (each replay freeing the memory again). Now the records wait, held by their
    finalizer, for a call or a garbage collection after the capture (a layer's fast path does not
    serve meanwhile: capture_frees.py). A capture on a stream sparsile never saw capture (an external stream, or a first
    capture with no sparsile call in it yet) is not seen here; the stream each released record's
    tensors were allocated on is asked itself before it is dropped (:func:`frees_captured`)."""
    if frees_in_capture():
        return True
    return not in_capture and not captures_under_way()


def frees_in_capture() -> bool:
    """Whether records of destroyed graphs may be dropped (their tensors freed) while a capture is
    under way. With torch's native caching allocator a freed block only goes back to its pool (the
    graph's private pool for a capture's scratch; events it would record wait for the capture's
    end). With ``cudaMallocAsync`` a tensor allocated in a capture is freed by ``cudaFreeAsync`` on
    the stream it was allocated on: torch.cuda.graph's capture stream is shared by its graphs, so
    inside the next capture that free would be captured into the new graph (freeing the memory at
    each of its replays). There they are held until no capture would take the frees (capture_frees.py)."""
    return _ALLOCATOR_BACKEND() != "cudaMallocAsync"


def capture_graph(stream: int | None) -> int | None:
    """The graph the capture on ``stream`` builds, or None (not known; never asked of the legacy
    default stream: an implicit synchronization there invalidates the capture)."""
    if not stream:
        return None
    try:
        return _CAPTURE_GRAPH(stream)
    except Exception:
        return None


def tie(cache: Any, record: Any, stream: int | None) -> bool:
    """Have ``cache`` drop ``record`` (planned in the capture on ``stream`` for that graph alone)
    once that graph is destroyed: :meth:`~.record_cache.RecordCache.graphs_released`. False where
    it cannot be tied (the record is kept while its weight lives, as before)."""
    releases = _RELEASES()
    graph = capture_graph(stream) if releases is not None else None
    return graph is not None and releases.watch(graph, (weakref.ref(cache), weakref.ref(record)))


def released() -> bool:
    """Whether a graph a record was tied to was destroyed since the records were last dropped."""
    releases = _RELEASES()
    return releases is not None and releases.released()


def release_counter() -> Any | None:
    """The counter the destroy callbacks raise (:attr:`~...backend.runtime.graph_objects.GraphReleases.counter`:
    its ``value`` is one memory read, no lock), or None where no graph release is watched."""
    releases = _RELEASES()
    return None if releases is None else releases.counter


def frees_captured(record: Any) -> bool:
    """Whether dropping ``record`` now would put frees into a capture: with ``cudaMallocAsync``, a
    tensor allocated in a capture is ``cudaFreeAsync``-ed on the stream it was allocated on (with
    events on the streams it was recorded on), so where one of the streams the record ran on (its
    ``marked``: its capture's stream, where it planned its scratch, and every stream its buffers are
    marked used on, a stream a PDL record forgot included) is capturing now, the free would
    become a node of that capture's graph (freeing the memory at each of its replays). That stream is
    asked itself, whether or not a sparsile call noted it (:func:`saw_capture`: torch's own streams
    only): a capture there on an external stream, or on one whose note was dropped, is seen too. Each
    handle asked is one torch's own free of the record's tensors names right after (``cudaFreeAsync``
    on the stream they were allocated on, an event on each stream ``record_stream`` marked): a stream
    its owner destroyed while they lived breaks that free whatever is asked here
    (``torch.cuda.ExternalStream``'s contract: its owner keeps it alive while they live). A PDL
    record's wait forgets a stream somebody else owns (noted_streams.py), but it stays in
    ``marked``: torch's free records an event there, which joins the allocation stream into a
    capture on it. The per-thread default stream (2) is asked on the calling thread, whose
    per-thread stream is where torch's free on that handle from this thread goes (its
    ``record_stream`` marks are on the legacy stream: graph_pools.usage_stream). Where the driver
    gives no answer the record is freed, as before. Never with the native allocator
    (:func:`frees_in_capture`)."""
    if frees_in_capture():
        return False
    return any(stream and stream_capturing(stream) for stream in tuple(record.marked))


def released_records() -> list[tuple[Any, Any]]:
    """(cache, record) of each record whose graph was destroyed since the last call, both alive. Each
    is handed back whatever captures are under way: a record tied to a graph was planned in a capture,
    so it is a ``CaptureRecord``, whose finalizer holds it where its frees would be captured
    (capture_frees.must_wait: :func:`may_drop_records`, :func:`frees_captured`)."""
    releases = _RELEASES()
    pairs = []
    for cache_ref, record_ref in releases.collect() if releases is not None else ():
        cache, record = cache_ref(), record_ref()
        if cache is not None and record is not None:
            pairs.append((cache, record))
    return pairs


def untied(count: int) -> None:
    """A cache now keeps ``count`` records of one capture each that no graph release will drop:
    past :data:`UNTIED_WARN`, warn once per process."""
    if count > UNTIED_WARN and not _warned:
        _warned.append(True)
        warnings.warn(f"sparsile.torch: {count} launch records planned inside CUDA-graph captures are kept by one "
                      "cache with no way to tell when their graph is destroyed (no driver user object could be tied to "
                      "their graph); "
                      "each keeps its scratch memory while its weight lives. Capturing the same layer again and "
                      "again grows this: capture once and replay, or recreate the layer", stacklevel=4)
