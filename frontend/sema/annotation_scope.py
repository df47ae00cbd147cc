"""The names a ``@jit`` function's annotations read from an enclosing function or class body.

Python evaluates a parameter annotation where the ``def`` is: for a function defined in another
function or a class body, in that scope, which is gone when the kernel compiles. Python's values
(``f.__annotations__``) stand for them then (frontend/sema/captures.py). Under ``from __future__
import annotations`` (PEP 563) Python keeps them as text instead, and the kernel evaluates that
text itself: a name of the kernel's closure and a module global it reads as Python would, but a
name bound in an enclosing function (outside the closure) or class body has no value it can read.
:class:`AnnotationNames` gives :class:`~.values.EnclosingScopeName` for those (SP0202 at the
name), never the module's value of the same name.

Which scope binds a name is read from the module's symbol table (:mod:`symtable`), as Python's
compiler decides it, when the kernel is made (with its own source; once per ``def``).
"""

from __future__ import annotations
import __future__

import inspect
import symtable
import weakref
from collections.abc import Callable
from typing import Any

from .values import EnclosingScopeName

FUTURE_ANNOTATIONS = __future__.annotations.compiler_flag
"""The code flag of a function compiled under ``from __future__ import annotations``."""


def keeps_annotations_as_text(f: Any) -> bool:
    """Whether ``f`` was compiled under ``from __future__ import annotations``."""
    code = getattr(f, "__code__", None)
    return code is not None and bool(code.co_flags & FUTURE_ANNOTATIONS)


class EnclosingScopes:
    """The function and class scopes around a nested function's ``def``, innermost last, read
    from its module's source when the kernel is made, as the kernel's own source is (empty when the
    source or the ``def`` cannot be found): a source file edited before the first compile must not
    change them."""

    def __init__(self, f: Any):
        self._scopes = enclosing_tables(f)
        self._function = f
        self._memo: dict[str, tuple[str, str] | None] = {}

    def binding(self, name: str) -> tuple[str, str] | None:
        """(``"function"`` or ``"class"``, scope name) of the enclosing scope that binds ``name``
        where an annotation of the ``def`` reads it; None when it is the module's (or a builtin)."""
        if name not in self._memo:
            self._memo[name] = _binding(self._scopes, name)
        return self._memo[name]

    @property
    def innermost(self) -> str:
        """The name of the function or class body the ``def`` is in."""
        parts = [p for p in str(self._function.__qualname__).split(".") if p != "<locals>"]
        return parts[-2] if len(parts) > 1 else "?"


_TABLES: weakref.WeakKeyDictionary[Any, list[symtable.SymbolTable]] = weakref.WeakKeyDictionary()
"""Code object -> :func:`enclosing_tables` of its functions: the module is read once per ``def``,
not at each call of a function that makes a kernel."""


def enclosing_tables(f: Any) -> list[symtable.SymbolTable]:
    """The symbol tables of the scopes around ``f``'s ``def``, outermost first, module excluded;
    read once per code object (the first kernel made from it)."""
    code = f.__code__
    tables = _TABLES.get(code)
    if tables is None:
        tables = _TABLES[code] = _enclosing_tables(f)
    return tables


def _enclosing_tables(f: Any) -> list[symtable.SymbolTable]:
    """The symbol tables of the scopes around ``f``'s ``def``, outermost first, module excluded."""
    try:
        lines, _ = inspect.findsource(f)
        table = symtable.symtable("".join(lines), inspect.getsourcefile(f) or "<unknown>", "exec")
    except (OSError, TypeError, SyntaxError, ValueError):
        return []
    first = f.__code__.co_firstlineno  # the first decorator's line; the `def` is at or after it
    parts = [p for p in str(f.__qualname__).split(".") if p != "<locals>"]
    chain: list[symtable.SymbolTable] = []
    for i, part in enumerate(parts):
        named = [c for c in table.get_children() if c.get_name() == part and c.get_type() in ("function", "class")]
        if i + 1 < len(parts):  # an enclosing scope: the closest one that starts before the kernel
            before = [c for c in named if c.get_lineno() <= first]
            if not before:
                return []
            table = max(before, key=lambda c: c.get_lineno())
            chain.append(table)
        elif not any(c.get_lineno() >= first for c in named):
            return []
    return chain


def _binding(scopes: list[symtable.SymbolTable], name: str) -> tuple[str, str] | None:
    """Where Python resolves ``name`` read in the innermost of ``scopes`` (an annotation of a
    ``def`` there): a class body is seen only from itself, as in Python."""
    for depth, table in enumerate(reversed(scopes)):
        kind = table.get_type()
        if kind == "class" and depth > 0:
            continue
        try:
            symbol = table.lookup(name)
        except KeyError:
            continue
        if symbol.is_local():
            return (str(kind), table.get_name())
        if symbol.is_global():  # declared `global`, or a name the compiler found nowhere around
            return None
    return None


class AnnotationNames:
    """The names of a nested ``@jit`` function's PEP 563 annotations: ``resolver``'s (the kernel's
    closure, then its module), except a name bound in an enclosing scope and not in the closure,
    which resolves to :class:`~.values.EnclosingScopeName`."""

    def __init__(self, resolver: Callable[[str], Any], f: Any, closure: dict[str, Any]):
        self._resolver = resolver
        self._closure = closure
        self._scopes = EnclosingScopes(f)

    def __call__(self, name: str) -> Any:
        if name not in self._closure:
            where = self._scopes.binding(name)
            if where is not None:
                return _unreadable(name, where, self._scopes.innermost)
        return self._resolver(name)


def _unreadable(name: str, where: tuple[str, str], innermost: str) -> EnclosingScopeName:
    kind, scope = where
    what = f"a variable of `{scope}`" if kind == "function" else f"a name of the class body `{scope}`"
    return EnclosingScopeName(
        f"`{name}` in the annotation of a kernel defined in `{innermost}` is {what}, which "
        "`from __future__ import annotations` leaves unevaluated",
        "remove `from __future__ import annotations` from the module (Python then evaluates the annotation "
        "where the `def` is), or leave the parameter unannotated: its type comes from the argument")
