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

The same where dynamo runs a node of its graph on fake tensors (:func:`in_fake_propagation`): a custom op's
fake implementation (the op called with arguments that do not fit), its vmap rule (an ensemble's weight
batched without its compressions), an autograd formula under torch.func (a frozen weight's gradient, forward
mode). There the error is raised in real Python, outside the code dynamo traces, and dynamo wrapped it in its
``TorchRuntimeError`` (the error's repr in the text, no ``__cause__``, also without ``fullgraph``). An error
built there to be kept, not raised (a refusal stored on a gradient's node), would stop the trace: such
code keeps the strings (``refused_grad.Refusal``) and builds the error when it raises it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from ...frontend.diagnostics import set_construction_hook

_BUILDING = threading.local()
"""``active`` while :func:`_built` builds an error: the hook returns (in dynamo's fake propagation,
:func:`in_fake_propagation`, it would otherwise stop the build it makes)."""


@torch.compiler.disable  # (its frames run eagerly: never a compiled copy of the error's __init__, see below)
def _built(error_type: type, code: str, message: str, help: str | None) -> Any:
    """The error, built outside dynamo: the hook sees no tracer (or this build) and returns."""
    _BUILDING.active = True
    try:
        return error_type(code, message, help=help)
    finally:
        _BUILDING.active = False


@torch.compiler.disable
def _raise(error: BaseException) -> None:
    """``raise error``, in a frame dynamo never compiles: after the graph break at :func:`_built`, dynamo
    compiles the rest of :func:`_stop_tracing` as a resume function, and torch 2.11's dynamo failed its own
    assertion (``exn_vt_stack.get_current_exception``) on a ``raise`` of a local there (a compiled
    ``torch.func.jvp`` through a frozen layer on a GPU) instead of raising the error."""
    raise error


def _stop_tracing(error_type: type, code: str, message: str, help: str | None) -> None:
    """Called for real with the error's type and strings, by dynamo while it traces (``assume_constant_result``):
    dynamo's ``Unsupported`` with the rendered error as its text and the error as its cause. Called by a frame
    that dynamo compiled and now runs (the rest of the error's construction after the graph break, outside
    any trace): the error itself, as the eager call raises it."""
    error = _built(error_type, code, message, help)
    if torch._guards.TracingContext.try_get() is None:  # (no trace: compiled code running)
        _raise(error)
    from torch._dynamo.exc import Unsupported

    raise Unsupported(error.render()) from error


_stop_tracing = torch.compiler.assume_constant_result(_stop_tracing)


def in_fake_propagation() -> bool:
    """Dynamo runs a node of the graph it builds on fake tensors (``torch._dynamo.utils.run_node``, which
    marks the node it runs: ``get_current_node``): a custom op's fake implementation, its vmap rule, an
    autograd formula of torch.func's transforms run there for real, outside the code dynamo traces
    (``is_dynamo_compiling`` is False). False where dynamo was never imported (nothing is compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    current = getattr(utils, "get_current_node", None)
    return current is not None and current() is not None


def _on_construction(error_type: type, code: str, message: str, help: str | None) -> None:
    """The construction hook: nothing outside dynamo (``is_dynamo_compiling`` is False in eager code,
    True where dynamo traces; :func:`in_fake_propagation` False), else :func:`_stop_tracing`."""
    if torch.compiler.is_dynamo_compiling() or (in_fake_propagation() and not getattr(_BUILDING, "active", False)):
        _stop_tracing(error_type, code, message, help)


def install() -> None:
    """Set the hook (``import sparsile.torch`` does)."""
    set_construction_hook(_on_construction)
