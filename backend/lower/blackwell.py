"""Blackwell (sm_100a / sm_103a / sm_110a): tensor memory (PTX ISA 9.7.16; docs/hardware.md §1-2,
§7), the lowering of the ``tmem`` ops of ``frontend/ops/blackwell.py``, and the helpers that the
``tcgen05`` issue path (``blackwell_mma.py``) and the tile-level MMA (``blackwell_tile.py``) share.

* **One TMEM allocation per CTA.** The ``prepare`` hook inserts ``tmem.init`` at the start of the
  kernel (warp 0: ``tcgen05.alloc`` of the power-of-two column count sema placed every
  ``tmem.alloc`` in, ``relinquish_alloc_permit``; then ``fence::before_thread_sync``, ``bar.sync``,
  ``fence::after_thread_sync``, every thread reads the base address) and ``tmem.release`` at its
  end, the one exit of every thread (fence, ``bar.sync``, warp 0 ``tcgen05.dealloc``).
* **TMEM <-> registers** through the access plan of the layout algebra
  (``layout.tmem_access.tmem_access_plan``): the anchor hook gives ``ref.load()`` results the
  ``32x32b`` register layout of the region; other layouts are converted first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...frontend.diagnostics import CompileError, Diagnostic, InternalError
from ...frontend.ir import types as T
from ...frontend.ir.core import Function, Operation
from ...frontend.layout.gf2 import LayoutError
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import normalize
from ...frontend.layout.tmem_access import TmemAccessPlan, tmem_access_plan, tmem_register_layout
from ...frontend.ops.blackwell_operands import (
    TMEM_LANES,
    tmem_chunk_layout,
    tmem_packing,
    tmem_tile_columns,
    tmem_view_layout,
)
from ...target.hooks import PreparedState, TargetHooks
from ...target.smem_desc import SmemDesc, encode_tcgen05_smem_desc
from ...target.targets import Feature, require
from .asynchronous import SmemRef, smem_base_address
from .codegen import CodeGen, DTile, lowering
from .llvm_text import LLValue, const, llvm_type

SWIZZLE_NAME = {128: "128B", 64: "64B", 32: "32B"}
TMEM_PTR = "ptr addrspace(6)"


@dataclass(frozen=True)
class TmemRef:
    """A TMEM view in code generation: ``addr`` is the TMEM address (lane 0) of its first column,
    ``tile_stride`` the columns between its 128-row tiles, ``stage_stride`` between stages."""

    addr: LLValue
    type: T.TmemType
    tile_stride: int
    stage_stride: int = 0


# ================================================================================================
# Hooks
# ================================================================================================
def register_layout(t: T.TmemType, num_warps: int, chunks: bool = False) -> LinearLayout | None:
    """The register layout ``tcgen05.ld.32x32b`` gives a 2-D TMEM view (warp w%4 its lane quarter,
    further warpgroups the upper columns), or None when the partition cannot access TMEM. A 64-row
    view (the M = 64 accumulator, 16 lanes per quarter) takes ``16x32bx2`` instead: thread t < 16
    row t of its warp's 16, the left half of the columns, thread t + 16 the same row's right half."""
    if num_warps % 4 or len(t.shape) != 2 or any(not T.is_power_of_two(x) for x in t.shape):
        return None
    shape = "16x32bx2" if t.shape[0] == TMEM_LANES // 2 else "32x32b"
    try:
        tl = tmem_chunk_layout(t) if chunks else tmem_view_layout(t)
        return normalize(tmem_register_layout(tl, shape, num_warps, unpack=True), num_warps)
    except (LayoutError, ValueError):
        return None


def anchor(op: Operation, num_warps: int) -> dict[int, LinearLayout]:
    """``ref.load()`` results and ``ref.store(x)`` values take the region's ``32x32b`` layout; so do
    the accumulators (and metadata words) of tile MMAs reserved for tcgen05."""
    if op.name in ("tmem.load", "tmem.load_chunks", "tmem.store"):
        lay = register_layout(op.operand("ref").type, num_warps, chunks=op.name == "tmem.load_chunks")
        if lay is not None:
            return {id(op.result if op.name != "tmem.store" else op.operand("value")): lay}
    if op.name in ("dot", "sparse_dot"):
        from .blackwell_tile import anchor as tile_anchor

        return tile_anchor(op, num_warps)
    return {}


def tmem_columns_used(func: Function) -> int:
    """The columns of the CTA's one TMEM allocation: a power of two >= 32 covering every
    ``tmem.alloc`` (placed by sema, docs/hardware.md §2 "alloc") and the columns reserved for tile
    MMAs; 0 when there is nothing."""
    end = 0
    for op in func.walk():
        if op.name == "tmem.alloc":
            end = max(end, op.attrs["col"] + op.attrs["ncols"])
        elif "tc_col" in op.attrs:
            end = max(end, op.attrs["tc_col"] + op.attrs["tc_ncols"])
    if not end:
        return 0
    n = 32
    while n < end:
        n *= 2
    return n


def prepare(func: Function, target: Any, num_warps: int) -> PreparedState | None:
    """Reserve TMEM for tile MMAs, then insert the kernel-wide TMEM allocation (start) and
    deallocation (end); None when the kernel uses no TMEM."""
    from ...frontend.ir.core import Builder
    from .blackwell_tile import reserve

    block = func.body.block
    init = next((op for op in block.ops if op.name == "tmem.init"), None)
    if init is not None:  # prepared before (the same function compiled again)
        return PreparedState(tmem_ncols=init.attrs["ncols"])
    user_end = max((op.attrs["col"] + op.attrs["ncols"] for op in func.walk() if op.name == "tmem.alloc"),
                   default=0)
    reserve(func, target, num_warps, user_end)
    ncols = tmem_columns_used(func)
    if not ncols:
        return None
    first = next(op for op in func.walk() if op.name == "tmem.alloc" or "tc_col" in op.attrs)
    b = Builder(block)
    if block.ops:
        b.set_insertion_point_before(block.ops[0])
    group = kernel_cta_group(func)
    b.create("tmem.init", [], [], {"ncols": ncols, "cta_group": group}, first.span)
    b.set_insertion_point_end(block)
    b.create("tmem.release", [], [], {"ncols": ncols, "cta_group": group}, first.span)
    return PreparedState(tmem_ncols=ncols)


def kernel_cta_group(func: Function) -> int:
    """2 when the kernel's tcgen05 ops work on CTA pairs (all of them must: ptxas rejects a kernel
    that mixes ``.cta_group::1`` and ``::2``, docs/hardware.md §1.1; legality SP0556), else 1."""
    return 2 if any(op.attrs.get("cta_group") == 2 for op in func.walk() if op.name.startswith("tcgen05.")) else 1


HOOKS = TargetHooks(anchor=anchor, prepare=prepare)


# ================================================================================================
# Helpers
# ================================================================================================
def require_tcgen05(cg: CodeGen, op: Operation, what: str = "`tcgen05` / tensor memory") -> None:
    """Report ``op`` (``targets.require``) when the target has no tcgen05 / tensor memory."""
    require(cg.target, Feature.TCGEN05, op.span, what=what)


def intrinsic(cg: CodeGen, ret: str, name: str, args: list[LLValue]) -> LLValue | None:
    """A call of the tcgen05 intrinsic ``name``, marked convergent."""
    return cg.intrinsic(ret, name, args, convergent=True)


def tmem_ptr(cg: CodeGen, addr: LLValue, offset: int = 0) -> LLValue:
    a = cg.fb.binop("add", addr, const(offset, "i32")) if offset else addr
    return cg.fb.value(f"inttoptr i32 {a.ref} to {TMEM_PTR}", TMEM_PTR, "tm")


def _issuer(cg: CodeGen) -> LLValue:
    """True in the one thread of the current partition that issues tcgen05 operations: the
    ``elect.sync`` leader of its warp 0, computed once at the partition's entry."""
    key = id(cg.fb.hoist)
    if key not in cg.state.issuers:
        fb = cg.fb
        cg.mod.declare("llvm.nvvm.elect.sync", "declare {i32, i1} @llvm.nvvm.elect.sync(i32) #1")
        w0 = fb.value(f"icmp eq i32 {cg.warp_id().ref}, 0", "i1", "w0", entry=True)
        e = fb.value("call {i32, i1} @llvm.nvvm.elect.sync(i32 -1) #1", "{i32, i1}", "el", entry=True)
        p = fb.value(f"extractvalue {{i32, i1}} {e.ref}, 1", "i1", "elp", entry=True)
        cg.state.issuers[key] = fb.value(f"and i1 {w0.ref}, {p.ref}", "i1", "issuer", entry=True)
    return cg.state.issuers[key]


