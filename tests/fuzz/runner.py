"""Run one mutant through ``sparsile check`` or through compilation to PTX, and classify it.

Outcomes: ``ok`` (checked or compiled), ``diagnostic`` (a located error: CompileError, or a
LaunchError/usage error the command line reports), ``internal`` (InternalError: a compiler bug
that says so), ``traceback`` (any other exception escaping to the user). ``hang`` and ``crash``
are decided by the process running this one (scripts/fuzz.py).
"""

from __future__ import annotations

import io
import os
import tempfile
import traceback
from pathlib import Path
from typing import Any

OK, DIAGNOSTIC, INTERNAL, TRACEBACK, HANG, CRASH = "ok", "diagnostic", "internal", "traceback", "hang", "crash"
OUTCOMES = (OK, DIAGNOSTIC, INTERNAL, TRACEBACK, HANG, CRASH)


def _classify(e: BaseException) -> tuple[str, str]:
    from sparsile.frontend.diagnostics import CompileError, InternalError, LaunchError

    if isinstance(e, CompileError | LaunchError):
        return DIAGNOSTIC, str(e).splitlines()[0] if str(e) else type(e).__name__
    kind = INTERNAL if isinstance(e, InternalError) else TRACEBACK
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return kind, "".join(tb[-6:])[-2000:]


def run_check(text: str, name: str = "mutant.spk", home: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """``sparsile check`` on ``text`` (through the command line's own code, in this process).
    ``home``: the folder of the file mutated, whose other .spk files are linked beside the mutant so
    that its relative imports (``from .sparse_gemm_sm90 import ...``) resolve. Linked, not copied:
    an imported module is cached by its real path and text, so an unchanged sibling is parsed once
    for all mutants rather than once each."""
    import shutil

    from sparsile import cli

    with tempfile.TemporaryDirectory() as d:
        for sibling in ([] if home is None else sorted(Path(home).glob("*.spk"))):
            if sibling.name != name:
                try:
                    os.symlink(sibling.resolve(), os.path.join(d, sibling.name))
                except OSError:  # no symbolic links here: a copy (parsed again for every mutant)
                    shutil.copy(sibling, d)
        path = os.path.join(d, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        out, err = io.StringIO(), io.StringIO()
        try:
            rc = cli.main(["check", path], stdout=out, stderr=err)
        except (Exception, RecursionError) as e:  # what escapes main() reaches the user as a traceback
            return _classify(e)
    if rc == 0:
        return OK, out.getvalue().splitlines()[0] if out.getvalue() else ""
    text_err = err.getvalue()
    if "internal compiler error" in text_err or "Traceback" in text_err:
        return INTERNAL, text_err[-2000:]
    return DIAGNOSTIC, (text_err.splitlines() or [""])[0]


def compile_signature(kernel: Any) -> dict[str, Any]:
    """Annotated parameter types, and 16 for each constexpr without a default."""
    from sparsile.frontend.ir import types as T

    sig: dict[str, Any] = {}
    for p in kernel.params:
        if p.annotation is T.CONSTEXPR:
            if not p.has_default:
                sig[p.name] = 16
        elif p.annotation is not None:
            sig[p.name] = p.annotation
    return sig


def run_compile(text: str, targets: tuple[str, ...], name: str = "mutant.spk", pick: int | None = None,
                home: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """Compile the kernels of ``text`` to PTX for each target (with ``pick``: only kernel number
    ``pick`` modulo their count, so that a file of 14 kernels costs one compile); the worst outcome
    wins."""
    import sparsile
    from sparsile.driver.compiler import compile_kernel

    outcome, detail = OK, ""
    rank = {OK: 0, DIAGNOSTIC: 1, INTERNAL: 2, TRACEBACK: 3}
    try:
        module = sparsile.loads(text, name, path=None if home is None else Path(home) / name)
        kernels = list(module.kernels.values())
        if pick is not None and kernels:
            kernels = [kernels[pick % len(kernels)]]
        plans = [(k, compile_signature(k), t) for k in kernels for t in targets]
    except (Exception, RecursionError) as e:
        return _classify(e)
    for kernel, sig, target in plans:
        try:
            compile_kernel(kernel, sig, target=target, stop_after="ptx")
            got = (OK, "")
        except (Exception, RecursionError) as e:
            got = _classify(e)
        if rank[got[0]] > rank[outcome]:
            outcome, detail = got[0], f"{kernel.name} @ {target}: {got[1]}"
    return outcome, detail


def targets_for(filename: str) -> tuple[str, ...]:
    """The targets a shipped file's kernels are written for."""
    if "sm100" in filename:
        return ("sm_100a",)
    if "sm90" in filename:
        return ("sm_90a",)
    return ("sm_90a", "sm_100a")
