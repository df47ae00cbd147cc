"""tests/support/fuzz_pool.py, the worker subprocesses of the fuzz scripts, with a toy worker: one that
answers, one that exits or aborts, one past its memory limit, one past its timeout, one that floods
its stderr, one that closes its output before it exits; then each script's classification of those
replies (scripts/fuzz.py, fuzz_diff.py, fuzz_mutants.py), and the pool loop."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest

from sparsile.tests.support import fuzz_pool
from sparsile.tests.support.fuzz_pool import ANSWER, DIED, TIMEOUT, PoolWorker, Reply, run_pool
from sparsile.tests.support.scripts import load_script

ECHO, EXIT, ABORT, ALLOC, SLEEP, FLOOD, CLOSE = 7, 1, 2, 3, 4, 5, 6
"""Toy jobs (integers: scripts/fuzz_diff.py sends its seeds as bare numbers)."""
TOY = r"""
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("toy_fuzz_pool", sys.argv[1])
pool = importlib.util.module_from_spec(spec)
sys.modules["toy_fuzz_pool"] = pool
spec.loader.exec_module(pool)

def handle(job):
    if job == 1:
        sys.stderr.write("leaving now\n"); sys.stderr.flush(); os._exit(3)
    if job == 2:
        os.abort()
    if job == 3:
        return len(bytearray(4 << 30))
    if job == 4:
        time.sleep(60)
    if job == 5:
        sys.stderr.write("x" * 300_000 + "\n"); sys.stderr.flush()
    if job == 6:
        os.close(1); time.sleep(1.5); os._exit(5)
    return {"echo": job, "pid": os.getpid()}

