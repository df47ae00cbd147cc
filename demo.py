"""``sparsile demo``: the 2:4 sparse GEMM end to end, with a short, honest report of what ran.

    C (M x N) = decompress(A_values, A_meta) (M x K) @ B^T

1. prune a random weight to 2:4 and compress it (values + "sm90" metadata, the sparsity toolkit);
2. compile ``stdlib/kernels/sparse_gemm_sm90.spk`` for sm_90a (source to cubin through nvJitLink,
   no GPU needed), and the Blackwell kernel ``sparse_gemm_sm100_persistent.spk`` (the one
   ``sparse_matmul`` runs there) for sm_100a when this installation has it;
3. on a machine with an NVIDIA GPU, run the kernel there and check C against a float64 reference;
4. run the same kernel in the CPU interpreter on a small problem and check it the same way.

Exit status 0 when everything that ran passed, 1 otherwise. Runs in seconds on a CPU.

    sparsile demo [--dtype f16|bf16|e4m3] [--size M N K] [--cpu]      (or python -m sparsile.demo)
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent / "stdlib" / "kernels"
BLACKWELL_FILE = KERNEL_DIR / "sparse_gemm_sm100_persistent.spk"  # what sparse_matmul runs on sm_100a
INTERPRETER_SIZE = (200, 130, 192)  # ragged in M and N: masking is exercised
DTYPES = ("f16", "bf16", "e4m3")
DEFAULT_SIZE = (2048, 2048, 2048)  # the GPU run's problem unless --size gives one
MAX_SIZE = 32768  # the GPU run's operands are made on the host first (M x K and N x K float64 normals: 8 GiB)


@dataclass
class Step:
    """One line of the report."""

    name: str
    status: str  # "ok", "FAILED", "skipped"
    detail: str
    seconds: float | None = None

    def line(self) -> str:
        took = f" ({self.seconds:.2f} s)" if self.seconds is not None else ""
        return f"  [{self.status:^7}] {self.name:<24} {self.detail}{took}"


def error_bound(dtype: str, ref: np.ndarray, abs_products: np.ndarray, k: int) -> np.ndarray:
    """Elementwise error allowed between the kernel's C and the float64 reference: half an ulp of
    the f16 output plus the accumulation error, f32 for 16-bit operands (1e-3·sqrt(K) absolute) and
    Hopper's ~14-bit accumulator for e4m3 ((K/64 + 1)·2^-13·Σ|a||b|; DeepSeek-V3 report §3.3.2),
    the bounds of benchmarks/sweep_sparse_gemm.py."""
    out_ulp = 2.0 ** -11 * np.abs(ref)
    if dtype == "e4m3":
        return out_ulp + (k // 64 + 1) * 2.0 ** -13 * abs_products + 1e-3
    return out_ulp + 1e-3 * np.sqrt(k)


def check(c: Any, a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[bool, str]:
    """Compare C with the float64 product of the dense operands; (passed, one-line summary)."""
    from .stdlib.sparsity import as_host_array

    c64 = as_host_array(c, "C").astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64.T
    err = np.abs(c64 - ref)
    bound = error_bound(dtype, ref, np.abs(a64) @ np.abs(b64).T, a.shape[1])
    unwritten = int(np.isnan(c64).sum())
    ok = unwritten == 0 and bool((err <= bound).all())
    worst = float((err / bound).max()) if err.size else 0.0
    detail = f"max |C - ref| {err.max():.2e} (max |ref| {np.abs(ref).max():.1f}), worst err/bound {worst:.2f}"
    if unwritten:
        detail += f", {unwritten} unwritten (NaN) outputs"
    return ok, detail


def operands(dtype: str, m: int, n: int, k: int, seed: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """A random weight pruned and compressed, its dense pruned twin, and B, in the operand dtype."""
    from .stdlib.kernels import prune_and_compress
    from .stdlib.sparsity import operand_type

    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), dtype)
    b = rng.standard_normal((n, k)).astype(np.float32).astype(operand_type(dtype).host_dtype)
    return weight, weight.dense(), b


def mma_instruction(ptx: str) -> str:
    """The first sparse tensor-core MMA in a kernel's PTX (what the hardware will run), or a note."""
    found = re.search(r"\b(wgmma\.mma_async\.sp|tcgen05\.mma\.sp|mma\.sp)[\w.:]*", ptx)
    return found.group(0) if found else "no sparse MMA instruction"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def step_compress(dtype: str, size: tuple[int, int, int]) -> tuple[Step, Any]:
    m, _, k = size
    (weight, dense, b), took = timed(lambda: operands(dtype, *size, seed=0))
    meta = weight.meta
    kept = np.count_nonzero(dense) / max(dense.size, 1)
    return Step("prune + compress", "ok", f"A {m}x{k} {dtype} -> values {weight.values.shape[0]}x"
                f"{weight.values.shape[1]}, sm90 metadata {meta.shape[0]}x{meta.shape[1]} words, "
                f"{kept:.0%} nonzero", took), (weight, dense, b)


