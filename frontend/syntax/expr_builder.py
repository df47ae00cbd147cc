"""Lark parse tree -> kernel AST for expressions: the expression half of
:class:`~sparsile.frontend.syntax.builder.AstBuilder`, a mixin as sema's ``ExprMixin`` is.

Names, literals, displays, attributes, subscripts, slices, calls and conditional expressions;
operator chains go to :class:`~.precedence.OperationGrouper`. Errors, collected in the builder's
:class:`DiagnosticBag`: SP0113 (a Python-only keyword used as a name), SP0116 (invalid number
literal), SP0117 (invalid string literal), SP0119 (invalid call arguments), and SP0121 (nested too
deeply: :class:`~.precedence.ExpressionTooDeep`, reported by the builder). The wording follows
CPython's compiler (Python reference, section 6.3.4 "Calls").
"""

from __future__ import annotations

import ast as pyast
import re
import warnings
from typing import TYPE_CHECKING

from lark import Token, Tree

from ..diagnostics import DiagnosticBag, Label
from ..spans import Span
from . import ast
from .precedence import MAX_EXPRESSION_DEPTH, ExpressionTooDeep, OperationGrouper

_LEADING_ZERO = re.compile(r"0[0-9_]*[1-9][0-9_]*")
_CONSTANT_RULES = {"const_none": None, "const_true": True, "const_false": False}


