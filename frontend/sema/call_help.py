"""The help line of SP0332 (a Python object called in a kernel): what the user can do instead,
which depends on what was called. A function of the user's own module can be decorated with
``@sparsile.jit`` (it is then inlined); NumPy's, ``math``'s or another library's function cannot be
(it is not the user's source), and where the language has a builtin of that name the help names it."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

from .builtins import ROOT
from .values import Builtin

LIBRARIES = frozenset({"numpy", "math", "cmath", "builtins", "torch", "jax", "jaxlib", "triton", "scipy",
                       "ml_dtypes", "operator"})
"""Top-level packages whose functions are not the user's source: decorating them is no advice."""

DECORATE = "a Python function called from a kernel must be decorated with `@sparsile.jit` (it is inlined)"


def _library_of(fn: Any) -> str | None:
    module = getattr(fn, "__module__", None)
    if isinstance(fn, np.ufunc):
        return "numpy"
    if isinstance(module, str) and module.partition(".")[0] in LIBRARIES:
        return module.partition(".")[0]
    if isinstance(fn, types.BuiltinFunctionType):  # a C function of some extension module
        return module if isinstance(module, str) else "builtins"
    return None


def not_callable_help(fn: Any) -> str | None:
    """The help for calling the Python object ``fn`` (a constant of the kernel) in a kernel, or None."""
    if isinstance(fn, type) or not callable(fn):
        return None
    name = getattr(fn, "__name__", None)
    library = _library_of(fn)
    if library is not None:
        if isinstance(name, str) and isinstance(ROOT.members.get(name), Builtin):
            return f"use the language's `{name}` (`sparsile.{name}`): a {library} function does not run in a kernel"
        return (f"a {library} function does not run in a kernel; only the language's builtins and "
                "`@sparsile.jit` functions can be called")
    if name == "<lambda>":
        return "a lambda cannot be inlined: define the function with `def` and decorate it with `@sparsile.jit`"
    if isinstance(fn, types.FunctionType | types.MethodType):
        return DECORATE
    return "only the language's builtins and `@sparsile.jit` functions can be called in a kernel"
