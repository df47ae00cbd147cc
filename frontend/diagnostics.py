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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

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
    if (diag.help or diag.notes) and diag.span.line > 0:  # (closes the source excerpt; none without a span)
        out.append(f"{pad} |")
    for note in diag.notes:
        out.append(f"{pad} = note: {note}")
    if diag.help:
        out.append(f"{pad} = help: {diag.help}")
    return "\n".join(out)


def _unique(diagnostics: Iterable[Diagnostic]) -> tuple[Diagnostic, ...]:
    """``diagnostics`` without repeats of the same code, message and span (a helper inlined three
    times reports its one mistake once), in first-seen order."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for d in diagnostics:
        sp = d.span
        where = (getattr(sp.source, "name", None), sp.file_line, sp.col, sp.end_line, sp.end_col)
        key = (d.code, d.message, where, d.severity)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return tuple(out)


ConstructionHook = Callable[[type, str, str, str | None], None]
_construction_hook: ConstructionHook | None = None


def set_construction_hook(hook: ConstructionHook | None) -> ConstructionHook | None:
    """Call ``hook(error_type, code, message, help)`` first whenever a :class:`SparsileError` is built
    (None: no hook). An integration sets it for a tracer that follows the Python of the code it traces
    and cannot build the error object itself: torch.compile's dynamo reported its own error about our
    ``Span`` instead of ours (sparsile.torch's ``traced_errors``). The hook returns (the error is then
    built as usual) or raises what the tracer should see instead. Returns the hook it replaces."""
    global _construction_hook
    previous, _construction_hook = _construction_hook, hook
    return previous


class SparsileError(Exception):
    """The base of every user-facing error: a diagnostic ``code`` (frontend/codes.py lists them
    all), a ``message``, the source ``span`` it points at (UNKNOWN_SPAN when it comes from Python
    values rather than kernel source) and an optional ``help`` line naming the fix.

    ``str()`` is ``error[CODE]: message`` followed, when there is help, by `` = help: ...``.
    Subclasses say where the error comes from (:class:`LaunchError`, ``LayoutError``,
    ``SparsityError``) and may add a Python base (``ValueError``) without repeating this constructor.
    """

    def __init__(self, code: str, message: str, help: str | None = None, span: Span | None = None):
        hook = _construction_hook
        if hook is not None:  # (first: a tracer that cannot build this object stops here, see set_construction_hook)
            hook(type(self), code, message, help)
        self.code = code
        self.message = message
        self.help = help
        self.span = UNKNOWN_SPAN if span is None else span
        super().__init__(self.render())

    def render(self) -> str:
        """``error[CODE]: message`` and the help line."""
        text = f"error[{self.code}]: {self.message}"
        if self.help:
            text += f"\n = help: {self.help}"
        return text

    def to_diagnostic(self, span: Span | None = None) -> Diagnostic:
        """This error as a diagnostic at ``span`` (by default its own)."""
        return Diagnostic(self.code, self.message, self.span if span is None else span, help=self.help)

    def to_compile_error(self, span: Span | None = None) -> CompileError:
        """This error as a :class:`CompileError` pointing at ``span`` (by default its own)."""
        return CompileError([self.to_diagnostic(span)])


class CompileError(SparsileError):
    """One or more user-facing diagnostics; ``str()`` renders them all. ``code``, ``message``,
    ``span`` and ``help`` are those of the first error (of the first diagnostic when none is an
    error)."""

    def __init__(self, diagnostics: Iterable[Diagnostic]):
        self.diagnostics: tuple[Diagnostic, ...] = _unique(diagnostics)
        first = next((d for d in self.diagnostics if d.severity is Severity.ERROR),
                     self.diagnostics[0] if self.diagnostics else None)
        self.code = first.code if first is not None else ""
        self.message = first.message if first is not None else ""
        self.help = first.help if first is not None else None
        self.span = first.span if first is not None else UNKNOWN_SPAN
        Exception.__init__(self, self.render())

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


class LaunchError(SparsileError):
    """A launch the launcher refused before touching the GPU (wrong argument, grid, device)."""


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
