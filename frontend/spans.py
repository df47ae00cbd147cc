"""Source files and spans.

Every AST node and every IR op carries a :class:`Span` so that a diagnostic raised by any pass
can point at the line the user wrote. Lines and columns are 1-based; ``end_col`` is exclusive,
as in Lark's ``propagate_positions`` metadata.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceFile:
    """The text of one kernel source: a ``.spk`` file or the source of a ``@jit`` function.

    ``line_offset`` maps line 1 of ``text`` to a line of the real file (a Python function's
    source starts in the middle of its module); ``col_offset`` is the indentation that was
    removed from every line before parsing.
    """

    name: str
    text: str
    line_offset: int = 0
    col_offset: int = 0

    def line(self, lineno: int) -> str:
        """The text of 1-based line ``lineno`` of ``text`` (without the newline)."""
        lines = self.text.split("\n")
        if 1 <= lineno <= len(lines):
            return lines[lineno - 1]
        return ""


@dataclass(frozen=True)
class Span:
    """A region of a source file: ``line:col`` to ``end_line:end_col`` (1-based, end exclusive)."""

    source: SourceFile
    line: int
    col: int
    end_line: int
    end_col: int

    @property
    def file_line(self) -> int:
        """The line number in the real file."""
        return self.line + self.source.line_offset

    @property
    def file_col(self) -> int:
        """The column number in the real file."""
        return self.col + self.source.col_offset

    def to(self, other: Span) -> Span:
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(self.source, self.line, self.col, other.end_line, other.end_col)

    def __str__(self) -> str:
        return f"{self.source.name}:{self.file_line}:{self.file_col}"

    def __repr__(self) -> str:
        return f"Span({self.source.name}:{self.line}:{self.col}-{self.end_line}:{self.end_col})"


_UNKNOWN_SOURCE = SourceFile("<unknown>", "")
UNKNOWN_SPAN = Span(_UNKNOWN_SOURCE, 0, 0, 0, 0)
