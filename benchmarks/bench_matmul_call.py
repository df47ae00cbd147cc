"""Host-inclusive time of one ``sparse_matmul`` call with and without its call cache
(stdlib/kernels/call_cache.py), beside the kernel time and the peers as torch users call them.

    python benchmarks/bench_matmul_call.py [--shapes 6144x4096 28672x4096 10240x8192] [--tokens 16 512]

Per weight (M x K, bf16, 2:4 by magnitude, a MetadataBuffer from prune_and_compress as the README
does) and token count T (x: T x K bf16), µs per call:

  kernel      the CUDA profiler's time of every kernel one sparse_matmul call launches
  planned     sparse_matmul with SPARSILE_CALL_CACHE=0: checked and planned on every call
  prepared    a cached call whose launches replay through prepared launches (SPARSILE_CALL_CACHE_NATIVE=0)
  cached      sparse_matmul as shipped: a call like the previous one replays its launches from
              native code (values, words, x, C and a split-K workspace: stdlib/kernels/call_native.py;
              SPARSILE_CALL_CACHE_NATIVE=1 keeps split-K's two launches prepared)
  enqueue     host time of a cached call until it returned (no synchronize)
  F.linear    dense torch.nn.functional.linear(x, W) (cuBLAS), host-inclusive
  cuSPARSELt  torch._cslt_sparse_mm(compressed W, x.T) with its default algorithm, host-inclusive

Host-inclusive times come from ``torch_timing.time_calls``: blocks of back-to-back calls, each
followed by a synchronize, the median block's time per call (so at least the kernel's time once
the GPU is the slower side). Each cached result is checked against float64 on new random x, with
C poisoned first.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import kernel_time, time_calls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["6144x4096", "28672x4096", "10240x8192"],
                    help="M x K weights (default: Llama-3 8B qkv, 8B gate_up, 70B qkv)")
    ap.add_argument("--tokens", nargs="+", type=int, default=[16, 512])
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--profile", action="store_true",
                    help="first: cProfile 2000 cached calls of the first weight and T (top 30 functions by own time)")
    return ap.parse_args(argv)


def profile_cached(m: int, k: int, t: int) -> None:
    """Where a cached call's host time goes: cProfile over 2000 calls, the top 30 by own time."""
    import cProfile
    import pstats

    import torch

    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    w = torch.randn(m, k, device="cuda")
    values, meta = prune_and_compress(w, "bf16")
    x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    for _ in range(50):
        sparse_matmul(values, meta, x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        sparse_matmul(values, meta, x)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def row(m: int, k: int, t: int, blocks: int) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from sparsile.stdlib.kernels import CompressedWeight, call_cache, call_native, prune_and_compress, sparse_matmul

    g = torch.Generator().manual_seed(m + k + t)
    w = torch.randn(m, k, generator=g).cuda()
    values, meta = prune_and_compress(w, "bf16")
    x = torch.randn(t, k, generator=g).cuda().to(torch.bfloat16)
    sync = torch.cuda.synchronize

    def call():
        return sparse_matmul(values, meta, x)

    def timed(fn):
        for _ in range(20):
            fn()
        sync()
        return time_calls(fn, sync, blocks=blocks, target_s=0.02, max_calls=200)

    r = {"m": m, "k": k, "t": t, "kernel": kernel_time(call)}
    os.environ[call_cache.ENV] = "0"
    try:
        r["planned"] = timed(call).wall
    finally:
        del os.environ[call_cache.ENV]
    setting = os.environ.get(call_native.ENV)  # the native replays asked for ("1": one launch only)
    os.environ[call_native.ENV] = "0"  # read when a call is recorded
    call_cache.clear()
    try:
        r["prepared"] = timed(call).wall
    finally:
        if setting is None:
            del os.environ[call_native.ENV]
        else:
            os.environ[call_native.ENV] = setting
        call_cache.clear()
    hits, native = call_cache.stats["hits"], call_native.counts["launched"]
    cached = timed(call)
    r["cached"], r["enqueue"], r["replays"] = cached.wall, cached.host, call_cache.stats["hits"] - hits
    r["native"] = call_native.counts["launched"] - native
    entry = call_cache.lookup(call_cache.call_key(values, meta, x, None, False, (None, None, True) + (None,) * 5))
    kinds = [type(launch).__name__ for launch, *_ in entry.launches] if hasattr(entry, "launches") else []
    r["launches"] = "+".join(sorted(set(kinds), key=kinds.index)) + f" x{len(kinds)}" if kinds else "-"
    r["launches"] += f", {r['native']} native" if r["native"] else ""
    # cached calls against float64 on new x: into a poisoned out (its own key: the first call is
    # recorded, the next two replay) and as returned (a fresh C per call)
    dense32 = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float32)).cuda()
    dense = dense32.double()
    worst = 0.0
    out = torch.empty(m, t, device="cuda", dtype=torch.float16)
    for i in range(4):
        x.copy_(torch.randn(t, k, generator=g).cuda().to(torch.bfloat16))
        out.fill_(float("nan"))
        c = sparse_matmul(values, meta, x, out=out) if i < 3 else call()
        ref = dense @ x.double().T
        worst = max(worst, ((c.double() - ref).abs().max() / ref.abs().max()).item())
    r["err"] = worst
    wd = w.to(torch.bfloat16)
    r["dense"] = timed(lambda: F.linear(x, wd)).wall
    try:
        comp = torch._cslt_compress(dense32.to(torch.bfloat16))
        xt = x.T.contiguous() if t % 8 else x.T
        r["cslt"] = timed(lambda: torch._cslt_sparse_mm(comp, xt)).wall
    except Exception as e:  # cuSPARSELt not in this torch build, or the shape refused
        r["cslt_error"] = f"{type(e).__name__}: {str(e)[:60]}"
    return r


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.profile:
        m, k = (int(v) for v in args.shapes[0].split("x"))
        profile_cached(m, k, args.tokens[0])
    print(f"{'weight':>11} {'T':>5} | {'kernel':>7} {'planned':>8} {'prepared':>8} {'cached':>7} {'enqueue':>8} | "
          f"{'F.linear':>8} {'cuSPARSELt':>10} | {'replays':>7} {'err':>8}  launches replayed")
    for shape in args.shapes:
        m, k = (int(v) for v in shape.split("x"))
        for t in args.tokens:
            r = row(m, k, t, args.blocks)
            print(f"{shape:>11} {t:>5} | {fmt(r['kernel']):>7} {fmt(r['planned']):>8} {fmt(r['prepared']):>8} "
                  f"{fmt(r['cached']):>7} "
                  f"{fmt(r['enqueue']):>8} | {fmt(r['dense']):>8} {fmt(r.get('cslt')):>10} | {r['replays']:>7} "
                  f"{r['err']:>8.1e}  {r['launches']}" + (f"  ({r['cslt_error']})" if "cslt_error" in r else ""),
                  flush=True)
    print("µs per call; planned = SPARSILE_CALL_CACHE=0, cached = as shipped (the module docstring)")
    from sparsile.stdlib.kernels import call_cache

    if call_cache.last_prepare_error:
        print(f"a launch replayed through kernel[grid]: {call_cache.last_prepare_error}")


if __name__ == "__main__":
    main()
