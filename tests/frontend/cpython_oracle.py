"""An independent oracle for the parser: CPython's own parse of the same source, translated node
by node into sparsile AST classes with CPython's positions (0-based columns + 1).

The kernel language is a subset of Python's syntax, so any program the kernel parser accepts must
also be accepted by CPython and give the same tree and spans.
"""

from __future__ import annotations

import ast as pyast
import inspect
import re
import warnings

from sparsile.frontend.spans import SourceFile, Span
from sparsile.frontend.syntax import ast

_BINOPS = {pyast.Add: "+", pyast.Sub: "-", pyast.Mult: "*", pyast.Div: "/", pyast.FloorDiv: "//",
           pyast.Mod: "%", pyast.Pow: "**", pyast.LShift: "<<", pyast.RShift: ">>", pyast.BitAnd: "&",
           pyast.BitOr: "|", pyast.BitXor: "^", pyast.MatMult: "@"}
_UNARY = {pyast.USub: "-", pyast.UAdd: "+", pyast.Invert: "~", pyast.Not: "not"}
_CMP = {pyast.Lt: "<", pyast.LtE: "<=", pyast.Gt: ">", pyast.GtE: ">=", pyast.Eq: "==", pyast.NotEq: "!=",
        pyast.In: "in", pyast.NotIn: "not in", pyast.Is: "is", pyast.IsNot: "is not"}


