"""The 2:4 sparse GEMM at 8192³ (or --size, or --shape MxNxK) under kernel variants, against cuSPARSELt and cuBLAS,
on one GPU: CUDA-event times of back-to-back calls, each variant first checked against float64 with
a poisoned output.

    python benchmarks/gemm_variants.py --dtypes bf16 f16 --stages 4 5 --group-m 16 8

``--profile-once`` instead runs each contender once inside a CUDA profiler range (after warm-up),
for Nsight Compute: ``ncu --profile-from-start off --set full -o gemm python benchmarks/
gemm_variants.py --profile-once`` (the ninth session's comparison in RESULTS.md). Variants: the
kernel launched with one CTA per tile ("tile") and the CTA-pair kernel that ``sparse_matmul`` runs
for large C ("pair"), for every (STAGES, GROUP_M) given; ``--tma-store`` adds both with the epilogue
that stores the tile through shared memory by TMA (the ``_tma`` kernels; at most STAGES 4 fit).
``--meta-tma`` adds the kernels of ``sparse_gemm_sm90_mt.spk``, whose producer streams the
metadata words by TMA with the values instead of the consumers loading them from global memory
(pair; tile for bf16). ``--inflight`` adds each of them again with ``INFLIGHT=1``: one sparse MMA
group kept in flight across K steps (three metadata register sets, each stage released one step later), against the
default that waits for every MMA; ``--l2-hint`` adds the ``_mt`` kernels with L2 eviction priorities
(the weight's values and metadata evict-first, B evict-last, each alone and both); ``--per-warp``
adds the ``_mt`` kernels with ``PER="warp"`` (each
consumer warp releases a stage itself instead of its warpgroup after a named barrier);
``--pingpong`` adds the ping-pong kernel at its best measured configuration (128 x 128, BK 128,
4 stages, a CTA per SM; with ``--inflight`` also its INFLIGHT=1).

    python benchmarks/gemm_variants.py --dtypes bf16 f16 --inflight --pingpong
    python benchmarks/gemm_variants.py --dtypes e4m3 --meta-tma --inflight   # against cuBLAS fp8 (torch._scaled_mm)

e4m3: the kernels of the same names for e4m3 (no ping-pong kernel), cuSPARSELt with an f16 output,
and dense cuBLAS fp8 through ``torch._scaled_mm`` (unit scales, f16 output) for the dense row.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sparse_gemm as B  # sibling scripts, not a package
from torch_timing import event_time_us, profiled_once


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", nargs="+", choices=("bf16", "f16", "e4m3"), default=["bf16", "f16"])
    ap.add_argument("--size", type=int, default=8192, help="M = N = K")
    ap.add_argument("--shape", type=mnk, default=None,
                    help="M x N x K (e.g. 57344x256x8192; replaces --size): a layer's GEMM under the variants")
    ap.add_argument("--stages", nargs="+", type=int, default=[4])
    ap.add_argument("--group-m", nargs="+", type=int, default=[16])
    ap.add_argument("--only", default="",
                    help="time only the kernels whose label contains this (e.g. 'pair, metadata')")
    ap.add_argument("--bn", nargs="+", type=int, default=[256], help="tile widths (BN) to time each kernel at")
    ap.add_argument("--bk", nargs="+", type=int, default=[0],
                    help="K steps (BK) to time each kernel at (0: the kernel's default)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tma-store", action="store_true",
                    help="also the kernels whose epilogue stores the tile through shared memory by TMA (_tma)")
    ap.add_argument("--meta-tma", action="store_true",
                    help="also the kernels that stream the metadata by TMA (sparse_gemm_sm90_mt.spk)")
    ap.add_argument("--per-warp", action="store_true",
                    help="also the _mt kernels with PER='warp' (each consumer warp releases a stage with an "
                         "arrival of its own, no named barrier per warpgroup); needs --meta-tma")
    ap.add_argument("--inflight", action="store_true",
                    help="also each kernel with INFLIGHT=1 (one sparse MMA group in flight across K steps)")
    ap.add_argument("--l2-hint", action="store_true",
                    help="also the metadata-by-TMA kernels with L2 eviction priorities on their loads (L2A / L2B: "
                         "the weight evict-first, B evict-last, each alone and both); needs --meta-tma")
    ap.add_argument("--pingpong", action="store_true",
                    help="also the ping-pong kernel (128 x 128, BK 128, 4 stages; INFLIGHT=1 too with --inflight)")
    ap.add_argument("--profile-once", action="store_true",
                    help="one call of each contender inside a CUDA profiler range (for ncu --profile-from-start off)")
    return ap.parse_args(argv)


def mnk(text: str) -> tuple[int, int, int]:
    """``--shape``: "MxNxK", three positive integers (``tuning.parse_shape``, as ``sparsile tune``)."""
    from sparsile.frontend.diagnostics import LaunchError
    from sparsile.stdlib.kernels.tuning import parse_shape

    try:
        return parse_shape(text)
    except LaunchError as e:
        raise argparse.ArgumentTypeError(e.message) from None


L2_HINTS = {"A first": {"L2A": "evict_first"}, "B last": {"L2B": "evict_last"},
            "A first B last": {"L2A": "evict_first", "L2B": "evict_last"}}
"""``--l2-hint``'s variants: the L2 eviction priorities of the weight's (A) and B's loads."""

