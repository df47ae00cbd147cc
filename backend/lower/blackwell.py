"""Blackwell (sm_100a / sm_103a / sm_110a): tensor memory and ``tcgen05`` (PTX ISA 9.7.16;
docs/hardware.md §1-2, §6-7), the lowering of ``frontend/ops/blackwell.py``.

* **One TMEM allocation per CTA.** The ``prepare`` hook inserts ``tmem.init`` at the start of the
  kernel (warp 0: ``tcgen05.alloc`` of the power-of-two column count sema placed every
  ``tmem.alloc`` in, ``relinquish_alloc_permit``; then ``fence::before_thread_sync``, ``bar.sync``,
  ``fence::after_thread_sync``, every thread reads the base address) and ``tmem.release`` at its
  end, the one exit of every thread (fence, ``bar.sync``, warp 0 ``tcgen05.dealloc``).
* **Single-thread issue.** ``tcgen05.mma`` / ``cp`` / ``commit`` run in one thread: ``elect.sync``
  in warp 0 of the current partition, evaluated once at the partition's entry so that the MMAs
  and the commit that tracks them come from the same thread (commit arrives when the async ops
  *of its thread* are done, §2).
* **MMA splitting** (:func:`mma_plan`): one ``tcgen05.mma`` call becomes K steps x M tiles (128
  rows) x N tiles (<= 256 columns); the metadata column of step ``ks`` in M tile ``mt`` is
  ``mt·tile_stride + (ks // p)·2`` with selector ``ks % p``, ``p = 2 // columns-per-instruction``
  (docs/hardware.md §11: 16-bit/tf32 column pairs with selector 0/1; 8-bit selector 0 and two
  columns per instruction). Instruction descriptors come from ``descriptors.encode_idesc``,
  shared-memory descriptors from ``descriptors.encode_tcgen05_smem_desc`` (version bit 46).
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
from ...frontend.layout.layouts import LayoutError, LinearLayout
from ...frontend.layout.tile import normalize
from ...frontend.layout.tmem_access import TmemAccessPlan, tmem_access_plan, tmem_register_layout
from ...frontend.ops.blackwell import (
    D_DTYPE,
    PTX_DTYPE,
    instr_k,
    meta_columns_per_instr,
    split_n,
    tmem_chunk_layout,
    tmem_packing,
    tmem_tile_columns,
    tmem_view_layout,
)
from ...target.descriptors import InstrDesc, SmemDesc, encode_idesc, encode_tcgen05_smem_desc
from ...target.hooks import PreparedState, TargetHooks
from ...target.targets import Feature, require
from .asynchronous import SmemRef, bar_ptr, smem_base_address
from .codegen import CodeGen, DTile, lowering
from .llvm_text import LLValue, const, llvm_type

KIND_CODE = {"f16": 0, "tf32": 1, "f8f6f4": 2, "i8": 3}  # intrinsic immarg (docs/hardware.md §6)
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
    further warpgroups the upper columns), or None when the partition cannot access TMEM."""
    if num_warps % 4 or len(t.shape) != 2 or any(not T.is_power_of_two(x) for x in t.shape):
        return None
    try:
        tl = tmem_chunk_layout(t) if chunks else tmem_view_layout(t)
        return normalize(tmem_register_layout(tl, "32x32b", num_warps, unpack=True), num_warps)
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
def _require_tcgen05(cg: CodeGen, op: Operation, what: str = "`tcgen05` / tensor memory") -> None:
    require(cg.target, Feature.TCGEN05, op.span, what=what)


def _intrinsic(cg: CodeGen, ret: str, name: str, args: list[LLValue]) -> LLValue | None:
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


def _issue(cg: CodeGen, emit: Any, pair: bool = False) -> None:
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
    return _desc_at(cg, fb.binop("add", ref.base, const(off, "i32")) if off else ref.base,
                    SmemDesc(0, 16, 8 * ref.swizzle, SWIZZLE_NAME[ref.swizzle]))


