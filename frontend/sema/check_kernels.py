"""What ``sparsile check`` does with one kernel: specialize it and run sema, with representative
values for the constexpr parameters that have neither a default nor a ``--signature`` value.

A kernel whose every constexpr is known is checked once (:data:`CHECKED` or its errors). For the
others each missing constexpr gets a representative value: a few candidate assignments of small
powers of two (:data:`CANDIDATES`: all 16, all 64, distinct values 16, 32, 64, ..., all 128, all
32, then f32 for the constexprs named where the first failed, :data:`DTYPE_CANDIDATE`) are tried
in turn and the first one that specializes without an error makes the kernel
:data:`CHECKED` (with those values, which the report names). When every candidate fails, an error
is reported only when it is no artefact of the chosen values: it occurs at the same place with the
same code for every candidate, and its source text does not mention a representative constexpr
(``static_assert(BLOCK >= 256)`` or ``x.to(DT)`` depend on the value, an unknown name or a wrong
arity does not), or it does mention one but is no ``static_assert`` and says the same for every
candidate but for the numbers in it (a 2-D tile stored through 1-D pointers, whatever BLOCK is).
When only value-dependent errors remain the kernel is :data:`PARTIAL`: checked up to the first
check that depends on the value. A run-time parameter without a type (no annotation and no
``--signature`` type) is poisoned: sema checks everything that does not depend on it, and the
kernel is at best :data:`PARTIAL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import CompileError, Diagnostic, LaunchError, Severity
from ..ir import types as T
from ..spans import UNKNOWN_SPAN
from .values import POISON

CHECKED, PARTIAL, FAILED = "checked", "partial", "failed"

CANDIDATES: tuple[Callable[[int], int], ...] = (
    lambda i: 16,
    lambda i: 64,
    lambda i: 16 << i,  # distinct values: errors that only appear when two constexprs are equal
    lambda i: 128,
    lambda i: 32,
)
"""Candidate representative values: the i-th constexpr without a value gets ``candidate(i)``."""
DTYPE_CANDIDATE = T.f32
"""Tried for the constexprs named where the first candidate failed (``x.to(DT)``), with the others
at the first two candidates' values."""


@dataclass
class KernelCheck:
    """The outcome of checking one kernel."""

    name: str
    status: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    representative: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def describe(self) -> str:
        """One line for the report (for kernels that are not plainly checked)."""
        values = ", ".join(f"{k}={v}" for k, v in self.representative.items())
        if self.status == CHECKED and values:
            return f"`{self.name}` was checked with representative values {values}; give yours with --signature"
        if self.status == PARTIAL:
            at = f" (with representative values {values})" if values and "tried" not in self.reason else ""
            return f"`{self.name}` was checked partially{at}: {self.reason}; give them with --signature"
        return ""


SP_NO_KERNEL = "SP0251"


def no_kernel_warning(filename: str) -> Diagnostic:
    """The warning of ``check`` for a file without kernels (it does not say "ok")."""
    return Diagnostic(SP_NO_KERNEL, f"`{filename}` defines no kernel: nothing was checked", UNKNOWN_SPAN,
                      Severity.WARNING, help="mark kernels with `@kernel` (helpers are checked where a kernel "
                      "calls them)")


def missing_types(kernel: Any, signature: dict[str, Any]) -> list[str]:
    """The run-time parameters of ``kernel`` with no type (annotation or signature)."""
    return [p.name for p in kernel.params
            if p.name not in signature and p.annotation is not T.CONSTEXPR and p.annotation is None]


def missing_constexprs(kernel: Any, signature: dict[str, Any]) -> list[str]:
    """The constexpr parameters of ``kernel`` with no value (default or signature)."""
    return [p.name for p in kernel.params
            if p.name not in signature and p.annotation is T.CONSTEXPR and not p.has_default]


def _specialize(kernel: Any, signature: dict[str, Any], untyped: tuple[str, ...] = ()) -> list[Diagnostic]:
    """The diagnostics of sema on ``kernel`` for ``signature`` (empty when it specializes); the
    ``untyped`` run-time parameters are poisoned: what depends on them is not checked."""
    own = dict(signature)
    for p in kernel.params:
        if p.name not in own and p.annotation is not T.CONSTEXPR and p.annotation is not None:
            own[p.name] = p.annotation
    own.update({n: T.i32 for n in untyped})
    bindings, key = kernel.signature_bindings(own)
    try:
        if untyped:
            kernel.fresh_ir({**bindings, **{n: POISON for n in untyped}})
        else:
            kernel.ir_for(bindings, key)
    except CompileError as e:
        return [d for d in e.diagnostics if d.severity.value == "error"] or list(e.diagnostics)
    return []


def _span_text(span: Any) -> str:
    """The source text under ``span`` (empty for a synthesized span)."""
    if span.line <= 0:
        return ""
    lines = span.source.text.split("\n")[span.line - 1:span.end_line]
    if not lines:
        return ""
    if len(lines) == 1:
        return lines[0][span.col - 1:span.end_col - 1]
    return "\n".join([lines[0][span.col - 1:], *lines[1:-1], lines[-1][:span.end_col - 1]])


def _mentions(diag: Diagnostic, names: list[str]) -> bool:
    """Whether the source text under ``diag`` (or one of its labels) names one of ``names``."""
    texts = [_span_text(diag.span), *(_span_text(lab.span) for lab in diag.labels)]
    return any(re.search(rf"\b{re.escape(n)}\b", t) for t in texts for n in names)