def emit_in_issuer(cg: CodeGen, emit: Any, pair: bool = False) -> None:
    """Run ``emit()`` in the issuing thread; ``pair`` (a cta_group::2 op): only in the even CTA of
    the CTA pair, one thread of which issues for both (PTX ISA 9.7.16.5)."""
    fb = cg.fb
    then, done = fb.new_block("tc_issue"), fb.new_block("tc_issued")
    cond = _issuer(cg)
    if pair:
        from .cluster import cluster_rank

        odd = fb.binop("and", cluster_rank(cg), const(1, "i32"))
        cond = fb.binop("and", cond, fb.icmp("eq", odd, const(0, "i32")))
    fb.cond_br(cond, then, done)
    fb.set_block(then)
    emit()
    fb.br(done)
    fb.set_block(done)


def _warp0_do(cg: CodeGen, emit: Any) -> None:
    """Run ``emit()`` in warp 0 of the CTA (a warp-uniform branch: ``.sync.aligned`` forms)."""
    fb = cg.fb
    w = fb.value(f"lshr i32 {cg.tid.ref}, 5", "i32", "cw")
    then, done = fb.new_block("tc_warp0_"), fb.new_block("tc_warp0_done")
    fb.cond_br(fb.icmp("eq", w, const(0, "i32")), then, done)
    fb.set_block(then)
    emit()
    fb.br(done)
    fb.set_block(done)


