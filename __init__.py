"""sparsile: a Triton-style kernel language for structured-sparse matrix multiply on NVIDIA tensor cores.

The public API::

    import sparsile as sp

    @sp.jit
    def add(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        sp.store(out + offs, sp.load(x + offs, mask=mask) + sp.load(y + offs, mask=mask), mask=mask)

    add.interpret[(4,)](x, y, out, 1000, BLOCK=256)      # numpy interpreter, no GPU needed
    add[(4,)](x, y, out, 1000, BLOCK=256)                # on the GPU
    module = sp.load("kernels.spk")                      # a module of kernels from a .spk file

Every builtin, dtype and namespace of the language is an attribute (``sp.program_id``, ``sp.f16``,
``sp.ptr``, ``sp.constexpr``, ...). Builtins only mean something inside a kernel; called from plain
Python they raise. ``sp.load`` is two things: called from Python it reads a ``.spk`` file, used
inside a kernel it is the memory ``load`` builtin.

Importing sparsile registers every op of the language and stays light: the LLVM and CUDA backends
are imported only when something is compiled or launched.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from .driver.autotune import Autotuner, Config, autotune
from .driver.host import next_power_of_2
from .driver.kernel import Kernel
from .driver.module import KernelModule, jit, load, loads
from .frontend.diagnostics import CompileError, Diagnostic, InternalError, LaunchError, SparsileError
from .frontend.interp.values import InterpreterError
from .frontend.ops import opdefs as _opdefs
from .frontend.sema import type_ctors as _type_ctors  # registers `ptr[...]` and `tensor[...]`
from .frontend.sema.builtins import ROOT as _ROOT
from .frontend.sema.values import Const as _Const
from .version import __version__ as __version__

_opdefs.load_all_ops()
del _type_ctors

kernel = jit  # `@sparsile.kernel` reads like the `@kernel` of .spk files


def tune(shapes: Any, **kwargs: Any) -> Any:
    """Pre-tune the shipped sparse GEMM for ``shapes`` and return (and optionally write) its table:
    :func:`sparsile.stdlib.kernels.tuning.tune_sparse_matmul` (docs/autotune.md)."""
    from .stdlib.kernels.tuning import tune_sparse_matmul

    return tune_sparse_matmul(shapes, **kwargs)

_NOT_HERE = {"heuristics": "compute the value in Python and pass it as a constexpr argument "
                           "(`kernel[grid](..., EVEN_N=n % BLOCK == 0)`), or use `sparsile.autotune`"}
"""Host-side Triton names sparsile does not have -> what to do instead (docs/language.md, "Coming from Triton")."""

__all__ = ["Autotuner", "CompileError", "Config", "Diagnostic", "InternalError", "InterpreterError", "Kernel",
           "KernelModule", "LaunchError", "SparsileError", "autotune", "jit", "kernel", "load", "loads",
           "next_power_of_2", "tune"]
_API = frozenset(__all__)
# Language names that would shadow Python builtins under `from sparsile import *` stay attributes only.
_NOT_STARRED = frozenset({"max", "min", "sum", "abs", "bool", "load"})


def _language_value(member: Any) -> Any:
    return member.value if isinstance(member, _Const) else member


def _export_language() -> list[str]:
    """Put every member of the language's root namespace on this module (API names win)."""
    names = []
    for name, member in _ROOT.members.items():
        if name in _API or name.startswith("_"):
            continue
        globals()[name] = _language_value(member)
        names.append(name)
    return names


_LANGUAGE_NAMES = _export_language()

__all__ += sorted(n for n in _LANGUAGE_NAMES if n not in _NOT_STARRED)


def __getattr__(name: str) -> Any:
    """Language names registered after import (an op module loaded later) resolve here too, and
    ``sparsile.torch`` is imported on first use."""
    if name in _ALIASES:
        try:
            return importlib.import_module(f"sparsile.{name}")
        except ImportError as exc:  # SP0900, SP0908, SP0930, SP0937: hasattr(sparsile, "torch") is then False
            if getattr(exc, "code", None) not in ("SP0900", "SP0908", "SP0930", "SP0937"):
                raise
            raise AttributeError(str(exc)) from exc
    member = _ROOT.members.get(name)
    if member is None:
        hint = f": {_NOT_HERE[name]}" if name in _NOT_HERE else ""
        raise AttributeError(f"module 'sparsile' has no attribute {name!r}{hint}")
    return _language_value(member)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ROOT.members))


# ``sparsile.torch`` and ``sparsile.jax`` live in integrations/: a folder named torch (jax) at the package root would
# shadow the library itself when the checkout is on sys.path. The finder below makes ``import
# sparsile.torch`` give that module without importing torch (jax) before it is asked for.
_ALIASES = {"torch": "sparsile.integrations.torch", "jax": "sparsile.integrations.jax"}


class _AliasLoader:
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        try:
            real = importlib.import_module(self.target)
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            from .install_hints import torch_install_hint
            from .integrations.torch_version import TORCH_REQUIREMENT

            error = ModuleNotFoundError(
                "error[SP0900]: sparsile.torch needs PyTorch, which is not installed\n"
                f" = help: {torch_install_hint(TORCH_REQUIREMENT)}", name="torch")
            error.code, error.message = "SP0900", "sparsile.torch needs PyTorch, which is not installed"
            raise error from exc
        sys.modules[module.__name__] = real  # the import system returns what sys.modules holds


class _AliasFinder:
    """Finds ``sparsile.<alias>`` for the names of ``_ALIASES``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        head, _, name = fullname.partition(".")
        if head != "sparsile" or name not in _ALIASES:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _AliasLoader(_ALIASES[name]))


if not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path):
    sys.meta_path.append(_AliasFinder())
