"""Malformed programs: every one must raise CompileError with the right code, words and position.

Each row is ``(id, source, code, message, line, column)``; the message is the exact first
diagnostic's text and ``line:column`` the start of its span (1-based). The messages follow CPython's
wording where CPython has one.
"""

from __future__ import annotations

import pytest

from sparsile.frontend.diagnostics import CompileError, InternalError
from sparsile.frontend.syntax import parser as parser_module
from sparsile.frontend.syntax.parser import parse_expression, parse_function_source, parse_module

CASES = [
    ("invalid_dollar", 'x = $\n', "SP0101", 'invalid character `$`', 1, 5),
    ("invalid_question", 'x = a ? b : c\n', "SP0101", 'invalid character `?`', 1, 7),
    ("invalid_backtick", 'x = `a`\n', "SP0101", "invalid character '`' (backtick)", 1, 5),
    ("invalid_unicode_arrow", 'def f() → i32:\n    pass\n',
     "SP0101", 'invalid character `→` (U+2192)', 1, 9),
    ("invalid_nbsp", 'x = 1\xa0+ 2\n', "SP0101", 'invalid non-printable character U+00A0', 1, 6),
    ("smart_quote", 's = “hello”\n', "SP0101", 'invalid character `“` (U+201C)', 1, 5),
    ("bang", 'if !x:\n    pass\n', "SP0101", 'invalid character `!`', 1, 4),
    ("backslash_not_at_end", 'x = 1 \\ + 2\n',
     "SP0101", 'unexpected character after line continuation character `\\`', 1, 7),
    # a last line that is only `\` (found by test_parser_fuzz: the grammar ignores `\` + newline)
    ("backslash_last_line", 'x = 1\n\\', "SP0110",
     'unexpected end of input after the line continuation character `\\`', 2, 1),
    ("backslash_last_line_indented", 'def f():\n    x = 1\n    \\\n', "SP0110",
     'unexpected end of input after the line continuation character `\\`', 3, 5),
    ("unterminated_string", "msg = 'oops\n", "SP0102", 'unterminated string', 1, 7),
    ("unterminated_double", 'assert x, "bad\n', "SP0102", 'unterminated string', 1, 11),
    ("unterminated_triple", 'def f():\n    """doc\n    return 1\n',
     "SP0102", 'unterminated triple-quoted string', 2, 5),
    ("dict_literal", "d = {'a': 1}\n",
     "SP0113", 'dict and set literals (`{...}`) are not supported in kernels', 1, 5),
    ("unexpected_indent", 'x = 1\n    y = 2\n', "SP0103", 'unexpected indentation', 2, 5),
    ("indented_first_line", '  x = 1\n', "SP0103", 'unexpected indentation', 1, 3),
    ("missing_block", 'def f():\nreturn 1\n',
     "SP0104", 'expected an indented block after the function definition on line 1', 2, 1),
    ("missing_block_if", 'def f(x):\n    if x:\n    return 1\n',
     "SP0104", 'expected an indented block after the `if` statement on line 2', 3, 5),
    ("missing_block_at_eof", 'for i in range(3):\n',
     "SP0104", 'expected an indented block after the `for` statement on line 1', 1, 19),
    ("bad_dedent", 'def f():\n        x = 1\n    y = 2\n',
     "SP0106", 'unindent does not match any outer indentation level', 3, 5),
    ("tabs_after_spaces", 'def f():\n        x = 1\n\ty = 2\n',
     "SP0105", 'inconsistent use of tabs and spaces in indentation', 3, 1),
    ("spaces_after_tab", 'def f():\n\tx = 1\n        y = 2\n',
     "SP0105", 'inconsistent use of tabs and spaces in indentation', 3, 1),
    ("unmatched_paren", 'x = f(1))\n', "SP0108", 'unmatched `)`', 1, 9),
    ("unmatched_bracket", 'x = ]\n', "SP0108", 'unmatched `]`', 1, 5),
    ("mismatched", 'x = [1, 2)\n', "SP0107", 'closing `)` does not match opening `[`', 1, 10),
    ("never_closed_eof", 'x = f(1,\n', "SP0109", '`(` was never closed', 1, 6),
    ("never_closed_next_line", 'def f():\n    x = (1 + 2\n    y = 3\n',
     "SP0109", '`(` was never closed', 2, 9),
    ("missing_colon_if", 'if x > 0\n    pass\n',
     "SP0112", 'expected `:` after the `if` condition, found end of line', 1, 9),
    ("missing_colon_def", 'def f(x)\n    pass\n',
     "SP0112", 'expected `:` after the function signature, found end of line', 1, 9),
    ("missing_colon_while", 'while x\n    pass\n',
     "SP0112", 'expected `:` after the `while` condition, found end of line', 1, 8),
    ("missing_colon_for", 'for i in range(3)\n    pass\n',
     "SP0112", 'expected `:` after the `for` loop header, found end of line', 1, 18),
    ("missing_colon_else", 'if x:\n    pass\nelse\n    pass\n',
     "SP0112", 'expected `:` after `else`, found end of line', 3, 5),
    ("missing_colon_elif", 'if x:\n    pass\nelif y\n    pass\n',
     "SP0112", 'expected `:` after the `elif` condition, found end of line', 3, 7),
    ("assign_in_condition", 'if x = 1:\n    pass\n',
     "SP0112", 'expected `:` after the `if` condition, found `=`', 1, 6),
    ("for_missing_in", 'for i range(3):\n    pass\n',
     "SP0112", 'expected `in` after the `for` loop target, found `range`', 1, 7),
    ("expected_expression_rpar", 'x = f(, 1)\n',
     "SP0111", 'expected an expression, `)`, `**` or `*`, found `,`', 1, 7),
    ("expected_expression_close", 'x = ()\ny = (,)\n',
     "SP0111", 'expected an expression or `)`, found `,`', 2, 6),
    ("expected_expression_eol", 'x = \n', "SP0111", 'expected an expression, found end of line', 1, 4),
    ("expected_expression_after_op", 'y = a * \n',
     "SP0111", 'expected an expression, found end of line', 1, 8),
    ("two_expressions", 'x = a b\n',
     "SP0110", 'expected an operator, `,`, `=`, end of line, ..., found `b`', 1, 7),
    ("missing_comma_in_call", 'f(a b)\n',
     "SP0110", 'expected `)`, an operator, `,` or `=`, found `b`', 1, 5),
    ("ternary_without_else", 'x = a if b\n', "SP0110", 'expected `else`, found end of line', 1, 11),
    ("else_without_if", 'else:\n    pass\n',
     "SP0110", '`else` does not follow an `if` block at the same indentation', 1, 1),
    ("elif_without_if", 'x = 1\nelif x:\n    pass\n',
     "SP0110", '`elif` does not follow an `if` block at the same indentation', 2, 1),
    ("for_else", 'for i in range(3):\n    pass\nelse:\n    pass\n',
     "SP0114", '`else` after `for` is not supported in kernels', 3, 1),
    ("while_else", 'while x:\n    x -= 1\nelse:\n    pass\n',
     "SP0114", '`else` after `while` is not supported in kernels', 3, 1),
    ("lambda", 'f = lambda x: x + 1\n',
     "SP0113", '`lambda` expressions are not supported in kernels', 1, 5),
    ("with_stmt", 'with lock:\n    pass\n',
     "SP0113", '`with` statements are not supported in kernels', 1, 1),
    ("class_def", 'class K:\n    pass\n',
     "SP0113", '`class` definitions are not supported in kernels', 1, 1),
    ("try_stmt", 'try:\n    x = 1\nexcept E:\n    pass\n',
     "SP0113", 'exception handling (`try`) is not supported in kernels', 1, 1),
    ("raise_stmt", "raise ValueError('no')\n", "SP0113", '`raise` is not supported in kernels', 1, 1),
    ("yield_expr", 'def g():\n    yield 1\n',
     "SP0113", 'generators (`yield`) are not supported in kernels', 2, 5),
    ("global_stmt", 'def g():\n    global X\n',
     "SP0113", '`global` declarations are not supported in kernels', 2, 5),
    ("del_stmt", 'del x\n', "SP0113", '`del` is not supported in kernels', 1, 1),
    ("async_def", 'async def f():\n    pass\n',
     "SP0113", '`async` functions are not supported in kernels', 1, 1),
    ("fstring", "msg = f'value {x}'\n", "SP0113", 'f-strings are not supported in kernels', 1, 7),
    ("bytes", "b = b'abc'\n", "SP0113", 'byte strings are not supported in kernels', 1, 5),
    ("walrus", 'if (n := 10) > 5:\n    pass\n',
     "SP0113", 'the `:=` operator is not supported in kernels', 1, 7),
    # docs/language.md says comprehensions are reported as such (they were a generic SP0110 at `for`)
    ("list_comprehension", 'v = [i * 2 for i in range(4)]\n',
     "SP0113", 'comprehensions and generator expressions are not supported in kernels', 1, 12),
    ("generator_in_call", 'v = sum(i for i in range(4))\n',
     "SP0113", 'comprehensions and generator expressions are not supported in kernels', 1, 11),
    ("generator_in_parens", 'v = (i\n     for i in t)\n',
     "SP0113", 'comprehensions and generator expressions are not supported in kernels', 2, 6),
    ("assign_to_call", 'f() = 1\n', "SP0115", 'cannot assign to a function call', 1, 1),
    ("assign_to_literal", '1 = x\n', "SP0115", 'cannot assign to a literal', 1, 1),
    ("assign_to_expression", 'a + b = c\n', "SP0115", 'cannot assign to an expression', 1, 1),
    ("assign_to_none", 'None = 1\n', "SP0115", 'cannot assign to `None`', 1, 1),
    ("augassign_tuple", 'a, b += 1\n',
     "SP0115", '`+=` needs a single name, attribute or subscript on its left', 1, 6),
    ("augassign_call", 'f() += 1\n', "SP0115", 'cannot assign to a function call', 1, 1),
    ("annotate_tuple", 'a, b: i32 = 1, 2\n', "SP0110", 'expected `=`, end of line or `;`, found `:`', 1, 5),
    ("leading_zero", 'x = 007\n',
     "SP0116", 'leading zeros in decimal integer literals are not permitted', 1, 5),
    ("huge_int", "x = " + "9" * 5000 + "\n", "SP0116", "integer literal is too large", 1, 5),
    ("bad_escape", "s = '\\N{NOT A REAL NAME}'\n",
     "SP0117", 'invalid string literal: unknown Unicode character name', 1, 5),
    ("star_args_param", 'def f(*args):\n    pass\n',
     "SP0118", 'variadic parameter `*args` is not supported in kernels', 1, 7),
    ("kwargs_param", 'def f(a, **kw):\n    pass\n',
     "SP0118", 'variadic keyword parameter `**kw` is not supported in kernels', 1, 10),
    ("slash_param", 'def f(a, /, b):\n    pass\n',
     "SP0118", 'positional-only parameters (`/`) are not supported in kernels', 1, 10),
    ("duplicate_param", 'def f(a, b, a):\n    pass\n', "SP0118", 'duplicate parameter `a`', 1, 13),
    ("default_order", 'def f(a=1, b):\n    pass\n',
     "SP0118", 'parameter `b` without a default follows a parameter with a default', 1, 12),
    ("bare_star_alone", 'def f(a, *):\n    pass\n',
     "SP0118", 'named parameters must follow a bare `*`', 1, 10),
    ("positional_after_keyword", 'f(a=1, 2)\n',
     "SP0119", 'positional argument follows keyword argument', 1, 8),
    ("repeated_keyword", 'f(a=1, a=2)\n', "SP0119", 'keyword argument repeated: `a`', 1, 8),
    ("positional_after_kwunpack", 'f(**kw, x)\n',
     "SP0119", 'positional argument follows keyword argument unpacking', 1, 9),
    ("return_outside", 'return 1\n', "SP0122", '`return` outside a function', 1, 1),
    ("break_outside", 'if x:\n    break\n', "SP0123", '`break` outside a loop', 2, 5),
    ("continue_in_nested_def", 'for i in x:\n    def g():\n        continue\n',
     "SP0123", '`continue` outside a loop', 3, 9),
    ("keyword_as_name", 'x = yield\n', "SP0113", 'generators (`yield`) are not supported in kernels', 1, 5),
    ("missing_params_parens", 'def f:\n    pass\n', "SP0110", 'expected `(`, found `:`', 1, 6),
    ("decorator_then_eof", '@kernel\n', "SP0110", 'expected `@` or `def`, found end of input', 1, 8),
    ("decorator_then_statement", '@kernel\nx = 1\n', "SP0110", 'expected `@` or `def`, found `x`', 2, 1),
    ("import_nothing", 'import\n', "SP0110", 'expected a name, found end of line', 1, 7),
    ("from_import_nothing", 'from a import\n',
     "SP0110", 'expected a name, `(` or `*`, found end of line', 1, 14),
    # CPython accepts a trailing `,` in an import list only inside parentheses (found by test_parser_fuzz)
    ("from_import_trailing_comma", 'from a import b, c as d,\n',
     "SP0110", 'trailing comma not allowed without surrounding parentheses', 1, 25),
    ("from_import_trailing_comma_next_line", 'from a import b,\nx = 1\n',
     "SP0110", 'trailing comma not allowed without surrounding parentheses', 1, 17),
    ("from_import_trailing_comma_eof", 'from a import b,',
     "SP0110", 'trailing comma not allowed without surrounding parentheses', 1, 17),
    ("from_import_trailing_comma_semicolon", 'from a import b,; x = 1\n',
     "SP0110", 'expected a name, found `;`', 1, 17),
    ("from_import_double_comma", 'from a import (b,,)\n', "SP0110", 'expected a name or `)`, found `,`', 1, 18),
    ("import_trailing_comma", 'import a,\n', "SP0110", 'expected a name, found end of line', 1, 10),
    ("semicolon_empty", 'x = 1;; y = 2\n',
     "SP0110", 'expected a statement or end of line, found `;`', 1, 7),
    ("keyword_name_def", 'def (x):\n    pass\n', "SP0110", 'expected a name, found `(`', 1, 5),
    ("dot_number", 'x = a.1\n',
     "SP0110", 'expected an operator, `,`, `=`, end of line, ..., found `.1`', 1, 6),
    ("not_after_comparison", "x = a == not b\n", "SP0124", "`not` cannot follow an operator other than `and`/`or`",
     1, 10),
    ("not_after_minus", "x = -not b\n", "SP0124", "`not` cannot follow an operator other than `and`/`or`", 1, 6),
    ("deep_brackets", "x = " + "(" * 101 + "1" + ")" * 101 + "\n", "SP0121",
     "brackets are nested too deeply (more than 100 levels)", 1, 105),
    ("deep_unary", "x = " + "-" * 250 + "1\n",
     "SP0121", "expression is nested too deeply (more than 200 levels)", 1, 1),
]

