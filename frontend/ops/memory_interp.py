"""Interpreter semantics of the explicit memory ops of ``memory.py`` (whose docstring gives them, with
the PTX ISA sections): shared-memory buffers as numpy arrays shared by the program's partitions,
mbarriers with phases, expected bytes and deadlock detection (PTX ISA 9.7.13.15), and TMA copies
with the tensor-map and box-start rules the GPU enforces (PTX ISA 9.7.9.25; ``docs/hardware.md``
§5.4, ``target/tma_layout.py``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ...target.tma_layout import TENSOR_MAP, global_layout_problems
from ..interp import tcgen05_async as race
from ..interp.values import (
    ANOTHER_FAILED,
    DEADLOCK,
    OUT_OF_BOUNDS,
    TMA_BOX_START,
    InterpreterError,
    TensorVal,
    shared_condition,
)
from ..ir import types as T
from ..ir.core import Operation
from .memory import (
    barrier_op,
    fence_async,
    mbar_alloc,
    mbar_arrive,
    mbar_expect,
    mbar_index,
    mbar_wait,
    smem_alloc,
    smem_index,
    smem_load,
    smem_slice,
    smem_store,
    tma_load,
    tma_store,
    tma_store_wait,
)
from .tensor import box_offsets


class Mbarrier:
    """An mbarrier: a phase completes when its arrivals and expected bytes are all in."""

    def __init__(self, arrivals: int, cond: threading.Condition):
        self.expected = arrivals
        self.pending = arrivals
        self.tx = 0
        self.phase = 0
        self.completed = 0  # phases completed so far (the phase in progress has this index)
        self.cond = cond

    def _maybe_complete(self) -> None:
        if self.pending <= 0 and self.tx <= 0:
            self.phase ^= 1
            self.completed += 1
            self.pending = self.expected
            self.tx = 0
            self.cond.notify_all()

    def arrive(self, tx: int = 0) -> None:
        with self.cond:
            self.tx += tx
            self.pending -= 1
            self._maybe_complete()

    def complete_tx(self, nbytes: int) -> None:
        with self.cond:
            self.tx -= nbytes
            self._maybe_complete()

    def done(self, parity: int) -> bool:
        """The phase of parity ``parity`` has completed: the current phase differs from it."""
        return self.phase != (parity & 1)

    def wait(self, parity: int, ctx: Any, op: Operation) -> int:
        """Block until the phase of parity ``parity`` completed; return the number of phases completed
        when the wait saw it (what the thread observed: ``interp/tcgen05_async.py``). Every arrival in
        the interpreter is made by a running partition thread (TMA and tcgen05 complete when issued), so when every
        live partition of the program waits and no wait can complete, none ever will: that is
        reported at once as a deadlock (:func:`deadlocked`); a 20 s timeout stays as a backstop."""
        with self.cond:
            waiters: dict[int, tuple[Mbarrier, int, Operation]] = ctx.shared.setdefault("_waiters", {})
            me = threading.get_ident()
            waiters[me] = (self, parity, op)
            try:
                while not self.done(parity):
                    if ctx.shared.get("_abort"):
                        raise InterpreterError(ANOTHER_FAILED, "another partition failed", op.span, ctx.program_id)
                    stuck = deadlocked(ctx)
                    if stuck:
                        raise InterpreterError(DEADLOCK, stuck, op.span, ctx.program_id)
                    if not self.cond.wait(timeout=20.0) and not self.done(parity):
                        raise InterpreterError(DEADLOCK,
                                               f"deadlock: an mbarrier wait for phase parity {parity & 1} never "
                                               "completed", op.span, ctx.program_id)
                return self.completed
            finally:
                del waiters[me]


def deadlocked(ctx: Any) -> str | None:
    """A message when every live partition thread of the program (``ctx.shared["_live"]``, 1
    outside ``warp_specialize``) — of every running CTA of its cluster in a cluster kernel — waits
    on an mbarrier whose phase has not completed, else None.
    Call it holding the program's condition."""
    cluster = ctx.shared.get("_cluster")
    in_cluster_sync = 0
    if cluster is None:
        shareds = [ctx.shared]
    else:  # CTAs of a cluster arrive on each other's barriers: count the whole cluster (one condition);
        # a CTA blocked in cluster.sync() waits too (it is released only when every CTA reaches it)
        run = cluster[0]
        shareds = [sh for rank, sh in enumerate(run.shared) if rank not in run.exited]
        in_cluster_sync = run.arrived
    waiters = {k: v for sh in shareds for k, v in sh.get("_waiters", {}).items()}
    live = sum(sh.get("_live", 1) for sh in shareds)
    if not waiters or len(waiters) + in_cluster_sync < live or \
            any(bar.done(parity) for bar, parity, _ in waiters.values()):
        return None
    waits = sorted(f"line {op.span.line} (parity {parity & 1})" if op.span is not None else f"parity {parity & 1}"
                   for _, parity, op in waiters.values())
    return (f"deadlock: every partition waits on an mbarrier that no one will arrive on ({'; '.join(waits)}); "
            "an arrival (mbarrier.arrive / expect, tcgen05.commit) is missing or a phase parity is wrong")


