"""Timing and setup helpers shared by ``bench_linear.py`` and ``bench_llama.py`` (torch on a GPU):
host-inclusive time per call, profiler kernel time, CUDA-graph replay time, 2:4 magnitude pruning,
per-row e4m3 quantization, and the machine/commit line a results table starts with."""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FP8_MAX = 448.0


def positive(text: str) -> int:
    """An argparse type: a positive integer."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


@dataclass
class Timing:
    """Per-call times in µs, medians over the blocks: ``wall`` includes the synchronize at the end of
    each block, ``host`` stops when the last call has returned; ``wall_best`` is the fastest block's
    wall time (other processes on a shared host only ever add time to a block)."""

    wall: float
    host: float
    wall_best: float = 0.0
    cpu_share: float = 1.0
    """Median over blocks of the calling thread's CPU time (user + system) over the wall time up to the
    last return: below 1 when the thread was off a core (descheduled, or blocked in a system call)."""
    gc_runs: int = 0
    """Garbage collections (any generation) during the timed blocks."""


def time_calls(fn: Callable[[], Any], sync: Callable[[], None], blocks: int = 7,
               target_s: float = 0.01, max_calls: int = 200) -> Timing:
    """Median over ``blocks`` of (N back-to-back calls, then ``sync``) / N; N sized so a block lasts
    about ``target_s`` (at least 2, at most ``max_calls``: short enough not to fill the launch queue)."""
    return time_calls_interleaved([fn], sync, blocks, target_s, max_calls)[0]


def time_calls_interleaved(fns: list[Callable[[], Any]], sync: Callable[[], None], blocks: int = 7,
                           target_s: float = 0.01, max_calls: int = 200) -> list[Timing]:
    """:func:`time_calls` of each of ``fns``, their blocks taken in turn (a block of the first, one
    of the second, ..., then again), so that contenders compared with each other meet the same
    host: a shared machine's host runs Python at speeds 2x apart from one moment to the next
    (benchmarks/RESULTS.md, twenty-eighth session), which timing one after the other would charge
    to whichever ran in the slow stretch."""
    counts = []
    for fn in fns:
        fn()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        single = time.perf_counter() - start
        counts.append(max(2, min(max_calls, int(target_s / max(single, 1e-7)))))
    walls: list[list[float]] = [[] for _ in fns]
    hosts: list[list[float]] = [[] for _ in fns]
    shares: list[list[float]] = [[] for _ in fns]
    gc_runs = [0] * len(fns)
    for _ in range(blocks):
        for i, (fn, calls) in enumerate(zip(fns, counts, strict=True)):
            sync()
            collections = sum(g["collections"] for g in gc.get_stats())
            cpu = time.thread_time()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            launched = time.perf_counter()
            cpu = time.thread_time() - cpu
            sync()
            done = time.perf_counter()
            gc_runs[i] += sum(g["collections"] for g in gc.get_stats()) - collections
            walls[i].append((done - start) / calls * 1e6)
            hosts[i].append((launched - start) / calls * 1e6)
            shares[i].append(cpu / max(launched - start, 1e-9))
    return [Timing(statistics.median(w), statistics.median(h), min(w), statistics.median(c), g)
            for w, h, c, g in zip(walls, hosts, shares, gc_runs, strict=True)]


def profile_calls(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 2000, top: int = 25) -> str:
    """The ``top`` functions by own time over ``calls`` calls of ``fn`` (cProfile; ``sync`` every 200
    calls so the launch queue never fills)."""
    import cProfile
    import io
    import pstats

    sync()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        fn()
        if i % 200 == 199:
            sync()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def host_probe_us(repeats: int = 7) -> float:
    """µs of a fixed pure-Python workload (dict and tuple operations, no torch, no GPU), median of
    ``repeats``: the host's speed for Python at this moment, to tell a slower host (a busy shared
    machine, another core, a lower clock) from a slower call path when a call's host time moves."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        d: dict[int, tuple[int, int]] = {}
        for i in range(2000):
            d[i & 63] = (i, i + 1)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def event_time_us(fn: Callable[[], Any], iters: int, warmup: int = 3) -> float:
    """Mean µs per call of ``fn`` between two CUDA events around ``iters`` back-to-back calls, after
    ``warmup`` calls (the first compiles): GPU time including the gaps between launches."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def kernel_time(fn: Callable[[], Any], calls: int = 10) -> float:
    """Mean CUDA device time (µs) of all the kernels (and copies) one call of ``fn`` launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.events():
        if evt.device_type.name == "CUDA":
            total += getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
    if total <= 0:
        raise RuntimeError("the profiler recorded no CUDA kernel time (CUPTI unavailable?)")
    return total / calls


