"""Compile-time constants of the wrong kind where the kernel needs a number.

* A bool given to a ``constexpr`` parameter that the kernel uses as a number is SP0723, naming the
  parameter and the value: as a size or a bound (``arange(0, BLOCK)``, a shape, a ``range`` or
  ``static_range`` bound, an axis), in arithmetic (``BLOCK * 2``, ``-BLOCK``) or in an ordering
  comparison (``offs < BLOCK``). Python's bool is an int, so ``BLOCK=True`` used to compile as 1.
  A bool constexpr used as a flag (``if FLAG:``, ``not``, ``and`` / ``or``, ``==``, ``&``, ``|``,
  ``^``, ``int(FLAG)``) is accepted. This is the compile-time side of SP0708, which a bool given to
  a run-time integer or float parameter gets (``frontend/sema/specialize.py``).
* Any other compile-time constant of the wrong type where an integer is needed (a float, a bool
  that is no parameter's, a string) stays SP0201, with a help line about its type rather than the
  one for a run-time value (:func:`wrong_constant_help`).

Which bool is a parameter's own is known by identity: ``Sema.constant_params`` maps the id of
each constexpr parameter's :class:`Const` to it, and a name bound to it (a local alias, a helper's
argument) holds that same object; a value computed from it (``not FLAG``) is a new one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..spans import Span
from .values import Const

NUMERIC_OPERATORS = frozenset({"+", "-", "*", "/", "//", "%", "**", "<<", ">>", "@", "<", "<=", ">", ">="})
"""Binary operators that use their operands as numbers (``&``, ``|``, ``^``, ``==`` and ``!=`` are
also the logical operators of flags)."""

NUMERIC_UNARY = frozenset({"-", "+"})
"""Unary operators that use their operand as a number (``~`` and ``not`` negate a flag)."""


def flag_parameter(sema: Any, value: Any) -> str | None:
    """The name of the constexpr parameter whose own bool ``value`` is, else None."""
    if not isinstance(value, Const) or not isinstance(value.value, bool | np.bool_):
        return None
    found = getattr(sema, "constant_params", {}).get(id(value))
    return found[0] if found is not None and found[1] is value else None


def flag_as_number(name: str, value: Any, use: str, span: Span) -> CompileError:
    """SP0723: constexpr parameter ``name`` was given the bool ``value`` and is used as a number
    (``use``: "`end` of arange", "an operand of `*`")."""
    return CompileError([Diagnostic(
        "SP0723", f"constexpr argument `{name}` is the bool {bool(value)!r}, used as a number here ({use})", span,
        help=f"pass an integer for `{name}` (`int(flag)` for 0 / 1); a bool constexpr is a flag, for `if {name}:`, "
             "`not`, `and` / `or` and `==`")])


def check_number_use(sema: Any, value: Any, use: str, span: Span) -> None:
    """Raise :func:`flag_as_number` when ``value`` is a constexpr parameter's own bool."""
    name = flag_parameter(sema, value)
    if name is not None:
        raise flag_as_number(name, value.value, use, span)


def check_operands(sema: Any, op: str, operands: tuple[tuple[Any, Span], ...]) -> None:
    """:func:`check_number_use` for the operands of operator ``op`` when it is a numeric one."""
    if op in NUMERIC_OPERATORS:
        for value, span in operands:
            check_number_use(sema, value, f"an operand of `{op}`", span)


def wrong_constant_help(value: Any, wanted: str) -> str:
    """SP0201's help for a compile-time constant ``value`` that is not ``wanted`` ("int", "tuple of
    integers"): what is wrong with it, not how to make a run-time value constant."""
    wanted = ("an " if wanted[:1] in "aeiou" else "a ") + wanted
    if isinstance(value, bool | np.bool_):
        return f"it is a compile-time constant, but a bool: give {wanted} (`int(flag)` for 0 / 1)"
    if isinstance(value, float | np.floating):
        return f"it is a compile-time constant, but a float: give {wanted} (`int(x)`, or `//` for integer division)"
    if value is None:
        return f"it is the compile-time constant None: give {wanted}"
    if isinstance(value, T.Type):
        return f"it is the type {value}, not a value: give {wanted}"
    return f"it is a compile-time constant of type {type(value).__name__}: give {wanted}"
