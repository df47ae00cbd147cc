"""Lowering of the explicit-level memory ops (``ops_memory.py``): shared-memory buffers, mbarriers,
async-proxy fences, partition barriers and warp specialization (sm_90a and later); the TMA copies
are lowered in :mod:`.tma`.

Shared-memory buffers live in the kernel's dynamic shared memory, each 1024-byte aligned (the
128B-swizzle atom, docs/hardware.md §5.3). A 2-D buffer of R x C elements with swizzle span S is
stored as column panels of S bytes (rows of exactly S bytes, TMA box per panel); byte address bits
[4, 4+log2(S/16)) are XORed with bits [7, ...) (PTX ISA 5.5.7). Ops one thread must issue (TMA,
``arrive.expect_tx``, ``arrive``) run in the first thread of the current partition.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ...frontend.diagnostics import InternalError
from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...target.targets import Feature, require
from .codegen import CodeGen, DTile, PartitionCtx, lowering
from .llvm_text import LLValue, const
from .reduce import storage_of
from .smem_access import load_runs, smem_run_width, store_runs


@dataclass(frozen=True)
class SmemRef:
    """A view of a shared-memory buffer: ``base`` is its byte offset in dynamic shared memory;
    ``full_rows`` the rows of the allocation (the panel stride); the view is ``shape``."""

    base: LLValue
    elem: T.ScalarType
    shape: tuple[int, ...]
    swizzle: int
    full_rows: int
    row_bytes: int  # bytes of one full row of the allocation (all panels)
    align: int = 1024  # bytes: the view's first element's alignment (a slice along the last dimension lowers it)
    # bytes from one index of each leading dimension (all but the last two) to the next: the
    # buffer's, which a slice of a leading dimension does not change
    lead_strides: tuple[int, ...] = ()

    @property
    def ebytes(self) -> int:
        return max(1, self.elem.bits // 8)

    @property
    def pitch(self) -> int:
        """Bytes between consecutive rows inside a panel."""
        return self.swizzle if self.swizzle else self.row_bytes

    @property
    def panel_cols(self) -> int:
        return (self.swizzle // self.ebytes) if self.swizzle else self.shape[-1]

    @property
    def run_bytes(self) -> int:
        """What every row start of the view is aligned to (bounds the width of vector accesses)."""
        return math.gcd(self.row_bytes, self.align)

    @property
    def matrix_bytes(self) -> int:
        """Bytes of one 2-D matrix of the allocation (the stride of leading dims)."""
        return self.full_rows * self.row_bytes


@dataclass(frozen=True)
class BarRef:
    base: LLValue  # byte offset of the first barrier
    count: int


def smem_base_address(cg: CodeGen) -> LLValue:
    """The 32-bit shared-state-space address of the dynamic shared memory."""
    if cg.state.smem_addr is None:
        cg.state.smem_addr = cg.fb.value("ptrtoint ptr addrspace(3) @sparsile_smem to i32", "i32", "sbase",
                                         function_entry=True)
    return cg.state.smem_addr


def element_offset(cg: CodeGen, ref: SmemRef, row: LLValue, col: LLValue) -> LLValue:
    """Byte offset (from the dynamic shared memory start) of element (row, col) of a 2-D view,
    swizzle applied."""
    fb = cg.fb
    eb = ref.ebytes
    if ref.swizzle:
        pc = ref.panel_cols
        panel = fb.binop("udiv", col, const(pc, "i32"))
        within = fb.binop("urem", col, const(pc, "i32"))
        off = fb.binop("add", fb.binop("mul", panel, const(ref.full_rows * ref.swizzle, "i32")),
                       fb.binop("add", fb.binop("mul", row, const(ref.swizzle, "i32")),
                                fb.binop("mul", within, const(eb, "i32"))))
        off = fb.binop("add", off, ref.base)
        mask = ref.swizzle // 16 - 1
        bits = fb.binop("and", fb.binop("lshr", off, const(7, "i32")), const(mask, "i32"))
        return fb.binop("xor", off, fb.binop("shl", bits, const(4, "i32")))
    off = fb.binop("add", fb.binop("mul", row, const(ref.row_bytes, "i32")), fb.binop("mul", col, const(eb, "i32")))
    return fb.binop("add", off, ref.base)


def _nd_offset(cg: CodeGen, ref: SmemRef, coords: list[LLValue]) -> LLValue:
    """Offset of an element of an N-D view: leading dims stride whole matrices."""
    fb = cg.fb
    if len(coords) == 1:
        return element_offset(cg, ref, const(0, "i32"), coords[0])
    lead = coords[:-2]
    base = ref
    if lead:
        extra: LLValue = const(0, "i32")
        for d in reversed(range(len(lead))):
            extra = fb.binop("add", extra, fb.binop("mul", lead[d], const(ref.lead_strides[d], "i32")))
        base = SmemRef(fb.binop("add", ref.base, extra), ref.elem, ref.shape[-2:], ref.swizzle, ref.full_rows,
                       ref.row_bytes, ref.align)
    return element_offset(cg, base, coords[-2], coords[-1])


@lowering("smem.alloc")
def lower_smem_alloc(cg: CodeGen, op: Operation) -> None:
    t = op.result.type
    assert isinstance(t, T.SmemType)
    eb = max(1, t.elem.bits // 8)
    shape = t.shape
    rows = shape[-2] if len(shape) >= 2 else 1
    row_bytes = shape[-1] * eb
    if t.swizzle and row_bytes % t.swizzle:
        raise InternalError(f"swizzled rows of {row_bytes} bytes reached the lowering (legality SP0560)", op.span)
    matrices = 1
    for d in shape[:-2]:
        matrices *= d
    nbytes = matrices * rows * row_bytes
    off = cg.smem_alloc(nbytes, 1024)
    lead_strides: list[int] = []  # outermost first
    stride = rows * row_bytes
    for d in reversed(shape[:-2]):
        lead_strides.insert(0, stride)
        stride *= d
    cg.set(op.result, SmemRef(const(off, "i32"), t.elem, shape, t.swizzle, rows, row_bytes, 1024,
                              tuple(lead_strides)))


@lowering("smem.index")
def lower_smem_index(cg: CodeGen, op: Operation) -> None:
    ref: SmemRef = cg.get(op.operand("buf"))
    i = cg.scalar(op.operand("index"))
    if len(ref.shape) == 2:  # a row of a matrix: one row pitch on (inside each column panel)
        stride = ref.pitch
    else:  # a matrix (or a stack of them) of a higher-rank buffer
        stride = ref.lead_strides[0]
    base = cg.fb.binop("add", ref.base, cg.fb.binop("mul", i, const(stride, "i32")))
    cg.set(op.result, SmemRef(base, ref.elem, ref.shape[1:], ref.swizzle, ref.full_rows, ref.row_bytes, ref.align,
                              ref.lead_strides[1:]))


@lowering("smem.slice")
def lower_smem_slice(cg: CodeGen, op: Operation) -> None:
    ref: SmemRef = cg.get(op.operand("buf"))
    start = cg.scalar(op.operand("start"))
    d, n = op.attrs["dim"], op.attrs["size"]
    rank = len(ref.shape)
    fb = cg.fb
    shape = tuple(n if i == d else x for i, x in enumerate(ref.shape))
    align = ref.align
    if d == rank - 2:  # rows: offset inside each panel
        base = fb.binop("add", ref.base, fb.binop("mul", start, const(ref.pitch, "i32")))
    elif d < rank - 2:
        base = fb.binop("add", ref.base, fb.binop("mul", start, const(ref.lead_strides[d], "i32")))
    elif ref.swizzle:
        raise InternalError("a slice along a swizzled last dimension reached the lowering (legality SP0561)", op.span)
    else:  # columns of an unswizzled buffer: the rows keep the allocation's pitch (a strided view)
        eb = ref.ebytes
        base = fb.binop("add", ref.base, fb.binop("mul", start, const(eb, "i32")))
        owner = op.operand("start").owner  # a constant start keeps what alignment it can
        known = int(owner.attrs["value"]) if owner is not None and owner.name == "arith.constant" else 1
        align = math.gcd(align, known * eb) or align
    cg.set(op.result, SmemRef(base, ref.elem, shape, ref.swizzle, ref.full_rows, ref.row_bytes, align,
                              ref.lead_strides))


def kmajor_swizzle(row_bytes: int) -> int:
    """The widest swizzle span (128, 64, 32 bytes) whose atoms rows of ``row_bytes`` fill; 0 if none."""
    return next((s for s in (128, 64, 32) if row_bytes % s == 0), 0)


def stage_kmajor(cg: CodeGen, x: DTile, transpose: bool, rows: int, cols: int) -> SmemRef | None:
    """A register tile written into a fresh K-major swizzled shared buffer of ``rows x cols``
    (``transpose``: the tile is cols x rows, e.g. B (K, N) stored as N x K), for an MMA to read by
    descriptor; None when no swizzle fits the rows."""
    elem = x.elem
    assert isinstance(elem, T.ScalarType)
    eb = max(1, elem.bits // 8)
    sw = kmajor_swizzle(cols * eb)
    if not sw:
        return None
    off = cg.smem_alloc(rows * cols * eb, 1024)
    ref = SmemRef(const(off, "i32"), elem, (rows, cols), sw, rows, cols * eb)
    sty, _ = storage_of(elem)
    seen: set[tuple[str, ...]] = set()
    for r, c in enumerate(cg.coords(x.layout)):
        key = tuple(v.ref for v in c)
        if key in seen:
            continue
        seen.add(key)
        row, col = (c[1], c[0]) if transpose else (c[0], c[1])
        ptr = cg.smem_ptr(element_offset(cg, ref, row, col))
        cg.fb.emit(f"store {sty} {x.regs[r].ref}, ptr addrspace(3) {ptr.ref}, align {eb}")
    return ref


@lowering("smem.store")
def lower_smem_store(cg: CodeGen, op: Operation) -> None:
    ref: SmemRef = cg.get(op.operand("buf"))
    x = cg.tile(op.operand("value"))
    sty, eb = storage_of(x.elem)
    vec = 1 if x.elem.is_bool else smem_run_width(x.layout, eb, ref.panel_cols, ref.run_bytes)
    store_runs(cg, x, cg.coords(x.layout), vec, lambda c: cg.smem_ptr(_nd_offset(cg, ref, c)), sty, eb)


@lowering("smem.load")
def lower_smem_load(cg: CodeGen, op: Operation) -> None:
    ref: SmemRef = cg.get(op.operand("buf"))
    res = op.result
    elem = T.element_type(res.type)
    assert isinstance(elem, T.ScalarType)
    sty, eb = storage_of(elem)
    vec = 1 if elem.is_bool else smem_run_width(res.layout, eb, ref.panel_cols, ref.run_bytes)
    regs = load_runs(cg, cg.coords(res.layout), vec, lambda c: cg.smem_ptr(_nd_offset(cg, ref, c)), sty, eb)
    if elem.is_bool:
        regs = [cg.fb.icmp("ne", v, const(0, "i8")) for v in regs]
    cg.set(res, DTile(res.layout, regs, elem))


# ------------------------------------------------------------------------------------------------
# mbarriers
# ------------------------------------------------------------------------------------------------
def emit_where(cg: CodeGen, cond: LLValue, emit: Callable[[], None], label: str) -> None:
    """Run ``emit()`` in the threads where ``cond`` holds, the others branching past it."""
    fb = cg.fb
    then, done = fb.new_block(f"{label}_then"), fb.new_block(f"{label}_done")
    fb.cond_br(cond, then, done)
    fb.set_block(then)
    emit()
    fb.br(done)
    fb.set_block(done)


def emit_in_leader(cg: CodeGen, emit: Callable[[], None]) -> None:
    """Run ``emit()`` in the first thread of the current partition only."""
    emit_where(cg, cg.is_leader(), emit, "lead")


def bar_ptr(cg: CodeGen, bar: BarRef) -> LLValue:
    return cg.smem_ptr(bar.base)


@lowering("mbarrier.alloc")
def lower_mbar_alloc(cg: CodeGen, op: Operation) -> None:
    if cg.part.index >= 0:
        raise InternalError("an mbarrier allocation in a partition reached the lowering (legality SP0562)", op.span)
    n, arrivals = op.attrs["count"], op.attrs["arrivals"]
    off = cg.smem_alloc(8 * n, 8)

    def init() -> None:
        for i in range(n):
            p = cg.smem_ptr(off + 8 * i)
            cg.intrinsic("void", "llvm.nvvm.mbarrier.init.shared", [p, const(arrivals, "i32")])
        cg.intrinsic("void", "llvm.nvvm.fence.mbarrier_init.release.cluster", [])

    emit_in_leader(cg, init)
    cg.barrier()
    cg.set(op.result, BarRef(const(off, "i32"), n))


@lowering("mbarrier.index")
def lower_mbar_index(cg: CodeGen, op: Operation) -> None:
    bar: BarRef = cg.get(op.operand("bar"))
    i = cg.scalar(op.operand("index"))
    cg.set(op.result, BarRef(cg.fb.binop("add", bar.base, cg.fb.binop("mul", i, const(8, "i32"))), 1))


@lowering("mbarrier.expect")
def lower_mbar_expect(cg: CodeGen, op: Operation) -> None:
    bar: BarRef = cg.get(op.operand("bar"))
    nbytes = cg.scalar(op.operand("bytes"))
    emit_in_leader(cg, lambda: cg.intrinsic("i64", "llvm.nvvm.mbarrier.arrive.expect.tx.scope.cta.space.cta",
                                         [bar_ptr(cg, bar), nbytes]))


@lowering("mbarrier.arrive")
def lower_mbar_arrive(cg: CodeGen, op: Operation) -> None:
    """One arrival on behalf of the whole partition: every thread's earlier work (e.g. another
    warpgroup's wgmma reading the stage) must be done first, so the partition synchronizes, then
    its first thread arrives. With ``multicast``, that thread arrives on the barrier at the same
    offset in each CTA of the mask (``mapa``; ``mbarrier.arrive.relaxed.cluster.shared::cluster``,
    PTX ISA 9.7.13.15.13). Relaxed: the arrival releases a buffer whose reads have completed
    (``wgmma_wait``), so it needs no memory ordering; with ``.release.cluster`` the H200 ran the
    multicast sparse GEMM 2.5x slower (2784 against 1100 µs at 8192³, measured 2026-11-30)."""
    bar: BarRef = cg.get(op.operand("bar"))
    arrive = _multicast_arrival(cg, op, bar) if op.attrs.get("multicast") else (
        lambda: cg.intrinsic("i64", "llvm.nvvm.mbarrier.arrive.shared", [bar_ptr(cg, bar)]))
    if op.attrs.get("per") == "warp":
        # each warp arrives once, from its first lane, after its own lanes converged: no named
        # barrier, so a warp that finished its wait_group does not wait for its warpgroup's others
        # (the barrier's count is the number of arriving warps, so it still completes only when
        # every warp got here)
        cg.asm("void", "bar.warp.sync -1;", "", [], side_effect=True, convergent=True)
        _in_first_thread_of(cg, 32, arrive, "warp_lead")
        return
    if op.attrs.get("per") == "warpgroup":
        if cg.num_warps % 4:
            raise InternalError(f"a per-warpgroup arrival in {cg.num_warps} warps reached the lowering "
                                "(legality SP0566)", op.span)
        # every warpgroup synchronizes its own 128 threads (barrier 8 + its index in the CTA) and
        # its first thread arrives
        bar_id = cg.fb.binop("add", cg.fb.binop("lshr", cg.tid, const(7, "i32")), const(8, "i32"))
        cg.asm("void", "bar.sync $0, 128;", "r", [bar_id], side_effect=True, convergent=True)
        _in_first_thread_of(cg, 128, arrive, "wg_lead")
        return
    if cg.num_warps > 1 or cg.part.index < 0:
        cg.barrier()
    emit_in_leader(cg, arrive)


def _in_first_thread_of(cg: CodeGen, threads: int, emit: Callable[[], None], label: str) -> None:
    """Run ``emit()`` in the first thread of each aligned group of ``threads`` (a power of two: a
    warp, a warpgroup)."""
    first = cg.fb.icmp("eq", cg.fb.binop("and", cg.tid, const(threads - 1, "i32")), const(0, "i32"))
    emit_where(cg, first, emit, label)

def _multicast_arrival(cg: CodeGen, op: Operation, bar: BarRef) -> Callable[[], None]:
    """Emit, in the arriving thread, one remote arrival per CTA of the mask (a loop over the
    cluster's ranks, each arrival predicated on its bit)."""
    from ...frontend.ops.cluster import cluster_size
    from .cluster import map_shared

    require(cg.target, Feature.CLUSTER, op.span, what="an arrival on other CTAs' mbarriers (multicast=)")
    mask = cg.scalar(op.operand("mask"))
    size = cluster_size(cg.state.cluster or (1, 1, 1))

    def emit() -> None:
        local = bar_ptr(cg, bar)
        for rank in range(size):
            bit = cg.fb.binop("and", cg.fb.binop("lshr", mask, const(rank, "i32")), const(1, "i32"))
            on = cg.fb.icmp("ne", bit, const(0, "i32"))
            remote = map_shared(cg, local, const(rank, "i32"))
            cg.asm("void", "{ .reg .pred p; setp.ne.b32 p, $1, 0; "
                   "@p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [$0]; }", "r,r",
                   [remote, cg.fb.value(f"zext i1 {on.ref} to i32", "i32", "on")], side_effect=True)

    return emit


@lowering("mbarrier.wait")
def lower_mbar_wait(cg: CodeGen, op: Operation) -> None:
    bar: BarRef = cg.get(op.operand("bar"))
    parity = cg.fb.binop("and", cg.scalar(op.operand("phase")), const(1, "i32"))
    fb = cg.fb
    ptr = bar_ptr(cg, bar)
    loop, done = fb.new_block("mbar_wait"), fb.new_block("mbar_done")
    fb.br(loop)
    fb.set_block(loop)
    # In a cluster kernel, arrivals may come from other CTAs. On sm_90 they are TMA completions
    # (multicast) and relaxed arrivals (mbarrier.arrive multicast=): neither is a release to pair
    # with, so the wait acquires at CTA scope; at cluster scope the H200 ran the multicast sparse
    # GEMM 8% slower (1191 against 1100 µs, 2026-11-30). Blackwell cluster kernels (tcgen05 commits
    # to peer barriers, unverified on hardware) keep the conservative cluster scope (PTX ISA
    # 9.7.13.15.16; docs/blackwell.md §7).
    scope = "cluster" if cg.state.cluster and cg.target.has(Feature.TCGEN05) else "cta"
    ok = cg.intrinsic("i1", f"llvm.nvvm.mbarrier.try.wait.parity.scope.{scope}.space.cta", [ptr, parity])
    assert ok is not None
    fb.cond_br(ok, done, loop)
    fb.set_block(done)


# ------------------------------------------------------------------------------------------------
# fences and barriers (the TMA copies are lowered in tma.py)
# ------------------------------------------------------------------------------------------------
@lowering("fence.async_shared")
def lower_fence_async(cg: CodeGen, op: Operation) -> None:
    cg.intrinsic("void", "llvm.nvvm.fence.proxy.async.shared_cta", [])


@lowering("barrier")
def lower_barrier(cg: CodeGen, op: Operation) -> None:
    cg.barrier()


# ------------------------------------------------------------------------------------------------
# warp specialization
# ------------------------------------------------------------------------------------------------
@lowering("warp_specialize")
def lower_warp_specialize(cg: CodeGen, op: Operation) -> None:
    warps, regs = op.attrs["warps"], op.attrs["regs"]
    if sum(warps) != cg.total_warps:
        raise InternalError(f"partitions of {sum(warps)} warps in a {cg.total_warps}-warp kernel reached the lowering "
                            "(legality SP0563)", op.span)
    if cg.part.index >= 0:
        raise InternalError("a nested warp_specialize reached the lowering (legality SP0564)", op.span)
    fb = cg.fb
    warp = fb.value(f"lshr i32 {cg.tid.ref}, 5", "i32", "pw")
    done = fb.new_block("ws_done")
    first = 0
    saved_part, saved_hoist = cg.part, fb.hoist
    for i, (region, w, r) in enumerate(zip(op.regions, warps, regs, strict=True)):
        body = fb.new_block(f"ws_part{i}")
        nxt = fb.new_block(f"ws_check{i + 1}") if i + 1 < len(warps) else done
        inside = fb.icmp("ult", fb.binop("sub", warp, const(first, "i32")), const(w, "i32"))
        fb.cond_br(inside, body, nxt)
        fb.set_block(body)
        fb.hoist = body
        cg.part = PartitionCtx(i, first, w)
        if r is not None:
            if w % 4:
                raise InternalError(f"a register budget on {w} warps reached the lowering (legality SP0565)", op.span)
            inc = r > cg.state.default_regs
            kind = "inc" if inc else "dec"
            cg.intrinsic("void", f"llvm.nvvm.setmaxnreg.{kind}.sync.aligned.u32", [const(r, "i32")],
                         convergent=True)
            cg.extra_fn_attrs["nvvm.minctasm"] = "1"
        cg.lower_block(region.block)
        fb.br(done)
        fb.set_block(nxt)
        first += w
    cg.part, fb.hoist = saved_part, saved_hoist
