"""sparsile's errors under torch.compile: the code, message and help of a diagnostic raised in a traced forward.

Dynamo (torch.compile's tracer) follows the Python of a forward. A layer's check that fails (x of another
in_features, a buffer on another device: SP0901) raises a :class:`~sparsile.frontend.diagnostics.SparsileError`,
which dynamo cannot build: it stopped at its own error about the error's ``Span`` ("SourcelessBuilder ...
Span"), an ``Unsupported`` graph break. Without ``fullgraph`` it ran the frame eagerly and the user got our
error; with ``fullgraph=True`` (or ``torch.export``'s strict tracer) only dynamo's, whose text had none of ours.

:func:`install` sets a construction hook (``diagnostics.set_construction_hook``): while dynamo traces, the
error is built for real at trace time (:func:`_stop_tracing`, a function dynamo calls instead of tracing:
``assume_constant_result`` with the error's type and strings), and dynamo is stopped with an ``Unsupported``
whose text is the rendered error (``error[SP0901]: ...`` and its help) and whose ``__cause__`` is the error
itself. Without ``fullgraph`` that is the graph break it was: the frame runs eagerly and raises the error
itself, as before. With ``fullgraph=True`` the user catches dynamo's ``Unsupported``: ``str(e)`` holds the
code, message and help, ``e.__cause__`` is the ``IntegrationError``. The eager path is not touched (the hook
runs only when an error is built, and returns at once outside dynamo).
"""

from __future__ import annotations

from typing import Any

import torch

from ...frontend.diagnostics import set_construction_hook


@torch.compiler.disable  # (its frames run eagerly: never a compiled copy of the error's __init__, see below)
def _built(error_type: type, code: str, message: str, help: str | None) -> Any:
    """The error, built outside dynamo: the hook sees no tracer and returns."""
    return error_type(code, message, help=help)


def _stop_tracing(error_type: type, code: str, message: str, help: str | None) -> None:
    """Called for real with the error's type and strings, by dynamo while it traces (``assume_constant_result``):
    dynamo's ``Unsupported`` with the rendered error as its text and the error as its cause. Called by a frame
    that dynamo compiled and now runs (the rest of the error's construction after the graph break, outside
    any trace): the error itself, as the eager call raises it."""
    error = _built(error_type, code, message, help)
    if torch._guards.TracingContext.try_get() is None:  # (no trace: compiled code running)
        raise error
    from torch._dynamo.exc import Unsupported

    raise Unsupported(error.render()) from error


_stop_tracing = torch.compiler.assume_constant_result(_stop_tracing)


def _on_construction(error_type: type, code: str, message: str, help: str | None) -> None:
    """The construction hook: nothing outside dynamo (``is_dynamo_compiling`` is False in eager code,
    True where dynamo traces), else :func:`_stop_tracing`."""
    if torch.compiler.is_dynamo_compiling():
        _stop_tracing(error_type, code, message, help)


def install() -> None:
    """Set the hook (``import sparsile.torch`` does)."""
    set_construction_hook(_on_construction)
