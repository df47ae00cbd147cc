"""Programmatic dependent launch (sm_90+): the namespace ``pdl`` (PTX ISA 9.7.13, parallel
synchronization instructions, ``griddepcontrol``; docs/language.md, "Programmatic dependent launch").

A kernel launched with ``pdl=True`` (a kernel option, ``backend/runtime/launcher.py``) may start
while the kernel before it in the stream is still running: its CTAs are scheduled, and what it
does before ``pdl.wait()`` overlaps the previous kernel's tail.

* ``pdl.wait()`` — ``griddepcontrol.wait``: the thread waits until every prerequisite grid has
  completed and its memory operations are performed and visible to this grid. A kernel must call
  it before it reads anything an earlier kernel writes, and before it writes anything an earlier
  kernel may still read. Before it, a kernel may only touch memory no earlier kernel in the stream
  is writing (a model's constant weights, say), initialize barriers and shared memory. Launched
  without ``pdl=True`` it returns at once.
* ``pdl.launch_dependents()`` — ``griddepcontrol.launch_dependents``: the next kernel in the
  stream, if it is launched with ``pdl=True``, may be scheduled once every CTA of this grid has
  called it or exited. It orders no memory (the dependent's ``pdl.wait()`` does). Without it the
  dependent is scheduled when this grid's CTAs have exited. Repeated calls by a CTA's threads
  have no further effect.

The interpreter runs one grid at a time, so both are no-ops there. The rule that a kernel launched
with ``pdl=True`` calls ``pdl.wait()`` is ``frontend/legality/grid_dependency.py``; the lowering,
inline asm with a memory clobber so that no load or store moves across it, is
``backend/lower/grid_dependency.py``.
"""

from __future__ import annotations

from typing import Any

from ..ir.core import Operation
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from .opdefs import NO_LAYOUT_RULE, TYPED_BY_SEMA, define_op

pdl_wait_op = define_op("pdl.wait", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                        doc="griddepcontrol.wait: wait for the prerequisite grids and their memory.")
pdl_launch_op = define_op("pdl.launch_dependents", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                          doc="griddepcontrol.launch_dependents: let the dependent grid be scheduled.")


@builtin("wait", ns="pdl")
def pdl_wait(em: Emitter) -> None:
    """Wait until the kernels this one depends on (launched before it, with ``pdl=True``) have
    completed and their writes are visible (``griddepcontrol.wait``)."""
    em.create("pdl.wait", [], [])
    return None


@builtin("launch_dependents", ns="pdl")
def pdl_launch_dependents(em: Emitter) -> None:
    """Let the next kernel of the stream, launched with ``pdl=True``, start before this one ends
    (``griddepcontrol.launch_dependents``)."""
    em.create("pdl.launch_dependents", [], [])
    return None


@pdl_wait_op.interpreter
def _i_wait(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return []  # the interpreter runs one grid at a time: the previous one has completed


@pdl_launch_op.interpreter
def _i_launch_dependents(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return []
