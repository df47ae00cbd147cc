"""Where a launch record that owns scratch memory is kept for a call (docs/torch.md, "Scratch per
stream and per CUDA-graph capture").

A record that owns memory its launches write besides y (a split-K workspace and its arrival
counters; an e4m3 record's quantized copy of x and its per-token scales) serves one stream: eager
calls on one stream run in order, so they may share it. A CUDA graph bakes those addresses in, and
two graphs may be replayed at once on two streams (or one graph on a side stream while eager calls
run): so each capture plans a record of its own, whose scratch is allocated inside the capture (in
that graph's memory pool), instead of reusing the eager record of its stream or another graph's;
it is kept as long as that graph (graph_life.py).
An eager record with scratch for a stream somebody else owns is kept under that stream's driver id
as well (:func:`foreign_key`): a stream created later under the handle of a destroyed one is another
stream, and gets a record of its own (noted_streams.py).
Not while torch.compile's CUDA graph trees record a graph: they refuse allocations left in their
pool that are not outputs, share that pool between the graphs of a tree (which replay one at a
time), and warm up on the stream they capture on, so the warm-up's record is reused there as
before.
"""

from __future__ import annotations

import itertools
import sys

from ._kernels import capture_id

TREES = "torch._inductor.cudagraph_trees"
FOREIGN = "stream"
"""The tag of :func:`foreign_key`'s last member."""
_UNKNOWN = itertools.count()  # captures whose id could not be read: a record of their own per call


def trees_recording() -> bool:
    """Whether the capture under way is torch.compile's CUDA graph trees recording a graph: a frame
    of their module (``torch._inductor.cudagraph_trees``) on this thread's stack (they capture inside
    ``CUDAGraphNode``'s constructor, ``_record``). Their manager's ``in_recording`` cannot tell: its
    state turns to "recording" only after that constructor returned, so it read False during the
    very capture (the H100 run of the fiftieth session: every ``reduce-overhead`` graph failed on a
    record planned in their pool). False where torch.compile never loaded them. Called only while a
    capture is under way."""
    trees = sys.modules.get(TREES)
    path = getattr(trees, "__file__", None)
    if not path:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == TREES or frame.f_code.co_filename == path:
            return True
        frame = frame.f_back
    return False


def scratch_key(key: tuple, stream: int, off_pool: bool) -> tuple:
    """Where a record that owns scratch is kept for a call of ``key`` on ``stream`` inside a
    CUDA-graph capture: ``(*key, stream, ("capture", id))`` for the capture's id
    (``cuStreamGetCaptureInfo``), or under a fresh tag where it cannot be read (a record per call);
    ``(*key, stream)``, the eager record of the stream, while CUDA graph trees record the graph
    (``off_pool``: the custom op's call). Outside a capture: ``(*key, stream)``."""
    if off_pool and trees_recording():
        return (*key, stream)
    cid = capture_id(stream)
    return (*key, stream, ("capture", cid) if cid is not None else ("capture", None, next(_UNKNOWN)))


def is_capture_key(key: tuple) -> bool:
    """Whether a record stored at ``key`` is one capture's own (:func:`scratch_key` inside a capture)."""
    return bool(key) and isinstance(key[-1], tuple) and key[-1][:1] == ("capture",)


def foreign_key(key: tuple, stream: int, sid: int | None) -> tuple:
    """Where an eager record that owns scratch is kept for calls of ``key`` on ``stream``, a stream
    somebody else owns whose driver id is ``sid`` (noted_streams.stream_id; None where the driver
    does not say: the handle alone decides then, as for other streams): ``(*key, stream, ("stream", sid))``."""
    return (*key, stream, (FOREIGN, sid))


def foreign_id(stored: tuple) -> tuple[bool, int | None]:
    """(whether ``stored`` is a :func:`foreign_key`, the stream id it names)."""
    last = stored[-1] if stored else None
    if isinstance(last, tuple) and len(last) == 2 and last[0] == FOREIGN:
        return True, last[1]
    return False, None


def per_stream(stored: tuple, key: tuple, stream: int) -> bool:
    """Whether a record stored at ``stored`` is the eager record with scratch of ``key`` on ``stream``:
    ``(*key, stream)``, or a :func:`foreign_key` of them."""
    n = len(key) + 1
    return stored[:n] == (*key, stream) and (len(stored) == n or (len(stored) == n + 1 and foreign_id(stored)[0]))
