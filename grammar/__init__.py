"""The kernel grammar (``kernel.lark``) and its cached parser factory.

:func:`get_parser` builds the Lark LALR(1) parser once per process (``propagate_positions=True``,
basic lexer, start symbols ``module`` and ``expression_input``). The parse tables are also kept
on disk through Lark's own cache (``cache=<path>``), so that a fresh process loads them instead of
rebuilding them (~350 ms). Like Python's ``.pyc`` files they belong to the installation, not to the
compile cache of kernels (``$SPARSILE_CACHE_DIR``, which does not hold them): they go to
``grammar/__pycache__`` next to ``kernel.lark`` when that folder is this user's and private, else to
a per-user folder in the temp directory. ``SPARSILE_GRAMMAR_CACHE`` names another folder, or ``off``.
A folder that cannot be written is skipped silently.

:class:`IndentationPostLexer` turns Python-style indentation into ``_INDENT``/``_DEDENT`` tokens
(Python reference, section 2.1.8 "Indentation"), drops newlines inside brackets (section 2.1.6
"Implicit line joining"), and raises :class:`LayoutProblem` for indentation and bracket errors;
``frontend/syntax/parser.py`` turns those into SP01xx diagnostics. This module knows nothing of
diagnostics or source files.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import lark
from lark import Lark, Token
from lark.lark import PostLex

GRAMMAR_PATH = Path(__file__).with_name("kernel.lark")
START_SYMBOLS = ("module", "expression_input")
MAX_BRACKET_DEPTH = 100
"""Deeper bracket nesting is refused (SP0121) instead of risking Python's recursion limit."""
MAX_INDENT_DEPTH = 100
"""Deeper block nesting is refused (SP0121), as CPython does ("too many levels of indentation")."""

OPEN_BRACKETS = {"LPAR": "RPAR", "LSQB": "RSQB"}
CLOSE_BRACKETS = {"RPAR": "LPAR", "RSQB": "LSQB"}
TAB_SIZE = 8
"""Python compares indentation with tabs counted as 8 columns and as 1 column; indentation whose
order differs between the two counts is ambiguous (Python reference 2.1.8, ``TabError``)."""


class LayoutProblem(Exception):
    """An indentation or bracket error found by the post-lexer.

    ``kind`` is one of ``"inconsistent_tabs"``, ``"bad_dedent"``, ``"unmatched_close"``,
    ``"mismatched_close"``, ``"unclosed"``, ``"too_deep"`` (brackets), ``"too_deep_indent"``.
    ``token`` is the offending token (for indentation errors: the newline token that precedes the
    line); ``opener`` is the open bracket involved, if any.
    """

    def __init__(self, kind: str, token: Token, opener: Token | None = None):
        super().__init__(f"{kind} at line {token.line}, column {token.column}")
        self.kind = kind
        self.token = token
        self.opener = opener


