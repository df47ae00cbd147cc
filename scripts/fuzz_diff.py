"""Sweep the differential program fuzzers over a range of seeds on the CPU.

    python scripts/fuzz_diff.py --gen plain --seeds 20000:24000 [--targets sm_90a,sm_100a]
                                [--timeout 120] [--mem-gb 8] [--fresh]

For each seed the generated program (``tests/support/program_gen.py``'s ``generate``, or
``program_gen_sparse.py``'s ``generate_sparse`` with ``--gen sparse``) is compiled to PTX for every
target (each constexpr ``K`` variant, not through the compile cache), then run in the interpreter
and compared with the generator's numpy reference (``program_check.check_against_reference``).
Seeds run in a worker subprocess under ``RLIMIT_AS`` (``--mem-gb``) and a per-seed ``--timeout``;
the worker is reused from seed to seed (importing sparsile costs more than most seeds) and replaced
after a timeout or a crash (``--fresh``: a new one for every seed). One line is printed per
failing seed, with its class:

- ``compile-exception``: an exception other than a sparsile diagnostic while compiling;
- ``diagnostic``: a sparsile error (SP code) on a generated, hence valid, program (compile or run);
- ``interpret-exception``: an exception other than a diagnostic while interpreting or evaluating
  the reference (``generator-exception``: while generating the program);
- ``llvm-abort``: the worker died (an abort in LLVM, a segfault, the memory limit);
- ``timeout``: no answer within ``--timeout`` seconds;
- ``mismatch``: the interpreter's outputs differ from the reference's.

Replay one seed in this process, with its source and full traceback: ``--replay SEED``. The exit
status is 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
if PACKAGE_PARENT not in sys.path:  # the checkout is the package `sparsile`
    sys.path.insert(0, PACKAGE_PARENT)

from sparsile.tests.support.fuzz_pool import ANSWER, TIMEOUT, PoolWorker, Reply, run_pool, serve  # noqa: E402

CLASSES = ("compile-exception", "diagnostic", "interpret-exception", "generator-exception", "llvm-abort",
           "timeout", "mismatch")


def _generator(gen: str) -> Any:
    if gen == "sparse":
        from sparsile.tests.support.program_gen_sparse import generate_sparse
        return generate_sparse
    from sparsile.tests.support.program_gen import generate
    return generate


def _error_class(e: BaseException, stage: str) -> str:
    from sparsile.frontend.diagnostics import SparsileError

    return "diagnostic" if isinstance(e, SparsileError) else f"{stage}-exception"


def _summary(e: BaseException, full: bool) -> str:
    if full:
        return "".join(traceback.format_exception(type(e), e, e.__traceback__))
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def check_seed(gen: str, seed: int, targets: tuple[str, ...], full: bool = False) -> dict[str, str]:
    """One seed through generation, compilation and the reference comparison: ``{"class", "detail"}``
    (class ``ok`` when it passed)."""
    from sparsile.tests.support.compile import compile_src
    from sparsile.tests.support.program_check import check_against_reference

    try:
        program = _generator(gen)(seed)
    except (Exception, RecursionError) as e:
        return {"class": "generator-exception", "detail": _summary(e, full)}
    try:
        for variant in program.variants():
            for target in targets:
                compile_src(variant.source, target, cache=False, **variant.consts)
    except (Exception, RecursionError) as e:
        return {"class": _error_class(e, "compile"), "detail": f"{target}, K={variant.consts.get('K')}: "
                + _summary(e, full)}
    try:
        diffs = check_against_reference(program, seed)
    except (Exception, RecursionError) as e:
        return {"class": _error_class(e, "interpret"), "detail": _summary(e, full)}
    if diffs:
        more = f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""
        return {"class": "mismatch", "detail": diffs[0][:300] + more}
    return {"class": "ok", "detail": ""}


def _worker(gen: str, targets: tuple[str, ...]) -> None:
    """Read seeds on stdin, answer one JSON line each."""
    import warnings

    warnings.simplefilter("error")  # as the test suite runs: a stray numpy warning is a finding
    serve(lambda seed: check_seed(gen, int(seed), targets))


def outcome_of(reply: Reply, timeout: float) -> dict[str, str]:
    """A seed's result: the worker's answer, a timeout, or ``llvm-abort`` with the exit status and
    the last 300 characters of the worker's stderr, on one line."""
    if reply.kind == ANSWER:
        return reply.answer
    if reply.kind == TIMEOUT:
        return {"class": "timeout", "detail": f"no answer in {timeout:.0f} s"}
    err = reply.stderr[-300:].strip().replace("\n", " | ")
    return {"class": "llvm-abort", "detail": f"worker exit status {reply.status}: {err}"}


class Worker(PoolWorker):
    """A worker subprocess under the memory limit; :meth:`run` returns a seed's result."""

    def __init__(self, gen: str, targets: tuple[str, ...], mem_gb: float) -> None:
        super().__init__([sys.executable, __file__, "--worker", "--gen", gen, "--targets", ",".join(targets)],
                         mem_gb)

    def run(self, seed: int, timeout: float) -> dict[str, str]:
        return outcome_of(self.ask(seed, timeout), timeout)


def sweep(gen: str, seeds: range, targets: tuple[str, ...], timeout: float, mem_gb: float, fresh: bool,
          log: Any = sys.stdout) -> collections.Counter:
    """Run every seed; print a line per failure and a progress line every 200 seeds."""
    counts: collections.Counter = collections.Counter()
    start = time.time()

    def task(w: Worker, seed: int, i: int) -> None:
        res = w.run(seed, timeout)
        if fresh:
            w.close()
        counts[res["class"]] += 1
        if res["class"] != "ok":
            print(f"FAIL {gen} seed {seed} [{res['class']}] {res['detail']}", file=log, flush=True)
        if i % 200 == 0:
            print(f"# {gen} {i}/{len(seeds)} seeds in {time.time() - start:.0f} s: {dict(counts)}",
                  file=log, flush=True)

    run_pool(seeds, 1, lambda: Worker(gen, targets, mem_gb), task)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gen", choices=("plain", "sparse"), default="plain", help="which program generator")
    p.add_argument("--seeds", default="0:100", help="A:B, the seeds A to B - 1")
    p.add_argument("--targets", default="sm_90a,sm_100a", help="comma-separated compile targets")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per seed before it counts as a timeout")
    p.add_argument("--mem-gb", type=float, default=8.0, help="RLIMIT_AS of the worker, GiB")
    p.add_argument("--fresh", action="store_true", help="a new worker process for every seed")
    p.add_argument("--replay", type=int, help="run this one seed here: its source, and a full traceback")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    targets = tuple(t for t in args.targets.split(",") if t)
    if args.worker:
        _worker(args.gen, targets)
        return 0
    if args.replay is not None:
        print(_generator(args.gen)(args.replay).source)
        res = check_seed(args.gen, args.replay, targets, full=True)
        print(res["class"], res["detail"])
        return 0 if res["class"] == "ok" else 1
    a, b = (int(x) for x in args.seeds.split(":"))
    counts = sweep(args.gen, range(a, b), targets, args.timeout, args.mem_gb, args.fresh)
    print(json.dumps({"gen": args.gen, "seeds": args.seeds, **counts}), flush=True)
    return 0 if set(counts) <= {"ok"} else 1


if __name__ == "__main__":
    sys.exit(main())