class CPythonOracle:
    """Translate a CPython AST into sparsile AST nodes with CPython's positions."""

    def __init__(self, source: SourceFile):
        self.source = source
        self.lines = source.text.replace("\r\n", "\n").replace("\r", "\n").split("\n")

    def col(self, line: int, byte_offset: int) -> int:
        """CPython counts UTF-8 bytes from 0; sparsile counts characters from 1."""
        return len(self.lines[line - 1].encode()[:byte_offset].decode("utf-8", errors="ignore")) + 1

    def span(self, node: pyast.AST) -> Span:
        return Span(self.source, node.lineno, self.col(node.lineno, node.col_offset),
                    node.end_lineno, self.col(node.end_lineno, node.end_col_offset))

    def body(self, stmts: list[pyast.stmt]) -> tuple[str | None, list[ast.Stmt]]:
        docstring = None
        if stmts and isinstance(stmts[0], pyast.Expr) and isinstance(stmts[0].value, pyast.Constant) \
                and isinstance(stmts[0].value.value, str):
            docstring = inspect.cleandoc(stmts[0].value.value)
            stmts = stmts[1:]
        return docstring, [self.stmt(s) for s in stmts]

    def stmt(self, n: pyast.stmt) -> ast.Stmt:
        sp = self.span(n)
        e = self.expr
        match n:
            case pyast.Assign():
                return ast.Assign([e(t) for t in n.targets], e(n.value), span=sp)
            case pyast.AnnAssign():
                return ast.AnnAssign(e(n.target), e(n.annotation), e(n.value) if n.value else None, span=sp)
            case pyast.AugAssign():
                return ast.AugAssign(e(n.target), _BINOPS[type(n.op)], e(n.value), span=sp)
            case pyast.Expr():
                return ast.ExprStmt(e(n.value), span=sp)
            case pyast.For():
                assert not n.orelse
                return ast.For(e(n.target), e(n.iter), [self.stmt(s) for s in n.body], span=sp)
            case pyast.While():
                return ast.While(e(n.test), [self.stmt(s) for s in n.body], span=sp)
            case pyast.If():
                return ast.If(e(n.test), [self.stmt(s) for s in n.body], [self.stmt(s) for s in n.orelse], span=sp)
            case pyast.Return():
                return ast.Return(e(n.value) if n.value else None, span=sp)
            case pyast.Pass():
                return ast.Pass(span=sp)
            case pyast.Break():
                return ast.Break(span=sp)
            case pyast.Continue():
                return ast.Continue(span=sp)
            case pyast.Assert():
                return ast.Assert(e(n.test), e(n.msg) if n.msg else None, span=sp)
            case pyast.Import():
                return ast.Import([(a.name, a.asname) for a in n.names], span=sp)
            case pyast.ImportFrom():
                module = "." * n.level + (n.module or "")
                return ast.ImportFrom(module, [(a.name, a.asname) for a in n.names], span=sp)
            case pyast.FunctionDef():
                args = n.args
                assert not args.posonlyargs and args.vararg is None and args.kwarg is None
                defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
                params = [self.param(a, d, "positional") for a, d in zip(args.args, defaults)]
                params += [self.param(a, d, "keyword_only") for a, d in zip(args.kwonlyargs, args.kw_defaults)]
                docstring, body = self.body(n.body)
                name_span = self.name_after_def(n.name, sp)
                return ast.FunctionDef(n.name, params, body, [e(d) for d in n.decorator_list],
                                       e(n.returns) if n.returns else None, docstring, name_span, span=sp)
        raise AssertionError(f"oracle lacks {type(n).__name__}")

    def name_after_def(self, name: str, def_span: Span) -> Span:
        """CPython does not record where a function's name is: find it after the `def` keyword (it
        may be on a later line after a backslash)."""
        line, col = def_span.line, def_span.col + 3
        while True:
            match = re.compile(rf"\b{re.escape(name)}\b").search(self.lines[line - 1], col - 1)
            if match is not None:
                return Span(self.source, line, match.start() + 1, line, match.end() + 1)
            line, col = line + 1, 1

    def param(self, a: pyast.arg, default, kind) -> ast.Param:
        return ast.Param(a.arg, self.expr(a.annotation) if a.annotation else None,
                         self.expr(default) if default is not None else None, kind, span=self.span(a))

    def expr(self, n: pyast.expr) -> ast.Expr:
        sp = self.span(n)
        e = self.expr
        match n:
            case pyast.Name():
                return ast.Name(n.id, span=sp)
            case pyast.Constant():
                return ast.Constant(n.value, span=sp)
            case pyast.Tuple():
                return ast.Tuple([e(x) for x in n.elts], span=sp)
            case pyast.List():
                return ast.List([e(x) for x in n.elts], span=sp)
            case pyast.Attribute():
                end = self.span(n)
                attr_span = Span(self.source, end.end_line, end.end_col - len(n.attr), end.end_line, end.end_col)
                return ast.Attribute(e(n.value), n.attr, attr_span, span=sp)
            case pyast.Subscript():
                index = n.slice
                indices = [e(x) for x in index.elts] if isinstance(index, pyast.Tuple) else [e(index)]
                return ast.Subscript(e(n.value), indices, span=sp)
            case pyast.Slice():
                return ast.Slice(*(e(x) if x is not None else None for x in (n.lower, n.upper, n.step)), span=sp)
            case pyast.Starred():
                return ast.Starred(e(n.value), span=sp)
            case pyast.Call():
                keywords = [ast.Keyword(k.arg, e(k.value), span=self.span(k)) for k in n.keywords]
                return ast.Call(e(n.func), [e(a) for a in n.args], keywords, span=sp)
            case pyast.BinOp():
                return ast.BinOp(_BINOPS[type(n.op)], e(n.left), e(n.right), span=sp)
            case pyast.UnaryOp():
                return ast.UnaryOp(_UNARY[type(n.op)], e(n.operand), span=sp)
            case pyast.BoolOp():
                return ast.BoolOp("and" if isinstance(n.op, pyast.And) else "or", [e(v) for v in n.values], span=sp)
            case pyast.Compare():
                return ast.Compare(e(n.left), [_CMP[type(o)] for o in n.ops], [e(c) for c in n.comparators],
                                   span=sp)
            case pyast.IfExp():
                return ast.IfExp(e(n.test), e(n.body), e(n.orelse), span=sp)
        raise AssertionError(f"oracle lacks {type(n).__name__}")


def cpython_module(text: str, name: str) -> ast.Module:
    """CPython's parse of ``text`` as a sparsile Module (raises SyntaxError if CPython rejects it;
    the Module's own span is a placeholder, CPython has none)."""
    source = SourceFile(name, text)
    oracle = CPythonOracle(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = pyast.parse(text)
    docstring, body = oracle.body(tree.body)
    return ast.Module(body, source, docstring, span=Span(source, 1, 1, 1, 1))
