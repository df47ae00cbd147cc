"""sparse_matmul's C element type and prune_and_compress's GPU route, on the GPU (issue 12).

For Llama-3 8B/70B layer shapes (bf16 weight M x K, x of T tokens) it prints, per T:

* the kernel time of ``sparse_matmul`` with float16 C (the ``sparse_gemm_bf16`` kernel, the plan's
  split-K and CTA-pair choice), ``out_dtype="bfloat16"`` and ``out_dtype="float32"`` (the
  ``_splitk`` kernel; bf16 through ``splitk_reduce``), CUDA events, mean of ``--iters`` launches of
  one prepared plan;
* once per weight: ``prune_and_compress`` of the CUDA weight (``compress_gpu``) against the same
  weight on the CPU (the host toolkit), and that the two give the same bits.

    python benchmarks/bench_gemm_out_dtype.py
    python benchmarks/bench_gemm_out_dtype.py --tokens 16 4096 --shapes 14336x4096
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import event_time_us  # a sibling script, not a package

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (57344, 8192), (8192, 28672)]
"""(M = out features, K = in features): Llama-3 8B QKV, O, gate+up, down; 70B gate+up, down."""
OUT_DTYPES = (None, "bfloat16", "float32")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=[f"{m}x{k}" for m, k in SHAPES], help="MxK weights")
    parser.add_argument("--tokens", nargs="+", type=int, default=[16, 256, 4096], help="T (N of C)")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    args.shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    return args


def kernel_us(plan, iters: int) -> float:
    """Mean microseconds per ``plan.run()`` between CUDA events (after one warm-up run)."""
    return event_time_us(plan.run, iters, warmup=1)


def main(argv: list[str] | None = None) -> int:
    import torch

    from sparsile.stdlib.kernels import plan_sparse_matmul, prune_and_compress

    args = parse_args(argv)
    prune_and_compress(torch.randn(128, 128, device="cuda").to(torch.bfloat16), "bf16")  # compiles the kernel
    print(f"{'M x K':>12} {'T':>5} " + " ".join(f"{d or 'float16'!s:>10} us" for d in OUT_DTYPES))
    for m, k in args.shapes:
        w = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        values, meta = prune_and_compress(w, "bf16")
        torch.cuda.synchronize()
        gpu_s = time.perf_counter() - t0
        w_cpu = w.cpu()
        t0 = time.perf_counter()
        host_values, host_meta = prune_and_compress(w_cpu, "bf16")
        host_s = time.perf_counter() - t0
        same = torch.equal(values.cpu().view(torch.int16), host_values.view(torch.int16)) and bool(
            (meta.data == host_meta.data).all())
        print(f"prune_and_compress {m}x{k}: CUDA weight {gpu_s * 1e3:.1f} ms CPU weight "
              f"{host_s * 1e3:.1f} ms, bit-identical: {same}")
        for t in args.tokens:
            x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
            times = [kernel_us(plan_sparse_matmul(values, meta, x, out_dtype=d), args.iters) for d in OUT_DTYPES]
            print(f"{m:>6}x{k:<5} {t:>5} " + " ".join(f"{us:13.1f}" for us in times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
