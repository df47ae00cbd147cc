"""Kernel time of sparse_linear's fused epilogues on the GPU, against sparse_matmul (no epilogue,
C = W x^T in f16) at Llama-3 8B layer shapes, each result checked against a float64 reference.

    python benchmarks/bench_linear_epilogue.py                 # the table
    python benchmarks/bench_linear_epilogue.py --quick         # one shape, T in {1, 16, 1024}
    python benchmarks/bench_linear_epilogue.py --shapes o --tokens 256 1024   # chosen rows

``--profile-once`` runs each contender once inside a CUDA profiler range instead of timing it, for
Nsight Compute (``ncu --profile-from-start off --metrics ... python benchmarks/bench_linear_epilogue.py
--shapes o --tokens 1024 --profile-once``; ``scripts/gpu_runs.sh profile-linear``). "fp8 matmul"
against "fp8 scales" is the e4m3 layer's epilogue and transposed store; "matmul" against "plain" the
same in bf16. Each contender takes its own tuned-table entry (sparse_matmul's "e4m3 MxNxK", the
layer's "linear-e4m3 MxNxK"), so a difference can also be the config: run it again with
``SPARSILE_TUNED_TABLE=0`` (both on the same heuristic) to tell them apart.

Kernel times are the CUDA profiler's device time per call (all launches of a call: split-K's
reduce included), as in bench_sparse_gemm.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (1, 16, 128, 1024, 4096)
VARIANTS = ("matmul", "plain", "bias", "bias+silu", "gelu_tanh", "fp8 matmul", "fp8 scales", "fp8 scales+bias")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None, help="Llama-3 8B layers")
    parser.add_argument("--tokens", nargs="+", type=int, default=None)
    parser.add_argument("--profile-once", action="store_true",
                        help="one call of each contender in a CUDA profiler range (ncu --profile-from-start off)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT.parent))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from bench_sparse_gemm import profile_kernel_time

    from sparsile.stdlib.kernels import CompressedWeight, linear, prune_and_compress, sparse_matmul

    shapes = {"gate_up": SHAPES["gate_up"]} if args.quick else SHAPES
    if args.shapes:
        shapes = {name: SHAPES[name] for name in args.shapes}
    tokens = args.tokens or ((1, 16, 1024) if args.quick else TOKENS)
    g = torch.Generator().manual_seed(0)
    print(f"{'shape':8} {'T':>5} {'variant':16} {'dtype':5} {'us':>8} {'max rel err':>12}")
    for name, (n_out, k) in shapes.items():
        w = torch.randn(n_out, k, generator=g) / k ** 0.5
        weights = {dt: prune_and_compress(w.cuda(), dt) for dt in ("bf16", "e4m3")}
        w8 = prune_and_compress((w * 64).cuda(), "e4m3")
        bias = torch.randn(n_out, generator=g).cuda()
        for t in tokens:
            x = torch.randn(t, k, generator=g).cuda().to(torch.bfloat16)
            xq, sx = linear.quantize_per_token_e4m3(x)
            sw = torch.full((n_out,), 1 / 64, device="cuda")
            for variant in VARIANTS:
                dt = "e4m3" if variant.startswith("fp8") else "bf16"
                values, meta = w8 if dt == "e4m3" else weights[dt]
                if variant.endswith("matmul"):
                    xin = xq if dt == "e4m3" else x

                    def call(values=values, meta=meta, xin=xin):
                        return sparse_matmul(values, meta, xin)
                    ref_kw: dict = {}
                else:
                    kw = {"plain": {}, "bias": {"bias": bias}, "bias+silu": {"bias": bias, "activation": "silu"},
                          "gelu_tanh": {"activation": "gelu_tanh"},
                          "fp8 scales": {"scale_x": sx, "scale_w": sw},
                          "fp8 scales+bias": {"bias": bias, "scale_x": sx, "scale_w": sw}}[variant]
                    xin = xq if dt == "e4m3" else x
                    plan = linear.plan_sparse_linear(values, meta, xin, **kw)

                    def call(plan=plan):
                        return plan.run()
                    ref_kw = kw
                us = profiled_once(call) if args.profile_once else profile_kernel_time(call, args.iters)
                y = call()
                torch.cuda.synchronize()
                dense = CompressedWeight(values, meta).dense().astype(np.float64)
                xin_h = (xq if dt == "e4m3" else x).double().cpu().numpy()
                if variant.endswith("matmul"):
                    ref = dense @ xin_h.T
                else:
                    ref = linear.reference_linear(dense, xin_h, **{key: v.cpu().numpy() if hasattr(v, "cpu") else v
                                                                  for key, v in ref_kw.items()})
                err = np.abs(y.double().cpu().numpy() - ref).max() / max(np.abs(ref).max(), 1e-30)
                print(f"{name:8} {t:5} {variant:16} {dt:5} {us:8.1f} {err:12.2e}", flush=True)


def profiled_once(call) -> float:
    """One call inside a CUDA profiler range, after two warm-up calls (returns 0: ncu times it)."""
    import torch

    call()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0.0


if __name__ == "__main__":
    main()
