"""Lowering of reductions and layout conversions.

``reduce`` along an axis: registers of one thread that differ only along the axis combine first;
then lanes whose layout basis moves only along the axis combine with butterfly shuffles
(``shfl.sync.bfly``: lane ``l`` reads lane ``l ^ 2^b``; PTX ISA, "Data Movement and Conversion
Instructions: shfl.sync"); then warps combine through shared memory. The result layout is the
input layout with the axis dropped (inference guarantees it), so no data moves afterwards. What
is combined is the reduction's :class:`~.reduce_fold.Fold`: one accumulator for ``sum`` / ``max``
/ ``min``, a (value, index) pair for ``argmax`` / ``argmin`` (backend/lower/reduce_fold.py); each
part travels through the shuffles and shared memory on its own.

``convert_layout``: a register permutation when both layouts give every thread the same elements,
otherwise a round trip through shared memory (each thread writes what it holds, every thread reads
what it needs).
"""

from __future__ import annotations

from ...frontend.diagnostics import CompileError, Diagnostic
from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...frontend.layout.gf2 import GF2Span
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import (
    LANE,
    REG,
    WARP,
    distinct_registers,
    packed_basis,
    register_coords,
    same_thread_part,
    thread_bases,
)
from .codegen import CodeGen, DTile, lowering
from .llvm_text import LLValue, const, llvm_type
from .reduce_fold import Parts, fold_for


def shuffle_xor(cg: CodeGen, v: LLValue, lane_mask: int) -> LLValue:
    fb = cg.fb
    name = "llvm.nvvm.shfl.sync.bfly.i32"
    cg.mod.declare(name, f"declare i32 @{name}(i32, i32, i32, i32) #1")

    def shfl32(x: LLValue) -> LLValue:
        return fb.value(f"call i32 @{name}(i32 -1, i32 {x.ref}, i32 {lane_mask}, i32 31) #1", "i32", "shfl")

    if v.type in ("i32", "float"):
        x = fb.cast("bitcast", v, "i32") if v.type != "i32" else v
        r = shfl32(x)
        return fb.cast("bitcast", r, v.type) if v.type != "i32" else r
    if v.type in ("i64", "double"):
        x = fb.cast("bitcast", v, "i64") if v.type != "i64" else v
        lo = shfl32(fb.cast("trunc", x, "i32"))
        hi = shfl32(fb.cast("trunc", fb.binop("lshr", x, const(32, "i64")), "i32"))
        r = fb.binop("or", fb.cast("zext", lo, "i64"), fb.binop("shl", fb.cast("zext", hi, "i64"), const(32, "i64")))
        return fb.cast("bitcast", r, v.type) if v.type != "i64" else r
    # 8/16-bit values travel widened
    wide = fb.cast("zext", fb.cast("bitcast", v, f"i{_bits(v.type)}") if v.type in ("half", "bfloat") else v, "i32")
    r = shfl32(wide)
    nar = fb.cast("trunc", r, f"i{_bits(v.type)}")
    return fb.cast("bitcast", nar, v.type) if v.type in ("half", "bfloat") else nar


def _bits(ty: str) -> int:
    return {"half": 16, "bfloat": 16, "i16": 16, "i8": 8, "i1": 1}.get(ty, 32)


def linear_index(cg: CodeGen, coords: list[LLValue], shape: tuple[int, ...]) -> LLValue:
    """The row-major ``i32`` index of the element at ``coords`` in a tensor of ``shape``."""
    fb = cg.fb
    lin: LLValue = const(0, "i32")
    stride = 1
    for d in reversed(range(len(shape))):
        term = coords[d] if stride == 1 else fb.binop("mul", coords[d], const(stride, "i32"))
        lin = term if lin.ref == "0" else fb.binop("add", lin, term)
        stride *= shape[d]
    return lin


def _pure(basis: tuple[int, ...], axis: int) -> str:
    """``"axis"`` if the basis moves only along ``axis``, ``"other"`` if not at all, else ``"mixed"``."""
    on = basis[axis] != 0
    off = any(c != 0 for d, c in enumerate(basis) if d != axis)
    if on and not off:
        return "axis"
    if on and off:
        return "mixed"
    return "other"


