"""Where the host time of one eager ``SparseLinear`` call goes (issue 12's eager targets), on the GPU.

    python benchmarks/bench_layer_host.py                 # 8B o and 8B gate_up, T = 1, bf16
    python benchmarks/bench_layer_host.py --profile 8B_o  # and a cProfile of that layer's calls
    python benchmarks/bench_layer_host.py --dtype e4m3    # e4m3 weights: x quantized per token first

Each row is the host time per call (µs) of one step of the call path, measured alone: N calls back to
back timed up to the last return (the GPU work they queue is drained before and after each block, never
inside), median of several blocks. The steps: the whole module call (``SparseLinear.__call__``, and
``nn.Module.__call__``, which it skips for a plain eager call), ``forward`` without either, the layer's
last call (the fast path those take for a call like the previous one), the record cache's run (the full
path), each prepared launch alone (and the record's native launch alone, on unless
``SPARSILE_TORCH_NATIVE=0``: docs/torch.md), the output allocation, torch's current-stream query, and a
bare ``cuLaunchKernel`` of the same kernel (cuda.bindings) as the floor, beside dense ``F.linear`` of
the same shape, and the module call again with the last call's graph replays off (integrations/torch/
graph_launch.py). With ``--dtype e4m3`` the record's first launch quantizes x per token (into buffers the
record owns); the quantizer's prepared launch alone (``_kernels.quantize_per_token``, with its two
allocations, as calls made it before) is shown too.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import environment, profile_calls, torch_layer_missing  # a sibling script, not a package

SHAPES = {"8B_o": (4096, 4096), "8B_gate_up": (28672, 4096), "8B_qkv": (6144, 4096), "70B_down": (8192, 28672),
          "70B_o": (8192, 8192), "70B_qkv": (10240, 8192)}


def host_us(fn: Callable[[], Any], sync: Callable[[], None], calls: int = 300, blocks: int = 7) -> float:
    """Median over blocks of the host time per call of ``calls`` back-to-back calls."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(blocks):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(times)


