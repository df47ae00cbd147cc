"""Explicit-level memory ops shared by Hopper and Blackwell: shared-memory buffers, mbarriers, TMA
copies, async-proxy fences, and warp specialization.

Semantics (the interpreter implements them; PTX ISA sections cited per op):

* ``smem.alloc(dtype, shape, swizzle=0)`` — a CTA-wide buffer in shared memory (zero-initialized
  in the interpreter, undefined on the GPU). ``swizzle`` (0, 32, 64, 128 bytes) is the TMA/MMA
  swizzle span (PTX 5.5.7); rows wider than the span are stored as column panels of one span each.
* ``buf[i]`` — the i-th buffer along the leading dimension; ``buf.slice(dim, start, size)``.
* ``buf.load()`` / ``buf.store(tile)`` — ordinary shared-memory reads and writes by every thread.
* ``mbarrier.alloc(count, arrivals=1)`` — ``count`` barriers expecting ``arrivals`` arrivals per
  phase (PTX 9.7.13.15); ``bars[i]`` picks one. ``mbarrier.expect(bar, nbytes)`` is one arrival
  announcing ``nbytes`` of asynchronous copies; ``mbarrier.arrive(bar)`` is one arrival;
  ``mbarrier.wait(bar, phase)`` blocks until the phase of that parity has completed.
* ``tma.load(tensor, offsets, dst, bar)`` — copy the box ``dst.shape`` at ``offsets`` into ``dst``
  and count its bytes on ``bar`` (elements outside the tensor read zero; PTX 9.7.9.25);
  ``cache=`` (``"evict_first"``, ``"evict_last"``, ``"evict_normal"``, ``"evict_unchanged"`` or None)
  gives the copy an L2 eviction priority (``.L2::cache_hint`` with a ``createpolicy.fractional``
  policy, PTX 9.7.9.25 and `createpolicy`): data read once (a weight streamed through) can make
  room for data many CTAs read again (the activations). ``tma.store(tensor, offsets, src)`` writes
  it back (clipped); ``tma.store_wait()`` waits for the stores of this thread to finish reading
  shared memory.
* ``fence.async_shared()`` — orders this thread's shared-memory writes before later async-proxy
  reads (``fence.proxy.async.shared::cta``); needed before TMA stores and MMAs read data written by
  ordinary stores (the fence TileLang's sparse GEMM once omitted: tile-ai/tilelang issue #2634).
* ``barrier()`` — all threads of the current partition (the CTA outside warp specialization).
* ``warp_specialize(partition(fn, *args, warps=, regs=), ...)`` — run each partition's helper on its
  own warps (consecutive, in order), concurrently; ``regs`` sets the register budget with
  ``setmaxnreg`` (sm_90a+). Ops that one thread must issue (TMA, expect, arrive) are issued by the
  first thread of the partition.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...target.tma_layout import TENSOR_MAP, global_layout_problems
from ..interp.values import ANOTHER_FAILED, DEADLOCK, OUT_OF_BOUNDS, TMA_BOX_START, InterpreterError, TensorVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const, HelperFunction
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, RUN_BY_REGION_WALK, TYPED_BY_SEMA, define_op, flagged, variadic
from .tensor import box_offsets

SWIZZLES = (0, 32, 64, 128)

smem_alloc = define_op("smem.alloc", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                       doc="A shared-memory buffer.")
smem_index = define_op("smem.index", operands=("buf", "index"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                       legality=NO_LEGALITY, doc="One buffer of a stacked shared-memory buffer.")
smem_slice = define_op("smem.slice", operands=("buf", "start"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                       doc="A sub-range of a shared-memory buffer along one dim.")
smem_load = define_op("smem.load", operands=("buf",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                      legality=NO_LEGALITY, doc="Read a shared-memory buffer into a tile.")
smem_store = define_op("smem.store", operands=("buf", "value"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                       legality=NO_LEGALITY, side_effects=True, doc="Write a tile into a shared-memory buffer.")
mbar_alloc = define_op("mbarrier.alloc", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                       doc="An array of initialized mbarriers.")
mbar_index = define_op("mbarrier.index", operands=("bar", "index"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                       legality=NO_LEGALITY, doc="One mbarrier of an array.")
mbar_expect = define_op("mbarrier.expect", operands=("bar", "bytes"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                        side_effects=True, doc="Arrive once, expecting async bytes.")
mbar_arrive = define_op("mbarrier.arrive", operands=flagged(("bar",), ("mask", "multicast")), verify=TYPED_BY_SEMA,
                        layout=NO_LAYOUT_RULE, side_effects=True, doc="Arrive once.")
mbar_wait = define_op("mbarrier.wait", operands=("bar", "phase"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                      side_effects=True, doc="Wait for a phase to complete.")
tma_load = define_op("tma.load", operands=variadic(("tensor",), "offset", ("smem", "bar")), verify=TYPED_BY_SEMA,
                     layout=NO_LAYOUT_RULE, side_effects=True, doc="Async bulk tensor copy global -> shared.")
tma_store = define_op("tma.store", operands=variadic(("tensor",), "offset", ("smem",)), verify=TYPED_BY_SEMA,
                      layout=NO_LAYOUT_RULE, side_effects=True, doc="Async bulk tensor copy shared -> global.")
tma_store_wait = define_op("tma.store_wait", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                           doc="Wait until TMA stores read shared memory.")
fence_async = define_op("fence.async_shared", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                        doc="fence.proxy.async.shared::cta")
barrier_op = define_op("barrier", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                       side_effects=True, doc="Barrier over the current partition's threads.")
warp_specialize_op = define_op("warp_specialize", verify=TYPED_BY_SEMA, interpret=RUN_BY_REGION_WALK,
                               layout=NO_LAYOUT_RULE, side_effects=True,
                               doc="Concurrent partitions on disjoint warps.")


# ------------------------------------------------------------------------------------------------
# Builtins
# ------------------------------------------------------------------------------------------------
def _smem(em: Emitter, arg: Arg) -> tuple[Value, T.SmemType]:
    v = em.value(arg)
    if not isinstance(v.type, T.SmemType):
        em.error("SP0380", f"expected a shared-memory buffer, found {v.type}", arg.span)
    return v, v.type


def _bar(em: Emitter, arg: Arg, single: bool = True) -> Value:
    v = em.value(arg)
    if not isinstance(v.type, T.BarrierType):
        em.error("SP0381", f"expected an mbarrier, found {v.type}", arg.span)
    if single and v.type.count != 1:
        em.error("SP0381", f"expected one mbarrier, found an array of {v.type.count}", arg.span,
                 help="pick one with `bars[i]`")
    return v


def _index_value(em: Emitter, arg: Arg) -> Value:
    v = em.value(arg, like=T.i32)
    if not (isinstance(v.type, T.ScalarType) and v.type.is_int):  # not a tile, a tensor, an smem buffer
        em.error("SP0343", f"an index must be an integer scalar, found {v.type}", arg.span)
    return em.cast(v, T.i32)


@builtin("alloc", ns="smem")
def smem_alloc_builtin(em: Emitter, dtype: Arg, shape: Arg, swizzle: Arg | None = None) -> Value:
    """A shared-memory buffer of ``shape`` and ``dtype``; ``swizzle`` in bytes (0, 32, 64, 128)."""
    dt = em.dtype_arg(dtype)
    dims = em.int_tuple(shape, "the buffer shape")
    if any(d <= 0 for d in dims):
        em.error("SP0382", f"buffer dimensions must be positive, found {dims}", shape.span)
    sw = 0 if swizzle is None else em.constexpr(swizzle, "the swizzle")
    if sw not in SWIZZLES:
        em.error("SP0383", f"swizzle must be 0, 32, 64 or 128 bytes, found {sw}", swizzle.span if swizzle else em.span)
    if sw and dims[-1] * dt.bits // 8 < 16:
        em.error("SP0383", f"a swizzled row must hold at least 16 bytes, found {dims[-1] * dt.bits // 8}",
                 shape.span, help="use swizzle=0 for narrow rows")
    return em.op1("smem.alloc", [], T.SmemType(dt, dims, sw), dtype=dt.name, shape=dims, swizzle=sw)


@builtin("__getitem__", method_of=(T.SmemType,), method_only=True)
def smem_getitem(em: Emitter, buf: Arg, index: Arg) -> Value:
    """``buf[i]``: the i-th buffer along the leading dimension."""
    v, t = _smem(em, buf)
    if len(t.shape) < 2:
        em.error("SP0384", f"`buf[i]` needs a buffer of rank 2 or more, found {t}", buf.span)
    i = _index_value(em, index)
    return em.op1("smem.index", [v, i], T.SmemType(t.elem, t.shape[1:], t.swizzle, t.pitch))


@builtin("slice", method_of=(T.SmemType,), method_only=True)
def smem_slice_builtin(em: Emitter, buf: Arg, dim: Arg, start: Arg, size: Arg) -> Value:
    """The rows/columns ``[start, start + size)`` of dimension ``dim``; along the last dimension only
    of an unswizzled buffer (a strided view: loads and stores, not TMA or MMA descriptors)."""
    v, t = _smem(em, buf)
    d = em.constexpr(dim, "the dimension")
    n = em.constexpr(size, "the slice size")
    if not 0 <= d < len(t.shape) or not 0 < n <= t.shape[d]:
        em.error("SP0384", f"cannot take {n} elements of dimension {d} of {t}", em.span)
    s = _index_value(em, start)
    shape = tuple(n if i == d else x for i, x in enumerate(t.shape))
    pitch = (t.pitch or t.shape[-1]) if d == len(t.shape) - 1 else t.pitch
    return em.op1("smem.slice", [v, s], T.SmemType(t.elem, shape, t.swizzle, pitch), dim=d, size=n)


@builtin("load", method_of=(T.SmemType,), method_only=True)
def smem_load_builtin(em: Emitter, buf: Arg) -> Value:
    """The whole buffer as a tile (dimensions must be powers of two)."""
    v, t = _smem(em, buf)
    for d in t.shape:
        if not T.is_power_of_two(d):
            em.error("SP0301", f"loading {t} into registers needs power-of-two dimensions", buf.span)
    return em.op1("smem.load", [v], T.TileType(t.elem, t.shape))


@builtin("store", method_of=(T.SmemType,), method_only=True)
def smem_store_builtin(em: Emitter, buf: Arg, value: Arg) -> None:
    """Write a tile of the buffer's shape (converted to its element type)."""
    v, t = _smem(em, buf)
    x = em.value(value, like=t.elem)
    if T.shape_of(x.type) != t.shape:
        em.error("SP0385", f"cannot store a tile of shape {T.shape_of(x.type)} into {t}", value.span)
    em.create("smem.store", [v, em.cast(x, t.elem)], [])
    return None


