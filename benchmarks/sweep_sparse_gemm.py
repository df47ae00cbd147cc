"""Correctness sweep of the Hopper sparse GEMM kernels on the GPU: every dtype (f16, bf16, e4m3,
s8, tf32) over square, ragged and LLM shapes, against a float64 reference with per-dtype bounds,
outputs poisoned (NaN / sentinel) before each run. Prints one summary table; exits 1 on any failure.

    python benchmarks/sweep_sparse_gemm.py [--quick] [--dtype tf32 ...]

Bounds: f16/bf16/e4m3 outputs are f16 (half an ulp of |ref|) plus the accumulation error — f32 for
16-bit and tf32 (1e-3·sqrt(K) absolute; the tf32 reference reads its f32 inputs as the H200 does,
low 13 mantissa bits dropped), Hopper's ~14-bit fp8 accumulator for e4m3
((K/64)·2^-13·Σ|a||b|, DeepSeek-V3 §3.3.2); s8 accumulates exactly in s32 (bound 0).
K is padded with zero columns to the TMA row granularity (the kernels need rows of 16-byte multiples).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SQUARES = [64, 128, 1000, 4096, 8192]
RAGGED = [(1000, 777, 4097), (129, 4097, 1000), (4097, 1000, 1000)]
LLM = [(14336, 16, 4096), (4096, 128, 14336), (28672, 64, 8192)]
K_ALIGN = {"f16": 16, "bf16": 16, "e4m3": 32, "s8": 32, "tf32": 8}
DTYPES = ("f16", "bf16", "e4m3", "s8", "tf32")


def make(dtype: str, m: int, n: int, k: int, rng: np.random.Generator):
    import ml_dtypes

    from sparsile.stdlib import sparsity as S

    kp = -(-k // K_ALIGN[dtype]) * K_ALIGN[dtype]
    if dtype == "s8":
        dense = rng.integers(-100, 100, (m, k)).astype(np.int8)
        b = rng.integers(-100, 100, (n, k)).astype(np.int8)
        w = S.prune_2_4(dense)
    elif dtype == "tf32":
        w = S.prune_1_2(rng.standard_normal((m, k)).astype(np.float32))
        b = rng.standard_normal((n, k)).astype(np.float32)
    else:
        host = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
        w = S.prune_2_4(rng.standard_normal((m, k)).astype(np.float32)).astype(host)
        b = rng.standard_normal((n, k)).astype(host)
    wp = np.zeros((m, kp), w.dtype)
    wp[:, :k] = w
    bp = np.zeros((n, kp), b.dtype)
    bp[:, :k] = b
    vals, idx = S.compress(wp, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data)
    wf, bf = w.astype(np.float64), b.astype(np.float64)
    if dtype == "tf32":  # the tensor cores read f32 data as tf32 by dropping 13 mantissa bits (H200)
        from sparsile.frontend.ops.core import tf32_truncate

        wf = tf32_truncate(w).astype(np.float64)
        bf = tf32_truncate(b).astype(np.float64)
    return vals, meta, bp, matmul_f64(wf, bf.T), matmul_f64(np.abs(wf), np.abs(bf).T), kp


def matmul_f64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x @ y in float64: on the GPU through torch when it is there (the 8192-cubed references take
    seconds each on a CPU), else numpy. Both are IEEE float64 products."""
    try:
        import torch

        if torch.cuda.is_available():
            return (torch.from_numpy(x).cuda() @ torch.from_numpy(np.ascontiguousarray(y)).cuda()).cpu().numpy()
    except ImportError:
        pass
    return x @ y


def bound(dtype: str, ref: np.ndarray, absprod: np.ndarray, k: int) -> np.ndarray:
    if dtype == "s8":
        return np.zeros_like(ref)
    out_ulp = 2.0 ** -11 * np.abs(ref) if dtype != "tf32" else 2.0 ** -24 * np.abs(ref)
    if dtype == "e4m3":
        return out_ulp + (k // 64 + 1) * 2.0 ** -13 * absprod + 1e-3
    if dtype == "tf32":  # inputs exactly as the MMA reads them: only f32 accumulation error remains
        return out_ulp + 1e-3 * np.sqrt(k)
    return out_ulp + 1e-3 * np.sqrt(k)


def main() -> None:
    import sparsile as sp

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", action="append", choices=DTYPES, default=None, help="only these dtypes (repeatable)")
    args = ap.parse_args()
    mod = sp.load(ROOT / "stdlib" / "kernels" / "sparse_gemm_sm90.spk")
    shapes = [(s, s, s) for s in (SQUARES[:4] if args.quick else SQUARES)] + RAGGED + ([] if args.quick else LLM)
    rng = np.random.default_rng(2026)
    rows = []
    failures = 0
    for dtype in args.dtype or DTYPES:
        for m, n, k in shapes:
            vals, meta, b, ref, absprod, kp = make(dtype, m, n, k, rng)
            out_dt = {"s8": np.int32, "tf32": np.float32}.get(dtype, np.float16)
            c = np.full((m, n), np.iinfo(np.int32).min if dtype == "s8" else np.nan, out_dt)
            bn = 128 if dtype == "tf32" else 256
            kern = getattr(mod, f"sparse_gemm_{dtype}")
            kern[(((m + 127) // 128) * ((n + bn - 1) // bn),)](vals, meta, b, c, m, n, kp, meta.shape[1], n, BN=bn)
            unwritten = int(np.sum(c == np.iinfo(np.int32).min)) if dtype == "s8" else int(np.isnan(c).sum())
            err = np.abs(c.astype(np.float64) - ref)
            ok = unwritten == 0 and bool((err <= bound(dtype, ref, absprod, kp)).all())
            failures += not ok
            rows.append((dtype, m, n, k, float(err.max()), float(np.abs(ref).max()), unwritten, ok))
            print(f"{dtype:>5} {m:>6}x{n:<6}x{k:<6} max err {err.max():.3e} ({'ok' if ok else 'FAIL'})", flush=True)
    print()
    print(f"{'dtype':>5} {'M':>6} {'N':>6} {'K':>6} {'max |err|':>10} {'max |ref|':>10} {'unwritten':>9} result")
    for dtype, m, n, k, e, r, u, ok in rows:
        print(f"{dtype:>5} {m:>6} {n:>6} {k:>6} {e:>10.3e} {r:>10.3e} {u:>9} {'ok' if ok else 'FAIL'}")
    print(f"{len(rows) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
