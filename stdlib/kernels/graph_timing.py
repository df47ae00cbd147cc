"""Timing a launch as one replay of a CUDA graph of several calls.

:func:`graph_bench` gives the milliseconds per ``run(stream=)``: ``run.calls`` (default
:data:`GRAPH_CALLS`) calls captured into one CUDA graph, replayed and timed with CUDA events
(backend/runtime/bench.py's ``do_bench``), as the graph-mode decode step runs its kernels, with no
host time between launches. The tuners (:mod:`.tuning`, :mod:`.linear_tuning`,
:mod:`.decode_tuning`) and the decode benchmarks time their candidates with it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...frontend.diagnostics import SparsileError

GRAPH_CALLS = 10


def graph_bench(run: Callable[..., Any], *, warmup: int, rep: int, stream: Any = None) -> float:
    """Milliseconds per ``run(stream=)``, timed (backend/runtime/bench.py's ``do_bench``) as one
    replay of a CUDA graph of ``run.calls`` (default :data:`GRAPH_CALLS`) calls divided by that: as
    the graph-mode decode step runs them, with no host time between the launches of a call (a
    split-K reduction launch is not charged the host's launch cost, as it would be when the host
    cannot keep ahead of ~10 µs kernels). ``stream`` is ignored (the graph runs on a side stream of
    torch's current device, timed with events of that device, whatever sparsile's current device: a
    tuner makes its device torch's current one, stdlib/kernels/tune_device.py; where capturing
    fails, the launches themselves are timed there)."""
    import torch

    from ...backend.runtime.bench import do_bench

    calls = int(getattr(run, "calls", GRAPH_CALLS))
    side = torch.cuda.Stream()
    device = side.device.index  # torch's current device: the events are recorded on its stream, in its context
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run(stream=side)  # compiled and loaded before the capture
        side.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:  # capture_begin/end: torch.cuda.graph would also synchronize and empty the cache, per candidate
            graph.capture_begin()
            try:
                for _ in range(calls):
                    run(stream=side)
            finally:
                graph.capture_end()
        except (RuntimeError, SparsileError):  # no capture here: time the launches themselves
            torch.cuda.synchronize()
            return do_bench(functools.partial(run, stream=side), warmup=warmup, rep=rep, stream=side, device=device)
        try:
            return do_bench(graph.replay, warmup=max(1, warmup // calls), rep=rep, stream=side, device=device) / calls
        finally:
            side.synchronize()
            del graph
