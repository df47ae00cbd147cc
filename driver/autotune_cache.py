"""What the autotuner remembers: the on-disk file of winners and shipped tables (its keys: autotune_keys.py).

A tuned choice is stored per GPU name, key values (an array's shape and dtype), the dtypes of
every array argument and the compiler version (docs/autotune.md). One JSON file per kernel and
config list lives under ``$SPARSILE_CACHE_DIR/autotune/``::

    {"format": "sparsile-autotune/1", "compiler": "sparsile 0.1.0+<hash>", "kernel": "add",
     "entries": {"NVIDIA H200|n=4096; dtypes: x=float32 y=float32": {"config": {...}, "ms": 0.01}}}

It is written to a temporary file in the same directory and ``os.replace``-d over the old one,
so a reader sees the old file or the new one, never half of one. Writers (processes, threads) take
the file's advisory lock (:func:`locked`) around reading the file again, merging their entry and
replacing it, so that two tuning at once each keep the other's entries. A lock not had within
``LOCK_TIMEOUT`` seconds skips the write with a warning (SP0775) naming the lock file (and for the
exclusive kind its holder): the choice stays in memory; an exclusive lock file whose holder is gone
is broken (:func:`_take_exclusive`). A
file that does not parse, has another format or another compiler version is ignored with a
warning (SP0774) and rewritten at the next store; a directory that cannot be written is reported
once (SP0775) and tuning goes on in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not POSIX (Windows): the exclusive-create lock below
    fcntl = None  # type: ignore[assignment]


from ..frontend.diagnostics import LaunchError

FORMAT = "sparsile-autotune/1"
TABLE_FORMAT = "sparsile-autotune-table/1"
SP_BAD_TABLE = "SP0773"
SP_STALE_FILE = "SP0774"
SP_UNWRITABLE = "SP0775"

LOCK_TIMEOUT = 10.0
"""Seconds a writer waits for another's lock on a cache file or table before it skips its write
(a lock is held for one read and one write of the file: milliseconds)."""
LOCK_KIND = "flock" if fcntl is not None else "exclusive"
"""How files are locked: ``flock`` (POSIX ``fcntl.flock`` on ``.<name>.flock``, released by the
system when its process ends; removed at release) or ``exclusive`` (the portable fallback, also
where a file system refuses ``flock``: ``.<name>.lock`` made with ``O_CREAT | O_EXCL``, holding
its holder's record (host, PID namespace, pid) and removed at release; one left by a process that
was killed holding it is broken by the next writer on that host that sees the pid gone,
:func:`_lock_state`). The tests run both."""
STALE_LOCK_AGE = 30.0
"""Seconds after which an exclusive lock file without a readable holder record (its holder stopped
between making it and writing the record, microseconds; or an older sparsile's empty lock file) is
taken as left behind and broken. Measured by the file's mtime against this host's clock."""


class AutotuneWarning(UserWarning):
    """A problem with the autotuner's disk cache: tuning goes on, the file is ignored or not written."""


def compiler_version() -> str:
    """The compiler version tuned entries are valid for (driver/cache.py's)."""
    from .cache import compiler_version as version

    return version()


def identity_hash(*parts: Any) -> str:
    """16 hex digits over the JSON of ``parts`` (a kernel's source, name, configs and key names)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:16]


class TuningFile:
    """The winners of one kernel and config list on disk (``path`` None: memory only)."""

    def __init__(self, path: Path | None, kernel: str):
        self.path = path
        self.kernel = kernel
        self._reported = False

    def _warn(self, code: str, message: str) -> None:
        warnings.warn(f"warning[{code}]: {message}", AutotuneWarning, stacklevel=4)

    def read(self, quiet: bool = False) -> dict[str, Any]:
        """The stored entries; {} (with a warning unless ``quiet``) when the file is missing,
        corrupt, of another format or of another compiler version."""
        if self.path is None:
            return {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as e:
            if not quiet:
                self._warn(SP_STALE_FILE, f"cannot read the autotuning cache `{self.path}` ({e.strerror}); "
                                          "tuning again")
            return {}
        try:
            data = json.loads(text)
            ok = isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("entries"), dict)
        except ValueError:
            ok = False
        if not ok:
            if not quiet:
                self._warn(SP_STALE_FILE, f"the autotuning cache `{self.path}` is corrupt or of another format; "
                                          "it is ignored and will be rewritten")
            return {}
        version = compiler_version()
        if data.get("compiler") != version:
            if not quiet:
                self._warn(SP_STALE_FILE, f"the autotuning cache `{self.path}` was written by "
                                          f"{data.get('compiler')!r}, not {version!r}; it is ignored and will be "
                                          "rewritten")
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}

    def store(self, entry: str, record: dict[str, Any]) -> None:
        """Add ``entry`` to what the file holds now (read again under its lock, :func:`locked`) and
        replace the file atomically; a warning (SP0775) and no write when the lock is not had
        within ``LOCK_TIMEOUT`` seconds or the directory cannot be written."""
        if self.path is None:
            return

        def merged() -> dict[str, Any]:
            entries = self.read(quiet=True)
            entries[entry] = record
            return {"format": FORMAT, "compiler": compiler_version(), "kernel": self.kernel, "entries": entries}
        try:
            update_json_atomic(self.path, merged)
        except LockTimeout as e:
            self._warn(SP_UNWRITABLE, f"cannot lock the autotuning cache `{self.path}` {e.strerror}; this tuned "
                                      "choice is kept in memory only")
        except OSError as e:
            if not self._reported:
                self._reported = True
                self._warn(SP_UNWRITABLE, f"cannot write the autotuning cache `{self.path}` ({e.strerror or e}); "
                                          "tuned choices are kept in memory only")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to a temporary file beside ``path`` and ``os.replace`` it over
    ``path``: a reader sees the old file or the new one (OSError when the directory is not
    writable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LockTimeout(OSError):
    """The lock of a file was not had in time (``strerror`` says how long and who holds it)."""


_thread_locks: dict[str, threading.Lock] = {}
_registry = threading.Lock()
_stuck: set[str] = set()
"""Files (by path) whose lock timed out in this process: the next writer tries once, without waiting
again (a program tuning many keys is not held up LOCK_TIMEOUT seconds per key), until one has it."""


def _forget_thread_locks() -> None:
    """In a forked child: the locks of this process's other threads are not held there."""
    global _registry
    _registry = threading.Lock()
    _thread_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_thread_locks)