@builtin("alloc", ns="mbarrier")
def mbar_alloc_builtin(em: Emitter, count: Arg, arrivals: Arg | None = None) -> Value:
    """``count`` mbarriers, each completing a phase after ``arrivals`` arrivals (and their bytes)."""
    n = em.constexpr(count, "the number of barriers")
    a = 1 if arrivals is None else em.constexpr(arrivals, "the arrival count")
    if not 1 <= n <= 64:
        em.error("SP0386", f"between 1 and 64 barriers can be allocated at once, found {n}", count.span)
    if not 1 <= a < (1 << 20):
        em.error("SP0386", f"the arrival count must be in [1, 2^20), found {a}", arrivals.span if arrivals else em.span)
    return em.op1("mbarrier.alloc", [], T.BarrierType(n), count=n, arrivals=a)


@builtin("__getitem__", method_of=(T.BarrierType,), method_only=True)
def mbar_getitem(em: Emitter, bars: Arg, index: Arg) -> Value:
    """``bars[i]``: one barrier of an array."""
    v = _bar(em, bars, single=False)
    return em.op1("mbarrier.index", [v, _index_value(em, index)], T.BarrierType(1))


@builtin("expect", ns="mbarrier")
def mbar_expect_builtin(em: Emitter, bar: Arg, nbytes: Arg) -> None:
    """One arrival that also announces ``nbytes`` of asynchronous copies (arrive.expect_tx)."""
    b = _bar(em, bar)
    n = em.value(nbytes, like=T.i32)
    em.create("mbarrier.expect", [b, em.cast(n, T.i32)], [])
    return None


