"""Compile latency on the CPU (no GPU needed): source text to cubin, for every example kernel and
the Hopper sparse and dense GEMM, cold and warm, and the cost of a compile-cache hit.

    python benchmarks/bench_compile.py [--target sm_90a] [--reps 5] [--case NAME ...]

Columns (milliseconds unless marked):
  import     ``import sparsile`` in a fresh Python process (the package byte-compiled first, as
             ``pip install`` leaves it)
  cold       first compile in that fresh process with an empty kernel cache (``SPARSILE_CACHE_DIR``
             a new temporary folder): parse, sema, passes, LLVM, PTX, nvJitLink, and the first-use
             loading of lark, llvmlite and nvJitLink. The grammar's parse tables are present: like
             .pyc files they are built once per installation (grammar/__pycache__), not per cache
  first      the same with the parse tables missing too (``SPARSILE_GRAMMAR_CACHE`` a new temporary
             folder): the very first compile after installing, which builds them
  warm       median of --reps compiles of the same source in a warm process, nothing cached:
             ``sparsile.loads(text)`` + ``compile_kernel`` (passes/llvm/ptx/cubin: the stages' share)
  hit mem    a compile-cache hit in memory (``compile_cached``, the launch path's lookup), in µs
  hit disk   a hit read back from the disk cache after the in-memory cache was dropped
Triton's numbers for equivalent kernels (its vector-add, softmax and matmul tutorials, written for
this script) are printed when ``import triton`` works (cold: fresh process, empty cache; warm: the
same kernel again in that process with ``TRITON_ALWAYS_COMPILE=1``); it is not installed on our CPU
machine. Children run without PYTHONDONTWRITEBYTECODE (users' Pythons keep .pyc files).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """One kernel to compile: its file, kernel name and ahead-of-time signature."""

    name: str
    path: str  # relative to the repository root
    kernel: str
    signature: str  # `sparsile compile --signature` syntax


CASES = [
    Case("vector_add", "examples/vector_add.spk", "vector_add",
         "x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32, BLOCK=1024"),
    # 128 and 512 elements per thread (4 warps) of a masked program-id tile (benchmarks/downcast.spk), whose
    # compile time grew with the square of the elements per thread before the constant-offset address form
    Case("downcast_16k", "benchmarks/downcast.spk", "downcast", "x=ptr[f32], out=ptr[f16], n=i32, BLOCK=16384"),
    Case("downcast_64k", "benchmarks/downcast.spk", "downcast", "x=ptr[f32], out=ptr[f16], n=i32, BLOCK=65536"),
    # a 1 x 4096 x 16 box of a 3-D tensor through load_tile / store_tile on the generic path (512 elements per
    # thread): per-element addresses with run-time strides, quadratic in LLVM before the linear box form
    Case("load_tile3d_64k", "benchmarks/load_tile3d.spk", "load_tile3d",
         "X=tensor[bf16, 3], O=tensor[bf16, 3], BZ=1, BR=4096, BC=16"),
    Case("softmax", "examples/softmax.spk", "softmax",
         "x=ptr[f32], out=ptr[f32], n_rows=i32, n_cols=i32, stride=i32, BLOCK=1024, ROWS=4"),
    Case("transpose", "examples/transpose.spk", "transpose",
         "x=ptr[f32], out=ptr[f32], m=i32, n=i32, stride_x=i32, stride_out=i32, BM=32, BN=32"),
    Case("sparse_gemm_f16", "stdlib/kernels/sparse_gemm_sm90.spk", "sparse_gemm_f16",
         "A=tensor[f16, 2], E=meta[f16], B=tensor[f16, 2], C=ptr[f16], M=i32, N=i32, K=i32, lde=i32, ldc=i32"),
    Case("dense_gemm_f16", "stdlib/kernels/dense_gemm_sm90.spk", "dense_gemm_f16",
         "A=tensor[f16, 2], B=tensor[f16, 2], C=ptr[f16], M=i32, N=i32, K=i32, ldc=i32"),
]
HOPPER_ONLY = {"sparse_gemm_f16", "dense_gemm_f16"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="sparsile compile latency (CPU)")
    ap.add_argument("--target", default="sm_90a", help="GPU target to compile for (default sm_90a)")
    ap.add_argument("--reps", type=int, default=5, help="warm compiles per case (median reported)")
    ap.add_argument("--case", action="append", choices=[c.name for c in CASES], default=None,
                    help="only these cases (repeatable)")
    ap.add_argument("--no-triton", action="store_true", help="skip Triton even if it is installed")
    ap.add_argument("--json", action="store_true", help="print one JSON object per case instead of the table")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    return args


def selected_cases(names: list[str] | None, target: str) -> list[Case]:
    """The cases to run: all (or the named ones); the Hopper kernels only for sm_90a targets."""
    cases = [c for c in CASES if names is None or c.name in names]
    return [c for c in cases if c.name not in HOPPER_ONLY or target.startswith("sm_90")]


# ------------------------------------------------------------------------------------------------
# one case, in a fresh process (run with --child)

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import sparsile
t_import = time.perf_counter() - t0
from sparsile.driver import cache as cache_mod
from sparsile.driver.compiler import compile_cached, compile_kernel
from sparsile.target.targets import get_target
from sparsile.driver.kernel import KERNEL_OPTIONS
from sparsile.frontend.sema.specialize import parse_signature

path, kernel_name, signature_text, target_name, reps = sys.argv[1:6]
text = open(path).read()

def prepare():
    module = sparsile.loads(text, path)
    kernel = module.kernels[kernel_name]
    signature = parse_signature(signature_text, module._resolve)
    bindings, key = kernel.signature_bindings(signature)
    options = {**KERNEL_OPTIONS, **kernel.options}
    return kernel, signature, bindings, key, options

target = get_target(target_name)
t0 = time.perf_counter()
kernel, signature, bindings, key, options = prepare()
ck = compile_cached(kernel, bindings, key, target, options)
cold = time.perf_counter() - t0

hits = []
for _ in range(200):
    t0 = time.perf_counter()
    compile_cached(kernel, bindings, key, target, options)
    hits.append(time.perf_counter() - t0)
hits.sort()
disk = []
for _ in range(5):
    cache_mod.reset_default_cache()
    t0 = time.perf_counter()
    compile_cached(kernel, bindings, key, target, options)
    disk.append(time.perf_counter() - t0)
disk.sort()

warm, stages = [], []
for _ in range(int(reps)):
    t0 = time.perf_counter()
    k2, sig2, _, _, _ = prepare()
    c2 = compile_kernel(k2, sig2, target=target_name, cache=False)
    warm.append(time.perf_counter() - t0)
    stages.append(dict(c2.timings))
order = sorted(range(len(warm)), key=warm.__getitem__)
median = order[len(order) // 2]
print(json.dumps({"import": t_import, "cold": cold, "warm": warm[median], "warm_all": warm,
                  "stages": stages[median], "hit_mem": hits[len(hits) // 2], "hit_disk": disk[len(disk) // 2],
                  "cubin": len(ck.cubin)}))
"""