def rows_for(name: str, n: int, k: int, t: int, torch: Any, dtype: str = "bf16") -> list[tuple[str, float]]:
    import torch.nn.functional as F

    from sparsile.integrations.torch import SparseLinear
    from sparsile.integrations.torch._kernels import capturing, quantize_per_token, stream_getter
    from sparsile.integrations.torch.linear import tracing

    empty = torch.nn.Identity()

    sync = torch.cuda.synchronize
    dense = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = SparseLinear.from_dense(dense, None if dtype == "bf16" else dtype)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    layer(x)
    sync()
    records = layer.__dict__["_records"]
    (key, record), = records.records.items()
    w = layer.__dict__["_weight"]
    getter = stream_getter(x.get_device())
    stream = getter()
    y = torch.empty((t, n), dtype=torch.bfloat16, device="cuda")
    # what the record takes: x itself (an e4m3 record quantizes it in its first launch)
    xk, sx, quantize = x, None, dtype == "e4m3"
    eager = record.eager if record.eager is not None else record.prepared
    print(f"{name}: record launches per eager call {len(eager) if eager else 'none (plan.rebind path)'}, native "
          f"{'on' if getattr(record, 'native', None) is not None else 'off'}, kernels "
          f"{[run.__self__.kernel_name for run, _ in eager or ()]}")
    rows = [("dense F.linear", host_us(lambda: F.linear(x, dense.weight), sync)),
            ("SparseLinear __call__", host_us(lambda: layer(x), sync)),
            ("nn.Module.__call__ (the call before the direct one)",
             host_us(lambda: torch.nn.Module.__call__(layer, x), sync)),
            ("SparseLinear.forward", host_us(lambda: layer.forward(x), sync))]
    if dtype == "e4m3":
        rows.append(("quantize_per_token alone (prepared launch, 2 allocations)",
                     host_us(lambda: quantize_per_token(x), sync)))
    last = layer.__dict__.get("_last")  # the last call's fast path (integrations/torch/last_call.py)
    if last is not None:
        rows.append(("LastCall (the fast path of __call__ and forward)", host_us(lambda: last(xk), sync)))
        replays = last.replays  # repeated calls as one CUDA-graph launch (graph_launch.py)
        if replays is not None:
            print(f"{name}: calls replayed as a CUDA graph so far: {replays.replayed}")
            last.replays = None
            rows.append(("SparseLinear __call__, graph replays off", host_us(lambda: layer(x), sync)))
            last.replays = replays
    full_path = functools.partial(records.run, key, xk, w, sx, torch.bfloat16, quantize=quantize)
    rows += [("RecordCache.run (the full path)", host_us(full_path, sync)),
             ("LaunchRecord call", host_us(lambda: record(xk, sx, stream), sync))]
    for i, (prepared_run, which) in enumerate(record.prepared or ()):
        launch = prepared_run.__self__
        args = which((xk, y, sx))
        run = functools.partial(prepared_run, args, stream)
        bare = functools.partial(launch._launch_once, launch._dims, stream)
        rows.append((f"prepared launch {i} ({launch.kernel_name})", host_us(run, sync)))
        rows.append((f"  bare cuLaunchKernel {i}", host_us(bare, sync)))
    native = getattr(record, "native", None)  # the record's native launch (None with SPARSILE_TORCH_NATIVE=0)
    if native is not None:
        xp, yp, sp = xk.data_ptr(), y.data_ptr(), 0 if sx is None else sx.data_ptr()
        rows.append(("native launch", host_us(lambda: native.launch(xp, yp, sp, stream), sync)))
    rows += [("torch.empty (T, N)", host_us(lambda: torch.empty((t, n), dtype=torch.bfloat16, device="cuda"), sync)),
             ("torch.empty_like (the record's y)",
              host_us(lambda: torch.empty_like(record.y_like, memory_format=torch.contiguous_format), sync)),
             ("current stream query", host_us(getter, sync)),
             ("x.data_ptr()", host_us(x.data_ptr, sync)),
             ("tracing(x)", host_us(lambda: tracing(x), sync)),
             ("capturing()", host_us(capturing, sync)),
             ("weight versions", host_us(lambda: tuple([v._version for v in record.tracked or ()]), sync)),
             ("nn.Module.__call__ of an empty module", host_us(lambda: empty(x), sync))]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8B_o", "8B_gate_up"], choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--profile", nargs="*", default=[], choices=sorted(SHAPES))
    parser.add_argument("--dtype", choices=("bf16", "e4m3"), default="bf16", help="the layer's weight type")
    args = parser.parse_args()
    missing = torch_layer_missing()
    if missing:
        print(missing)
        return
    import torch

    print(", ".join(f"{k} {v}" for k, v in environment().items()))
    print(f"T = {args.tokens}, {args.dtype}; SPARSILE_DECODE_REDUCE={os.environ.get('SPARSILE_DECODE_REDUCE', '')!r}")
    table: dict[str, dict[str, float]] = {}
    for name in args.shapes:
        n, k = SHAPES[name]
        for step, us in rows_for(name, n, k, args.tokens, torch, args.dtype):
            table.setdefault(step, {})[name] = us
    print("| step | " + " | ".join(args.shapes) + " |")
    print("|---|" + "---|" * len(args.shapes))
    for step, cols in table.items():
        print(f"| {step} | " + " | ".join(f"{cols[s]:.1f}" if s in cols else "-" for s in args.shapes) + " |")
    for name in args.profile:
        from sparsile.integrations.torch import SparseLinear

        n, k = SHAPES[name]
        layer = SparseLinear.from_dense(torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16),
                                        None if args.dtype == "bf16" else args.dtype)
        x = torch.randn(args.tokens, k, device="cuda", dtype=torch.bfloat16)
        print(f"\ncProfile of 2000 calls of SparseLinear {name}, {args.dtype} (T = {args.tokens}):")
        print(profile_calls(functools.partial(layer, x), torch.cuda.synchronize))


if __name__ == "__main__":
    main()
