"""Thread-block clusters (sm_90+): the namespace ``cluster`` and the cluster forms of TMA loads
(PTX ISA 9.7.13.3 ``barrier.cluster``, 10.14-10.17 ``%cluster_ctarank`` / ``%cluster_nctarank``,
9.7.9.25 ``cp.async.bulk.tensor`` ``.multicast::cluster`` / ``.cta_group::2``).

A kernel declares its cluster shape with ``@kernel(cluster=(x, y, z))`` (or ``cluster=`` at the
launch); the launcher launches it with that shape and the PTX carries ``.reqnctapercluster``.

Semantics (the interpreter implements them; the backend is ``backend/lower/cluster.py``):

* ``cluster.rank()`` — this CTA's rank in its cluster, ``%cluster_ctarank`` (x fastest:
  ``x + y·cx + z·cx·cy`` of the CTA's position in the cluster). ``cluster.size()`` — the number
  of CTAs of a cluster, a compile-time constant from the declared shape.
* ``cluster.sync()`` — every thread of every CTA of the cluster arrives and waits
  (``barrier.cluster.arrive.release.aligned`` + ``barrier.cluster.wait.acquire.aligned``): shared
  memory written (and mbarriers initialized) before it is visible to the whole cluster after it.
  ``.aligned`` needs every thread of each warp to execute it: it is a kernel-level statement, not
  allowed inside a ``warp_specialize`` partition (SP0553).
* ``mbarrier.arrive(bar, per=..., multicast=mask)`` — the arrival is made on the barrier at
  ``bar``'s offset in every CTA whose rank bit is set in ``mask`` (``mapa`` +
  ``mbarrier.arrive.relaxed.cluster.shared::cluster``, PTX ISA 9.7.9.23 and 9.7.13.15.13): how the
  consumers of a CTA release a buffer that a peer's multicast TMA load will overwrite.
* ``tma.load(tensor, offsets, dst, bar, multicast=mask, bar_cta=r)`` — ``multicast``: the box is
  written at ``dst``'s offset in the shared memory of every CTA whose rank bit is set in ``mask``,
  and each of those CTAs' barrier at ``bar``'s offset counts its bytes. ``bar_cta``: the bytes are
  counted on the barrier at ``bar``'s offset in CTA ``r`` — this CTA or its peer in the CTA pair
  (ranks differing in bit 0), ``.cta_group::2``, sm_100a+ — and, with ``multicast``, for every
  destination on the CTA of that destination's pair with ``r``'s parity (PTX ISA 9.7.9.25).

Any access to another CTA's shared memory (a remote barrier, a multicast destination, the peer's
operands of a 2-CTA MMA) must follow a ``cluster.sync()`` that comes after the allocations, and the
CTA must not have exited: the interpreter reports both instead of racing (``_remote``), and a
cluster that stops making progress is reported as a deadlock after a timeout, like mbarriers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..interp import tcgen05_async as race
from ..interp.values import ANOTHER_FAILED, CLUSTER_ACCESS, DEADLOCK, InterpreterError, TensorVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .memory_interp import tma_box_start_check, tma_layout_check
from .opdefs import NO_LAYOUT_RULE, TYPED_BY_SEMA, define_op, variadic
from .tensor import box_offsets

MAX_PORTABLE_CLUSTER = 8
"""The portable cluster size limit (CUDA programming guide; docs/hardware.md §7)."""
SYNC_TIMEOUT_S = 20.0

cluster_rank_op = define_op("cluster.rank", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                            doc="%cluster_ctarank: this CTA's rank in its cluster.")
cluster_sync_op = define_op("cluster.sync", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                            doc="barrier.cluster.arrive + wait (all threads).")
tma_load_cluster_op = define_op("tma.load_cluster",
                                operands=variadic(("tensor",), "offset", ("smem", "bar", "mask", "rank")),
                                verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                                doc="cp.async.bulk.tensor with .multicast::cluster and/or a peer-CTA mbarrier.")


# ------------------------------------------------------------------------------------------------
# Builtins
# ------------------------------------------------------------------------------------------------
def declared_cluster(em: Emitter) -> tuple[int, int, int] | None:
    """The kernel's declared cluster shape, None for a kernel without a cluster."""
    shape = getattr(em.sema, "kernel_attrs", {}).get("cluster")
    return tuple(shape) if shape else None  # type: ignore[return-value]