ARRIVAL_UNITS = ("partition", "warpgroup", "warp")
"""What one ``mbarrier.arrive`` arrives for: the whole partition, each warpgroup, or each warp."""


@builtin("arrive", ns="mbarrier")
def mbar_arrive_builtin(em: Emitter, bar: Arg, per: Arg | None = None, multicast: Arg | None = None) -> None:
    """Arrive on ``bar`` once for the partition (``per="partition"``, the default: after all its
    threads got here), once for each of its warpgroups (``per="warpgroup"``: each warpgroup
    arrives when its own four warps got here, without waiting for the others), or once for each
    of its warps (``per="warp"``: no synchronization beyond the warp; the barrier's count is then
    the number of arriving warps). In a cluster, ``multicast`` (a mask of CTA ranks) makes that
    arrival on the barrier at ``bar``'s offset in each of those CTAs instead (``ops_cluster.py``)."""
    unit = "partition" if per is None else em.constexpr(per, "`per`", (str,))
    if unit not in ARRIVAL_UNITS:
        em.error("SP0371", f"`per` must be \"partition\", \"warpgroup\" or \"warp\", found {unit!r}",
                 per.span if per else em.span)
    if multicast is not None:
        from .cluster import multicast_mask

        mask = multicast_mask(em, multicast, "`mbarrier.arrive` with multicast=")
        em.create("mbarrier.arrive", [_bar(em, bar), mask], [], {"per": unit, "multicast": True})
        return None
    em.create("mbarrier.arrive", [_bar(em, bar)], [], {"per": unit})
    return None


