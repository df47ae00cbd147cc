"""The decode kernel's untabled heuristic against 128-row slabs, on weights outside the shipped table.

    python benchmarks/bench_decode_heuristic.py                      # Qwen2.5-7B / 14B shapes, T 1 and 16, bf16
    python benchmarks/bench_decode_heuristic.py --shapes 4608x3584 --tokens 16 --dtypes bf16 e4m3

For each weight (N_out x K), token count and dtype, two plans of ``plan_sparse_decode`` without a
table: the heuristic (``heuristic_bm``: 64-row slabs where they fit in one wave of the SMs) and
``bm=128`` (the heuristic before it, the same split-K and stage rules on 128-row slabs). Both are
timed as the tuner times a candidate (one replay of a CUDA graph of ten calls rotating over weight
copies of 3x the L2, so every call streams its weight from HBM), and the 128-row plan's output,
poisoned first, must match the heuristic's within the tuner's tolerance. Prints a table: configs,
µs per call, and old / new.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

QWEN = ("4608x3584", "3584x3584", "3584x18944", "37888x3584", "7168x5120", "5120x5120", "5120x13824")
"""Qwen2.5-7B (fused qkv, o, down, fused gate_up) and Qwen2.5-14B (fused qkv, o, down): not in the
shipped decode table, which holds Llama-3 8B / 70B shapes."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--shapes", nargs="+", default=list(QWEN), help="N_out x K")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--dtypes", nargs="+", default=["bf16"], choices=["bf16", "f16", "e4m3"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rep", type=int, default=20)
    args = ap.parse_args(argv)
    from sparsile.backend import runtime

    if not runtime.has_gpu():
        print("bench_decode_heuristic.py: no GPU here", file=sys.stderr)
        return 3
    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.decode_tuning import (
        Rotation,
        _poison,
        default_candidate,
        gpu_problem,
        parse_decode_shape,
        weight_copies,
    )
    from sparsile.stdlib.kernels.graph_timing import graph_bench
    from sparsile.stdlib.kernels.tuning import f32_copy, matches_reference, reference_tolerance

    sms = runtime.current_device().sm_count
    make = gpu_problem()
    print(f"{runtime.current_device().name} ({sms} SMs); µs per call, graph replay from HBM")
    print("| weight | T | dtype | heuristic | µs | 128-row slabs | µs | 128-row / heuristic |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for dtype in args.dtypes:
        for shape in args.shapes:
            n_out, k = parse_decode_shape(shape)
            for t in args.tokens:
                new = make(dtype, n_out, k, t)
                old = plan_sparse_decode(new.base.values, new.base.meta, new.base.x, table=False, bm=128)
                times, ref = [], None
                for plan in (new, old):
                    _poison(plan.out)
                    out = f32_copy(plan.run())
                    if ref is None:
                        ref, tol = out, reference_tolerance(out)
                    elif not matches_reference(out, ref, tol):
                        print(f"| {shape} | {t} | {dtype} | WRONG: the 128-row plan disagrees with the heuristic's |")
                        return 1
                    copies = [dataclasses.replace(plan, values=v, meta=m) for v, m in weight_copies(plan)]
                    times.append(graph_bench(Rotation([plan, *copies], default_candidate(plan)), warmup=args.warmup,
                                             rep=args.rep) * 1e3)
                ratios.append(times[1] / times[0])
                print(f"| {shape} | {t} | {dtype} | {default_candidate(new)} | {times[0]:.2f} | "
                      f"{default_candidate(old)} | {times[1]:.2f} | {ratios[-1]:.2f}x |", flush=True)
    if ratios:
        print(f"geometric mean of 128-row / heuristic: {statistics.geometric_mean(ratios):.3f}x over {len(ratios)} "
              "cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
