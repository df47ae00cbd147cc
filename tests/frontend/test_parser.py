"""Valid programs: AST shape and spans.

Three kinds of evidence that the parser is right, none of them taken from the parser itself:

* every program of ``corpus/valid`` is also parsed by CPython (the language is a Python subset) and
  CPython's tree, translated node by node into our AST classes, must give the same ``dump`` --
  spans included (CPython's 0-based columns + 1);
* hand-written golden dumps for the constructs whose shape matters most (precedence, slices,
  chained comparisons, decorators);
* decorator mode checked against the real positions of a method in this very file.
"""

from __future__ import annotations

import ast as pyast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparsile.frontend.syntax import ast
from sparsile.frontend.syntax.ast import dump, walk
from sparsile.frontend.syntax.parser import parse_expression, parse_function_source, parse_module, time_parse
from sparsile.grammar import build_parser, cache_path, get_parser
from sparsile.tests.frontend.cpython_oracle import cpython_module

CORPUS = Path(__file__).parent / "corpus" / "valid"
CORPUS_FILES = sorted(CORPUS.glob("*.spk"))

def _statements_dump(module: ast.Module) -> list[str]:
    return [dump(s, spans=True) for s in module.body]


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_matches_cpython_including_spans(path: Path):
    text = path.read_text()
    ours = parse_module(text, path.name)
    expected = cpython_module(text, path.name)
    assert ours.docstring == expected.docstring
    assert len(ours.body) == len(expected.body)
    for mine, theirs in zip(_statements_dump(ours), _statements_dump(expected)):
        assert mine == theirs


def test_corpus_covers_every_node_kind():
    seen = set()
    for path in CORPUS_FILES:
        seen |= {type(n).__name__ for n in walk(parse_module(path.read_text()))}
    node_kinds = {name for name, obj in vars(ast).items()
                  if isinstance(obj, type) and issubclass(obj, ast.Node) and obj not in (ast.Node, ast.Expr, ast.Stmt)}
    assert node_kinds <= seen, node_kinds - seen


def test_attribute_spans_match_the_attribute_name():
    module = parse_module("x = a.bcd.e\n")
    attrs = [n for n in walk(module) if isinstance(n, ast.Attribute)]
    assert [(n.attr, n.attr_span.col, n.attr_span.end_col) for n in attrs] == [("e", 11, 12), ("bcd", 7, 10)]


# ---------------------------------------------------------------- hand-written goldens


def _expr(text: str) -> str:
    return dump(parse_expression(text), width=1000)


