"""The diagnostics of ``sparsile.jax`` (the SP093x codes of docs/diagnostics.md).

:class:`JaxCallError` is a :class:`~sparsile.stdlib.sparsity.SparsityError` (so a ``ValueError``)
with a code, a message and a help line; the message ends with the place in the user's program that
made the call (``(at model.py:12)``), since inside ``jax.jit`` the error is raised while tracing.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any

from ...stdlib.sparsity.errors import SparsityError

SP_JAX_MISSING = "SP0930"
"""``sparsile.jax`` was imported but JAX is not installed."""
SP_JAX_OUT_SHAPES = "SP0931"
"""``out_shapes`` that are not shape/dtype structs, name no parameter, or disagree with the kernel."""
SP_JAX_ARGUMENT = "SP0932"
"""A kernel argument of a kind the call cannot pass: a traced value for a scalar or constexpr
parameter (they are static), or something that is neither an array nor a number (a
``jax.ShapeDtypeStruct`` for an input); a traced ``split_k``, ``interpret`` or ``in_features`` of
``sparse_linear`` (or ``out_features`` of ``SparseLinear``) or ``interpret`` of ``call`` (static
options); ``constexprs`` that is no mapping; a traced weight for ``SparseLinear.from_dense`` (it
compresses on the host)."""
SP_JAX_WRITES_INPUT = "SP0933"
"""The kernel writes a parameter that is an input, not an output, or ``input_output_aliases`` is bad."""
SP_JAX_NO_AUTODIFF = "SP0934"
"""Differentiation (``jax.grad``, ``jax.jvp``, ``jax.vjp``) through a sparsile call."""
SP_JAX_NO_VMAP = "SP0935"
"""``jax.vmap`` over ``sparsile.jax.call`` (it has no batching rule; ``sparse_linear`` has its own)."""
SP_JAX_RUNTIME = "SP0936"
"""The FFI handler failed while XLA ran the program (no CUDA stream, a launch error)."""
SP_JAX_TOO_OLD = "SP0937"
"""``sparsile.jax`` was imported with a JAX older than the oldest one it supports (requires.py)."""
SP_JAX_LINEAR_INPUT = "SP0938"
"""``sparse_linear`` inputs that do not fit together: x, values, meta or bias of the wrong rank,
shape or element type."""
SP_JAX_ROW_SHARD = "SP0939"
"""A ``SparseLinear`` whose values hold a part of its ``out_features`` rows (a shard of its output
features, inside ``shard_map`` or ``pmap``) that is not whole 16-row blocks of the sm90 metadata
words, or more rows than ``out_features`` (shards.py)."""

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../integrations
_PACKAGE = os.path.dirname(_HERE)


_ROOT = __name__.partition(".")[0]  # the package's import name ("sparsile")
_LIBRARIES = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"],
                                                          sysconfig.get_paths()["platstdlib"]})


def caller_location() -> str:
    """``file:line`` of the innermost frame outside sparsile, jax and Python's standard library
    (the user's call), or "". A frame of code Python generated for a sparsile module (the
    ``__init__`` that dataclasses writes for ``SparseLinear``, file ``<string>``) is sparsile's."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        path = os.path.abspath(name)
        inside = path.startswith(_PACKAGE + os.sep) and os.sep + "tests" + os.sep not in path[len(_PACKAGE):]
        library = path.startswith(_LIBRARIES) and "site-packages" not in path
        if not (inside or library or f"{os.sep}jax{os.sep}" in path or f"{os.sep}jaxlib{os.sep}" in path
                or name.startswith("<frozen") or _generated_for_sparsile(frame)):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _generated_for_sparsile(frame: Any) -> bool:
    """Whether ``frame`` runs code generated at run time (file ``<string>``: exec) in the globals of
    a sparsile module outside its tests, as dataclasses does for a class's ``__init__``."""
    module = frame.f_globals.get("__name__", "")
    return frame.f_code.co_filename == "<string>" and isinstance(module, str) and \
        module.startswith(_ROOT + ".") and ".tests." not in f"{module}."


class JaxCallError(SparsityError):
    """A user-facing error of ``sparsile.jax``: ``code`` (SP093x), ``message`` (with the caller's
    location) and ``help``."""

    def __init__(self, code: str, message: str, help: str | None = None, *, located: bool = True):
        where = caller_location() if located else ""
        super().__init__(code, f"{message} (at {where})" if where else message, help)
