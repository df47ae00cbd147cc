"""The diagnostic for ``sparsile.NAME`` in a kernel where NAME is sparsile's Python API (the
``jit`` / ``kernel`` decorators, ``CompileError``, ``autotune``, ...) rather than a name of the
kernel language: the module has the attribute, so "no member" would be untrue."""

from __future__ import annotations

import sys

from ..diagnostics import Diagnostic
from ..spans import Span
from .builtins import ROOT
from .values import Namespace

DECORATORS = frozenset({"jit", "kernel"})


def python_api_member(base: Namespace, attr: str, span: Span) -> Diagnostic | None:
    """SP0204 at ``span`` if ``base`` is the ``sparsile`` namespace and ``attr`` is one of the
    Python module's public API names (``sparsile.__all__``) that the language does not have."""
    if base is not ROOT or attr in base.members:
        return None
    module = sys.modules.get(__name__.partition(".")[0])  # the package (sparsile), whatever path it came by
    if attr not in getattr(module, "__all__", ()):
        return None
    if attr in DECORATORS:
        help_ = f"`sparsile.{attr}` is the decorator that makes a kernel; it has no meaning inside one"
    else:
        help_ = "inside a kernel, `sparsile.` names the language's builtins, types and constants (docs/language.md)"
    return Diagnostic("SP0204", f"`sparsile.{attr}` is sparsile's Python API, not a name of the kernel language",
                      span, help=help_)