PINGPONG_CONFIG = {"BN": 128, "BK": 128, "STAGES": 4}
"""The ping-pong kernel's fastest configuration on the H200 (docs/hopper.md, "The ping-pong schedule")."""


def variants(mod: Any, pingpong: Any, dtype: str, args: argparse.Namespace, m: int, n: int, sms: int,
             meta_tma: Any = None, bn: int = 256) -> dict[str, tuple[Any, dict[str, Any]]]:
    """label -> (the kernel launched on its grid, constexprs over BN = ``bn`` and the STAGES / GROUP_M
    of the table); ``pingpong`` is the ping-pong module (None without --pingpong), ``meta_tma`` the
    metadata-by-TMA module (None without --meta-tma)."""
    from sparsile.stdlib.kernels.gemm import pair_ctas
    from sparsile.stdlib.kernels.gemm_choice import KERNELS
    from sparsile.stdlib.kernels.gemm_schedule import pingpong_ctas

    tiles = -(-m // 128) * -(-n // bn)
    kernels: dict[str, tuple[Any, dict[str, Any]]] = {"tile": (getattr(mod, f"sparse_gemm_{dtype}")[(tiles,)], {})}
    pairs = pair_ctas(m, n, bn, KERNELS[dtype], 1, True, sms)
    if pairs:
        kernels["pair"] = (getattr(mod, f"sparse_gemm_{dtype}_pair")[(pairs,)], {})
        if args.tma_store:  # the same CTA pairs, the tile stored through shared memory by TMA
            kernels["pair, TMA-store epilogue"] = (getattr(mod, f"sparse_gemm_{dtype}_pair_tma")[(pairs,)], {})
    if meta_tma is not None:
        if pairs:
            kernels["pair, metadata by TMA"] = (getattr(meta_tma, f"sparse_gemm_{dtype}_pair_mt")[(pairs,)], {})
        if dtype in ("bf16", "e4m3"):
            kernels["tile, metadata by TMA"] = (getattr(meta_tma, f"sparse_gemm_{dtype}_mt")[(tiles,)], {})
    if args.tma_store and dtype == "bf16":
        kernels["tile, TMA-store epilogue"] = (mod.sparse_gemm_bf16_tma[(tiles,)], {})
    if pingpong is not None and dtype != "e4m3":  # (no e4m3 ping-pong kernel)
        grid = (pingpong_ctas(m, n, PINGPONG_CONFIG["BN"], sms),)
        kernels["ping-pong 128x128, BK 128"] = (getattr(pingpong, f"sparse_gemm_{dtype}_pingpong")[grid],
                                                dict(PINGPONG_CONFIG))
    if args.per_warp and meta_tma is not None:  # the _mt kernels again, each warp releasing a stage itself
        kernels.update({f"{label}, per-warp release": (kern, {**cfg, "PER": "warp"})
                        for label, (kern, cfg) in list(kernels.items()) if "metadata by TMA" in label})
    if args.l2_hint and meta_tma is not None:  # the _mt kernels again with L2 eviction priorities on their loads
        kernels.update({f"{label}, L2 {name}": (kern, {**cfg, **hints})
                        for label, (kern, cfg) in list(kernels.items()) if "metadata by TMA" in label
                        for name, hints in L2_HINTS.items()})
    if args.inflight:  # each of them again with one sparse MMA group in flight
        kernels.update({f"{label}, INFLIGHT=1": (kern, {**cfg, "INFLIGHT": 1})
                        for label, (kern, cfg) in list(kernels.items())})
    return kernels


def shape_of(kw: dict[str, Any]) -> str:
    """BN x BK (where given), STAGES of a run's constexprs."""
    return f"{kw['BN']}x{kw['BK']}, {kw['STAGES']}" if "BK" in kw else f"{kw['BN']}, {kw['STAGES']}"


def bench_dtype(mod: Any, dtype: str, args: argparse.Namespace, timer: Callable[..., float],
                pingpong: Any = None, meta_tma: Any = None) -> None:
    """The table rows of one dtype: each variant, then cuSPARSELt (default, searched) and cuBLAS."""
    import torch

    m, n, k = args.shape or (args.size,) * 3
    o = B.pruned_operands(dtype, m, n, k, seed=1)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    runs = [(bn, bk, label, kern, cfg) for bn in args.bn for bk in args.bk
            for label, (kern, cfg) in variants(mod, pingpong, dtype, args, m, n, sms, meta_tma, bn).items()
            if args.only in label]
    for bn, bk, label, kern, cfg in runs:
        if "STAGES" in cfg and (bn, bk) != (args.bn[0], args.bk[0]):
            continue  # the ping-pong kernel: its own configuration, once
        for stages in [cfg["STAGES"]] if "STAGES" in cfg else args.stages:
            for group_m in args.group_m:
                kw = {"BN": bn, **({"BK": bk} if bk else {}), "STAGES": stages, "GROUP_M": group_m, **cfg}

                def call(kern: Any = kern, kw: dict[str, Any] = kw) -> None:
                    kern(o["values"], o["meta"], o["b"], c, m, n, k, o["lde"], n, **kw)
                c.fill_(float("nan"))
                try:
                    call()
                except Exception as e:  # a configuration that does not fit (shared memory, registers)
                    print(f"| {dtype} | {label} | {shape_of(kw)} | {group_m} | - | {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:80]} |", flush=True)
                    continue
                torch.cuda.synchronize()
                err = ((c.float() - o["ref"]).abs().max() / o["scale"]).item()
                print(f"| {dtype} | {label} | {shape_of(kw)} | {group_m} | {timer(call, args.iters):.1f} | "
                      f"{err:.1e} |", flush=True)
    bt = o["b"].T
    kw = {"out_dtype": torch.float16} if dtype == "e4m3" else {}
    try:
        comp = torch._cslt_compress(o["w"])
        alg = B.cslt_search(comp, bt, **kw)
        default = timer(lambda: torch._cslt_sparse_mm(comp, bt, **kw), args.iters)
        tuned = timer(lambda: torch._cslt_sparse_mm(comp, bt, alg_id=alg, **kw), args.iters)
        print(f"| {dtype} | cuSPARSELt default / tuned (alg {alg}) | | | {default:.1f} / {tuned:.1f} | |")
    except Exception as e:  # cuSPARSELt may refuse this dtype
        print(f"| {dtype} | cuSPARSELt | | | - | {type(e).__name__}: {str(e)[:60]} |")
    if dtype == "e4m3":
        one = torch.tensor(1.0, device="cuda")
        cublas = timer(lambda: torch._scaled_mm(o["w"], bt, scale_a=one, scale_b=one, out_dtype=torch.float16),
                       args.iters)
    else:
        cublas = timer(lambda: torch.mm(o["w"], bt), args.iters)
    print(f"| {dtype} | cuBLAS dense{' fp8' if dtype == 'e4m3' else ''} | | | {cublas:.1f} | |", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    import sparsile as sp

    if not torch.cuda.is_available():
        print("gemm_variants needs an NVIDIA GPU and torch with CUDA", file=sys.stderr)
        return 2
    mod = sp.load(B.ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90.spk")
    pingpong = sp.load(B.ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90_pingpong.spk") if args.pingpong else None
    meta_tma = sp.load(B.ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90_mt.spk") if args.meta_tma else None
    print("| dtype | kernel | BN (x BK), STAGES | GROUP_M | µs | err |\n|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        bench_dtype(mod, dtype, args, profiled_once if args.profile_once else event_time_us, pingpong, meta_tma)
    return 0


if __name__ == "__main__":
    sys.exit(main())
