"""Whole-program assembly for kernels that reallocate registers (``setmaxnreg``).

nvJitLink compiles PTX as a relocatable unit (ptxas ``--compile-only``), and there ptxas ignores
``setmaxnreg`` (info C7504): the register budgets of ``warp_specialize(partition(..., regs=N))``
would silently not happen. No nvJitLink option changes that (docs/hopper.md, "Limits"). ptxas in
whole-program mode keeps them, given the entry's register count (``.maxntid`` with
``.minnctapersm``, which the ``warp_specialize`` lowering emits).

So a PTX that contains ``setmaxnreg`` is assembled by a whole-program ptxas when one is configured,
and otherwise by nvJitLink with a warning (``SP0612``). The ptxas used is, in order:

* ``SPARSILE_PTXAS=/path/to/ptxas`` (``SPARSILE_PTXAS=0``: none, always nvJitLink);
* the ptxas of the PyPI wheel ``nvidia-cuda-nvcc`` (the ``[ptxas]`` extra: ``pip install -e '.[ptxas]'`` in
  the checkout), which keeps the install pip-only.

A ptxas on PATH is not picked up by itself: which assembler built a kernel must not depend on what
happens to be installed. The compile cache keys on :func:`identity`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings
from pathlib import Path

from ...frontend.diagnostics import CompileError, Diagnostic
from ...install_hints import install_hint
from ...target.targets import Target

ENV_PTXAS = "SPARSILE_PTXAS"
SP_REGISTER_BUDGETS_DROPPED = "SP0612"
SP_BAD_PTXAS = "SP0613"
SETMAXNREG = "setmaxnreg."
"""The PTX instruction whose presence sends a kernel to the whole-program assembler."""
PTXAS_REQUIREMENT = "nvidia-cuda-nvcc>=13.0"
"""The wheel whose ptxas is picked up (pyproject's ``ptxas`` extra)."""


class RegisterBudgetWarning(UserWarning):
    """A kernel's ``setmaxnreg`` register budgets were dropped (assembled by nvJitLink)."""


def _wheel_ptxas() -> str | None:
    """The ptxas of the ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin/ptxas``, or the CUDA 12
    layout ``nvidia/cuda_nvcc/bin/ptxas``), found without importing anything."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for rel in ("cu13/bin/ptxas", "cuda_nvcc/bin/ptxas"):
            path = Path(root) / rel
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def whole_program_ptxas() -> str | None:
    """The ptxas that assembles ``setmaxnreg`` kernels, or None (see the module docstring)."""
    chosen = os.environ.get(ENV_PTXAS)
    if chosen is not None:
        if chosen in ("", "0"):
            return None
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise CompileError([Diagnostic(
                SP_BAD_PTXAS, f"{ENV_PTXAS}={chosen} is not an executable ptxas",
                help=f"point {ENV_PTXAS} at a ptxas binary, or set {ENV_PTXAS}=0 to assemble with nvJitLink")])
        return chosen
    return _wheel_ptxas()


def identity() -> str:
    """Which whole-program ptxas compiles would use (path, size, mtime), for the cache key."""
    try:
        path = whole_program_ptxas()
    except CompileError:
        return "invalid"
    if path is None:
        return "none"
    stat = os.stat(path)
    return f"{path} {stat.st_size} {stat.st_mtime_ns}"


def needs_whole_program(ptx: str) -> bool:
    return SETMAXNREG in ptx


def assemble(ptx: str, target: Target, ptxas: str, *, opt_level: int = 3, name: str = "kernel.ptx",
             timeout: float = 300) -> tuple[bytes, str]:
    """(cubin, ptxas's report) of ``ptx`` assembled by ``ptxas`` in whole-program mode; a rejected
    PTX is ``SP0610`` with ptxas's messages as notes."""
    with tempfile.TemporaryDirectory(prefix="sparsile-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        cmd = [ptxas, f"-arch={target.arch_option}", f"-O{opt_level}", "-v", str(src), "-o", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError([Diagnostic("SP0610", f"ptxas ({ptxas}) could not assemble {name}: {exc}",
                                           help=f"set {ENV_PTXAS}=0 to assemble with nvJitLink")]) from None
        log = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or not out.is_file():
            notes = tuple(line for line in log.splitlines() if line.strip()) or ("(no output)",)
            raise CompileError([Diagnostic(
                "SP0610", f"ptxas ({ptxas}) could not turn {name} into a cubin for {target.name}", notes=notes,
                help="this is most likely a sparsile code-generation bug; please report it with the kernel and "
                     f"this log (or set {ENV_PTXAS}=0 to try nvJitLink)")])
        return out.read_bytes(), log


def warn_budgets_dropped(name: str) -> None:
    """The warning for a ``setmaxnreg`` kernel assembled by nvJitLink."""
    warnings.warn(
        f"warning[{SP_REGISTER_BUDGETS_DROPPED}]: {name}: the register budgets of warp_specialize "
        "(partition(..., regs=N), PTX setmaxnreg) are dropped: nvJitLink assembles relocatable code, where "
        "ptxas ignores setmaxnreg; the kernel runs with the budget of its launch instead. "
        f"help: {install_hint('ptxas', PTXAS_REQUIREMENT)}, whose ptxas assembles it whole-program (or set "
        f"{ENV_PTXAS}=/path/to/ptxas)",
        RegisterBudgetWarning, stacklevel=2)


__all__ = ["ENV_PTXAS", "PTXAS_REQUIREMENT", "SETMAXNREG", "SP_BAD_PTXAS", "SP_REGISTER_BUDGETS_DROPPED",
           "RegisterBudgetWarning", "assemble", "identity", "needs_whole_program", "warn_budgets_dropped",
           "whole_program_ptxas"]
