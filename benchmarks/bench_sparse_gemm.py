"""Sparse GEMM on the H200: sparsile 2:4 vs cuSPARSELt (torch._cslt_sparse_mm) vs cuBLAS dense
(torch.mm) vs sparsile dense, in one run, one table.

    C (M x N) = A_2:4 (M x K) @ B^T,  B stored N x K

For the LLM rows, A is the pruned weight (M = out features, K = in features) and B the activations
(N = tokens), i.e. C = W X^T. Kernel times come from the CUDA profiler (device time of the kernels
a call launches, averaged over the timed calls), so per-call host work (torch's re-planning,
Python launch overhead) is excluded for every contender alike. Effective TFLOP/s = 2*M*N*K / time
for sparse and dense alike.

    python benchmarks/bench_sparse_gemm.py            # the full table
    python benchmarks/bench_sparse_gemm.py --quick    # 4096 and 8192 squares, f16 only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SQUARES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 16384)]
# (out features, in features) of Llama-3 8B / 70B MLP layers, with T tokens
LLM = [((14336, 4096), (16, 2048, 8192)), ((4096, 14336), (128, 4096)), ((28672, 8192), (16, 4096))]


def profile_kernel_time(fn, iters: int, warmup: int = 3) -> float:
    """Mean device time (us) per call of the kernels ``fn`` launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.events():
        if evt.device_type.name == "CUDA" and evt.device_time_total > 0 and "Memcpy" not in evt.name \
                and "Memset" not in evt.name:
            total += evt.device_time_total
    return total / iters


def bn_for(n: int) -> int:
    bn = 16
    while bn < min(n, 256):
        bn *= 2
    return bn