def require_cluster(em: Emitter, what: str, span: Any = None) -> tuple[int, int, int]:
    """The declared cluster shape, or SP0552 at the use when the kernel declares none."""
    shape = declared_cluster(em)
    if shape is None:
        em.error("SP0552", f"{what} needs a thread-block cluster, but the kernel declares none", span or em.span,
                 help="declare its shape: `@kernel(num_warps=..., cluster=(2, 1, 1))`")
    return shape  # type: ignore[return-value]


def cluster_size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


@builtin("rank", ns="cluster")
def cluster_rank(em: Emitter) -> Value:
    """This CTA's rank in its cluster (``%cluster_ctarank``: x fastest)."""
    require_cluster(em, "`cluster.rank()`")
    return em.op1("cluster.rank", [], T.i32)


@builtin("size", ns="cluster")
def cluster_size_builtin(em: Emitter) -> Const:
    """The number of CTAs in a cluster: a compile-time constant of the declared shape."""
    return Const(cluster_size(require_cluster(em, "`cluster.size()`")))


@builtin("sync", ns="cluster")
def cluster_sync(em: Emitter) -> None:
    """Every thread of every CTA of the cluster arrives, then waits for all (``barrier.cluster``)."""
    require_cluster(em, "`cluster.sync()`")
    em.create("cluster.sync", [], [])
    return None


def _rank_value(em: Emitter, arg: Arg, what: str) -> Value:
    v = em.value(arg, like=T.i32)
    if not isinstance(v.type, T.ScalarType) or not v.type.is_int:
        em.error("SP0554", f"{what} must be an integer scalar, found {v.type}", arg.span)
    return em.cast(v, T.i32)


def multicast_mask(em: Emitter, multicast: Arg, what: str) -> Value:
    """The i32 mask of CTA ranks of a ``multicast=`` argument (SP0552 outside a cluster, SP0554 for
    a constant mask naming no CTA or CTAs outside the cluster)."""
    size = cluster_size(require_cluster(em, what, multicast.span))
    m = em.unwrap(multicast)
    if isinstance(m, Const) and isinstance(m.value, int) and not 0 < m.value < (1 << size):
        em.error("SP0554", f"the multicast mask {m.value:#x} must name CTAs of the {size}-CTA cluster "
                 f"(a non-zero mask below {1 << size:#x})", multicast.span)
    return _rank_value(em, multicast, "the multicast mask")


def emit_tma_load_cluster(em: Emitter, t: Value, offs: list[Value], d: Value, bar: Value, multicast: Arg | None,
                          bar_cta: Arg | None, hint: dict[str, str] | None = None) -> None:
    """``tma.load`` with ``multicast=`` and/or ``bar_cta=`` (called by ``ops_memory.tma.load``);
    ``hint``: its ``cache=`` attribute ({} or {"cache": name})."""
    shape = require_cluster(em, "`tma.load` with multicast= or bar_cta=",
                            (multicast or bar_cta).span)  # type: ignore[union-attr]
    size = cluster_size(shape)
    if multicast is not None:
        mask = multicast_mask(em, multicast, "`tma.load` with multicast=")
    else:
        mask = em.constant(0, T.i32)
    if bar_cta is not None:
        r = em.unwrap(bar_cta)
        if isinstance(r, Const) and isinstance(r.value, int) and not 0 <= r.value < size:
            em.error("SP0554", f"bar_cta={r.value} is not a CTA of the {size}-CTA cluster", bar_cta.span)
        if size % 2:
            em.error("SP0557", f"bar_cta= names a CTA of this CTA's pair, but the cluster {shape} has an odd "
                     f"number of CTAs ({size})", bar_cta.span, help="use a cluster of an even size, e.g. (2, 1, 1)")
        rank = _rank_value(em, bar_cta, "bar_cta")
    else:
        rank = em.constant(-1, T.i32)
    em.create("tma.load_cluster", [t, *offs, d, bar, mask, rank], [],
              {"multicast": multicast is not None, "peer_bar": bar_cta is not None, **(hint or {})})


