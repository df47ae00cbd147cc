"""benchmarks/bench_first_call.py on the CPU (a subprocess: it makes the planners see an H200 for the
rest of its process): the listing of the specializations a layer's first calls need, and a short
cold compile of them, serially and in two worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_first_call.py"), *args],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_listing_names_the_h200_plans() -> None:
    out = _run("--list", "--layers", "q,down", "--dtypes", "bf16", "--tokens", "1,512")
    assert "distinct specializations" in out.splitlines()[0]
    # the decode kernel at one token (the decode table's split for 4096 x 4096), the tuned tiled one at 512
    assert "sparse_decode_bf16" in out and "layer bf16 q T=1" in out
    assert "sparse_linear_bf16_mt" in out and "STAGES=" in out and "GROUP_M=16" in out
    assert "matmul bf16 down T=512" in out or "matmul bf16 q T=512" in out


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_short_cold_compile(jobs: str) -> None:
    out = _run("--layers", "k/v", "--dtypes", "bf16", "--tokens", "1", "--no-matmul", "--jobs", jobs)
    rows = [line for line in out.splitlines() if line.rstrip().endswith("T=1")]
    total = out.splitlines()[-1]
    assert rows and total.startswith(f"total: {len(rows)} compiles, wall ")
    assert all(int(line.split()[-5]) > 0 for line in rows)  # each row's ms
