"""The help line of SP0332 (a Python object called in a kernel): what the user can do instead,
which depends on what was called. A function of the user's own module can be decorated with
``@sparsile.jit`` (it is then inlined); NumPy's, ``math``'s or another library's function cannot be
(it is not the user's source), and where the language has a builtin of that name the help names it
with its signature (``np.zeros(4)`` is ``zeros(shape, dtype)`` here) and says where it means something
else (``math.floor`` gives a Python int, the language's ``floor`` a float).
A class cannot be instantiated (a kernel has no objects); a ``functools.partial`` is not inlined (its
function, called with all its arguments, is); an autotuned kernel is not either (the kernel it tunes is).
A method of a library object (``os.environ.get``) is called outside the kernel, and so is a call in a
parameter default (:func:`in_a_default`: the default is kernel code, evaluated when the kernel compiles)."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..diagnostics import Diagnostic
from .builtins import ROOT, signature_text
from .python_builtins import POWER
from .values import Builtin, autotuned_kernel_name, kernel_object_name

LIBRARIES = frozenset({"numpy", "math", "cmath", "builtins", "torch", "jax", "jaxlib", "triton", "scipy",
                       "ml_dtypes", "operator"})
"""Top-level packages whose functions are not the user's source: decorating them is no advice."""

DECORATE = "a Python function called from a kernel must be decorated with `@sparsile.jit` (it is inlined)"

OBJECT = ("a kernel cannot create Python objects: create the object outside the kernel (a global object's "
          "attributes read in a kernel are compile-time constants) or pass the values as arguments")

METHOD = ("a method cannot be inlined, since a kernel cannot take `self` or `cls`: make `{name}` a `@staticmethod` "
          "decorated with `@sparsile.jit` (or a function at module level), and pass what it reads from `self` as "
          "arguments")
"""(Decorating the method itself is SP0249, so the function's help would be no advice here.)"""

LIBRARY_METHOD = ("`{name}` is a method of a {library} object, which does not run in a kernel: call it in Python "
                  "outside the kernel and pass the result as an argument (a `constexpr` one for a compile-time value)")

DEFAULT = ("a parameter default is evaluated as kernel code when the kernel compiles, where only the language's "
           "builtins and `@sparsile.jit` functions can be called: compute the value in Python at module level "
           "(`{constant} = ...`) and make that constant the default, or pass `{param}=` at each launch")
"""The help of SP0332 in a parameter default (``n: sp.constexpr = int(os.environ.get("N", "8"))``)."""

PARTIAL = "a `functools.partial` is not inlined: "

ALIASES = {"absolute": "abs", "amax": "max", "amin": "min"}
"""A library function's ``__name__`` -> the language builtin of the same meaning (``np.abs`` is
``np.absolute``)."""

TO_INT = ("of a float tile `x.to(i32)` truncates toward zero (docs/language.md rule 8); of a compile-time "
          "constant `int(x)` does")

DIFFERENT = {
    "floor": "`{lib}.floor` returns an int; the language's `floor(x)` (`sparsile.floor`) returns a float of x's "
             "type: `floor(x).to(i32)` is the integer",
    "ceil": "`{lib}.ceil` returns an int; the language's `ceil(x)` (`sparsile.ceil`) returns a float of x's "
            "type: `ceil(x).to(i32)` is the integer",
}
"""Functions whose language builtin of the same name returns something else (only math's: NumPy's
``floor`` returns a float too)."""

NO_BUILTIN = {
    "trunc": "the language has no `trunc`: " + TO_INT,
    "fabs": "use the language's `abs(x)` (`sparsile.abs`)",
    "pow": POWER,
    "power": POWER,
}
"""Library functions the language spells another way."""


