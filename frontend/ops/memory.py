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

This module defines the ops and the builtins that type them; the interpreter semantics are
``memory_interp.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import types as T
from ..ir.core import Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const, HelperFunction
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, RUN_BY_REGION_WALK, TYPED_BY_SEMA, define_op, flagged, variadic

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