SP_NOT_A_TYPE = "SP0302"
SP_CONST_EVAL_FAILED = "SP0331"
VALUE_CHECKS = frozenset({"SP0320", SP_NOT_A_TYPE, SP_CONST_EVAL_FAILED})
"""Codes whose failure is about a constexpr's value by nature (``static_assert``, a size given
where a dtype belongs, a compile-time operation the value does not support: ``len(T)`` of an
integer where the kernel wants a tuple)."""


def _shape_of_message(d: Diagnostic) -> str:
    """``d``'s message with every number replaced: the same error at other sizes compares equal."""
    return re.sub(r"\d+", "#", d.message)


def _value_independent(d: Diagnostic, others: list[list[Diagnostic]], free: list[str]) -> bool:
    """Whether ``d`` (from the first candidate) is no artefact of the representative values: every
    other candidate reports it at the same place with the same code, and either its source does not
    name a representative constexpr, or it is no value check and its message is the same but for
    the sizes (a 2-D tile stored through 1-D pointers, whatever BLOCK is)."""
    same = [[o for o in diags if (o.code, o.span) == (d.code, d.span)] for diags in others]
    if not all(same):
        return False
    if not _mentions(d, free):
        return True
    shape = _shape_of_message(d)
    return d.code not in VALUE_CHECKS and all(any(_shape_of_message(o) == shape for o in s) for s in same)


def _wrong_kind(d: Diagnostic, value: Any) -> bool:
    """Whether ``d`` says a value of the wrong kind was given (a size where a dtype belongs)."""
    return d.code == SP_NOT_A_TYPE or d.message.endswith(f"found {value!r}")


def _try(kernel: Any, signature: dict[str, Any], assignments: list[dict[str, Any]], untyped: tuple[str, ...]
         ) -> tuple[KernelCheck | None, list[tuple[dict[str, Any], list[Diagnostic]]]]:
    """Specialize ``kernel`` with each assignment in turn: the result of the first that works
    (CHECKED), or of errors that every assignment shares and that no value explains (FAILED), else
    None; with the attempts made."""
    attempts: list[tuple[dict[str, Any], list[Diagnostic]]] = []
    free = list(assignments[0])
    for values in assignments:
        if any(values == v for v, _ in attempts):
            continue
        try:
            diags = _specialize(kernel, {**signature, **values}, untyped)
        except LaunchError as e:  # a representative value the signature binding refuses
            diags = [Diagnostic(e.code, str(e), kernel.node.span)]
        if not diags:
            return KernelCheck(kernel.name, CHECKED, [], values), attempts
        attempts.append((values, diags))
    first_values, first = attempts[0]
    real = [d for d in first if _value_independent(d, [diags for _, diags in attempts[1:]], free)]
    return (KernelCheck(kernel.name, FAILED, real, first_values) if real else None), attempts


def check_kernel(kernel: Any, signature: dict[str, Any]) -> KernelCheck:
    """Check ``kernel`` for the parameters ``signature`` gives (see the module docstring).
    ``signature`` holds only this kernel's names. LaunchErrors of a bad signature propagate."""
    try:
        untyped = tuple(missing_types(kernel, signature))
    except CompileError as e:  # the parameters' annotations themselves are wrong
        return KernelCheck(kernel.name, FAILED, list(e.diagnostics))
    result = _check_values(kernel, signature, untyped)
    if untyped and result.status == CHECKED:
        names = ", ".join(f"`{n}`" for n in untyped)
        result.status = PARTIAL
        result.reason = f"{names} {'has' if len(untyped) == 1 else 'have'} no type, so what depends on " \
                        f"{'it' if len(untyped) == 1 else 'them'} was not checked"
    return result


def _check_values(kernel: Any, signature: dict[str, Any], untyped: tuple[str, ...]) -> KernelCheck:
    """:func:`check_kernel` for the constexprs: their values, or representative ones."""
    name = kernel.name
    free = missing_constexprs(kernel, signature)
    if not free:
        diags = _specialize(kernel, signature, untyped)
        return KernelCheck(name, FAILED if diags else CHECKED, diags)
    int_assignments = [{n: candidate(i) for i, n in enumerate(free)} for candidate in CANDIDATES]
    result, attempts = _try(kernel, signature, int_assignments, untyped)
    if result is not None:
        return result
    first_values, first = attempts[0]
    suspects = [n for n in free if any(_mentions(d, [n]) and _wrong_kind(d, first_values[n]) for d in first)]
    if suspects:  # constexprs used as dtypes: try f32 for them, two sizes for the others
        dtype_assignments = [{n: DTYPE_CANDIDATE if n in suspects else a[n] for n in free} for a in int_assignments[:2]]
        result, dtype_attempts = _try(kernel, signature, dtype_assignments, untyped)
        if result is not None:
            return result
        attempts += dtype_attempts
    d = first[0]
    where = f" at {d.span}" if d.span.line > 0 else ""
    tried = "; ".join(", ".join(f"{k}={v}" for k, v in values.items()) for values, _ in attempts)
    reason = (f"every representative value tried ({tried}) stops at a check that depends on the value "
              f"(first: error[{d.code}]{where}: {d.message})")
    if untyped:
        reason += f"; {', '.join(f'`{n}`' for n in untyped)} had no type"
    return KernelCheck(name, PARTIAL, [], first_values, reason)


__all__ = ["CANDIDATES", "CHECKED", "FAILED", "PARTIAL", "KernelCheck", "check_kernel", "missing_constexprs",
           "missing_types", "no_kernel_warning"]