def lock_path(path: Path, kind: str | None = None) -> Path:
    """The file the writers of ``path`` lock: ``.<name>.flock`` beside it for the ``flock`` kind,
    ``.<name>.lock`` for the ``exclusive`` one (default: ``LOCK_KIND``'s)."""
    return path.with_name(f".{path.name}.{'flock' if (kind or LOCK_KIND) == 'flock' else 'lock'}")


@contextlib.contextmanager
def locked(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold the advisory lock of ``path`` (its writers', not its readers': a reader sees the old
    file or the new one anyway) for the ``with`` block: a lock per path among this process's
    threads, then one among processes on :func:`lock_path` (``LOCK_KIND``; the exclusive kind
    where the file system refuses ``flock``). Waits at most ``timeout`` seconds (default
    ``LOCK_TIMEOUT``), then raises :class:`LockTimeout`; an OSError when the lock file cannot be
    made (a directory that cannot be written). ``path``'s directory is made if needed."""
    name = os.path.normcase(os.path.abspath(path))
    wait = LOCK_TIMEOUT if timeout is None else timeout
    if name in _stuck:
        wait = 0.0
    deadline = time.monotonic() + wait
    with _registry:
        inner = _thread_locks.setdefault(name, threading.Lock())
    if not inner.acquire(timeout=max(0.0, wait)):
        _stuck.add(name)
        raise LockTimeout(errno.ETIMEDOUT, f"within {wait:g} s (another thread of this process holds it)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = LOCK_KIND
        if kind == "flock":
            try:
                release = _take_flock(lock_path(path, kind), deadline)
            except _FlockUnsupported:
                kind = "exclusive"
        holder = ""
        if kind != "flock":
            release, holder = _take_exclusive(lock_path(path, kind), deadline)
        if release is None:
            _stuck.add(name)
            raise LockTimeout(errno.ETIMEDOUT, f"within {wait:g} s (another process holds `{lock_path(path, kind)}`"
                                               f"{holder})")
        _stuck.discard(name)
        try:
            yield
        finally:
            release()
    finally:
        inner.release()


def _pause(tries: int) -> float:
    return min(0.05, 0.001 * 2 ** min(tries, 6))


class _FlockUnsupported(Exception):
    """The file system refuses ``flock`` (some network file systems): the exclusive kind instead."""


_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP), errno.ENOSYS}


