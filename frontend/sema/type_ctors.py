"""Type constructors usable in annotations and constant expressions: ``ptr[f32]``,
``tensor[f16, 2]``, and the plain scalar types (registered by :mod:`builtins`)."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..ir.core import Value
from ..spans import Span
from .builtins import ROOT
from .values import Arg, Const


@dataclass(frozen=True)
class TypeCtor:
    """A generic type awaiting its parameters (``ptr``, ``tensor``)."""

    name: str

    def apply(self, params: tuple[object, ...]) -> T.Type | str:
        """The type, or an error message."""
        params = tuple(_numpy_scalar(p) for p in params)
        if self.name == "ptr":
            if len(params) != 1 or not isinstance(params[0], T.ScalarType):
                return "`ptr[...]` takes one scalar element type, e.g. `ptr[f32]`"
            return T.PointerType(params[0])
        if self.name == "tensor":
            if len(params) != 2 or not isinstance(params[0], T.ScalarType) or not isinstance(params[1], int):
                return "`tensor[...]` takes an element type and a rank, e.g. `tensor[f16, 2]`"
            if not 1 <= params[1] <= 5:
                return f"a tensor's rank must be 1 to 5 (the TMA limit), found {params[1]}"
            return T.TensorType(params[0], params[1])
        return f"`{self.name}` takes no parameters"

    def __getitem__(self, params: object) -> T.Type | InvalidAnnotation:
        """``ptr[f32]`` evaluated by Python itself (annotations of @jit functions, when the function is
        defined; the compiler reads them again from the source). NumPy / ml_dtypes types stand for
        their scalar types (``ptr[np.uint32]``), as elsewhere in a @jit kernel. Invalid parameters give
        an :class:`InvalidAnnotation`, not an exception: defining the function must not fail, and the
        compiler reports the annotation at its span (a diagnostic with a code)."""
        items = params if isinstance(params, tuple) else (params,)
        t = self.apply(tuple(_numpy_scalar(p) for p in items))
        return InvalidAnnotation(t) if isinstance(t, str) else t

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class InvalidAnnotation:
    """What Python's own evaluation of an invalid ``ptr[...]`` / ``tensor[...]`` gives (its message)."""

    message: str

    def __str__(self) -> str:
        return self.message


PYTHON_DTYPES: dict[type, T.ScalarType] = {float: T.f64, int: T.i64, bool: T.bool_}
"""Python's builtin types as dtypes, as NumPy reads them (``np.dtype(float)`` is float64): the same
types as a ``constexpr`` (docs/language.md, "Parameter types")."""


def _python_builtin(p: object) -> type | None:
    """Python's builtin ``float`` / ``int`` / ``bool`` that ``p`` is: the type itself (a nested
    function's annotation Python evaluated) or a kernel's name for it; None otherwise."""
    from .consts import PyBuiltin  # (consts imports the emitter, which imports this module)

    if isinstance(p, Const):
        p = p.value
    if isinstance(p, PyBuiltin):
        p = getattr(builtins, p.name)
    return p if isinstance(p, type) and p in PYTHON_DTYPES else None


def python_builtin_dtype(p: object) -> T.ScalarType | None:
    """The dtype Python's builtin ``float`` / ``int`` / ``bool`` (``p``, :func:`_python_builtin`)
    stands for where a dtype is taken (``x.to(float)``, ``zeros(shape, float)``, ``ptr[float]``):
    ``f64`` / ``i64`` / ``bool``, as NumPy reads them and as the ``constexpr`` ``DT=float`` is; None
    for anything else."""
    builtin = _python_builtin(p)
    return None if builtin is None else PYTHON_DTYPES[builtin]


def _numpy_scalar(p: object) -> object:
    """``p``, or the scalar type a NumPy dtype or scalar type (``np.uint32``, ``ml_dtypes.bfloat16``)
    or Python's builtin ``float`` / ``int`` / ``bool`` (:func:`python_builtin_dtype`) stands for."""
    if isinstance(p, T.Type | int | str) or p is None:
        return p
    builtin = python_builtin_dtype(p)
    if builtin is not None:
        return builtin
    try:
        import numpy as np

        if isinstance(p, np.dtype) or (isinstance(p, type) and issubclass(p, np.generic)):
            return T.from_numpy_dtype(np.dtype(p)) or p
    except (TypeError, ValueError):
        pass
    return p


ROOT.members["ptr"] = Const(TypeCtor("ptr"))
ROOT.members["tensor"] = Const(TypeCtor("tensor"))


def annotation_help(value: object) -> str | None:
    """The help for an annotation that is not a type: a quoted one (``x: "ptr[f32]"``, a forward
    reference in Python) is read as a string constant, since kernel annotations are code."""
    if isinstance(value, str):
        return f"kernel annotations are read as code, not as text: write `{value}` without the quotes"
    builtin = _python_builtin(value)
    if builtin is float or builtin is int:  # (`a: bool` is the language's bool)
        # (as a dtype Python's float is f64, as NumPy reads it; unannotated, a Python float given at a
        # launch is an f32 scalar and an int an i32: an annotation names which, docs/language.md)
        value_type, dtype = ("f32", "f64") if builtin is float else ("i32", "i64")
        name = builtin.__name__
        return (f"a scalar parameter's annotation names the language's type: write `{value_type}` or `{dtype}` (an "
                f"unannotated Python {name} at a launch is `{value_type}`; as a dtype, e.g. `x.to({name})`, Python's "
                f"{name} is `{dtype}`)")
    return None


def constexpr_call(args: list[Arg], kwargs: dict[str, Arg], span: Span) -> Any:
    """``constexpr(x)`` in a kernel (Triton's ``tl.constexpr(x)``): ``x`` itself, which must be
    known at compile time (SP0201); another number of arguments is SP0321."""
    if len(args) != 1 or kwargs:
        raise CompileError([Diagnostic("SP0321", "`constexpr(x)` takes one argument", span)])
    if _holds_run_time_value(args[0].value):
        raise CompileError([Diagnostic(
            "SP0201", "the argument of `constexpr(...)` must be a compile-time constant, found a run-time value",
            args[0].span, help="`constexpr(...)` marks a value known when the kernel compiles: pass it as a "
                               "`constexpr` parameter, or drop the `constexpr(...)`")])
    return args[0].value


def _holds_run_time_value(v: object) -> bool:
    if isinstance(v, tuple):
        return any(_holds_run_time_value(x) for x in v)
    return isinstance(v, Value)
