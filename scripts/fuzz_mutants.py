"""Sweep mutants of generated programs through compilation to PTX for every target (tests/fuzz/).

    python scripts/fuzz_mutants.py --gen plain --seeds 0:2000 [--jobs 2] [--programs 300]
                                   [--targets 3 | --targets all] [--no-interpret]
                                   [--timeout 20] [--mem-gb 6]
    python scripts/fuzz_mutants.py --replay plain:17:1017          # source, steps, full traceback

Mutant ``GEN:P:S`` is mutation seed ``S`` of program seed ``P`` of the generator ``GEN``
(``tests/fuzz/gen_mutate.py``'s ``make_mutant``: one to three mutations: a type, a tile shape or
constexpr, an axis, operands swapped, a statement dropped or duplicated, an expression replaced,
kernel options, a mask, a pointer, a stored value, the targets). ``--seeds A:B`` sweeps mutation
seeds A to B - 1, of program seeds ``S % --programs``. Each mutant is compiled to PTX (not through
the compile cache) for three targets drawn from the whole target table (``--targets all``: every
target), then, if it compiled for one, run in the interpreter on a grid of at most 2 x 2 programs
(``--no-interpret``: not; past ``--interpret-timeout`` it counts as ``slow``, not a bug: a mutation
may make a loop endless). Mutants run in worker subprocesses under ``RLIMIT_AS`` (``--mem-gb``)
and ``--timeout`` seconds per target compiled; a worker is replaced after a crash or a timeout. Outcomes
(tests/fuzz/gen_runner.py): ``ok``, ``diagnostic`` (well-formed: catalog code, message, span inside
the source), and the bugs ``malformed``, ``internal``, ``exception``, ``crash`` (the worker died: an
LLVM abort, a segfault, the memory limit; its stderr tail is printed) and ``timeout``, each printed
with the mutant's id. The exit status is 1 if there was a bug.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

N_TARGETS = 21
"""The size of the target table (tests/fuzz/test_gen_mutants_quick.py checks it)."""
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
if PACKAGE_PARENT not in sys.path:  # the checkout is the package `sparsile`
    sys.path.insert(0, PACKAGE_PARENT)

from sparsile.tests.support.fuzz_pool import ANSWER, TIMEOUT, PoolWorker, Reply, run_pool, serve  # noqa: E402


def _mutant(spec: str, n_targets: int) -> Any:
    from sparsile.tests.fuzz.gen_mutate import ALL_TARGETS, make_mutant

    gen, seed, mseed = spec.split(":")
    m = make_mutant(gen, int(seed), int(mseed), n_targets=min(n_targets, len(ALL_TARGETS)))
    if n_targets >= len(ALL_TARGETS):
        m.targets = ALL_TARGETS
    return m


def _worker(n_targets: int) -> None:
    """Read ``{"spec", "stage"[, "targets"]}`` lines on stdin, answer ``{"outcome", "detail", "compiled"}``."""
    import warnings

    from sparsile.tests.fuzz.gen_runner import EXCEPTION, compile_mutant, interpret_mutant

    warnings.simplefilter("error")  # a stray numpy warning is a finding, as in the test suite

    def one(job: dict[str, Any]) -> dict[str, Any]:
        try:
            m = _mutant(job["spec"], n_targets)
            if job.get("targets"):  # the caller's targets instead of the mutant's
                m.targets = tuple(job["targets"])
            if job["stage"] == "compile":
                outcome, detail, compiled = compile_mutant(m)
            else:
                (outcome, detail), compiled = interpret_mutant(m), []
        except Exception as e:  # the mutator itself: reported, not fatal
            outcome, detail, compiled = EXCEPTION, "mutator: " + "".join(traceback.format_exception(e))[-1500:], []
        return {"outcome": outcome, "detail": detail, "compiled": compiled}

    serve(one)


def outcome_of(reply: Reply, timeout: float) -> dict[str, Any]:
    """A job's result: the worker's answer, a timeout, or a crash with how the worker ended and
    the last 1500 characters of its stderr."""
    if reply.kind == ANSWER:
        return reply.answer
    if reply.kind == TIMEOUT:
        return {"outcome": "timeout", "detail": f"no answer in {timeout:.0f} s", "compiled": []}
    err = reply.stderr[-1500:].strip()
    return {"outcome": "crash", "detail": f"the worker died ({reply.why()}): {err}", "compiled": []}


class Worker(PoolWorker):
    """A worker subprocess under the memory limit; :meth:`run` returns a job's result."""

    def __init__(self, n_targets: int, mem_gb: float) -> None:
        super().__init__([sys.executable, __file__, "--worker", "--targets", str(n_targets)], mem_gb)

    def run(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        return outcome_of(self.ask(job, timeout), timeout)


def sweep(specs: list[str], n_workers: int, n_targets: int, timeout: float, mem_gb: float, interpret: bool,
          interpret_timeout: float = 20.0, log: Any = sys.stdout) -> dict[str, collections.Counter]:
    """Run every mutant on ``n_workers`` workers; print a line per bug and progress every 200. The
    compile stage may take ``timeout`` seconds per target. An
    interpreter run past ``interpret_timeout`` counts as ``slow``, not as a bug: a mutation may
    make a loop endless (a dropped ``i = i + 1``), which the GPU would not finish either."""
    counts = {"compile": collections.Counter(), "interpret": collections.Counter()}
    lock = threading.Lock()
    start = time.time()
    bugs = ("malformed", "internal", "exception", "crash", "timeout")

    def report(spec: str, stage: str, res: dict[str, Any]) -> None:
        with lock:
            counts[stage][res["outcome"]] += 1
            if res["outcome"] in bugs:
                print(f"BUG {res['outcome']} [{stage}] --replay {spec}\n{res['detail']}", file=log, flush=True)

    def task(w: Worker, spec: str, done: int) -> None:
        res = w.run({"spec": spec, "stage": "compile"}, timeout * min(n_targets, N_TARGETS))
        report(spec, "compile", res)
        if interpret and res["compiled"]:
            got = w.run({"spec": spec, "stage": "interpret"}, interpret_timeout)
            if got["outcome"] == "timeout":  # a mutant may loop for ever, as it would on the GPU
                got["outcome"] = "slow"
                with lock:
                    print(f"NOTE slow [interpret] --replay {spec}: {got['detail']}", file=log, flush=True)
            report(spec, "interpret", got)
        if done % 200 == 0:
            with lock:
                print(f"# {done}/{len(specs)} in {time.time() - start:.0f} s: "
                      f"{ {k: dict(v) for k, v in counts.items()} }", file=log, flush=True)

    run_pool(specs, n_workers, lambda: Worker(n_targets, mem_gb), task)
    return counts


def replay(spec: str, n_targets: int, interpret: bool) -> int:
    """Print the mutant and run it here, with full tracebacks."""
    from sparsile.tests.fuzz.gen_runner import BUGS, compile_mutant, interpret_mutant

    m = _mutant(spec, n_targets)
    print(f"# {m.name}: {'; '.join(m.steps)}\n# consts {m.consts}, targets {', '.join(m.targets)}\n{m.source}")
    outcome, detail, compiled = compile_mutant(m)
    print(f"compile: {outcome}\n{detail}")
    bad = outcome in BUGS
    if interpret and compiled:
        outcome, detail = interpret_mutant(m)
        print(f"interpret: {outcome}\n{detail}")
        bad = bad or outcome in BUGS
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gen", choices=("plain", "sparse", "both"), default="both", help="which program generator")
    p.add_argument("--seeds", default="0:200", help="A:B, the mutation seeds A to B - 1")
    p.add_argument("--programs", type=int, default=500, help="program seeds: mutation seed modulo this")
    p.add_argument("--targets", default="3", help="targets per mutant, drawn from the table, or `all`")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds per target compiled before the mutant counts as a timeout")
    p.add_argument("--interpret-timeout", type=float, default=20.0,
                   help="seconds for an interpreter run; past it the mutant counts as `slow` (it may loop for ever)")
    p.add_argument("--mem-gb", type=float, default=6.0, help="RLIMIT_AS of a worker, GiB")
    p.add_argument("--no-interpret", action="store_true", help="compile only")
    p.add_argument("--replay", help="GEN:PROGRAM_SEED:MUTATION_SEED: run this one mutant here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    n_targets = 10**6 if args.targets == "all" else int(args.targets)
    if args.worker:
        _worker(n_targets)
        return 0
    if args.replay:
        return replay(args.replay, n_targets, not args.no_interpret)
    a, b = (int(x) for x in args.seeds.split(":"))
    gens = ("plain", "sparse") if args.gen == "both" else (args.gen,)
    specs = [f"{gens[s % len(gens)]}:{s % args.programs}:{s}" for s in range(a, b)]
    counts = sweep(specs, args.jobs, n_targets, args.timeout, args.mem_gb, not args.no_interpret,
                   args.interpret_timeout)
    print(json.dumps({"seeds": args.seeds, **{k: dict(v) for k, v in counts.items()}}), flush=True)
    bugs = {"malformed", "internal", "exception", "crash", "timeout"}
    return 1 if any(set(c) & bugs for c in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
