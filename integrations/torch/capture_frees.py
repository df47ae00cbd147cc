"""Launch records planned inside a CUDA-graph capture whose tensors may not be freed yet (docs/torch.md,
"Scratch per stream and per CUDA-graph capture").

A record planned inside a capture allocated its tensors (scratch, padded copies, its y template) in
that capture. With torch's ``cudaMallocAsync`` allocator such a tensor is freed by ``cudaFreeAsync``
on the stream it was allocated on (torch.cuda.graph's capture stream, shared by its graphs): freed
while a capture is under way there, the free becomes a node of that capture's graph, and each
replay frees the memory again (memory corruption, illegal addresses). A record goes when its graph is
destroyed (the cache's collect, graph_life.py: in a capture too), when its weight is collected
(``RecordCache._dropped``, a weakref callback that runs at any allocation, on any thread, inside a
capture too), when its cache is collected with its layer (by the garbage collector, where no callback
runs), or when a layer's last call lets go of it. So a capture's record is a :class:`CaptureRecord`,
whose finalizer, whatever let go of it, keeps it (in :data:`HELD`) where freeing it now would put
frees into a capture (:func:`must_wait`), and :func:`drop_held` lets it go
at the next call of any cache outside a capture (``RecordCache.run``'s full path, not a layer's
last-call fast path, which falls through while any is held), or at the end of the next garbage
collection (a ``gc.callbacks`` hook, :func:`_after_collection`, put in place by the first hold), once
no such capture is seen. Its
tensors are freed there and then only because no reference cycle runs through a record: its weak
reference to its weight calls its cache back through a weak reference (record_cache.py); held in a
cycle, it would be freed by a later garbage collection, during a capture too (its finalizer runs
once: a record it held is not held again).

Bound: only records planned in a capture whose last reference went while a capture was under way
are held, each until the next full-path call outside a capture or the next garbage collection after
the capture ended, whichever comes first: their own memory and their weight's (a record pins the
memory of the weight it reads: a layer deleted during a capture keeps its weights' memory until
then). A process that only replays graphs after it makes no full-path call, but collections come as
it allocates Python objects (a generation-0 collection each few hundred net allocations of tracked
objects, tensors among them); one that allocates none keeps them until it ends. A collection is as
safe a point as a call: it runs on some thread at some allocation, a capture's included, as the
weakref callbacks and finalizers that hold records already do, and :func:`must_wait` asks the same
questions there (that thread's capture, the noted capture streams, the record's ``marked`` streams). With
torch's native allocator nothing is held (a freed block goes back to its pool, as before).

This is the one hold of sparsile.torch under ``cudaMallocAsync``. Before, the collect of destroyed
graphs' records had one of its own, asking the same questions: it left such a record in its cache
(and the graph's release pending) while a capture was under way, and no layer's fast path was made
meanwhile. Every record tied to a graph was planned in a capture, so it is a :class:`CaptureRecord`:
the finalizer's hold already covered it, and the collect now drops it whatever captures are under way."""

from __future__ import annotations

import gc

from . import graph_life
from ._kernels import LaunchRecord, capturing

HELD: dict[int, LaunchRecord] = {}
"""The records kept from being freed, by id (a dict: a finalizer on another thread changes it
atomically); never replaced, only changed."""


def must_wait(record: LaunchRecord) -> bool:
    """Whether freeing ``record`` (planned in a capture) now would put frees into a capture: with
    ``cudaMallocAsync`` only, while a capture sparsile can see is under way (the calling thread's,
    one on a noted capture stream: :func:`~.graph_life.may_drop_records`) or one of the streams its
    buffers are marked used on captures (``marked``: :func:`~.graph_life.frees_captured`). Driver
    calls: ``cuStreamIsCapturing`` only, legal during any capture."""
    if graph_life.frees_in_capture():
        return False
    return not graph_life.may_drop_records(capturing()) or graph_life.frees_captured(record)


class CaptureRecord(LaunchRecord):
    """A :class:`~._kernels.LaunchRecord` planned inside a CUDA-graph capture (``RecordCache.run``
    makes one there): its finalizer holds it (:data:`HELD`) where :func:`must_wait` says so."""

    def __del__(self) -> None:
        """The last reference went: kept alive in :data:`HELD` where freeing it now would put frees
        into a capture (run at any allocation, on any thread, by the garbage collector too: it never
        raises; where it cannot tell, the record is freed, as before). Called once per record: once
        :func:`drop_held` lets go of it, it is freed then (nothing else refers to it: module docstring)."""
        try:
            if must_wait(self):
                HELD[id(self)] = self
                _watch_collections()
        except Exception:  # (at interpreter exit, modules may be gone)
            pass


_WATCHING: list[bool] = []
"""Non-empty once :func:`_after_collection` is among ``gc.callbacks`` (a list: appended to atomically,
from a finalizer on any thread; two threads appending both leave the hook in twice, which is harmless)."""


def _watch_collections() -> None:
    """Have each garbage collection's end let go of the held records that may go then
    (:func:`_after_collection`), from the first hold on. Lock-free (list appends): it runs in a finalizer."""
    if not _WATCHING:
        _WATCHING.append(True)
        gc.callbacks.append(_after_collection)


def _after_collection(phase: str, info: dict) -> None:
    """``gc.callbacks`` hook: at the end of a collection (any thread, any allocation, inside a capture
    too) the held records :func:`must_wait` no longer keeps are let go of (:func:`drop_held`), so that
    a process that only replays graphs does not keep them, with their weights' memory, until its next
    full-path call. Nothing where none is held (one dict look per collection). Never raises (a hook's
    exception would be reported at every collection); a record :func:`drop_held` could not look at
    stays held."""
    if phase != "stop" or not HELD:
        return
    try:
        drop_held()
    except Exception:
        pass


def drop_held() -> int:
    """Let go of the held records that may be freed now (:func:`must_wait` asked again of each);
    how many stay held. Each record is taken out of :data:`HELD` before it is looked at and put back
    where it must wait, so only the thread that looked frees it, right after its look (no copy of
    HELD keeps it through the looks at the others, nor through another thread's look that finds a
    capture begun since)."""
    for key in list(HELD):  # (a snapshot of the keys: finalizers on other threads add records)
        record = HELD.pop(key, None)
        if record is None:  # (another thread's drop_held took it)
            continue
        try:
            wait = must_wait(record)
        except BaseException:  # (kept: a record let go of by an error would be freed whatever captures)
            HELD[key] = record
            raise
        if wait:
            HELD[key] = record
        record = None  # (the last reference to one let go of: freed here)
    return len(HELD)
