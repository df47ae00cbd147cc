"""The parser's front door: kernel source text -> :mod:`sparsile.frontend.syntax.ast` with spans.

* :func:`parse_module` parses a ``.spk`` file.
* :func:`parse_function_source` parses the source of one decorated Python function
  (``inspect.getsource``), which may be indented (a method, a nested function); it is dedented
  and the removed indentation and the function's first line are kept in the
  :class:`~sparsile.frontend.spans.SourceFile` (``col_offset``, ``line_offset``) so that every
  span points into the real file. Decorators that use Python-only syntax (Python has already
  evaluated them) are dropped rather than reported.
* :func:`parse_expression` parses one expression.

Syntax errors raise :class:`~sparsile.frontend.diagnostics.CompileError` with SP01xx
diagnostics (see :mod:`.syntax_errors` and :mod:`.ast_builder`). After the first syntax error the
parser resumes at the next top-level ``def``/decorator/import line, so one run reports one error
per broken function (at most :data:`MAX_ERRORS`). Lark exceptions never escape: anything
unexpected becomes an :class:`~sparsile.frontend.diagnostics.InternalError`.
"""

from __future__ import annotations

import ast as pyast
import contextlib
import dataclasses
import functools
import gc
import re
import time
import warnings
from collections.abc import Iterator

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedToken

from ...grammar import CLOSE_BRACKETS, OPEN_BRACKETS, LayoutProblem, get_parser
from ..diagnostics import CompileError, Diagnostic, DiagnosticBag, InternalError, Label
from ..dump import dump
from ..spans import SourceFile, Span
from . import ast
from .builder import AstBuilder
from .errors import HEADER_KEYWORDS, ParseContext, SyntaxErrorMapper

MAX_ERRORS = 10
_LAYOUT_TOKENS = frozenset({"_NEWLINE", "_INDENT", "_DEDENT"})
_RESUME_LINE = re.compile(r"(?:@|def\b|import\b|from\b)")


# ---------------------------------------------------------------- public API


def parse_module(text: str, filename: str = "<string>") -> ast.Module:
    """Parse a whole ``.spk`` source into a :class:`~sparsile.frontend.syntax.ast.Module`."""
    source = SourceFile(filename, _normalize_newlines(text))
    with _collector_paused():
        return _parse_module_source(source)


def parse_function_source(text: str, filename: str, first_line: int) -> ast.FunctionDef:
    """Parse the source of one (possibly decorated, possibly indented) Python function.

    ``first_line`` is the 1-based line of ``text``'s first line in ``filename``.
    """
    dedented, col_offset = _dedent(_normalize_newlines(text))
    source = SourceFile(filename, dedented, line_offset=first_line - 1, col_offset=col_offset)
    with _collector_paused():
        try:
            module = _parse_module_source(source)
        except CompileError as err:
            function = _parse_without_python_decorators(source, err)
            if function is None:
                raise
            return function
    return _single_function(module)


def parse_expression(text: str, filename: str = "<string>") -> ast.Expr:
    """Parse a single expression (an annotation, a decorator, a constant's value)."""
    source = SourceFile(filename, _normalize_newlines(text))
    with _collector_paused():
        tree, diagnostics = _parse_tree(source.text, source, "expression_input")
    bag = DiagnosticBag(list(diagnostics))
    expr = None
    if tree is not None:
        expr = _guarded(lambda: AstBuilder(source, bag).expression(tree), source)
    bag.raise_if_errors()
    assert expr is not None
    return expr


@dataclasses.dataclass(frozen=True)
class ParseTiming:
    """What :func:`time_parse` measured: the source size, the first parse in this process (which
    includes building or loading the grammar if nothing parsed before), and the median of later
    parses."""

    lines: int
    tokens: int
    grammar_ready_s: float
    first_parse_s: float
    median_parse_s: float

    @property
    def microseconds_per_line(self) -> float:
        return self.median_parse_s * 1e6 / max(self.lines, 1)


def time_parse(text: str, repeat: int = 20) -> ParseTiming:
    """Measure :func:`parse_module` on a valid ``text`` (a helper for benchmarks; the compiler does
    not use it)."""
    start = time.perf_counter()
    parser = get_parser()
    _start_sets()
    ready = time.perf_counter() - start
    start = time.perf_counter()
    parse_module(text)
    first = time.perf_counter() - start
    samples = []
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        parse_module(text)
        samples.append(time.perf_counter() - start)
    tokens = sum(1 for _ in parser.lex(_normalize_newlines(text) + "\n"))
    import statistics  # here, not at the top: a fresh process's first compile never needs it

    return ParseTiming(text.count("\n") + 1, tokens, ready, first, statistics.median(samples))


