"""Operator precedence for the grammar's flat ``operation`` rule.

The grammar parses an expression's operators as one flat sequence (operands with their prefix
operators, separated by binary operators) because a rule per precedence level makes the LALR
parser reduce through a dozen rules for every operand. This module groups the sequence into
:class:`~sparsile.frontend.syntax.ast.BinOp`, :class:`~sparsile.frontend.syntax.ast.UnaryOp`,
:class:`~sparsile.frontend.syntax.ast.BoolOp` and :class:`~sparsile.frontend.syntax.ast.Compare` nodes by
precedence climbing, with Python's table (Python reference 6.17, loosest first)::

    or < and < not x < comparisons (chained: 0 <= i < n) < | < ^ < & < << >>
       < + - < * / // % @ < +x -x ~x < ** (right-associative)

``**`` binds tighter than a prefix operator on its left and looser than one on its right
(``-x**2 == -(x**2)``, ``2**-1 == 2**(-1)``). ``not`` may only follow ``and``, ``or``, another
``not`` or start the expression (``a == not b`` is refused, as in Python: SP0124).

Spans follow Python: a node runs from its first operand (prefix operator and parentheses
included) to the end of its last operand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lark import Token, Tree

from ..diagnostics import DiagnosticBag
from ..spans import Span
from . import ast

MAX_EXPRESSION_DEPTH = 200

_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!=", "in", "not in", "is", "is not"})
_NOT_LEVEL = 3
_PREFIX_LEVEL = 11
PRECEDENCE: dict[str, int] = {
    "or": 1, "and": 2,
    **dict.fromkeys(_COMPARISONS, 4),
    "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9,
    "*": 10, "/": 10, "//": 10, "%": 10, "@": 10,
    "**": 12,
}
"""Binding strength of every binary operator (higher binds tighter)."""


class ExpressionTooDeep(Exception):
    """An expression nests deeper than :data:`MAX_EXPRESSION_DEPTH` levels."""


@dataclass
class _Operand:
    prefixes: list[Token]
    primary: Tree | Token
    used: int = 0


class OperationGrouper:
    """Groups one ``operation`` parse-tree node, ``prefix_op* primary (binary_op prefix_op* primary)*``.
    ``convert(item, depth)`` builds the AST of a primary found at nesting ``depth`` and ``span_of``
    gives the span of a parse-tree item."""

    def __init__(self, tree: Tree, convert: Callable[[Tree | Token, int], ast.Expr],
                 span_of: Callable[[Tree | Token], Span], bag: DiagnosticBag, depth: int = 0):
        self._convert = convert
        self._span_of = span_of
        self._bag = bag
        self._depth = depth
        self._items: list[_Operand | str] = []
        prefixes: list[Token] = []
        for child in tree.children:
            if isinstance(child, Tree) and child.data == "binary_op":
                self._items.append(_operator_text(child))
            elif isinstance(child, Tree) and child.data == "prefix_op":
                prefixes.append(child.children[0])
            else:
                self._items.append(_Operand(prefixes, child))
                prefixes = []
        self._at = 0

    def group(self) -> ast.Expr:
        expr, _ = self._expression(0)
        return expr

    # ------------------------------------------------------------ precedence climbing

    def _peek_operator(self) -> str | None:
        if self._at < len(self._items):
            item = self._items[self._at]
            if isinstance(item, str):
                return item
        return None

    def _expression(self, min_level: int) -> tuple[ast.Expr, Span]:
        self._depth += 1
        try:
            if self._depth > MAX_EXPRESSION_DEPTH:
                raise ExpressionTooDeep
            left, span = self._operand(min_level)
            while (op := self._peek_operator()) is not None and PRECEDENCE[op] >= min_level:
                level = PRECEDENCE[op]
                if op in ("and", "or"):
                    values = [left]
                    while self._peek_operator() == op:
                        self._at += 1
                        value, end = self._expression(level + 1)
                        values.append(value)
                    span = span.to(end)
                    left = ast.BoolOp(op, values, span=span)  # type: ignore[arg-type]
                elif op in _COMPARISONS:
                    ops, comparators = [], []
                    while (cmp := self._peek_operator()) is not None and cmp in _COMPARISONS:
                        self._at += 1
                        ops.append(cmp)
                        value, end = self._expression(level + 1)
                        comparators.append(value)
                    span = span.to(end)
                    left = ast.Compare(left, ops, comparators, span=span)
                else:
                    self._at += 1
                    # `**` is right-associative: its right side may hold another `**`.
                    right, end = self._expression(level if op == "**" else level + 1)
                    span = span.to(end)
                    left = ast.BinOp(op, left, right, span=span)
            return left, span
        finally:
            self._depth -= 1

    def _operand(self, min_level: int) -> tuple[ast.Expr, Span]:
        item = self._items[self._at]
        assert isinstance(item, _Operand)
        if item.used < len(item.prefixes):
            token = item.prefixes[item.used]
            item.used += 1
            op = str(token)
            start = self._span_of(token)
            if op == "not" and min_level > _NOT_LEVEL:
                self._bag.error("SP0124", "`not` cannot follow an operator other than `and`/`or`", start,
                                help="put the `not` expression in parentheses")
            inner, end = self._expression(_NOT_LEVEL if op == "not" else _PREFIX_LEVEL)
            span = start.to(end)
            return ast.UnaryOp(op, inner, span=span), span
        self._at += 1
        return self._convert(item.primary, self._depth), self._span_of(item.primary)


def _operator_text(tree: Tree) -> str:
    """``"is not"`` / ``"not in"`` from their tokens (``is not`` is one token that may contain a
    line continuation)."""
    (first, *rest) = tree.children
    if first.type == "IS_NOT":
        return "is not"
    return " ".join(str(t) for t in (first, *rest))


__all__ = ["MAX_EXPRESSION_DEPTH", "PRECEDENCE", "ExpressionTooDeep", "OperationGrouper"]
