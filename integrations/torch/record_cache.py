"""The launch records of ``sparsile.torch`` by key (:class:`RecordCache`): found or built per call,
kept per weight while it lives, and brought up to in-place writes of the weight (docs/torch.md, "A
weight written in place"). The records themselves: ``_kernels.LaunchRecord``."""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ..errors import SP_STALE_CAPTURE, IntegrationError
from . import graph_life
from ._kernels import LaunchRecord, capture_id, capturing, pdl_wanted, stream_getter
from .capture_frees import HELD, CaptureRecord, drop_held
from .capture_keys import foreign_id, foreign_key, is_capture_key, scratch_key
from .noted_streams import stream_id
from .optimizer_steps import AfterStep, bump_unless_written, watch_optimizer_steps
from .weight import Weight, same_binding, storage_key, weight_versions

FOREIGN_SLACK = 64
"""How many handles :attr:`RecordCache.foreign` may hold beyond twice those of its live records before the
handles whose records are all gone are forgotten (:meth:`RecordCache._forget_foreign`)."""
_STEP_WATCHED: weakref.WeakSet[LaunchRecord] = weakref.WeakSet()
"""The live records whose weight a fused optimizer step could leave them behind (:func:`_stepped`)."""


def _watch_steps(record: LaunchRecord) -> None:
    """Have optimizer steps reach ``record`` where it reads copies of its weight's tensors (converted,
    padded) or launches with PDL (it waits for the weight's writes): both are done on a write its
    version counters show, and a fused optimizer's step shows none (optimizer_steps.py)."""
    if record.tracked is not None and (record.copies_weight or record.pdl):
        _STEP_WATCHED.add(record)
        watch_optimizer_steps(_stepped)


def _stepped(params: list[torch.Tensor]) -> AfterStep | None:
    """The watcher of optimizer steps for the launch records: each parameter with a gradient in the
    memory of a tensor a live record watches (:func:`_watch_steps`) gets its version counter bumped
    after the step where the step did not bump it (a fused optimizer's), as a write through torch does:
    the record's next call, or its layer's last call, sees the write and refreshes its copies (before,
    a bias made a parameter and read through a converted copy kept the value from before the step)."""
    if not _STEP_WATCHED:
        return None
    watched = set()
    for record in tuple(_STEP_WATCHED):  # (a snapshot: records die meanwhile)
        copied = record.copied or (True,) * len(record.tracked)
        watched.update(storage_key(t) for t, c in zip(record.tracked, copied, strict=True) if c or record.pdl)
    return bump_unless_written([p for p in params if p.grad is not None and storage_key(p) in watched])


def _dropped_from(cache: weakref.ref, key: tuple, owner: weakref.ref) -> None:
    """The callback of a record's weak reference ``owner`` to its weight (stored at ``key`` of the cache
    ``cache`` refers to): :meth:`RecordCache._dropped`, where the cache lives. The cache is referred to weakly:
    a strong reference (its bound method) made a cycle of the cache and each of its records, so a cache let go
    of was freed only by a garbage collection, at any allocation, a capture's under way included; and a capture's
    record that its finalizer held then (capture_frees.py) kept its cache, and stayed in that cycle after
    ``drop_held`` let it go, its tensors freed by the next collection, during a capture too."""
    live = cache()
    if live is not None:
        live._dropped(key, owner)


def _graphs_own(record: LaunchRecord) -> bool:
    """Whether ``record`` is the capture graph's alone: stored under the capture's id (its scratch),
    or reading copies of the weight that only that graph's replay fills (``unfilled``)."""
    return record.unfilled or is_capture_key(record.key)