# ---------------------------------------------------------------- pipeline


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing allocates many long-lived objects (tokens, trees, nodes) at once; pausing the cyclic
    garbage collector meanwhile keeps the time linear in the size of large sources."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _parse_module_source(source: SourceFile, text: str | None = None) -> ast.Module:
    """Parse ``text`` (by default ``source.text``; a variant with some lines blanked keeps every
    position) and build the module, raising all diagnostics found."""
    text = source.text if text is None else text
    tree, diagnostics = _parse_tree(text, source, "module")
    bag = DiagnosticBag(list(diagnostics))
    module = None
    if tree is not None:
        dump("parse", source.name, tree.pretty)
        module = _guarded(lambda: AstBuilder(source, bag).module(tree), source)
    else:
        _collect_later_errors(text, source, bag)
    bag.raise_if_errors()
    assert module is not None
    dump("build", source.name, lambda: ast.dump(module))
    return module


def _collect_later_errors(text: str, source: SourceFile, bag: DiagnosticBag) -> None:
    """After a syntax error, parse again from each later top-level definition so that errors in
    other functions are reported in the same run."""
    lines = text.split("\n")
    decorator_lines = {number for number, line in enumerate(lines, 1) if line.startswith("@")}
    # A definition starts at its first decorator: skip lines that follow a decorator line.
    starts = [number for number, line in enumerate(lines, 1)
              if _RESUME_LINE.match(line) and number - 1 not in decorator_lines]
    last_line = max(d.span.line for d in bag)
    while len(bag) < MAX_ERRORS:
        resume = next((s for s in starts if s > last_line), None)
        if resume is None:
            return
        padded = "\n" * (resume - 1) + "\n".join(lines[resume - 1:])
        tree, diagnostics = _parse_tree(padded, source, "module")
        if tree is not None:
            later = DiagnosticBag()
            _guarded(lambda tree=tree, later=later: AstBuilder(source, later).module(tree), source)
            bag.extend(d for d in later if d.span.line >= resume)
            return
        for diag in diagnostics:
            if all((d.code, d.span) != (diag.code, diag.span) for d in bag):
                bag.add(diag)
        last_line = max(last_line + 1, max(d.span.line for d in diagnostics))


def _guarded(build, source: SourceFile):
    """Run an AST-building step; a crash inside it is a compiler bug, not a user error."""
    try:
        return build()
    except CompileError:
        raise
    except RecursionError as err:
        raise CompileError([Diagnostic("SP0121", "the source is nested too deeply to compile",
                                       Span(source, 1, 1, 1, 2))]) from err
    except Exception as err:
        raise InternalError(f"building the AST failed: {type(err).__name__}: {err}") from err


@functools.cache
def _start_sets() -> tuple[frozenset[str], frozenset[str]]:
    """The terminals that can begin an expression and a statement, read off the parser tables."""
    parser = get_parser()
    expression = parser.parse_interactive(start="expression_input").accepts() - {"_NEWLINE"}
    statement = parser.parse_interactive(start="module").accepts() - {"_NEWLINE", "$END"}
    return frozenset(expression), frozenset(statement)


def _parse_tree(text: str, source: SourceFile, start: str) -> tuple[Tree | None, list[Diagnostic]]:
    """Run the LALR parser over ``text`` and return the parse tree, or ``None`` and the first
    syntax error in words. A failure of the parser itself is an :class:`InternalError`."""
    try:
        return _run_parser(text, source, start)
    except InternalError:
        raise
    except Exception as err:
        raise InternalError(f"the parser failed unexpectedly: {type(err).__name__}: {err}") from err


def _run_parser(text: str, source: SourceFile, start: str) -> tuple[Tree | None, list[Diagnostic]]:
    parser = get_parser()
    if not text.endswith("\n"):
        text += "\n"
    mapper = SyntaxErrorMapper(parser, source, *_start_sets(), text)
    null = mapper.null_byte()
    if null is not None:
        return None, [null]
    feed = _TokenFeed()
    interactive = parser.parse_interactive(text, start=start)
    try:
        for token in interactive.iter_parse():
            feed.see(token)
        tree = interactive.feed_eof(feed.current)
        eof = mapper.continuation_at_eof()  # (only where the parse succeeded: other errors come first)
        return (tree, []) if eof is None else (None, [eof])
    except UnexpectedToken as err:
        context = feed.context(err.token)
        diagnostic = mapper.unexpected_token(err, context, _accepts(interactive))
        root = _root_cause(parser, text, mapper, context)
        return None, [root if root is not None else diagnostic]
    except UnexpectedCharacters as err:
        return None, [mapper.unexpected_character(err)]
    except LayoutProblem as problem:
        return None, [mapper.layout_problem(problem)]


def _accepts(interactive) -> set[str]:
    try:
        return set(interactive.accepts())
    except LarkError:
        return set(interactive.choices())