# ------------------------------------------------------------------------------------------------
# Interpreter: the CTAs of a cluster run concurrently
# ------------------------------------------------------------------------------------------------
@dataclass
class ClusterRun:
    """The cluster view shared by the CTAs of one cluster in the interpreter: each CTA's shared
    state (``ctx.shared``) by rank, one condition variable for all their mbarriers, the cluster
    barrier's state, and the CTAs that finished."""

    shape: tuple[int, int, int]
    shared: list[dict[Any, Any]]
    cond: threading.Condition
    syncs: list[int] = field(default_factory=list)
    exited: set[int] = field(default_factory=set)
    arrived: int = 0
    generation: int = 0

    @property
    def size(self) -> int:
        return len(self.shared)

    def abort(self) -> None:
        with self.cond:
            for s in self.shared:
                s["_abort"] = True
            self.cond.notify_all()

    def complete_if_all_arrived(self) -> None:
        """The barrier completes when every CTA that has not exited arrived (PTX ISA 9.7.13.3:
        ``barrier.cluster.wait`` waits for all non-exited threads). Call with ``cond`` held."""
        if self.arrived and self.arrived >= self.size - len(self.exited):
            self.arrived = 0
            self.generation += 1
            self.cond.notify_all()

    def sync(self, rank: int, op: Operation, pid: Any) -> None:
        """``barrier.cluster``: wait until every (non-exited) CTA of the cluster arrived."""
        with self.cond:
            gen = self.generation
            self.arrived += 1
            self.complete_if_all_arrived()
            self.cond.notify_all()  # waiters on mbarriers re-check for a deadlock (ops_memory.deadlocked)
            if self.generation == gen:
                ok = self.cond.wait_for(lambda: self.generation != gen or self.shared[rank].get("_abort"),
                                        timeout=SYNC_TIMEOUT_S)
                if self.shared[rank].get("_abort"):
                    raise InterpreterError(ANOTHER_FAILED, "another CTA of the cluster failed", op.span, pid)
                if not ok:
                    raise InterpreterError(DEADLOCK, "deadlock: cluster.sync() was not reached by every CTA of the "
                                           "cluster (a CTA waits elsewhere)", op.span, pid)
            self.syncs[rank] += 1


def cluster_of(ctx: Any) -> tuple[ClusterRun, int] | None:
    """(the cluster view, this CTA's rank) of a program, None outside a cluster."""
    return ctx.shared.get("_cluster")


def _remote(ctx: Any, op: Operation, rank: int, what: str) -> dict[Any, Any]:
    """CTA ``rank``'s shared state for a remote access by this CTA (checked: a cluster.sync()
    must separate the allocations from remote use, and the CTA must still run)."""
    cl = cluster_of(ctx)
    if cl is None:
        raise InterpreterError(CLUSTER_ACCESS, f"{what} outside a cluster", op.span, ctx.program_id)
    run, me = cl
    if not 0 <= rank < run.size:
        raise InterpreterError(CLUSTER_ACCESS, f"{what}: CTA rank {rank} is not in the {run.size}-CTA cluster",
                               op.span, ctx.program_id)
    if rank == me:
        return ctx.shared
    if run.syncs[me] == 0:
        raise InterpreterError(CLUSTER_ACCESS, f"{what}: CTA {me} accesses the shared memory of CTA {rank} before "
                               "any cluster.sync(): its buffers and mbarriers may not be initialized yet", op.span,
                               ctx.program_id, help="call cluster.sync() after allocating the shared buffers and "
                                                    "mbarriers, before the first access to another CTA's")
    if rank in run.exited:
        raise InterpreterError(CLUSTER_ACCESS, f"{what}: CTA {rank} already exited (end the kernel with "
                               "cluster.sync() so that no CTA exits while others use its shared memory)", op.span,
                               ctx.program_id)
    return run.shared[rank]