class ExprBuilderMixin:
    """The ``_expr_<rule>`` handlers of :class:`~sparsile.frontend.syntax.builder.AstBuilder`."""

    # provided by AstBuilder
    bag: DiagnosticBag
    _depth: int

    if TYPE_CHECKING:
        def _span(self, item: Tree | Token) -> Span: ...
        def _check_name(self, token: Token) -> None: ...

    def _expr(self, item: Tree | Token) -> ast.Expr:
        self._depth += 1
        try:
            if self._depth > MAX_EXPRESSION_DEPTH:
                raise ExpressionTooDeep
            if isinstance(item, Token):
                raise AssertionError(f"bare token {item.type} where an expression tree was expected")
            return getattr(self, f"_expr_{item.data}", self._expr_operator)(item)
        finally:
            self._depth -= 1

    def _expr_at(self, item: Tree | Token, depth: int) -> ast.Expr:
        """:meth:`_expr` for an operand found ``depth`` levels deep by the precedence grouper."""
        saved, self._depth = self._depth, depth
        try:
            return self._expr(item)
        finally:
            self._depth = saved

    def _expr_operator(self, tree: Tree) -> ast.Expr:
        kind = tree.data
        if kind == "operation":
            grouper = OperationGrouper(tree, self._expr_at, self._span, self.bag, self._depth)
            return grouper.group()
        if kind in _CONSTANT_RULES:
            return ast.Constant(_CONSTANT_RULES[kind], span=self._span(tree))
        raise AssertionError(f"no AST rule for parse-tree node {kind!r}")

    def _expr_ifexp(self, tree: Tree) -> ast.Expr:
        body, test, orelse = (self._expr(c) for c in tree.children)
        return ast.IfExp(test, body, orelse, span=self._span(tree))

    def _expr_tuple_items(self, tree: Tree) -> ast.Expr:
        return ast.Tuple([self._expr(c) for c in tree.children if c is not None], span=self._span(tree))

    _expr_target_tuple = _expr_tuple_items

    def _expr_empty_tuple(self, tree: Tree) -> ast.Expr:
        return ast.Tuple([], span=self._span(tree))

    def _expr_paren(self, tree: Tree) -> ast.Expr:
        inner = self._expr(tree.children[0])
        if isinstance(inner, ast.Tuple):
            return ast.Tuple(inner.elts, span=self._span(tree))
        return inner

    def _expr_list_display(self, tree: Tree) -> ast.Expr:
        return ast.List([self._expr(c) for c in tree.children if c is not None], span=self._span(tree))

    def _expr_name(self, tree: Tree) -> ast.Expr:
        token = tree.children[0]
        self._check_name(token)
        return ast.Name(str(token), span=self._span(tree))

    def _expr_number(self, tree: Tree) -> ast.Expr:
        token = tree.children[0]
        text = str(token)
        span = self._span(tree)
        if _LEADING_ZERO.fullmatch(text):
            self.bag.error("SP0116", "leading zeros in decimal integer literals are not permitted", span,
                           help="use an `0o` prefix for an octal integer")
            return ast.Constant(0, span=span)
        lowered = text.lower()
        if not lowered.startswith(("0x", "0o", "0b")) and any(c in lowered for c in ".e"):
            return ast.Constant(float(text), span=span)
        try:
            return ast.Constant(int(text, 0), span=span)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            self.bag.error("SP0116", "integer literal is too large", span)
            return ast.Constant(0, span=span)

    def _expr_string(self, tree: Tree) -> ast.Expr:
        parts = []
        for token in tree.children:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    value = pyast.literal_eval(str(token))
            except (SyntaxError, ValueError) as err:
                reason = (getattr(err, "msg", None) or str(err)).rsplit(": ", 1)[-1]
                self.bag.error("SP0117", f"invalid string literal: {reason}", self._span(token))
                value = ""
            parts.append(value)
        return ast.Constant("".join(parts), span=self._span(tree))

    def _expr_attribute(self, tree: Tree) -> ast.Expr:
        value_tree, name = tree.children
        return ast.Attribute(self._expr(value_tree), str(name), self._span(name), span=self._span(tree))

    def _expr_subscript(self, tree: Tree) -> ast.Expr:
        value_tree, subscripts = tree.children
        value = self._expr(value_tree)
        indices = [self._expr(c) for c in subscripts.children if c is not None]
        if len(subscripts.children) == 1 and len(indices) == 1 and isinstance(indices[0], ast.Tuple):
            indices = list(indices[0].elts)
        return ast.Subscript(value, indices, span=self._span(tree))

    def _expr_slice(self, tree: Tree) -> ast.Expr:
        parts = [self._expr(c) if c is not None else None for c in tree.children]
        lower, upper = parts[0], parts[1]
        step = parts[2] if len(parts) == 3 else None
        return ast.Slice(lower, upper, step, span=self._span(tree))

    def _expr_call(self, tree: Tree) -> ast.Expr:
        func_tree, arguments = tree.children
        func = self._expr(func_tree)
        args: list[ast.Expr] = []
        keywords: list[ast.Keyword] = []
        seen: dict[str, Span] = {}
        unpacked_keywords = False
        for item in arguments.children if arguments is not None else []:
            kind = item.data if isinstance(item, Tree) else ""
            span = self._span(item)
            if kind == "keyword_arg":
                name_token, value_tree = item.children
                name = str(name_token)
                if name in seen:
                    self.bag.error("SP0119", f"keyword argument repeated: `{name}`", self._span(name_token),
                                   labels=[Label(seen[name], "first given here")])
                seen.setdefault(name, self._span(name_token))
                keywords.append(ast.Keyword(name, self._expr(value_tree), span=span))
            elif kind == "double_star_arg":
                unpacked_keywords = True
                keywords.append(ast.Keyword(None, self._expr(item.children[0]), span=span))
            elif kind == "star_arg":
                if unpacked_keywords:
                    self.bag.error("SP0119", "iterable argument unpacking follows keyword argument unpacking", span)
                args.append(ast.Starred(self._expr(item.children[0]), span=span))
            else:
                if unpacked_keywords:
                    self.bag.error("SP0119", "positional argument follows keyword argument unpacking", span)
                elif keywords:
                    self.bag.error("SP0119", "positional argument follows keyword argument", span,
                                   help="pass positional arguments before keyword arguments")
                args.append(self._expr(item))
        return ast.Call(func, args, keywords, span=self._span(tree))