@pytest.mark.parametrize(("text", "expected"), [
    ("-x**2", "UnaryOp(op='-', operand=BinOp(op='**', left=Name(id='x'), right=Constant(value=2)))"),
    ("2**-1", "BinOp(op='**', left=Constant(value=2), right=UnaryOp(op='-', operand=Constant(value=1)))"),
    ("a**b**c", "BinOp(op='**', left=Name(id='a'), right=BinOp(op='**', left=Name(id='b'), right=Name(id='c')))"),
    ("a ** -b ** c", "BinOp(op='**', left=Name(id='a'), right=UnaryOp(op='-', operand=BinOp(op='**', "
                     "left=Name(id='b'), right=Name(id='c'))))"),
    ("-a * b", "BinOp(op='*', left=UnaryOp(op='-', operand=Name(id='a')), right=Name(id='b'))"),
    ("not not a", "UnaryOp(op='not', operand=UnaryOp(op='not', operand=Name(id='a')))"),
    ("not a and b", "BoolOp(op='and', values=[UnaryOp(op='not', operand=Name(id='a')), Name(id='b')])"),
    ("a and not b < c", "BoolOp(op='and', values=[Name(id='a'), UnaryOp(op='not', operand=Compare(left=Name(id='b'), "
                        "ops=['<'], comparators=[Name(id='c')]))])"),
    ("a < b | c", "Compare(left=Name(id='a'), ops=['<'], comparators=[BinOp(op='|', left=Name(id='b'), "
                  "right=Name(id='c'))])"),
    ("x is not\\\n None", "Compare(left=Name(id='x'), ops=['is not'], comparators=[Constant(value=None)])"),
    ("a - b - c", "BinOp(op='-', left=BinOp(op='-', left=Name(id='a'), right=Name(id='b')), right=Name(id='c'))"),
    ("a + b * c", "BinOp(op='+', left=Name(id='a'), right=BinOp(op='*', left=Name(id='b'), right=Name(id='c')))"),
    ("a | b & c", "BinOp(op='|', left=Name(id='a'), right=BinOp(op='&', left=Name(id='b'), right=Name(id='c')))"),
    ("a << b + c", "BinOp(op='<<', left=Name(id='a'), right=BinOp(op='+', left=Name(id='b'), right=Name(id='c')))"),
    ("a ^ b | c", "BinOp(op='|', left=BinOp(op='^', left=Name(id='a'), right=Name(id='b')), right=Name(id='c'))"),
    ("a @ b // c", "BinOp(op='//', left=BinOp(op='@', left=Name(id='a'), right=Name(id='b')), right=Name(id='c'))"),
    ("not a == b", "UnaryOp(op='not', operand=Compare(left=Name(id='a'), ops=['=='], comparators=[Name(id='b')]))"),
    ("0 <= i < n", "Compare(left=Constant(value=0), ops=['<=', '<'], comparators=[Name(id='i'), Name(id='n')])"),
    ("x not in y", "Compare(left=Name(id='x'), ops=['not in'], comparators=[Name(id='y')])"),
    ("x is not None", "Compare(left=Name(id='x'), ops=['is not'], comparators=[Constant(value=None)])"),
    ("a or b and c", "BoolOp(op='or', values=[Name(id='a'), BoolOp(op='and', values=[Name(id='b'), Name(id='c')])])"),
    ("a if c else b", "IfExp(test=Name(id='c'), body=Name(id='a'), orelse=Name(id='b'))"),
    ("a[:, None]", "Subscript(value=Name(id='a'), indices=[Slice(), Constant(value=None)])"),
    ("a[::2]", "Subscript(value=Name(id='a'), indices=[Slice(step=Constant(value=2))])"),
    ("a[1:2]", "Subscript(value=Name(id='a'), indices=[Slice(lower=Constant(value=1), upper=Constant(value=2))])"),
    ("a[i, j]", "Subscript(value=Name(id='a'), indices=[Name(id='i'), Name(id='j')])"),
    ("a[(1, 2)]", "Subscript(value=Name(id='a'), indices=[Constant(value=1), Constant(value=2)])"),
    ("f(*a, k=1, **kw)", "Call(func=Name(id='f'), args=[Starred(value=Name(id='a'))], keywords=["
                         "Keyword(name='k', value=Constant(value=1)), Keyword(name=None, value=Name(id='kw'))])"),
    ("sp.ptr[sp.f16]", "Subscript(value=Attribute(value=Name(id='sp'), attr='ptr'), "
                       "indices=[Attribute(value=Name(id='sp'), attr='f16')])"),
    ("0x_ff + 0o17 + 0b101 + 1_000", None),
    ("(1,)", "Tuple(elts=[Constant(value=1)])"),
    ("()", "Tuple(elts=[])"),
    ("[]", "List(elts=[])"),
    ("'a' \"b\" '''c'''", "Constant(value='abc')"),
    ("1e-3", "Constant(value=0.001)"),
    ("True, False, None", "Tuple(elts=[Constant(value=True), Constant(value=False), Constant(value=None)])"),
])
def test_expression_goldens(text: str, expected: str | None):
    if expected is None:  # integer literal forms: compare with Python's own evaluation
        folded = parse_expression(text)
        leaves = [n.value for n in walk(folded) if isinstance(n, ast.Constant)]
        assert leaves == [0xFF, 0o17, 0b101, 1000]
        return
    assert _expr(text) == expected


