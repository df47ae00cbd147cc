"""The help of SP0202 (unknown name) for a Python built-in name that means nothing in a kernel
(``dict``, ``round``, ``ValueError``, ``getattr``, ...): what a kernel can use instead. The built-ins
a kernel has (docs/language.md, "Compile-time values": ``len int float bool abs min max tuple str
isinstance`` on constants, the language's ``sum``, ``range`` in a ``for`` loop) never get here."""

from __future__ import annotations

import builtins

SUPPORTED = ("`len`, `int`, `float`, `bool`, `abs`, `min`, `max`, `sum`, `tuple`, `str` and `isinstance` on "
             "compile-time values")

CONTAINER = ("a kernel has no dicts, lists or sets: its only container is a tuple (`(a, b)`, indexed by "
             "constants; lists are tuples); run-time data lives in tiles")

ITERATE = ("a `for` loop iterates over `range(...)` or `static_range(...)` only: loop over the indices and "
           "index the tuples (`for i in static_range(len(t)):`)")

ATTRIBUTES = ("a kernel reads an attribute by writing it (`obj.name`, a compile-time constant under @jit); "
              "there is no lookup by a string")

EXCEPTION = ("a kernel cannot raise exceptions: check with `assert cond, \"message\"` (at run time, by the "
             "interpreter) or `static_assert(cond, \"message\")` at compile time")

POWER = "write `x ** y`"

NAMES: dict[str, str] = {
    "print": "kernels do not print at run time; `static_print(...)` prints constants at compile time",
    "dict": CONTAINER,
    "list": CONTAINER,
    "set": CONTAINER,
    "frozenset": CONTAINER,
    "enumerate": ITERATE,
    "zip": ITERATE,
    "reversed": ITERATE,
    "iter": ITERATE,
    "next": ITERATE,
    "getattr": ATTRIBUTES,
    "hasattr": ATTRIBUTES,
    "setattr": "a kernel cannot assign to attributes (docs/language.md, Syntax)",
    "slice": "a kernel has no slice objects: write the subscript (`t[1:3]` of a tuple, `x[:, None]` of a tile)",
    "round": ("the language has no `round`: `floor(x)` / `ceil(x)` round a float down / up; `x.to(i32)` "
              "truncates toward zero"),
    "pow": POWER,
    "divmod": "write `a // b` and `a % b` (on integers they round toward zero, as C: docs/language.md rule 6)",
    "all": "combine conditions with `and`; a tile of bools `m` is all true where `min(m.to(i32)) == 1`",
    "any": "combine conditions with `or`; a tile of bools `m` has a true element where `max(m.to(i32)) == 1`",
}
"""Python built-ins with a kernel-side spelling or reason."""


def _is_exception(name: str) -> bool:
    obj = getattr(builtins, name, None)
    return isinstance(obj, type) and issubclass(obj, BaseException)


def builtin_help(name: str) -> str | None:
    """The help line for the Python built-in ``name`` in a kernel, or None where ``name`` is no
    Python built-in."""
    if name in NAMES:
        return NAMES[name]
    if name.startswith("_") or not hasattr(builtins, name):
        return None
    if _is_exception(name):
        return EXCEPTION
    if isinstance(getattr(builtins, name), type):  # `object`, `type`, `super`, `complex`, ...
        return (f"`{name}` is a Python class; a kernel creates no objects. Python built-ins a kernel can call: "
                f"{SUPPORTED}")
    return f"`{name}` is a Python built-in with no meaning in a kernel; those a kernel can call: {SUPPORTED}"