HELP_EXPECTED = {
    "backslash_last_line": "a `\\` continues a line onto the next one: remove it from the last line",
    "assign_in_condition": "to compare two values use `==`",
    "missing_block": "indent the body of the block (write `pass` for an empty one)",
    "raise_stmt": 'use `assert condition, "message"` to check a condition',
    "bang": "use `not` for logical negation and `!=` for inequality",
    "from_import_trailing_comma": "put the imported names in parentheses, or remove the trailing `,`",
    # (it said the body then "also runs after a `break`", which kernels do not have: SP0203)
    "for_else": ("put the `else` body after the loop: kernels have no `break`, so it runs there exactly when it "
                 "would have run"),
    "list_comprehension": ("loop over `static_range(...)` (unrolled at compile time), or write the elements "
                           "out in a tuple"),
}


def _first_error(source: str) -> CompileError:
    with pytest.raises(CompileError) as info:
        parse_module(source, "k.spk")
    return info.value


def test_corpus_is_large_enough_and_ids_are_unique():
    ids = [case[0] for case in CASES]
    assert len(ids) >= 40
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(("source", "code", "message", "line", "col"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_malformed_program(source: str, code: str, message: str, line: int, col: int):
    err = _first_error(source)
    first = err.diagnostics[0]
    assert (first.code, first.message, first.span.line, first.span.col) == (code, message, line, col)
    assert first.span.source.name == "k.spk"
    rendered = err.render()
    assert rendered.startswith(f"error[{code}]: {message}")
    assert f"--> k.spk:{line}:{col}" in rendered


@pytest.mark.parametrize(("case_id", "help_text"), sorted(HELP_EXPECTED.items()))
def test_help_lines(case_id: str, help_text: str):
    (source,) = [c[1] for c in CASES if c[0] == case_id]
    assert _first_error(source).diagnostics[0].help == help_text


def test_caret_underlines_the_offending_token():
    rendered = _first_error("x = f(a b)\n").render()
    assert "1 | x = f(a b)\n  |         ^\n" in rendered
    rendered = _first_error("f() = 3\n").render()
    assert rendered.endswith("1 | f() = 3\n  | ^^^")


def test_mismatched_bracket_labels_the_opener():
    (diag,) = _first_error("x = [1,\n     2)\n").diagnostics
    assert diag.code == "SP0107"
    assert [(lab.span.line, lab.span.col, lab.message) for lab in diag.labels] == [(1, 5, "`[` opened here")]


def test_unclosed_bracket_points_at_the_opener_and_where_parsing_stopped():
    diag = _first_error("x = (1 +\ny = 2\n").diagnostics[0]
    assert (diag.code, diag.span.line, diag.span.col) == ("SP0109", 1, 5)
    assert [(lab.span.line, lab.span.col, lab.message) for lab in diag.labels] == [(2, 3, "the parser stopped here")]


def test_errors_in_several_functions_are_reported_together():
    source = (
        "def a():\n"
        "    x = (1 +\n"
        "\n"
        "@kernel\n"
        "def b():\n"
        "    if x\n"
        "        pass\n"
        "\n"
        "def c():\n"
        "    return 1\n"
        "\n"
        "def d():\n"
        "    for i in x:\n"
        "        pass\n"
        "    else:\n"
        "        pass\n"
        "    y = $\n"
    )
    err = _first_error(source)
    assert [(d.code, d.span.line) for d in err.diagnostics] == [("SP0109", 2), ("SP0112", 6), ("SP0101", 17)]
    assert err.render().endswith("error: aborting due to 3 previous errors")


def test_ast_level_errors_are_all_collected():
    source = "def f(a=1, b, a):\n    f() = 1\n    g(x=1, x=2)\n    return 1\nbreak\n"
    err = _first_error(source)
    assert err.codes == ["SP0118", "SP0118", "SP0115", "SP0119", "SP0123"]
    assert [d.span.col for d in err.diagnostics[:2]] == [12, 15]


def test_errors_in_decorator_mode_point_into_the_real_file():
    text = "    @kernel\n    def k(x):\n        y = x +\n"
    with pytest.raises(CompileError) as info:
        parse_function_source(text, "model.py", 120)
    (diag,) = info.value.diagnostics
    assert (diag.code, diag.span.file_line, diag.span.file_col) == ("SP0111", 122, 16)
    assert "--> model.py:122:16" in info.value.render()
    assert "122 |         y = x +" in info.value.render()


def test_decorator_mode_requires_exactly_one_function():
    for text in ("x = 1\n", "def a():\n    pass\ndef b():\n    pass\n", "", "# only a comment\n"):
        with pytest.raises(CompileError) as info:
            parse_function_source(text, "m.py", 1)
        assert info.value.codes == ["SP0120"]


def test_decorator_mode_body_errors_are_not_hidden_by_python_only_decorators():
    text = "@jit(grid=lambda m: 1)\ndef k(x):\n    with x:\n        pass\n"
    with pytest.raises(CompileError) as info:
        parse_function_source(text, "m.py", 1)
    assert [(d.code, d.span.line) for d in info.value.diagnostics] == [("SP0113", 3)]


def test_parse_expression_errors():
    with pytest.raises(CompileError) as info:
        parse_expression("a +")
    assert info.value.codes == ["SP0111"]
    with pytest.raises(CompileError):
        parse_expression("x = 1")


def test_a_crash_inside_the_ast_builder_is_an_internal_error(monkeypatch):
    def broken(self, tree):
        raise KeyError("boom")

    monkeypatch.setattr(parser_module.AstBuilder, "module", broken)
    with pytest.raises(InternalError, match="internal compiler error"):
        parse_module("x = 1\n")


def test_a_crash_inside_the_error_mapper_is_an_internal_error(monkeypatch):
    def broken(*args, **kwargs):
        raise AttributeError("boom")

    monkeypatch.setattr(parser_module.SyntaxErrorMapper, "unexpected_token", broken)
    with pytest.raises(InternalError, match="AttributeError: boom"):
        parse_module("x = = 1\n")
