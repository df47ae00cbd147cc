"""Run-time values of the interpreter.

Scalars and tiles are numpy arrays (0-d for scalars) of the host dtype of their element type
(``ml_dtypes`` for bf16 and 8-bit floats). Pointers are :class:`PtrVal`: a buffer plus element
offsets, so that every load and store is bounds-checked against the buffer the pointer came from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..diagnostics import Diagnostic, SparsileError
from ..spans import UNKNOWN_SPAN, Span

# The codes of the interpreter's run-time faults (docs/diagnostics.md, SP078x).
OUT_OF_BOUNDS = "SP0780"      # a load, store or index outside its buffer, shared buffer, TMEM or mbarriers
ASSERTION_FAILED = "SP0781"   # a device `assert` was false
DEADLOCK = "SP0782"           # waits that can never complete (mbarriers, cluster.sync)
ANOTHER_FAILED = "SP0783"     # a thread stopped because another partition or CTA failed first
BUDGET_EXCEEDED = "SP0784"    # more operations than ``max_ops``
CLUSTER_ACCESS = "SP0785"     # a cluster operation on a CTA, buffer or mbarrier it cannot reach
BAD_OPERAND_DATA = "SP0786"   # sparse metadata or block scales the MMA cannot decode
GRID_NOT_CLUSTERS = "SP0787"  # the grid is no whole number of clusters
UNSUPPORTED = "SP0788"        # a program the interpreter cannot represent
TMA_BOX_START = "SP0789"      # a TMA box whose innermost start is not a 16-byte multiple (faults on the H200)
INT_OVERFLOW = "SP0790"       # a signed `//` or `%` of the type's minimum by -1 (undefined on the GPU)
TMEM_RACE = "SP0791"          # an access racing with an asynchronous tcgen05.mma / cp (interp/tcgen05_async.py)
ZERO_STEP = "SP0792"          # a run-time `range` loop whose step is 0 (Python refuses it; the GPU never advances)


class InterpreterError(SparsileError):
    """A run-time fault found by the interpreter (out-of-bounds access, failed assert, deadlock):
    a :class:`SparsileError` with a ``code`` (SP078x), the ``message``, the ``span`` of the op
    being interpreted, the ``program`` (CTA index) that faulted, and an optional ``help`` line.

    ``str()`` is ``error[CODE]: file:line:col: message (program (x, y, z))`` and the help line.
    """

    def __init__(self, code: str, message: str, span: Span | None = None,
                 program: tuple[int, ...] | None = None, help: str | None = None):
        self.program = program
        super().__init__(code, message, help, UNKNOWN_SPAN if span is None else span)

    def render(self) -> str:
        """``error[CODE]: where: message (program ...)`` and the help line."""
        where = f"{self.span}: " if self.span.line > 0 else ""
        prog = f" (program {self.program})" if self.program is not None else ""
        text = f"error[{self.code}]: {where}{self.message}{prog}"
        if self.help:
            text += f"\n = help: {self.help}"
        return text

    def to_diagnostic(self, span: Span | None = None) -> Diagnostic:
        """This error as a diagnostic at ``span`` (by default its own), naming the program."""
        notes = (f"in program {self.program}",) if self.program is not None else ()
        return Diagnostic(self.code, self.message, self.span if span is None else span, help=self.help,
                          notes=notes)


@dataclass(eq=False)
class Buffer:
    """A kernel argument's memory: a flat host array that loads and stores index."""

    name: str
    data: np.ndarray  # 1-D view


@dataclass(eq=False)
class PtrVal:
    """A pointer (``off`` 0-d) or a tile of pointers into ``buf``; offsets are in elements."""

    buf: Buffer
    off: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.off.shape


@dataclass(eq=False)
class TensorVal:
    """A global tensor argument: a buffer viewed with a shape and element strides."""

    buf: Buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    tma_checked: bool = False  # its layout passed the TMA rules (ops/memory.py, at its first TMA copy)
    # the byte strides of the array the caller passed (the interpreter may read a dense copy of a
    # strided view; a GPU launch maps the view itself): what the TMA rules are checked against
    caller_strides: tuple[int, ...] | None = None


def shared_condition(ctx: Any) -> threading.Condition:
    """The condition variable of a program's shared state (``ctx.shared["_cond"]``): the lock the
    interpreter's threads (warp_specialize partitions, the CTAs of a cluster) hold to touch mbarriers
    and other shared state, and wait on."""
    c = ctx.shared.get("_cond")
    if c is None:
        c = ctx.shared.setdefault("_cond", threading.Condition())
    return c
