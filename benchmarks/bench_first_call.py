"""What a sparsified Llama-3-8B's first calls spend compiling: every kernel specialization that the
torch layer's planner (``sparsile.torch``'s launch records: :func:`first_call_launches` of
integrations/torch/first_call.py) and ``sparse_matmul``'s planner pick for the model's layer shapes
(stdlib/kernels/tuned/llama3-shapes.txt: QKV fused and unfused, O, gate_up fused (with and without
the fused SwiGLU) and unfused, down) in bf16 and e4m3 at T = 1, 16 and 512 tokens (``--calls``: of
the layer's eager calls, its calls traced by torch.compile, or both, as warm_up's ``calls``), planned as on
an H200 (a faked device: the planners read its name and SM count, so the shipped H200 tables
apply, as the tests of the tables do), then compiled cold for sm_90a (an empty SPARSILE_CACHE_DIR)
in this process, or ``--jobs`` at a time (worker processes, as ``sparsile.torch.warm_up``; ``--threads``:
threads of this process). No GPU is needed and nothing is launched.

    python benchmarks/bench_first_call.py                        # serial
    python benchmarks/bench_first_call.py --jobs 2               # two worker processes
    python benchmarks/bench_first_call.py --jobs 2 --threads     # two threads

Prints one row per distinct specialization (kernel, constexprs, ms of its own compile) and the
totals: the wall time of compiling them all and the sum of the rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script from a checkout: import the package from its parent
    sys.path.insert(0, str(ROOT.parent))

LAYERS: dict[str, tuple[int, int, str | None]] = {
    # name: (out features, in features, activation of a fused MLP's gated layer)
    "q": (4096, 4096, None), "k/v": (1024, 4096, None), "qkv": (6144, 4096, None), "o": (4096, 4096, None),
    "gate/up": (14336, 4096, None), "gate_up": (28672, 4096, None), "gate_up+swiglu": (28672, 4096, "swiglu"),
    "down": (4096, 14336, None),
}
"""Llama-3-8B's projections (llama3-shapes.txt: qkv 6144 x 4096, o 4096 x 4096, gate+up 28672 x 4096,
down 4096 x 14336), and the unfused q, k, v, gate and up."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="threads compiling at once (default 1: serial)")
    parser.add_argument("--tokens", default="1,16,512", help="token counts T, comma-separated")
    parser.add_argument("--dtypes", default="bf16,e4m3", help="weight types, comma-separated")
    parser.add_argument("--layers", default=",".join(LAYERS), help="layers, comma-separated, of: " + ", ".join(LAYERS))
    parser.add_argument("--calls", default="eager", choices=("eager", "traced", "both"),
                        help="the layer's eager calls, its calls under torch.compile, or both (warm_up's calls=)")
    parser.add_argument("--no-matmul", action="store_true", help="only the torch layer's plans, not sparse_matmul's")
    parser.add_argument("--threads", action="store_true",
                        help="compile in --jobs threads of this process instead of worker processes")
    parser.add_argument("--list", action="store_true", help="list the specializations without compiling")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def fake_h200() -> None:
    """Make the planners see an H200 (its name and SM count select the shipped tuned tables)."""
    from sparsile.backend import runtime
    from sparsile.backend.runtime.devices import DeviceInfo

    h200 = DeviceInfo(0, "NVIDIA H200", (9, 0), 132, 49152, 232448, 1024, (1024, 1024, 64),
                      (2**31 - 1, 65535, 65535), 16, 50 * 2**20)
    runtime.has_gpu = lambda: True
    runtime.current_device = lambda ordinal=None: h200


def layer_launches(name: str, dtype: str, t: int, calls: str = "eager") -> list:
    import torch

    from sparsile.integrations.torch.first_call import WARM_UP_CALLS, first_call_launches
    from sparsile.integrations.torch.glu import GatedLinear
    from sparsile.integrations.torch.linear import SparseLinear

    n, k, gated = LAYERS[name]
    layer = SparseLinear(k, n, bias=False, dtype=dtype)
    if gated:
        layer = GatedLinear.over(layer, gated)
    return [launch for traced in WARM_UP_CALLS[calls]
            for launch in first_call_launches(layer, t, torch.bfloat16, traced=traced)]


def matmul_launches(name: str, dtype: str, t: int) -> list:
    """sparse_matmul's plan of the same weight (A: N_out x K) and b (T x K) in the weight's type."""
    import numpy as np
    import torch

    from sparsile.integrations.torch.linear import SparseLinear
    from sparsile.stdlib.kernels.gemm import plan_sparse_matmul

    n, k, gated = LAYERS[name]
    if gated:
        return []
    layer = SparseLinear(k, n, bias=False, dtype=dtype)
    b = torch.empty((t, k), dtype=layer.values.dtype)
    plan = plan_sparse_matmul(layer.values, layer.meta.numpy().view(np.uint32), b)
    if hasattr(plan, "launches"):
        return plan.launches()
    return [(plan.kernel, plan.grid, plan.arguments(), plan._constexprs())]


def describe(constexprs: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in constexprs.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sparsile-first-call-") as cache_dir:
        os.environ["SPARSILE_CACHE_DIR"] = cache_dir  # cold: nothing compiled yet
        return run(args, cache_dir)


def run(args: argparse.Namespace, cache_dir: str) -> int:
    from sparsile.driver.cache import reset_default_cache

    reset_default_cache()
    fake_h200()
    from sparsile.driver.compile_pool import _in_threads, compile_specializations
    from sparsile.integrations.torch.first_call import distinct_specializations

    tokens = [int(t) for t in args.tokens.split(",")]
    start = time.perf_counter()
    found = []
    for dtype in args.dtypes.split(","):
        for name in args.layers.split(","):
            for t in tokens:
                found += [(f"layer {dtype} {name} T={t}", launch)
                          for launch in layer_launches(name, dtype, t, args.calls)]
                if not args.no_matmul:
                    found += [(f"matmul {dtype} {name} T={t}", launch) for launch in matmul_launches(name, dtype, t)]
    planned = time.perf_counter() - start
    where = {id(launch): place for place, launch in reversed(found)}
    unique = distinct_specializations(launch for _, launch in found)
    mode = "threads" if args.threads else "worker processes" if args.jobs > 1 else "serial"
    print(f"{len(found)} launches planned ({planned:.1f} s), {len(unique)} distinct specializations; "
          f"jobs {args.jobs} ({mode}), {os.cpu_count()} CPUs, cache {cache_dir}")
    if args.list:
        for launch, _ in unique:
            print(f"{launch[0].name:<28} {describe(launch[3]):<90} {where[id(launch)]}")
        return 0
    specs = [spec for _, spec in unique]
    wall_start = time.perf_counter()
    times = _in_threads(specs, "sm_90a", args.jobs) if args.threads else \
        compile_specializations(specs, "sm_90a", args.jobs)
    wall = time.perf_counter() - wall_start
    print(f"{'kernel':<28} {'specialization':<90} {'ms':>8}  first needed by")
    for (launch, _), took in zip(unique, times, strict=True):
        print(f"{launch[0].name:<28} {describe(launch[3]):<90} {1e3 * took:>8.0f}  {where[id(launch)]}")
    print(f"total: {len(unique)} compiles, wall {wall:.1f} s with {args.jobs} job(s) ({mode}), sum of rows "
          f"{sum(times):.1f} s")
    return 0

if __name__ == "__main__":
    sys.exit(main())