def _indent_widths(indent: str) -> tuple[int, int]:
    """The width of an indentation string with tabs counted as :data:`TAB_SIZE` and as 1 column
    (tabs advance to the next multiple of the tab size and a form feed resets the count, as in
    Python's tokenizer)."""
    wide = narrow = 0
    for ch in indent:
        if ch == "\t":
            wide = (wide // TAB_SIZE + 1) * TAB_SIZE
            narrow += 1
        elif ch == "\f":
            wide = narrow = 0
        else:
            wide += 1
            narrow += 1
    return wide, narrow


class IndentationPostLexer(PostLex):
    """Python-style layout: ``_INDENT``/``_DEDENT`` from leading whitespace, newlines inside brackets
    ignored, brackets matched. Every call to :meth:`process` keeps its own state, so one instance
    may serve several parses (and threads) at once."""

    always_accept = ("_NEWLINE",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        levels: list[tuple[int, int]] = [(0, 0)]
        brackets: list[Token] = []
        last: Token | None = None
        first = True
        for token in stream:
            if first:
                first = False
                if token.type != "_NEWLINE" and token.column > 1:
                    # Indented first line: report it as the parser would any unexpected indent.
                    # Positioned like a newline token that ends where the line's text starts.
                    yield Token("_INDENT", "", token.start_pos, token.line, 1, token.line, token.column,
                                token.start_pos)
                    levels.append((1, 1))
            kind = token.type
            if kind == "_NEWLINE":
                if not brackets:
                    yield token
                    yield from self._layout(token, levels)
            elif kind in OPEN_BRACKETS:
                if len(brackets) >= MAX_BRACKET_DEPTH:
                    raise LayoutProblem("too_deep", token)
                brackets.append(token)
                yield token
            elif kind in CLOSE_BRACKETS:
                if not brackets:
                    raise LayoutProblem("unmatched_close", token)
                opener = brackets.pop()
                if opener.type != CLOSE_BRACKETS[kind]:
                    raise LayoutProblem("mismatched_close", token, opener)
                yield token
            else:
                yield token
            last = token
        if brackets:
            raise LayoutProblem("unclosed", brackets[-1], brackets[-1])
        while len(levels) > 1:
            levels.pop()
            if last is None:
                yield Token("_DEDENT", "", 0, 1, 1, 1, 1, 0)
            else:
                yield Token.new_borrow_pos("_DEDENT", "", last)

    @staticmethod
    def _layout(newline: Token, levels: list[tuple[int, int]]) -> Iterator[Token]:
        """Compare the indentation after ``newline`` with the stack of open levels, as Python's
        tokenizer does: a deeper line opens a level, a shallower one must return exactly to an
        enclosing level, and the tab-as-8 and tab-as-1 widths must order the lines the same way."""
        indent = newline.value.rsplit("\n", 1)[-1]
        wide, narrow = _indent_widths(indent)
        top_wide, top_narrow = levels[-1]
        if wide == top_wide:
            if narrow != top_narrow:
                raise LayoutProblem("inconsistent_tabs", newline)
            return
        if wide > top_wide:
            if narrow <= top_narrow:
                raise LayoutProblem("inconsistent_tabs", newline)
            if len(levels) > MAX_INDENT_DEPTH:
                raise LayoutProblem("too_deep_indent", newline)
            levels.append((wide, narrow))
            yield Token.new_borrow_pos("_INDENT", indent, newline)
            return
        depth = len(levels)
        while depth > 1 and wide < levels[depth - 1][0]:
            depth -= 1
        if wide != levels[depth - 1][0]:
            raise LayoutProblem("bad_dedent", newline)
        if narrow != levels[depth - 1][1]:
            raise LayoutProblem("inconsistent_tabs", newline)
        for _ in range(len(levels) - depth):
            levels.pop()
            yield Token.new_borrow_pos("_DEDENT", indent, newline)


def grammar_text() -> str:
    """The text of ``kernel.lark``."""
    return GRAMMAR_PATH.read_text(encoding="utf-8")


def _private_dir(path: Path) -> bool:
    """Create ``path`` (mode 0700) if needed; True if it is a directory owned by this user and not
    writable by others, so that unpickling the cached tables from it is safe."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return False
    return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


ENV_GRAMMAR_CACHE = "SPARSILE_GRAMMAR_CACHE"
_OFF_VALUES = ("off", "0", "false", "no", "none", "disabled")


def cache_path(text: str | None = None) -> Path | None:
    """Where Lark keeps the parse tables for this grammar, Lark and Python version; ``None`` when no
    safe writable folder exists (or ``SPARSILE_GRAMMAR_CACHE=off``)."""
    text = grammar_text() if text is None else text
    key = f"{text}\0{lark.__version__}\0{sys.version_info[:2]}".encode()
    name = f"kernel-{hashlib.sha256(key).hexdigest()[:16]}.lalr"
    root = os.environ.get(ENV_GRAMMAR_CACHE, "").strip()
    if root.lower() in _OFF_VALUES:
        return None
    if root:
        folders = [Path(root).expanduser()]
    else:
        user = os.getuid() if hasattr(os, "getuid") else "user"
        folders = [GRAMMAR_PATH.parent / "__pycache__", Path(tempfile.gettempdir()) / f"sparsile-{user}" / "grammar"]
    for folder in folders:
        if _private_dir(folder):
            return folder / name
    return None


def build_parser(*, cache: bool = True, debug: bool = False) -> Lark:
    """Build a new Lark parser for the kernel grammar (not memoized; see :func:`get_parser`).

    ``debug=True`` skips the disk cache and makes Lark log every shift/reduce conflict as a
    warning on the ``lark`` logger (the grammar's test asserts there are none).
    """
    text = grammar_text()
    path = cache_path(text) if cache and not debug else None
    return Lark(
        text,
        parser="lalr",
        lexer="basic",
        start=list(START_SYMBOLS),
        propagate_positions=True,
        maybe_placeholders=True,
        postlex=IndentationPostLexer(),
        cache=str(path) if path is not None else False,
        debug=debug,
    )


_lock = threading.Lock()
_parser: Lark | None = None
builds = 0
"""How many parsers :func:`get_parser` has built or loaded in this process (1 after first use)."""


def get_parser() -> Lark:
    """The process-wide kernel parser, built (or loaded from the disk cache) once, on first use;
    safe to call from several threads."""
    global _parser, builds
    if _parser is None:
        with _lock:
            if _parser is None:
                _parser = build_parser()
                builds += 1
    return _parser


__all__ = [
    "CLOSE_BRACKETS",
    "GRAMMAR_PATH",
    "MAX_BRACKET_DEPTH",
    "MAX_INDENT_DEPTH",
    "OPEN_BRACKETS",
    "START_SYMBOLS",
    "IndentationPostLexer",
    "LayoutProblem",
    "build_parser",
    "cache_path",
    "get_parser",
    "grammar_text",
]
