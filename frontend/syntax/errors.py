"""Syntax-error diagnostics (SP01xx): Lark's lexer/parser failures and the indentation post-lexer's
problems, rewritten in words with the exact span of the offending token.

Codes owned here (``docs/diagnostics.md`` lists them with triggering programs):

======  ==============================================================================
SP0101  invalid character (``$``, ``?``, a stray ``\\``, non-ASCII punctuation)
SP0102  unterminated string
SP0103  unexpected indentation
SP0104  expected an indented block
SP0105  inconsistent use of tabs and spaces in indentation
SP0106  unindent does not match any outer indentation level
SP0107  closing bracket does not match the opening one
SP0108  unmatched closing bracket
SP0109  bracket never closed
SP0110  unexpected token (generic: "expected ..., found ...")
SP0111  expected an expression
SP0112  expected ``:`` (or ``in``) in a block header
SP0113  Python syntax that kernels do not support (``lambda``, ``with``, dicts, f-strings, comprehensions, ...)
SP0121  nesting too deep
======  ==============================================================================

SP0114-SP0123 for errors found while building the AST live in ``frontend/syntax/builder.py`` (and
``expr_builder.py``, its expressions).
The words follow CPython's own messages (Python reference, chapter 2 "Lexical analysis") where
one exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from lark.lexer import PatternStr

from ...grammar import MAX_BRACKET_DEPTH, MAX_INDENT_DEPTH, LayoutProblem
from ..diagnostics import Diagnostic, Label
from ..spans import SourceFile, Span

PYTHON_ONLY_KEYWORDS: dict[str, str] = {
    "lambda": "`lambda` expressions are not supported in kernels",
    "with": "`with` statements are not supported in kernels",
    "class": "`class` definitions are not supported in kernels",
    "try": "exception handling (`try`) is not supported in kernels",
    "except": "exception handling (`except`) is not supported in kernels",
    "finally": "exception handling (`finally`) is not supported in kernels",
    "raise": "`raise` is not supported in kernels",
    "global": "`global` declarations are not supported in kernels",
    "nonlocal": "`nonlocal` declarations are not supported in kernels",
    "del": "`del` is not supported in kernels",
    "yield": "generators (`yield`) are not supported in kernels",
    "await": "`await` is not supported in kernels",
    "async": "`async` functions are not supported in kernels",
}
"""Python keywords the kernel grammar does not have (they lex as names) and what to say about them."""

PYTHON_ONLY_HELP: dict[str, str] = {
    "raise": "use `assert condition, \"message\"` to check a condition",
    "lambda": "define a helper function with `def` instead",
    "class": "use module-level constants and helper functions",
}

HEADER_KEYWORDS = {"IF": "if", "ELIF": "elif", "ELSE": "else", "WHILE": "while", "FOR": "for", "DEF": "def"}

_TOKEN_WORDS = {
    "_NEWLINE": "end of line",
    "_INDENT": "an indented block",
    "_DEDENT": "the end of the indented block",
    "$END": "end of input",
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "AUGASSIGN": "an augmented assignment (`+=`, ...)",
    "IS_NOT": "`is not`",
}

_OPERATOR_TEXTS = frozenset(
    ["is not", *"+ - * / // % ** << >> & | ^ @ < > == >= <= != . ( [ if in not is and or".split()]
)
_DISPLAY_ORDER = ("a statement", "an expression", "a name", "`)`", "`]`", "`:`", "an operator", "`,`", "`=`",
                  "end of line")
_MIN_OPERATORS_GROUPED = 8
_BEFORE_STARRED = frozenset({"COMMA", "LPAR", "LSQB", "EQUAL", "RETURN", "SEMICOLON", "_NEWLINE", "_INDENT",
                             "_DEDENT"})
"""Tokens after which a `*` that the parser refuses begins a starred expression (not a missing operand)."""
_MAX_EXPECTED_SHOWN = 4


@dataclass(frozen=True)
class ParseContext:
    """What the token-feeding loop knows when the parser stops: the offending ``token``, the token
    before it, the first token of the current logical line, the most recent block-header token,
    and the brackets open at that point."""

    token: Token
    previous: Token | None
    line_head: Token | None
    last_header: Token | None
    open_brackets: tuple[Token, ...]


class SyntaxErrorMapper:
    """Builds SP01xx diagnostics for one source; shared lookup tables come from the parser."""

    def __init__(self, parser: Lark, source: SourceFile, expression_starts: frozenset[str],
                 statement_starts: frozenset[str], text: str | None = None):
        """``text`` is what was parsed (by default ``source.text``; a copy with some lines blanked
        out has the same positions)."""
        self._parser = parser
        self.source = source
        self._expression_starts = expression_starts
        self._statement_starts = statement_starts
        self._text = source.text if text is None else text
        self._lines = self._text.split("\n")

    # ------------------------------------------------------------ spans

    def span(self, line: int, col: int, end_line: int, end_col: int) -> Span:
        return Span(self.source, line, col, end_line, end_col)

    def token_span(self, token: Token) -> Span:
        line = token.line or 1
        col = token.column or 1
        end_line = token.end_line or line
        end_col = token.end_column or col + 1
        return self.span(line, col, end_line, max(end_col, col + 1) if end_line == line else end_col)

    def word_span(self, line: int, col: int) -> Span:
        """The name, number or single character starting at ``line:col`` (the end of the text gives
        a one-column span just past the last character)."""
        text = self._lines[line - 1] if 0 < line <= len(self._lines) else ""
        i = col - 1
        j = i + 1
        if i < len(text) and (text[i].isalnum() or text[i] == "_"):
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
        return self.span(line, col, line, j + 1)

    def end_of_input_span(self) -> Span:
        for number in range(len(self._lines), 0, -1):
            text = self._lines[number - 1]
            if text.strip():
                end = len(text.rstrip()) + 1
                return self.span(number, end, number, end + 1)
        return self.span(1, 1, 1, 2)

    def _line_start_span(self, newline: Token) -> Span:
        """The first token of the line that follows a ``_NEWLINE`` (or a layout token borrowing its
        position)."""
        line, col = newline.end_line, newline.end_column
        if line is None or line > len(self._lines) or not self._lines[line - 1].strip():
            return self.end_of_input_span()
        return self.word_span(line, col)

    def _after(self, token: Token) -> Span:
        """A one-column span just after ``token`` (where a missing token belongs)."""
        line, col = token.end_line or 1, token.end_column or 1
        if token.type == "_NEWLINE":
            line, col = token.line, token.column
        return self.span(line, col, line, col + 1)

    def offending_span(self, token: Token, previous: Token | None) -> Span:
        if token.type == "$END":
            return self.end_of_input_span()
        if token.type in ("_INDENT", "_DEDENT"):
            return self._line_start_span(token)
        if token.type == "_NEWLINE":
            if previous is not None and previous.type not in ("_NEWLINE", "_INDENT", "_DEDENT"):
                return self._after(previous)
            return self.span(token.line, token.column, token.line, token.column + 1)
        return self.token_span(token)

    # ------------------------------------------------------------ words

    def describe_terminal(self, name: str) -> str:
        if name in _TOKEN_WORDS:
            return _TOKEN_WORDS[name]
        try:
            pattern = self._parser.get_terminal(name).pattern
        except KeyError:
            return name.lower()
        if isinstance(pattern, PatternStr):
            return f"`{pattern.value}`"
        return name.lower()

    def describe_found(self, token: Token) -> str:
        if token.type in ("_NEWLINE", "$END", "_INDENT", "_DEDENT"):
            return "an indented line" if token.type == "_INDENT" else _TOKEN_WORDS[token.type]
        if token.type == "STRING":
            return "a string"
        text = str(token.value)
        if len(text) > 24:
            text = text[:21] + "..."
        return f"`{text}`"

    def _is_operator(self, name: str) -> bool:
        word = self.describe_terminal(name)
        return word.startswith("`") and word.strip("`") in _OPERATOR_TEXTS

    def describe_expected(self, accepts: Iterable[str]) -> list[str]:
        """The expected terminals in words, grouped ("an expression", "an operator") and ordered so
        that the likeliest fixes come first."""
        names = set(accepts)
        words: list[str] = []
        if {"PASS", "RETURN", "NAME"} <= names:
            words.append("a statement")
            names -= self._statement_starts
        elif {"NAME", "NUMBER", "LPAR"} <= names:
            words.append("an expression")
            names -= self._expression_starts
        operators = {n for n in names if self._is_operator(n)}
        if len(operators) >= _MIN_OPERATORS_GROUPED:
            words.append("an operator")
            names -= operators
        rest = sorted({self.describe_terminal(n) for n in names} - set(words))
        words.extend(rest)
        rank = {w: i for i, w in enumerate(_DISPLAY_ORDER)}
        words.sort(key=lambda w: (rank.get(w, len(rank)), w))
        return words

    @staticmethod
    def join_words(words: list[str]) -> str:
        """``a``, ``a or b``, ``a, b or c``; more than a few become ``a, b, c, d, ...``."""
        if len(words) > _MAX_EXPECTED_SHOWN:
            return ", ".join(words[:_MAX_EXPECTED_SHOWN]) + ", ..."
        if len(words) == 1:
            return words[0]
        return ", ".join(words[:-1]) + " or " + words[-1]

    # ------------------------------------------------------------ lexer errors

    def unexpected_character(self, err: UnexpectedCharacters) -> Diagnostic:
        text = self._text
        pos = err.pos_in_stream
        char = text[pos] if 0 <= pos < len(text) else ""
        line, col = err.line, err.column
        one = self.span(line, col, line, col + 1)
        if char in ("'", '"'):
            if text.startswith(char * 3, pos):
                return Diagnostic("SP0102", "unterminated triple-quoted string", self.span(line, col, line, col + 3),
                                  help=f"close the string with `{char * 3}`")
            if pos >= 2 and text.startswith(char * 3, pos - 2) and col > 2:
                # `"""abc` lexes as the empty string `""` followed by an unterminated `"abc`.
                return Diagnostic("SP0102", "unterminated triple-quoted string",
                                  self.span(line, col - 2, line, col + 1), help=f"close the string with `{char * 3}`")
            end = len(self._lines[line - 1]) + 1 if 0 < line <= len(self._lines) else col + 1
            return Diagnostic("SP0102", "unterminated string", self.span(line, col, line, max(end, col + 1)),
                              help=f"close the string with `{char}` on the same line, or use triple quotes "
                                   "for text that spans lines")
        if char in "{}":
            return Diagnostic("SP0113", "dict and set literals (`{...}`) are not supported in kernels", one,
                              help="use a tuple `(...)` or a list `[...]`")
        if char == "\\":
            return Diagnostic("SP0101", "unexpected character after line continuation character `\\`", one,
                              help="a `\\` continues a line only as the last character of the line")
        if char == "!":
            return Diagnostic("SP0101", "invalid character `!`", one,
                              help="use `not` for logical negation and `!=` for inequality")
        if char == "`":
            return Diagnostic("SP0101", "invalid character '`' (backtick)", one)
        if char and not char.isprintable():
            return Diagnostic("SP0101", f"invalid non-printable character U+{ord(char):04X}", one)
        if char in "\u201c\u201d\u2018\u2019":
            return Diagnostic("SP0101", f"invalid character `{char}` (U+{ord(char):04X})", one,
                              help="use a straight quote `\"` or `'`")
        if char and not char.isascii():
            return Diagnostic("SP0101", f"invalid character `{char}` (U+{ord(char):04X})", one)
        return Diagnostic("SP0101", f"invalid character `{char}`", one)

    def null_byte(self) -> Diagnostic | None:
        """CPython refuses a source that contains a NUL character anywhere (even in a comment)."""
        pos = self._text.find("\0")
        if pos < 0:
            return None
        line = self._text.count("\n", 0, pos) + 1
        col = pos - (self._text.rfind("\n", 0, pos) + 1) + 1
        return Diagnostic("SP0101", "invalid null character U+0000 in the source", self.span(line, col, line, col + 1))

    def continuation_at_eof(self) -> Diagnostic | None:
        """A source whose last line is only a line continuation ``\\`` (CPython: "unexpected EOF while
        parsing"; the grammar ignores a ``\\`` before a newline, so the parse alone would accept it)."""
        text = self._text if self._text.endswith("\n") else self._text + "\n"
        start = text.rfind("\n", 0, len(text) - 1) + 1
        last = text[start:-1]
        if last.strip(" \t\f") != "\\":
            return None
        line = text.count("\n", 0, start) + 1
        col = last.index("\\") + 1
        return Diagnostic("SP0110", "unexpected end of input after the line continuation character `\\`",
                          self.span(line, col, line, col + 1),
                          help="a `\\` continues a line onto the next one: remove it from the last line")

    # ------------------------------------------------------------ layout errors

    def layout_problem(self, problem: LayoutProblem) -> Diagnostic:
        token, kind = problem.token, problem.kind
        if kind == "inconsistent_tabs":
            line = token.end_line
            return Diagnostic("SP0105", "inconsistent use of tabs and spaces in indentation",
                              self.span(line, 1, line, max(token.end_column, 2)),
                              help="indent with spaces only (or with tabs only)")
        if kind == "bad_dedent":
            return Diagnostic("SP0106", "unindent does not match any outer indentation level",
                              self._line_start_span(token),
                              help="indent this line like one of the enclosing blocks")
        if kind == "too_deep_indent":
            return Diagnostic("SP0121", f"too many levels of indentation (more than {MAX_INDENT_DEPTH})",
                              self._line_start_span(token))
        if kind == "too_deep":
            return Diagnostic("SP0121", f"brackets are nested too deeply (more than {MAX_BRACKET_DEPTH} levels)",
                              self.token_span(token))
        if kind == "unmatched_close":
            return Diagnostic("SP0108", f"unmatched `{token.value}`", self.token_span(token),
                              help="remove it, or add the opening bracket it closes")
        opener = problem.opener
        assert opener is not None
        if kind == "mismatched_close":
            return Diagnostic("SP0107", f"closing `{token.value}` does not match opening `{opener.value}`",
                              self.token_span(token),
                              labels=(Label(self.token_span(opener), f"`{opener.value}` opened here"),))
        return Diagnostic("SP0109", f"`{opener.value}` was never closed", self.token_span(opener))

    # ------------------------------------------------------------ parser errors

    def unexpected_token(self, err: UnexpectedToken, ctx: ParseContext, accepts: set[str]) -> Diagnostic:
        token = ctx.token
        found = self.describe_found(token)
        span = self.offending_span(token, ctx.previous)

        if token.type == "_INDENT":
            return Diagnostic("SP0103", "unexpected indentation", span,
                              help="indent only the body of a block (the lines after a line ending in `:`)")
        special = self._python_only(ctx)
        if special is not None:
            return special
        if "_INDENT" in accepts:
            return self._expected_block(ctx, span)
        if token.type == "AUGASSIGN" and not ctx.open_brackets:
            return Diagnostic("SP0115", f"`{token.value}` needs a single name, attribute or subscript on its left",
                              span)
        if token.type in ("ELSE", "ELIF") and ctx.line_head is token:
            return Diagnostic("SP0110", f"`{token.value}` does not follow an `if` block at the same indentation",
                              span, help=f"indent `{token.value}` like the `if` it belongs to")
        header = self._header_problem(ctx, accepts, found, span)
        if header is not None:
            return header
        if self._bare_import_list_ends_in_comma(ctx):
            return Diagnostic("SP0110", "trailing comma not allowed without surrounding parentheses", span,
                              help="put the imported names in parentheses, or remove the trailing `,`")

        words = self.describe_expected(accepts)
        message = f"expected {self.join_words(words)}, found {found}" if words else f"unexpected {found}"
        code = "SP0111" if words and words[0] == "an expression" else "SP0110"
        help_text = None
        if "an operator" in words and token.type in self._expression_starts:
            help_text = "two expressions in a row need an operator or a `,` between them"
        elif token.type == "_NEWLINE" and words and words[0] == "an expression":
            help_text = None
        return Diagnostic(code, message, span, help=help_text)

    @staticmethod
    def _bare_import_list_ends_in_comma(ctx: ParseContext) -> bool:
        """``from m import a, b,`` at the end of its line (CPython's own message for it; a ``;``
        after the ``,`` is plain invalid syntax there too)."""
        return (ctx.token.type in ("_NEWLINE", "$END") and ctx.previous is not None
                and ctx.previous.type == "COMMA" and ctx.line_head is not None
                and ctx.line_head.type == "FROM" and not ctx.open_brackets)

    def _expected_block(self, ctx: ParseContext, span: Span) -> Diagnostic:
        header = ctx.last_header
        if header is None:
            return Diagnostic("SP0104", "expected an indented block", span)
        where = f"on line {self.token_span(header).file_line}"
        if header.type == "DEF":
            what = f"after the function definition {where}"
        elif header.type in ("ELSE", "ELIF"):
            what = f"after `{header.value}` {where}"
        else:
            what = f"after the `{header.value}` statement {where}"
        return Diagnostic("SP0104", f"expected an indented block {what}", span,
                          help="indent the body of the block (write `pass` for an empty one)")

    def _header_problem(self, ctx: ParseContext, accepts: set[str], found: str, span: Span) -> Diagnostic | None:
        head = ctx.line_head
        if head is None or head.type not in HEADER_KEYWORDS or len(ctx.open_brackets) > 0:
            return None
        token = ctx.token
        if head.type == "FOR" and "IN" in accepts and "COLON" not in accepts:
            return Diagnostic("SP0112", f"expected `in` after the `for` loop target, found {found}", span)
        if "COLON" not in accepts or token.type == "COLON":
            return None
        what = {
            "IF": "the `if` condition",
            "ELIF": "the `elif` condition",
            "WHILE": "the `while` condition",
            "FOR": "the `for` loop header",
            "DEF": "the function signature",
            "ELSE": "`else`",
        }[head.type]
        help_text = None
        if token.type == "EQUAL" and head.type in ("IF", "ELIF", "WHILE"):
            help_text = "to compare two values use `==`"
        return Diagnostic("SP0112", f"expected `:` after {what}, found {found}", span, help=help_text)

    def _python_only(self, ctx: ParseContext) -> Diagnostic | None:
        """Python syntax the kernel language lacks: keywords that lex as names, f-strings, `:=`,
        comprehensions (a `for` inside brackets) and starred expressions."""
        token, previous = ctx.token, ctx.previous
        candidates = [t for t in (ctx.line_head, token, previous) if t is not None and t.type == "NAME"]
        for candidate in candidates:
            message = PYTHON_ONLY_KEYWORDS.get(str(candidate.value))
            if message is not None:
                return Diagnostic("SP0113", message, self.token_span(candidate),
                                  help=PYTHON_ONLY_HELP.get(str(candidate.value)))
        if (token.type == "STRING" and previous is not None and previous.type == "NAME"
                and previous.end_pos == token.start_pos):
            prefix = str(previous.value).lower()
            span = self.token_span(previous).to(self.token_span(token))
            if "f" in prefix and set(prefix) <= set("frb"):
                return Diagnostic("SP0113", "f-strings are not supported in kernels", span,
                                  help="use a plain string")
            if "b" in prefix and set(prefix) <= set("rb"):
                return Diagnostic("SP0113", "byte strings are not supported in kernels", span,
                                  help="use a plain string")
        if token.type == "FOR" and ctx.open_brackets:
            return Diagnostic("SP0113", "comprehensions and generator expressions are not supported in kernels",
                              self.token_span(token),
                              help="loop over `static_range(...)` (unrolled at compile time), or write the elements "
                                   "out in a tuple")
        if token.type == "STAR" and (previous is None or previous.type in _BEFORE_STARRED):  # `a, *b = t`
            return Diagnostic("SP0113", "starred expressions (`*x`) are not supported in kernels",
                              self.token_span(token),
                              help="index the tuple instead: `a, b = t[0], t[1:]`")
        walrus = None
        if token.type == "EQUAL" and previous is not None and previous.type == "COLON" \
                and previous.end_pos == token.start_pos:
            walrus = self.token_span(previous).to(self.token_span(token))
        elif token.type == "COLON" and self._text.startswith("=", token.end_pos):
            walrus = self.span(token.line, token.column, token.line, token.column + 2)
        if walrus is not None:
            return Diagnostic("SP0113", "the `:=` operator is not supported in kernels", walrus,
                              help="assign the value on its own line first")
        return None


__all__ = ["HEADER_KEYWORDS", "PYTHON_ONLY_KEYWORDS", "ParseContext", "SyntaxErrorMapper"]
