"""Decode (T <= 64) on the H200: the decode kernel (stdlib/kernels/decode.py) against the
shipped sparse_linear kernels and dense ``torch.nn.functional.linear``, at Llama-3 8B and 70B layer
shapes, each result checked against a float64 reference on the GPU.

    python benchmarks/bench_decode.py                      # bf16, 8B and 70B shapes, T in 1 4 16 32 64
    python benchmarks/bench_decode.py --dtype f16 --quick  # one shape per model
    python benchmarks/bench_decode.py --splits 1,2,4,8,16  # the decode kernel at each split-K as well
    python benchmarks/bench_decode.py --quick --stages 2,3,4,6  # and at each ring depth
    python benchmarks/bench_decode.py --tokens 16 64 --no-tiled  # some token counts, untiled weights only

"decode" is the weight as prune_and_compress gives it; "decode tiled" the same kernel on the
weight copied into the tiled layout (decode.tile_for_decode: each TMA box one contiguous run).

Kernel times are the CUDA profiler's device time per call (every launch of a call: split-K's reduce
included; bench_sparse_gemm.profile_kernel_time). Each case rotates over enough copies of the
weight that their total exceeds 3x the 50 MB L2, so every call reads its weight from HBM.
"Required" bytes are what the operation must move: for the sparse kernels the values
(N_out x K/2 elements), the metadata (N_out x K/8 bytes for 16-bit types), x and y; for dense the
full weight, x and y. GB/s = required bytes / kernel time; % = of the H200's 4.8 TB/s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # (N_out, K)
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (28672, 4096), "8B down": (4096, 14336),
    "70B qkv": (10240, 8192), "70B o": (8192, 8192), "70B gate_up": (57344, 8192), "70B down": (8192, 28672),
}
QUICK = ("8B gate_up", "70B o")
TOKENS = (1, 4, 16, 32, 64)
HBM_BYTES_PER_S = 4.8e12
L2_BYTES = 50 * 2 ** 20
MAX_REL_ERR = 2e-2  # of max |y|: bf16 output rounding (2^-9) plus f32 accumulation, with margin


def required_bytes(n_out: int, k: int, t: int, elem: int, sparse: bool) -> int:
    """The bytes the call must move: the weight (compressed values and metadata, or dense), x, y."""
    weight = n_out * k // 2 * elem + n_out * k // 8 * (2 // elem) if sparse else n_out * k * elem
    return weight + t * k * elem + t * n_out * elem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--splits", default="", help="comma-separated split-K values to time the decode kernel at")
    parser.add_argument("--stages", default="", help="comma-separated ring depths to time the decode kernel at")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS),
                        help="token counts (default 1 4 16 32 64)")
    parser.add_argument("--no-tiled", action="store_true", help="leave out the tiled-layout rows")
    args = parser.parse_args()
    if not all(1 <= t <= 64 for t in args.tokens):
        parser.error("--tokens takes token counts from 1 to 64 (the decode kernel's range)")
    sys.path.insert(0, str(ROOT.parent))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from bench_sparse_gemm import profile_kernel_time

    from sparsile.stdlib.kernels import linear, prune_and_compress
    from sparsile.stdlib.kernels.decode import plan_sparse_decode

    tdt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    splits = [int(s) for s in args.splits.split(",") if s]
    stages = [int(s) for s in args.stages.split(",") if s]
    g = torch.Generator().manual_seed(0)
    print(f"{'shape':12} {'T':>3} {'kernel':18} {'us':>8} {'GB/s':>7} {'%HBM':>6} {'vs dense':>8} {'vs shipped':>10} "
          f"{'rel err':>9} config")
    for name in (QUICK if args.quick else SHAPES):
        n_out, k = SHAPES[name]
        w = (torch.randn(n_out, k, generator=g) / k ** 0.5).cuda()
        sparse_bytes = required_bytes(n_out, k, 0, 2, True)
        copies = max(1, min(8, -(-3 * L2_BYTES // sparse_bytes)))
        weights = [prune_and_compress(w * (1 + 2 ** -7 * i), args.dtype) for i in range(copies)]
        dense_copies = [torch.from_numpy(weights[0].dense().astype(np.float32)).to(tdt).cuda()]
        dense_copies += [(dense_copies[0].float() * (1 + 2 ** -7 * i)).to(tdt) for i in range(1, copies)]
        ref_w = dense_copies[0].double()
        for t in args.tokens:
            x = torch.randn(t, k, generator=g).cuda().to(tdt)
            ref = (x.double() @ ref_w.T)
            dense_us = shipped_us = None
            variants: list[tuple[str, list, str]] = [
                ("dense", [lambda d=d, x=x: torch.nn.functional.linear(x, d) for d in dense_copies], "cuBLAS")]
            plans = [linear.plan_sparse_linear(v, m, x, kernel="gemm") for v, m in weights]
            variants.append(("sparse_linear", [p.run for p in plans],
                             f"BN={plans[0].bn} split={plans[0].split_k} pair={plans[0].pair}"))
            tuning = [(None, None)] + [(sp, None) for sp in splits] + [(None, st) for st in stages]
            for tiled in (False,) if args.no_tiled else (False, True):
                for split, st in tuning:
                    dplans = [plan_sparse_decode(v, m, x, split_k=split, stages=st, tiled=tiled) for v, m in weights]
                    c = dplans[0].config
                    label = ("decode tiled" if tiled else "decode") + ("" if split is None else f" s={split}") \
                        + ("" if st is None else f" st={st}")
                    variants.append((label, [p.run for p in dplans],
                                     f"BN={c.bn} BK={c.bk} stages={c.stages} split={c.split_k}"))
            for label, calls, config in variants:
                state = {"i": 0}

                def call(calls=calls, state=state):
                    state["i"] += 1
                    return calls[state["i"] % len(calls)]()

                us = profile_kernel_time(call, args.iters)
                y = calls[0]()
                torch.cuda.synchronize()
                err = ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                nbytes = required_bytes(n_out, k, t, 2, label != "dense")
                gbs = nbytes / (us * 1e-6) / 1e9
                dense_us = us if label == "dense" else dense_us
                shipped_us = us if label == "sparse_linear" else shipped_us
                ratio = dense_us / us if dense_us else float("nan")
                shipped = shipped_us / us if shipped_us else float("nan")
                verdict = "" if err <= MAX_REL_ERR else f"  WRONG (max rel err > {MAX_REL_ERR})"
                print(f"{name:12} {t:3} {label:18} {us:8.1f} {gbs:7.0f} {100 * gbs * 1e9 / HBM_BYTES_PER_S:5.1f}% "
                      f"{ratio:7.2f}x {shipped:9.2f}x {err:9.1e} {config}{verdict}", flush=True)
        del weights, dense_copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