def _take_flock(lock: Path, deadline: float) -> Callable[[], None] | None:
    """``flock`` the file ``lock`` (made if missing); the release, which removes the file before it
    unlocks it, or None at the deadline. A waiter that then has the lock of a removed file sees
    that ``lock`` is another file (or none) and takes the new one instead."""
    assert fcntl is not None
    tries = 0
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except (BlockingIOError, PermissionError):  # held (EWOULDBLOCK; EACCES on some systems)
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return None
                    time.sleep(_pause(tries))
                    tries += 1
                except OSError as e:
                    if e.errno not in _NO_FLOCK:
                        raise
                    with contextlib.suppress(OSError):
                        os.unlink(lock)
                    raise _FlockUnsupported from e
            mine = os.fstat(fd)
            try:
                now = os.stat(lock)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            def release(fd: int = fd) -> None:
                with contextlib.suppress(OSError):
                    os.unlink(lock)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return release
        os.close(fd)  # the lock of a file its holder removed as it let go: take the file there now
        if time.monotonic() >= deadline:
            return None


def _pid_namespace() -> str:
    """This process's PID namespace (Linux: ``pid:[4026531836]``; "" elsewhere): two containers
    that share a hostname and a cache directory see other pids."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _holder_record() -> bytes:
    """What an exclusive lock file holds: its holder's host, PID namespace and pid, and a token
    (two records are never equal, so a lock is known by its record)."""
    return json.dumps({"host": socket.gethostname(), "pidns": _pid_namespace(), "pid": os.getpid(),
                       "token": os.urandom(8).hex()}).encode()


@dataclasses.dataclass(frozen=True)
class _LockState:
    """An exclusive lock file as a waiter found it: ``identity`` (device, inode, mtime and record:
    which lock it is), ``stale`` (its holder is known to be gone) and ``holder`` (for the timeout's
    message)."""

    identity: str
    stale: bool
    holder: str


def _alive(pid: int) -> bool:
    """A process of this PID namespace has ``pid`` (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


def _lock_state(lock: Path) -> _LockState | None:
    """What the exclusive lock file ``lock`` says of its holder, None where it cannot be opened
    (released meanwhile). Stale: a holder on this host (same hostname and PID namespace) whose pid
    no process has, on POSIX (``os.kill(pid, 0)``; Windows' would signal it); or no readable record
    and an mtime older than STALE_LOCK_AGE. A holder on another host, or of another PID namespace,
    is never taken as gone: the timeout's message names it."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # gone (released meanwhile); Windows: being removed
        return None
    try:
        seen = os.fstat(fd)
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    identity = hashlib.sha256(f"{seen.st_dev}:{seen.st_ino}:{seen.st_mtime_ns}:".encode() + text).hexdigest()[:16]
    try:
        record = json.loads(text)
        host, pidns, pid = record["host"], record.get("pidns", ""), record["pid"]
        ok = isinstance(host, str) and isinstance(pidns, str) and type(pid) is int and pid > 0
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        return _LockState(identity, time.time() - seen.st_mtime > STALE_LOCK_AGE,
                          f": a lock file without its holder's record, taken as left behind once it is "
                          f"{STALE_LOCK_AGE:g} s old; if no program is tuning, delete it")
    if host != socket.gethostname():
        return _LockState(identity, False, f": pid {pid} on host `{host}`; if no program is tuning there, delete "
                                           "it: one stopped while it held the lock left it")
    if pidns != _pid_namespace():
        return _LockState(identity, False, f": pid {pid} on host `{host}` (another PID namespace: {pidns}); if "
                                           "no program is tuning there, delete it: one stopped while it held the "
                                           "lock left it")
    if os.name == "posix" and pid != os.getpid() and not _alive(pid):
        return _LockState(identity, True, f": pid {pid} on this host, which has ended")
    return _LockState(identity, False, f": pid {pid} on this host `{host}`, running; if it is not tuning, delete "
                                       "the lock file")


def _break_stale(lock: Path, stale: _LockState) -> bool:
    """Remove the lock file ``lock`` if it is still the stale lock ``stale`` (True where this
    waiter removed it). Under a marker made with ``O_EXCL`` whose name is the stale lock's identity,
    so one waiter breaks it: another that found the same stale lock makes the marker after it (or
    fails to while it is held), sees that ``lock`` is no longer that lock (released, or taken again
    since: a new record) and leaves it. The marker is removed after; one left by a waiter that
    stopped while breaking is removed once STALE_LOCK_AGE old, so the stale lock is broken later."""
    marker = lock.with_name(f"{lock.name}.break-{stale.identity}")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if time.time() - marker.stat().st_mtime > STALE_LOCK_AGE:
                marker.unlink()
        return False
    except OSError:
        return False
    os.close(fd)
    try:
        now = _lock_state(lock)
        if now is None or now.identity != stale.identity:
            return False
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        return True
    finally:
        with contextlib.suppress(OSError):
            marker.unlink()


def _take_exclusive(lock: Path, deadline: float) -> tuple[Callable[[], None] | None, str]:
    """Make the file ``lock`` with ``O_CREAT | O_EXCL`` (one maker wins, on every platform and
    file system) and write this process's record to it; (the release, which removes it, "") or, at
    the deadline, (None, what the lock file says of its holder, for the timeout's message). A
    lock whose holder is gone (:func:`_lock_state`) is broken (:func:`_break_stale`) and the lock
    taken again at once."""
    tries = 0
    holder = ""
    while True:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            state = _lock_state(lock)
            if state is not None:
                if state.stale and _break_stale(lock, state):
                    continue
                holder = state.holder
        except PermissionError:  # Windows: a lock file being removed; elsewhere a directory not writable
            if os.name != "nt" or not lock.parent.is_dir():
                raise
        else:
            try:
                try:
                    os.write(fd, _holder_record())
                finally:
                    os.close(fd)
            except BaseException:  # (a full disk, an interrupt: the empty lock file stayed STALE_LOCK_AGE)
                with contextlib.suppress(OSError):
                    lock.unlink()
                raise
            return (lambda: lock.unlink(missing_ok=True)), ""
        if time.monotonic() >= deadline:
            return None, holder
        time.sleep(_pause(tries))
        tries += 1


def update_json_atomic(path: Path, update: Callable[[], Any], timeout: float | None = None) -> Any:
    """Under ``path``'s lock (:func:`locked`): ``data = update()`` (which reads the file again and
    merges into it), then :func:`write_json_atomic`; returns ``data``. LockTimeout (an OSError) when
    the lock is not had in time, OSError when the directory is not writable."""
    with locked(path, timeout):
        data = update()
        write_json_atomic(path, data)
    return data


def write_table(path: Path, merge: Callable[[], Any], own: Any) -> Path:
    """Write a tuning table: ``merge()`` (``own``, this run's table, merged with the file as it is
    then) to ``path`` under its lock. When the lock is not had within ``LOCK_TIMEOUT`` seconds,
    ``own`` goes beside it to ``<stem>.<pid><suffix>`` with a warning (SP0775), so that a long run
    keeps its results; returns the path written."""
    try:
        update_json_atomic(path, merge)
        return path
    except LockTimeout as e:
        aside = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")
        write_json_atomic(aside, own)
        warnings.warn(f"warning[{SP_UNWRITABLE}]: cannot lock the tuning table `{path}` {e.strerror}; this run's "
                      f"table was written to `{aside}` instead", AutotuneWarning, stacklevel=3)
        return aside


def tuning_path(kernel: str, identity: str) -> Path | None:
    """``<cache dir>/autotune/<kernel>-<identity>.json``, or None when disk caching is off."""
    from .cache import cache_dir_from_env

    directory = cache_dir_from_env()
    return None if directory is None else directory / "autotune" / f"{kernel}-{identity}.json"


def load_table(table: Any) -> dict[str, dict[str, Any]]:
    """A shipped table of choices: a mapping ``{key: config}`` or the path of a JSON file holding
    one (or ``{"format": "sparsile-autotune-table/1", "entries": {...}}``). A key is a cache key
    (``n=4096; dtypes: ...``), ``GPU name|key``, or ``*`` for every call. LaunchError SP0773 when
    it cannot be read or is not such a mapping."""
    if table is None:
        return {}
    source = "the defaults= mapping"
    if isinstance(table, str | os.PathLike):
        source = f"`{os.fspath(table)}`"
        try:
            table = json.loads(Path(table).read_text(encoding="utf-8"))
        except OSError as e:
            raise LaunchError(SP_BAD_TABLE, f"cannot read the autotuning table {source}: {e.strerror}") from None
        except ValueError as e:
            raise LaunchError(SP_BAD_TABLE, f"the autotuning table {source} is not JSON: {e}") from None
        if isinstance(table, dict) and "entries" in table:
            table = table["entries"]
    if not isinstance(table, Mapping) or not all(isinstance(k, str) and isinstance(v, Mapping)
                                                  for k, v in table.items()):
        raise LaunchError(SP_BAD_TABLE, f"the autotuning table {source} must map cache keys to configs "
                                        "(dicts of constexpr values and options)",
                          help='e.g. {"n=4096; dtypes: x=float32": {"BLOCK": 1024, "num_warps": 4}, '
                               '"*": {"BLOCK": 256}}')
    return {k: dict(v) for k, v in table.items()}


def table_choice(table: Mapping[str, dict[str, Any]], gpu: str, key: str) -> dict[str, Any] | None:
    """The table's config for ``key`` on ``gpu``: ``gpu|key``, then ``key``, then ``*``."""
    for name in (f"{gpu}|{key}", key, "*"):
        if name in table:
            return table[name]
    return None
