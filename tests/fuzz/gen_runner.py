"""Compile a mutant of tests/fuzz/gen_mutate.py to PTX for its targets (and run the ones that
compile in the interpreter), and classify what happened.

Outcomes: ``ok`` (compiled), ``diagnostic`` (a well-formed sparsile error: a code of the catalog,
a message, and for a CompileError a span inside the source), ``malformed`` (a sparsile error
without one of those), ``internal`` (InternalError), ``exception`` (any other exception: a Python
traceback from the compiler's internals). ``crash`` (the process died: an LLVM abort, a segfault,
the memory limit) and ``timeout`` are decided by the process running this one
(scripts/fuzz_mutants.py). Everything but ``ok`` and ``diagnostic`` is a bug.
"""

from __future__ import annotations

import math
import traceback
from typing import Any

from .gen_mutate import Mutant, generate

OK, DIAGNOSTIC, MALFORMED, INTERNAL, EXCEPTION, CRASH, TIMEOUT = (
    "ok", "diagnostic", "malformed", "internal", "exception", "crash", "timeout")
BUGS = (MALFORMED, INTERNAL, EXCEPTION, CRASH, TIMEOUT)
RANK = {OK: 0, DIAGNOSTIC: 1, MALFORMED: 2, INTERNAL: 3, EXCEPTION: 4, CRASH: 5, TIMEOUT: 6}
FILE = "mutant.spk"


def diagnostic_problem(e: BaseException, source: str) -> str | None:
    """What is wrong with the form of the sparsile error ``e`` raised for ``source``, or None."""
    from sparsile.frontend.codes import CODES
    from sparsile.frontend.diagnostics import CompileError, Severity

    if not isinstance(e, CompileError):  # a LaunchError: about the call, not the source
        code, message = getattr(e, "code", ""), getattr(e, "message", "")
        if code not in CODES or not message:
            return f"{type(e).__name__} with code {code!r}, message {message!r}"
        return None
    errors = [d for d in e.diagnostics if d.severity is Severity.ERROR]
    if not errors:
        return "a CompileError without an error"
    lines = source.split("\n")
    for d in errors:
        if d.code not in CODES or not d.message.strip():
            return f"code {d.code!r}, message {d.message!r}"
        sp = d.span
        if sp.source.name != FILE:
            continue  # in an imported file: not this source's lines
        if sp.line <= 0:
            return f"[{d.code}] {d.message}: no span"
        if not (1 <= sp.line <= sp.end_line <= len(lines)) or sp.col < 1 or sp.col > len(lines[sp.line - 1]) + 1:
            return f"[{d.code}] {d.message}: span {sp.line}:{sp.col}-{sp.end_line}:{sp.end_col} outside the source"
    return None


def classify(e: BaseException, source: str) -> tuple[str, str]:
    """The outcome of the exception ``e`` and a line (a traceback tail for bugs)."""
    from sparsile.frontend.diagnostics import InternalError, SparsileError

    if isinstance(e, SparsileError):
        problem = diagnostic_problem(e, source)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        return (DIAGNOSTIC, first) if problem is None else (MALFORMED, f"{first}\n{problem}")
    kind = INTERNAL if isinstance(e, InternalError) else EXCEPTION
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return kind, "".join(tb[-8:])[-3000:]


def _signature(kernel: Any, consts: dict[str, Any]) -> dict[str, Any]:
    import sparsile as sp

    sig: dict[str, Any] = {p.name: p.annotation for p in kernel.params if p.annotation is not sp.constexpr
                           and p.annotation is not None}
    sig.update(consts)
    return sig


def load(m: Mutant) -> Any:
    """The mutant's kernel ``k``."""
    import sparsile as sp

    return sp.loads(m.source, FILE).kernels["k"]


def largest_tile(m: Mutant) -> int | None:
    """The elements of the mutant's largest tile, from its typed IR (sema only: no target, no
    passes); None where it does not reach the IR (a diagnostic, SP0344 among them)."""
    from sparsile.frontend.ir import types as T

    try:
        kernel = load(m)
        bindings, _ = kernel.signature_bindings(_signature(kernel, m.consts))
        func = kernel.fresh_ir(bindings, {"num_warps": int(kernel.options.get("num_warps") or 4)})
    except Exception:  # (a RecursionError too)
        return None
    return max((math.prod(T.shape_of(r.type)) for op in func.walk() for r in op.results
                if isinstance(r.type, T.TileType)), default=0)


def compile_mutant(m: Mutant, targets: tuple[str, ...] | None = None) -> tuple[str, str, list[str]]:
    """Compile to PTX for each target (``m.targets`` by default, not through the compile cache):
    the worst outcome with its detail, and the targets it compiled for."""
    from sparsile.driver.compiler import compile_kernel

    try:
        kernel = load(m)
        sig = _signature(kernel, m.consts)
    except (Exception, RecursionError) as e:
        return (*classify(e, m.source), [])
    outcome, detail, compiled = OK, "", []
    for target in targets or m.targets:
        try:
            compile_kernel(kernel, sig, target=target, stop_after="ptx", cache=False)
            got = (OK, "")
            compiled.append(target)
        except (Exception, RecursionError) as e:
            got = classify(e, m.source)
        if RANK[got[0]] > RANK[outcome]:
            outcome, detail = got[0], f"{target}: {got[1]}"
    return outcome, detail, compiled


def _arguments(m: Mutant, kernel: Any) -> list[Any] | None:
    """The generator's inputs, converted to the mutant's parameter types where those changed; None
    where a parameter has no input (the mutant is not run)."""
    import numpy as np

    from sparsile.frontend.ir import types as T

    inputs = generate(m.gen, m.seed).inputs(m.seed)
    inputs.update(m.consts)
    args = []
    for p in kernel.params:
        if p.name not in inputs:
            if p.has_default:
                continue
            return None
        v = inputs[p.name]
        ann = p.annotation
        if isinstance(v, np.ndarray) and isinstance(ann, T.PointerType | T.TensorType):
            with np.errstate(all="ignore"):
                v = v.astype(T.numpy_dtype(ann.elem))
        args.append(v)
    return args


def interpret_mutant(m: Mutant) -> tuple[str, str]:
    """Run the mutant in the interpreter on a grid of at most 2 programs per axis."""
    try:
        kernel = load(m)
        args = _arguments(m, kernel)
        if args is None:
            return OK, "not run: a parameter without an input"
        grid = tuple(min(g, 2) for g in m.grid)
        kernel.interpret[grid](*args)
    except (Exception, RecursionError) as e:
        return classify(e, m.source)
    return OK, ""