def bench_case(sp_mod, dense_mod, dtype: str, m: int, n: int, k: int, iters: int) -> dict:
    import torch
    from sparsile.stdlib import sparsity as S
    from sparsile.stdlib.kernels.gemm import KERNELS, choose_split_k, pair_ctas

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a32 = torch.randn(m, k, device="cuda", generator=g)
    b32 = torch.randn(n, k, device="cuda", generator=g)
    # 2:4 magnitude pruning on the device (top-2 of every 4), compression with the sparsity toolkit
    grp = a32.view(m, k // 4, 4)
    keep = grp.abs().topk(2, dim=-1).indices
    mask = torch.zeros_like(grp, dtype=torch.bool).scatter_(-1, keep, True)
    w = (grp * mask).view(m, k).to(tdt)
    b = b32.to(tdt)
    import ml_dtypes

    host_dt = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    w_host = w.view(torch.int16 if dtype != "e4m3" else torch.int8).cpu().numpy().view(host_dt)
    vals, idx = S.compress(w_host, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data).view(np.int32)
    ints = np.int16 if dtype != "e4m3" else np.int8
    vals_t = torch.from_numpy(np.ascontiguousarray(vals).view(ints)).cuda().view(tdt)
    meta_t = torch.from_numpy(np.ascontiguousarray(meta)).cuda().view(torch.uint32)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    ref = (w.double() @ b.double().T).float()  # float64 product on the GPU
    scale = ref.abs().max().item()
    bn = bn_for(n)
    grid = (((m + 127) // 128) * ((n + bn - 1) // bn),)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = choose_split_k(m, n, k, bn, KERNELS[dtype], sms)  # what sparse_matmul would pick
    kern = getattr(sp_mod, f"sparse_gemm_{dtype}" + ("_splitk" if split > 1 else ""))[(grid[0], split)]
    if split == 1:
        def ours():
            kern(vals_t, meta_t, b, c, m, n, k, meta.shape[1], n, BN=bn)
    else:
        work = torch.empty(split, m, n, device="cuda", dtype=torch.float32)
        reduce = sp_mod.splitk_reduce[((m * n + 1023) // 1024,)]

        def ours():
            kern(vals_t, meta_t, b, work, m, n, k, meta.shape[1], n, BN=bn, SPLIT_K=split)
            reduce(work, c, m * n, SPLIT_K=split)

    def checked_time(fn) -> tuple[float, float]:
        """(max |C - ref| / max |ref| of one poisoned run, mean kernel time in µs)."""
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        return ((c.float() - ref).abs().max() / scale).item(), profile_kernel_time(fn, iters)

    err, t = checked_time(ours)
    row = {"dtype": dtype, "m": m, "n": n, "k": k, "sparsile": t, "err": err, "split": split}
    variants = {}
    if grid[0] > sms:  # persistent: one CTA per SM, each computing several tiles
        variants["persistent"] = getattr(sp_mod, f"sparse_gemm_{dtype}")[(sms,)]
    pairs = pair_ctas(m, n, bn, KERNELS[dtype], split, True, sms)
    if pairs:  # what sparse_matmul runs for large C: CTA pairs sharing B (multicast), persistent
        variants["pair"] = getattr(sp_mod, f"sparse_gemm_{dtype}_pair")[(pairs,)]
    for name, launch in variants.items():
        row[f"{name}_err"], row[name] = checked_time(
            lambda launch=launch: launch(vals_t, meta_t, b, c, m, n, k, meta.shape[1], n, BN=bn))
    try:
        comp = torch._cslt_compress(w)
        bt = b.T
        row["cslt"] = profile_kernel_time(lambda: torch._cslt_sparse_mm(comp, bt, out_dtype=torch.float16)
                                          if dtype == "e4m3" else torch._cslt_sparse_mm(comp, bt), iters)
    except Exception as e:  # cuSPARSELt may not take this dtype/shape
        row["cslt"] = None
        row["cslt_error"] = f"{type(e).__name__}: {str(e)[:80]}"
    if dtype != "e4m3":
        row["cublas"] = profile_kernel_time(lambda: torch.mm(w, b.T), iters)
        dkern = getattr(dense_mod, f"dense_gemm_{dtype}")[grid]
        wd = w.contiguous()
        row["sp_dense"] = profile_kernel_time(lambda: dkern(wd, b, c, m, n, k, n, BN=bn), iters)
        row["dense_err"] = ((c.float() - ref).abs().max() / scale).item()
    else:
        try:
            one = torch.tensor(1.0, device="cuda")
            row["cublas"] = profile_kernel_time(lambda: torch._scaled_mm(w, b.T, scale_a=one, scale_b=one,
                                                                         out_dtype=torch.float16), iters)
        except Exception:
            row["cublas"] = None
        row["sp_dense"] = None
    return row


def run_isolated(dtype: str, m: int, n: int, k: int, iters: int, timeout: float) -> dict:
    """One case in a child process (kernels come from the compile cache on disk after the first)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--iters", str(iters),
           "--case", f"{dtype}:{m}x{n}x{k}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(lines[-1])


HEADER = (f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} {'sk':>2} | {'sparsile':>9} {'TF':>5} | "
          f"{'persist.':>9} {'TF':>5} | {'pair':>9} {'TF':>5} | {'cuSPARSELt':>9} {'TF':>5} | "
          f"{'cuBLAS':>9} {'TF':>5} | {'sp.dense':>9} {'TF':>5} | {'vs cslt':>7} {'dense/cuBLAS':>12} {'err':>7}")


def format_row(r: dict) -> str:
    f = 2.0 * r["m"] * r["n"] * r["k"]
    ours = r.get("pair") or r["sparsile"]  # what sparse_matmul runs
    vs = f"{r['cslt'] / ours:>7.2f}" if r.get("cslt") else f"{'-':>7}"
    dv = f"{r['cublas'] / r['sp_dense']:>12.2f}" if r.get("sp_dense") and r.get("cublas") else f"{'-':>12}"
    err = max(r["err"], r.get("persistent_err", 0.0), r.get("pair_err", 0.0))
    return (f"{r['dtype']:>5} {r['m']:>6} {r['n']:>6} {r['k']:>6} {r.get('split', 1):>2} | {fmt(r['sparsile'], f)} | "
            f"{fmt(r.get('persistent'), f)} | {fmt(r.get('pair'), f)} | {fmt(r.get('cslt'), f)} | "
            f"{fmt(r.get('cublas'), f)} | {fmt(r.get('sp_dense'), f)} | {vs} {dv} {err:>7.1e}")


def fmt(t: float | None, flops: float) -> str:
    if t is None:
        return f"{'-':>9} {'-':>5}"
    return f"{t:>9.1f} {flops / t / 1e6:>5.0f}"


def main() -> None:
    import sparsile as sp

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--case", action="append", default=[],
                    help="only this case, e.g. f16:8192x8192x8192 (repeatable)")
    ap.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                    help="measure each case in a fresh process (default; a long in-process run once stalled "
                         "for minutes inside one case that takes seconds on its own)")
    ap.add_argument("--case-timeout", type=float, default=180.0, help="seconds allowed per isolated case")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sp_mod = sp.load(ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90.spk")
    dense_mod = sp.load(ROOT / "stdlib" / "kernels" / "dense_gemm_sm90.spk")
    cases: list[tuple[str, int, int, int]] = []
    if args.quick:
        cases = [("f16", 4096, 4096, 4096), ("f16", 8192, 8192, 8192)]
    else:
        for dt in ("f16", "bf16"):
            cases += [(dt, *s) for s in SQUARES]
        cases += [("e4m3", 8192, 8192, 8192)]
        for (out, inp), tokens in LLM:
            for t in tokens:
                cases += [("f16", out, t, inp), ("bf16", out, t, inp)]
    if args.case:
        cases = []
        for spec in args.case:
            dt, dims = spec.split(":")
            m, n, k = (int(x) for x in dims.split("x"))
            cases.append((dt, m, n, k))
    if args.json:  # one case, measured in this process, as one JSON line (the --isolate child)
        for dt, m, n, k in cases:
            print(json.dumps(bench_case(sp_mod, dense_mod, dt, m, n, k, args.iters)), flush=True)
        return
    rows = []
    print(HEADER, flush=True)
    for dt, m, n, k in cases:
        started = time.perf_counter()
        if args.isolate:
            r = run_isolated(dt, m, n, k, args.iters, args.case_timeout)
        else:
            r = bench_case(sp_mod, dense_mod, dt, m, n, k, args.iters)
        if "error" in r:
            print(f"{dt:>5} {m:>6} {n:>6} {k:>6}: {r['error']} ({time.perf_counter() - started:.0f} s)", flush=True)
            continue
        rows.append(r)
        print(format_row(r), flush=True)  # as it comes, so a run stopped early still shows its rows
    print()
    print(HEADER)
    for r in rows:
        print(format_row(r))
    print("times: us per call, CUDA profiler kernel time; TF: effective TFLOP/s = 2MNK/t (sparse and dense alike);")
    print("sk = split-K shares (sparse_matmul's choice: choose_split_k; the time includes splitk_reduce);")
    print("persist. = the one-CTA kernel on one CTA per SM (each computing several tiles; '-' when there are no")
    print("more tiles than SMs); pair = the CTA-pair kernel (B multicast, persistent), which sparse_matmul runs for")
    print("large C ('-' where it does not); vs cslt = cuSPARSELt time / the time of sparse_matmul's choice (pair")
    print("where shown, else one CTA per tile); e4m3 cuBLAS column is")
    print("torch._scaled_mm; err = max |C - ref| / max |ref| over both sparsile runs (ref: the same inputs")
    print("multiplied in float64 on the GPU)")


if __name__ == "__main__":
    main()
