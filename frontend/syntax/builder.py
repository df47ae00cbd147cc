"""Lark parse tree -> kernel AST (:mod:`sparsile.frontend.syntax.ast`), with spans and the syntax rules
that the LALR grammar leaves to a later check.

Errors found here are collected in a :class:`DiagnosticBag` (several per source) with codes:

======  ==============================================================================
SP0113  a Python keyword the kernel language lacks, used as a name (``yield``, ...)
SP0114  ``else`` after a ``for``/``while`` loop
SP0115  invalid assignment target (``f() = 1``, ``a + b += 1``)
SP0116  invalid number literal (``012``)
SP0117  invalid string literal (bad ``\\N{...}`` escape)
SP0118  invalid parameter list (``*args``, ``**kw``, ``/``, duplicates, default order)
SP0119  invalid call arguments (positional after keyword, repeated keyword)
SP0121  expression nested too deeply
SP0124  ``not`` after an operator other than ``and``/``or`` (see :mod:`.precedence`)
SP0122  ``return`` outside a function
SP0123  ``break``/``continue`` outside a loop
======  ==============================================================================

The rules and their wording follow CPython's compiler (Python reference, sections 7.2 "Assignment
statements", 8.7 "Function definitions", 6.3.4 "Calls").

Expressions are built by the ``_expr_<rule>`` handlers of :class:`~.expr_builder.ExprBuilderMixin`
(``expr_builder.py``: SP0116, SP0117, SP0119); statements, functions and the checks here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from lark import Token, Tree

from ..diagnostics import DiagnosticBag, Label
from ..spans import SourceFile, Span
from . import ast
from .errors import PYTHON_ONLY_KEYWORDS
from .expr_builder import ExprBuilderMixin
from .precedence import MAX_EXPRESSION_DEPTH, ExpressionTooDeep


class AstBuilder(ExprBuilderMixin):
    """Converts the parse tree of one source. Use :meth:`module` or :meth:`expression` once."""

    def __init__(self, source: SourceFile, bag: DiagnosticBag):
        self.source = source
        self.bag = bag
        self._depth = 0
        self._in_function = 0
        self._in_loop = 0
        self._lines = source.text.split("\n")
        # statement (by id) -> end of its line's trailing ";" when it is the last of a simple_stmt
        self._semicolon_ends: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------ spans

    def _span(self, item: Tree | Token) -> Span:
        if isinstance(item, Token):
            return Span(self.source, item.line, item.column, item.end_line, item.end_column)
        meta = item.meta
        if getattr(meta, "empty", True):
            return Span(self.source, 1, 1, 1, 1)
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    # ------------------------------------------------------------ module level

    def module(self, tree: Tree) -> ast.Module:
        body = self._statements(tree.children)
        docstring, body = _split_docstring(body)
        lines = self.source.text.split("\n")
        while len(lines) > 1 and not lines[-1]:
            lines.pop()
        span = Span(self.source, 1, 1, len(lines), len(lines[-1]) + 1)
        return ast.Module(body, self.source, docstring, span=span)

    def expression(self, tree: Tree) -> ast.Expr | None:
        (child,) = [c for c in tree.children if c is not None]
        try:
            return self._expr(child)
        except ExpressionTooDeep:
            self._too_deep(self._span(tree))
            return None

    def _statements(self, items: list) -> list[ast.Stmt]:
        out: list[ast.Stmt] = []
        for item in items:
            if isinstance(item, Tree):
                out.extend(self._statement(item))
        return out

    def _statement(self, tree: Tree) -> list[ast.Stmt]:
        kind = tree.data
        if kind == "simple_stmt":
            out: list[ast.Stmt] = []
            for child in tree.children:
                if isinstance(child, Tree):
                    out.extend(self._statement(child))
            if out:
                end = self._trailing_semicolon(out[-1].span.end_line, out[-1].span.end_col)
                if end is not None:
                    self._semicolon_ends[id(out[-1])] = end
            return out
        try:
            handler: Callable[[Tree], ast.Stmt] = getattr(self, f"_stmt_{kind}")
            return [handler(tree)]
        except ExpressionTooDeep:
            self._too_deep(self._span(tree))
            return []

    def _too_deep(self, span: Span) -> None:
        self.bag.error("SP0121", f"expression is nested too deeply (more than {MAX_EXPRESSION_DEPTH} levels)",
                       span, help="split it into several statements")

    def _suite(self, tree: Tree) -> list[ast.Stmt]:
        return self._statements(tree.children)

    # ------------------------------------------------------------ simple statements

    def _stmt_expression_stmt(self, tree: Tree) -> ast.Stmt:
        value = self._expr(tree.children[0])
        return ast.ExprStmt(value, span=self._span(tree))

    def _stmt_assign_stmt(self, tree: Tree) -> ast.Stmt:
        exprs = [self._expr(c) for c in tree.children]
        for target in exprs[:-1]:
            self._check_target(target, allow_tuple=True)
        return ast.Assign(exprs[:-1], exprs[-1], span=self._span(tree))

    def _stmt_annassign_stmt(self, tree: Tree) -> ast.Stmt:
        target_tree, annotation_tree, value_tree = tree.children
        target = self._expr(target_tree)
        if isinstance(target, ast.Tuple | ast.List):
            self.bag.error("SP0115", "only a single name, attribute or subscript can be annotated",
                           target.span)
        else:
            self._check_target(target, allow_tuple=False)
        annotation = self._expr(annotation_tree)
        value = self._expr(value_tree) if value_tree is not None else None
        return ast.AnnAssign(target, annotation, value, span=self._span(tree))

    def _stmt_augassign_stmt(self, tree: Tree) -> ast.Stmt:
        target_tree, op_token, value_tree = tree.children
        target = self._expr(target_tree)
        if isinstance(target, ast.Tuple | ast.List):
            self.bag.error("SP0115", f"`{op_token}` needs a single target, not a tuple or list", target.span)
        else:
            self._check_target(target, allow_tuple=False)
        value = self._expr(value_tree)
        return ast.AugAssign(target, str(op_token)[:-1], value, span=self._span(tree))

    def _stmt_pass_stmt(self, tree: Tree) -> ast.Stmt:
        return ast.Pass(span=self._span(tree))

    def _stmt_break_stmt(self, tree: Tree) -> ast.Stmt:
        span = self._span(tree)
        if not self._in_loop:
            self.bag.error("SP0123", "`break` outside a loop", span)
        return ast.Break(span=span)

    def _stmt_continue_stmt(self, tree: Tree) -> ast.Stmt:
        span = self._span(tree)
        if not self._in_loop:
            self.bag.error("SP0123", "`continue` outside a loop", span)
        return ast.Continue(span=span)

    def _stmt_return_stmt(self, tree: Tree) -> ast.Stmt:
        span = self._span(tree)
        if not self._in_function:
            self.bag.error("SP0122", "`return` outside a function", span)
        (value_tree,) = tree.children
        value = self._expr(value_tree) if value_tree is not None else None
        return ast.Return(value, span=span)

    def _stmt_assert_stmt(self, tree: Tree) -> ast.Stmt:
        test_tree, msg_tree = tree.children
        msg = self._expr(msg_tree) if msg_tree is not None else None
        return ast.Assert(self._expr(test_tree), msg, span=self._span(tree))

    def _stmt_import_stmt(self, tree: Tree) -> ast.Stmt:
        names = []
        for item in tree.children:
            dotted, alias = item.children
            names.append((_dotted(dotted), str(alias) if alias is not None else None))
        return ast.Import(names, span=self._span(tree))

    def _stmt_import_from(self, tree: Tree) -> ast.Stmt:
        module_tree, targets = tree.children
        module = "".join("." if isinstance(c, Token) else _dotted(c) for c in module_tree.children)
        (what,) = targets.children
        if isinstance(what, Token):
            names: list[tuple[str, str | None]] = [("*", None)]
        else:
            names = []
            for item in what.children:
                name, alias = item.children
                names.append((str(name), str(alias) if alias is not None else None))
        return ast.ImportFrom(module, names, span=self._span(tree))

    # ------------------------------------------------------------ compound statements

    def _trailing_semicolon(self, line: int, col: int) -> tuple[int, int] | None:
        """The end just past the optional ``;`` that closes a simple statement's line, if there is
        one after (line, col). CPython ends a compound statement's span there (its block ends with
        the last token before NEWLINE), so ours does too."""
        while line <= len(self._lines):
            text = self._lines[line - 1]
            i = col - 1
            while i < len(text) and text[i] in " \t\f":
                i += 1
            if i < len(text) and text[i] == ";":
                return line, i + 2
            if text[i:] == "\\":  # explicit line joining: the ";" may be on the next line
                line, col = line + 1, 1
                continue
            return None
        return None

    def _block_span(self, tree: Tree, body: list[ast.Stmt], last: ast.Stmt | None = None) -> Span:
        """From the start of ``tree`` to the end of its last statement (``last``, else the body's),
        that statement's line-closing ``;`` included."""
        start = self._span(tree)
        last = last or (body[-1] if body else None)
        if last is None:
            return start
        end = self._semicolon_ends.get(id(last), (last.span.end_line, last.span.end_col))
        return Span(self.source, start.line, start.col, *end)

    def _stmt_if_stmt(self, tree: Tree) -> ast.Stmt:
        test_tree, suite, *clauses = tree.children
        else_clause = clauses.pop()
        test = self._expr(test_tree)
        body = self._suite(suite)
        orelse = self._suite(else_clause.children[1]) if else_clause is not None else []
        for clause in reversed(clauses):
            elif_test = self._expr(clause.children[0])
            elif_body = self._suite(clause.children[1])
            last = orelse[-1] if orelse else None
            orelse = [ast.If(elif_test, elif_body, orelse, span=self._block_span(clause, elif_body, last))]
        last = orelse[-1] if orelse else None
        return ast.If(test, body, orelse, span=self._block_span(tree, body, last))

    def _loop_body(self, suite: Tree) -> list[ast.Stmt]:
        self._in_loop += 1
        try:
            return self._suite(suite)
        finally:
            self._in_loop -= 1

    def _reject_loop_else(self, else_clause: Tree | None, loop: str) -> None:
        if else_clause is None:
            return
        keyword = else_clause.children[0]
        self.bag.error("SP0114", f"`else` after `{loop}` is not supported in kernels", self._span(keyword),
                       help="put the `else` body after the loop: kernels have no `break`, so it runs there exactly "
                            "when it would have run")

    def _stmt_while_stmt(self, tree: Tree) -> ast.Stmt:
        test_tree, suite, else_clause = tree.children
        test = self._expr(test_tree)
        body = self._loop_body(suite)
        self._reject_loop_else(else_clause, "while")
        return ast.While(test, body, span=self._block_span(tree, body))

    def _stmt_for_stmt(self, tree: Tree) -> ast.Stmt:
        target_tree, iter_tree, suite, else_clause = tree.children
        target = self._expr(target_tree)
        self._check_target(target, allow_tuple=True)
        iterable = self._expr(iter_tree)
        body = self._loop_body(suite)
        self._reject_loop_else(else_clause, "for")
        return ast.For(target, iterable, body, span=self._block_span(tree, body))

    def _stmt_decorated(self, tree: Tree) -> ast.Stmt:
        *decorator_trees, funcdef = tree.children
        decorators = [self._expr(d.children[0]) for d in decorator_trees]
        return self._function(funcdef, decorators)

    def _stmt_funcdef(self, tree: Tree) -> ast.Stmt:
        return self._function(tree, [])

    def _function(self, tree: Tree, decorators: list[ast.Expr]) -> ast.FunctionDef:
        name_token, params_tree, returns_tree, suite = tree.children
        self._check_name(name_token)
        params = self._parameters(params_tree)
        returns = self._expr(returns_tree) if returns_tree is not None else None
        saved_loop = self._in_loop
        self._in_function += 1
        self._in_loop = 0
        try:
            body = self._suite(suite)
        finally:
            self._in_function -= 1
            self._in_loop = saved_loop
        docstring, body = _split_docstring(body)
        span = self._block_span(tree, body)
        if not body:  # a function whose body is only a docstring
            span = Span(self.source, span.line, span.col, *self._end_of(suite))
        return ast.FunctionDef(str(name_token), params, body, decorators, returns, docstring,
                               self._span(name_token), span=span)

    def _end_of(self, suite: Tree) -> tuple[int, int]:
        """The end of the last statement in a suite whose statements were all removed."""
        node = suite
        while isinstance(node, Tree):
            trees = [c for c in node.children if isinstance(c, Tree)]
            if node.data == "simple_stmt" or not trees:
                break
            node = trees[-1]
        trees = [c for c in node.children if isinstance(c, Tree)]
        last = trees[-1] if trees else node
        span = self._span(last)
        return self._trailing_semicolon(span.end_line, span.end_col) or (span.end_line, span.end_col)

    def _parameters(self, tree: Tree | None) -> list[ast.Param]:
        if tree is None:
            return []
        params: list[ast.Param] = []
        seen: dict[str, Span] = {}
        keyword_only = False
        bare_star: Span | None = None
        seen_default = False
        for item in tree.children:
            span = self._span(item)
            kind = item.data
            if kind == "slash_param":
                self.bag.error("SP0118", "positional-only parameters (`/`) are not supported in kernels", span,
                               help="remove the `/`")
                continue
            if kind in ("bare_star_param", "star_param"):
                if keyword_only:
                    self.bag.error("SP0118", "only one `*` is allowed in a parameter list", span)
                keyword_only = True
                if kind == "star_param":
                    self.bag.error("SP0118", f"variadic parameter `*{item.children[0]}` is not supported in kernels",
                                   span, help="list the parameters one by one")
                else:
                    bare_star = span
                continue
            if kind == "double_star_param":
                self.bag.error("SP0118", f"variadic keyword parameter `**{item.children[0]}` is not supported "
                               "in kernels", span, help="list the parameters one by one")
                continue
            name_token, annotation_tree, default_tree = item.children
            name = str(name_token)
            self._check_name(name_token)
            if name in seen:
                self.bag.error("SP0118", f"duplicate parameter `{name}`", self._span(name_token),
                               labels=[Label(seen[name], "first declared here")])
                continue
            seen[name] = self._span(name_token)
            annotation = self._expr(annotation_tree) if annotation_tree is not None else None
            default = self._expr(default_tree) if default_tree is not None else None
            if not keyword_only:
                if default is not None:
                    seen_default = True
                elif seen_default:
                    self.bag.error("SP0118", f"parameter `{name}` without a default follows a parameter with a "
                                   "default", span, help=f"give `{name}` a default or move it before them")
            else:
                bare_star = None
            name_span = self._span(name_token)
            params.append(ast.Param(name, annotation, default, "keyword_only" if keyword_only else "positional",
                                    span=name_span.to(annotation.span) if annotation is not None else name_span))
        if bare_star is not None:
            self.bag.error("SP0118", "named parameters must follow a bare `*`", bare_star)
        return params

    # ------------------------------------------------------------ checks

    def _check_name(self, token: Token) -> None:
        message = PYTHON_ONLY_KEYWORDS.get(str(token))
        if message is not None:
            self.bag.error("SP0113", message, self._span(token))

    def _check_target(self, target: ast.Expr, *, allow_tuple: bool) -> None:
        if isinstance(target, ast.Name | ast.Attribute | ast.Subscript):
            return
        if allow_tuple and isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._check_target(element, allow_tuple=True)
            return
        self.bag.error("SP0115", f"cannot assign to {_describe(target)}", target.span)


def _dotted(tree: Tree) -> str:
    return ".".join(str(t) for t in tree.children)


def _split_docstring(body: list[ast.Stmt]) -> tuple[str | None, list[ast.Stmt]]:
    if body and isinstance(body[0], ast.ExprStmt):
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return inspect.cleandoc(value.value), body[1:]
    return None, body


def _describe(expr: ast.Expr) -> str:
    """How CPython names an expression that cannot be assigned to."""
    if isinstance(expr, ast.Call):
        return "a function call"
    if isinstance(expr, ast.Constant):
        if expr.value is None or isinstance(expr.value, bool):
            return f"`{expr.value}`"
        return "a literal"
    if isinstance(expr, ast.Compare):
        return "a comparison"
    if isinstance(expr, ast.IfExp):
        return "a conditional expression"
    if isinstance(expr, ast.Starred):
        return "a starred expression"
    if isinstance(expr, ast.Tuple | ast.List):
        return "a tuple" if isinstance(expr, ast.Tuple) else "a list"
    return "an expression"


__all__ = ["AstBuilder"]
