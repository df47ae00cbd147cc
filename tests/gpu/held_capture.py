"""Thread helpers of the GPU tests that hold another thread's CUDA graph capture open
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
