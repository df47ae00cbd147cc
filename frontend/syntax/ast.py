"""The kernel AST: what the parser produces and semantic analysis reads.

Node and field names follow Python's :mod:`ast` where the constructs coincide, so that the two
front doors (``.spk`` files and ``@jit`` functions) give the same tree. Every node carries a
:class:`~sparsile.frontend.spans.Span` (``span``, keyword-only; end column exclusive). Nodes are
frozen dataclasses compared by identity (``eq=False``), so they may key dictionaries (e.g. a
node -> type table in sema); build changed copies with :func:`dataclasses.replace`.

Operators are spelled as in Python: ``BinOp.op`` is one of :data:`BINARY_OPS`, ``UnaryOp.op``
one of :data:`UNARY_OPS`, ``BoolOp.op`` ``"and"``/``"or"``, ``Compare.ops`` items one of
:data:`COMPARE_OPS`, ``AugAssign.op`` a binary operator without the ``=``.

:func:`walk` iterates over a tree; :func:`dump` renders it as readable text (used by snapshot tests
and ``sparsile compile --emit ast``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from ..spans import SourceFile, Span

BINARY_OPS = ("+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "@")
UNARY_OPS = ("-", "+", "~", "not")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=", "in", "not in", "is", "is not")

ParamKind = Literal["positional", "keyword_only"]


@dataclass(eq=False, frozen=True)
class Node:
    """Base of every AST node."""

    span: Span = field(kw_only=True, repr=False)


@dataclass(eq=False, frozen=True)
class Expr(Node):
    """Base of expressions."""


@dataclass(eq=False, frozen=True)
class Stmt(Node):
    """Base of statements."""


# ---------------------------------------------------------------- expressions


@dataclass(eq=False, frozen=True)
class Name(Expr):
    id: str


@dataclass(eq=False, frozen=True)
class Constant(Expr):
    """A literal: ``int``, ``float``, ``bool``, ``str`` or ``None`` (adjacent strings are joined)."""

    value: int | float | bool | str | None


@dataclass(eq=False, frozen=True)
class Tuple(Expr):
    elts: list[Expr]


@dataclass(eq=False, frozen=True)
class List(Expr):
    elts: list[Expr]


@dataclass(eq=False, frozen=True)
class Attribute(Expr):
    """``value.attr``; ``attr_span`` covers just the attribute name."""

    value: Expr
    attr: str
    attr_span: Span = field(repr=False)


@dataclass(eq=False, frozen=True)
class Slice(Expr):
    """``lower:upper:step`` inside a subscript; absent parts are ``None``."""

    lower: Expr | None
    upper: Expr | None
    step: Expr | None


@dataclass(eq=False, frozen=True)
class Subscript(Expr):
    """``value[i, j, ...]``. ``indices`` has one item per comma-separated index (a single index is a
    one-element list; a parenthesized tuple index ``a[(1, 2)]`` is flattened like ``a[1, 2]``)."""

    value: Expr
    indices: list[Expr]


@dataclass(eq=False, frozen=True)
class Starred(Expr):
    """``*value`` as a call argument (parsed so that sema can reject it with a clear message)."""

    value: Expr


@dataclass(eq=False, frozen=True)
class Keyword(Node):
    """``name=value`` in a call; ``name`` is ``None`` for ``**value``."""

    name: str | None
    value: Expr


@dataclass(eq=False, frozen=True)
class Call(Expr):
    func: Expr
    args: list[Expr]
    keywords: list[Keyword]


@dataclass(eq=False, frozen=True)
class BinOp(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(eq=False, frozen=True)
class UnaryOp(Expr):
    op: str
    operand: Expr


@dataclass(eq=False, frozen=True)
class BoolOp(Expr):
    """``a and b and c`` (one node for the whole chain of the same operator)."""

    op: Literal["and", "or"]
    values: list[Expr]


@dataclass(eq=False, frozen=True)
class Compare(Expr):
    """``left ops[0] comparators[0] ops[1] comparators[1] ...`` (``0 <= i < n``)."""

    left: Expr
    ops: list[str]
    comparators: list[Expr]


@dataclass(eq=False, frozen=True)
class IfExp(Expr):
    """``body if test else orelse``."""

    test: Expr
    body: Expr
    orelse: Expr


# ---------------------------------------------------------------- statements


@dataclass(eq=False, frozen=True)
class Assign(Stmt):
    """``t1 = t2 = value``: ``targets`` lists the chained targets left to right."""

    targets: list[Expr]
    value: Expr


@dataclass(eq=False, frozen=True)
class AnnAssign(Stmt):
    target: Expr
    annotation: Expr
    value: Expr | None


@dataclass(eq=False, frozen=True)
class AugAssign(Stmt):
    """``target op= value``; ``op`` is the binary operator (``"+"`` for ``+=``)."""

    target: Expr
    op: str
    value: Expr


@dataclass(eq=False, frozen=True)
class ExprStmt(Stmt):
    value: Expr


@dataclass(eq=False, frozen=True)
class For(Stmt):
    """``for target in iter: body`` (any iterable expression; ``range``/``static_range`` are calls)."""

    target: Expr
    iter: Expr
    body: list[Stmt]


@dataclass(eq=False, frozen=True)
class While(Stmt):
    test: Expr
    body: list[Stmt]


@dataclass(eq=False, frozen=True)
class If(Stmt):
    """``if``; an ``elif`` is a nested :class:`If` that is the only statement of ``orelse``."""

    test: Expr
    body: list[Stmt]
    orelse: list[Stmt]


@dataclass(eq=False, frozen=True)
class Return(Stmt):
    value: Expr | None


@dataclass(eq=False, frozen=True)
class Pass(Stmt):
    pass


@dataclass(eq=False, frozen=True)
class Break(Stmt):
    pass


@dataclass(eq=False, frozen=True)
class Continue(Stmt):
    pass


@dataclass(eq=False, frozen=True)
class Assert(Stmt):
    test: Expr
    msg: Expr | None


@dataclass(eq=False, frozen=True)
class Param(Node):
    """One function parameter; parameters after a bare ``*`` are ``"keyword_only"``. As in Python,
    ``span`` covers the name and the annotation, not the default."""

    name: str
    annotation: Expr | None
    default: Expr | None
    kind: ParamKind


@dataclass(eq=False, frozen=True)
class FunctionDef(Stmt):
    """``def name(params) -> returns: body``. ``span`` runs from ``def`` to the end of the body (as
    in Python, decorators are not included); ``name_span`` covers the name. The docstring, if any,
    is removed from ``body`` and kept cleaned (:func:`inspect.cleandoc`) in ``docstring``."""

    name: str
    params: list[Param]
    body: list[Stmt]
    decorators: list[Expr]
    returns: Expr | None
    docstring: str | None
    name_span: Span = field(repr=False)


@dataclass(eq=False, frozen=True)
class Import(Stmt):
    """``import a.b as c, d``: ``names`` holds ``(dotted name, alias or None)`` pairs."""

    names: list[tuple[str, str | None]]


@dataclass(eq=False, frozen=True)
class ImportFrom(Stmt):
    """``from module import a as b``; ``module`` keeps leading dots of relative imports and
    ``names`` is ``[("*", None)]`` for a star import."""

    module: str
    names: list[tuple[str, str | None]]


@dataclass(eq=False, frozen=True)
class Module(Node):
    """A parsed source: its statements (without the docstring), the source and the docstring."""

    body: list[Stmt]
    source: SourceFile = field(repr=False)
    docstring: str | None


# ---------------------------------------------------------------- traversal and printing

_HIDDEN_FIELDS = frozenset({"span", "attr_span", "name_span", "source"})
_ALWAYS_SHOWN = frozenset({("Constant", "value"), ("Keyword", "name"), ("Module", "body"),
                           ("FunctionDef", "body"), ("Tuple", "elts"), ("List", "elts")})


def _visible_fields(node: Node) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(node) if f.name not in _HIDDEN_FIELDS]


def iter_child_nodes(node: Node) -> Iterator[Node]:
    """The nodes directly below ``node``, in field order."""
    for f in _visible_fields(node):
        value = getattr(node, f.name)
        if isinstance(value, Node):
            yield value
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Node):
                    yield item


def walk(node: Node) -> Iterator[Node]:
    """Every node of the tree rooted at ``node`` (itself first), depth first, in source order.
    Iterative, so that very deep trees do not hit Python's recursion limit."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(list(iter_child_nodes(current))))