def _root_cause(parser, text: str, mapper: SyntaxErrorMapper, context: ParseContext) -> Diagnostic | None:
    """When the parser stops inside brackets opened on an earlier line, the real mistake is often
    a bracket that is never closed: prefer a bracket error found by lexing the whole text."""
    if not context.open_brackets or context.open_brackets[-1].line == context.token.line:
        return None
    problem = _bracket_problem(parser, text)
    if problem is None:
        return None
    diagnostic = mapper.layout_problem(problem)
    stopped = mapper.offending_span(context.token, context.previous)
    return dataclasses.replace(diagnostic, labels=(*diagnostic.labels, Label(stopped, "the parser stopped here")))


def _bracket_problem(parser, text: str, attempts: int = 20) -> LayoutProblem | None:
    """The first unclosed or mismatched bracket in ``text``, lexing past invalid characters (each is
    blanked out, which keeps every position)."""
    for _ in range(attempts):
        try:
            for _token in parser.lex(text):
                pass
        except LayoutProblem as problem:
            return problem if problem.kind in ("unclosed", "mismatched_close") else None
        except UnexpectedCharacters as err:
            pos = err.pos_in_stream
            text = text[:pos] + " " + text[pos + 1:]
            continue
        except LarkError:
            return None
        return None
    return None


class _TokenFeed:
    """Remembers, as tokens go to the parser, what the error messages need to know."""

    def __init__(self) -> None:
        self.current: Token | None = None
        self.previous: Token | None = None
        self.line_head: Token | None = None
        self.last_header: Token | None = None
        self.brackets: list[Token] = []
        self._line_start = True

    def see(self, token: Token) -> None:
        self.previous, self.current = self.current, token
        kind = token.type
        if kind == "_NEWLINE":
            self._line_start = True
        elif kind not in _LAYOUT_TOKENS and self._line_start:
            self._line_start = False
            self.line_head = token
            if kind in HEADER_KEYWORDS:
                self.last_header = token
        if kind in OPEN_BRACKETS:
            self.brackets.append(token)
        elif kind in CLOSE_BRACKETS and self.brackets:
            self.brackets.pop()

    def context(self, token: Token) -> ParseContext:
        previous = self.previous if token is self.current else self.current
        return ParseContext(token, previous, self.line_head, self.last_header, tuple(self.brackets))


# ---------------------------------------------------------------- decorator mode


def _dedent(text: str) -> tuple[str, int]:
    """Remove the first non-blank line's indentation from every line that has it; blank lines
    become empty. Returns the text and the number of columns removed."""
    lines = text.split("\n")
    first = next((line for line in lines if line.strip()), "")
    prefix = first[: len(first) - len(first.lstrip(" \t"))]
    if not prefix:
        return text, 0
    out = []
    for line in lines:
        if line.startswith(prefix):
            out.append(line[len(prefix):])
        elif not line.strip():
            out.append("")
        else:
            out.append(line)
    return "\n".join(out), len(prefix)


def _single_function(module: ast.Module) -> ast.FunctionDef:
    functions = [s for s in module.body if isinstance(s, ast.FunctionDef)]
    others = [s for s in module.body if not isinstance(s, ast.FunctionDef)]
    if len(functions) == 1 and not others:
        return functions[0]
    if others:
        span = others[0].span
    elif functions:
        span = functions[1].name_span
    else:
        span = module.span
    raise CompileError([Diagnostic("SP0120", "expected the source of exactly one function definition", span,
                                   help="decorate a single `def` function")])


def _parse_without_python_decorators(source: SourceFile, err: CompileError) -> ast.FunctionDef | None:
    """If the only syntax errors lie in the decorators (Python-only syntax such as a ``lambda``
    argument, already evaluated by Python), parse the function without them and keep those
    decorators that the kernel grammar does accept. Otherwise return ``None``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = pyast.parse(source.text)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], pyast.FunctionDef):
        return None
    python_function = tree.body[0]
    decorators = python_function.decorator_list
    if not decorators or all(d.span.line >= python_function.lineno for d in err.diagnostics):
        return None
    lines = source.text.split("\n")
    blanked = [""] * (python_function.lineno - 1) + lines[python_function.lineno - 1:]
    function = _single_function(_parse_module_source(source, "\n".join(blanked)))
    kept: list[ast.Expr] = []
    for decorator in decorators:
        own_lines = lines[decorator.lineno - 1: decorator.end_lineno]
        text = "\n" * (decorator.lineno - 1) + "\n".join([*own_lines, "def _decorated():", "    pass", ""])
        try:
            parsed = _single_function(_parse_module_source(source, text))
        except CompileError:
            continue
        kept.extend(parsed.decorators)
    return dataclasses.replace(function, decorators=kept)


__all__ = ["MAX_ERRORS", "ParseTiming", "parse_expression", "parse_function_source", "parse_module", "time_parse"]