def smem_descriptor(cg: CodeGen, ref: SmemRef, row: int, col: int) -> LLValue:
    """The tcgen05 shared-memory descriptor (docs/hardware.md §1.5, §9) of the K-major swizzled
    operand sub-tile at (row, col): start address of that element (K advances inside a swizzle
    row by adding ``bytes >> 4``), LBO unused (16), SBO = 8 rows x swizzle span, version bit 46,
    swizzle code, base offset 0 (buffers are 1024-byte aligned)."""
    if ref.swizzle not in SWIZZLE_NAME:
        raise InternalError("tcgen05 operands must be swizzled (sema checks this)")
    fb = cg.fb
    panel, within = divmod(col, ref.panel_cols)
    off = panel * ref.full_rows * ref.swizzle + row * ref.swizzle + within * ref.ebytes
    return smem_desc_at(cg, fb.binop("add", ref.base, const(off, "i32")) if off else ref.base,
                        SmemDesc(0, 16, 8 * ref.swizzle, SWIZZLE_NAME[ref.swizzle]))


def smem_desc_at(cg: CodeGen, offset: LLValue, fields: SmemDesc) -> LLValue:
    """The tcgen05 shared-memory descriptor ``fields`` of the operand at byte ``offset`` of shared memory."""
    fb = cg.fb
    addr = fb.binop("add", smem_base_address(cg), offset)
    lo = fb.binop("and", fb.binop("lshr", addr, const(4, "i32")), const(0x3FFF, "i32"))
    return fb.binop("or", fb.cast("zext", lo, "i64"), const(encode_tcgen05_smem_desc(fields), "i64"))


# ================================================================================================
# TMEM allocation and views
# ================================================================================================
@lowering("tmem.init")
def lower_tmem_init(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
    ncols = op.attrs["ncols"]
    slot = cg.smem_alloc(4, 16)

    g = op.attrs.get("cta_group", 1)  # ::2: warp 0 of each CTA of the pair allocates collectively

    def alloc() -> None:
        intrinsic(cg, "void", f"llvm.nvvm.tcgen05.alloc.shared.cg{g}", [cg.smem_ptr(slot), const(ncols, "i32")])
        intrinsic(cg, "void", f"llvm.nvvm.tcgen05.relinq.alloc.permit.cg{g}", [])

    _warp0_do(cg, alloc)
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])
    cg.barrier()
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
    base = cg.fb.value(f"load i32, ptr addrspace(3) {cg.smem_ptr(slot).ref}, align 4", "i32", "tmem_base")
    cg.state.tmem_base = base


@lowering("tmem.release")
def lower_tmem_release(cg: CodeGen, op: Operation) -> None:
    base = cg.state.tmem_base
    if base is None:
        raise InternalError("tmem.release without tmem.init", op.span)
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])
    cg.barrier()
    g = op.attrs.get("cta_group", 1)
    if g == 2:  # the peer's TMEM accesses (the pair's MMAs) end before the collective dealloc (PTX ISA 9.7.16.5)
        from .cluster import cluster_barrier

        cluster_barrier(cg)

    def free() -> None:
        intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
        intrinsic(cg, "void", f"llvm.nvvm.tcgen05.dealloc.cg{g}",
                  [tmem_ptr(cg, base), const(op.attrs["ncols"], "i32")])

    _warp0_do(cg, free)


