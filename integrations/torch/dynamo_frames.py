"""A function dynamo never compiles as a frame of its own, but traces where it inlines it.

``torch.compiler.disable`` marks a function for dynamo both ways: a frame of it is run eagerly, and a
call to it from a traced frame is a graph break (with ``fullgraph=True``, torch's "Skip calling
`torch.compiler.disable()`d function"). The custom ops' autograd formulas (autograd.py) want the first
and not the second: autograd's engine running their backward inside a torch.compile'd function with a
graph break hands its frame to dynamo, which stopped at its own AssertionError ("False != True") on
the backward's ctx instead of SP0922; compiled autograd (``torch._dynamo.compiled_autograd``) inlines
the backward into the compiled backward graph, where a graph break stopped ``fullgraph=True``.

:func:`skip_frames` sets the frame strategy of the function's code object, as dynamo's own
``skip_code`` does, with the frames it calls skipped too (as a recursive ``disable``): the eval-frame
callback runs such frames eagerly; dynamo's inlining does not read it. Where this torch lacks the
strategy (a private API), the function is disabled as before (graph breaks under compiled autograd).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def skip_frames(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its frames (and those they call) run eagerly when dynamo's frame callback meets them,
    still traced where dynamo inlines a call to it; or ``torch.compiler.disable(fn)`` where the frame
    strategy is missing (the function to use in its place: ``fn`` itself when the strategy is set)."""
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # (another torch: the old behaviour)
        return torch.compiler.disable(fn)
    set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    return fn
