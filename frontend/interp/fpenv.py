"""The interpreter's floating-point environment: IEEE defaults (subnormals kept, round to nearest),
whatever the calling thread set.

numpy computes in the calling thread's floating-point environment, and some hosts change it: XLA
runs a CPU computation (so ``sparsile.jax.call``'s CPU handler and its ``pure_callback``) with
flush-to-zero and denormals-are-zero set, and ``torch.set_flush_denormal(True)`` sets them for the
thread that calls it. A subnormal f32 or f64 would then read and compute as zero in the interpreter
there, while the language keeps subnormals (docs/language.md: only f32 ``atomic_add`` flushes) and
``kernel.interpret`` elsewhere keeps them. :func:`default_fp_environment` runs the interpreter in
the C library's default environment (``fesetenv(FE_DFL_ENV)``, which clears FTZ / DAZ in MXCSR on
x86-64 and FZ in FPCR on AArch64) and restores the caller's afterwards. Where the C library is not
glibc or musl on Linux (``FE_DFL_ENV`` is then no ``(fenv_t *) -1``) it leaves the environment alone.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_FENV_BYTES = 256
"""Room for a ``fenv_t`` (32 bytes on x86-64 glibc, 8 on AArch64): generously more."""
_FE_DFL_ENV = ctypes.c_void_p(-1)
"""glibc's and musl's ``FE_DFL_ENV``: ``((const fenv_t *) -1)``."""


def _libm() -> Any:
    """The C math library's ``fegetenv`` / ``fesetenv``, or None where they cannot be used."""
    if not sys.platform.startswith("linux"):
        return None
    lib = None
    for name in (None, "libm.so.6"):  # the process's own symbols (Python links libm), then glibc's libm by name
        try:  # (not ctypes.util.find_library: it runs ldconfig, ~0.1 s at import)
            lib = ctypes.CDLL(name)
            get, set_ = lib.fegetenv, lib.fesetenv
            break
        except (OSError, AttributeError):
            lib = None
    if lib is None:
        return None
    get.argtypes, set_.argtypes = [ctypes.c_void_p], [ctypes.c_void_p]
    get.restype = set_.restype = ctypes.c_int
    return lib


_LIB = _libm()


@contextmanager
def default_fp_environment() -> Iterator[None]:
    """Run the body in the default floating-point environment (subnormals kept), then restore the
    calling thread's own (threads the body starts inherit the default one)."""
    if _LIB is None:
        yield
        return
    saved = ctypes.create_string_buffer(_FENV_BYTES)
    if _LIB.fegetenv(saved) != 0:
        yield
        return
    _LIB.fesetenv(_FE_DFL_ENV)
    try:
        yield
    finally:
        _LIB.fesetenv(saved)
