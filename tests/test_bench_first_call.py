"""benchmarks/bench_first_call.py on the CPU (a subprocess: it makes the planners see an H200 for the
rest of its process): the listing of the specializations a layer's first calls need, and a short
cold compile of them, serially and in two worker processes. The three runs are made by one subprocess
(one import of torch and sparsile rather than three), each through the script's ``main`` with its own
arguments and so its own empty cache directory; the serial compile (in that process) comes before the
one in worker processes, whose compiled kernels are then read back into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "list": ["--list", "--layers", "q,down", "--dtypes", "bf16", "--tokens", "1,512"],
    "1": ["--layers", "k/v", "--dtypes", "bf16", "--tokens", "1", "--no-matmul", "--jobs", "1"],
    "2": ["--layers", "k/v", "--dtypes", "bf16", "--tokens", "1", "--no-matmul", "--jobs", "2"],
}
"""The benchmark's arguments for each test, in the order the subprocess runs them."""

_SCRIPT = """
import contextlib, importlib.util, io, sys, traceback
spec = importlib.util.spec_from_file_location("bench_first_call", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
for name, args in eval(sys.argv[2]).items():
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = bench.main(args)
    except BaseException:
        rc, out = 1, io.StringIO(out.getvalue() + traceback.format_exc())
    sys.stdout.write(f"=== {name} rc={rc}\\n{out.getvalue()}")
"""


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[int, str]]:
    """Each run's (exit status of ``main``, its output), by the name of its test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "benchmarks" / "bench_first_call.py"),
                           repr(RUNS)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = {}
    for part in proc.stdout.split("=== ")[1:]:
        head, _, body = part.partition("\n")
        name, _, rc = head.partition(" rc=")
        found[name] = (int(rc), body)
    assert list(found) == list(RUNS), proc.stdout[-2000:] + proc.stderr[-2000:]
    return found


def _run(runs: dict[str, tuple[int, str]], name: str) -> str:
    rc, out = runs[name]
    assert rc == 0, f"bench_first_call.py {' '.join(RUNS[name])}: exit status {rc}\n{out[-2000:]}"
    return out


def test_listing_names_the_h200_plans(runs) -> None:
    out = _run(runs, "list")
    assert "distinct specializations" in out.splitlines()[0]
    # the decode kernel at one token (the decode table's split for 4096 x 4096), the tuned tiled one at 512
    assert "sparse_decode_bf16" in out and "layer bf16 q T=1" in out
    assert "sparse_linear_bf16_mt" in out and "STAGES=" in out and "GROUP_M=16" in out
    assert "matmul bf16 down T=512" in out or "matmul bf16 q T=512" in out


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_short_cold_compile(runs, jobs: str) -> None:
    out = _run(runs, jobs)
    rows = [line for line in out.splitlines() if line.rstrip().endswith("T=1")]
    total = out.splitlines()[-1]
    assert rows and total.startswith(f"total: {len(rows)} compiles, wall ")
    assert f"jobs {jobs} ({'serial' if jobs == '1' else 'worker processes'})" in out.splitlines()[0]
    assert all(int(line.split()[-5]) > 0 for line in rows)  # each row's ms
