"""Writers of one autotuning cache file or tuning table at once (driver/autotune_cache.py,
docs/autotune.md "The cache"): the read-merge-write of each happens under an advisory lock, so no
writer's entries are lost, and a lock that cannot be had in time skips the write with a warning
instead of hanging.

The race is forced (tests/support/cache_race.py): each store's read waits at a barrier for the
other writers' reads, so without the lock every round loses all but one of its entries; with it
the barrier times out once a round. Both lock kinds run: ``flock`` (POSIX) and ``exclusive`` (the
portable fallback: a lock file made with O_EXCL)."""

from __future__ import annotations

import errno
import importlib.util
import json
import multiprocessing
import os
import re
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from sparsile.driver import autotune_cache
from sparsile.driver.autotune_cache import AutotuneWarning, TuningFile
from sparsile.tests.support import cache_race

KINDS = ["flock", "exclusive"] if importlib.util.find_spec("fcntl") else ["exclusive"]


@pytest.fixture(autouse=True)
def _lock_kind_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LOCK_KIND", "LOCK_TIMEOUT", "_stuck"):  # raising=False: the tests ran before there was a lock
        monkeypatch.setattr(autotune_cache, name, getattr(autotune_cache, name, None), raising=False)
    monkeypatch.setattr(autotune_cache, "_stuck", set(), raising=False)


