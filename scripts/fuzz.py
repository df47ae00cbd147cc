"""Long mutation-fuzzing run of the shipped ``.spk`` kernels (tests/fuzz/).

    python scripts/fuzz.py --check 20000 --compile 1000 --jobs 2 [--timeout 60] [--seed 0]

Each mutant (``tests/fuzz/mutate.py``: one to three token- or AST-level mutations of a shipped
file, reproducible from the file and its seed) goes through ``sparsile check`` or through
compilation to PTX of one of the file's kernels (chosen by the seed) for sm_90a and/or sm_100a, as
the file is written for (the examples and the portable tile kernel: both). Mutants run in worker
subprocesses, one job at a time each, so that a hang (past ``--timeout`` seconds) or a crash of
the interpreter (an abort in LLVM, a segfault) is caught and the worker replaced. Outcomes are
counted as ok / diagnostic / internal / traceback / hang / crash; everything but the first two is
printed with the file, seed and mutation to reproduce it (``--replay FILE:SEED:MODE``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
if PACKAGE_PARENT not in sys.path:  # the checkout is the package `sparsile`
    sys.path.insert(0, PACKAGE_PARENT)

from sparsile.tests.support.fuzz_pool import ANSWER, TIMEOUT, PoolWorker, Reply, run_pool, serve  # noqa: E402


def _worker() -> None:
    """Read ``{"file", "seed", "mode"}`` lines on stdin, answer ``{"outcome", "detail", "what"}``."""
    from sparsile.tests.fuzz.mutate import mutant
    from sparsile.tests.fuzz.runner import run_check, run_compile, targets_for

    def one(job: dict[str, Any]) -> dict[str, str]:
        path = Path(job["file"])
        text, what = mutant(path, job["seed"])
        if job["mode"] == "check":
            outcome, detail = run_check(text, path.name, path.parent)
        else:
            outcome, detail = run_compile(text, targets_for(path.name), path.name, pick=job["seed"], home=path.parent)
        return {"outcome": outcome, "detail": detail, "what": what}

    serve(one)


def outcome_of(reply: Reply, timeout: float) -> dict[str, Any]:
    """The job's result: the worker's answer, or a hang or a crash."""
    if reply.kind == ANSWER:
        return reply.answer
    if reply.kind == TIMEOUT:
        return {"outcome": "hang", "detail": f"no answer in {timeout:.0f} s", "what": ""}
    detail = "the worker died before the job" if reply.before_job else f"worker exit status {reply.status}"
    return {"outcome": "crash", "detail": detail, "what": ""}


class Worker(PoolWorker):
    """One worker subprocess; :meth:`run` returns the job's result, or a hang / crash outcome."""

    def __init__(self) -> None:
        super().__init__([sys.executable, __file__, "--worker"])

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        return outcome_of(self.ask(job, timeout), timeout)


def jobs(n_check: int, n_compile: int, seed: int) -> list[dict[str, Any]]:
    """The mutants of the run: the shipped files in turn, seeds counting up from ``seed`` (compile
    mutants from ``seed + 10**6``), compile jobs spread evenly among the check jobs."""
    from sparsile.tests.fuzz.mutate import SOURCES

    check = [{"file": str(SOURCES[i % len(SOURCES)]), "seed": seed + i, "mode": "check"} for i in range(n_check)]
    comp = [{"file": str(SOURCES[i % len(SOURCES)]), "seed": seed + 10**6 + i, "mode": "compile"}
            for i in range(n_compile)]
    # interleaved, so that a run cut short has made progress on both
    every = max(1, len(check) // max(1, len(comp)))
    out: list[dict[str, Any]] = []
    for i, job in enumerate(comp):
        out += [*check[i * every:(i + 1) * every], job]
    return out + check[len(comp) * every:]


def run(all_jobs: list[dict[str, Any]], n_workers: int, timeout: float, log: Any) -> dict[str, collections.Counter]:
    """Run ``all_jobs`` on ``n_workers`` workers; returns the outcome counts per mode."""
    counts: dict[str, collections.Counter] = {"check": collections.Counter(), "compile": collections.Counter()}
    lock = threading.Lock()
    start = time.time()

    def task(w: Worker, job: dict[str, Any], _taken: int) -> None:
        res = w.run(job, timeout)
        with lock:
            counts[job["mode"]][res["outcome"]] += 1
            done = sum(sum(c.values()) for c in counts.values())
            if res["outcome"] not in ("ok", "diagnostic"):
                name = Path(job["file"]).name
                print(f"== {res['outcome']}: --replay {name}:{job['seed']}:{job['mode']} ({res['what']})\n"
                      f"{res['detail']}", file=log, flush=True)
            if done % 500 == 0:
                print(f"{done}/{len(all_jobs)} in {time.time() - start:.0f} s: "
                      f"{ {m: dict(c) for m, c in counts.items()} }", file=log, flush=True)

    run_pool(all_jobs, n_workers, Worker, task)
    return counts


def replay(spec: str) -> None:
    """Print the mutant ``FILE:SEED:MODE`` and run it in this process."""
    from sparsile.tests.fuzz.mutate import SOURCES, mutant
    from sparsile.tests.fuzz.runner import run_check, run_compile, targets_for

    name, seed, mode = spec.split(":")
    path = next(p for p in SOURCES if p.name == name)
    text, what = mutant(path, int(seed))
    print(f"# {what}\n{text}")
    result = (run_check(text, name, path.parent) if mode == "check"
              else run_compile(text, targets_for(name), name, int(seed), home=path.parent))
    print(result[0], result[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", type=int, default=20000, help="mutants through `sparsile check`")
    p.add_argument("--compile", type=int, default=1000, help="mutants compiled to PTX")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a mutant counts as a hang")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--replay", help="FILE:SEED:MODE: print and run one mutant")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    if args.replay:
        replay(args.replay)
        return 0
    counts = run(jobs(args.check, args.compile, args.seed), args.jobs, args.timeout, sys.stdout)
    print(json.dumps({m: dict(c) for m, c in counts.items()}))
    bad = sum(c[k] for c in counts.values() for k in ("internal", "traceback", "hang", "crash"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