def _format_span(span: Span) -> str:
    return f"@{span.line}:{span.col}-{span.end_line}:{span.end_col}"


def _format_value(value: object, level: int, spans: bool, width: int) -> str:
    if isinstance(value, Node):
        return _format_node(value, level, spans, width)
    if isinstance(value, list):
        if not value:
            return "[]"
        items = [_format_value(v, level + 1, spans, width) for v in value]
        flat = "[" + ", ".join(items) + "]"
        if "\n" not in flat and len(flat) + 2 * level <= width:
            return flat
        pad = "  " * (level + 1)
        return "[\n" + "".join(f"{pad}{item},\n" for item in items) + "  " * level + "]"
    return repr(value)


def _format_node(node: Node, level: int, spans: bool, width: int) -> str:
    parts = []
    for f in _visible_fields(node):
        value = getattr(node, f.name)
        empty = value is None or (isinstance(value, list) and not value)
        if empty and (type(node).__name__, f.name) not in _ALWAYS_SHOWN:
            continue
        parts.append((f.name, _format_value(value, level + 1, spans, width)))
    name = type(node).__name__ + (_format_span(node.span) if spans else "")
    flat = f"{name}(" + ", ".join(f"{k}={v}" for k, v in parts) + ")"
    if "\n" not in flat and len(flat) + 2 * level <= width:
        return flat
    pad = "  " * (level + 1)
    body = "".join(f"{pad}{k}={v},\n" for k, v in parts)
    return f"{name}(\n{body}" + "  " * level + ")"


def dump(node: Node, *, spans: bool = False, width: int = 100) -> str:
    """A readable, stable rendering of the tree: ``Kind(field=value, ...)``, one node per line once
    a node does not fit in ``width`` columns. Fields that are ``None`` or empty lists are left out,
    except ``Constant.value``, ``Keyword.name``, function and module ``body`` and ``elts``; spans
    are shown as ``@line:col-end_line:end_col`` after the node kind when ``spans`` is true."""
    return _format_node(node, 0, spans, width)


__all__ = [
    "BINARY_OPS",
    "COMPARE_OPS",
    "UNARY_OPS",
    "AnnAssign",
    "Assert",
    "Assign",
    "Attribute",
    "AugAssign",
    "BinOp",
    "BoolOp",
    "Break",
    "Call",
    "Compare",
    "Constant",
    "Continue",
    "Expr",
    "ExprStmt",
    "For",
    "FunctionDef",
    "If",
    "IfExp",
    "Import",
    "ImportFrom",
    "Keyword",
    "List",
    "Module",
    "Name",
    "Node",
    "Param",
    "ParamKind",
    "Pass",
    "Return",
    "Slice",
    "Starred",
    "Stmt",
    "Subscript",
    "Tuple",
    "UnaryOp",
    "While",
    "dump",
    "iter_child_nodes",
    "walk",
]
