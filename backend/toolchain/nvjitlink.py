"""A ctypes binding of the nvJitLink C API: PTX in, cubin out.

Why not ``cuda.bindings.nvjitlink``: importing it loads ``cuda.pathfinder`` and, through it,
``importlib.metadata``, ``email``, ``zipfile`` and some sixty other modules, about 30 ms of a
fresh process's first compile (``python -X importtime``; ``benchmarks/bench_compile.py`` column
``cold``). The library itself is the same one: the ``libnvJitLink.so`` of the PyPI wheel
``nvidia-nvjitlink`` (no system CUDA needed), found in ``site-packages/nvidia/cu13/lib``.
``SPARSILE_NVJITLINK`` names another library file; when there is no wheel, ``cuda.pathfinder``
(a cuda-python dependency: conda, ``CUDA_HOME``, the system) is asked, then the system loader.
A library older than nvJitLink 13 is passed over (pyproject requires 13).

The calls used (nvJitLink.h, CUDA 13): ``nvJitLinkCreate(handle*, n, options)``,
``nvJitLinkAddData(handle, type, data, size, name)``, ``nvJitLinkComplete``,
``nvJitLinkGetLinkedCubin[Size]``, ``nvJitLinkGet{Error,Info}Log[Size]``, ``nvJitLinkDestroy``,
``nvJitLinkVersion``. The unversioned symbol names are the ones the wheel's header and
cuda-python bind. ctypes releases the GIL during each call, so a link does not block other
Python threads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV_LIBRARY = "SPARSILE_NVJITLINK"

# nvJitLinkResult (nvJitLink.h); names as cuda-python spells them.
RESULT_NAMES = {
    0: "SUCCESS", 1: "ERROR_UNRECOGNIZED_OPTION", 2: "ERROR_MISSING_ARCH", 3: "ERROR_INVALID_INPUT",
    4: "ERROR_PTX_COMPILE", 5: "ERROR_NVVM_COMPILE", 6: "ERROR_INTERNAL", 7: "ERROR_THREADPOOL",
    8: "ERROR_UNRECOGNIZED_INPUT", 9: "ERROR_FINALIZE", 10: "ERROR_NULL_INPUT",
    11: "ERROR_INCOMPATIBLE_OPTIONS", 12: "ERROR_INCORRECT_INPUT_TYPE", 13: "ERROR_ARCH_MISMATCH",
    14: "ERROR_OUTDATED_LIBRARY", 15: "ERROR_MISSING_FATBIN", 16: "ERROR_UNRECOGNIZED_ARCH",
    17: "ERROR_UNSUPPORTED_ARCH", 18: "ERROR_LTO_NOT_ENABLED",
}
INPUT_PTX = 2  # nvJitLinkInputType NVJITLINK_INPUT_PTX

MIN_MAJOR = 13  # pyproject requires nvidia-nvjitlink>=13 (PTX ISA 9.0, sm_110a)
# The library file of the CUDA 13 wheels, relative to a ``nvidia`` package folder.
_WHEEL_FILES = ("cu13/lib/libnvJitLink.so.13", "cu13/bin/x86_64/nvJitLink_130_0.dll", "cu13/bin/nvJitLink_130_0.dll")
_SYSTEM_NAMES = ("libnvJitLink.so.13",)


class NvJitLinkUnavailable(RuntimeError):
    """No usable nvJitLink library was found (the message says where it was looked for)."""


class NvJitLinkError(RuntimeError):
    """An nvJitLink call failed: ``result`` is its nvJitLinkResult, ``log`` the error log."""

    def __init__(self, call: str, result: int, log: str = "") -> None:
        self.call, self.result, self.log = call, result, log
        self.reason = f"{RESULT_NAMES.get(result, 'unknown result')} ({result})"
        super().__init__(f"{call}: {self.reason}")


@dataclass(frozen=True)
class Linked:
    """A finished link: the cubin and nvJitLink's info log (registers/spills with -verbose)."""

    cubin: bytes
    info_log: str


def _wheel_candidates() -> list[Path]:
    roots = [Path(entry) / "nvidia" for entry in sys.path if entry]
    return [root / rel for rel in _WHEEL_FILES for root in roots]


def _pathfinder_path() -> str | None:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return load_nvidia_dynamic_lib("nvJitLink").abs_path
    except Exception:  # not installed, or no library found: the caller tries the system loader
        return None


def _candidates() -> Iterator[str]:
    """Library files to try, best first; cuda.pathfinder (slow to import) only when no wheel is
    found on ``sys.path``."""
    explicit = os.environ.get(ENV_LIBRARY)
    if explicit:
        yield explicit
        return
    yield from (str(p) for p in _wheel_candidates() if p.is_file())
    found = _pathfinder_path()
    if found:
        yield found
    yield from _SYSTEM_NAMES


