"""The typed interface between a target's lowering and the passes before it.

A target whose instructions fix some layouts (wgmma and tcgen05 accumulators, mma fragments) gives
layout inference an *anchor*, and may *prepare* the function before code generation (tcgen05
reserves tensor memory), handing code generation a :class:`PreparedState`. The lowering modules of
the backend provide a :class:`TargetHooks` for their target (``backend/lower/hooks.py`` chooses one
per target); layout inference and the legality pass (frontend) read it through this interface only,
so the frontend never imports the backend. See docs/architecture.md.
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


@dataclass(frozen=True)
class PreparedState:
    """What a target's prepare hook hands on: ``run_passes`` (driver/compiler.py) returns it and
    ``generate_llvm`` keeps it as ``CodeGen.prepared``. A target without a prepare hook, or whose
    hook prepared nothing, gets the defaults."""

    tmem_ncols: int = 0
    """The tensor-memory columns of the kernel-wide allocation the tcgen05 prepare hook inserted
    (``blackwell.prepare``: the ``tmem.init`` op it puts at the start of the kernel carries the same
    count, and its lowering reads it there); 0 when the kernel uses no tensor memory, or on targets
    without tcgen05."""


PrepareHook = Callable[["Function", Any, int], "PreparedState | None"]
"""``prepare(func, target, num_warps)``: rewrites ``func`` before layout inference and returns what
it hands to code generation (None: nothing, the same as ``PreparedState()``)."""


@dataclass(frozen=True)
class TargetHooks:
    """What one target's lowering contributes before layout inference (both parts optional)."""

    anchor: AnchorHook | None = None
    prepare: PrepareHook | None = None


NO_HOOKS = TargetHooks()
"""The hooks of a target whose lowering fixes no layout (sm_80 scalar paths, the interpreter)."""
