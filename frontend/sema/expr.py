"""Sema for expressions: the dispatch on the expression's kind, constants and names. Operators
(:mod:`.operators`), calls (:mod:`.calls`) and attributes and subscripts (:mod:`.access`) are
mixins of :class:`ExprMixin`."""

from __future__ import annotations

import difflib
from typing import Any

from ..diagnostics import CompileError, Diagnostic, Label
from ..spans import Span
from ..syntax import ast as A
from .access import AccessMixin
from .builtins import lookup_global
from .calls import CallMixin
from .consts import PY_FOLDABLE, PyBuiltin, as_sv
from .emitter import Emitter, describe
from .member_help import for_loop_help
from .operators import OperatorMixin
from .python_builtins import builtin_help
from .triton_names import name_help
from .values import (
    POISON,
    AssignedLater,
    Const,
    EmptyClosureCell,
    EnclosingScopeName,
    PoisonError,
    Unbound,
    UnreadableAnnotation,
)


class ExprMixin(OperatorMixin, CallMixin, AccessMixin):
    """Expressions for :class:`~sparsile.frontend.sema.core.Sema`."""

    # provided by Sema
    builder: Any
    current_span: Span | None

    def emitter(self) -> Emitter:
        return Emitter(self.builder, self)

    def describe(self, v: Any) -> str:
        return describe(v)

    def const_expr(self, node: A.Expr, what: str) -> Any:
        v = self.expr(node)
        if isinstance(v, Const):
            return v.value
        if isinstance(v, tuple) and all(isinstance(x, Const) for x in v):
            return tuple(x.value for x in v)
        raise CompileError([Diagnostic("SP0201", f"{what} must be a compile-time constant", node.span)])

    # ------------------------------------------------------------------------------ dispatch
    def expr(self, node: A.Expr) -> Any:
        saved = self.current_span
        self.current_span = node.span
        try:
            v = self._expr(node)
        finally:
            self.current_span = saved
        if v is POISON:
            raise PoisonError()
        if isinstance(v, Const) and isinstance(v.value, tuple):
            return as_sv(v.value)  # one representation of tuples: a Python tuple of sema values
        return v

    def _expr(self, node: A.Expr) -> Any:
        if isinstance(node, A.Constant):
            return Const(node.value)
        if isinstance(node, A.Name):
            return self.name(node)
        if isinstance(node, A.Tuple | A.List):
            return tuple(self.expr(e) for e in node.elts)
        if isinstance(node, A.BinOp):
            return self.binop(node.op, self.expr(node.left), self.expr(node.right), node.left.span,
                              node.right.span, node.span)
        if isinstance(node, A.UnaryOp):
            return self.unaryop(node)
        if isinstance(node, A.BoolOp):
            return self.boolop(node)
        if isinstance(node, A.Compare):
            return self.compare(node)
        if isinstance(node, A.IfExp):
            return self.ifexp(node)
        if isinstance(node, A.Call):
            return self.call(node)
        if isinstance(node, A.Attribute):
            return self.attribute(node)
        if isinstance(node, A.Subscript):
            return self.subscript(node)
        if isinstance(node, A.Slice):
            raise CompileError([Diagnostic("SP0227", "a slice is only allowed inside `[...]`", node.span)])
        if isinstance(node, A.Starred):
            raise CompileError([Diagnostic("SP0228", "`*` unpacking is not supported in kernels", node.span)])
        raise CompileError([Diagnostic("SP0210", f"`{type(node).__name__}` expressions are not supported", node.span)])

    # ------------------------------------------------------------------------------ names
    def name(self, node: A.Name) -> Any:
        try:
            v = self.lookup_local(node.id)  # type: ignore[attr-defined]
        except KeyError:
            pass
        else:
            if type(v) is Const and self.constant_params:  # type: ignore[attr-defined]
                self.note_constant_use(node.span, v)  # type: ignore[attr-defined]
            return _check_bound(node, v)
        frames = self.frames  # type: ignore[attr-defined]
        if frames and node.id in frames[-1].local_names:
            raise _assigned_later(node, frames[-1].name)
        try:
            v = self.resolve_global(node.id)  # type: ignore[attr-defined]
        except KeyError:
            pass
        else:
            if isinstance(v, AssignedLater):
                raise _assigned_later(node, v.function)
            if isinstance(v, EnclosingScopeName):
                raise UnreadableAnnotation([Diagnostic("SP0202", v.message, node.span, help=v.help)])
            if isinstance(v, EmptyClosureCell):
                raise CompileError([Diagnostic(
                    "SP0202", f"`{node.id}` is a variable of an enclosing function that has no value yet", node.span,
                    help=f"assign `{node.id}` in the enclosing function before the kernel's first launch: a kernel "
                         "reads its closure when it compiles, as Python reads it when the function runs")])
            return _check_bound(node, v)
        b = lookup_global(node.id)
        if b is not None:
            return b
        if node.id in PY_FOLDABLE:
            return Const(PyBuiltin(node.id))
        candidates = set(self.scope.all_names()) | set(_known_globals())  # type: ignore[attr-defined]
        close = difflib.get_close_matches(node.id, sorted(candidates), n=1)
        help_ = (for_loop_help(node.id) or name_help(node.id) or builtin_help(node.id)
                 or (f"did you mean `{close[0]}`?" if close else None))
        raise CompileError([Diagnostic("SP0202", f"unknown name `{node.id}`", node.span, help=help_)])


def _assigned_later(node: A.Name, function: str) -> CompileError:
    """SP0202 for a name read before the function it is local to assigns it."""
    return CompileError([Diagnostic(
        "SP0202", f"`{node.id}` is used before `{function}` assigns it", node.span,
        help=f"a name assigned anywhere in a function is local to it, as in Python: no `{node.id}` from outside "
             f"`{function}` (a module value, an enclosing function's) is read there; assign it before this use (before "
             "the loop, for a loop body), or rename the local")])


def _check_bound(node: A.Name, v: Any) -> Any:
    """``v``, unless the name has no value on this path (SP0237)."""
    if isinstance(v, Unbound):
        raise CompileError([Diagnostic("SP0237", f"`{node.id}` {v.why}", node.span, help=v.help or None,
                                       labels=(Label(v.span, "here"),))])
    return v


def _known_globals() -> list[str]:
    from .builtins import ROOT

    return list(ROOT.members)
