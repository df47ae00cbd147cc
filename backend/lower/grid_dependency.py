"""Lowering of the programmatic-dependent-launch ops (``frontend/ops/grid_dependency.py``), sm_90+.

* ``pdl.wait`` -> ``griddepcontrol.wait;`` (PTX ISA 9.7.13, "griddepcontrol");
* ``pdl.launch_dependents`` -> ``griddepcontrol.launch_dependents;``.

Both are inline asm with side effects and a memory clobber, executed by every thread that reaches
them. LLVM 22 has intrinsics for them, but declares them as touching no memory, so a load after
the wait could legally be hoisted above it; the clobber forbids that. Inline asm is gated here
(``targets.require``): LLVM does not check it.
"""

from __future__ import annotations

from ...frontend.ir.core import Operation
from ...target.targets import Feature, require
from .codegen import CodeGen, lowering


@lowering("pdl.wait")
def lower_pdl_wait(cg: CodeGen, op: Operation) -> None:
    require(cg.target, Feature.GRID_DEPENDENCY, op.span, what="`pdl.wait()`")
    cg.asm("void", "griddepcontrol.wait;", "~{memory}", [], side_effect=True)


@lowering("pdl.launch_dependents")
def lower_pdl_launch_dependents(cg: CodeGen, op: Operation) -> None:
    require(cg.target, Feature.GRID_DEPENDENCY, op.span, what="`pdl.launch_dependents()`")
    cg.asm("void", "griddepcontrol.launch_dependents;", "~{memory}", [], side_effect=True)