def _root(arr: np.ndarray) -> np.ndarray:
    while arr.base is not None and isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def peer_array(ctx: Any, op: Operation, view: np.ndarray, rank: int, what: str) -> np.ndarray:
    """The view at the same offset as ``view`` (a view of one of this CTA's shared-memory or TMEM
    allocations) in CTA ``rank``'s copy of that allocation."""
    target = _remote(ctx, op, rank, what)
    if target is ctx.shared:
        return view
    root = _root(view)
    key = next((k for k, v in ctx.shared.items() if v is root), None)
    if key is None or key not in target:
        raise InterpreterError(CLUSTER_ACCESS, f"{what}: CTA {rank} has no such buffer yet", op.span, ctx.program_id)
    peer_root = target[key]
    offset = view.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return np.ndarray(view.shape, view.dtype, buffer=peer_root, offset=offset, strides=view.strides)


def peer_barrier(ctx: Any, op: Operation, bar: Any, rank: int, what: str) -> Any:
    """The mbarrier at the same offset as ``bar`` (one of this CTA's) in CTA ``rank``."""
    target = _remote(ctx, op, rank, what)
    if target is ctx.shared:
        return bar
    for key, bars in ctx.shared.items():
        if isinstance(key, tuple) and key[:1] == ("mbar",):
            for i, b in enumerate(bars):
                if b is bar:
                    if key not in target:
                        break
                    return target[key][i]
    raise InterpreterError(CLUSTER_ACCESS,
                           f"{what}: CTA {rank} has not initialized this mbarrier yet", op.span, ctx.program_id)


def mask_ranks(ctx: Any, op: Operation, mask: int, what: str) -> list[int]:
    """The ranks named by a multicast mask (checked against the cluster)."""
    cl = cluster_of(ctx)
    size = cl[0].size if cl else 1
    if not 0 < mask < (1 << size):
        raise InterpreterError(CLUSTER_ACCESS, f"{what}: the multicast mask {mask:#x} names no CTA or CTAs outside "
                               f"the {size}-CTA cluster", op.span, ctx.program_id)
    return [r for r in range(size) if mask >> r & 1]


@cluster_rank_op.interpreter
def _i_rank(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    cl = cluster_of(ctx)
    return [np.array(cl[1] if cl else 0, dtype=np.int32)]


@cluster_sync_op.interpreter
def _i_sync(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    cl = cluster_of(ctx)
    if cl is not None:
        cl[0].sync(cl[1], op, ctx.program_id)
    return []


@tma_load_cluster_op.interpreter
def _i_tma_load_cluster(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t: TensorVal = args[0]
    tma_layout_check(ctx, op, t)
    dst, bars, mask, bar_cta = args[-4], args[-3], int(args[-2]), int(args[-1])
    offs = [int(x) for x in args[1:-4]]
    tma_box_start_check(ctx, op, t, offs)
    cl = cluster_of(ctx)
    me = cl[1] if cl else 0
    dests = mask_ranks(ctx, op, mask, "tma.load") if op.attrs["multicast"] else [me]
    if op.attrs["peer_bar"] and bar_cta not in (me, me ^ 1):
        raise InterpreterError(CLUSTER_ACCESS, f"tma.load: bar_cta={bar_cta} is neither this CTA ({me}) nor its "
                               f"peer ({me ^ 1}) (.cta_group::2 signals a barrier of the CTA pair)", op.span,
                               ctx.program_id)
    flat, inside = box_offsets(t, offs, dst.shape)
    vals = t.buf.data[flat]
    box = np.where(inside, vals, np.zeros((), vals.dtype)).astype(dst.dtype)
    for d in dests:
        view = peer_array(ctx, op, dst, d, "tma.load multicast")
        race.check(ctx, op, view, "tma.load", write=True, tcgen05=False, pipelined=False)
        view[...] = box
        signal = ((d & ~1) | (bar_cta & 1)) if op.attrs["peer_bar"] else d
        peer_barrier(ctx, op, bars[0], signal, "tma.load").complete_tx(dst.nbytes)
    return []


__all__ = ["ClusterRun", "cluster_of", "cluster_size", "declared_cluster", "emit_tma_load_cluster", "mask_ranks",
           "multicast_mask", "peer_array", "peer_barrier", "require_cluster"]