@smem_alloc.interpreter
def _i_smem_alloc(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    key = ("smem", id(op))
    if key not in ctx.shared:
        t = op.result.type
        ctx.shared[key] = np.zeros(t.shape, T.numpy_dtype(t.elem if t.elem != T.tf32 else T.f32))
    return [ctx.shared[key]]


@smem_index.interpreter
def _i_smem_index(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    buf, i = args
    if not 0 <= int(i) < buf.shape[0]:
        raise InterpreterError(OUT_OF_BOUNDS,
                               f"shared buffer index {int(i)} is out of range [0, {buf.shape[0]})", op.span,
                               ctx.program_id)
    return [buf[int(i)]]


@smem_slice.interpreter
def _i_smem_slice(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    buf, start = args
    d, n = op.attrs["dim"], op.attrs["size"]
    s = int(start)
    if not 0 <= s <= buf.shape[d] - n:
        raise InterpreterError(OUT_OF_BOUNDS,
                               f"slice [{s}, {s + n}) of dimension {d} is outside a buffer of {buf.shape[d]}",
                               op.span, ctx.program_id)
    idx = tuple(slice(s, s + n) if i == d else slice(None) for i in range(buf.ndim))
    return [buf[idx]]


@smem_load.interpreter
def _i_smem_load(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.array(args[0], copy=True)]


@smem_store.interpreter
def _i_smem_store(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    race.check(ctx, op, args[0], "smem store", write=True, tcgen05=False, pipelined=False)
    args[0][...] = args[1]
    return []


@mbar_alloc.interpreter
def _i_mbar_alloc(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    key = ("mbar", id(op))
    if key not in ctx.shared:
        cond = shared_condition(ctx)
        ctx.shared[key] = [Mbarrier(op.attrs["arrivals"], cond) for _ in range(op.attrs["count"])]
    return [ctx.shared[key]]


@mbar_index.interpreter
def _i_mbar_index(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    bars, i = args
    if not 0 <= int(i) < len(bars):
        raise InterpreterError(OUT_OF_BOUNDS,
                               f"barrier index {int(i)} is out of range [0, {len(bars)})", op.span, ctx.program_id)
    return [[bars[int(i)]]]


@mbar_expect.interpreter
def _i_mbar_expect(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    args[0][0].arrive(int(args[1]))
    return []


@mbar_arrive.interpreter
def _i_mbar_arrive(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    warps = getattr(ctx, "warps", 4)
    times = {"warpgroup": max(1, warps // 4), "warp": warps}.get(op.attrs.get("per"), 1)
    bars = [args[0][0]]
    if op.attrs.get("multicast"):
        from .cluster import mask_ranks, peer_barrier

        bars = [peer_barrier(ctx, op, args[0][0], r, "mbarrier.arrive")
                for r in mask_ranks(ctx, op, int(args[1]), "mbarrier.arrive")]
    for bar in bars:
        for _ in range(times):
            bar.arrive()
    return []


@mbar_wait.interpreter
def _i_mbar_wait(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    bar = args[0][0]
    race.waited(ctx, op, bar, bar.wait(int(args[1]), ctx, op))
    return []


def tma_layout_check(ctx: Any, op: Operation, t: TensorVal) -> None:
    """A tensor whose layout no TMA map can describe (a row not a multiple of 16 bytes, an empty
    dimension: target/tma_layout.py) is SP0714 at its first TMA copy, located there; a GPU launch,
    which encodes the map, reports the same rule (backend/runtime/tensormap.py). Once per tensor."""
    if t.tma_checked:
        return
    strides = t.caller_strides or tuple(s * t.buf.data.itemsize for s in t.strides)
    problems = global_layout_problems(t.shape, strides) if t.shape else []
    if problems:
        raise InterpreterError(TENSOR_MAP, f"the tensor map of argument `{t.buf.name}` is invalid: "
                               + "; ".join(problems), op.span, ctx.program_id,
                               help="TMA reads rows that start on 16-byte boundaries: pad the last dimension "
                                    "(e.g. to a multiple of 8 halves); docs/hardware.md §5.4")
    t.tma_checked = True


def tma_box_start_check(ctx: Any, op: Operation, t: TensorVal, offsets: list[int]) -> None:
    """A box whose innermost start coordinate is not a 16-byte multiple of its row is SP0789: on the
    H200 such a copy faulted (CUDA_ERROR_ILLEGAL_INSTRUCTION; docs/hardware.md §5.4), so the
    interpreter reports it where the GPU would fail (offsets are in numpy order, the last one
    innermost)."""
    start = offsets[-1] * t.buf.data.itemsize if offsets else 0
    if start % 16:
        raise InterpreterError(TMA_BOX_START, f"`{op.name}` of argument `{t.buf.name}` starts its box at element "
                               f"{offsets[-1]} of a row, {start} bytes in: not a multiple of 16 bytes", op.span,
                               ctx.program_id, help="start each box on a 16-byte boundary of its row (docs/hardware.md "
                               "§5.4)")


@tma_load.interpreter
def _i_tma_load(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t: TensorVal = args[0]
    tma_layout_check(ctx, op, t)
    dst = args[-2]
    bar = args[-1][0]
    offs = [int(x) for x in args[1:-2]]
    tma_box_start_check(ctx, op, t, offs)
    race.check(ctx, op, dst, "tma.load", write=True, tcgen05=False, pipelined=False)
    flat, inside = box_offsets(t, offs, dst.shape)
    vals = t.buf.data[flat]
    dst[...] = np.where(inside, vals, np.zeros((), vals.dtype)).astype(dst.dtype)
    bar.complete_tx(dst.nbytes)
    return []


@tma_store.interpreter
def _i_tma_store(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t: TensorVal = args[0]
    tma_layout_check(ctx, op, t)
    src = np.asarray(args[-1])
    tma_box_start_check(ctx, op, t, [int(x) for x in args[1:-1]])
    flat, inside = box_offsets(t, [int(x) for x in args[1:-1]], src.shape)
    t.buf.data[flat[inside]] = src[inside].astype(t.buf.data.dtype)
    return []


@tma_store_wait.interpreter
@fence_async.interpreter
@barrier_op.interpreter
def _i_noop(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return []
