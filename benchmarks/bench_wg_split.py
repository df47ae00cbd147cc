"""Kernel time of the sm_90a sparse GEMM with its consumer warpgroups splitting each tile by rows
(the default: 64 rows x BN tokens each) or by columns (``WG_N``: 128 rows x BN/2 tokens each, so
each stage's B is read from shared memory once), for sparse_matmul and the sparse_linear layer, at
Llama-3 8B layer shapes; every result checked against float64 (outputs poisoned first).

    python benchmarks/bench_wg_split.py                                  # the table
    python benchmarks/bench_wg_split.py --shapes o qkv --tokens 1024 4096 --dtypes bf16 e4m3

Kernel times are the CUDA profiler's device time per call, as in bench_sparse_gemm.py; both
contenders use the same plan (the shipped tuned table's config, or the heuristic one) and differ
only in WG_N.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["o", "qkv", "gate_up"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[256, 1024, 4096])
    parser.add_argument("--dtypes", nargs="+", choices=["bf16", "f16", "e4m3"], default=["bf16", "e4m3"])
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT.parent))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from bench_sparse_gemm import profile_kernel_time

    from sparsile.stdlib.kernels import CompressedWeight, linear, plan_sparse_matmul, prune_and_compress

    g = torch.Generator().manual_seed(0)
    print(f"{'shape':8} {'T':>5} {'dtype':5} {'kernel':14} {'config':22} {'WG_N=0 us':>10} {'WG_N=1 us':>10} "
          f"{'speedup':>8} {'rel err 0':>10} {'rel err 1':>10}")
    for name in args.shapes:
        n_out, k = SHAPES[name]
        w = torch.randn(n_out, k, generator=g) / k ** 0.5
        for dt in args.dtypes:
            values, meta = prune_and_compress((w * 64 if dt == "e4m3" else w).cuda(), dt)
            dense = CompressedWeight(values, meta).dense().astype(np.float64)
            for t in args.tokens:
                x = torch.randn(t, k, generator=g).cuda().to(torch.bfloat16)
                sw = torch.full((n_out,), 1 / 64, device="cuda")
                if dt == "e4m3":
                    xin, sx = linear.quantize_per_token_e4m3(x)
                    layer_kw = {"scale_w": sw, "scale_x": sx}
                else:
                    xin = x.to(torch.float16) if dt == "f16" else x
                    layer_kw = {}
                xh = xin.double().cpu().numpy()
                for kind in ("sparse_matmul", "sparse_linear"):
                    if kind == "sparse_matmul":
                        base = plan_sparse_matmul(values, meta, xin)
                        ref = dense @ xh.T
                        config = f"BN={base.bn} split={base.split_k} pair={base.pair_ctas}"
                    else:
                        base = linear.plan_sparse_linear(values, meta, xin, **layer_kw)
                        ref = linear.reference_linear(dense, xh, **{key: v.cpu().numpy() for key, v in
                                                                    layer_kw.items()})
                        config = f"BN={base.bn} split={base.split_k} pair={base.pair}"
                    times, errs = [], []
                    for wg_n in (0, 1):
                        plan = dataclasses.replace(base, wg_n=wg_n)
                        plan.out.fill_(float("nan"))
                        plan.run()
                        torch.cuda.synchronize()
                        y = plan.out.double().cpu().numpy()
                        errs.append(float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30)))
                        times.append(profile_kernel_time(plan.run, args.iters))
                    print(f"{name:8} {t:5} {dt:5} {kind:14} {config:22} {times[0]:10.1f} {times[1]:10.1f} "
                          f"{times[0] / times[1]:7.2f}x {errs[0]:10.2e} {errs[1]:10.2e}", flush=True)
    print("WG_N applies only where a plan has one CTA per tile, no split-K and BN >= 64; elsewhere both "
          "columns time the same kernel (gemm.wg_n_constexprs).")


if __name__ == "__main__":
    main()
