"""How Python objects seen by a ``@jit`` kernel become sema values.

Names a decorated function reads from its module or closure are compile-time constants: numbers,
strings, tuples, dtypes, the ``sparsile`` module and its builtins, other ``@jit`` functions (inlined
as helpers), and Python modules (whose attributes are wrapped the same way on access).
"""

from __future__ import annotations

import types as pytypes
from typing import Any

import numpy as np

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..spans import Span
from ..syntax import ast as A
from .builtins import ROOT
from .consts import convert_const, typed_constant
from .values import Builtin, Const, HelperFunction, Namespace


def wrap_python_value(obj: Any) -> Any:
    """The sema value for a Python object read by a kernel."""
    if isinstance(obj, Builtin | Namespace | HelperFunction):
        return obj
    if isinstance(obj, pytypes.ModuleType) and obj.__name__ == "sparsile":
        return ROOT
    alias = _builtin_alias(obj)
    if alias is not None:
        return alias
    if isinstance(obj, bool | int | float | str) or obj is None:
        return Const(obj)
    if isinstance(obj, T.Type):
        return Const(obj)
    if isinstance(obj, T.TypedConstant):  # `C = sp.u8(250)` in the module: what `u8(250)` is in the kernel
        try:
            return typed_constant(obj)
        except ValueError:
            return Const(obj)  # no value: any use of it reports what it is
    if isinstance(obj, tuple | list):
        return tuple(wrap_python_value(x) for x in obj)
    try:
        if isinstance(obj, np.integer):  # a captured NumPy scalar is Python's number, as at a launch
            return Const(int(obj))
        if isinstance(obj, np.floating) or (isinstance(obj, np.generic) and type(obj).__module__ == "ml_dtypes"):
            return Const(float(obj))  # (ml_dtypes' bfloat16 is no np.floating)
        if isinstance(obj, np.dtype | type) and obj is not type:
            t = T.from_numpy_dtype(np.dtype(obj)) if _is_numpy_dtype_like(obj) else None
            if t is not None:
                return Const(t)
    except Exception:  # an object numpy cannot interpret stays a plain constant
        pass
    return Const(obj)


def numpy_scalar_constant(obj: Any) -> Const | None:
    """The typed constant of a NumPy (or ml_dtypes) scalar: what the call ``np.int8(100)`` written
    in a kernel is, the ``i8`` constant 100. None for a scalar of a type the language has none for
    (``np.complex64``)."""
    if not isinstance(obj, np.generic):
        return None
    t = T.from_numpy_dtype(np.dtype(type(obj)))
    if t is None:
        return None
    value = bool(obj) if t.is_bool else int(obj) if t.is_int else float(obj)
    return Const(convert_const(value, t), t)  # exact: the value is already one of type t


NUMPY_SCALARS_HELP = ("the language's NumPy scalars are np.bool_, np.int8 to np.int64, np.uint8 to np.uint64, "
                      "np.float16, np.float32, np.float64 and ml_dtypes' bfloat16, float8_e4m3fn and "
                      "float8_e5m2; or give a Python number")


def numpy_type_without_type(obj: Any) -> str | None:
    """The name of ``obj``'s NumPy scalar type when the language has no such type
    (``np.complex64(3)``, ``np.longdouble(2.5)``, ``np.str_("a")``, or the class itself), else None."""
    cls = obj if isinstance(obj, type) else type(obj)
    if not (issubclass(cls, np.generic) and cls is not np.generic):
        return None
    try:
        return None if T.from_numpy_dtype(np.dtype(cls)) is not None else cls.__name__
    except (TypeError, ValueError):  # an abstract class (np.floating): not a scalar's type either
        return cls.__name__