def _open_library() -> NvJitLink:
    tried: list[str] = []
    for candidate in _candidates():
        try:
            lib = NvJitLink(ctypes.CDLL(candidate), candidate)
            major, minor = lib.version()
        except (OSError, NvJitLinkUnavailable, NvJitLinkError) as exc:
            tried.append(f"{candidate}: {exc}")
            continue
        if major >= MIN_MAJOR:
            return lib
        tried.append(f"{candidate}: version {major}.{minor}, sparsile needs {MIN_MAJOR} or newer")
    where = "; ".join(tried) or "no libnvJitLink in any site-packages/nvidia folder"
    raise NvJitLinkUnavailable(f"could not load nvJitLink ({where})")


class NvJitLink:
    """The loaded library with typed entry points. Use :func:`library`."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        handle_p = ctypes.POINTER(ctypes.c_void_p)
        size_p = ctypes.POINTER(ctypes.c_size_t)
        signatures = {
            "nvJitLinkCreate": (handle_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_char_p)),
            "nvJitLinkDestroy": (handle_p,),
            "nvJitLinkAddData": (ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p),
            "nvJitLinkComplete": (ctypes.c_void_p,),
            "nvJitLinkGetLinkedCubinSize": (ctypes.c_void_p, size_p),
            "nvJitLinkGetLinkedCubin": (ctypes.c_void_p, ctypes.c_void_p),
            "nvJitLinkGetErrorLogSize": (ctypes.c_void_p, size_p),
            "nvJitLinkGetErrorLog": (ctypes.c_void_p, ctypes.c_char_p),
            "nvJitLinkGetInfoLogSize": (ctypes.c_void_p, size_p),
            "nvJitLinkGetInfoLog": (ctypes.c_void_p, ctypes.c_char_p),
            "nvJitLinkVersion": (ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint)),
        }
        try:
            for name, argtypes in signatures.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, ctypes.c_int
                setattr(self, "_" + name, fn)
        except AttributeError as exc:
            raise NvJitLinkUnavailable(f"{path} lacks an nvJitLink entry point ({exc})") from None

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_uint(), ctypes.c_uint()
        result = self._nvJitLinkVersion(ctypes.byref(major), ctypes.byref(minor))
        if result != 0:
            raise NvJitLinkError("nvJitLinkVersion", result)
        return major.value, minor.value

    def _log(self, handle: ctypes.c_void_p, kind: str) -> str:
        size = ctypes.c_size_t()
        if getattr(self, f"_nvJitLinkGet{kind}LogSize")(handle, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        buf = ctypes.create_string_buffer(size.value)
        if getattr(self, f"_nvJitLinkGet{kind}Log")(handle, buf) != 0:
            return ""
        return buf.value.decode("utf-8", errors="replace").strip()

    def link_ptx(self, ptx: bytes, options: list[str], name: str = "kernel.ptx") -> Linked:
        """Create a link with ``options``, add ``ptx``, complete it and return the cubin.
        :class:`NvJitLinkError` (with the error log) when a step fails."""
        handle = ctypes.c_void_p()
        encoded = [o.encode() for o in options]
        argv = (ctypes.c_char_p * len(encoded))(*encoded)
        result = self._nvJitLinkCreate(ctypes.byref(handle), len(encoded), argv)
        if result != 0:
            raise NvJitLinkError("nvJitLinkCreate", result)
        try:
            result = self._nvJitLinkAddData(handle, INPUT_PTX, ptx, len(ptx), name.encode())
            if result != 0:
                raise NvJitLinkError("nvJitLinkAddData", result, self._log(handle, "Error"))
            result = self._nvJitLinkComplete(handle)
            if result != 0:
                raise NvJitLinkError("nvJitLinkComplete", result, self._log(handle, "Error"))
            size = ctypes.c_size_t()
            result = self._nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))
            if result != 0:
                raise NvJitLinkError("nvJitLinkGetLinkedCubinSize", result)
            cubin = ctypes.create_string_buffer(size.value)
            result = self._nvJitLinkGetLinkedCubin(handle, cubin)
            if result != 0:
                raise NvJitLinkError("nvJitLinkGetLinkedCubin", result)
            return Linked(cubin.raw, self._log(handle, "Info"))
        finally:
            self._nvJitLinkDestroy(ctypes.byref(handle))


_LOCK = threading.Lock()


@functools.cache
def _load() -> NvJitLink:
    return _open_library()


def library() -> NvJitLink:
    """The process's nvJitLink, loaded on first use (thread-safe). :class:`NvJitLinkUnavailable`
    when it cannot be loaded."""
    with _LOCK:
        return _load()


def library_file() -> str | None:
    """Where :func:`library` would load nvJitLink from, without loading it: the path of the
    wheel's file (or of ``SPARSILE_NVJITLINK``), else ``None``. With its size and mtime it
    identifies the library cheaply (the compile cache keys on that)."""
    explicit = os.environ.get(ENV_LIBRARY)
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    return next((str(p) for p in _wheel_candidates() if p.is_file()), None)