@builtin("wait", ns="mbarrier")
def mbar_wait_builtin(em: Emitter, bar: Arg, phase: Arg) -> None:
    """Wait until the barrier's phase of parity ``phase`` has completed."""
    b = _bar(em, bar)
    p = _index_value(em, phase)
    em.create("mbarrier.wait", [b, p], [])
    return None


def _tensor_and_offsets(em: Emitter, tensor: Arg, offsets: Arg) -> tuple[Value, list[Value]]:
    t = em.value(tensor)
    if not isinstance(t.type, T.TensorType):
        em.error("SP0342", f"TMA copies need a global tensor parameter (`tensor[T, rank]`), found {t.type}",
                 tensor.span)
    raw = em.unwrap(offsets)
    items = list(raw) if isinstance(raw, tuple) else [raw]
    if len(items) != t.type.rank:
        em.error("SP0343", f"a tensor of rank {t.type.rank} needs {t.type.rank} offsets, found {len(items)}",
                 offsets.span)
    return t, [_index_value(em, Arg(x, offsets.span)) for x in items]


def _check_box(em: Emitter, t: Value, s: T.SmemType, span: Any) -> None:
    tt = t.type
    assert isinstance(tt, T.TensorType)
    if tt.elem.bits != s.elem.bits or (tt.elem.is_float != s.elem.is_float and tt.elem != T.tf32):
        em.error("SP0387", f"a TMA copy between {tt} and {s} needs the same element type", span)
    if len(s.shape) != tt.rank:
        em.error("SP0387", f"the shared buffer {s} must have the tensor's rank {tt.rank}", span)
    for d in s.shape:
        if d > 256:
            em.error("SP0388", f"a TMA box dimension is at most 256 elements, found {d} in {s.shape}", span,
                     help="split the buffer into several copies (docs/hardware.md §5.4)")
    row_bytes = s.shape[-1] * s.elem.bits // 8
    if row_bytes % 16:
        em.error("SP0388", f"the innermost box dimension must span a multiple of 16 bytes, found {row_bytes}",
                 span, help="widen the buffer's last dimension (docs/hardware.md §5.4)")