def step_compile_hopper(dtype: str, problem: Any) -> Step:
    from .stdlib.kernels import plan_sparse_matmul

    weight, _, b = problem
    plan = plan_sparse_matmul(weight.values, weight.meta, b, kernel="gemm")
    try:
        ck, took = timed(lambda: plan.compile("sm_90a"))
    except Exception as e:  # a compiler bug or a broken installation: report it, do not crash
        return Step("compile sm_90a", "FAILED", f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return Step("compile sm_90a", "ok", f"sparse_gemm_sm90.spk::{plan.choice.kernel} (BN={plan.bn}) -> cubin "
                f"{len(ck.cubin)} B, {ck.smem_bytes // 1024} KiB smem, {ck.num_warps} warps, "
                f"{mma_instruction(ck.ptx)}", took)


def step_compile_blackwell(dtype: str) -> list[Step]:
    if not BLACKWELL_FILE.exists():
        return [Step("compile sm_100a", "skipped", f"{BLACKWELL_FILE.name} is not in this installation: the "
                     "Blackwell (tcgen05) kernel is compiled and checked elsewhere")]
    from . import load
    from .frontend.ir import types as T

    try:
        module = load(BLACKWELL_FILE)
    except Exception as e:
        return [Step("compile sm_100a", "FAILED", f"{BLACKWELL_FILE.name}: {type(e).__name__}: "
                     f"{str(e).splitlines()[0]}")]
    # the GEMM the demo shows (the file's sparse_linear_* kernels need the epilogue module's loader)
    names = [n for n in module.kernels if n == f"sparse_gemm_{dtype}"] or sorted(module.kernels)[:1]
    steps = []
    for name in names:
        kernel = module.kernels[name]
        if any(p.annotation is None or (p.annotation is T.CONSTEXPR and not p.has_default) for p in kernel.params):
            steps.append(Step("compile sm_100a", "skipped", f"{name}: needs a signature the demo cannot infer"))
            continue
        signature = {p.name: p.annotation for p in kernel.params if p.annotation is not T.CONSTEXPR}
        try:
            ck, took = timed(lambda kernel=kernel, signature=signature: kernel.compile(signature, target="sm_100a"))
        except Exception as e:
            steps.append(Step("compile sm_100a", "FAILED", f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}"))
            continue
        steps.append(Step("compile sm_100a", "ok", f"{BLACKWELL_FILE.name}::{name} -> cubin {len(ck.cubin)} B, "
                          f"{mma_instruction(ck.ptx)}", took))
    return steps


def step_run(dtype: str, problem: Any, interpret: bool) -> Step:
    from .stdlib.kernels import sparse_matmul

    weight, dense, b = problem
    m, n, k = dense.shape[0], b.shape[0], dense.shape[1]
    where = "interpreter (CPU)" if interpret else "GPU run"
    try:
        c, took = timed(lambda: sparse_matmul(weight.values, weight.meta, b, interpret=interpret))
    except Exception as e:
        return Step(where, "FAILED", f"{m}x{n}x{k}: {type(e).__name__}: {str(e).splitlines()[0]}")
    ok, detail = check(c, dense, b, dtype)
    return Step(where, "ok" if ok else "FAILED", f"{m}x{n}x{k} {dtype}: {detail}", took)


def gpu_name() -> str | None:
    from .backend import runtime

    if not runtime.has_gpu():
        return None
    dev = runtime.current_device()
    return f"{getattr(dev, 'name', 'GPU')} (sm_{dev.compute_capability[0]}{dev.compute_capability[1]})"


def _positive_int(text: str) -> int:
    """An argparse type: a problem size of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1, got {value}")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"sizes go up to {MAX_SIZE}, got {value}")
    return value


DESCRIPTION = ("The 2:4 sparse GEMM end to end: prune and compress a random weight, compile the Hopper (sm_90a) "
               "and Blackwell (sm_100a) kernels (no GPU needed), run the Hopper kernel on the GPU if there is one "
               "and check it against float64, and always run it in the CPU interpreter on a small problem. "
               "Exit status 0 when everything that ran passed, 1 otherwise.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sparsile demo", description=DESCRIPTION)
    ap.add_argument("--dtype", choices=DTYPES, default="f16", help="operand type (default f16)")
    ap.add_argument("--size", nargs=3, type=_positive_int, metavar=("M", "N", "K"), default=None,
                    help=f"problem size of the GPU run, each up to {MAX_SIZE} (default "
                         f"{' '.join(map(str, DEFAULT_SIZE))}; without a GPU run, not used)")
    ap.add_argument("--cpu", action="store_true", help="do not use a GPU even if there is one")
    if argv and argv[0] == "--":  # `sparsile demo -- --dtype e4m3` hands the separator through
        argv = argv[1:]
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    from . import __version__

    gpu = None if args.cpu else gpu_name()
    print(f"sparsile {__version__} demo: 2:4 sparse GEMM  C = decompress(A_values, A_meta) @ B^T "
          f"({args.dtype}, C in f16)")
    print(f"  machine: {platform.machine()}, Python {platform.python_version()}, GPU: "
          f"{gpu or ('not used (--cpu)' if args.cpu else 'none found')}")
    sys.stdout.flush()
    steps: list[Step] = []

    def report(step: Step) -> None:
        steps.append(step)
        print(step.line(), flush=True)

    step, small_problem = step_compress(args.dtype, INTERPRETER_SIZE)
    report(step)
    report(step_compile_hopper(args.dtype, small_problem))
    for s in step_compile_blackwell(args.dtype):
        report(s)
    size = tuple(args.size or DEFAULT_SIZE)
    if gpu is None and args.size is not None:  # say so, rather than let the interpreter's size pass for it
        report(Step("GPU run", "skipped", f"{'x'.join(map(str, size))}: not run "
                    f"({'--cpu' if args.cpu else 'no GPU found'}); --size sets the GPU run's problem only"))
    if gpu is not None:
        try:
            step, problem = step_compress(args.dtype, size)
        except (MemoryError, ValueError) as e:  # too large for this host: report it, do not crash
            step, problem = Step("prune + compress", "FAILED", f"{'x'.join(map(str, size))}: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'out of memory'}"), None
        report(step)
        if problem is not None:
            report(step_run(args.dtype, problem, interpret=False))
    report(step_run(args.dtype, small_problem, interpret=True))
    counts = {status: sum(s.status == status for s in steps) for status in ("ok", "skipped", "FAILED")}
    ran_on = "on the GPU and in the interpreter" if gpu else "in the interpreter only (no GPU run here)"
    print(f"result: {'FAILED' if counts['FAILED'] else 'OK'} ({counts['ok']} ok, {counts['skipped']} skipped, "
          f"{counts['FAILED']} failed); the kernel's numbers were checked {ran_on}; "
          f"{time.perf_counter() - started:.1f} s in all")
    failed = counts["FAILED"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
