"""Load the compiler's native libraries on a background thread while the frontend parses.

A fresh process's first compile opens two large shared libraries, libllvmlite (LLVM, ~180 MB)
and libnvJitLink (ptxas inside, ~115 MB), and nvJitLink's first link pays a one-time setup.
Together that is ~30 ms of native work that holds no Python lock: ``dlopen`` and ctypes calls
release the GIL (measured: a pure-Python loop runs at full speed beside them). So when a kernel
is defined (``sparsile.load``/``loads``, ``@sparsile.jit``) this module starts one thread that
does that work while the main thread parses and type-checks; the compile then finds the
libraries loaded. Importing ``llvmlite.binding`` itself is Python work and is not moved here:
on a thread it would only compete for the GIL.

``SPARSILE_PRELOAD=0`` turns it off. Before ``os.fork`` the thread is joined, so a child never
inherits a dynamic loader lock held by a thread that does not exist in it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading

from . import nvjitlink
from .linker import NO_CACHE  # without it nvJitLink would initialize the CUDA driver (linker.NO_CACHE)

ENV_PRELOAD = "SPARSILE_PRELOAD"
_OFF_VALUES = frozenset({"0", "off", "no", "false"})
# Smallest valid PTX: nvJitLink's one-time setup happens on the first link of any input.
_WARMUP_PTX = b".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry sparsile_warmup() { ret; }\n"

_lock = threading.Lock()
_thread: threading.Thread | None = None
errors: list[str] = []
"""What the background work could not do (it never raises; the compile reports real problems)."""


def _llvmlite_library() -> str | None:
    """The path llvmlite's own loader opens (``llvmlite/binding/libllvmlite.so`` on Linux), found
    without importing llvmlite.binding."""
    spec = importlib.util.find_spec("llvmlite")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for name in ("libllvmlite.so", "libllvmlite.dylib", "llvmlite.dll"):
            path = os.path.join(root, "binding", name)
            if os.path.isfile(path):
                return path
    return None


def _work() -> None:
    try:
        path = _llvmlite_library()
        if path is not None:
            ctypes.CDLL(path)
    except OSError as exc:
        errors.append(f"libllvmlite: {exc}")
    try:
        nvjitlink.library().link_ptx(_WARMUP_PTX, ["-arch=sm_80", NO_CACHE], "warmup.ptx")
    except Exception as exc:  # missing or broken nvJitLink: the compile raises SP0611 itself
        errors.append(f"nvJitLink: {exc}")


def enabled() -> bool:
    return os.environ.get(ENV_PRELOAD, "1").strip().lower() not in _OFF_VALUES


def start() -> None:
    """Start the background load once per process (no-op when disabled or already started)."""
    global _thread
    if _thread is not None or not enabled():
        return
    with _lock:
        if _thread is None:
            # not a daemon: interpreter shutdown waits for it instead of unloading LLVM under it
            _thread = threading.Thread(target=_work, name="sparsile-preload", daemon=False)
            _thread.start()


def wait(timeout: float | None = None) -> None:
    """Wait for the background load (if one was started) to finish."""
    thread = _thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait)
