"""Correctness sweep of the Hopper sparse GEMM kernels on the GPU: every dtype (f16, bf16, e4m3,
s8, tf32) over square, ragged and LLM shapes, against a float64 reference with per-dtype bounds,
outputs poisoned (NaN / sentinel) before each run. Prints one summary table; exits 1 on any failure.

    python benchmarks/sweep_sparse_gemm.py [--quick] [--dtype tf32 ...] [--tuned]
    python benchmarks/sweep_sparse_gemm.py --tuned-only [--kind gemm|linear|decode]
        [--skip N] [--entries N] [--max-seconds S]

``--tuned`` adds (``--tuned-only`` runs alone) the check of every configuration of the shipped tuned
tables (stdlib/kernels/tuned/h200.json: sparse_matmul's and the layer's entries;
decode-h200.json: the decode kernel's), each through the path its readers take (sweep_tuned.py),
with the same operands, poisoning and bounds; smallest weights first, ``--entries`` /
``--max-seconds`` bound the run.

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
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SQUARES = [64, 128, 1000, 4096, 8192]
RAGGED = [(1000, 777, 4097), (129, 4097, 1000), (4097, 1000, 1000)]
LLM = [(14336, 16, 4096), (4096, 128, 14336), (28672, 64, 8192)]
K_ALIGN = {"f16": 16, "bf16": 16, "e4m3": 32, "s8": 32, "tf32": 8}
DTYPES = ("f16", "bf16", "e4m3", "s8", "tf32")


def host_weight(dtype: str, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random (m, k) weight in ``dtype``'s host type, 2:4-pruned (tf32: 1:2)."""
    from sparsile.stdlib import sparsity as S

    if dtype == "s8":
        return S.prune_2_4(rng.integers(-100, 100, (m, k)).astype(np.int8))
    if dtype == "tf32":
        return S.prune_1_2(rng.standard_normal((m, k)).astype(np.float32))
    return S.prune_2_4(rng.standard_normal((m, k)).astype(np.float32)).astype(host_type(dtype))


