"""Which lowering's :class:`~sparsile.target.hooks.TargetHooks` a target uses.

The hooks live beside the lowering that needs them (``hopper.HOOKS``, ``blackwell.HOOKS``,
``mma.HOOKS``); this module picks one by the target's features. The lowering modules are imported
here on demand, not at module level: each costs LLVM-side imports that a kernel for another target
never pays (tests/backend/test_codegen_registry.py checks this).
"""

from __future__ import annotations

from ...target.hooks import NO_HOOKS, TargetHooks
from ...target.targets import Feature, Target


def hooks_for(target: Target) -> TargetHooks:
    """The hooks of ``target``: wgmma (sm_90a) or tcgen05 (sm_100a) layouts, else none."""
    if target.has(Feature.WGMMA):
        from .hopper import HOOKS

        return HOOKS
    if target.has(Feature.TCGEN05):
        from .blackwell import HOOKS as BLACKWELL_HOOKS

        return BLACKWELL_HOOKS
    return NO_HOOKS