def test_statement_golden():
    text = textwrap.dedent('''\
        @sparsile.jit(num_warps=4)
        def f(x: ptr[f32], n: i32 = 1, *, BLOCK: constexpr) -> None:
            """Doc."""
            a, b = b, a
            for i in static_range(4):
                if i == 0:
                    continue
                elif i > n:
                    break
            return
        ''')
    expected = textwrap.dedent('''\
        FunctionDef(
          name='f',
          params=[
            Param(name='x', annotation=Subscript(value=Name(id='ptr'), indices=[Name(id='f32')]), kind='positional'),
            Param(name='n', annotation=Name(id='i32'), default=Constant(value=1), kind='positional'),
            Param(name='BLOCK', annotation=Name(id='constexpr'), kind='keyword_only'),
          ],
          body=[
            Assign(targets=[Tuple(elts=[Name(id='a'), Name(id='b')])], value=Tuple(elts=[Name(id='b'), Name(id='a')])),
            For(
              target=Name(id='i'),
              iter=Call(func=Name(id='static_range'), args=[Constant(value=4)]),
              body=[
                If(
                  test=Compare(left=Name(id='i'), ops=['=='], comparators=[Constant(value=0)]),
                  body=[Continue()],
                  orelse=[If(test=Compare(left=Name(id='i'), ops=['>'], comparators=[Name(id='n')]), body=[Break()])],
                ),
              ],
            ),
            Return(),
          ],
          decorators=[
            Call(
              func=Attribute(value=Name(id='sparsile'), attr='jit'),
              keywords=[Keyword(name='num_warps', value=Constant(value=4))],
            ),
          ],
          returns=Constant(value=None),
          docstring='Doc.',
        )''')
    (function,) = parse_module(text).body
    assert dump(function, width=120) == expected


def test_selected_spans():
    text = "def f(a):\n    if a:\n        x = g(a, k=1)\n    return x\n"
    (function,) = parse_module(text).body
    assert isinstance(function, ast.FunctionDef)
    assert (function.span.line, function.span.col, function.span.end_line, function.span.end_col) == (1, 1, 4, 13)
    assert (function.name_span.col, function.name_span.end_col) == (5, 6)
    if_stmt = function.body[0]
    assert (if_stmt.span.line, if_stmt.span.col, if_stmt.span.end_line, if_stmt.span.end_col) == (2, 5, 3, 22)
    call = if_stmt.body[0].value
    assert isinstance(call, ast.Call)
    assert (call.span.line, call.span.col, call.span.end_col) == (3, 13, 22)
    assert (call.keywords[0].span.col, call.keywords[0].span.end_col) == (18, 21)


def test_module_records_imports_and_docstring():
    module = parse_module('"""Kernels."""\nimport a.b as c, d\nfrom ..x.y import (p, q as r,)\n')
    assert module.docstring == "Kernels."
    imp, imp_from = module.body
    assert isinstance(imp, ast.Import) and imp.names == [("a.b", "c"), ("d", None)]
    assert isinstance(imp_from, ast.ImportFrom)
    assert imp_from.module == "..x.y" and imp_from.names == [("p", None), ("q", "r")]


@pytest.mark.parametrize("source", ["from a import (p, q as r,)\n", "from a import (\n    p,\n    q as r,\n)\n",
                                    "from a import (p, q as r)\n", "from a import p, q as r\n"])
def test_import_lists_match_cpython(source: str):
    """A parenthesized import list may end with a `,`; the tree and spans are CPython's."""
    (ours,) = parse_module(source).body
    (theirs,) = cpython_module(source, "<k>").body
    assert ours.names == [("p", None), ("q", "r")]
    assert dump(ours, spans=True) == dump(theirs, spans=True)


def test_empty_and_comment_only_sources():
    assert parse_module("").body == []
    assert parse_module("# nothing\n\n   \n# here").body == []


def test_crlf_and_missing_final_newline():
    module = parse_module("x = 1\r\nif x:\r\n    y = 2")
    assert [type(s).__name__ for s in module.body] == ["Assign", "If"]
    assert module.body[1].body[0].span.line == 3


def test_walk_visits_in_source_order():
    names = [n.id for n in walk(parse_expression("f(a, b)[c] + d")) if isinstance(n, ast.Name)]
    assert names == ["f", "a", "b", "c", "d"]


def test_nodes_are_frozen_and_compared_by_identity():
    a, b = parse_expression("x"), parse_expression("x")
    assert a != b and len({a, b}) == 2
    with pytest.raises(AttributeError):
        a.id = "y"  # type: ignore[misc]


# ---------------------------------------------------------------- decorator mode


class _Holder:
    @staticmethod
    def method_kernel(x, n):  # pragma: no cover - parsed, never run
        """A kernel written as an indented method."""
        total = x + n
        return total