L2_CACHE_HINTS = ("evict_first", "evict_last", "evict_normal", "evict_unchanged")
"""The L2 eviction priorities of ``tma.load(..., cache=)``: ``createpolicy.fractional.L2::<hint>``
(PTX ISA, `createpolicy`), applied to the whole copy."""


def cache_hint(em: Emitter, cache: Arg | None) -> dict[str, str]:
    """The op attributes of ``tma.load``'s ``cache=`` argument: {} for None (no hint), else
    {"cache": hint}; a name not in :data:`L2_CACHE_HINTS` is SP0376."""
    if cache is None:
        return {}
    hint = em.constexpr(cache, "the L2 cache hint `cache=`", (str, type(None)))
    if hint is None:
        return {}
    if hint not in L2_CACHE_HINTS:
        em.error("SP0376", f"unknown L2 cache hint cache={hint!r}", cache.span,
                 help="use " + ", ".join(repr(h) for h in L2_CACHE_HINTS) + " or None")
    return {"cache": hint}


@builtin("load", ns="tma")
def tma_load_builtin(em: Emitter, tensor: Arg, offsets: Arg, dst: Arg, bar: Arg, multicast: Arg | None = None,
                     bar_cta: Arg | None = None, cache: Arg | None = None) -> None:
    """Copy the box of ``dst.shape`` at ``offsets`` into ``dst``; completion is counted on ``bar``.
    In a cluster, ``multicast`` (a mask of CTA ranks) writes the box into each of those CTAs and
    ``bar_cta`` counts the bytes on the barrier of that CTA of the pair (``ops_cluster.py``).
    ``cache``: the copy's L2 eviction priority (:data:`L2_CACHE_HINTS`, or None: none given)."""
    t, offs = _tensor_and_offsets(em, tensor, offsets)
    d, st = _smem(em, dst)
    _check_box(em, t, st, dst.span)
    hint = cache_hint(em, cache)
    if multicast is not None or bar_cta is not None:
        from .cluster import emit_tma_load_cluster

        emit_tma_load_cluster(em, t, offs, d, _bar(em, bar), multicast, bar_cta, hint)
        return None
    em.create("tma.load", [t, *offs, d, _bar(em, bar)], [], hint)
    return None


@builtin("store", ns="tma")
def tma_store_builtin(em: Emitter, tensor: Arg, offsets: Arg, src: Arg) -> None:
    """Copy ``src`` to the box at ``offsets`` (elements outside the tensor are skipped)."""
    t, offs = _tensor_and_offsets(em, tensor, offsets)
    s, st = _smem(em, src)
    _check_box(em, t, st, src.span)
    em.create("tma.store", [t, *offs, s], [])
    return None


@builtin("store_wait", ns="tma")
def tma_store_wait_builtin(em: Emitter, pending: Arg | None = None) -> None:
    """Wait until at most ``pending`` TMA stores still read shared memory (default 0)."""
    n = 0 if pending is None else em.constexpr(pending, "the number of pending stores")
    em.create("tma.store_wait", [], [], {"pending": n})
    return None


@builtin("async_shared", ns="fence")
def fence_async_builtin(em: Emitter) -> None:
    """Order earlier shared-memory writes before later async-proxy (TMA, wgmma, tcgen05) reads."""
    em.create("fence.async_shared", [], [])
    return None


