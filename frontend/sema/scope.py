"""Name bindings of sema, apart from the IR: the scope chain of a kernel's blocks (:class:`Scope`),
the names a block of statements may bind (:func:`assigned_names`), whether every path through it
ends in ``return`` (:func:`ends_in_return`), and what a ``return`` leaves (:class:`ReturnSignal`).

Used by :mod:`.core` (statements, helper inlining) and :mod:`.control` (``if``/``for``/``while``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..spans import Span
from ..syntax import ast as A


class Scope:
    """Name bindings of one block; lookups continue in the enclosing scope."""

    def __init__(self, parent: Scope | None = None):
        self.parent = parent
        self.names: dict[str, Any] = {}

    def lookup(self, name: str) -> Any:
        s: Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        raise KeyError(name)

    def has(self, name: str) -> bool:
        try:
            self.lookup(name)
            return True
        except KeyError:
            return False

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self.lookup(name)
        except KeyError:
            return default

    def all_names(self) -> set[str]:
        out: set[str] = set()
        s: Scope | None = self
        while s is not None:
            out |= set(s.names)
            s = s.parent
        return out


@dataclass
class ReturnSignal:
    """A ``return`` was executed on this path, with this value (None for a bare return)."""

    value: Any
    span: Span


def assigned_names(stmts: list[A.Stmt]) -> list[str]:
    """Names a block of statements may (re)bind, in first-assignment order (nested blocks too)."""
    out: list[str] = []

    def add_target(t: A.Expr) -> None:
        if isinstance(t, A.Name):
            if t.id not in out:
                out.append(t.id)
        elif isinstance(t, A.Tuple | A.List):
            for e in t.elts:
                add_target(e)

    def visit(body: list[A.Stmt]) -> None:
        for s in body:
            if isinstance(s, A.Assign):
                for t in s.targets:
                    add_target(t)
            elif isinstance(s, A.AnnAssign | A.AugAssign):
                add_target(s.target)
            elif isinstance(s, A.For):
                add_target(s.target)
                visit(s.body)
            elif isinstance(s, A.While):
                visit(s.body)
            elif isinstance(s, A.If):
                visit(s.body)
                visit(s.orelse)
            elif isinstance(s, A.FunctionDef) and s.name not in out:
                out.append(s.name)

    visit(stmts)
    return out


def ends_in_return(stmts: list[A.Stmt]) -> bool:
    """Whether every path through ``stmts`` ends in ``return``."""
    if not stmts:
        return False
    last = stmts[-1]
    if isinstance(last, A.Return):
        return True
    if isinstance(last, A.If):
        return ends_in_return(last.body) and ends_in_return(last.orelse)
    return False
