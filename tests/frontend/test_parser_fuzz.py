"""Fuzzing the parser: whatever the input, the only exception is CompileError (never a Lark
exception, never an internal crash), and every diagnostic is a well-formed SP01xx one.

Inputs are valid programs mutated token by token (delete, duplicate, swap, replace, insert a
random character), soups of the language's own tokens, decorated functions at random indentation,
and arbitrary text.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.syntax import ast
from sparsile.frontend.syntax.parser import parse_expression, parse_function_source, parse_module
from sparsile.tests.frontend.cpython_oracle import cpython_module

CORPUS = Path(__file__).parent / "corpus" / "valid"
_TOKEN = re.compile(r"\n|[ \t]+|\w+|'''|\"\"\"|\"[^\"\n]*\"|'[^'\n]*'|\*\*=?|//=?|<<=?|>>=?|[-+*/%@&|^<>!=:]=|\S")


def _chunks() -> list[str]:
    """The corpus cut into top-level definitions: small seeds keep each example fast."""
    seeds = []
    for path in sorted(CORPUS.glob("*.spk")):
        text = path.read_text()
        seeds.extend(part + "\n" for part in re.split(r"\n\s*\n(?=[@\w#])", text) if part.strip())
    return seeds


SEEDS = _chunks()
SEED_TOKENS = [_TOKEN.findall(seed) for seed in SEEDS]
VOCABULARY = sorted({tok for toks in SEED_TOKENS for tok in toks} | {
    "def", "if", "elif", "else", "for", "in", "while", "return", "pass", "break", "continue", "assert", "import",
    "from", "as", "not", "and", "or", "is", "None", "True", "False", "lambda", "with", "class", "yield", "\\\n",
    "\t", "    ", "\n", "(", ")", "[", "]", "{", "}", ":", ",", ";", ".", "=", "->", "**", "*", "'", '"', '"""',
    "#", "@", "$", "?", "!", "`", "0x", "1e", "0b2", "012", "1_", "\u00a0", "\u201c", "\u2192", "é", "\x00",
})
ODD_CHARACTERS = st.sampled_from([*"()[]{}:;,.=+-*/\\'\"#@$!?`~^&|<>%\t\n ", "\u00a0", "é", "\u2028", "\x0c"])

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(source: str) -> None:
    try:
        module = parse_module(source, "fuzz.spk")
    except CompileError as err:
        _check_error(err, source)
    else:
        assert isinstance(module, ast.Module)
        for node in ast.walk(module):
            assert node.span.line >= 1


def _check_error(err: CompileError, source: str) -> None:
    assert err.diagnostics
    line_count = len(source.replace("\r\n", "\n").replace("\r", "\n").split("\n")) + 1
    for diag in err.diagnostics:
        assert re.fullmatch(r"SP01\d\d", diag.code), diag.code
        assert diag.message and "Token(" not in diag.message and "__ANON" not in diag.message
        assert 1 <= diag.span.line <= line_count, (diag, source)
        assert diag.span.col >= 1
    assert str(err)  # renders without error


@st.composite
def mutated_programs(draw) -> str:
    tokens = list(draw(st.sampled_from(SEED_TOKENS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert_char", "insert_token"]))
        i = draw(st.integers(0, max(len(tokens) - 1, 0)))
        if kind == "delete" and tokens:
            del tokens[i]
        elif kind == "duplicate" and tokens:
            tokens.insert(i, tokens[i])
        elif kind == "swap" and len(tokens) > 1:
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == "replace" and tokens:
            tokens[i] = draw(st.sampled_from(VOCABULARY))
        elif kind == "insert_char":
            tokens.insert(i, draw(ODD_CHARACTERS))
        else:
            tokens.insert(i, draw(st.sampled_from(VOCABULARY)))
    return "".join(tokens)


@FUZZ
@given(mutated_programs())
def test_mutated_programs_raise_only_compile_errors(source: str):
    _check(source)


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60).map(" ".join))
def test_token_soups_raise_only_compile_errors(source: str):
    _check(source)


@FUZZ
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60).map("".join))
def test_glued_token_soups_raise_only_compile_errors(source: str):
    _check(source)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_compile_errors(source: str):
    _check(source)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_expressions_raise_only_compile_errors(source: str):
    try:
        parse_expression(source)
    except CompileError as err:
        _check_error(err, source)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_programs(), st.sampled_from(["", "    ", "\t", "        "]), st.integers(1, 5000),
       st.sampled_from(["", "@jit\n", "@sp.jit(grid=lambda m: (1,))\n", "@x[\n"]))
def test_function_sources_raise_only_compile_errors(body: str, indent: str, first_line: int, decorator: str):
    source = "".join(indent + line for line in (decorator + body).splitlines(keepends=True))
    try:
        function = parse_function_source(source, "fuzz.py", first_line)
    except CompileError as err:
        for diag in err.diagnostics:
            assert re.fullmatch(r"SP01\d\d", diag.code)
            assert diag.span.file_line >= first_line or diag.span.line == 0
        assert str(err)
    else:
        assert isinstance(function, ast.FunctionDef)
        assert function.span.file_line >= first_line


@FUZZ
@given(mutated_programs())
# Mutants that random draws found and the derandomized CI profile never draws (one `delete` of the
# right token of the right seed is too rare for 150 fixed examples): they stay here as explicit cases.
@example("from sparsile.lang import ptr, f32, i32 as I32, \n")  # bare import list ending in `,`
@example("from sparsile.lang import (ptr, f32, i32 as I32, )\n")
def test_accepted_mutants_are_valid_python_with_the_same_tree_and_spans(source: str):
    """The kernel language is a subset of Python: whatever the kernel parser accepts, CPython must
    accept too, and CPython's tree must be the same, spans included."""
    try:
        ours = parse_module(source, "fuzz.spk")
    except CompileError:
        return
    theirs = cpython_module(source, "fuzz.spk")
    assert ours.docstring == theirs.docstring
    assert [ast.dump(s, spans=True) for s in ours.body] == [ast.dump(s, spans=True) for s in theirs.body]


def test_seeds_themselves_parse():
    for seed in SEEDS:
        parse_module(seed)