def _axis_bits(layout: LinearLayout, name: str, axis: int, op: Operation) -> list[int]:
    """The ``name`` (lane or warp) bits whose basis moves along ``axis`` only; SP0623 for a bit that
    mixes the axis with another."""
    bits = []
    for b, basis in enumerate(thread_bases(layout, name)):
        p = _pure(basis, axis)
        if p == "mixed":
            raise CompileError([Diagnostic("SP0623", "this reduction's layout mixes the reduced axis with "
                                           f"another in one {name} bit; the compiler cannot reduce it yet", op.span)])
        if p == "axis":
            bits.append(b)
    return bits


def counts_each_element_once(layout: LinearLayout, axis: int) -> bool:
    """Whether folding a thread's distinct registers, then the lanes and warps whose bases move
    along ``axis`` only, adds every element of a reduced line exactly once: those lane and warp
    bases must be independent of each other and of the registers' span (a lane that repeats a
    register's element, or two lanes that hold the same one, would count it twice)."""
    span = GF2Span(packed_basis(tuple(layout.basis(REG, i).values()))
                   for i in range(layout.in_bits(REG) if REG in layout.in_names else 0))
    moved = [packed_basis(b) for name in (LANE, WARP) for b in thread_bases(layout, name) if _pure(b, axis) == "axis"]
    return all(span.add(v) for v in moved)


def thread_combines(layout: LinearLayout, axis: int) -> list[tuple[tuple[int, ...], int]]:
    """(output key, register) for each register a thread folds into its partial results: the key
    is the register's offset with ``axis`` dropped. A broadcast register basis (zero) makes
    registers repeat elements; only the first register of each offset is taken, so that a ``sum``
    counts each element once (a tile broadcast along the reduced axis would otherwise be summed
    once per copy)."""
    offs = register_coords(layout)
    return [(tuple(c for d, c in enumerate(offs[r]) if d != axis), r) for r in distinct_registers(layout)]


