"""Legality rules of programmatic dependent launch (``frontend/ops/grid_dependency.py``).

* ``griddepcontrol`` exists from sm_90 on (PTX ISA 9.7.13, "griddepcontrol"): ``pdl.wait()`` and
  ``pdl.launch_dependents()`` need ``Feature.GRID_DEPENDENCY`` (SP0602 at the op), and so does a
  kernel compiled with ``pdl=True`` (SP0602 at the kernel: the launch attribute needs sm_90 too);
* a kernel compiled with ``pdl=True`` calls ``pdl.wait()`` somewhere (SP0590): it may start while
  the previous kernel of the stream still runs, and without the wait every read of that kernel's
  output, and every write of memory it still reads, would race with it. (Where the wait must come
  is up to the kernel: before its first access to such memory. No rule can tell a constant weight,
  which may be read before the wait, from an activation, which may not.)
"""

from __future__ import annotations

from collections.abc import Iterator

from ...target.targets import Feature, feature_problem
from ..diagnostics import Diagnostic
from ..ir.core import Function
from .core import Context, function_rule, require_feature

SP_PDL_WITHOUT_WAIT = "SP0590"
"""A kernel compiled with ``pdl=True`` that never calls ``pdl.wait()``."""

require_feature("GRID_DEPENDENCY", "`{op}` (programmatic dependent launch)", "pdl.wait", "pdl.launch_dependents")


@function_rule()
def pdl_kernel_waits(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    if not func.attrs.get("pdl"):
        return
    d = feature_problem(ctx.target, Feature.GRID_DEPENDENCY, func.span, what="a kernel compiled with pdl=True")
    if d is not None:
        yield d
        return
    if not any(op.name == "pdl.wait" for op in func.walk()):  # nested regions (loops, branches, partitions) too
        yield Diagnostic(SP_PDL_WITHOUT_WAIT, f"`{func.name}` is compiled with pdl=True, so it may start before the "
                         "previous kernel in the stream has finished, but it never calls pdl.wait(): its reads of that "
                         "kernel's output would race with it", func.span,
                         help="call pdl.wait() before the kernel's first access to memory an earlier kernel writes "
                              "(loads of constant weights and barrier setup may come before it), or drop pdl=True")
