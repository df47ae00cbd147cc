"""The memory of the launch records of ``_kernels.py`` (docs/torch.md): planned outside
torch.compile's CUDA-graph memory pools, and kept from reuse while any stream that used it may
still run kernels reading it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from .noted_streams import LEGACY_STREAM, waited_as

_SIDE_STREAMS: dict[int, Any] = {}


def outside_graph_pools(device: torch.device, build: Callable[[], Any], stream: int | None = None,
                        capturing: bool = False) -> None:
    """Run ``build`` (planning: allocations, the counters' zero fill) where torch.compile's CUDA
    graph trees do not route allocations into their graph's memory pool: they route every
    allocation of the *thread* that warms a graph up, and refuse tensors left in the pool that are
    not outputs. So it runs in a short-lived thread, on a side stream ordered after torch's current
    one, or ``stream`` (an int handle) where the record will launch (and that stream after it); its
    exception, if any, is raised here. What it allocates there is used on ``stream``: each CUDA
    tensor ``build`` returns is marked as used by that stream (``record_stream``), so that when the
    record is dropped its memory is not handed out again before the work queued there has run.
    While a graph is being captured (``capturing``) ``build`` runs as it is (nothing may allocate on
    another stream then, and a manually captured graph owns what it allocates)."""
    if device.type != "cuda" or capturing:
        build()
        return
    current = torch.cuda.current_stream(device)
    if stream is not None and stream != current.cuda_stream:
        current = torch.cuda.ExternalStream(stream, device=device)
    side = _SIDE_STREAMS.get(current.device_index)
    if side is None:
        side = _SIDE_STREAMS[current.device_index] = torch.cuda.Stream(current.device)
    side.wait_stream(current)
    failure: list[BaseException] = []

    kept: list[Any] = []

    def work() -> None:
        try:
            with torch.cuda.device(current.device), torch.cuda.stream(side):
                kept.extend(build() or ())
        except BaseException as e:  # re-raised in the calling thread
            failure.append(e)

    worker = threading.Thread(target=work, name="sparsile-plan")
    worker.start()
    worker.join()
    current.wait_stream(side)
    if failure:
        raise failure[0]
    marked = [t for t in kept if isinstance(t, torch.Tensor) and t.is_cuda]
    if marked:  # (the per-thread default stream's marks go to the legacy stream: usage_stream)
        per_thread = waited_as(current.cuda_stream) == LEGACY_STREAM
        used = torch.cuda.default_stream(current.device) if per_thread else current
        for t in marked:
            t.record_stream(used)


def usage_stream(stream: int, device: torch.device) -> torch.cuda.Stream:
    """The torch stream to mark a record's buffers used by launches on ``stream`` (an int handle) with
    (``record_stream``): torch's allocator records an event on it when they are freed, on whichever
    thread frees them. The legacy default stream (torch's default) for the legacy handles and for the
    per-thread default stream (2): on the freeing thread that handle would name that thread's stream,
    and the legacy stream waits for every per-thread one (a blocking stream; noted_streams.py)."""
    if waited_as(stream) == LEGACY_STREAM:
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(stream, device=device)


def used_on(tensors: list[Any], stream: int) -> None:
    """A record's buffers (padded weight copies, workspace) are read by launches on ``stream`` (an
    int handle) too: torch's caching allocator must not hand their memory out again, once the record
    is dropped, before the work queued there has run (``record_stream``; the stream a buffer was
    allocated on is covered already)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            t.record_stream(usage_stream(stream, t.device))


def planned_buffers(prepared: list[Any] | None, eager: list[Any] | None, launches: list[Any],
                    not_planned: tuple[torch.Tensor | None, ...]) -> list[Any]:
    """The tensors a record's launches read that its plan made (workspace, counters, padded copies
    of the weight or of x, converted bias): the fixed arguments of its prepared launches
    (``prepared``, ``eager``: [(a prepared launch's ``run``, ...)]), or, without prepared launches
    (the plan rebound per call), the tensor arguments of the plan's ``launches``. Tensors on the
    memory of ``not_planned`` (the layer's weight, the first call's x, y and scale_x) are left out:
    they are not the record's to keep."""
    skip = {t.data_ptr() for t in not_planned if isinstance(t, torch.Tensor)}
    if prepared is not None:
        args = [a for launches_of in (prepared, eager) for run, _ in launches_of or ()
                for a in getattr(run.__self__, "_fixed", ())]
    else:
        args = [a for _, _, launch_args, _ in launches for a in launch_args]
    kept: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.data_ptr() not in skip and not any(a is k for k in kept):
            kept.append(a)
    return kept