@builtin("barrier")
def barrier_builtin(em: Emitter) -> None:
    """Wait for every thread of the current partition (the whole CTA outside warp_specialize)."""
    em.create("barrier", [], [])
    return None


@dataclass(frozen=True)
class Partition:
    """``partition(fn, *args, warps=, regs=)`` before it is placed by ``warp_specialize``."""

    fn: HelperFunction
    args: tuple[Any, ...]
    warps: int
    regs: int | None
    span: Any = field(default=None, compare=False)


@builtin("partition")
def partition_builtin(em: Emitter, fn: Arg, *args: Arg, warps: Arg | None = None, regs: Arg | None = None) -> Const:
    """One partition of ``warp_specialize``: the helper ``fn`` called with ``args`` on ``warps`` warps
    with a ``regs`` register budget per thread (``setmaxnreg``; None keeps the kernel's)."""
    f = em.unwrap(fn)
    helper = f if isinstance(f, HelperFunction) else getattr(getattr(f, "value", None), "as_helper", lambda: None)()
    if not isinstance(helper, HelperFunction):
        em.error("SP0389", "the first argument of `partition` must be a helper function", fn.span)
    w = 4 if warps is None else em.constexpr(warps, "the number of warps")
    r = None if regs is None else em.constexpr(regs, "the register budget")
    if w <= 0:
        em.error("SP0389", f"a partition needs at least one warp, found {w}", warps.span if warps else em.span)
    if r is not None and (r % 8 or not 24 <= r <= 256):
        em.error("SP0390", f"setmaxnreg takes a multiple of 8 in [24, 256], found {r}", regs.span if regs else em.span)
    return Const(Partition(helper, tuple(em.unwrap(a) for a in args), w, r, em.span))


@builtin("warp_specialize")
def warp_specialize_builtin(em: Emitter, *partitions: Arg) -> None:
    """Run the partitions concurrently on consecutive warps of the CTA."""
    parts: list[Partition] = []
    for p in partitions:
        v = em.unwrap(p)
        if not (isinstance(v, Const) and isinstance(v.value, Partition)):
            em.error("SP0389", "`warp_specialize` takes `partition(...)` values", p.span)
        parts.append(v.value)
    if not parts:
        em.error("SP0389", "`warp_specialize` needs at least one partition", em.span)
    sema = em.sema
    op = em.create("warp_specialize", [], [], {"warps": tuple(p.warps for p in parts),
                                                "regs": tuple(p.regs for p in parts)}, regions=len(parts))
    for region, part in zip(op.regions, parts, strict=True):
        sema.run_partition(part.fn, list(part.args), region.block, part.span or em.span)
    return None


# ------------------------------------------------------------------------------------------------
# Interpreter
# ------------------------------------------------------------------------------------------------
class Mbarrier:
    """An mbarrier: a phase completes when its arrivals and expected bytes are all in."""

    def __init__(self, arrivals: int, cond: threading.Condition):
        self.expected = arrivals
        self.pending = arrivals
        self.tx = 0
        self.phase = 0
        self.cond = cond

    def _maybe_complete(self) -> None:
        if self.pending <= 0 and self.tx <= 0:
            self.phase ^= 1
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

    def wait(self, parity: int, ctx: Any, op: Operation) -> None:
        """Block until the phase of parity ``parity`` completed. Every arrival in the interpreter is
        made by a running partition thread (TMA and tcgen05 complete when issued), so when every
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


def _cond(ctx: Any) -> threading.Condition:
    c = ctx.shared.get("_cond")
    if c is None:
        c = ctx.shared.setdefault("_cond", threading.Condition())
    return c


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
    args[0][...] = args[1]
    return []


@mbar_alloc.interpreter
def _i_mbar_alloc(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    key = ("mbar", id(op))
    if key not in ctx.shared:
        cond = _cond(ctx)
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
    args[0][0].wait(int(args[1]), ctx, op)
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
