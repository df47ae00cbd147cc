"""One call each of the decode kernel at several token counts, and of its peers at the largest, inside
a CUDA profiler range, for Nsight Compute: where the decode kernel's bandwidth goes between N = 1
and N = 64 (benchmarks/RESULTS.md, twenty-second session: 8B gate_up bf16 streams 3.82 TB/s at
N = 1 and 3.31 TB/s at N = 64).

    ncu --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section SchedulerStats \\
        python benchmarks/profile_decode.py --shape 28672x4096 --tokens 1 64 --dtype bf16

Each contender runs twice before its profiled call (compiled, loaded, its table entry read). The
decode kernel runs as ``sparse_matmul`` plans it at that N (the decode table's entry, else the
heuristic); its configuration is printed. Peers at the largest N: cuBLAS (``torch.mm``) on the
dense weight and cuSPARSELt with the algorithm ``torch._cslt_sparse_mm_search`` picks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse_gemm import cslt_search, pruned_operands  # sibling scripts, not a package
from torch_timing import profiled_once


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="28672x4096", help="M x K of the weight (default 8B gate_up)")
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 64])
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--no-peers", action="store_true", help="only the decode kernel")
    return ap.parse_args(argv)


def profiled(name: str, fn) -> None:
    """``fn`` profiled once (after two warm-up calls), then its name printed."""
    profiled_once(fn)
    print(f"profiled: {name}", flush=True)


def main(argv: list[str] | None = None) -> None:
    import torch

    from sparsile.stdlib.kernels.decode import SparseDecodePlan
    from sparsile.stdlib.kernels.gemm import plan_sparse_matmul

    args = parse_args(argv)
    m, k = (int(v) for v in args.shape.split("x"))
    operands = {}
    for n in args.tokens:
        o = operands[n] = pruned_operands(args.dtype, m, n, k, seed=m + n + k)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        plan = plan_sparse_matmul(o["values"], o["meta"], o["b"], out=c, target="sm_90a")
        if not isinstance(plan, SparseDecodePlan):
            raise SystemExit(f"N = {n}: sparse_matmul does not run the decode kernel here")
        cfg = plan.config
        profiled(f"decode {args.dtype} {m}x{n}x{k} bm={cfg.bm} split_k={cfg.split_k} stages={cfg.stages} "
                 f"ctas/SM={cfg.ctas_per_sm} ({cfg.source})", plan.run)
        err = ((c.float() - o["ref"]).abs().max() / o["scale"]).item()
        print(f"  max |C - ref| / max |ref| = {err:.1e}", flush=True)
    if args.no_peers:
        return
    n = max(args.tokens)  # the peers at the largest N (cuSPARSELt does not run at N = 1)
    w, b = operands[n]["w"], operands[n]["b"]
    profiled(f"cuBLAS {args.dtype} {m}x{n}x{k}", lambda: torch.mm(w, b.T))
    try:
        comp = torch._cslt_compress(w)
        bt = b.T
        try:
            torch._cslt_sparse_mm(comp, bt)
        except Exception:  # as bench_sparse_gemm.cslt_times: B^T as a contiguous copy where the view is refused
            bt = b.T.contiguous()
        alg = cslt_search(comp, bt)
        profiled(f"cuSPARSELt {args.dtype} {m}x{n}x{k} alg {alg}", lambda: torch._cslt_sparse_mm(comp, bt, alg_id=alg))
    except Exception as e:
        print(f"cuSPARSELt at N = {n} did not run: {type(e).__name__}: {str(e)[:120]}", flush=True)

if __name__ == "__main__":
    main()
