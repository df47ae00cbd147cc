"""Compile-time uses of a Python object whose value no compile cache key holds (SP0254).

A kernel folds the values it reads from Python (docs/language.md, "What a kernel captures"), and
every cache of compiled code is keyed on their fingerprints (frontend/sema/fingerprints.py). An
instance of your class, a NumPy array, a dict or a Python function is keyed by its type (on disk)
and its identity (in the process): what a kernel reads from its attributes is keyed by value, but
an operator, a truth test or a builtin that runs its Python code (``v == w``, ``if v:`` with a
``__bool__``, ``float(v)``, ``len(v)``, ``v in t``) would fold a value that no key holds, and two
processes (or one object changed in place) would share compiled code for other values. Such a use
is refused at its source, with a help naming what to capture instead.

A value that is keyed (a dataclass instance by its fields, an enum member by its name and value)
may still fold through the code of its class (a ``__bool__`` or ``__eq__`` of its own): that code
is not in the key, so the fold's result is (:func:`keyed_fold`, frontend/sema/class_code.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..spans import Span
from .captures import note_fold, note_folded
from .class_code import runs_own_code
from .fingerprints import unkeyed_part
from .values import Const

HELP = ("a kernel keys such an object by its type: read the attributes it needs (`obj.name`, each keyed by "
        "its value) or test `obj is None`; to fold a value, capture a number, string, tuple, dataclass "
        "instance or SimpleNamespace instead, or pass it as a constexpr argument")


def _note_folded(value: Any) -> None:
    """Each object with fields in the sema value ``value`` (a constant, a tuple of sema values) is
    recorded as folded (captures.note_folded): changed in place, it recompiles."""
    if isinstance(value, Const):
        value = value.value
    if isinstance(value, tuple | list):
        for x in value:
            _note_folded(x)
    else:
        note_folded(value)


def _unkeyed(value: Any) -> Any:
    """The unkeyed part of a sema value (a constant, or a tuple of sema values), else None."""
    if isinstance(value, Const):
        return unkeyed_part(value.value)
    if isinstance(value, tuple):
        return next((p for p in map(_unkeyed, value) if p is not None), None)
    return None


def unkeyed_error(use: str, part: Any, span: Span) -> CompileError:
    """SP0254: ``use`` (`` `==` ``, ``the condition``) needs the value of ``part``, at ``span``."""
    return CompileError([Diagnostic(
        "SP0254", f"{use} needs the value of a Python object of type `{type(part).__qualname__}`, which the "
                  "compile cache cannot key", span, help=HELP)])


def check_keyed(use: str, value: Any, span: Span) -> None:
    """Raise :func:`unkeyed_error` when the sema value ``value`` holds an object no key holds the value of."""
    part = _unkeyed(value)
    if part is not None:
        raise unkeyed_error(use, part, span)
    _note_folded(value)


def python_value(value: Any) -> Any:
    """The Python value of a sema value: a constant's value, a tuple of them."""
    if isinstance(value, Const):
        return value.value
    if isinstance(value, tuple):
        return tuple(map(python_value, value))
    return value


def keyed_fold(use: str, operands: Sequence[tuple[Any, Span]], span: Span, recompute: Callable[[], Any],
               result: Any) -> None:
    """:func:`check_keyed` of each operand (a sema value and its span) of a fold of ``use`` at
    ``span`` that gave ``result``; where the fold ran the code of a user's class, ``result`` is
    keyed (captures.note_fold: ``recompute`` folds the operands again) and must itself be keyed."""
    for value, at in operands:
        check_keyed(use, value, at)
    values = tuple(python_value(v) for v, _ in operands)
    if runs_own_code(values):
        part = unkeyed_part(result)
        if part is not None:
            raise CompileError([Diagnostic(
                "SP0254", f"{use} gives a Python object of type `{type(part).__qualname__}`, which the compile cache "
                          "cannot key", span, help=HELP)])
        note_fold(use, values, (span.line, span.col), recompute, result)


def user_code_failed(use: str, error: Exception, span: Span) -> CompileError:
    """SP0331: folding ``use`` (`` `==` ``, ``the condition``) at ``span`` ran Python code (a special
    method of the user's class) that raised ``error``; at a launch check that ran it again too."""
    return CompileError([Diagnostic(
        "SP0331", f"{use} failed on compile-time values: {type(error).__name__}: {error}", span,
        help="a special method of your class raised it: a kernel runs the methods it folds when it is "
             "compiled and again at every launch (docs/language.md, \"What a kernel captures\")")])


def keyed_truth(value: Any, span: Span, use: str = "the condition") -> bool:
    """The truth value of a constant or a tuple (``if v:``): SP0254 when it runs the ``__bool__`` or
    ``__len__`` of an object no key holds the value of (without either, such an object is true)."""
    if isinstance(value, tuple):
        return bool(value)  # (its length: no element's code runs)
    v = value.value
    part = unkeyed_part(v) if not isinstance(v, tuple | list) else None
    if part is not None and (hasattr(type(part), "__bool__") or hasattr(type(part), "__len__")):
        raise unkeyed_error(use, part, span)
    note_folded(v)  # (a dataclass's own `__bool__` reads its fields)
    try:
        truth = bool(v)
    except Exception as e:  # (a `__bool__` / `__len__` of the user's: it raised, or gave no bool)
        raise user_code_failed(use, e, span) from None
    if runs_own_code((v,)):
        note_fold(use, (v,), (span.line, span.col), lambda: bool(v), truth)
    return truth
