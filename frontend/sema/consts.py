"""Compile-time values in sema: Python builtins applied to constants (``len``, ``min``, ``int``,
...), folding of ``max``/``min``/``abs``/``sum`` on constants, and conversions between Python values
and sema values. Every failure is a diagnostic (SP0303, SP0331), never a Python exception."""

from __future__ import annotations

from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..ir.core import Value
from ..spans import Span
from .emitter import describe
from .values import POISON, Arg, Const

PY_FOLDABLE = frozenset({"len", "int", "float", "bool", "abs", "min", "max", "tuple", "str", "isinstance"})
"""Python builtins a kernel may call on compile-time values."""

NOT_CONSTANT = object()


def python_constant(v: Any) -> Any:
    """The Python value of a constant or a tuple of constants, else ``NOT_CONSTANT``."""
    if isinstance(v, Const):
        return v.value
    if isinstance(v, tuple):
        items = [python_constant(x) for x in v]
        return NOT_CONSTANT if any(x is NOT_CONSTANT for x in items) else tuple(items)
    return NOT_CONSTANT


class PyBuiltin:
    """A Python builtin applied to compile-time values (``len``, ``min``, ``int``, ...)."""

    def __init__(self, name: str):
        self.name = name

    def call(self, args: list[Arg], kwargs: dict[str, Arg], span: Span) -> Any:
        vals = []
        for a in args:
            v = a.value
            if isinstance(v, Const):
                vals.append(v.value)
            elif isinstance(v, tuple) and self.name in ("len", "tuple"):
                vals.append(v)
            elif isinstance(v, tuple) and all(isinstance(x, Const) for x in v):
                vals.append(tuple(x.value for x in v))
            else:
                raise CompileError([Diagnostic("SP0331", f"`{self.name}` works on compile-time values only, found "
                                               f"{describe(v)}", a.span)])
        if kwargs:
            raise CompileError([Diagnostic("SP0321", f"`{self.name}` takes no keyword arguments here", span)])
        import builtins as py

        try:
            r = getattr(py, self.name)(*vals)
        except Exception as e:  # a wrong constant argument: report it at the call
            msg = f"`{self.name}` failed on compile-time values: {e}"
            raise CompileError([Diagnostic("SP0331", msg, span)]) from None
        return as_sv(r)

    def __repr__(self) -> str:
        return f"<python builtin {self.name}>"


def as_sv(x: Any) -> Any:
    if isinstance(x, Const | Value) or x is POISON:
        return x
    if isinstance(x, tuple):
        return tuple(as_sv(e) for e in x)
    return Const(x)


def convert_const(v: Any, t: T.ScalarType) -> Any:
    if t.is_bool:
        return bool(v)
    if t.is_int:
        return int(v)
    return float(v)


def try_fold_builtin(name: str, args: list[Arg], kwargs: dict[str, Arg]) -> Any:
    """``max(3, 4)`` and friends on constants use Python semantics."""
    try:
        return _fold_builtin(name, args, kwargs)
    except (TypeError, ValueError, OverflowError) as e:
        raise CompileError([Diagnostic("SP0331", f"`{name}` failed on compile-time values: {e}",
                                       args[0].span)]) from None


def _fold_builtin(name: str, args: list[Arg], kwargs: dict[str, Arg]) -> Any:
    if name not in ("max", "min", "abs", "sum") or kwargs:
        return None
    vals = [a.value for a in args]
    if not vals or not all(isinstance(v, Const) and isinstance(v.value, int | float) for v in vals):
        if len(vals) == 1 and isinstance(vals[0], tuple) and all(isinstance(x, Const) for x in vals[0]):
            import builtins as py

            return Const(getattr(py, name)(x.value for x in vals[0]))
        return None
    import builtins as py

    if name == "sum":
        return None
    return Const(getattr(py, name)(*(v.value for v in vals)))
