"""Worker subprocesses and the pool loop shared by the fuzz scripts (scripts/fuzz.py, fuzz_diff.py,
fuzz_mutants.py).

A :class:`PoolWorker` runs one job at a time in a subprocess (``argv``, typically the script itself
with ``--worker``), optionally under ``RLIMIT_AS``: the job goes out as one JSON line on the
worker's stdin, the answer comes back as one JSON line on its stdout (:func:`serve` is the worker's
side). :meth:`PoolWorker.ask` returns a :class:`Reply`: the answer, or that no answer came within
the timeout (the worker is killed), or that the worker died (an abort in LLVM, a segfault, the
memory limit), with its exit status and the tail of what it wrote to stderr since its last answer.
The next job starts a new worker. Stderr is read all the time by a thread, so that a worker that
writes much there never stalls on a full pipe; "since its last answer" is exact: :func:`serve`
writes ``ANSWER_MARK`` to stderr before each answer, and the reader forgets what came before it
(clearing the tail when the answer arrives would race with the reader still draining the pipe).

:func:`run_pool` hands a list of items to ``n`` threads, each with its own worker. What a job is and
how a reply is classified stay with each script.

This module imports nothing of sparsile: a worker may load it by its file path.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
"""The folder holding the checkout (the package ``sparsile``): put on the workers' PYTHONPATH."""
ANSWER, TIMEOUT, DIED = "answer", "timeout", "died"
STDERR_KEPT = 1 << 16
"""Bytes of a worker's stderr kept (the last ones, since its last answer)."""
READER_NAME = "fuzz-pool-stderr"
"""The name of the threads reading the workers' stderr."""
ANSWER_MARK = b"\x1esparsile-fuzz-pool: answer\x1e\n"
"""Written by :func:`serve` to stderr before each answer: what the worker wrote before it is forgotten."""

T = TypeVar("T")
W = TypeVar("W", bound="PoolWorker")


@dataclass(frozen=True)
class Reply:
    """What became of one job: ``kind`` is ``ANSWER`` (``answer``: the worker's decoded JSON line),
    ``TIMEOUT`` (no answer in time; the worker was killed) or ``DIED`` (``status``: its exit
    status, negative for a signal; ``stderr``: the tail of its stderr since its last answer;
    ``before_job``: it was already dead when the job was sent)."""

    kind: str
    answer: Any = None
    status: int | None = None
    stderr: str = ""
    before_job: bool = False

    def why(self) -> str:
        """``signal SIGABRT`` or ``exit status 3``."""
        status = self.status if self.status is not None else 0
        if status < 0:
            try:
                return f"signal {signal.Signals(-status).name}"
            except ValueError:
                return f"signal {-status}"
        return f"exit status {status}"


class _StderrTail:
    """A thread reading a pipe until its end, keeping the last ``STDERR_KEPT`` bytes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, name=READER_NAME, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.data += chunk
                mark = self.data.rfind(ANSWER_MARK)
                if mark >= 0:
                    del self.data[:mark + len(ANSWER_MARK)]
                del self.data[:-STDERR_KEPT]

    def text(self, wait: float = 0.0) -> str:
        """What was read since the last :meth:`clear`, after waiting up to ``wait`` seconds for the
        pipe's end (the worker has exited: the rest of its output is on the way)."""
        self.thread.join(wait)
        with self.lock:
            return self.data.decode("utf-8", errors="replace")


class PoolWorker:
    """One worker subprocess at a time, started on demand: ``argv`` under ``RLIMIT_AS`` of
    ``mem_gb`` GiB (None: no limit)."""

    def __init__(self, argv: list[str], mem_gb: float | None = None) -> None:
        self.argv = argv
        self.mem = None if mem_gb is None else int(mem_gb * 2**30)
        self.proc: subprocess.Popen[str] | None = None
        self.tail: _StderrTail | None = None

    def _limit(self) -> None:
        if self.mem is not None:
            resource.setrlimit(resource.RLIMIT_AS, (self.mem, self.mem))

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, preexec_fn=self._limit)
        assert proc.stderr is not None
        self.tail = _StderrTail(proc.stderr.fileno())
        return proc

    def ask(self, job: Any, timeout: float) -> Reply:
        """Send ``job`` (anything JSON can write) and wait up to ``timeout`` seconds for the answer."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.tail is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died(timeout, before_job=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line:
            return Reply(ANSWER, answer=json.loads(line))
        if not ready:
            self.close()
            return Reply(TIMEOUT)
        return self._died(timeout)  # (readable without a line: the worker closed its output, it is ending)

    def _died(self, timeout: float, before_job: bool = False) -> Reply:
        """The worker's end: its status (killed if it has not exited within ``timeout`` seconds)."""
        assert self.proc is not None and self.tail is not None
        try:
            status = self.proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:  # its output closed, yet it runs on: no answer in time
            self.close()
            return Reply(TIMEOUT)
        err = self.tail.text(wait=5.0)
        self.close()
        return Reply(DIED, status=status, stderr=err, before_job=before_job)

    def close(self) -> None:
        """Kill the worker, if there is one, and close its pipes."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        if self.tail is not None:
            self.tail.thread.join(1.0)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:  # (stdin: a write left in its buffer, to a worker that is gone)
                pass
        self.proc = None
        self.tail = None


def serve(handle: Callable[[Any], Any], recursion_limit: int = 4000) -> None:
    """The worker's side: answer each JSON line of stdin with ``handle(job)`` as a JSON line (after
    ``ANSWER_MARK`` on stderr: what the job wrote there is not the next job's)."""
    sys.setrecursionlimit(recursion_limit)
    for line in sys.stdin:
        answer = json.dumps(handle(json.loads(line)))
        sys.stderr.flush()
        sys.stderr.buffer.write(ANSWER_MARK)
        sys.stderr.buffer.flush()
        print(answer, flush=True)


class _Queue(Generic[T]):
    """The items not yet taken, in order, shared by the pool's threads."""

    def __init__(self, items: Sequence[T]) -> None:
        self.items = list(reversed(items))
        self.total = len(items)
        self.lock = threading.Lock()

    def take(self) -> tuple[T, int] | None:
        """The next item and how many were taken with it, or None when none is left."""
        with self.lock:
            if not self.items:
                return None
            return self.items.pop(), self.total - len(self.items)


def run_pool(items: Sequence[T], n_workers: int, new_worker: Callable[[], W],
             task: Callable[[W, T, int], None]) -> None:
    """Call ``task(worker, item, taken)`` for every item, in order, on ``n_workers`` threads that
    each own a worker made by ``new_worker`` (closed at the end); ``taken`` counts the items taken
    so far, this one included. ``task`` guards what it shares with the other threads. With one
    worker the loop runs in this thread (an interrupt stops it at once)."""
    queue = _Queue(items)

    def loop() -> None:
        w = new_worker()
        try:
            while (got := queue.take()) is not None:
                task(w, *got)
        finally:
            w.close()

    if n_workers == 1:
        loop()
        return
    threads = [threading.Thread(target=loop) for _ in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