@lowering("tmem.alloc")
def lower_tmem_alloc(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
    base = cg.state.tmem_base
    if base is None:
        raise InternalError("tmem.alloc lowered before the kernel's TMEM allocation", op.span)
    t = op.result.type
    tile = tmem_tile_columns(t)
    stage = (t.shape[-2] // 128) * tile
    cg.set(op.result, TmemRef(cg.fb.binop("add", base, const(op.attrs["col"], "i32")), t, tile, stage))


@lowering("tmem.index")
def lower_tmem_index(cg: CodeGen, op: Operation) -> None:
    ref: TmemRef = cg.get(op.operand("ref"))
    i = cg.scalar(op.operand("index"))
    fb = cg.fb
    addr = fb.binop("add", ref.addr, fb.binop("mul", i, const(ref.stage_stride, "i32")))
    cg.set(op.result, TmemRef(addr, op.result.type, ref.tile_stride))


@lowering("tmem.slice")
def lower_tmem_slice(cg: CodeGen, op: Operation) -> None:
    ref: TmemRef = cg.get(op.operand("ref"))
    start = cg.scalar(op.operand("start"))
    fb = cg.fb
    if op.attrs["dim"] == 0:
        off = fb.binop("mul", fb.binop("lshr", start, const(7, "i32")), const(ref.tile_stride, "i32"))
    else:
        p = tmem_packing(ref.type)
        off = fb.binop("udiv", start, const(p, "i32")) if p > 1 else start
    cg.set(op.result, TmemRef(fb.binop("add", ref.addr, off), op.result.type, ref.tile_stride))


# ================================================================================================
# TMEM <-> registers
# ================================================================================================
def _check_partition(cg: CodeGen, op: Operation) -> None:
    """Warp w may only touch TMEM lanes 32·(%warpid % 4).. (docs/hardware.md §2): the partition must
    be whole warpgroups starting at a warpgroup boundary, so its warp i has quarter i % 4."""
    if cg.num_warps % 4 or cg.part.first_warp % 4:
        raise CompileError([Diagnostic(
            "SP0550", f"tcgen05.ld/st run on whole warpgroups: this partition has {cg.num_warps} warp(s) starting "
            f"at warp {cg.part.first_warp}", op.span,
            help="give TMEM loads/stores to a partition of 4 (or 8, ...) warps placed at a multiple of 4 "
                 "(list it first in warp_specialize)")])


def _plan(t: T.TmemType, layout: LinearLayout, nw: int, direction: str, chunks: bool,
          lane_offset: int = 0) -> TmemAccessPlan:
    tl = tmem_chunk_layout(t) if chunks else tmem_view_layout(t)
    return tmem_access_plan(tl, layout, nw, direction=direction, lane_offset=lane_offset)


def _warp_address(cg: CodeGen, ref: TmemRef, plan: TmemAccessPlan) -> LLValue:
    """The TMEM address of this warp's part (PTX ISA "Tensor Memory Addressing": lane in bits
    16-31, column in bits 0-15): warp 0's base from the plan (the lane offset), then the image of
    each set bit of the partition-relative warp index (its lane quarter, or the columns of
    further warpgroups).

    The warp map is linear over GF(2): the images combine by XOR. When no two images share an
    address bit (every layout code generation chooses) XOR is a sum and they are added one at a
    time; otherwise their XOR is added. Every warp's address is checked against the plan."""
    fb = cg.fb
    bases = [(lane << 16) + col for lane, col in plan.warp_bases]
    base0 = bases[0]
    nbits = (len(bases) - 1).bit_length()
    deltas = [bases[1 << b] - base0 for b in range(nbits)]
    for w, want in enumerate(bases):
        got = 0
        for b, d in enumerate(deltas):
            got ^= d if w >> b & 1 else 0
        if base0 + got != want:
            raise InternalError(f"the TMEM access plan's warp bases are not affine in the warp index: warp {w} "
                                f"has base {plan.warp_bases[w]}")
    disjoint = all(not deltas[i] & deltas[j] for i in range(nbits) for j in range(i + 1, nbits))
    addr = fb.binop("add", ref.addr, const(base0, "i32")) if base0 else ref.addr
    off: LLValue | None = None
    for b, delta in enumerate(deltas):
        if delta:
            bit = fb.binop("and", fb.binop("lshr", cg.warp_id(), const(b, "i32")), const(1, "i32"))
            term = fb.binop("mul", bit, const(delta, "i32"))
            if disjoint:
                addr = fb.binop("add", addr, term)
            else:
                off = term if off is None else fb.binop("xor", off, term)
    return addr if off is None else fb.binop("add", addr, off)


def _access_name(plan: TmemAccessPlan, op: str) -> tuple[str, str]:
    n = plan.regs_per_instruction
    vec = "i32" if n == 1 else f"<{n} x i32>"
    return f"llvm.nvvm.tcgen05.{op}.{plan.shape}.x{plan.num}", vec


def _tied_wait_ld(cg: CodeGen, words: list[LLValue]) -> list[LLValue]:
    """``tcgen05.wait::ld`` that redefines the loaded registers (tied asm operands), so that no
    use of a loaded value can be scheduled above the wait (PTX ISA 9.7.16.8.3)."""
    out: list[LLValue] = []
    fb = cg.fb
    for start in range(0, len(words), 128):
        chunk = words[start:start + 128]
        cons = ",".join(["=r"] * len(chunk)) + "," + ",".join(str(i) for i in range(len(chunk)))
        ret = "{" + ", ".join(["i32"] * len(chunk)) + "}"
        res = cg.asm(ret, "tcgen05.wait::ld.sync.aligned;", cons, chunk, side_effect=True, convergent=True)
        assert res is not None
        out.extend(fb.extract(res, i, "i32") for i in range(len(chunk)))
    return out


def _to_element(cg: CodeGen, word: LLValue, bit_offset: int, bits: int, elem: T.ScalarType) -> LLValue:
    """Element ``elem`` stored in ``bits`` bits at ``bit_offset`` of a 32-bit TMEM word (a 16-bit
    accumulator sits in the low half of its cell)."""
    fb = cg.fb
    width = min(bits, elem.bits) if elem.bits < 32 else 32
    v = fb.binop("lshr", word, const(bit_offset, "i32")) if bit_offset else word
    if width < 32:
        if width < 8:
            v = fb.binop("and", v, const((1 << width) - 1, "i32"))
            return fb.cast("trunc", v, "i8")
        v = fb.cast("trunc", v, f"i{width}")
    ty = llvm_type(elem)
    return fb.cast("bitcast", v, ty) if ty in ("float", "half", "bfloat") else v


def _from_element(cg: CodeGen, v: LLValue, elem: T.ScalarType) -> LLValue:
    fb = cg.fb
    if v.type in ("float", "half", "bfloat"):
        v = fb.cast("bitcast", v, f"i{elem.bits}")
    return fb.cast("zext", v, "i32") if v.type != "i32" else v


def load_tile(cg: CodeGen, ref: TmemRef, want: LinearLayout, elem: T.ScalarType, span: Any,
              chunks: bool = False, *, lane_offset: int = 0) -> DTile:
    """``tcgen05.ld`` of a TMEM view into a tile of layout ``want`` (through the region's own
    ``32x32b`` layout and a conversion when no atom produces ``want`` directly). ``lane_offset``
    (0 or 16) reads the view 16 lanes into each warp's quarter (``tmem_access_plan``)."""
    nw = cg.num_warps
    plan = _plan(ref.type, want, nw, "load", chunks, lane_offset)
    layout = want
    if not plan.ok:  # load in the region's own layout, then convert
        layout = register_layout(ref.type, nw, chunks)
        if layout is None:
            raise CompileError([Diagnostic("SP0550", f"no tcgen05.ld atom can read {ref.type}", span)])
        plan = _plan(ref.type, layout, nw, "load", chunks, lane_offset).require(span)
    fb = cg.fb
    waddr = _warp_address(cg, ref, plan)
    name, vec = _access_name(plan, "ld")
    words: list[LLValue] = []
    for ins in plan.instructions:
        args = [tmem_ptr(cg, waddr, (ins.lane_offset << 16) + ins.col_offset)]
        if plan.half_split is not None:
            args.append(const(plan.half_split, "i64"))
        args.append(const(0, "i1"))
        v = intrinsic(cg, vec, name, args)
        assert v is not None
        if plan.regs_per_instruction == 1:
            words.append(v)
        else:
            words.extend(fb.extract_element(v, i, "i32") for i in range(plan.regs_per_instruction))
    words = _tied_wait_ld(cg, words)
    regs = []
    for row in plan.sources:
        src = row[0]
        regs.append(_to_element(cg, words[src.instruction * plan.regs_per_instruction + src.slot], src.bit_offset,
                                src.bits, elem))
    tile = DTile(layout, regs, elem)
    if layout != want:
        from .reduce import convert_tile

        tile = convert_tile(cg, tile, want, tuple(size for _, size in want.out_dims))
    return tile


def _emit_load(cg: CodeGen, op: Operation, chunks: bool) -> None:
    require_tcgen05(cg, op)
    _check_partition(cg, op)
    res = op.result
    elem = T.element_type(res.type)
    assert isinstance(elem, T.ScalarType)
    cg.set(res, load_tile(cg, cg.get(op.operand("ref")), res.layout, elem, op.span, chunks))


@lowering("tmem.load")
def lower_tmem_load(cg: CodeGen, op: Operation) -> None:
    _emit_load(cg, op, chunks=False)


@lowering("tmem.load_chunks")
def lower_tmem_load_chunks(cg: CodeGen, op: Operation) -> None:
    _emit_load(cg, op, chunks=True)


def store_tile(cg: CodeGen, ref: TmemRef, x: DTile, span: Any, *, lane_offset: int = 0) -> None:
    """``tcgen05.st`` of a tile into a TMEM view (converted to the region's ``32x32b`` layout when
    no atom takes its layout), then ``tcgen05.wait::st``. ``lane_offset`` as for :func:`load_tile`.

    When the tile's layout replicates over warps, only the warps of the plan's ``predicate`` store
    (a warp-uniform branch around the ``.sync.aligned`` stores, PTX ISA "tcgen05.st"), so every
    TMEM cell has one writer."""
    nw = cg.num_warps
    plan = _plan(ref.type, x.layout, nw, "store", False, lane_offset)
    if not plan.ok:
        from .reduce import convert_tile

        layout = register_layout(ref.type, nw)
        if layout is None:
            raise CompileError([Diagnostic("SP0550", f"no tcgen05.st atom can write {ref.type}", span)])
        x = convert_tile(cg, x, layout, tuple(ref.type.shape))
        plan = _plan(ref.type, layout, nw, "store", False, lane_offset).require(span)
    fb = cg.fb
    elem = x.elem
    assert isinstance(elem, T.ScalarType)
    n = plan.regs_per_instruction
    words: list[LLValue | None] = [None] * (len(plan.instructions) * n)
    for r, row in enumerate(plan.sources):
        src = row[0]
        v = _from_element(cg, x.regs[r], elem)
        if elem.bits < 32 and src.bits < 32:
            v = fb.binop("and", v, const((1 << src.bits) - 1, "i32"))
        if src.bit_offset:
            v = fb.binop("shl", v, const(src.bit_offset, "i32"))
        i = src.instruction * n + src.slot
        words[i] = v if words[i] is None else fb.binop("or", words[i], v)  # type: ignore[arg-type]
    waddr = _warp_address(cg, ref, plan)
    name, vec = _access_name(plan, "st")
    done = None
    if plan.predicate:  # replicated over warps: the warps whose replicated bits are 0 store
        mask = sum(1 << b for _, b in plan.predicate)
        masked = fb.binop("and", cg.warp_id(), const(mask, "i32"))
        then, done = fb.new_block("tmem_st"), fb.new_block("tmem_st_done")
        fb.cond_br(fb.icmp("eq", masked, const(0, "i32")), then, done)
        fb.set_block(then)
    for k, ins in enumerate(plan.instructions):
        data = [w if w is not None else const(0, "i32") for w in words[k * n:(k + 1) * n]]
        if n == 1:
            packed = data[0]
        else:
            packed = LLValue("poison", vec)
            for j, w in enumerate(data):
                packed = fb.insert_element(packed, w, j)
        args = [tmem_ptr(cg, waddr, (ins.lane_offset << 16) + ins.col_offset)]
        if plan.half_split is not None:
            args.append(const(plan.half_split, "i64"))
        intrinsic(cg, "void", name, [*args, packed, const(0, "i1")])
    if done is not None:
        fb.br(done)
        fb.set_block(done)
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.wait.st", [])


@lowering("tmem.store")
def lower_tmem_store(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
    _check_partition(cg, op)
    store_tile(cg, cg.get(op.operand("ref")), cg.tile(op.operand("value")), op.span)


__all__ = ["HOOKS", "TmemRef", "anchor", "emit_in_issuer", "intrinsic", "load_tile", "prepare", "register_layout",
           "require_tcgen05", "smem_desc_at", "smem_descriptor", "store_tile", "tmem_columns_used", "tmem_ptr"]

from . import blackwell_tile  # noqa: E402, F401  (registers the tile-level dot / sparse_dot lowering)
