"""The steady-state eager call of a ``SparseLinear``: :class:`LastCall` (docs/torch.md, "The eager
call's fast path").

A decode loop calls each layer with x of one shape, dtype and device, on one stream, step after
step. The full eager path (``RecordCache.run``) builds a key, looks the record up, checks the
weight and the capture state, reshapes x and y, then launches: about half of an eager call's host
time on the H200 (benchmarks/RESULTS.md, sixteenth session). A layer keeps what its last call found
(the record and the call's x shape, dtype, device and stream) and a call that matches it launches the
record's native launch directly, after the checks that can change between calls: whether the
record is still the last one its cache ran (a cleared cache, another call through it), torch's
current stream (and, for a record with scratch on a stream somebody else owns, the driver's id of that
stream: a stream created under a destroyed one's handle is another, noted_streams.py), a CUDA-graph
capture, records of the cache waiting to be filled (planned in a capture), records of captures whose
free waits for a capture's end (capture_frees.py: any cache's), a CUDA graph destroyed whose own
records the cache keeps (graph_life.py: one read of the counter its destroy callback raises, only
where the cache holds such records), an in-place write to the weight
(its version counters), and x contiguous, 16-byte aligned and no lazy negation
(``torch._neg_view(x)``, ``z.conj().imag``: its memory holds the values before it). Anything else
returns None, and the caller takes the full path, which handles it and leaves a new
:class:`LastCall`. Both paths launch the same record with the same arguments: the same bits. Calls
at x and y addresses seen before are replayed as one CUDA-graph launch (graph_launch.py).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from ._kernels import LaunchRecord, capturing
from .capture_frees import HELD
from .capture_keys import foreign_id, per_stream
from .graph_launch import GraphReplays
from .noted_streams import stream_id

_version = operator.attrgetter("_version")  # a tensor's version counter


class LastCall:
    """A layer's last eager call through ``record`` (of ``cache``) for x like ``x`` on ``stream``
    (``stream_of()`` gives torch's current stream on x's device). Calling it with the next x gives
    y (x.shape[:-1] + (N,), the record's output type) or None: not the same kind of call (see the
    module docstring), nothing launched."""

    __slots__ = ("cache", "counter", "device", "dtype", "entry", "record", "replays", "seen", "shape", "stream",
                 "stream_id", "stream_of", "y_like")

    def __init__(self, cache: Any, entry: tuple[LaunchRecord, int], x: torch.Tensor, stream_of: Callable[[], int],
                 releases: tuple[Any, int] = (None, 0)):
        # valid while ``entry`` is the cache's last call: a cleared cache, a dropped weight and any
        # call through the cache (another token count, a capture) end it
        self.cache, self.entry, self.stream_of = cache, entry, stream_of
        self.record, self.stream = entry
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.get_device()
        # y as empty_like of the record's one-element template broadcast to y's shape (x's leading
        # dimensions): no view of a 2-D y per call (the kernel writes (T, N) rows, the same bytes)
        record = self.record
        self.y_like = record.y_like if x.dim() == 2 else record.y_like.view(*x.shape[:-1], record.shape[1])
        self.replays = GraphReplays.of(record.native)  # calls repeated at the same addresses: one graph launch
        # ``releases``, where the cache keeps records tied to CUDA graphs: the counter their destroy callbacks
        # raise and its value before the full path last collected (RecordCache.releases_seen, read once by
        # :meth:`of`); a call through the cache (a capture, which ties records) ends this last call, so a
        # cache without them needs no look
        self.counter, self.seen = releases
        # a record with scratch on a stream somebody else owns: that stream's driver id (capture_keys.foreign_key),
        # compared at each call (a new stream under the handle of a destroyed one has another); else None
        self.stream_id = foreign_id(record.key)[1]

    @classmethod
    def of(cls, cache: Any, x: torch.Tensor, stream_of: Callable[[], int], key: tuple | None = None
           ) -> LastCall | None:
        """The :class:`LastCall` of the call ``cache`` just ran for x (contiguous, in the record's
        input type, no per-call scale) with ``key``, or None where its record launches no native
        launch, or the cache's last call is another's (another thread's call through the cache
        while this one's launch had released the GIL: another key, as another x dtype or output type)."""
        last = cache.last
        if last is None or not x.is_contiguous():
            return None
        record = last[0]
        if key is not None and record.key != key and not per_stream(record.key, key, last[1]):
            return None
        if record.native is None or record.unfilled or record.shape[0] != x.numel() // max(1, x.shape[-1]):
            return None
        # (each read once: another thread's capture may tie the cache's first record meanwhile, whose
        # releases_seen is not read yet; that capture made itself the cache's last call, ending this one)
        releases = cache.releases_seen if cache.tied else (None, 0)
        if releases is None:  # (tied by another thread's capture since this call looked)
            return None
        return cls(cache, last, x, stream_of, releases)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if x.shape != self.shape or x.dtype is not self.dtype or x.get_device() != self.device:
            return None
        record = self.record
        native = record.native  # None after a failed native launch: the full path runs its prepared launches
        cache = self.cache
        stream = self.stream
        counter = self.counter  # (a graph destroyed since: the full path drops its records)
        # (a capture never records the legacy default stream, handle 0: CUDA refuses to begin one there)
        # (HELD: records of captures let go of while a capture was under way: the full path frees them)
        if native is None or cache.last is not self.entry or cache.unfilled or HELD or self.stream_of() != stream \
                or (stream and capturing()) or (counter is not None and counter.value != self.seen):
            return None
        sid = self.stream_id  # (asked of torch's current stream, not capturing: alive)
        if sid is not None and stream_id(stream) != sid:
            return None  # another stream under the handle: the full path plans it a record of its own
        tracked = record.tracked
        if tracked is not None and tuple(map(_version, tracked)) != record.versions:
            return None  # the weight was written: the full path refreshes or replaces the record
        xp = x.data_ptr()
        if xp % 16 or not x.is_contiguous() or x.is_neg():  # (a neg view: its memory holds x before the negation)
            return None
        # (y_like is a broadcast: not dense, so empty_like gives it contiguous strides)
        y = torch.empty_like(self.y_like)
        yp = y.data_ptr()
        replays = self.replays
        if replays is not None:
            pair = (xp, yp)
            if replays.launch(pair, stream):  # x and y where a captured call had them
                return y
        status, done = native.launch(xp, yp, 0, stream)
        if status:  # not all launched natively: the prepared launches run the rest, on 2-D views
            record.after_native(status, done, (x.view(record.shape[0], -1), y.view(record.shape), None), stream)
        elif replays is not None:
            replays.launched_natively(pair)
        return y