BUILD_TABLES = "from sparsile.grammar import get_parser; get_parser()"
PACKAGE_DIRS = ("frontend", "backend", "grammar", "stdlib")


def prepare_installation() -> None:
    """Leave the checkout as an installed sparsile is after ``pip install``, which byte-compiles
    every module: .pyc files for the package (``python -m compileall``; children keep them)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-l", str(ROOT)], env=env, check=False)
    subprocess.run([sys.executable, "-m", "compileall", "-q", *(str(ROOT / d) for d in PACKAGE_DIRS)], env=env,
                   check=False)


def _child(code: str, args: list[str], cache_dir: str, grammar_dir: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARSILE_CACHE_DIR": cache_dir}
    if grammar_dir is not None:
        env["SPARSILE_GRAMMAR_CACHE"] = grammar_dir
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users' Pythons keep .pyc files; so does this benchmark
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600)


def run_case(case: Case, target: str, reps: int) -> dict:
    """Measure one case in fresh interpreters: once with an empty kernel cache (the installation's
    grammar tables present: every fresh process of an installed sparsile), once with the grammar
    tables missing as well (the very first compile after installing)."""
    args = [str(ROOT / case.path), case.kernel, case.signature, target, str(reps)]
    with tempfile.TemporaryDirectory(prefix="sparsile-bench-cache-") as cache_dir:
        _child(BUILD_TABLES, [], cache_dir)  # this installation's tables, as any earlier use leaves them
        proc = _child(CHILD, args, cache_dir)
    if proc.returncode != 0:
        return {"case": case.name, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory(prefix="sparsile-bench-cache-") as cache_dir, \
            tempfile.TemporaryDirectory(prefix="sparsile-bench-grammar-") as grammar_dir:
        again = _child(CHILD, [*args[:4], "1"], cache_dir, grammar_dir)
    if again.returncode == 0:
        first = json.loads(again.stdout.strip().splitlines()[-1])
        result["first"] = first["cold"]
    return {"case": case.name, **result}


# ------------------------------------------------------------------------------------------------
# Triton, when installed (same kinds of kernels, compiled ahead of time for the same architecture)

TRITON_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
t_import = time.perf_counter() - t0

@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

@triton.jit
def softmax_kernel(x, out, n_rows, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(out + row * stride + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)

@triton.jit
def matmul_kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        ka = k * BK + rk
        x = tl.load(a + rm[:, None] * K + ka[None, :], mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + rn[:, None] * K + ka[None, :], mask=(rn[:, None] < N) & (ka[None, :] < K), other=0.0)
        acc = tl.dot(x, tl.trans(y), acc)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))

cases = {
    "vector_add": (add_kernel, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                   {"BLOCK": 1024}),
    "softmax": (softmax_kernel, {"x": "*fp32", "out": "*fp32", "n_rows": "i32", "n_cols": "i32", "stride": "i32",
                                 "BLOCK": "constexpr"}, {"BLOCK": 1024}),
    "dense_gemm_f16": (matmul_kernel, {"a": "*fp16", "b": "*fp16", "c": "*fp16", "M": "i32", "N": "i32", "K": "i32",
                                       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
                       {"BM": 128, "BN": 256, "BK": 64}),
}
name, arch = sys.argv[1], int(sys.argv[2])
fn, signature, constexprs = cases[name]
target = GPUTarget("cuda", arch, 32)
t0 = time.perf_counter()
compiled = triton.compile(ASTSource(fn, signature, constexprs), target=target)
cold = time.perf_counter() - t0
warm = []
for _ in range(3):  # the same kernel again in this process, its cache bypassed (TRITON_ALWAYS_COMPILE=1)
    t0 = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs), target=target)
    warm.append(time.perf_counter() - t0)
warm.sort()
print(json.dumps({"import": t_import, "cold": cold, "warm": warm[1], "cubin": len(compiled.asm.get("cubin", b""))}))
"""


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def run_triton(name: str, target: str) -> dict:
    """Triton's cold compile of its version of ``name`` (fresh process, empty TRITON_CACHE_DIR)."""
    arch = int("".join(ch for ch in target.removeprefix("sm_") if ch.isdigit()))
    with tempfile.TemporaryDirectory(prefix="triton-bench-cache-") as cache_dir:
        env = {**os.environ, "TRITON_CACHE_DIR": cache_dir, "TRITON_ALWAYS_COMPILE": "1"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        script = Path(cache_dir) / "triton_child.py"  # @triton.jit reads its function's source file
        script.write_text(TRITON_CHILD)
        proc = subprocess.run([sys.executable, str(script), name, str(arch)], capture_output=True, text=True,
                              env=env, timeout=600)
    if proc.returncode != 0:
        return {"case": name, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return {"case": name, **json.loads(proc.stdout.strip().splitlines()[-1])}


# ------------------------------------------------------------------------------------------------
# report


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['case']:<16} error: {r['error']}"
    st = r["stages"]
    stages = "/".join(f"{1e3 * st.get(k, 0.0):.0f}" for k in ("passes", "llvm", "ptx", "cubin"))
    first = f"{1e3 * r['first']:.0f}" if "first" in r else "-"
    return (f"{r['case']:<16} {1e3 * r['import']:>7.0f} {1e3 * r['cold']:>8.0f} {first:>8} {1e3 * r['warm']:>8.1f} "
            f"{stages:>19} {1e6 * r['hit_mem']:>8.1f} {1e3 * r['hit_disk']:>9.2f} {r['cubin']:>8}")


HEADER = (f"{'case':<16} {'import':>7} {'cold':>8} {'first':>8} {'warm':>8} {'passes/llvm/ptx/cubin':>19} "
          f"{'hit mem':>8} {'hit disk':>9} {'cubin B':>8}\n"
          f"{'':<16} {'ms':>7} {'ms':>8} {'ms':>8} {'ms':>8} {'ms (of warm)':>19} {'us':>8} {'ms':>9} {'':>8}")


def machine_line() -> str:
    cpus = os.cpu_count()
    try:
        from sparsile.driver.cache import compiler_version

        version = compiler_version()
    except Exception:  # the benchmark can run before the package is importable in this process
        version = "?"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "?"
    return (f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {cpus} CPUs, "
            f"Python {platform.python_version()}, {version}, commit {commit}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = selected_cases(args.case, args.target)
    prepare_installation()
    print(f"compile latency, target {args.target}: {machine_line()}")
    if not args.json:
        print(HEADER)
    failures = 0
    for case in cases:
        r = run_case(case, args.target, args.reps)
        failures += "error" in r
        print(json.dumps(r) if args.json else format_row(r), flush=True)
    if args.no_triton:
        return 1 if failures else 0
    if not triton_available():
        print("triton: not installed here, no Triton numbers (install triton and rerun for them)")
        return 1 if failures else 0
    print("\nTriton (fresh process, empty TRITON_CACHE_DIR), cold compile of its own version of the kernel:")
    for name in ("vector_add", "softmax", "dense_gemm_f16"):
        r = run_triton(name, args.target)
        if "error" in r:
            print(f"{name:<16} error: {r['error']}")
        else:
            print(f"{name:<16} import {1e3 * r['import']:>6.0f} ms, cold {1e3 * r['cold']:>7.0f} ms, "
                  f"warm {1e3 * r['warm']:>7.1f} ms, cubin {r['cubin']} B")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