def _desc_at(cg: CodeGen, offset: LLValue, fields: SmemDesc) -> LLValue:
    fb = cg.fb
    addr = fb.binop("add", smem_base_address(cg), offset)
    lo = fb.binop("and", fb.binop("lshr", addr, const(4, "i32")), const(0x3FFF, "i32"))
    return fb.binop("or", fb.cast("zext", lo, "i64"), const(encode_tcgen05_smem_desc(fields), "i64"))


# ================================================================================================
# TMEM allocation and views
# ================================================================================================
@lowering("tmem.init")
def lower_tmem_init(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
    ncols = op.attrs["ncols"]
    slot = cg.smem_alloc(4, 16)

    g = op.attrs.get("cta_group", 1)  # ::2: warp 0 of each CTA of the pair allocates collectively

    def alloc() -> None:
        _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.alloc.shared.cg{g}", [cg.smem_ptr(slot), const(ncols, "i32")])
        _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.relinq.alloc.permit.cg{g}", [])

    _warp0_do(cg, alloc)
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])
    cg.barrier()
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
    base = cg.fb.value(f"load i32, ptr addrspace(3) {cg.smem_ptr(slot).ref}, align 4", "i32", "tmem_base")
    cg.state.tmem_base = base


@lowering("tmem.release")
def lower_tmem_release(cg: CodeGen, op: Operation) -> None:
    base = cg.state.tmem_base
    if base is None:
        raise InternalError("tmem.release without tmem.init", op.span)
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])
    cg.barrier()
    g = op.attrs.get("cta_group", 1)
    if g == 2:  # the peer's TMEM accesses (the pair's MMAs) end before the collective dealloc (PTX ISA 9.7.16.5)
        from .cluster import cluster_barrier

        cluster_barrier(cg)

    def free() -> None:
        _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
        _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.dealloc.cg{g}",
                   [tmem_ptr(cg, base), const(op.attrs["ncols"], "i32")])

    _warp0_do(cg, free)


@lowering("tmem.alloc")
def lower_tmem_alloc(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
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


def _plan(t: T.TmemType, layout: LinearLayout, nw: int, direction: str, chunks: bool) -> TmemAccessPlan:
    tl = tmem_chunk_layout(t) if chunks else tmem_view_layout(t)
    return tmem_access_plan(tl, layout, nw, direction=direction)


def _warp_address(cg: CodeGen, ref: TmemRef, plan: TmemAccessPlan) -> LLValue:
    """The TMEM address of this warp's part: lane quarter (and further warps' columns) from the
    plan's warp bases, one bit of the partition-relative warp index at a time."""
    fb = cg.fb
    addr = ref.addr
    nbits = (len(plan.warp_bases) - 1).bit_length()
    for b in range(nbits):
        lane, col = plan.warp_bases[1 << b]
        delta = (lane << 16) + col
        if delta:
            bit = fb.binop("and", fb.binop("lshr", cg.warp_id(), const(b, "i32")), const(1, "i32"))
            addr = fb.binop("add", addr, fb.binop("mul", bit, const(delta, "i32")))
    return addr


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
              chunks: bool = False) -> DTile:
    """``tcgen05.ld`` of a TMEM view into a tile of layout ``want`` (through the region's own
    ``32x32b`` layout and a conversion when no atom produces ``want`` directly)."""
    nw = cg.num_warps
    plan = _plan(ref.type, want, nw, "load", chunks)
    layout = want
    if not plan.ok:  # load in the region's own layout, then convert
        layout = register_layout(ref.type, nw, chunks)
        if layout is None:
            raise CompileError([Diagnostic("SP0550", f"no tcgen05.ld atom can read {ref.type}", span)])
        plan = _plan(ref.type, layout, nw, "load", chunks).require(span)
    fb = cg.fb
    waddr = _warp_address(cg, ref, plan)
    name, vec = _access_name(plan, "ld")
    words: list[LLValue] = []
    for ins in plan.instructions:
        args = [tmem_ptr(cg, waddr, (ins.lane_offset << 16) + ins.col_offset)]
        if plan.half_split is not None:
            args.append(const(plan.half_split, "i64"))
        args.append(const(0, "i1"))
        v = _intrinsic(cg, vec, name, args)
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
    _require_tcgen05(cg, op)
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