def host_b(dtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random dense (n, k) operand (B of the GEMM, x of the layer) in ``dtype``'s host type."""
    if dtype == "s8":
        return rng.integers(-100, 100, (n, k)).astype(np.int8)
    if dtype == "tf32":
        return rng.standard_normal((n, k)).astype(np.float32)
    return rng.standard_normal((n, k)).astype(host_type(dtype))


def host_type(dtype: str) -> Any:
    """The numpy element type of f16, bf16 and e4m3 operands."""
    import ml_dtypes

    return {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]


def padded(x: np.ndarray, kp: int) -> np.ndarray:
    """``x`` (rows, k) with zero columns up to ``kp``."""
    out = np.zeros((x.shape[0], kp), x.dtype)
    out[:, :x.shape[1]] = x
    return out


def compressed(wp: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, "sm90" metadata words) of a pruned, padded weight."""
    from sparsile.stdlib import sparsity as S

    vals, idx = S.compress(wp, dtype)
    return vals, np.asarray(S.encode_metadata(idx, "sm90", dtype).data)


def as_f64(dtype: str, x: np.ndarray) -> np.ndarray:
    """``x`` in float64 as the tensor cores read it (tf32: f32 with 13 mantissa bits dropped, H200)."""
    if dtype == "tf32":
        from sparsile.frontend.interp.numerics import tf32_truncate

        return tf32_truncate(x).astype(np.float64)
    return x.astype(np.float64)


def make(dtype: str, m: int, n: int, k: int, rng: np.random.Generator):
    kp = -(-k // K_ALIGN[dtype]) * K_ALIGN[dtype]
    w = host_weight(dtype, m, k, rng)
    b = host_b(dtype, n, k, rng)
    vals, meta = compressed(padded(w, kp), dtype)
    wf, bf = as_f64(dtype, w), as_f64(dtype, b)
    return vals, meta, padded(b, kp), matmul_f64(wf, bf.T), matmul_f64(np.abs(wf), np.abs(bf).T), kp


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


OUT_HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}
"""Half an ulp of an output type, relative to the value (the rounding of a correct result)."""


def bound(dtype: str, ref: Any, absprod: Any, k: int, out: str = "") -> Any:
    """The largest error allowed against the float64 ``ref`` (a numpy array or a torch tensor, and
    ``absprod`` alike); ``out``: the output's numpy type name (default: the sparse GEMM's, f16 or,
    for tf32, f32)."""
    if dtype == "s8":
        return 0 * ref
    out_ulp = OUT_HALF_ULP.get(out, 2.0 ** -24 if dtype == "tf32" else 2.0 ** -11) * abs(ref)
    if dtype == "e4m3":
        return out_ulp + (k // 64 + 1) * 2.0 ** -13 * absprod + 1e-3
    if dtype == "tf32":  # inputs exactly as the MMA reads them: only f32 accumulation error remains
        return out_ulp + 1e-3 * np.sqrt(k)
    return out_ulp + 1e-3 * np.sqrt(k)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--tuned`` / ``--tuned-only``: the tuned tables' configs, sweep_tuned.py)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", action="append", choices=DTYPES, default=None,
                    help="only these dtypes (repeatable; the tuned tables' entries too)")
    ap.add_argument("--tuned", action="store_true", help="also check every config of the tuned tables")
    ap.add_argument("--tuned-only", action="store_true", help="only check the tuned tables' configs")
    ap.add_argument("--kind", action="append", choices=("gemm", "linear", "decode"), default=None,
                    help="tuned entries of these kinds only (repeatable; default all)")
    ap.add_argument("--skip", type=count, default=0, help="skip the first N tuned entries (resume a bounded run)")
    ap.add_argument("--entries", type=positive, default=None, help="check at most N tuned entries (smallest first)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no tuned entry after this many seconds (the one running finishes)")
    ap.add_argument("--table", type=Path, default=None, help="the sparse GEMM / linear table (default tuned/h200.json)")
    ap.add_argument("--decode-table", type=Path, default=None,
                    help="the decode table (default tuned/decode-h200.json)")
    return ap.parse_args(argv)


def positive(text: str) -> int:
    """An argument that must be an integer of at least 1."""
    return count(text, 1)


def count(text: str, least: int = 0) -> int:
    """An argument that must be an integer of at least ``least``."""
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"must be an integer of at least {least}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> None:
    from sparsile.backend import runtime

    args = parse_args(argv)
    if not runtime.has_gpu():
        print("sweep_sparse_gemm.py checks the kernels on a GPU: no NVIDIA GPU is available (the CPU tests "
              "run the tuned check in the interpreter: tests/test_sweep_tuned.py)", file=sys.stderr)
        sys.exit(2)
    failures = 0 if args.tuned_only else sweep(args)
    if args.tuned or args.tuned_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import sweep_tuned as st  # a sibling script (the benchmarks are no package)

        from sparsile.frontend.diagnostics import SparsileError

        try:
            tables = st.Tables(st.read_table(args.table or st.GEMM_TABLE),
                               st.read_table(args.decode_table or st.DECODE_TABLE))
            st.table_cases(tables)  # a table that is none: SP0779, SP0862, SP0863
        except (OSError, ValueError, SparsileError) as e:
            why = f"{e.filename}: {e.strerror}" if isinstance(e, OSError) else str(e)
            print(f"sweep_sparse_gemm.py: cannot read the tuned tables: {why}", file=sys.stderr)
            sys.exit(2)
        print(st.HEADER, flush=True)
        rows, bad, left = st.check_tables(tables, kinds=tuple(args.kind or st.KINDS), skip=args.skip,
                                          entries=args.entries, max_seconds=args.max_seconds,
                                          say=lambda line: print(line, flush=True),
                                          dtypes=tuple(args.dtype) if args.dtype else None,
                                          device=st.operand_device())
        failures += st.report(rows, bad, left, args.skip)
    sys.exit(1 if failures else 0)


def sweep(args: argparse.Namespace) -> int:
    """The sweep of the kernels over dtypes and shapes; prints its table, returns the failures."""
    import sparsile as sp

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
    return failures


if __name__ == "__main__":
    main()
