"""Compile-time values in sema: Python builtins applied to constants (``len``, ``min``, ``int``,
...), folding of ``max``/``min``/``abs``/``sum`` on constants, and conversions between Python values
and sema values. Every failure is a diagnostic (SP0303, SP0331), never a Python exception."""

from __future__ import annotations

import math
from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..interp.numerics import finite_float_to_int, float_to_type, int_to_float, int_to_int
from ..ir import types as T
from ..ir.core import Value
from ..spans import Span
from .emitter import INTEGER_CONSTANT_RANGE, describe, plain_number
from .keyed_values import keyed_fold
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


def _python_value(x: Any) -> Any:
    """What a constant is to a Python builtin: ``int`` in ``isinstance(B, int)`` is Python's ``int``."""
    import builtins as py

    return getattr(py, x.name) if isinstance(x, PyBuiltin) else x


def _class_value(x: Any) -> Any:
    """isinstance's class: ``bool`` in a kernel is the language's bool type, which there means Python's
    ``bool`` (``isinstance(B, bool)`` on a constant)."""
    return bool if isinstance(x, T.ScalarType) and x == T.bool_ else _python_value(x)


class PyBuiltin:
    """A Python builtin applied to compile-time values (``len``, ``min``, ``int``, ...)."""

    def __init__(self, name: str):
        self.name = name

    def call(self, args: list[Arg], kwargs: dict[str, Arg], span: Span) -> Any:
        vals = []
        for i, a in enumerate(args):
            v = a.value
            value = _class_value if self.name == "isinstance" and i == 1 else _python_value
            if isinstance(v, Const):
                vals.append(value(v.value))
            elif isinstance(v, tuple) and self.name in ("len", "tuple"):
                vals.append(v)
            elif isinstance(v, tuple) and all(isinstance(x, Const) for x in v):
                vals.append(tuple(value(x.value) for x in v))
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
        # (`float(v)` ran the object's `__float__`; `len` of a tuple runs no element's code)
        folded = [(a.value, a.span) for a in args
                  if self.name != "isinstance" and not (isinstance(a.value, tuple) and self.name in ("len", "tuple"))]
        if folded:
            fn = getattr(py, self.name)
            keyed_fold(f"`{self.name}`", folded, span, lambda: fn(*vals), r)
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
    """``t(v)`` of a constant: the value the run-time conversion to ``t`` gives (docs/language.md
    rule 8): an integer wraps to an integer type's width and rounds once to a float type; a float
    truncates toward zero and saturates to an integer type, and rounds to nearest even to a float
    type (through f32, saturating, to an 8-bit float; through f32, then to nearest with ties away
    from zero, to tf32). An infinite or NaN value has no integer
    value at compile time (OverflowError / ValueError, reported as SP0303)."""
    v = plain_number(v)  # (`class Size(int)` by its value, as its key: not its own `__int__` / `__float__`)
    if t.is_bool:
        return bool(v)
    if t.is_int:
        if isinstance(v, float):
            if not math.isfinite(v):
                int(v)  # raises OverflowError (inf) or ValueError (NaN)
            return finite_float_to_int(v, t)
        return int_to_int(int(v), t)
    if isinstance(v, float):
        return float_to_type(v, t)
    if t.name == "tf32":  # to f32, then cvt.rna.tf32.f32, as at run time (int_to_float keeps f32's bits)
        return float_to_type(int_to_float(int(v), T.f32), t)
    return int_to_float(int(v), t)


def typed_constant(c: T.TypedConstant) -> Const:
    """The typed constant of ``dtype(value)`` written in Python (``u8(250)`` as a @jit kernel's
    constexpr argument or module constant): what ``u8(250)`` is in a kernel. Raises ValueError when
    it has none (a value that is no number, an infinite or NaN float or an integer that no integer
    type holds converted to an integer type)."""
    v, t = c.value, c.dtype
    if not isinstance(v, bool | int | float):
        raise ValueError(f"{t}(...) converts a number, found {type(v).__name__}")
    if t.is_int and not t.is_bool and isinstance(v, int) and not isinstance(v, bool) \
            and not INTEGER_CONSTANT_RANGE[0] <= v <= INTEGER_CONSTANT_RANGE[1]:
        raise ValueError(f"no integer type holds {v}")
    try:
        return Const(convert_const(v, t), t)
    except (OverflowError, ValueError):
        raise ValueError(f"{v!r} has no value in {t}") from None


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
            return Const(_py_builtin(name, [x.value for x in vals[0]], spread=False))
        return None
    if name == "sum":
        return None
    return Const(_py_builtin(name, [v.value for v in vals], spread=True))


def _py_builtin(name: str, vals: list[Any], spread: bool) -> Any:
    """Python's ``max`` / ``min`` / ``abs`` / ``sum`` of constants, but ``max`` and ``min`` of numbers
    with a float among them as the language's (docs/language.md rule 9, PTX ``max`` / ``min``):
    NaN is skipped (NaN only when every value is) and ``+0.0 > -0.0`` in either order. Python's
    ``max(-0.0, 0.0)`` is ``-0.0`` and ``max(nan, 1.0)`` is NaN. ``spread``: the values are the
    call's arguments (``max(a, b)``), else the items of its one tuple argument (``max(t)``)."""
    import builtins as py

    if name in ("max", "min") and vals and all(isinstance(v, int | float) for v in vals) \
            and any(isinstance(v, float) for v in vals) and (len(vals) > 1 or not spread):
        return fold_max_min(name, vals)
    return getattr(py, name)(*vals) if spread else getattr(py, name)(vals)


def fold_max_min(name: str, vals: list[int | float]) -> int | float:
    """``max`` / ``min`` of compile-time numbers as ``maximum`` / ``minimum`` compute them at run
    time (see :func:`_py_builtin`); of equal values the first is kept, as Python's."""
    numbers = [v for v in vals if not (isinstance(v, float) and math.isnan(v))]
    if not numbers:
        return vals[0]
    best = numbers[0]
    for v in numbers[1:]:
        if v == best == 0:  # +0.0 > -0.0
            neg_v, neg_best = math.copysign(1.0, v) < 0, math.copysign(1.0, best) < 0
            if neg_v != neg_best and neg_v == (name == "min"):
                best = v
        elif (v > best) if name == "max" else (v < best):
            best = v
    return best
