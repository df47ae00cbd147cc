"""The compile cache: an in-memory LRU in front of an on-disk directory of entries.

An entry is a few named binary blobs (``ptx``, ``cubin``, ...) plus a small JSON metadata
dict, stored under a key that hashes everything the output depends on (:func:`make_key`).

Disk location: ``$SPARSILE_CACHE_DIR``, default ``~/.cache/sparsile``. ``SPARSILE_CACHE_DIR=off``
or ``SPARSILE_NO_DISK_CACHE=1`` keeps the cache in memory only.

Disk format (one file per entry, ``<dir>/v1/<key[:2]>/<key>.entry``): magic, a little-endian
u32 header length, a JSON header (key, metadata, blob names and sizes), the blobs, and a
SHA-256 of everything before it. Writes go to a temporary file in the same directory that is
then ``os.replace``-d over the entry, so concurrent readers see either nothing or a complete
entry, and concurrent writers of the same key simply race to install identical content. Any
entry that fails to parse or verify is treated as a miss.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import threading
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..version import __version__

ENV_CACHE_DIR = "SPARSILE_CACHE_DIR"
ENV_NO_DISK_CACHE = "SPARSILE_NO_DISK_CACHE"
FORMAT_VERSION = "v1"
_MAGIC = b"SPARSILE-CACHE\x01\n"
_DIGEST_SIZE = 32
_OFF_VALUES = frozenset({"off", "none", "0", "false", "no", "disable", "disabled"})
_ON_VALUES = frozenset({"1", "true", "yes", "on"})
_BLOB_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_KEY = re.compile(r"^[0-9a-f]{64}$")
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_COMPILER_SOURCE_DIRS = ("frontend", "backend", "driver", "target", "grammar")


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


@functools.cache
def compiler_version() -> str:
    """``sparsile <version>+<hash>``: the package version plus a hash of the compiler's own
    sources (frontend, backend, grammar, top-level modules), so that an editable install never
    reuses entries produced by different compiler code. (The version is ``sparsile.__version__``,
    which tests/test_packaging.py keeps equal to pyproject's: ``importlib.metadata`` would cost a
    fresh process ~20 ms of imports and a scan of every installed distribution.)"""
    digest = hashlib.sha256()
    files = sorted(_PACKAGE_ROOT.glob("*.py"))
    for sub in _COMPILER_SOURCE_DIRS:
        files += sorted(p for p in (_PACKAGE_ROOT / sub).rglob("*") if p.suffix in (".py", ".lark"))
    for path in files:
        try:
            digest.update(str(path.relative_to(_PACKAGE_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
        except OSError:
            continue
    return f"sparsile {__version__}+{digest.hexdigest()[:16]}"


def _nvjitlink_identity() -> str:
    """The nvJitLink library the cubins come from: the wheel's file by name, size and mtime
    (a stat, no loading: a cache hit in a fresh process never loads nvJitLink), else the version
    the loaded library reports."""
    from ..backend.toolchain import nvjitlink

    path = nvjitlink.library_file()
    if path is not None:
        stat = os.stat(path)
        return f"{os.path.basename(path)} {stat.st_size} {stat.st_mtime_ns}"
    try:
        return ".".join(map(str, nvjitlink.library().version()))
    except Exception:
        return "unavailable"


@functools.cache
def toolchain_versions() -> dict[str, str]:
    """The versions a compiled artifact depends on: compiler, llvmlite (LLVM), nvJitLink, the
    whole-program ptxas of ``setmaxnreg`` kernels (backend/toolchain/whole_program.py), and Python,
    NumPy and ml_dtypes, whose code a kernel folds captured values through (``str(v)`` of an
    ``IntEnum`` member, NumPy's arithmetic of a scalar default: frontend/sema/class_code.py)."""
    import platform

    import llvmlite
    import ml_dtypes
    import numpy as np

    from ..backend.toolchain import whole_program

    return {"compiler": compiler_version(), "llvmlite": llvmlite.__version__, "nvjitlink": _nvjitlink_identity(),
            "ptxas": whole_program.identity(),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__}


def _versions_now() -> dict[str, str]:
    """:func:`toolchain_versions` and the lowering switches set in the environment now (a kernel
    compiled with one is another build): the lane exchange of stores (backend/lower/lane_exchange.py)."""
    from ..backend.lower import lane_exchange

    if lane_exchange.enabled():
        return toolchain_versions()
    return {**toolchain_versions(), "lane_exchange_stores": "off"}


def _canonical_options(options: object) -> str:
    if options is None:
        return "None"
    if isinstance(options, Mapping):
        return repr(sorted((str(k), repr(v)) for k, v in options.items()))
    return repr(options)


def make_key(*, target: object, source: str, kernel_name: str, specialization: object = None,
             options: object = None, versions: Mapping[str, str] | None = None, captures: str = "") -> str:
    """The SHA-256 (hex) over everything a compiled kernel depends on: toolchain versions
    (:func:`toolchain_versions` unless ``versions`` is given), target name, source text,
    kernel name, ``repr`` of the specialization key, the options (a mapping's items are
    sorted, so their order does not matter) and what a ``@jit`` kernel captured from Python
    (:meth:`~sparsile.frontend.sema.captures.CaptureSet.disk_key`: its globals, closure values and
    inlined helpers' sources)."""
    fields = {
        "captures": captures,
        "versions": dict(sorted((versions if versions is not None else _versions_now()).items())),
        "target": getattr(target, "name", None) or str(target),
        "source": source,
        "kernel": kernel_name,
        "specialization": repr(specialization),
        "options": _canonical_options(options),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------
# Entries and the disk format
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheEntry:
    """A cached artifact: named binary ``blobs`` and JSON ``metadata`` (both read-only views)."""

    key: str
    blobs: Mapping[str, bytes]
    metadata: Mapping[str, Any]

    def __getitem__(self, name: str) -> bytes:
        return self.blobs[name]


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    disk_writes: int = 0
    disk_errors: int = 0


def _make_entry(key: str, blobs: Mapping[str, bytes], metadata: Mapping[str, Any]) -> CacheEntry:
    return CacheEntry(key, types.MappingProxyType(dict(blobs)), types.MappingProxyType(dict(metadata)))


def _serialize(entry: CacheEntry) -> bytes:
    names = list(entry.blobs)
    header = json.dumps({"key": entry.key, "metadata": dict(entry.metadata),
                         "blobs": [[name, len(entry.blobs[name])] for name in names]},
                        sort_keys=True).encode("utf-8")
    body = b"".join([_MAGIC, struct.pack("<I", len(header)), header, *(entry.blobs[n] for n in names)])
    return body + hashlib.sha256(body).digest()


def _deserialize(data: bytes, key: str) -> CacheEntry | None:
    """The entry in ``data``, or ``None`` if it is truncated, corrupted or for another key."""
    if len(data) < len(_MAGIC) + 4 + _DIGEST_SIZE or not data.startswith(_MAGIC):
        return None
    body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
    if hashlib.sha256(body).digest() != digest:
        return None
    (header_len,) = struct.unpack_from("<I", body, len(_MAGIC))
    start = len(_MAGIC) + 4
    try:
        header = json.loads(body[start:start + header_len].decode("utf-8"))
        if header["key"] != key:
            return None
        blobs: dict[str, bytes] = {}
        pos = start + header_len
        for name, size in header["blobs"]:
            blobs[name] = body[pos:pos + size]
            pos += size
        if pos != len(body):
            return None
        return _make_entry(key, blobs, header["metadata"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


# --------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------


def cache_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The disk cache directory the environment asks for, or ``None`` when disk caching is off."""
    env = os.environ if environ is None else environ
    if env.get(ENV_NO_DISK_CACHE, "").strip().lower() in _ON_VALUES:
        return None
    value = env.get(ENV_CACHE_DIR, "").strip()
    if value.lower() in _OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()
    return Path(env.get("HOME") or Path.home()) / ".cache" / "sparsile"


_FROM_ENV: Any = object()


class CompileCache:
    """In-memory LRU (``max_memory_entries``; ``None`` = unbounded) backed by a directory.

    ``CompileCache()`` takes the directory from the environment (:func:`cache_dir_from_env`);
    ``CompileCache(None)`` is memory-only; ``memory=False`` always goes to disk (for tests and
    tools). Disk problems never fail a compile: the first one is reported with a warning and
    the instance continues in memory only.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = _FROM_ENV, *, memory: bool = True,
                 max_memory_entries: int | None = 512):
        if directory is _FROM_ENV:
            directory = cache_dir_from_env()
        self.directory: Path | None = Path(directory) if directory is not None else None
        self.memory_enabled = memory
        self.max_memory_entries = max_memory_entries
        self.stats = CacheStats()
        self._memory: OrderedDict[str, CacheEntry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def disk_enabled(self) -> bool:
        return self.directory is not None

    def entry_path(self, key: str) -> Path:
        if self.directory is None:
            raise ValueError("this cache has no disk directory")
        return self.directory / FORMAT_VERSION / key[:2] / f"{key}.entry"

    # -- lookup ------------------------------------------------------------------------------

    def get(self, key: str, *, count: bool = True) -> CacheEntry | None:
        """The entry for ``key`` from memory, else from disk (then kept in memory), else ``None``.
        ``count=False``: a second look (after waiting for another thread's compile), left out of
        :attr:`stats`."""
        if self.memory_enabled:
            with self._lock:
                entry = self._memory.get(key)
                if entry is not None:
                    self._memory.move_to_end(key)
                    self.stats.memory_hits += count
                    return entry
        entry = self._read_disk(key)
        with self._lock:
            if entry is None:
                self.stats.misses += count
                return None
            self.stats.disk_hits += count
            self._remember(entry)
        return entry

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def _read_disk(self, key: str) -> CacheEntry | None:
        if self.directory is None or not _KEY.match(key):
            return None
        try:
            data = self.entry_path(key).read_bytes()
        except OSError:
            return None
        return _deserialize(data, key)

    # -- store -------------------------------------------------------------------------------

    def put(self, key: str, blobs: Mapping[str, bytes], metadata: Mapping[str, Any] | None = None) -> CacheEntry:
        """Store ``blobs`` and ``metadata`` under ``key`` (a :func:`make_key` digest) and return
        the entry. ``ValueError`` for malformed keys, blob names or non-JSON metadata."""
        if not _KEY.match(key):
            raise ValueError(f"cache keys are 64 lowercase hex digits (make_key), got {key!r}")
        for name, blob in blobs.items():
            if not isinstance(name, str) or not _BLOB_NAME.match(name):
                raise ValueError(f"blob name {name!r} must match {_BLOB_NAME.pattern}")
            if not isinstance(blob, bytes | bytearray | memoryview):
                raise ValueError(f"blob {name!r} must be bytes, got {type(blob).__name__}")
        meta = dict(metadata or {})
        try:
            meta = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cache metadata must be JSON-serializable: {exc}") from None
        entry = _make_entry(key, {name: bytes(blob) for name, blob in blobs.items()}, meta)
        with self._lock:
            self._remember(entry)
        self._write_disk(entry)
        return entry

    def get_or_create(self, key: str,
                      build: Callable[[], tuple[Mapping[str, bytes], Mapping[str, Any]]]) -> CacheEntry:
        """The cached entry for ``key``, or ``build()``'s ``(blobs, metadata)`` stored under it."""
        entry = self.get(key)
        if entry is not None:
            return entry
        blobs, metadata = build()
        return self.put(key, blobs, metadata)

    def _remember(self, entry: CacheEntry) -> None:
        if not self.memory_enabled:
            return
        self._memory[entry.key] = entry
        self._memory.move_to_end(entry.key)
        if self.max_memory_entries is not None:
            while len(self._memory) > self.max_memory_entries:
                self._memory.popitem(last=False)

    def _write_disk(self, entry: CacheEntry) -> None:
        if self.directory is None:
            return
        path = self.entry_path(entry.key)
        tmp_name = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{entry.key[:16]}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_serialize(entry))
            os.replace(tmp_name, path)
            tmp_name = None
            with self._lock:
                self.stats.disk_writes += 1
        except OSError as exc:
            with self._lock:
                self.stats.disk_errors += 1
            warnings.warn(f"sparsile: disk cache at {self.directory} is not usable ({exc}); "
                          "continuing with the in-memory cache only", RuntimeWarning, stacklevel=3)
            self.directory = None
        finally:
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass

    # -- maintenance -------------------------------------------------------------------------

    def discard(self, key: str) -> None:
        """Forget ``key`` in memory and on disk: for an entry whose checksum is valid but whose
        content its reader cannot use (bad metadata), so that it is rebuilt instead of failing on
        every run."""
        with self._lock:
            self._memory.pop(key, None)
        if self.directory is None or not _KEY.match(key):
            return
        try:
            self.entry_path(key).unlink()
        except OSError:
            pass

    def clear_memory(self) -> None:
        with self._lock:
            self._memory.clear()

    def clear(self) -> None:
        """Drop every entry from memory and from this format version's disk directory."""
        self.clear_memory()
        if self.directory is None:
            return
        root = self.directory / FORMAT_VERSION
        for path in root.glob("*/*.entry"):
            try:
                path.unlink()
            except OSError:
                pass

    def __len__(self) -> int:
        """Entries held in memory."""
        return len(self._memory)


_default_cache: CompileCache | None = None
_default_lock = threading.Lock()


def default_cache() -> CompileCache:
    """The process-wide cache (directory from the environment at first use)."""
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            _default_cache = CompileCache()
        return _default_cache


def reset_default_cache() -> None:
    """Forget the process-wide cache (the next :func:`default_cache` re-reads the environment)."""
    global _default_cache
    with _default_lock:
        _default_cache = None
