"""What the autotuner remembers: cache keys, the on-disk file of winners, shipped tables.

A tuned choice is stored per GPU name, key values (an array's shape and dtype), the dtypes of
every array argument and the compiler version (docs/autotune.md). One JSON file per kernel and
config list lives under ``$SPARSILE_CACHE_DIR/autotune/``::

    {"format": "sparsile-autotune/1", "compiler": "sparsile 0.1.0+<hash>", "kernel": "add",
     "entries": {"NVIDIA H200|n=4096; dtypes: x=float32 y=float32": {"config": {...}, "ms": 0.01}}}

It is written to a temporary file in the same directory and ``os.replace``-d over the old one,
so a reader sees the old file or the new one, never half of one. A file that does not parse, has
another format or another compiler version is ignored with a warning (SP0774) and rewritten at the
next store; a directory that cannot be written is reported once (SP0775) and tuning goes on in
memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..frontend.diagnostics import LaunchError

FORMAT = "sparsile-autotune/1"
TABLE_FORMAT = "sparsile-autotune-table/1"
SP_BAD_TABLE = "SP0773"
SP_STALE_FILE = "SP0774"
SP_UNWRITABLE = "SP0775"


class AutotuneWarning(UserWarning):
    """A problem with the autotuner's disk cache: tuning goes on, the file is ignored or not written."""


def compiler_version() -> str:
    """The compiler version tuned entries are valid for (driver/cache.py's)."""
    from .cache import compiler_version as version

    return version()


def describe(value: Any) -> str:
    """How one argument enters a cache key: an array by its shape and dtype, a scalar (a numpy
    scalar or 0-d array too: ``np.int64(4096)`` is ``4096``, its dtype is among the key's dtypes)
    and anything else by repr."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and tuple(value.shape) == () and hasattr(value, "item"):
        return repr(value.item())
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{tuple(int(s) for s in value.shape)}:{dtype_name(value.dtype)}"
    return repr(value)


def dtype_name(dtype: Any) -> str:
    """``float16`` for numpy's, torch's (``torch.float16``) and cupy's dtypes alike."""
    name = getattr(dtype, "name", None)
    return str(name if isinstance(name, str) else dtype).removeprefix("torch.")


def key_string(key: Sequence[str], bound: Mapping[str, Any]) -> str:
    """The cache key of one call: ``key``'s argument values, then the dtypes of every array
    argument (``n=4096; dtypes: x=float32 out=float32``)."""
    parts = [f"{name}={describe(bound[name])}" for name in key]
    dtypes = [f"{name}={dtype_name(v.dtype)}" for name, v in bound.items()
              if hasattr(v, "dtype") and hasattr(v, "shape")]
    text = ", ".join(parts)
    if dtypes:
        text += ("; " if text else "") + "dtypes: " + " ".join(dtypes)
    return text


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
        """Add ``entry`` (merged with what the file holds now) and replace the file atomically."""
        if self.path is None:
            return
        entries = self.read(quiet=True)
        entries[entry] = record
        data = {"format": FORMAT, "compiler": compiler_version(), "kernel": self.kernel, "entries": entries}
        try:
            write_json_atomic(self.path, data)
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
