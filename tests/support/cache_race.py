"""Writers racing for one autotuning cache file (tests/driver/test_autotune_cache_lock.py), in
threads of this process or in other processes (so this module is importable by name).

The race is forced, not left to timing: each writer's read of the file inside
``TuningFile.store`` (its ``read(quiet=True)``) waits at a barrier shared by every writer before
it returns. Without a lock, every writer of a round has read the file before any writes it, so
each write drops the entries of the others (all but one of a round's entries are lost, every
round). With the lock, the writer that holds it waits at the barrier while the others wait for
the lock: the barrier times out (``pause`` seconds, once per round) and is broken, and the writers
then take the lock in turn, each reading what the one before wrote."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparsile.driver.autotune_cache import TuningFile

WAIT = 60.0
"""Seconds any other wait of these writers may take before the test fails (instead of hanging)."""


def pause_store_reads(barrier: Any, pause: float) -> Callable[..., Any]:
    """Make ``TuningFile.store``'s read of the file wait at ``barrier`` (at most ``pause`` s)
    after reading; returns the original ``TuningFile.read``."""
    original = TuningFile.read

    def read(self: TuningFile, quiet: bool = False) -> dict[str, Any]:
        entries = original(self, quiet)
        if quiet:  # the store's read of what the file holds now
            try:
                barrier.wait(pause)
            except threading.BrokenBarrierError:
                pass  # the lock keeps the other writers out: this one writes alone
        return entries
    TuningFile.read = read  # type: ignore[method-assign]
    return original


def entry_name(writer: str, thread: int, round_: int) -> str:
    return f"GPU|{writer}-t{thread}-r{round_}"


def write_rounds(path: str, writer: str, threads: int, rounds: int, start: Any, reads: Any) -> None:
    """``threads`` threads, each storing one entry a round to the file ``path`` through its own
    ``TuningFile`` (as separate autotuners of one kernel would). Every round begins when all writers
    (of every process) are at ``start``; the first one through resets ``reads`` (the barrier of the
    store's reads, broken by the last round's timeout where there is a lock) before any passes the
    second ``start``. Raises the first exception of a thread."""
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        try:
            for r in range(rounds):
                if start.wait(WAIT) == 0:
                    reads.reset()
                start.wait(WAIT)
                TuningFile(Path(path), "race").store(entry_name(writer, thread, r),
                                                     {"config": {"BLOCK": 16 * (r + 1)}, "ms": 1.0})
        except BaseException as e:  # reported by the caller
            errors.append(e)
            start.abort()  # the others stop at their next wait instead of waiting for this one
            reads.abort()
    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(WAIT * (rounds + 1))
    if errors:
        raise errors[0]


def process_writer(path: str, writer: str, threads: int, rounds: int, start: Any, reads: Any,
                   pause: float, lock_kind: str | None) -> None:
    """Another process's writer: the store's reads paused (see the module docstring), the lock
    of kind ``lock_kind`` (None: the platform's), then :func:`write_rounds`."""
    if lock_kind is not None:
        from sparsile.driver import autotune_cache

        autotune_cache.LOCK_KIND = lock_kind
    pause_store_reads(reads, pause)
    write_rounds(path, writer, threads, rounds, start, reads)


def hold_lock(path: str, held: Any, release: Any, lock_kind: str | None) -> None:
    """Hold the lock of ``path`` (another process's tuning, stuck in its write) until ``release``."""
    from sparsile.driver import autotune_cache

    if lock_kind is not None:
        autotune_cache.LOCK_KIND = lock_kind
    with autotune_cache.locked(Path(path)):
        held.set()
        release.wait(WAIT)
