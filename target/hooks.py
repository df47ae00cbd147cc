"""The typed interface between a target's lowering and the passes before it.

A target whose instructions fix some layouts (wgmma and tcgen05 accumulators, mma fragments) gives
layout inference an *anchor*, and may *prepare* the function before code generation (tcgen05
reserves tensor memory). The lowering modules of the backend provide a :class:`TargetHooks` for
their target (``backend/lower/hooks.py`` chooses one per target); layout inference and the legality
pass (frontend) read it through this interface only, so the frontend never imports the backend.
See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: the facts layer imports nothing of the frontend at run time
    from ..frontend.ir.core import Function, Operation
    from ..frontend.layout.layouts import LinearLayout


class AnchorHook(Protocol):
    """The layouts the hardware imposes on an op's values: ``id(value) -> layout``."""

    def __call__(self, op: Operation, num_warps: int) -> dict[int, LinearLayout]: ...


PrepareHook = Callable[["Function", Any, int], "dict[str, Any] | None"]
"""``prepare(func, target, num_warps)``: rewrites ``func`` before layout inference and returns the
state code generation reads (or None)."""


@dataclass(frozen=True)
class TargetHooks:
    """What one target's lowering contributes before layout inference (both parts optional)."""

    anchor: AnchorHook | None = None
    prepare: PrepareHook | None = None


NO_HOOKS = TargetHooks()
"""The hooks of a target whose lowering fixes no layout (sm_80 scalar paths, the interpreter)."""
