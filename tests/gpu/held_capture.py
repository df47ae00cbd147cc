"""Thread and stream helpers of the GPU tests that hold another thread's CUDA graph capture open
(test_capture_threads_gpu.py, test_pdl_weight_write_gpu.py)."""

from __future__ import annotations

import threading
from typing import Any

WAIT = 60


def hold_capture_open(xa: Any, began: threading.Event, done: threading.Event, result: dict) -> None:
    """The capturing thread: capture ``tanh(xa) * 3 + xa`` in global mode (torch.cuda.graph's default) on
    torch's shared capture stream, note that stream in ``result["stream"]``, set ``began`` and hold the
    capture open until ``done``; then replay it with its output poisoned and keep the output as
    ``result["ya"]``. Any failure is ``result["error"]`` (and ``began`` set)."""
    import torch

    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ya = torch.tanh(xa) * 3 + xa
            result["stream"] = torch.cuda.current_stream().cuda_stream
            began.set()
            assert done.wait(WAIT), "the other thread did not finish"
        ya.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        result["ya"] = ya.clone()
    except BaseException as exc:
        result["error"] = exc
        began.set()


def side_stream() -> Any:
    """A torch stream that is not torch.cuda.graph's capture stream: torch hands out its 32 pool streams
    round-robin (c10/cuda/CUDAStream.h), so a new ``torch.cuda.Stream()`` can be the very stream the
    other thread captures on (copying and synchronizing there would invalidate that capture: a test
    would fail by the pool's counter, about one run in 32 of a GPU session)."""
    import torch

    torch.cuda.graph(torch.cuda.CUDAGraph())  # (makes torch.cuda.graph's shared default capture stream)
    capture = torch.cuda.graph.default_capture_stream
    side = torch.cuda.Stream()
    while side.cuda_stream == capture.cuda_stream:
        side = torch.cuda.Stream()
    return side