def store_tile(cg: CodeGen, ref: TmemRef, x: DTile, span: Any) -> None:
    """``tcgen05.st`` of a tile into a TMEM view (converted to the region's ``32x32b`` layout when
    no atom takes its layout), then ``tcgen05.wait::st``."""
    nw = cg.num_warps
    plan = _plan(ref.type, x.layout, nw, "store", False)
    if not plan.ok:
        from .reduce import convert_tile

        layout = register_layout(ref.type, nw)
        if layout is None:
            raise CompileError([Diagnostic("SP0550", f"no tcgen05.st atom can write {ref.type}", span)])
        x = convert_tile(cg, x, layout, tuple(ref.type.shape))
        plan = _plan(ref.type, layout, nw, "store", False).require(span)
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
        _intrinsic(cg, "void", name, [*args, packed, const(0, "i1")])
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.wait.st", [])


@lowering("tmem.store")
def lower_tmem_store(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
    _check_partition(cg, op)
    store_tile(cg, cg.get(op.operand("ref")), cg.tile(op.operand("value")), op.span)


# ================================================================================================
# tcgen05.mma
# ================================================================================================
@dataclass(frozen=True)
class MmaInstr:
    """One ``tcgen05.mma`` of a split call: K step ``k_step`` of M tile ``m_tile`` and the N tile
    ``[n_start, n_start + n_size)``. Offsets are in elements of A (``a_row``, ``a_col``: stored,
    i.e. compressed, columns) and B, in TMEM columns for D (``d_col``) and the metadata
    (``meta_col``, relative to the metadata view). ``first`` marks the first K step, whose
    ``enable_input_d`` is the call's ``accumulate`` (later steps always accumulate)."""

    k_step: int
    m_tile: int
    n_start: int
    n_size: int
    a_row: int
    a_col: int
    b_row: int
    b_col: int
    d_col: int
    meta_col: int | None
    selector: int
    idesc: int
    first: bool
    a_scale_col: int | None = None
    b_scale_col: int | None = None


def mma_plan(a_elem: T.ScalarType, b_elem: T.ScalarType, acc_elem: T.ScalarType, m: int, n: int, k: int,
             sparse: bool, acc_tile_stride: int, meta_tile_stride: int = 0, cta_group: int = 1,
             block_scale: bool = False) -> list[MmaInstr]:
    """The instructions of ``tcgen05.mma`` over an M x N accumulator and K (see module docstring).

    Metadata (docs/hardware.md §11, §1.4): a 16-bit or tf32 instruction reads one
    column, 8-bit ones two; ``p = 2 // columns`` instructions share a column pair, so step ``ks``
    reads column ``(ks // p)·2`` of its M tile with selector ``ks % p``. The metadata depends on the
    M tile and K step only: every N tile reuses it.

    ``cta_group=2``: ``m`` is this CTA's 128 rows of the pair's M = 256 and ``n`` the whole N (each
    CTA's B holds N/2 rows, read at the same offsets in both): one instruction per K step, its
    descriptor M = 256.

    ``block_scale`` (kind::mxf8f6f4 ``.block_scale``, ``frontend/ops/tmem_scales.py``): K step ``ks``
    uses scale block ``ks``: scale-factor ids ``ks % 4`` for A and B in the descriptor, and the
    scale columns ``a_scale_col`` / ``b_scale_col`` (relative to the scale views)."""
    from ...frontend.ops.blackwell import MMA_KIND
    from ...frontend.ops.tmem_scales import a_scale_column, b_scale_column, scale_id

    kind = "mxf8f6f4" if block_scale else MMA_KIND[a_elem.name]
    step = instr_k(a_elem, sparse)
    a_step = step // 2 if sparse else step
    cols = meta_columns_per_instr(a_elem) if sparse else 0
    pair = 2 // cols if cols else 1
    out = []
    for ks in range(k // step):
        sel = ks % pair if sparse else 0
        meta_in_tile = (ks // pair) * 2 if sparse else None
        for mt in range(m // 128):
            for n0, nsz in split_n(n):
                scales = dict(scale_dtype="ue8m0", a_scale_id=scale_id(ks), b_scale_id=scale_id(ks),
                              block_size=32) if block_scale else {}
                d = InstrDesc(kind, PTX_DTYPE[a_elem.name], PTX_DTYPE[b_elem.name], D_DTYPE[acc_elem.name],
                              128 * cta_group, nsz, sparse=sparse, selector=sel, cta_group=cta_group,
                              **scales)  # type: ignore[arg-type]
                out.append(MmaInstr(ks, mt, n0, nsz, 128 * mt, ks * a_step, n0, ks * step, mt * acc_tile_stride + n0,
                                    None if meta_in_tile is None else mt * meta_tile_stride + meta_in_tile, sel,
                                    encode_idesc(d), ks == 0,
                                    a_scale_column(ks, mt, m) if block_scale else None,
                                    b_scale_column(ks, n0, n) if block_scale else None))
    return out


@lowering("tcgen05.mma")
def lower_mma(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
    kind = op.attrs["kind"]
    if kind == "i8":
        require(cg.target, Feature.TCGEN05_I8, op.span)
    sparse = op.attrs["sparse"]
    a_v, b_v, acc_v = op.operand("a"), op.operand("b"), op.operand("d")
    a, b, acc = cg.get(a_v), cg.get(b_v), cg.get(acc_v)
    meta: TmemRef | None = cg.get(op.operand("a_meta")) if sparse else None
    en = cg.scalar(op.operand("enable"))
    a_elem = a_v.type.elem
    group = op.attrs.get("cta_group", 1)
    scaled = bool(op.attrs.get("block_scale"))
    plan = mma_plan(a_elem, b_v.type.elem, acc_v.type.elem, op.attrs["m"], op.attrs["n"], op.attrs["k"], sparse,
                    acc.tile_stride, meta.tile_stride if meta else 0, group, block_scale=scaled)
    suffix = ".sp" if sparse else ""
    a_tmem = isinstance(a, TmemRef)
    name = f"llvm.nvvm.tcgen05.mma{suffix}.{'tensor' if a_tmem else 'shared'}"
    imm = [const(KIND_CODE[kind], "i32"), const(group, "i32"), const(0, "i32")]
    scale_refs: tuple[TmemRef, TmemRef] | None = None
    if scaled:  # (docs/hardware.md §6: no kind immarg; `.block32` = scale_vec::1X for mxf8f6f4, §1.1)
        require(cg.target, Feature.TCGEN05_MXF8F6F4, op.span)
        name += ".mxf8f6f4.block_scale.block32"
        imm = imm[1:]
        scale_refs = (cg.get(op.operand("a_scale")), cg.get(op.operand("b_scale")))

    def issue() -> None:
        for ins in plan:
            args = [tmem_ptr(cg, acc.addr, ins.d_col)]
            if a_tmem:
                args.append(tmem_ptr(cg, a.addr, ins.a_col // tmem_packing(a.type)))
            else:
                args.append(smem_descriptor(cg, a, ins.a_row, ins.a_col))
            args += [smem_descriptor(cg, b, ins.b_row, ins.b_col), const(ins.idesc, "i32"),
                     en if ins.first else const(1, "i1")]
            if meta is not None:
                args.append(tmem_ptr(cg, meta.addr, ins.meta_col or 0))
            if scale_refs is not None:
                args += [tmem_ptr(cg, scale_refs[0].addr, ins.a_scale_col or 0),
                         tmem_ptr(cg, scale_refs[1].addr, ins.b_scale_col or 0)]
            _intrinsic(cg, "void", name, args + imm)

    _issue(cg, issue, pair=group == 2)


@lowering("tcgen05.copy")
def lower_copy(cg: CodeGen, op: Operation) -> None:
    """``tcgen05.cp.cta_group::1.128x128b [tmem + 4i], desc`` per 2 KB atom (docs/hardware.md §1.4:
    no swizzle, SBO = 128 B, LBO unused, version bit 46; byte row r lands in lane r)."""
    _require_tcgen05(cg, op)
    src: SmemRef = cg.get(op.operand("src"))
    dst: TmemRef = cg.get(op.operand("dst"))
    fields = SmemDesc(0, 0, 128, "none")
    g = op.attrs.get("cta_group", 1)
    if op.attrs.get("scale"):
        _issue(cg, lambda: _copy_scale_atoms(cg, src, dst, op.attrs["atoms"]))
        return

    def issue() -> None:
        for i in range(op.attrs["atoms"]):
            off = cg.fb.binop("add", src.base, const(2048 * i, "i32")) if i else src.base
            _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.cp.128x128b.cg{g}",
                       [tmem_ptr(cg, dst.addr, 4 * i), _desc_at(cg, off, fields)])

    _issue(cg, issue, pair=g == 2)


def _copy_scale_atoms(cg: CodeGen, src: SmemRef, dst: TmemRef, atoms: int) -> None:
    """``tcgen05.cp.cta_group::1.32x128b.warpx4 [tmem + 4i], desc`` per 512-byte scale atom (PTX ISA
    9.7.16.9.2: ``.warpx4`` multicasts the 32 lanes into all four warps' lane quarters, which block
    scaling needs, 9.7.16.10.7). The source is 32 lines of 16 bytes, K-major without swizzle: core
    matrices of 8 lines x 16 bytes, SBO = 128 B between 8-line groups, LBO unused (§1.5)."""
    fields = SmemDesc(0, 0, 128, "none")
    for i in range(atoms):
        off = cg.fb.binop("add", src.base, const(512 * i, "i32")) if i else src.base
        _intrinsic(cg, "void", "llvm.nvvm.tcgen05.cp.32x128b_warpx4.cg1",
                   [tmem_ptr(cg, dst.addr, 4 * i), _desc_at(cg, off, fields)])


@lowering("tcgen05.commit")
def lower_commit(cg: CodeGen, op: Operation) -> None:
    """``tcgen05.commit.cta_group::N.mbarrier::arrive::one.shared::cluster[.multicast::cluster]``."""
    _require_tcgen05(cg, op)
    bar = cg.get(op.operand("bar"))
    g = op.attrs.get("cta_group", 1)
    if op.attrs.get("multicast"):
        mask = cg.scalar(op.operand("mask"))

        def issue() -> None:
            m16 = cg.fb.cast("trunc", mask, "i16")
            _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.commit.mc.shared.cg{g}", [bar_ptr(cg, bar), m16])

        _issue(cg, issue, pair=g == 2)
        return
    _issue(cg, lambda: _intrinsic(cg, "void", f"llvm.nvvm.tcgen05.commit.shared.cg{g}", [bar_ptr(cg, bar)]),
           pair=g == 2)


@lowering("tcgen05.fence_before")
def lower_fence_before(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])


@lowering("tcgen05.fence_after")
def lower_fence_after(cg: CodeGen, op: Operation) -> None:
    _require_tcgen05(cg, op)
    _intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])


__all__ = ["HOOKS", "MmaInstr", "TmemRef", "anchor", "load_tile", "mma_plan", "prepare", "register_layout",
           "smem_descriptor", "store_tile", "tmem_columns_used"]

from . import blackwell_tile  # noqa: E402, F401  (registers the tile-level dot / sparse_dot lowering)
