"""Front-end latency: parse + sema of the example kernels in a warm process.

Run: ``python benchmarks/bench_frontend.py [--reps N]``. The grammar's parse tables are built once
per process (and cached on disk by Lark), so the first parse of a process is reported separately
("first parse"); every other row is the median of ``--reps`` runs after that. The target for
parse + sema of ``examples/softmax.spk`` is under 20 ms.

Rows:
  parse            text -> AST (``parse_module``)
  module           AST -> module (decorators, constants, imports, parameter annotations)
  sema             AST -> typed IR for one specialization (not cached: a fresh Sema each run)
  parse + sema     the sum a user pays for a new kernel source
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
TARGET_MS = 20.0

# A specialization for each example kernel (run-time types and constexpr values).
SIGNATURES = {
    "softmax": ("softmax", "x=ptr[f32], out=ptr[f32], n_rows=i32, n_cols=i32, stride=i32, BLOCK=1024, ROWS=4"),
    "vector_add": ("vector_add", "x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32, BLOCK=1024"),
    "transpose": ("transpose", "x=ptr[f32], out=ptr[f32], m=i32, n=i32, stride_x=i32, stride_out=i32, BM=32, BN=32"),
}


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(name: str, reps: int) -> dict[str, list[float]]:
    import sparsile  # noqa: F401  (registers the ops)
    from sparsile.driver.module import KernelModule
    from sparsile.frontend.sema.core import Sema
    from sparsile.frontend.sema.specialize import parse_signature
    from sparsile.frontend.syntax.parser import parse_module

    text = (EXAMPLES / f"{name}.spk").read_text()
    kernel_name, sig_text = SIGNATURES[name]
    module = KernelModule(name, parse_module(text, f"{name}.spk"))
    kernel = module.kernels[kernel_name]
    signature = parse_signature(sig_text, module._resolve)
    bindings, _ = kernel.signature_bindings(signature)

    def sema() -> object:
        return Sema(kernel.globals, kernel.source.name).kernel(kernel.node, bindings, {"num_warps": 4})

    def everything() -> object:
        m = KernelModule(name, parse_module(text, f"{name}.spk"))
        k = m.kernels[kernel_name]
        b, _ = k.signature_bindings(signature)
        return Sema(k.globals, k.source.name).kernel(k.node, b, {"num_warps": 4})

    tree = parse_module(text, f"{name}.spk")
    return {
        "parse": timed(lambda: parse_module(text, f"{name}.spk"), reps),
        "module": timed(lambda: KernelModule(name, tree), reps),
        "sema": timed(sema, reps),
        "parse + sema": timed(everything, reps),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50, help="runs per row (default 50)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    import sparsile  # noqa: F401
    import_ms = (time.perf_counter() - t0) * 1e3
    from sparsile.frontend.syntax.parser import parse_module

    t0 = time.perf_counter()
    parse_module("x = 1\n", "warmup.spk")  # builds (or loads) the grammar's parse tables
    first_ms = (time.perf_counter() - t0) * 1e3

    print(f"import sparsile: {import_ms:.1f} ms; first parse (grammar tables): {first_ms:.1f} ms; "
          f"{args.reps} runs per row")
    print()
    header = f"| {'example':<11} | {'stage':<12} | {'median ms':>9} | {'min ms':>7} | {'p90 ms':>7} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    verdict = True
    for name in SIGNATURES:
        for stage, samples in measure(name, args.reps).items():
            samples.sort()
            med = statistics.median(samples)
            p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))]
            print(f"| {name:<11} | {stage:<12} | {med:9.2f} | {samples[0]:7.2f} | {p90:7.2f} |")
            if name == "softmax" and stage == "parse + sema":
                verdict = med < TARGET_MS
                softmax_ms = med
    print()
    print(f"softmax.spk parse + sema: {softmax_ms:.2f} ms (target < {TARGET_MS:.0f} ms): "
          f"{'met' if verdict else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