@lowering("reduce")
def lower_reduce(cg: CodeGen, op: Operation) -> None:
    x = cg.tile(op.operand("x"))
    axis, kind = op.attrs["axis"], op.attrs["kind"]
    res_elem = T.element_type(op.result.type)
    assert isinstance(res_elem, T.ScalarType)
    layout = x.layout
    fold = fold_for(cg, kind, x, axis, res_elem)
    if fold.once and not counts_each_element_once(layout, axis):
        raise CompileError([Diagnostic("SP0623", "this reduction's layout holds one element of the reduced axis in "
                                       "two threads; a sum would count it twice", op.span,
                                       help="let inference choose the layout of the reduced tile")])
    fb = cg.fb
    # 1. within the thread
    groups: dict[tuple[int, ...], Parts] = {}
    order: list[tuple[int, ...]] = []
    for key, r in thread_combines(layout, axis):
        v = fold.start(r)
        if key in groups:
            groups[key] = fold.combine(groups[key], v)
        else:
            groups[key] = v
            order.append(key)
    # 2. across lanes
    for b in _axis_bits(layout, LANE, axis, op):
        for k in order:
            groups[k] = fold.combine(groups[k], tuple(shuffle_xor(cg, p, 1 << b) for p in groups[k]))
    # 3. across warps, through shared memory
    warp_axis_bits = _axis_bits(layout, WARP, axis, op)
    out_layout: LinearLayout = op.result.layout if isinstance(op.result.type, T.TileType) else None  # type: ignore[assignment]
    if warp_axis_bits:
        out_shape = T.shape_of(op.result.type)
        numel = 1
        for s in out_shape:
            numel *= s
        g_count = 1 << len(warp_axis_bits)
        parts = [(llvm_type(t), max(1, t.bits // 8)) for t in fold.types]
        bases = [cg.smem_alloc(g_count * numel * eb, 16) for _, eb in parts]
        warp = cg.warp_id()
        g: LLValue = const(0, "i32")
        for i, b in enumerate(warp_axis_bits):
            bit = fb.binop("and", fb.binop("lshr", warp, const(b, "i32")), const(1, "i32"))
            g = fb.binop("or", g, fb.binop("shl", bit, const(i, "i32")))
        key_lin: dict[tuple[int, ...], LLValue] = {}
        if out_layout is not None:
            coords = cg.coords(out_layout)
            for r, off in enumerate(register_coords(out_layout)):
                key_lin.setdefault(off, linear_index(cg, coords[r], out_shape))
        else:
            key_lin[()] = const(0, "i32")

        def slot(idx: LLValue, p: int) -> LLValue:
            eb = parts[p][1]
            return cg.smem_ptr(fb.binop("add", fb.binop("mul", idx, const(eb, "i32")), const(bases[p], "i32")))

        cg.barrier()
        for k in order:
            idx = fb.binop("add", fb.binop("mul", g, const(numel, "i32")), key_lin[k])
            for p, (aty, eb) in enumerate(parts):
                fb.emit(f"store {aty} {groups[k][p].ref}, ptr addrspace(3) {slot(idx, p).ref}, align {eb}")
        cg.barrier()
        for k in order:
            total: Parts | None = None
            for gi in range(g_count):
                idx = fb.binop("add", key_lin[k], const(gi * numel, "i32"))
                v = tuple(fb.value(f"load {aty}, ptr addrspace(3) {slot(idx, p).ref}, align {eb}", aty, "red")
                          for p, (aty, eb) in enumerate(parts))
                total = v if total is None else fold.combine(total, v)
            assert total is not None
            groups[k] = total
    final = {k: fold.finish(v) for k, v in groups.items()}
    if out_layout is None:
        cg.set(op.result, final[()])
        return
    regs = [final[off] for off in register_coords(out_layout)]
    cg.set(op.result, DTile(out_layout, regs, res_elem))


# ------------------------------------------------------------------------------------------------
def storage_of(elem: T.ScalarType | T.PointerType) -> tuple[str, int]:
    """The LLVM type one element is stored as in memory, and its size in bytes (pointers are
    ``i64``, booleans ``i8``)."""
    if isinstance(elem, T.PointerType):
        return "i64", 8
    if elem.is_bool:
        return "i8", 1
    return llvm_type(elem), max(1, elem.bits // 8)


def convert_tile(cg: CodeGen, x: DTile, dst: LinearLayout, shape: tuple[int, ...]) -> DTile:
    """``x`` re-distributed to layout ``dst``."""
    src = x.layout
    if src == dst:
        return x
    if same_thread_part(src, dst):
        lookup: dict[tuple[int, ...], int] = {}
        for r, off in enumerate(register_coords(src)):
            lookup.setdefault(off, r)
        dst_offs = register_coords(dst)
        if all(off in lookup for off in dst_offs):
            return DTile(dst, [x.regs[lookup[off]] for off in dst_offs], x.elem)
    fb = cg.fb
    sty, eb = storage_of(x.elem)
    numel = 1
    for s in shape:
        numel *= s
    base = cg.smem_alloc(numel * eb, 16)

    def to_storage(v: LLValue) -> LLValue:
        if v.type == "ptr addrspace(1)":
            return fb.value(f"ptrtoint ptr addrspace(1) {v.ref} to i64", "i64")
        if v.type == "i1":
            return fb.cast("zext", v, "i8")
        return v

    def from_storage(v: LLValue) -> LLValue:
        if isinstance(x.elem, T.PointerType):
            return fb.value(f"inttoptr i64 {v.ref} to ptr addrspace(1)", "ptr addrspace(1)")
        if isinstance(x.elem, T.ScalarType) and x.elem.is_bool:
            return fb.icmp("ne", v, const(0, "i8"))
        return v

    cg.barrier()
    src_coords = cg.coords(src)
    written: set[tuple[int, ...]] = set()
    for r, off in enumerate(register_coords(src)):
        if off in written:
            continue
        written.add(off)
        lin = linear_index(cg, src_coords[r], shape)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base, "i32")))
        fb.emit(f"store {sty} {to_storage(x.regs[r]).ref}, ptr addrspace(3) {ptr.ref}, align {eb}")
    cg.barrier()
    dst_coords = cg.coords(dst)
    regs = []
    cache: dict[tuple[int, ...], LLValue] = {}
    for r, off in enumerate(register_coords(dst)):
        if off not in cache:
            lin = linear_index(cg, dst_coords[r], shape)
            ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base, "i32")))
            cache[off] = from_storage(fb.value(f"load {sty}, ptr addrspace(3) {ptr.ref}, align {eb}", sty, "cv"))
        regs.append(cache[off])
    return DTile(dst, regs, x.elem)


@lowering("convert_layout")
def lower_convert(cg: CodeGen, op: Operation) -> None:
    x = cg.tile(op.operand("x"))
    cg.set(op.result, convert_tile(cg, x, op.result.layout, T.shape_of(op.result.type)))
