"""Diagnostics: codes, severities, spans, rustc-style rendering, and the compiler's exceptions.

A user mistake becomes a :class:`Diagnostic` (never a Python traceback from compiler internals);
passes collect several into a :class:`DiagnosticBag` and raise one :class:`CompileError` holding
them all. A compiler bug is an :class:`InternalError`, which asks to be reported.

Code ranges (one owner each, so that codes never collide; ``docs/diagnostics.md`` lists every
code with a program that triggers it):

=========  ==========================================================
SP01xx     parsing (grammar, tokens, indentation)
SP02xx     names, scopes, constexpr evaluation, helper inlining
SP03xx     types, shapes, broadcasting, op signatures
SP04xx     layouts and layout inference
SP05xx     legality: hardware rules per target (tcgen05, wgmma, TMA, TMEM, SMEM)
SP06xx     targets and code generation (gating before LLVM)
SP07xx     launch-time checks (arguments, grid, shared memory, devices)
SP08xx     sparsity metadata (formats, validation)
=========  ==========================================================
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .spans import UNKNOWN_SPAN, Span


class Severity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Label:
    """A secondary span with a short message ("the accumulator was declared here")."""

    span: Span
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """One finding: ``code`` (e.g. ``"SP0503"``), a one-line ``message`` saying what was expected
    and what was found, the primary ``span``, an optional ``help`` line naming the fix, and
    optional secondary ``labels`` and free-form ``notes``."""

    code: str
    message: str
    span: Span = UNKNOWN_SPAN
    severity: Severity = Severity.ERROR
    help: str | None = None
    labels: tuple[Label, ...] = ()
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        return render(self)

    def __str__(self) -> str:
        return self.render()


def _gutter_width(diag: Diagnostic) -> int:
    lines = [diag.span.file_line] + [lab.span.file_line for lab in diag.labels]
    return max(len(str(n)) for n in lines)


def _excerpt(span: Span, width: int, marker: str, message: str = "") -> list[str]:
    """The source line of ``span`` with ``marker`` characters under the spanned columns."""
    if span.line <= 0:
        return []
    text = span.source.line(span.line)
    shown = (" " * span.source.col_offset) + text
    start = span.file_col
    if span.end_line == span.line:
        end = span.end_col + span.source.col_offset
    else:
        end = len(shown) + 1
    length = max(1, end - start)
    pad = " " * width
    underline = " " * (start - 1) + marker * length
    if message:
        underline += " " + message
    return [f"{span.file_line:>{width}} | {shown.rstrip()}", f"{pad} | {underline}"]


def render(diag: Diagnostic) -> str:
    """Render like rustc: ``error[CODE]: message``, ``--> file:line:col``, the source line with
    a caret under the span, secondary labels, then ``= help:`` and ``= note:`` lines."""
    width = _gutter_width(diag)
    pad = " " * width
    out = [f"{diag.severity.value}[{diag.code}]: {diag.message}"]
    if diag.span.line > 0:
        out.append(f"{pad}--> {diag.span}")
        out.append(f"{pad} |")
        out.extend(_excerpt(diag.span, width, "^"))
        for lab in diag.labels:
            if lab.span.source.name != diag.span.source.name:
                out.append(f"{pad}::: {lab.span}")
            out.extend(_excerpt(lab.span, width, "-", lab.message))
    if diag.help or diag.notes:
        out.append(f"{pad} |")
    for note in diag.notes:
        out.append(f"{pad} = note: {note}")
    if diag.help:
        out.append(f"{pad} = help: {diag.help}")
    return "\n".join(out)


class CompileError(Exception):
    """One or more user-facing diagnostics; ``str()`` renders them all."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        errors = [d for d in self.diagnostics if d.severity is Severity.ERROR]
        body = "\n\n".join(d.render() for d in self.diagnostics)
        if len(errors) > 1:
            body += f"\n\nerror: aborting due to {len(errors)} previous errors"
        return body

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]

    def __str__(self) -> str:
        return self.render()


def coded_error_diagnostic(e: BaseException, span: Span) -> Diagnostic | None:
    """The diagnostic at ``span`` of an exception that carries its own ``SPxxxx`` code, message and
    help (LayoutError, SparsityError, LaunchError raised below an op); None for any other."""
    code = getattr(e, "code", None)
    if not (isinstance(code, str) and code.startswith("SP")):
        return None
    message = getattr(e, "message", None) or str(e).split("\n")[0].removeprefix(f"error[{code}]: ")
    return Diagnostic(code, message, span, help=getattr(e, "help", None))


def not_a_value(e: Exception, what: str, span: Span) -> Diagnostic:
    """SP0252: ``what`` needs numbers, pointers or tiles but got a value of ``e.type`` (a tensor
    descriptor, a shared-memory buffer, an mbarrier); ``e`` is a ``types.NotAValueTypeError``."""
    return Diagnostic("SP0252", f"{what} needs numbers, pointers or tiles, found {getattr(e, 'type', e)}", span,
                      help="tensor descriptors, shared-memory buffers and mbarriers are passed whole to the "
                           "builtins that take them (tma.load, wgmma, mbarrier.wait, ...)")


class InternalError(Exception):
    """A compiler bug. Never the user's fault; the message asks for a report."""

    def __init__(self, message: str, span: Span | None = None):
        self.span = span
        where = f" (while compiling {span})" if span is not None and span.line > 0 else ""
        super().__init__(
            f"internal compiler error{where}: {message}\n"
            "This is a bug in sparsile, not in your kernel. Please report it with the kernel "
            "source and this message."
        )


class LaunchError(Exception):
    """A launch the launcher refused before touching the GPU (wrong argument, grid, device)."""

    def __init__(self, code: str, message: str, help: str | None = None):
        self.code = code
        self.help = help
        text = f"error[{code}]: {message}"
        if help:
            text += f"\n = help: {help}"
        super().__init__(text)


@dataclass
class DiagnosticBag:
    """Collects diagnostics across a pass so that several errors are reported at once."""

    items: list[Diagnostic] = field(default_factory=list)

    def add(self, diag: Diagnostic) -> Diagnostic:
        self.items.append(diag)
        return diag

    def error(self, code: str, message: str, span: Span = UNKNOWN_SPAN, *, help: str | None = None,
              labels: Iterable[Label] = (), notes: Iterable[str] = ()) -> Diagnostic:
        return self.add(Diagnostic(code, message, span, Severity.ERROR, help, tuple(labels), tuple(notes)))

    def warning(self, code: str, message: str, span: Span = UNKNOWN_SPAN, *, help: str | None = None,
                notes: Iterable[str] = ()) -> Diagnostic:
        return self.add(Diagnostic(code, message, span, Severity.WARNING, help, (), tuple(notes)))

    @property
    def has_errors(self) -> bool:
        return any(d.severity is Severity.ERROR for d in self.items)

    def raise_if_errors(self) -> None:
        if self.has_errors:
            raise CompileError(self.items)

    def extend(self, diags: Iterable[Diagnostic]) -> None:
        self.items.extend(diags)

    def __iter__(self) -> Iterator[Diagnostic]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def error(code: str, message: str, span: Span = UNKNOWN_SPAN, *, help: str | None = None,
          labels: Iterable[Label] = (), notes: Iterable[str] = ()) -> CompileError:
    """A :class:`CompileError` with a single error diagnostic, ready to ``raise``."""
    return CompileError([Diagnostic(code, message, span, Severity.ERROR, help, tuple(labels), tuple(notes))])
