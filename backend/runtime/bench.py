"""Timing kernels on the GPU for the autotuner (docs/autotune.md).

:func:`do_bench` runs a launch function ``warmup`` times, then ``rep`` times each bracketed by a
pair of CUDA events recorded on the launch stream, and returns the median in milliseconds. Events
on the stream measure the GPU time of the launches queued there (host overhead between launches
is not counted, as long as the host stays ahead of the GPU). The autotuner takes any function of
the same signature (``benchmarker=``), which is how the CPU tests make its choice deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Benchmarker = Callable[..., float]
"""``benchmarker(fn, *, warmup, rep, stream) -> milliseconds`` (the median time of one ``fn()``)."""


def do_bench(fn: Callable[[], None], *, warmup: int = 10, rep: int = 50, stream: Any = None,
             device: int | None = None) -> float:
    """The median GPU time of ``fn()`` in milliseconds, from CUDA events on ``stream`` (a stream
    handle or stream object as ``kernel[grid](..., stream=)`` takes; None: the legacy default
    stream of ``device``, default the current device: the one ``fn`` launches on). ``fn`` must queue
    its work on that stream."""
    from cuda.bindings import driver

    from .. import runtime
    from .launch_config import stream_handle

    # the device's context current while it runs (fn's launches then switch nothing), the thread's
    # own after it
    with runtime.devices.context_of(runtime.devices.device_state(device)):
        handle = stream_handle(stream)
        for _ in range(max(0, warmup)):
            fn()
        count = max(1, rep)
        starts = [runtime.check("cuEventCreate", driver.cuEventCreate(0)) for _ in range(count)]
        ends = [runtime.check("cuEventCreate", driver.cuEventCreate(0)) for _ in range(count)]
        try:
            for start, end in zip(starts, ends, strict=True):
                runtime.check("cuEventRecord", driver.cuEventRecord(start, handle))
                fn()
                runtime.check("cuEventRecord", driver.cuEventRecord(end, handle))
            runtime.check("cuEventSynchronize", driver.cuEventSynchronize(ends[-1]))
            times = sorted(runtime.check("cuEventElapsedTime", driver.cuEventElapsedTime(s, e))
                           for s, e in zip(starts, ends, strict=True))
        finally:
            for event in starts + ends:
                driver.cuEventDestroy(event)
    middle = len(times) // 2
    return float(times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2)


def on_device(benchmarker: Benchmarker, ordinal: int) -> Benchmarker:
    """``benchmarker`` run with GPU ``ordinal`` as the current device: sparsile's
    (:func:`~.devices.using_device`) and torch's when torch is loaded with CUDA
    (``torch.cuda.device``), both restored after each call. A benchmarker's contract
    (docs/autotune.md) names no device: it times ``fn`` with the current device's events (``do_bench``
    without ``device=``, ``torch.cuda.Event``), so a tuner of another GPU's launches makes that GPU
    current while it runs."""
    from . import devices

    def timed(fn: Callable[[], None], **kwargs: Any) -> float:
        with devices.using_device(ordinal), _torch_device(ordinal):
            return benchmarker(fn, **kwargs)
    timed.__wrapped__ = benchmarker  # type: ignore[attr-defined]
    return timed


def _torch_device(ordinal: int) -> Any:
    """torch's ``torch.cuda.device(ordinal)`` where torch is loaded and has CUDA, else nothing to do."""
    import contextlib
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.device(ordinal)


def device_name(ordinal: int | None = None) -> str:
    """The name of GPU ``ordinal`` (default the current one; ``NVIDIA H200``), or ``"cpu"`` where
    there is none."""
    from .. import runtime

    return runtime.current_device(ordinal).name if runtime.has_gpu() else "cpu"