def _processes() -> Any:
    """A multiprocessing context whose processes do not share this one's state: forkserver (each
    process a fork of one server that imported sparsile once, not one import of ~3 s each, on a
    single thread, not of this multi-threaded test process) where there is one, else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["sparsile.tests.support.cache_race"])
    return ctx


def _entries(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert data["format"] == autotune_cache.FORMAT and data["kernel"] == "race"
    return data["entries"]


def _expected(writers: list[str], threads: int, rounds: int) -> set[str]:
    return {cache_race.entry_name(w, t, r) for w in writers for t in range(threads) for r in range(rounds)}


@pytest.mark.parametrize("kind", KINDS)
def test_threads_storing_different_keys_lose_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   kind: str) -> None:
    """4 threads x 8 rounds, each thread through its own TuningFile of one path, reads forced to
    interleave: every entry is in the file (before the lock, 8 of the 32 were)."""
    monkeypatch.setattr(autotune_cache, "LOCK_KIND", kind, raising=False)
    threads, rounds = 4, 8
    start, reads = threading.Barrier(threads), threading.Barrier(threads)
    monkeypatch.setattr(TuningFile, "read", TuningFile.read)  # restored after the test
    cache_race.pause_store_reads(reads, 0.2)
    path = tmp_path / "cache" / "autotune" / "race-0123.json"
    cache_race.write_rounds(str(path), "main", threads, rounds, start, reads)
    assert set(_entries(path)) == _expected(["main"], threads, rounds)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no lock or temporary file left


@pytest.mark.parametrize("kind", [None, "exclusive"])
def test_processes_and_threads_storing_different_keys_lose_none(tmp_path: Path, kind: str | None) -> None:
    """3 processes of 2 threads each, 6 rounds, reads forced to interleave across all six
    writers: every one of the 36 entries is in the file (before the lock, about one a round was)."""
    ctx = _processes()
    procs, threads, rounds = 3, 2, 6
    _race_and_check(ctx, tmp_path / "race.json", procs, threads, rounds, kind)


def _race_and_check(ctx, path: Path, procs: int, threads: int, rounds: int, kind: str | None) -> None:
    """``procs`` processes of ``threads`` writer threads each store ``rounds`` keys of their own to
    ``path``, reads forced to interleave; every entry is in the file and no lock or temporary file
    is left."""
    start, reads = ctx.Barrier(procs * threads), ctx.Barrier(procs * threads)
    writers = [f"p{i}" for i in range(procs)]
    workers = [ctx.Process(target=cache_race.process_writer,
                           args=(str(path), w, threads, rounds, start, reads, 0.3, kind)) for w in writers]
    for p in workers:
        p.start()
    for p in workers:
        p.join(cache_race.WAIT * 2)
    codes = [p.exitcode for p in workers]
    for p in workers:
        if p.exitcode is None:
            p.kill()
    assert codes == [0] * procs
    assert set(_entries(path)) == _expected(writers, threads, rounds)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def _held(path: Path, kind: str, holder: str) -> tuple[Any, Any]:
    """The lock of ``path`` held by another thread or process until the returned
    ``release`` is set (and ``done`` joins the holder)."""
    if holder == "thread":
        held, release = threading.Event(), threading.Event()
        worker: Any = threading.Thread(target=cache_race.hold_lock, args=(str(path), held, release, kind))
    else:
        ctx = _processes()
        held, release = ctx.Event(), ctx.Event()
        worker = ctx.Process(target=cache_race.hold_lock, args=(str(path), held, release, kind))
    worker.start()
    deadline = time.monotonic() + cache_race.WAIT
    while not held.wait(0.05):  # a holder that failed (no lock to take) ends the test at once
        assert worker.is_alive() and time.monotonic() < deadline, "the lock holder did not take the lock"
    return release, worker


@pytest.mark.parametrize("kind, holder", [(k, "thread") for k in KINDS] + [(KINDS[0], "process")])
def test_a_lock_held_elsewhere_times_out_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        kind: str, holder: str) -> None:
    """A store that cannot take the lock in LOCK_TIMEOUT seconds warns (SP0775) and skips the write
    (the file as it was, the choice in memory only); the next store of that file while it is still
    stuck tries once and does not wait again. Once the holder lets go, stores write again."""
    monkeypatch.setattr(autotune_cache, "LOCK_KIND", kind, raising=False)
    monkeypatch.setattr(autotune_cache, "LOCK_TIMEOUT", 1.0, raising=False)
    path = tmp_path / "race.json"
    cache = TuningFile(path, "race")
    cache.store("GPU|a", {"config": {"BLOCK": 16}})
    before = path.read_text()
    release, worker = _held(path, kind, holder)
    try:
        started = time.monotonic()
        with pytest.warns(AutotuneWarning, match=r"SP0775.*cannot lock the autotuning cache `.*race\.json` within "
                                                 r"1 s.*kept in memory only"):
            cache.store("GPU|b", {"config": {"BLOCK": 32}})
        first = time.monotonic() - started
        started = time.monotonic()
        with pytest.warns(AutotuneWarning, match="SP0775"):
            TuningFile(path, "race").store("GPU|c", {"config": {"BLOCK": 64}})
        again = time.monotonic() - started
        assert path.read_text() == before
    finally:
        release.set()
        worker.join(cache_race.WAIT)
    assert 0.9 <= first < 10 and again < 0.5  # waited the timeout once, then tried without waiting
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.store("GPU|d", {"config": {"BLOCK": 128}})
    assert set(_entries(path)) == {"GPU|a", "GPU|d"}


@pytest.mark.skipif("flock" not in KINDS, reason="no fcntl.flock here")
def test_where_flock_is_refused_the_exclusive_lock_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that refuses flock (ENOLCK: NFS without its lock daemon) gets the exclusive
    lock file: stores still write, and one held elsewhere (here a fresh lock file without its
    holder's record, respected until STALE_LOCK_AGE old) times out with a warning that names it."""
    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(autotune_cache.fcntl, "flock", refuse)
    monkeypatch.setattr(autotune_cache, "LOCK_KIND", "flock", raising=False)
    monkeypatch.setattr(autotune_cache, "LOCK_TIMEOUT", 0.3, raising=False)
    path = tmp_path / "race.json"
    cache = TuningFile(path, "race")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.store("GPU|a", {"config": {"BLOCK": 16}})
    assert [p.name for p in tmp_path.iterdir()] == ["race.json"]
    left = tmp_path / ".race.json.lock"
    left.write_text("")
    with pytest.warns(AutotuneWarning, match=r"SP0775.*within 0\.3 s \(another process holds `.*\.race\.json\.lock`: "
                                             r"a lock file without .*; if no program is tuning, delete it"):
        cache.store("GPU|b", {"config": {"BLOCK": 32}})
    left.unlink()
    cache.store("GPU|c", {"config": {"BLOCK": 64}})
    assert set(_entries(path)) == {"GPU|a", "GPU|c"}
    assert [p.name for p in tmp_path.iterdir()] == ["race.json"]


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_and_foreign_files_are_replaced_under_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               kind: str) -> None:
    """What the file holds is read again under the lock: a corrupt file or one of another compiler
    is replaced by the new entry alone (as without concurrency), quietly at the store."""
    monkeypatch.setattr(autotune_cache, "LOCK_KIND", kind, raising=False)
    path = tmp_path / "race.json"
    for text in ("{not json", json.dumps({"format": autotune_cache.FORMAT, "compiler": "sparsile 0.0.0+old",
                                          "entries": {"GPU|old": {"config": {}}}})):
        path.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            TuningFile(path, "race").store("GPU|new", {"config": {"BLOCK": 16}})
        assert set(_entries(path)) == {"GPU|new"}


