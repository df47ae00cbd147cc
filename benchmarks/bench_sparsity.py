"""Host-side sparsity toolkit throughput: prune + compress + encode of a large matrix on the CPU.

Target (issue 4): a 16384 x 16384 f16 matrix is pruned to 2:4, compressed and encoded in the
tcgen05 format in under 2 s on the 2-core CI machine. Each step is timed separately (best of
``--repeats`` runs, input generation excluded) and printed as a table::

    python benchmarks/bench_sparsity.py                    # f16, 16384 x 16384
    python benchmarks/bench_sparsity.py --dtypes f16 e4m3 tf32 --size 8192
    python benchmarks/bench_sparsity.py --workers 1        # single thread
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np
from sparsile.stdlib.sparsity import compress, encode_metadata, operand_type, prune

TARGET_SECONDS = 2.0


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        result = None  # free the previous result before timing the next run
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_dtype(dtype: str, size: int, repeats: int, workers: int | None) -> list[tuple[str, float]]:
    """Seconds for prune, compress, encode (tcgen05, sm90) of a random (size, size) ``dtype`` matrix."""
    op = operand_type(dtype)
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((size, size), dtype=np.float32).astype(op.host_dtype)
    prune_s, pruned = _best(lambda: prune(dense, dtype), repeats)
    compress_s, (_, indices) = _best(lambda: compress(pruned, dtype, workers=workers), repeats)
    rows = [("prune", prune_s), ("compress", compress_s)]
    for fmt in ("tcgen05", "sm90"):
        if fmt == "sm90" and op.width_class == "4-bit":
            continue
        seconds, _ = _best(lambda fmt=fmt: encode_metadata(indices, fmt, dtype), repeats)
        rows.append((f"encode {fmt}", seconds))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16384, help="M = K of the matrix (default 16384)")
    parser.add_argument("--dtypes", nargs="+", default=["f16"], help="operand types (default f16)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per step; the best is reported")
    parser.add_argument("--workers", type=int, default=None, help="threads for compress (default: auto)")
    args = parser.parse_args(argv)

    print(f"sparsity toolkit, {args.size} x {args.size}, best of {args.repeats}, numpy {np.__version__}")
    print(f"{'dtype':<6} {'step':<16} {'seconds':>8} {'GB/s':>7}")
    ok = True
    for dtype in args.dtypes:
        op = operand_type(dtype)
        gigabytes = args.size * args.size * op.host_dtype.itemsize / 1e9
        rows = bench_dtype(dtype, args.size, args.repeats, args.workers)
        for step, seconds in rows:
            print(f"{dtype:<6} {step:<16} {seconds:8.3f} {gigabytes / seconds:7.2f}")
        total = sum(seconds for step, seconds in rows if step in ("prune", "compress", "encode tcgen05"))
        verdict = ""
        if dtype == "f16" and args.size == 16384:
            verdict = "  PASS (< 2 s)" if total < TARGET_SECONDS else "  FAIL (target < 2 s)"
            ok = ok and total < TARGET_SECONDS
        print(f"{dtype:<6} {'prune+compress+encode':<16} {total:8.3f}{verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
