"""The weights of a released ``fuse_projections_`` group's members made their own (projection_group.py,
``ProjectionGroup.release``).

A fused group's members hold row views of the fused buffers, which share one version counter: a write
to one member's weight counts for every member and the fused layer (the backward's check,
weight_versions.py, cannot tell which rows changed). While the group runs fused that is needed: the
fused layer computes with every member's rows. Once the group is released at run time each member
runs on its own, and a sibling's write refused its backward although its own rows had not changed.
So the members get copies of their rows, each with its own counter: one group's weights allocated
for the time of the copy (the fused copy is freed once nothing holds it: a fused run's pending
backward keeps it, with the weight its forward used, which no write reaches any more).

Not copied: a buffer that requires grad (a bias made trainable: an optimizer may hold that tensor),
an inference tensor (no counter), and nothing at all while a CUDA graph is captured or a tracer
runs (the copy would be recorded, not made), nor where a CUDA graph captured a launch of the fused
layer or of the gated forward's layer over its buffers (:func:`graph_replays`: every replay reads
the fused buffers, so an in-place write to a member, ``load_state_dict`` say, must still reach them,
as it did while the group was fused; given copies, the graph replayed the old weight without a
word); and where the device runs out of memory, nothing of the member being copied nor of those
after it (the members copied before keep their copies: a member is given all of its copies or
none). Those members keep their views, whose shared counter refuses too much, never too little.
Before it copies, it waits for the device (:func:`quiesce`): the fused copy's memory must not be handed
out again under a fused run still in flight on another stream.

Where a graph captured such a launch, the members that keep their views also keep those layers
(:func:`keep_replayed`, any release): nothing else held the fused layer once its group let go of it, so it
was collected with its record cache, whose captured records (workspace, counters, padded copies of the
weight) the graph replays; and a member's ``load_state_dict`` (``check_metadata``) brings those records up
to the write (``linear.sync_records``), as it did while the group was fused: else a record that reads a
padded copy of the weight replayed the old weight without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ._kernels import capturing

LOG = logging.getLogger("sparsile.torch")


def own_rows(fused: Any, members: Sequence[Any], names: Sequence[str], layers: Sequence[Any] = ()) -> int:
    """Give each of ``members`` a copy of its buffers ``names`` that are still views of ``fused``'s
    (see the module docstring for which are not copied; ``layers``: the layers over the fused buffers,
    ``ProjectionGroup.layers``); returns how many buffers were copied."""
    if capturing() or torch.compiler.is_compiling():
        return 0
    if graph_replays(layers):
        LOG.info("fused projections: a CUDA graph captured a fused launch of a released group; its members keep "
                 "views of the fused copy, which the graph replays")
        return 0
    copied = 0
    quiesce(fused._buffers.values())
    try:
        with torch.no_grad(), torch.inference_mode(False):
            for m in members:
                mine = {}
                for name in names:
                    whole, part = fused._buffers.get(name), m._buffers.get(name)
                    if whole is None or part is None or part.requires_grad or whole.is_inference():
                        continue
                    if part._base is (whole._base if whole._is_view() else whole):
                        mine[name] = part.clone()
                for name, t in mine.items():  # (SparseLinear.__setattr__ drops the records of the view)
                    setattr(m, name, t)
                copied += len(mine)
    except torch.OutOfMemoryError:
        LOG.info("fused projections: out of memory copying a released group's weights; its members keep "
                 "views of the fused copy")
    return copied


def quiesce(tensors: Any) -> None:
    """Wait for the CUDA devices that hold ``tensors`` (``torch.cuda.synchronize``). The fused buffers are
    freed once the members hold copies, and the caching allocator may hand their memory out again on the
    stream that allocated them at once: a fused run still in flight on another stream (one the records
    launched on, which never marked the weight as used there) would then read reused memory. While the
    members held views the memory lived on; a release at run time is rare (a group's members fed other
    inputs, a member's buffer replaced), so it waits for the device once instead of tracking every stream."""
    devices = {t.device for t in tensors if t is not None and t.is_cuda}
    for device in sorted(devices, key=str):
        torch.cuda.synchronize(device)


def graph_replays(layers: Sequence[Any]) -> bool:
    """Whether a CUDA graph captured a launch of one of ``layers`` (a record of its cache, kept or retired,
    marked ``captured``: the cache keeps such a record while its weight lives, since the graph may replay it)."""
    for layer in layers:
        cache = layer.__dict__.get("_records")
        if cache is None:
            continue
        for record in (*tuple(cache.records.values()), *tuple(cache.retired.values())):  # (snapshots: weakref
            if record.captured:                                                           # callbacks)
                return True
    return False


REPLAYED = "_replayed"
"""A released member's ``__dict__`` key: the layers over the fused buffers whose launches a CUDA graph captured
(:func:`keep_replayed`); its ``_invalidate`` syncs their records (``linear.sync_records``)."""


def keep_replayed(fused: Any, members: Sequence[Any], layers: Sequence[Any]) -> None:
    """Where a CUDA graph captured a launch of one of ``layers`` (the layers over ``fused``'s buffers,
    ``ProjectionGroup.layers``; :func:`graph_replays`), have each of ``members`` that still views
    ``fused``'s buffers keep them (:data:`REPLAYED`), so that the records the graph replays live as long
    as the member, and the member's syncs reach them. Their other records go (``RecordCache.clear``: the
    captured ones stay, retired): no call runs those layers any more."""
    if not graph_replays(layers):
        return
    shared = {t.untyped_storage().data_ptr() for t in fused._buffers.values() if t is not None}
    for layer in layers:
        layer.__dict__["_records"].clear()
    for m in members:
        if any(t is not None and t.untyped_storage().data_ptr() in shared for t in m._buffers.values()):
            kept = m.__dict__.get(REPLAYED, ())
            m.__dict__[REPLAYED] = (*kept, *(layer for layer in layers if all(layer is not k for k in kept)))