def test_an_unwritable_directory_is_still_reported_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock file cannot be made in a directory that cannot be written: SP0775 as before, once."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = TuningFile(blocker / "autotune" / "race.json", "race")
    with pytest.warns(AutotuneWarning, match=r"SP0775.*cannot write the autotuning cache .*in memory only"):
        cache.store("GPU|a", {"config": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.store("GPU|b", {"config": {}})


def _fake_table_writer(monkeypatch: pytest.MonkeyPatch) -> Any:
    from sparsile.backend.runtime import bench
    from sparsile.stdlib.kernels import tuning

    monkeypatch.setattr(bench, "device_name", lambda ordinal=None: "NVIDIA H200")
    return tuning


def test_tables_written_at_once_keep_both_runs_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `sparsile tune -o t.json` runs of other shapes finishing at once, each merging the file
    with its own entries (merged_table, forced to interleave): both runs' entries are in the file
    (before, the last writer's merge, made without the other's entries, replaced the file)."""
    tuning = _fake_table_writer(monkeypatch)
    reads = threading.Barrier(2)
    merged_table = tuning.merged_table

    def merged_then_wait(path: Path, table: dict[str, Any]) -> dict[str, Any]:
        result = merged_table(path, table)
        try:
            reads.wait(0.3)
        except threading.BrokenBarrierError:
            pass
        return result
    monkeypatch.setattr(tuning, "merged_table", merged_then_wait)
    out = tmp_path / "t.json"
    errors: list[BaseException] = []

    def run(key: str) -> None:
        try:
            tuning.finished_table({key: {"config": {"bn": 64}}}, out)
        except BaseException as e:
            errors.append(e)
    workers = [threading.Thread(target=run, args=(k,)) for k in ("bf16 1x2x3", "f16 4x5x6")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(cache_race.WAIT)
    assert errors == []
    assert set(json.loads(out.read_text())["entries"]) == {"bf16 1x2x3", "f16 4x5x6"}
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


def test_a_table_whose_lock_is_held_goes_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning run must not lose its results to a stuck lock: its table goes to `t.<pid>.json`
    with a warning naming it, and the table file is left as it was."""
    import os

    tuning = _fake_table_writer(monkeypatch)
    monkeypatch.setattr(autotune_cache, "LOCK_TIMEOUT", 0.3, raising=False)
    out = tmp_path / "t.json"
    tuning.finished_table({"bf16 1x2x3": {"config": {"bn": 64}}}, out)
    before = out.read_text()
    release, worker = _held(out, KINDS[0], "thread")
    try:
        aside = tmp_path / f"t.{os.getpid()}.json"
        with pytest.warns(AutotuneWarning, match=rf"SP0775.*cannot lock the tuning table `.*t\.json` within 0\.3 s.*"
                                                 rf"this run's table was written to `.*{aside.name}` instead"):
            table = tuning.finished_table({"f16 4x5x6": {"config": {"bn": 32}}}, out)
    finally:
        release.set()
        worker.join(cache_race.WAIT)
    assert out.read_text() == before
    assert json.loads(aside.read_text()) == table


# ------------------------------------------------------------------------------------------------
# the exclusive lock left behind: its holder (host, pid) recorded, a dead holder's lock broken


posix_only = pytest.mark.skipif(not hasattr(os, "fork"), reason="holders are told alive by os.kill(pid, 0) on POSIX")


def _exclusive(monkeypatch: pytest.MonkeyPatch, timeout: float) -> None:
    monkeypatch.setattr(autotune_cache, "LOCK_KIND", "exclusive", raising=False)
    monkeypatch.setattr(autotune_cache, "LOCK_TIMEOUT", timeout, raising=False)


def _left_by_killed_process(path: Path) -> tuple[Path, int]:
    """The exclusive lock of ``path`` as a process killed while it held it (SIGKILL: no release)
    leaves it; returns the lock file and the dead holder's pid."""
    _release, worker = _held(path, "exclusive", "process")
    worker.kill()
    worker.join(cache_race.WAIT)
    assert worker.exitcode is not None
    lock = autotune_cache.lock_path(path, "exclusive")
    assert lock.exists()
    return lock, worker.pid


def _record(lock: Path, **changes: Any) -> dict[str, Any]:
    """The holder record a lock file holds (JSON: host, pid, ...), with ``changes``, written back."""
    record = json.loads(lock.read_text())
    record.update(changes)
    lock.write_text(json.dumps(record))
    return record


def _stores_quietly(path: Path, entry: str) -> float:
    """Store ``entry`` with every warning an error; the seconds it took."""
    started = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TuningFile(path, "race").store(entry, {"config": {"BLOCK": 16}})
    return time.monotonic() - started


@posix_only
def test_a_lock_left_by_a_killed_process_is_broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process killed while it held the exclusive lock leaves the lock file, which names it (this
    host, its pid); the next store sees that no such process runs here, breaks the lock and writes,
    without waiting or a warning, and leaves no file behind. Before, the file was empty and every
    store of that path timed out (SP0775) until someone deleted it."""
    _exclusive(monkeypatch, 5.0)
    path = tmp_path / "race.json"
    lock, pid = _left_by_killed_process(path)
    record = json.loads(lock.read_text())
    assert record["pid"] == pid and record["host"] == socket.gethostname()
    assert _stores_quietly(path, "GPU|a") < 1.0
    assert set(_entries(path)) == {"GPU|a"}
    assert [p.name for p in tmp_path.iterdir()] == ["race.json"]


@posix_only
def test_a_running_holder_s_lock_is_respected_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock whose holder runs on this host is not broken: a process holding it, or a lock file that
    names this very process. The store times out (SP0775) with a warning naming the lock file and
    its holder."""
    _exclusive(monkeypatch, 0.5)
    path = tmp_path / "race.json"
    host = re.escape(socket.gethostname())
    release, worker = _held(path, "exclusive", "process")
    try:
        with pytest.warns(AutotuneWarning, match=rf"SP0775.*cannot lock the autotuning cache `.*race\.json` within "
                                                 rf"0\.5 s \(another process holds `.*\.race\.json\.lock`: pid "
                                                 rf"{worker.pid} on this host `{host}`, running; if it is not "
                                                 rf"tuning, delete the lock file\)"):
            TuningFile(path, "race").store("GPU|a", {"config": {}})
    finally:
        release.set()
        worker.join(cache_race.WAIT)
    lock, _ = _left_by_killed_process(path)
    _record(lock, pid=os.getpid())  # this process: alive
    monkeypatch.setattr(autotune_cache, "_stuck", set(), raising=False)
    with pytest.warns(AutotuneWarning, match=rf"SP0775.*holds `.*\.race\.json\.lock`: pid {os.getpid()} on this "
                                             rf"host `{host}`, running"):
        TuningFile(path, "race").store("GPU|b", {"config": {}})
    assert lock.exists() and json.loads(lock.read_text())["pid"] == os.getpid()
    lock.unlink()
    _stores_quietly(path, "GPU|c")
    assert set(_entries(path)) == {"GPU|c"}


@posix_only
def test_a_lock_from_another_host_is_respected_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock file naming a holder on another host (a cache directory on a network file system):
    whether that process runs cannot be told from here, so the lock is respected even where the pid
    is not alive here; the warning names the lock file, the host and the pid, to delete it by hand.
    So is a lock of another PID namespace of this host (a container sharing its hostname)."""
    _exclusive(monkeypatch, 0.3)
    path = tmp_path / "race.json"
    lock, pid = _left_by_killed_process(path)
    _record(lock, host="elsewhere.example")
    with pytest.warns(AutotuneWarning, match=rf"SP0775.*within 0\.3 s \(another process holds "
                                             rf"`{re.escape(str(lock))}`: pid {pid} on host `elsewhere\.example`; "
                                             r"if no program is tuning there, delete it: one stopped while it "
                                             r"held the lock left it\)"):
        TuningFile(path, "race").store("GPU|a", {"config": {}})
    record = _record(lock, host=socket.gethostname(), pidns="pid:[1]")
    monkeypatch.setattr(autotune_cache, "_stuck", set(), raising=False)
    if autotune_cache._pid_namespace() != "pid:[1]":
        with pytest.warns(AutotuneWarning, match=rf"SP0775.*pid {pid} on host `{re.escape(record['host'])}` "
                                                 r"\(another PID namespace: pid:\[1\]\)"):
            TuningFile(path, "race").store("GPU|b", {"config": {}})
    assert lock.exists() and not path.exists()


@pytest.mark.parametrize("text", ["", "{not json", '{"pid": "x"}'])
def test_an_empty_or_garbled_lock_is_broken_only_once_old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         text: str) -> None:
    """A lock file without a readable holder (its holder stopped between making it and writing its
    record, or an older sparsile's empty lock file): the holder's record follows the file's creation
    within microseconds, so a recent one is respected (the warning says what it is), and one older
    than STALE_LOCK_AGE (by its mtime) is taken as left behind and broken."""
    _exclusive(monkeypatch, 0.3)
    path = tmp_path / "race.json"
    lock = autotune_cache.lock_path(path, "exclusive")
    lock.write_text(text)
    with pytest.warns(AutotuneWarning, match=rf"SP0775.*within 0\.3 s \(another process holds `.*\.race\.json\.lock`: "
                                             rf"a lock file without its holder's record, taken as left behind once "
                                             rf"it is {autotune_cache.STALE_LOCK_AGE:g} s old; if no program is "
                                             r"tuning, delete it\)"):
        TuningFile(path, "race").store("GPU|a", {"config": {}})
    old = time.time() - autotune_cache.STALE_LOCK_AGE - 5
    os.utime(lock, (old, old))
    _stores_quietly(path, "GPU|b")
    assert set(_entries(path)) == {"GPU|b"}
    assert [p.name for p in tmp_path.iterdir()] == ["race.json"]


@posix_only
def test_a_stale_lock_is_broken_once_not_a_live_one_taken_since(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two waiters that both saw the same dead holder's lock: the first breaks it (and may take the
    lock at once); the second, breaking late, must not remove the live lock taken since. Breaking is
    done under a marker file named after the stale lock's identity (device, inode, mtime, record),
    made with O_EXCL, and the lock is removed only if it is still that one."""
    _exclusive(monkeypatch, 1.0)
    path = tmp_path / "race.json"
    lock, _ = _left_by_killed_process(path)
    first, second = autotune_cache._lock_state(lock), autotune_cache._lock_state(lock)
    assert first is not None and first.stale and second == first
    assert autotune_cache._break_stale(lock, first)
    assert not lock.exists()
    with autotune_cache.locked(path):  # the first waiter takes the lock; the second breaks late
        live = lock.read_text()
        assert not autotune_cache._break_stale(lock, second)
        assert lock.read_text() == live
    assert [p.name for p in tmp_path.iterdir()] == []


@posix_only
def test_processes_racing_to_break_a_stale_lock_lose_no_entries(tmp_path: Path) -> None:
    """A dead holder's lock left on the file that 3 processes of 2 threads each then store to, reads
    forced to interleave: all six first writers find the stale lock at once and race to break it; if
    two could break it and both hold the lock, entries would be lost. Every entry is in the file."""
    path = tmp_path / "race.json"
    ctx = _processes()
    _release, worker = _held(path, "exclusive", "process")
    worker.kill()
    worker.join(cache_race.WAIT)
    assert autotune_cache.lock_path(path, "exclusive").exists()
    procs, threads, rounds = 3, 2, 3
    _race_and_check(ctx, path, procs, threads, rounds, "exclusive")



@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_an_exclusive_lock_whose_record_cannot_be_written_is_not_left_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The lock file made, its holder's record not written (a full disk, an interrupt): the empty file
    stayed, and every writer of that file (of this process at once: it was marked stuck) timed out
    until it was STALE_LOCK_AGE old. It is removed as the error goes up."""
    _exclusive(monkeypatch, 0.5)
    path = tmp_path / "full.json"

    def write(fd: int, data: bytes) -> int:
        raise error

    monkeypatch.setattr(autotune_cache.os, "write", write)
    with pytest.raises(type(error)), autotune_cache.locked(path):
        pass
    monkeypatch.undo()
    _exclusive(monkeypatch, 0.5)
    assert [p.name for p in tmp_path.iterdir()] == []
    with autotune_cache.locked(path):
        pass
