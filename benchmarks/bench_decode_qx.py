"""The e4m3 decode step in one launch (the kernel quantizes 16-bit x itself) against two launches
(``quantize_per_token_e4m3``, then the decode kernel on that e4m3 x), and the one-launch kernel's
ring depth.

    python benchmarks/bench_decode_qx.py                                   # Llama-3 8B / 70B shapes, T 1 4 16
    python benchmarks/bench_decode_qx.py --shapes 28672x4096 --tokens 1 4 --stages 2 4 6 8

For each e4m3 weight (N_out x K, compressed on the GPU) and bf16 x (T, K), µs per call timed as the
decode tuner times a candidate: one replay of a CUDA graph of calls rotating over weight copies of
3x the L2, so each call streams its weight from HBM as a model's layers do (docs/autotune.md).
Columns:

  two launches   the quantizer and the decode kernel (the shipped table's configuration, split-K
                 reduced in the kernel), back to back in the graph: no host time between them
  one launch     ``plan_sparse_decode`` of the bf16 x: the table's configuration fitted to the
                 resident x (``resident_x_config``), split-K reduced in the kernel
  stages=S       the one launch with a ring of S stages (left out where it does not fit)

Every one-launch output (poisoned first) must equal the two launches' bit for bit on the same
split and slab height, and match them within the tuner's tolerance on another split (its partial
sums add in another order); a mismatch stops the run with exit status 1. A weight whose resident x
fits at no split gets a row saying so.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

LLAMA3 = ("6144x4096", "4096x4096", "28672x4096", "4096x14336", "10240x8192", "8192x8192", "57344x8192",
          "8192x28672")
"""Llama-3 8B and 70B (fused qkv, o, fused gate_up, down), N_out x K."""


class Calls:
    """``run(stream=)`` for graph_bench: each call runs ``step(i, stream)`` for the next copy i."""

    def __init__(self, copies: int, step: Any, calls: int):
        self.copies, self.step, self.next, self.calls = copies, step, 0, calls

    def __call__(self, stream: Any = None) -> None:
        self.step(self.next % self.copies, stream)
        self.next += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--shapes", nargs="+", default=list(LLAMA3), help="N_out x K")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--stages", nargs="*", type=int, default=[4, 6, 8], help="ring depths of the one launch to time")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rep", type=int, default=20)
    args = ap.parse_args(argv)
    from sparsile.backend import runtime

    if not runtime.has_gpu():
        print("bench_decode_qx.py: no GPU here", file=sys.stderr)
        return 3
    import torch

    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.decode_tuning import _poison, parse_decode_shape, weight_copies
    from sparsile.stdlib.kernels.graph_timing import GRAPH_CALLS, graph_bench
    from sparsile.stdlib.kernels.quantize_e4m3 import prepare_quantize_per_token_e4m3
    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu
    from sparsile.stdlib.kernels.tuning import f32_copy, matches_reference, reference_tolerance
    from sparsile.stdlib.sparsity.errors import SparsityError

    def bench(plans: list[Any], before: Any = None) -> float:
        def step(i: int, stream: Any) -> None:
            if before is not None:
                before(stream)
            plans[i].run(stream=stream)
        calls = len(plans) * max(1, GRAPH_CALLS // len(plans))
        return graph_bench(Calls(len(plans), step, calls), warmup=args.warmup, rep=args.rep) * 1e3

    def described(plan: Any) -> str:
        c = plan.config
        return f"bm{c.bm} s{c.stages} k{c.split_k}"

    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{runtime.current_device().name}; e4m3 weight, bf16 x; µs per call, graph replay from HBM")
    print("| weight | T | two launches | µs | one launch | µs | " + " | ".join(f"stages={s}" for s in args.stages)
          + " | best one / two |")
    print("|---" * (7 + len(args.stages)) + "|")
    for shape in args.shapes:
        n_out, k = parse_decode_shape(shape)
        values, meta = compress_gpu(torch.randn(n_out, k, device="cuda", generator=gen), "e4m3", "sm90")
        meta = meta.data
        for t in args.tokens:
            x = torch.randn(t, k, device="cuda", generator=gen).to(torch.bfloat16)
            xq = torch.empty(t, k, device="cuda", dtype=torch.float8_e4m3fn)
            sx = torch.empty(t, device="cuda", dtype=torch.float32)
            quantizer = prepare_quantize_per_token_e4m3(x, xq, sx)

            def quantize(stream: Any, quantizer: Any = quantizer, x: Any = x, xq: Any = xq, sx: Any = sx) -> None:
                quantizer.run((x, xq, sx), stream)

            two = plan_sparse_decode(values, meta, xq, scale_x=sx, reduce="kernel")

            def rotation(plan: Any) -> list[Any]:  # (the plan's own arrays copied: padded or tiled per config)
                return [plan, *(dataclasses.replace(plan, values=v, meta=m) for v, m in weight_copies(plan))]

            quantize(None)
            _poison(two.out)
            two.run()
            ref = two.out.clone()
            two_us = bench(rotation(two), quantize)
            try:
                one = plan_sparse_decode(values, meta, x, reduce="kernel")
            except SparsityError as e:  # the resident x fits at no split: x must be quantized first
                print(f"| {shape} | {t} | {described(two)} | {two_us:.2f} | no one launch: {e.code} |", flush=True)
                continue
            tol = reference_tolerance(f32_copy(ref))
            cells, best = [], None
            for depth in [None, *args.stages]:  # the shipped ring, then each depth asked for
                if depth is None:
                    plan = one
                else:
                    try:
                        plan = plan_sparse_decode(values, meta, x, reduce="kernel", stages=depth,
                                                  split_k=one.config.split_k, bm=one.config.bm)
                    except SparsityError:
                        cells.append("-")
                        continue
                _poison(plan.out)
                plan.run()
                torch.cuda.synchronize()
                same_cut = (plan.config.split_k, plan.config.bm) == (two.config.split_k, two.config.bm)
                if not (torch.equal(plan.out.view(torch.int16), ref.view(torch.int16)) if same_cut
                        else matches_reference(f32_copy(plan.out), f32_copy(ref), tol)):  # (other K shares)
                    print(f"| {shape} | {t} | WRONG: the one launch ({described(plan)}) differs from the two |")
                    return 1
                us = bench(rotation(plan))
                best = us if best is None else min(best, us)
                cells.append(f"{described(plan)}: {us:.2f}" if cells else f"{described(plan)} | {us:.2f}")
            print(f"| {shape} | {t} | {described(two)} | {two_us:.2f} | " + " | ".join(cells)
                  + f" | {best / two_us:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