def graph_time(fn: Callable[[], Any], reps: int, blocks: int) -> float:
    """µs per call when ``reps`` calls captured in one CUDA graph are replayed back to back."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (lazy init, autotuning, plans)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    t = time_calls(graph.replay, torch.cuda.synchronize, blocks=blocks, max_calls=50).wall / reps
    del graph
    return t


def graph_reps(kernel_us: float | None) -> int:
    """Calls per captured graph: about 200 µs of kernels, 1 to 20 calls."""
    return max(1, min(20, int(200.0 / max(kernel_us or 1.0, 1.0))))


def prune_24(w: Any) -> Any:
    """``w`` (N, K) with the two smallest-magnitude values of every 4 along K set to zero (same dtype)."""
    import torch

    n, k = w.shape
    groups = w.reshape(n, k // 4, 4)
    keep = groups.float().abs().topk(2, dim=-1).indices
    mask = torch.zeros(groups.shape, dtype=torch.bool, device=w.device).scatter_(-1, keep, True)
    return (groups * mask).reshape(n, k)


def quantize_rows_e4m3(t: Any) -> tuple[Any, Any]:
    """(t / s).to(e4m3), s (rows, 1) float32 = max |row| / 448 (1 for a zero row): per-token or
    per-output-channel scales."""
    import torch

    scale = (t.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def torch_layer_missing(*also: str) -> str | None:
    """Why a benchmark of the torch layer cannot run here (torch and the modules ``also`` installed,
    a CUDA device visible to torch, ``sparsile.torch`` importable), or None."""
    import importlib

    try:
        torch = importlib.import_module("torch")
        for name in also:
            importlib.import_module(name)
    except ImportError as e:
        return f"{e.name} is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    try:
        importlib.import_module("sparsile.torch")
    except ImportError as e:
        return f"sparsile.torch cannot be imported ({e})"
    return None


def first_line(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters of it), for a table's notes."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def relative_error(y: Any, ref: Any) -> float:
    """max |y - ref| / max |ref| (both as float64)."""
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


def environment() -> dict[str, str]:
    """The GPU, torch, CUDA and triton versions, the date and the sparsile commit: ``$SPARSILE_COMMIT``
    where it is set (a copy of the tree run elsewhere, whose git metadata, if any, may be another
    commit's), else git's ('+dirty' with local changes)."""
    import torch

    info = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    info["commit"] = os.environ.get("SPARSILE_COMMIT") or git_commit()
    return info


def git_commit() -> str:
    """This tree's commit by git, '+dirty' with local changes; "unknown" without git metadata."""
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "") if sha else "unknown"


def raise_dynamo_limits() -> None:
    """Let torch.compile keep many compiled entries for one function: every SparseLinear (every model)
    shares one ``forward``, and each shape adds guarded entries; past the default limit of 8 dynamo
    would silently run the rest eagerly."""
    import torch

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)


def profiled_once(fn: Callable[[], Any], iters: int = 0) -> float:
    """One call of ``fn`` inside a CUDA profiler range (for ``ncu --profile-from-start off``), after
    two warm-up calls; returns 0 (``iters``: ignored, the signature of the timing functions)."""
    import torch

    fn()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0.0