def python_method(fn: Any) -> types.FunctionType | None:
    """The function of ``fn`` if it is a method: bound to an object or a class (``OBJ.m``, a
    classmethod's ``C.c``), or a function defined in a class body whose first parameter is ``self``
    or ``cls`` (``C.m`` read from the class); else None (a module function, a staticmethod's function,
    a nested function)."""
    if isinstance(fn, types.MethodType):
        inner = fn.__func__
        return inner if isinstance(inner, types.FunctionType) else None
    if not isinstance(fn, types.FunctionType):
        return None
    owner = fn.__qualname__.split(".")[:-1]
    code = fn.__code__
    first = code.co_varnames[0] if code.co_argcount else None
    return fn if owner and owner[-1] != "<locals>" and first in ("self", "cls") else None


def library_of(fn: Any) -> str | None:
    """The top-level package of a library's function or class (``_operator``, the C module behind
    ``operator``, is ``operator``), or None for the user's own."""
    module = getattr(fn, "__module__", None)
    if isinstance(fn, np.ufunc):
        return "numpy"
    top = module.partition(".")[0].lstrip("_") if isinstance(module, str) else None
    if top in LIBRARIES:
        return top
    if isinstance(fn, types.BuiltinFunctionType):  # a C function of some extension module
        return top or "builtins"
    return None


def _standard_library(fn: Any) -> str | None:
    """"Python standard library" for a function of one of its modules (``collections.abc``), else None."""
    module = getattr(fn, "__module__", None)
    top = module.partition(".")[0] if isinstance(module, str) else None
    return "Python standard library" if top in sys.stdlib_module_names else None


def in_a_default(diagnostics: Iterable[Diagnostic], param: str) -> list[Diagnostic]:
    """The ``diagnostics`` of evaluating parameter ``param``'s default, a call the language cannot
    make (SP0332) with the help for a default computed by Python code (:data:`DEFAULT`)."""
    help_ = DEFAULT.format(constant=f"{param.upper()}_DEFAULT", param=param)
    return [dataclasses.replace(d, help=help_) if d.code == "SP0332" else d for d in diagnostics]


def _library_function_help(library: str, name: Any) -> str:
    """The help for calling ``library``'s function ``name`` in a kernel."""
    if library == "operator":
        return "write the operator itself (`a + b`, `a[i]`): an `operator` function does not run in a kernel"
    if name in DIFFERENT and library == "math":
        return DIFFERENT[name].format(lib=library)
    if name in NO_BUILTIN:
        return NO_BUILTIN[name]
    builtin = ROOT.members.get(ALIASES.get(name, name)) if isinstance(name, str) else None
    if isinstance(builtin, Builtin):
        return (f"use the language's `{signature_text(builtin)}` (`sparsile.{builtin.name}`): a {library} function "
                "does not run in a kernel")
    return (f"a {library} function does not run in a kernel; only the language's builtins and "
            "`@sparsile.jit` functions can be called")


def _partial_help(fn: functools.partial) -> str:
    inner = fn.func
    kernel = kernel_object_name(inner)
    if kernel is not None:
        return PARTIAL + f"call `{kernel}` itself with all its arguments"
    if isinstance(inner, types.FunctionType) and inner.__name__ != "<lambda>" and library_of(inner) is None:
        return PARTIAL + f"decorate `{inner.__name__}` with `@sparsile.jit` and call it with all its arguments"
    return PARTIAL + "call the function itself with all its arguments"


def _class_help(cls: type) -> str:
    library = library_of(cls)
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
    library = library_of(fn)
    if library is not None:
        return _library_function_help(library, name)
    if name == "<lambda>":
        return "a lambda cannot be inlined: define the function with `def` and decorate it with `@sparsile.jit`"
    method = python_method(fn)
    if method is not None:
        owner = library_of(method) or _standard_library(method)
        if owner is not None:  # `os.environ.get`: no method of the user's own to make static
            return LIBRARY_METHOD.format(name=method.__qualname__, library=owner)
        return METHOD.format(name=method.__name__)
    if isinstance(fn, types.FunctionType | types.MethodType):
        return DECORATE
    return "only the language's builtins and `@sparsile.jit` functions can be called in a kernel"
