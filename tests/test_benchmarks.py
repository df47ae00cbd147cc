"""The CPU-side parts of benchmarks/bench_compile.py and benchmarks/bench_elementwise.py: argument
parsing, size and case tables, launch configurations that compile for sm_90a, the arithmetic of
the reports, and a short real run of the compile benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import sparsile

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


be = load_script("bench_elementwise")
bc = load_script("bench_compile")


# ------------------------------------------------------------------------------------------------
# bench_elementwise


def test_elementwise_arguments():
    args = be.parse_args([])
    assert args.iters == 50 and args.block == 1024 and not args.quick
    assert be.vector_sizes(args) == be.VECTOR_SIZES and be.softmax_shapes(args) == be.SOFTMAX_SHAPES
    quick = be.parse_args(["--quick", "--iters", "7"])
    assert be.vector_sizes(quick) == be.QUICK_VECTOR_SIZES and be.softmax_shapes(quick) == be.QUICK_SOFTMAX_SHAPES
    assert be.vector_sizes(be.parse_args(["--sizes", "1000", "5000"])) == (1000, 5000)
    for bad in (["--iters", "0"], ["--block", "100"], ["--block", "8"], ["--sizes", "0"]):
        with pytest.raises(SystemExit):
            be.parse_args(bad)


def test_sizes_are_large_enough_to_measure_bandwidth():
    """At least 1 GiB moved by the largest vector add; every softmax moves at least 128 MiB."""
    assert max(be.vector_add_bytes(n) for n in be.VECTOR_SIZES) >= 1 << 30
    assert all(be.softmax_bytes(r, c) >= 128 << 20 for r, c in be.SOFTMAX_SHAPES)
    assert set(be.QUICK_VECTOR_SIZES) <= set(be.VECTOR_SIZES)


@pytest.mark.parametrize("cols,block,rows,warps", [(512, 512, 8, 4), (1000, 1024, 4, 4), (1024, 1024, 4, 4),
                                                   (4096, 4096, 1, 4), (8192, 8192, 1, 8), (3, 16, 16, 4)])
def test_softmax_config_covers_a_row(cols, block, rows, warps):
    cfg = be.softmax_config(cols)
    assert (cfg.block, cfg.rows, cfg.num_warps) == (block, rows, warps)
    assert cfg.block >= cols and cfg.grid(1000) == (-(-1000 // rows),)


def test_every_softmax_configuration_compiles_for_sm90a():
    """What the GPU run will launch: each softmax configuration and the vector add compile here."""
    softmax = sparsile.load(ROOT / "examples" / "softmax.spk")
    for n_rows, n_cols in be.SOFTMAX_SHAPES:
        cfg = be.softmax_config(n_cols)
        x = np.zeros((2, n_cols), np.float32)
        ck = softmax.softmax[cfg.grid(n_rows)].compile_for("sm_90a", x, x.copy(), n_rows, n_cols, n_cols,
                                                           BLOCK=cfg.block, ROWS=cfg.rows, num_warps=cfg.num_warps)
        assert ck.num_warps == cfg.num_warps and ck.cubin[:4] == b"\x7fELF"
    vector = sparsile.load(ROOT / "examples" / "vector_add.spk")
    v = np.zeros(16, np.float32)
    assert vector.vector_add[(1,)].compile_for("sm_90a", v, v, v.copy(), 16, BLOCK=1024).cubin[:4] == b"\x7fELF"


def test_report_arithmetic_and_table():
    assert be.gbps(3_000_000_000, 1_000_000) == pytest.approx(3.0)  # 3 GB in 1 s
    assert be.gbps(4_800_000, 1.0) == pytest.approx(4800.0)  # 4.8 MB in 1 us
    rows = [be.Row("vector_add", "1048576", be.vector_add_bytes(1 << 20), 10.0, 8.0, 0.0)]
    assert rows[0].ratio == pytest.approx(0.8)
    table = be.format_rows(rows)
    assert "vector_add" in table and "0.80" in table and f"{be.gbps(12 << 20, 10.0):.0f}" in table
    text = be.format_overheads({"driver": 2.5, "triton kernel[grid]": None})
    assert "2.50 us" in text and "-" in text.splitlines()[1]


def test_elementwise_without_gpu_says_why(capsys):
    if be.requirements_missing() is None:
        pytest.skip("this machine can run the benchmark")
    assert be.main(["--quick"]) == 2
    assert "needs an NVIDIA GPU and torch" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# bench_compile


def test_compile_arguments_and_cases():
    args = bc.parse_args([])
    assert args.target == "sm_90a" and args.reps == 5 and args.case is None
    names = [c.name for c in bc.selected_cases(None, "sm_90a")]
    assert names == ["vector_add", "softmax", "transpose", "sparse_gemm_f16", "dense_gemm_f16"]
    assert [c.name for c in bc.selected_cases(None, "sm_80")] == ["vector_add", "softmax", "transpose"]
    assert [c.name for c in bc.selected_cases(["softmax"], "sm_100a")] == ["softmax"]
    for bad in (["--reps", "0"], ["--case", "nope"]):
        with pytest.raises(SystemExit):
            bc.parse_args(bad)
    for case in bc.CASES:
        assert (ROOT / case.path).is_file() and case.kernel in sparsile.load(ROOT / case.path).kernels


def test_compile_benchmark_runs_one_case():
    (case,) = bc.selected_cases(["vector_add"], "sm_90a")
    r = bc.run_case(case, "sm_90a", reps=1)
    assert "error" not in r, r
    assert r["cold"] > 0 and r["warm"] > 0 and 0 < r["hit_mem"] < r["cold"] and r["cubin"] > 0
    assert set(r["stages"]) >= {"passes", "llvm", "ptx", "cubin"}
    row = bc.format_row(r)
    assert row.startswith("vector_add") and str(r["cubin"]) in row
    assert "error" in bc.format_row({"case": "x", "error": "boom"})
