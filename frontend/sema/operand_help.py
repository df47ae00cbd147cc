"""Help lines for operators a kernel evaluates at compile time only: ``is`` and ``in`` on a run-time
value (SP0331) and indexing a Python object that is no tuple (SP0333, a dict global): what the
kernel writes instead."""

from __future__ import annotations

from typing import Any

import numpy as np

from .values import Const

_EXAMPLE_ELEMENTS = 3
"""How many elements of the right-hand tuple the ``==`` example of ``in`` (and of a captured array,
the tuple example of SP0333) spells out."""


def membership_help(op: str, left: str, right: Any) -> str:
    """The help of SP0331 for ``left op right`` with a run-time operand: ``op`` is ``is``,
    ``is not``, ``in`` or ``not in``; ``left`` the left operand's name (``x`` for an expression);
    ``right`` the right operand's sema value."""
    if op in ("is", "is not"):
        eq = "==" if op == "is" else "!="
        return (f"`{op}` compares compile-time values (and `{left} {op} None` whether an argument was passed as "
                f"None): compare run-time values with `{eq}`")
    elems = [e.value for e in right if isinstance(e, Const)] if isinstance(right, tuple) else []
    if elems and len(elems) == len(right):
        eq, join = ("==", " | ") if op == "in" else ("!=", " & ")
        tests = [f"({left} {eq} {v!r})" for v in elems[:_EXAMPLE_ELEMENTS]]
        more = f"{join}..." if len(elems) > _EXAMPLE_ELEMENTS else ""
        example = f" (`{join.join(tests)}{more}`)"
    else:
        example = ""
    what = f"`{left}`" if left != "x" else "the value"
    return (f"`{op}` is evaluated when the kernel compiles: test a run-time value against each element with "
            f"`==`{example}, or make {what} a `constexpr` parameter")


def subscript_help(base: Any, name: str | None, key: str) -> str | None:
    """The help of SP0333 for ``name[key]`` indexing the Python object ``base`` (``name`` is None
    for an expression, ``key`` the index's text), or None where there is none to give."""
    if isinstance(base, np.ndarray):
        return _array_help(base, name or "TABLE")
    if not isinstance(base, dict):
        return None
    d = name or "D"
    return (f"a kernel cannot index a dict (it reads numbers, strings, tuples, lists, dtypes and the attributes of "
            f"Python objects): bind the entry to a module constant (`VALUE = {d}[{key}]`) and read that, or make "
            f"the dict an object whose attributes the kernel reads (`types.SimpleNamespace(**{d})`)")


def _array_help(array: np.ndarray, name: str) -> str:
    """The help of SP0333 for ``name[...]`` indexing a captured NumPy array: a kernel folds a captured
    tuple's elements (keyed by value) but reads no array it captures; the tuple spelled with the
    array's first elements."""
    head = [repr(v) for v in array.ravel()[:_EXAMPLE_ELEMENTS].tolist()]
    more = ", ..." if array.size > _EXAMPLE_ELEMENTS else "," if array.size == 1 else ""
    return (f"a kernel does not read the elements of an array it captures: capture a tuple and index it by a "
            f"constant (`{name} = ({', '.join(head)}{more})`), or pass the array as a pointer argument and load it "
            f"(`sp.load({name.lower()} + i)`)")
