"""The decode kernel's gated epilogue on the H200: a gated MLP's fused [gate; up] projection with
``activation="swiglu"`` (y = silu(gate) * up stored by the kernel) or ``"geglu"`` (y =
gelu_tanh(gate) * up, Gemma's MLP) against the same kernel storing both halves, followed by torch's
activation (``F.silu`` / ``F.gelu(approximate="tanh")``) and ``mul`` on the two column views (what a
fused projection group ran before), at Llama-3 8B and 70B gate/up shapes.

    python benchmarks/bench_glu.py                   # swiglu, bf16, 8B and 70B, T in 1 4 16 64
    python benchmarks/bench_glu.py --activations swiglu geglu --tokens 16 --shapes 8B

Times are µs per call from replaying a CUDA graph of several back-to-back calls (the graph holds
every kernel of a call: torch's two elementwise kernels in the unfused column). Each result is
checked against the unfused one (max |difference| / max |y|); the float64 checks are
tests/stdlib/test_decode_glu.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from torch_timing import environment, graph_time, prune_24  # noqa: E402

from sparsile.stdlib.kernels.linear_args import GATED_ACTIVATIONS  # noqa: E402

SHAPES = {"8B": (14336, 4096), "70B": (28672, 8192)}  # (F = intermediate size, K = hidden size)
MAX_REL_DIFF = 2e-2  # bf16: the unfused path rounds gate and up to bf16 before the activation and mul


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument("--activations", nargs="+", choices=tuple(GATED_ACTIVATIONS), default=["swiglu"],
                        help="the gated activations timed (default swiglu)")
    parser.add_argument("--reps", type=int, default=10, help="calls per captured graph")
    parser.add_argument("--blocks", type=int, default=7)
    args = parser.parse_args()

    import torch

    from sparsile.integrations.torch._kernels import glu_unfused
    from sparsile.stdlib.kernels import prune_and_compress
    from sparsile.stdlib.kernels.decode import plan_sparse_decode

    print(" ".join(f"{k}={v}" for k, v in environment().items()))
    print("| activation | weight | T | unfused: kernel + act + mul (µs) | gated epilogue (µs) | speed-up "
          "| config (unfused / gated) | max rel diff |")
    print("|---|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for name in args.shapes:
        f, k = SHAPES[name]
        w = prune_24(torch.randn(2 * f, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5)
        values, meta = prune_and_compress(w, "bf16")
        del w
        for t in args.tokens:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            plain = plan_sparse_decode(values, meta, x)
            for activation in args.activations:
                fused = plan_sparse_decode(values, meta, x, activation=activation)

                def unfused(plain=plain, activation=activation):  # what sparsile.torch's fallback runs
                    return glu_unfused(plain.run(), activation)

                def gated(fused=fused):
                    return fused.run()

                ref = unfused().float()
                got = gated().float()
                torch.cuda.synchronize()
                diff = ((got - ref).abs().max() / ref.abs().max()).item()
                t_unfused = graph_time(unfused, args.reps, args.blocks)
                t_fused = graph_time(gated, args.reps, args.blocks)
                cfg = lambda c: f"bm {c.bm} s{c.stages} k{c.split_k}{' persist' if c.persist else ''}"  # noqa: E731
                print(f"| {activation} | {name} {2 * f}x{k} | {t} | {t_unfused:.1f} | {t_fused:.1f} "
                      f"| {t_unfused / t_fused:.2f}x | {cfg(plain.config)} / {cfg(fused.config)} "
                      f"| {diff:.1e}{'' if diff < MAX_REL_DIFF else ' FAIL'} |", flush=True)
                if diff >= MAX_REL_DIFF:
                    sys.exit(1)


if __name__ == "__main__":
    main()