def numpy_without_type_diagnostic(name: str, span: Span) -> Diagnostic:
    """SP0302 for a NumPy scalar of type ``name``, which the language has no type for, at ``span``:
    the call ``np.complex64(3)`` in a kernel (a module-level kernel's default included) and Python's
    value of a default (a nested kernel's, or a module global's) give the same diagnostic."""
    return Diagnostic("SP0302", f"NumPy's `{name}` has no type in the language", span, help=NUMPY_SCALARS_HELP)


def default_as_argument(value: Any, node: A.Expr, wrapped: Any) -> Any:
    """The sema value of a ``@jit`` function's parameter default: Python's ``value`` (what the ``def``
    evaluated, ``f.__defaults__`` / ``f.__kwdefaults__``, module level or nested alike; ``wrapped``
    is it as a captured value is), typed as the same value given at a launch is
    (docs/language.md, "What a kernel captures"): a NumPy (or ml_dtypes) scalar is the typed
    constant of its type (``np.int8(5) % -3`` is NumPy's ``int8(-1)``, ``max(A, 1)`` of a global
    ``A = np.int8(100)`` the ``i8`` constant 100), ``np.True_`` is Python's ``True`` (a flag), and a
    tuple or list goes element by element (``node``'s elements give their spans when the source is
    a tuple or list display of the same length). A NumPy scalar of a type the language has none
    for is SP0302 at ``node``, as the call ``np.complex64(3)`` in a kernel is."""
    if isinstance(value, tuple | list) and isinstance(wrapped, tuple) and len(value) == len(wrapped):
        displayed = isinstance(node, A.Tuple | A.List) and len(node.elts) == len(value)
        nodes = node.elts if displayed else [node] * len(value)  # type: ignore[union-attr]
        return tuple(default_as_argument(v, n, w) for v, n, w in zip(value, nodes, wrapped, strict=True))
    if isinstance(value, np.bool_):
        return Const(bool(value))
    if not isinstance(value, np.generic):
        return wrapped
    typed = numpy_scalar_constant(value)
    if typed is not None:
        return typed
    raise CompileError([numpy_without_type_diagnostic(type(value).__name__, node.span)])


def is_run_time_scalar(value: Any) -> bool:
    """Whether a run-time (not ``constexpr``) parameter takes Python's default ``value`` itself, as
    it takes the same value given at a launch: a NumPy or ml_dtypes scalar (of a type the language
    has: :func:`default_as_argument` refused the others), which the launch types
    (``np.float16(1.5)`` an ``f16`` scalar, or the annotation's type)."""
    return isinstance(value, np.generic)


def default_diagnostic(param: str, constexpr: bool, value: Any, span: Span) -> Diagnostic | None:
    """What refuses a kernel parameter's default, the sema value ``value``: a typed constant of the
    language (``sp.f16(1.5)``, or a ``.spk`` kernel's ``f16(1.5)``) for a run-time parameter, which
    takes a number, as the same value given at a launch is refused (SP0708: it failed at the launch,
    naming sema's ``Const``, at module level). None for a default it takes."""
    if not constexpr and isinstance(value, Const) and value.dtype is not None:
        return Diagnostic("SP0708", f"the default of run-time parameter `{param}` is the typed constant "
                                    f"{value.dtype}({value.value!r})", span,
                          help=f"a typed default is a compile-time constant: annotate `{param}: sp.constexpr`, "
                               f"or give the type as the annotation and a Python number as the default "
                               f"(`{param}: sp.{value.dtype} = {value.value!r}`)")
    return None


def _is_numpy_dtype_like(obj: Any) -> bool:
    try:
        np.dtype(obj)
        return True
    except TypeError:
        return False


def _builtin_alias(obj: Any) -> Any:
    """The language builtin a Python-side API object stands for inside a kernel (``sparsile.load``
    reads ``.spk`` files from Python and is the memory ``load`` in a kernel)."""
    if not callable(obj):
        return None
    try:
        name = getattr(obj, "__sparsile_builtin__", None)
    except Exception:  # an object with a failing __getattr__ is just a constant
        return None
    return ROOT.members.get(name) if isinstance(name, str) else None
