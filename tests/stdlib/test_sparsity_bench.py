"""The benchmark script runs and prints its table (tiny size; the 2 s target is checked by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sparsity.py"


def test_bench_runs_small(capsys):
    spec = importlib.util.spec_from_file_location("bench_sparsity", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--size", "256", "--repeats", "1", "--dtypes", "f16", "e2m1"]) == 0
    out = capsys.readouterr().out
    for step in ("prune", "compress", "encode tcgen05", "encode sm90", "validate tcgen05", "validate sm90"):
        assert step in out
    assert "e2m1" in out
