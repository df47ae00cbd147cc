"""The benchmark script runs and prints its table (tiny size; the 2 s target is checked by hand)."""

from __future__ import annotations

from sparsile.tests.support import load_script


def test_bench_runs_small(capsys):
    module = load_script("benchmarks/bench_sparsity.py")
    assert module.main(["--size", "256", "--repeats", "1", "--dtypes", "f16", "e2m1"]) == 0
    out = capsys.readouterr().out
    for step in ("prune", "compress", "encode tcgen05", "encode sm90", "validate tcgen05", "validate sm90"):
        assert step in out
    assert "e2m1" in out
