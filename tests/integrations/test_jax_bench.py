"""The CPU-side parts of benchmarks/bench_jax.py: arguments, shapes, the profiler-event classifier."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("bench_script_bench_jax", ROOT / "benchmarks" / "bench_jax.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_arguments_and_shapes() -> None:
    b = _script()
    args = b.parse_args([])
    assert args.iters == 200 and not args.quick and b.shapes(args) == b.SHAPES
    assert b.shapes(b.parse_args(["--quick"])) == b.QUICK_SHAPES


def test_classify_events() -> None:
    b = _script()
    names = ["MemcpyDtoH", "Memcpy DtoH (Device -> Pinned)", "MemcpyHtoD", "sparse_gemm_bf16", "splitk_reduce",
             "loop_convert_fusion", "Memset"]
    assert b.classify_events(names) == {"dtoh": 2, "htod": 1, "sparsile_kernels": 2}