class RecordCache:
    """Launch records by key: at most ``capacity`` per weight (the least recently built of that
    weight dropped first, except records a CUDA graph captured), none for a weight that is gone.

    A record holds aliases of its weight, and a weak reference to the caller's ``values`` tensor:
    once that tensor is collected (its layer or model deleted, or the buffer replaced), its records
    are dropped and the weight's memory is freed. The limit is per weight, not global, so that a
    model with more projections than any fixed number keeps one record per layer: under
    torch.compile's CUDA graph trees a record dropped between the warm-up and the recording would be
    rebuilt inside the capture, and its allocations left in the graph's pool ("tensors in the
    cudagraph pool not tracked as outputs")."""

    def __init__(self, capacity: int = 64, pdl: bool = False):
        self.capacity = capacity
        self.pdl = pdl  # the weights are constant: records launch with PDL where pdl_wanted says so
        self.records: OrderedDict[tuple, LaunchRecord] = OrderedDict()
        # captured records replaced (weight written, cache cleared), by id: kept while their weight lives
        self.retired: dict[int, LaunchRecord] = {}  # (a dict: a weakref callback changes it atomically)
        # records planned inside a capture whose copies (counters) that graph's replay fills, by id:
        # filled (or replaced) by the next call outside a capture, whichever record it calls
        self.unfilled: dict[int, LaunchRecord] = {}
        # ids of the records a capture planned for its graph alone, tied to that graph (graph_life.py):
        # dropped at the first call outside a capture after the graph is destroyed
        self.tied: set[int] = set()
        self.untied = 0  # such records planned here that could not be tied (kept while their weight lives)
        # (graph_life.release_counter(), its value) read by the last call outside a capture with tied
        # records, before it collected: a layer's LastCall compares it (last_call.py); None: not read yet
        self.releases_seen: tuple[Any, int] | None = None
        self._streams: dict[int, Callable[[], int]] = {}  # device ordinal -> torch's current-stream getter
        # (the record the last call ran, its stream): what a layer's LastCall keeps (last_call.py)
        self.last: tuple[LaunchRecord, int] | None = None
        # handles of streams somebody else owns that a record with scratch was planned for here: their eager
        # records with scratch are kept under the stream's driver id too (capture_keys.foreign_key); only those
        # of live records, give or take FOREIGN_SLACK (_forget_foreign: a server's stream per request)
        self.foreign: set[int] = set()
        self.foreign_limit = FOREIGN_SLACK  # (the size at which the handles of dropped records are forgotten)
        # stream handles found lasting (noted_streams.lasting: never freed, so never another stream's), asked once:
        # a fused group's run stamp names any other by its driver id too (run_stamp.stream_named)
        self.lasting: set[int] = set()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An unpickled cache (a layer's, which pickles an empty one: ``SparseLinear.__getstate__``) is a
        new one of its capacity and PDL choice: one pickled before an attribute existed (``foreign``) has
        it (its first call on a stream somebody else owns raised AttributeError)."""
        self.__init__(state.get("capacity", 64), state.get("pdl", False))

    def clear(self) -> None:
        """Drop every record; those a CUDA graph captured stay (retired) while their weight lives."""
        captured = [r for r in tuple(self.records.values()) if r.captured]  # (a weakref callback may pop
        self.retired.update({id(r): r for r in captured})                   # entries meanwhile: a snapshot)
        self.records.clear()
        self.last = None
        self.unfilled.clear()  # (an unfilled record is not revived: only its graph reads it)
        for record in captured:
            self._unless_released(record)

    def _unless_released(self, record: LaunchRecord) -> None:
        """Take ``record``, just retired, back out where a collect on another thread released it
        meanwhile (its graph destroyed: :meth:`release`), which may have run between the caller's
        look at the record and its retiring; kept, a capture's own record would stay while its
        weight lives, never revived. (:meth:`release` marks ``released`` before its last pop from
        ``retired``: whichever order the two threads take, the record does not stay.)"""
        if record.released:
            self.retired.pop(id(record), None)

    def _weight_written(self, key: tuple, record: LaunchRecord, versions: tuple[int, ...]) -> LaunchRecord | None:
        """The weight of ``record`` (stored at ``key``) was written in place since it was built: a
        record that reads the weight in place only notes it (and waits for the write with PDL); one
        that reads copies of it (padded, re-encoded) has them refreshed (``refresh_copies``), or
        where that cannot be done is replaced by a new one built from the weight as it is now (None
        returned). Not while a CUDA graph is captured (the copy would become part of the graph, and
        planning reads the host): SP0920 then, since the graph would replay the old copies (with a
        bias read in place, a mix of both weights). Only a write to a tensor the record reads through
        a copy counts (``copies_stale``): a bias read in place needs nothing, in a capture too.
        Outside a capture the other captured records of the weight are synced too (a per-stream
        record of the capture stream, a graph's other token count), so that a warm-up on a side
        stream before a capture, or any call, brings every graph's copies up to the write. A replaced
        record a CUDA graph captured is kept, with its buffers, while its weight lives: that graph
        replays the old copies."""
        stale = record.copies_stale(versions)
        if stale and capturing():
            n, t = record.shape[1], record.shape[0]
            raise IntegrationError(
                SP_STALE_CAPTURE,
                f"sparsile.torch: a CUDA graph captures a sparse linear call ({n} output features, {t} tokens) whose "
                "weight was written in place since its last call outside a capture; its launch record reads padded "
                "copies of that weight, which cannot be refreshed inside a capture, so the graph would replay the "
                "old weight",
                help="after writing a weight in place, run the layer once outside the capture (torch's warm-up "
                     "before torch.cuda.graph) or call layer.check_metadata(); load_state_dict and "
                     "SemiSparseLinear.refresh do this themselves")
        self.sync(record.weight.values, captured_only=True, but=record)  # (nothing in a capture)
        if not stale or record.refresh_copies():
            record.weight_written(versions)
            return record
        return self._replaced(key, record)

    def _replaced(self, key: tuple, record: LaunchRecord) -> None:
        """Drop ``record`` (stored at ``key``) for a new one; one a CUDA graph captured is kept
        (retired) while its weight lives (dropped with it by _dropped): that graph may replay it."""
        if self.records.get(key) is record:
            self.records.pop(key, None)
        self.unfilled.pop(id(record), None)
        if record.captured:
            self.retired[id(record)] = record
            self._unless_released(record)

    def _fill(self) -> None:
        """The records planned inside a capture (``unfilled``), at this cache's first call outside a
        capture since, whichever record that call uses: their copies of the weight are made by that
        graph's kernels, which run at its first replay, so that an eager call, or a later capture
        reusing the record (a capture on the stream of a per-stream record after a warm-up on a
        side stream), would read unfilled memory. Each is filled now (``refresh_copies``: the bytes
        the graph's replay writes, from the weight as it is), or replaced where that cannot be done
        or where it has arrival counters to zero (retired: the graph keeps it; never revived).
        Another capture before such a call does not reuse it (:meth:`run`: it plans its own)."""
        for record in tuple(self.unfilled.values()):
            self.unfilled.pop(id(record), None)
            if not record.has_counters and record.refresh_copies():
                record.unfilled = False
                record.weight_written(weight_versions(record.tracked))  # the copies are the weight as it is now
            else:
                self._replaced(record.key, record)

    def sync(self, values: torch.Tensor, captured_only: bool = False, but: LaunchRecord | None = None) -> int:
        """Bring the records of the weight in ``values``' memory block (retired ones too) up to its
        in-place writes now, not at their next call: copies refreshed (``refresh_copies``), writes
        noted, so that CUDA graphs replaying them compute with the weight as it is
        (``load_state_dict``, ``SemiSparseLinear.refresh``). Returns how many records a graph
        captured still read copies of the weight from before (none refreshable; each is replaced at
        its next eager call, but that graph keeps the old copies). Nothing while a graph is captured.
        ``captured_only``: only records a graph captured (those a replay or a capture reads before
        their next eager call); ``but``: not that one."""
        if capturing() or not (self.records or self.retired):
            return 0
        # (a model's load_state_dict syncs each layer against every record of the custom op's
        # cache: a comparison per record; values' storage read only where a record is on its device)
        stale, device, where = 0, values.device, None
        for record in (*tuple(self.records.values()), *tuple(self.retired.values())):  # (snapshots: weakref callbacks)
            if record.tracked is None or record.storage[0] != device or record is but \
                    or (captured_only and not record.captured):
                continue
            where = where or storage_key(values)
            if record.storage != where:
                continue
            versions = weight_versions(record.tracked)
            if versions == record.versions:
                continue
            if not record.copies_stale(versions) or record.refresh_copies():
                record.weight_written(versions)
            elif record.captured:
                stale += 1
        last = self.last
        if last is not None and last[1] not in last[0].streams:  # (a PDL record forgot a stream somebody else owns:
            self.last = None  # a layer's last call there takes the full path, whose first launch there waits for it)
        return stale

    def _revived(self, key: tuple, own: tuple, w: Weight) -> tuple[LaunchRecord | None, tuple]:
        """A retired record of ``key`` (or ``own``: where this call's record with scratch is kept, of
        its stream or capture) and this weight back in use (its graph may still replay it; the
        version check then decides whether it may serve), so that a retired record is not joined
        by a new one each time a cache is cleared: (the record or None, where it is stored).
        Only one bound to the same weight: the same values tensor, the same memory of meta, bias and
        scale_w, the same activation (a layer's key names none of them: a replaced bias or a new
        activation clears the cache, and must not bring back the record of the old one)."""
        for k, r in self.retired.copy().items():
            if r.key in (key, own) and r.owner() is w.values and not r.unfilled \
                    and same_binding(r.weight, w):
                self.retired.pop(k, None)
                self.records[r.key] = r
                return r, r.key
        return None, key

    def _dropped(self, key: tuple, owner: weakref.ref) -> None:
        """The weak reference ``owner`` of the record stored at ``key`` died: drop that record, and
        the retired and unfilled records of the same weight (a weakref callback: it may run in any thread, at any
        allocation, so atomic steps: a pop, a dict copy)."""
        record = self.records.get(key)
        if record is not None and record.owner is owner:
            self.records.pop(key, None)
        last = self.last
        if last is not None and last[0].owner is owner:  # (it would pin the weight's memory)
            self.last = None
        for kept in (self.retired, self.unfilled):
            for k, r in kept.copy().items():
                if r.owner is owner:
                    kept.pop(k, None)
                    self.tied.discard(k)
        if record is not None and record.owner is owner:
            self.tied.discard(id(record))

    def _collect_released(self) -> None:
        """Drop the records of destroyed graphs (:meth:`graphs_released`) where any graph was destroyed,
        after noting the release counter's value (``releases_seen``): a layer's fast path compares it
        (one memory read), so that a graph destroyed from now on sends its next call here. Inside a
        capture too: with torch's ``cudaMallocAsync`` allocator a dropped record whose tensors may not be
        freed now (a capture under way would take the frees) is held by its finalizer, as any capture's
        record let go of then (capture_frees.py), and the fast paths take the full path until it is freed."""
        counter = graph_life.release_counter()
        seen = (None, 0) if counter is None else (counter, counter.value)  # (read before looking: a graph
        released = counter is not None and graph_life.released()           # destroyed after it is seen later)
        self.releases_seen = seen
        if released:
            self.graphs_released()

    def graphs_released(self) -> None:
        """Drop the records tied to a CUDA graph that is destroyed now (graph_life.py), in this
        cache and any other: each graph's records, kept for it alone, that no call will use again
        (a later capture plans its own; an eager call uses the eager record). A record planned in a
        capture without scratch that an eager call filled since (``_fill``) is every call's now: it
        stays. Their tensors go back to torch's allocator: the driver released the graph after its
        launches were complete, so nothing reads them. Inside a capture too (with torch's native
        allocator what dropping a record frees is legal there, as when a weakref callback drops one
        mid-capture: torch's allocator caches the tensors' blocks, sparsile's driver resources are
        released at a later safe point, backend/runtime/release.py; with ``cudaMallocAsync`` each of
        these records, planned in a capture, is a ``CaptureRecord``, whose finalizer holds it while
        its frees would be captured: capture_frees.py): none of these records is the capture's (a
        record planned in a capture is tied to that capture's graph, which is not destroyed before
        the capture ends)."""
        for cache, record in graph_life.released_records():
            cache.release(record)

    def release(self, record: LaunchRecord) -> None:
        """``record``'s graph is destroyed: drop it (see :meth:`graphs_released`), unless an eager
        call filled it since (it serves every call now, and other graphs may have captured it).

        Another thread's calls may run meanwhile (a collect runs on any thread that calls the
        cache): an eager call there can fill the record after the look below, and a capture then
        capture it; so it is looked at again once it is out of the cache's dicts, where no later
        call finds it, and kept (retired, revived by the next call of its key) where it was filled.
        Marked ``released`` before its last pop from ``retired``: a clear or a replacement retiring
        it meanwhile takes it back out (:meth:`_unless_released`)."""
        self.tied.discard(id(record))
        key = record.key
        if not _graphs_own(record):
            return
        if self.records.get(key) is record:
            self.records.pop(key, None)
        self.unfilled.pop(id(record), None)
        last = self.last
        if last is not None and last[0] is record:
            self.last = None
        if not _graphs_own(record):  # filled since the look above: a graph captured since may replay it
            self.retired[id(record)] = record
            return
        record.released = True
        self.retired.pop(id(record), None)

    def _tie(self, record: LaunchRecord, stream: int) -> None:
        """``record`` was just planned inside the capture on ``stream``: tie it to that graph where it
        is that graph's alone (stored under the capture's id, or filled by that graph's replay)."""
        if not _graphs_own(record):
            return
        if graph_life.tie(self, record, stream):
            self.tied.add(id(record))
        elif is_capture_key(record.key):
            self.untied += 1
            graph_life.untied(self.untied)

    def _trim(self, values: torch.Tensor) -> None:
        """Drop the oldest of ``values``' records beyond ``capacity``, except those a CUDA graph
        captured: a replay writes their workspace and counters, which must stay allocated as long
        as the graph may run. (Records of a collected weight are dropped by :meth:`_dropped`.)"""
        records = self.records
        mine = [key for key in tuple(records)  # a snapshot: a weakref callback may pop entries meanwhile
                if (record := records.get(key)) is not None and record.owner() is values and not record.captured]
        for key in mine[:max(0, len(mine) - self.capacity)]:
            records.pop(key, None)

    def _forget_foreign(self) -> None:
        """Forget the foreign handles (:attr:`foreign`) that no stored record is kept under (dropped by
        :meth:`_trim`, with their weight, or replaced), once the set reached :attr:`foreign_limit`; the next
        limit is twice what stays, and at least :data:`FOREIGN_SLACK` (a sweep per that many new handles).
        A server that makes a stream per request gave the set a handle per request, for good. Forgetting
        loses nothing: a handle's records with scratch are stored under :func:`~.capture_keys.foreign_key`
        only, so a call on a forgotten handle finds none by the handle alone (``(*key, stream)`` holds only
        the records of lasting streams, whose handles are never reused) and plans a record keyed by the
        stream's driver id again, as on its first call."""
        stored = [*tuple(self.records), *(r.key for r in tuple(self.retired.values()))]  # (snapshots: weakref
        live = {key[-2] for key in stored if foreign_id(key)[0]}                          # callbacks)
        self.foreign = self.foreign & live
        self.foreign_limit = max(FOREIGN_SLACK, 2 * len(self.foreign))

    def __len__(self) -> int:
        return len(self.records)

    def stream_of(self, device: int) -> Callable[[], int]:
        """A function giving torch's current stream on CUDA device ``device`` (an int handle)."""
        getter = self._streams.get(device)
        if getter is None:
            getter = self._streams[device] = stream_getter(device)
        return getter

    def run(self, key: tuple, x: torch.Tensor, w: Weight, scale_x: torch.Tensor | None, out_dtype: torch.dtype,
            stream: int | None = None, off_pool: bool = False, quantize: bool = False,
            static: torch.Tensor | None = None) -> torch.Tensor:
        """y for 2-D CUDA x on ``stream`` (default: torch's current stream on x's device), through
        the record of ``key`` (built on a miss; ``off_pool``: outside any CUDA-graph memory pool,
        for the custom op that torch.compile's CUDA graph trees call; ``quantize``: x is the 16-bit
        input of e4m3 weights, quantized per token by the record, see :class:`LaunchRecord`; with
        ``static``, a layer's static input scale, quantized with it instead: the key names its memory).
        ``key`` must name the weight's memory (its data pointers) and whether it quantizes: a record
        pins that memory, so no other weight can take its addresses while the record lives."""
        if stream is None:
            stream = self.stream_of(x.get_device())()
        if x.is_neg():  # a lazy negation (torch._neg_view, z.conj().imag): the launches read its memory, which
            x = x.resolve_neg()  # holds the values before it; a copy with the negation applied
        if x.data_ptr() % 16:  # a view at an odd offset: the kernel reads x through TMA, from 16-byte aligned rows
            x = x.clone()
        if scale_x is not None and scale_x.data_ptr() % 16:  # (the kernel's vector loads: a per-token slice, as
            scale_x = scale_x.clone()                        # torch.func.vmap's per-sample calls of the op pass)
        in_capture = capturing()
        if in_capture:  # its stream noted (torch's own): a later capture on it is seen by other threads' collects
            graph_life.saw_capture(x.get_device())
        # graphs destroyed: their own records dropped (in a capture too: captures with no eager call between them
        # kept one record per capture; with cudaMallocAsync their finalizer holds what a capture would take the
        # frees of: capture_frees.py)
        if self.tied:
            self._collect_released()
        if self.unfilled and not in_capture:  # records planned in a capture: filled before any eager call
            self._fill()
        if HELD and not in_capture:  # records of captures freed meanwhile, held while a capture was under way
            drop_held()
        records = self.records
        found = key
        record = records.get(key)
        # a record with scratch (workspace, quantized x) per stream, and inside a capture per capture (capture_keys.py)
        own = (*key, stream) if not in_capture else scratch_key(key, stream, off_pool)
        if record is None:
            if not in_capture and stream in self.foreign:  # a stream somebody else owns: by its driver id too
                own = foreign_key(key, stream, stream_id(stream))
            found = own
            record = records.get(found)
        if record is None and self.retired:
            record, found = self._revived(key, own, w)
        if record is not None and record.unfilled and in_capture and not record.planned_in(capture_id(stream)):
            # planned in another capture (or one whose id could not be read), whose replay fills its
            # copies (or zeroes its counters): this graph could be replayed first, so it plans a record
            # of its own, from the weight as it is now; that graph keeps the old one
            record = self._replaced(found, record)
        if record is not None and record.tracked is not None:
            versions = tuple([t._version for t in record.tracked])  # the record's aliases share the counters
            if versions != record.versions:  # written in place since the record was built
                record = self._weight_written(found, record, versions)
        if record is None:
            # planned in a capture, its tensors allocated there: freed only where no capture would take the
            # frees (capture_frees.py), whatever lets go of it (a collected weight, cache or layer, a release)
            record = (CaptureRecord if in_capture else LaunchRecord)(
                x, w, scale_x, out_dtype, off_pool, stream, quantize, self.pdl and pdl_wanted(x.device), static)
            if record.owns_workspace and not in_capture and stream in record.foreign and own == (*key, stream):
                # (its first record on this handle: a stream created later under the same handle, once
                # its owner destroyed this one, is another stream, with a record of its own)
                self.foreign.add(stream)
                own = foreign_key(key, stream, stream_id(stream))
            record.key = stored = own if record.owns_workspace else key
            record.owner = weakref.ref(w.values, functools.partial(_dropped_from, weakref.ref(self), stored))
            records[stored] = record
            _watch_steps(record)
            if record.unfilled:
                self.unfilled[id(record)] = record
            if in_capture:
                self._tie(record, stream)
            self._trim(w.values)
            if len(self.foreign) > self.foreign_limit:
                self._forget_foreign()
        self.last = (record, stream)
        return record(x, scale_x, stream, in_capture)
