"""The help line of SP0332 (a Python object called in a kernel): what the user can do instead,
which depends on what was called. A function of the user's own module can be decorated with
``@sparsile.jit`` (it is then inlined); NumPy's, ``math``'s or another library's function cannot be
(it is not the user's source), and where the language has a builtin of that name the help names it.
A class cannot be instantiated (a kernel has no objects); a ``functools.partial`` is not inlined (its
function, called with all its arguments, is); an autotuned kernel is not either (the kernel it tunes is)."""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from .builtins import ROOT
from .values import Builtin, autotuned_kernel_name, kernel_object_name

LIBRARIES = frozenset({"numpy", "math", "cmath", "builtins", "torch", "jax", "jaxlib", "triton", "scipy",
                       "ml_dtypes", "operator"})
"""Top-level packages whose functions are not the user's source: decorating them is no advice."""

DECORATE = "a Python function called from a kernel must be decorated with `@sparsile.jit` (it is inlined)"

OBJECT = ("a kernel cannot create Python objects: create the object outside the kernel (a global object's "
          "attributes read in a kernel are compile-time constants) or pass the values as arguments")

PARTIAL = "a `functools.partial` is not inlined: "


def _library_of(fn: Any) -> str | None:
    module = getattr(fn, "__module__", None)
    if isinstance(fn, np.ufunc):
        return "numpy"
    if isinstance(module, str) and module.partition(".")[0] in LIBRARIES:
        return module.partition(".")[0]
    if isinstance(fn, types.BuiltinFunctionType):  # a C function of some extension module
        return module if isinstance(module, str) else "builtins"
    return None


def _partial_help(fn: functools.partial) -> str:
    inner = fn.func
    kernel = kernel_object_name(inner)
    if kernel is not None:
        return PARTIAL + f"call `{kernel}` itself with all its arguments"
    if isinstance(inner, types.FunctionType) and inner.__name__ != "<lambda>" and _library_of(inner) is None:
        return PARTIAL + f"decorate `{inner.__name__}` with `@sparsile.jit` and call it with all its arguments"
    return PARTIAL + "call the function itself with all its arguments"


def _class_help(cls: type) -> str:
    library = _library_of(cls)
    if library is None:
        return OBJECT
    what = "a Python builtin class" if library == "builtins" else f"a {library} class"
    return (f"{what} cannot be instantiated in a kernel; only the language's builtins and `@sparsile.jit` "
            "functions can be called")


def not_callable_help(fn: Any) -> str | None:
    """The help for calling the Python object ``fn`` (a constant of the kernel) in a kernel, or None."""
    if isinstance(fn, type):
        return _class_help(fn)
    if not callable(fn):
        return None
    if isinstance(fn, functools.partial):
        return _partial_help(fn)
    tuned = autotuned_kernel_name(fn)
    if tuned is not None:
        return (f"an autotuned kernel picks its config when it is launched from Python; to inline its body call "
                f"`{tuned}.kernel(...)` with one config's constexprs as arguments")
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