def test_function_source_of_an_indented_method_points_into_this_file():
    lines, first_line = inspect.getsourcelines(_Holder.method_kernel)
    text = "".join(lines)
    function = parse_function_source(text, __file__, first_line)
    assert function.name == "method_kernel"
    assert function.docstring == "A kernel written as an indented method."
    assert [type(d).__name__ for d in function.decorators] == ["Name"]
    real = pyast.parse(Path(__file__).read_text())
    holder = next(n for n in real.body if isinstance(n, pyast.ClassDef) and n.name == "_Holder")
    real_fn = holder.body[0]
    real_return = real_fn.body[-1]
    ret = function.body[-1]
    assert (ret.span.file_line, ret.span.file_col) == (real_return.lineno, real_return.col_offset + 1)
    assert (function.span.file_line, function.span.file_col) == (real_fn.lineno, real_fn.col_offset + 1)
    assert function.span.source.col_offset == 4
    assert str(ret.span) == f"{__file__}:{real_return.lineno}:{real_return.col_offset + 1}"


def test_function_source_drops_python_only_decorators_but_keeps_the_others():
    text = ("    @sparsile.jit(grid=lambda meta: (meta['N'],))\n"
            "    @sp.kernel\n"
            "    def k(x):\n"
            "        return x\n")
    function = parse_function_source(text, "m.py", 40)
    assert dump(function.decorators[0]) == "Attribute(value=Name(id='sp'), attr='kernel')"
    assert len(function.decorators) == 1
    assert function.span.file_line == 42 and function.span.file_col == 5


def test_function_source_with_tabs_and_a_multiline_docstring():
    text = '\tdef k(x):\n\t\t"""Doc\n\t\tmore\n\t\t"""\n\t\treturn x\n'
    function = parse_function_source(text, "t.py", 7)
    assert function.docstring == "Doc\nmore"
    assert function.body[0].span.file_line == 11 and function.body[0].span.file_col == 3


def test_function_source_with_a_string_line_less_indented_than_the_function():
    text = '    def k(x):\n        s = """a\nb"""\n        return s\n'
    function = parse_function_source(text, "t.py", 1)
    assert dump(function.body[0].value) == "Constant(value='a\\nb')"
    assert function.body[1].span.file_line == 4 and function.body[1].span.file_col == 9


# ---------------------------------------------------------------- the parser factory


def test_parser_is_built_once_per_process():
    import sparsile.grammar as grammar

    parse_module("x = 1\n")
    assert get_parser() is get_parser()
    assert grammar.builds == 1


def test_grammar_has_no_lalr_conflicts(caplog):
    import logging

    from lark import logger as lark_logger

    level = lark_logger.level
    lark_logger.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="lark"):
            build_parser(cache=False, debug=True)
    finally:
        lark_logger.setLevel(level)
    conflicts = [r.getMessage() for r in caplog.records if "conflict" in r.getMessage().lower()]
    assert conflicts == []


def test_fresh_process_loads_tables_from_the_disk_cache(tmp_path):
    env = dict(os.environ, SPARSILE_GRAMMAR_CACHE=str(tmp_path))
    code = ("from sparsile.grammar import get_parser, cache_path; get_parser(); print(cache_path())")
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    path = Path(first.stdout.strip())
    assert path.is_file() and path.parent == tmp_path
    stamp = path.stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert second.stdout.strip() == str(path)
    assert path.stat().st_mtime_ns == stamp  # loaded, not rebuilt and rewritten


def test_unwritable_cache_dir_falls_back_to_no_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPARSILE_GRAMMAR_CACHE", str(blocker))
    assert cache_path() is None
    assert build_parser().parse("x = 1\n", start="module") is not None


def test_tables_are_not_in_the_kernel_cache(tmp_path, monkeypatch):
    """Emptying the compile cache of kernels keeps the grammar tables, as it keeps .pyc files."""
    monkeypatch.delenv("SPARSILE_GRAMMAR_CACHE", raising=False)
    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))
    path = cache_path()
    assert path is not None and tmp_path not in path.parents
    assert path.parent.name in ("__pycache__", "grammar")


def test_grammar_cache_off(monkeypatch):
    monkeypatch.setenv("SPARSILE_GRAMMAR_CACHE", "off")
    assert cache_path() is None


def test_time_parse_reports_the_source_size():
    text = (CORPUS / "elementwise.spk").read_text()
    timing = time_parse(text, repeat=2)
    assert timing.lines == text.count("\n") + 1
    assert timing.tokens > 300
    assert 0 < timing.median_parse_s and timing.microseconds_per_line > 0