pool.serve(handle)
"""
TOY_ARGV = [sys.executable, "-c", TOY, fuzz_pool.__file__]
TOY_MEM = int(0.5 * 2**30)
"""RLIMIT_AS for the toy: enough to start Python, not for the 4 GiB of ``ALLOC``."""


def toy(worker: Any) -> Any:
    """``worker`` (a script's) running the toy instead of its script, under ``TOY_MEM``."""
    worker.argv = TOY_ARGV
    worker.mem = TOY_MEM
    return worker


@pytest.fixture
def worker():
    w = toy(PoolWorker(["unused"]))
    yield w
    w.close()


def test_an_answer_comes_back_and_the_worker_serves_the_next_job(worker: PoolWorker) -> None:
    first = worker.ask(ECHO, timeout=30)
    assert first.kind == ANSWER and first.answer["echo"] == ECHO, first
    assert worker.ask(ECHO, timeout=30).answer["pid"] == first.answer["pid"]


@pytest.mark.parametrize(("job", "status", "why", "stderr"), [
    (EXIT, 3, "exit status 3", "leaving now"),
    (ABORT, -6, "signal SIGABRT", ""),
    (ALLOC, 1, "exit status 1", "MemoryError"),
])
def test_a_worker_that_dies_is_reported_with_its_status_and_stderr_and_replaced(
        worker: PoolWorker, job: int, status: int, why: str, stderr: str) -> None:
    pid = worker.ask(ECHO, timeout=30).answer["pid"]
    got = worker.ask(job, timeout=30)
    assert (got.kind, got.status, got.why()) == (DIED, status, why), got
    assert stderr in got.stderr and not got.before_job, got.stderr[-500:]
    again = worker.ask(ECHO, timeout=30)
    assert again.kind == ANSWER and again.answer["pid"] != pid


def test_a_worker_past_its_timeout_is_killed_and_replaced(worker: PoolWorker) -> None:
    pid = worker.ask(ECHO, timeout=30).answer["pid"]
    assert worker.ask(SLEEP, timeout=0.5) == Reply(TIMEOUT)
    assert worker.proc is None
    assert worker.ask(ECHO, timeout=30).answer["pid"] != pid


def test_a_worker_that_floods_its_stderr_still_answers_and_the_flood_is_not_the_next_crash_s(
        worker: PoolWorker) -> None:
    got = worker.ask(FLOOD, timeout=30)
    assert got.kind == ANSWER and got.answer["echo"] == FLOOD, got
    died = worker.ask(EXIT, timeout=30)
    assert died.kind == DIED and died.stderr.strip() == "leaving now", died.stderr[:200]


def test_the_flood_is_not_the_next_crash_s_stderr_however_late_the_reader_drains_it(
        worker: PoolWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer may arrive while the reader thread is still draining the flood written before it
    (a loaded machine: CI saw it once): what the reader reads late is still before the answer."""
    read = fuzz_pool.os.read

    def slow_read(fd: int, n: int) -> bytes:
        if threading.current_thread().name == fuzz_pool.READER_NAME:
            time.sleep(0.05)
            return read(fd, min(n, 4096))
        return read(fd, n)

    monkeypatch.setattr(fuzz_pool.os, "read", slow_read)
    got = worker.ask(FLOOD, timeout=60)
    assert got.kind == ANSWER and got.answer["echo"] == FLOOD, got
    died = worker.ask(EXIT, timeout=60)
    assert died.kind == DIED and died.stderr.strip() == "leaving now", died.stderr[:200]


def test_a_worker_that_closes_its_output_before_it_exits_died(worker: PoolWorker) -> None:
    got = worker.ask(CLOSE, timeout=30)
    assert (got.kind, got.status) == (DIED, 5), got


def test_a_worker_that_cannot_start_under_its_memory_limit_died() -> None:
    w = PoolWorker(TOY_ARGV, mem_gb=0.005)
    try:
        got = w.ask(ECHO, timeout=30)
    finally:
        w.close()
    assert got.kind == DIED and got.status != 0, got


def test_the_pool_hands_every_item_once_to_workers_that_it_closes() -> None:
    made: list[PoolWorker] = []
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def new_worker() -> PoolWorker:
        w = toy(PoolWorker(["unused"]))
        made.append(w)
        return w

    def task(w: PoolWorker, item: int, taken: int) -> None:
        got = w.ask(item, timeout=30)
        with lock:
            seen.append((got.answer["echo"], taken))

    run_pool(list(range(10, 20)), 2, new_worker, task)
    assert sorted(item for item, _ in seen) == list(range(10, 20))
    assert sorted(taken for _, taken in seen) == list(range(1, 11))
    assert len(made) == 2 and all(w.proc is None for w in made)


def test_a_pool_of_one_runs_in_order_in_this_thread() -> None:
    seen = []

    class Fake:
        closed = False

        def close(self) -> None:
            Fake.closed = True

    run_pool("abc", 1, Fake, lambda w, item, taken: seen.append((item, taken, threading.current_thread())))
    assert seen == [(c, i, threading.main_thread()) for i, c in enumerate("abc", 1)] and Fake.closed


# each script's classification of what the pool's worker replies

def fuzz_worker() -> Any:
    return load_script("scripts/fuzz.py", "fuzz_script").Worker()


def fuzz_diff_worker() -> Any:
    return load_script("scripts/fuzz_diff.py", "fuzz_diff_script").Worker("plain", ("sm_90a",), 8.0)


def fuzz_mutants_worker() -> Any:
    return load_script("scripts/fuzz_mutants.py", "fuzz_mutants_script").Worker(3, 6.0)


SCRIPTS = {"fuzz": fuzz_worker, "fuzz_diff": fuzz_diff_worker, "fuzz_mutants": fuzz_mutants_worker}
EXPECTED = {  # job: (the result's first fields, a part of its detail)
    "fuzz": {ABORT: ({"outcome": "crash", "what": ""}, "worker exit status -6"),
             ALLOC: ({"outcome": "crash", "what": ""}, "worker exit status 1"),
             SLEEP: ({"outcome": "hang", "what": ""}, "no answer in 1 s"),
             CLOSE: ({"outcome": "crash", "what": ""}, "worker exit status 5")},
    "fuzz_diff": {ABORT: ({"class": "llvm-abort"}, "worker exit status -6: "),
                  ALLOC: ({"class": "llvm-abort"}, "worker exit status 1: "),
                  SLEEP: ({"class": "timeout"}, "no answer in 1 s"),
                  CLOSE: ({"class": "llvm-abort"}, "worker exit status 5: ")},
    "fuzz_mutants": {ABORT: ({"outcome": "crash", "compiled": []}, "the worker died (signal SIGABRT): "),
                     ALLOC: ({"outcome": "crash", "compiled": []}, "the worker died (exit status 1): "),
                     SLEEP: ({"outcome": "timeout", "compiled": []}, "no answer in 1 s"),
                     CLOSE: ({"outcome": "crash", "compiled": []}, "the worker died (exit status 5): ")},
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_classifies_a_crash_the_memory_limit_a_timeout_and_an_answer(script: str) -> None:
    w = toy(SCRIPTS[script]())
    try:
        for job, (fields, detail) in EXPECTED[script].items():
            got = w.run(job, 1.0 if job == SLEEP else 30.0)
            assert {k: got.get(k) for k in fields} == fields and detail in got["detail"], (job, got)
            if job == ALLOC and script != "fuzz":  # the stderr tail (fuzz.py prints none)
                assert got["detail"].endswith("MemoryError"), got
            answer = w.run(ECHO, 30.0)
            assert answer["echo"] == ECHO, answer
    finally:
        w.close()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_worker_of_each_script_that_floods_its_stderr_answers_all_the_same(script: str) -> None:
    w = toy(SCRIPTS[script]())
    try:
        answer = w.run(FLOOD, 10.0)
    finally:
        w.close()
    assert answer["echo"] == FLOOD, answer


def test_fuzz_diff_keeps_the_last_300_characters_of_stderr_on_one_line() -> None:
    module = load_script("scripts/fuzz_diff.py", "fuzz_diff_script")
    got = module.outcome_of(Reply(DIED, status=-11, stderr="a\n" + "b" * 400 + "\nend of it\n"), 5.0)
    assert got == {"class": "llvm-abort", "detail": "worker exit status -11: " + "b" * 289 + " | end of it"}


def test_fuzz_mutants_keeps_the_last_1500_characters_of_stderr() -> None:
    module = load_script("scripts/fuzz_mutants.py", "fuzz_mutants_script")
    got = module.outcome_of(Reply(DIED, status=-11, stderr="a\n" + "b" * 2000 + "\nend\n"), 5.0)
    assert got == {"outcome": "crash", "detail": "the worker died (signal SIGSEGV): " + "b" * 1495 + "\nend",
                   "compiled": []}


def test_fuzz_says_the_worker_died_before_the_job() -> None:
    module = load_script("scripts/fuzz.py", "fuzz_script")
    got = module.outcome_of(Reply(DIED, status=1, before_job=True), 5.0)
    assert got == {"outcome": "crash", "detail": "the worker died before the job", "what": ""}
