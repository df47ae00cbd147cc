"""The portable lowering of ``dot`` and ``sparse_dot``: operands staged row-major in shared memory,
every thread accumulating its own accumulator elements with FMAs over K.

It runs on every target and is the reference the tensor-core lowerings (``lower_hopper``) are
tested against; it is not fast. ``sparse_dot`` first expands the compressed A tile into a dense one
in shared memory by decoding the metadata words (``docs/sparse-metadata.md``, "sm90" word format):
for 16-bit and tf32 operands row ``m`` and K-half ``h`` live in word row ``16(m/16) + 8h + m%8``
(high half-word for ``m%16 >= 8``); 8-bit operands use plain rows.
"""

from __future__ import annotations

from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...frontend.layout.tile import distinct_registers, register_coords
from .codegen import CodeGen, DTile, lowering
from .elementwise import cast_value
from .llvm_text import LLValue, const, llvm_type
from .reduce import linear_index, storage_of


def stage_rowmajor(cg: CodeGen, x: DTile, shape: tuple[int, ...], base: int) -> None:
    """Write every element a thread holds at ``base + linear(coord) * size`` (no barriers)."""
    fb = cg.fb
    sty, eb = storage_of(x.elem)
    coords = cg.coords(x.layout)
    for r in distinct_registers(x.layout):
        lin = linear_index(cg, coords[r], shape)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base, "i32")))
        v = x.regs[r]
        if v.type == "i1":
            v = fb.cast("zext", v, "i8")
        fb.emit(f"store {sty} {v.ref}, ptr addrspace(3) {ptr.ref}, align {eb}")


def _smem_load(cg: CodeGen, ty: str, eb: int, base: int, index: LLValue) -> LLValue:
    fb = cg.fb
    ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", index, const(eb, "i32")), const(base, "i32")))
    return fb.value(f"load {ty}, ptr addrspace(3) {ptr.ref}, align {eb}", ty, "sm")


def _zero_fill(cg: CodeGen, base: int, nbytes: int) -> None:
    """All threads clear ``nbytes`` (a multiple of 4) of shared memory at ``base``."""
    fb = cg.fb
    threads = 32 * cg.num_warps
    words = nbytes // 4
    for start in range(0, words, threads):
        idx = fb.binop("add", cg.local_tid(), const(start, "i32"))
        ok = fb.icmp("ult", idx, const(words, "i32"))
        then, done = fb.new_block("zf"), fb.new_block("zf_done")
        fb.cond_br(ok, then, done)
        fb.set_block(then)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", idx, const(4, "i32")), const(base, "i32")))
        fb.emit(f"store i32 0, ptr addrspace(3) {ptr.ref}, align 4")
        fb.br(done)
        fb.set_block(done)


def expand_sparse(cg: CodeGen, vals: DTile, meta: DTile, m: int, k: int, base_dense: int) -> None:
    """Scatter compressed A values into a zeroed dense (m, k) tile at ``base_dense``."""
    fb = cg.fb
    elem = vals.elem
    assert isinstance(elem, T.ScalarType)
    sty, eb = storage_of(elem)
    tf32 = elem in (T.tf32, T.f32)
    eight_bit = elem.bits == 8
    per_word = 16 if tf32 else 32
    meta_shape = (m, k // per_word)
    meta_base = cg.smem_alloc(m * (k // per_word) * 4, 16)
    stage_rowmajor(cg, meta, meta_shape, meta_base)
    cg.barrier()
    coords = cg.coords(vals.layout)
    for r in distinct_registers(vals.layout):
        i, kc = coords[r]
        if tf32:
            k0 = fb.binop("shl", kc, const(1, "i32"))  # one kept element per pair
            slot = None
        else:
            k0 = fb.binop("shl", fb.binop("lshr", kc, const(1, "i32")), const(2, "i32"))
            slot = fb.binop("and", kc, const(1, "i32"))
        kb = fb.binop("udiv", k0, const(per_word, "i32"))
        if eight_bit:
            row = i
            shift = fb.binop("shl", fb.binop("lshr", fb.binop("urem", k0, const(32, "i32")), const(2, "i32")),
                             const(2, "i32"))
        else:
            half_k = per_word // 2
            h = fb.binop("udiv", fb.binop("urem", k0, const(per_word, "i32")), const(half_k, "i32"))
            chunk = fb.binop("udiv", fb.binop("urem", k0, const(half_k, "i32")), const(2 if tf32 else 4, "i32"))
            hi = fb.binop("and", fb.binop("lshr", i, const(3, "i32")), const(1, "i32"))
            row = fb.binop("add", fb.binop("add", fb.binop("and", i, const(-16, "i32")),
                                           fb.binop("shl", h, const(3, "i32"))), fb.binop("and", i, const(7, "i32")))
            shift = fb.binop("add", fb.binop("shl", hi, const(4, "i32")), fb.binop("shl", chunk, const(2, "i32")))
        widx = fb.binop("add", fb.binop("mul", row, const(meta_shape[1], "i32")), kb)
        word = _smem_load(cg, "i32", 4, meta_base, widx)
        nib = fb.binop("and", fb.binop("lshr", word, shift), const(15, "i32"))
        if tf32:
            pos = fb.binop("lshr", fb.binop("and", nib, const(3, "i32")), const(1, "i32"))
        else:
            assert slot is not None
            pos = fb.binop("and", fb.binop("lshr", nib, fb.binop("shl", slot, const(1, "i32"))), const(3, "i32"))
        kk = fb.binop("add", k0, pos)
        lin = fb.binop("add", fb.binop("mul", i, const(k, "i32")), kk)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base_dense, "i32")))
        fb.emit(f"store {sty} {vals.regs[r].ref}, ptr addrspace(3) {ptr.ref}, align {eb}")


def fma_dot(cg: CodeGen, a_base: int, b_base: int, a_elem: T.ScalarType, b_elem: T.ScalarType, acc: DTile,
            m: int, n: int, k: int) -> DTile:
    """``acc + A @ B`` with A (m,k) and B (k,n) row-major in shared memory, as a K loop."""
    fb = cg.fb
    acc_t = acc.elem
    assert isinstance(acc_t, T.ScalarType)
    work_t = T.f32 if acc_t.is_float else T.i32
    wty = llvm_type(work_t)
    a_ty, a_eb = storage_of(a_elem)
    b_ty, b_eb = storage_of(b_elem)
    coords = cg.coords(acc.layout)
    offs = register_coords(acc.layout)
    uniq: list[int] = []
    seen: dict[tuple[int, ...], int] = {}
    for r, off in enumerate(offs):
        if off not in seen:
            seen[off] = r
            uniq.append(r)
    init = [cast_value(cg, acc_t, work_t, acc.regs[r]) if acc_t != work_t else acc.regs[r] for r in uniq]
    pre = fb.current
    head, body, done = fb.new_block("k_head"), fb.new_block("k_body"), fb.new_block("k_done")
    fb.br(head)
    fb.set_block(head)
    kv_name = fb.fresh("k")
    kv = LLValue(kv_name, "i32")
    phi_names = [fb.fresh("acc") for _ in uniq]
    phis = [LLValue(nm, wty) for nm in phi_names]
    fb.cond_br(fb.icmp("slt", kv, const(k, "i32")), body, done)
    fb.set_block(body)
    rows: dict[str, LLValue] = {}
    cols: dict[str, LLValue] = {}
    new_vals = []
    for j, r in enumerate(uniq):
        i_c, n_c = coords[r]
        if i_c.ref not in rows:
            idx = fb.binop("add", fb.binop("mul", i_c, const(k, "i32")), kv)
            rows[i_c.ref] = cast_value(cg, a_elem, work_t, _smem_load(cg, a_ty, a_eb, a_base, idx))
        if n_c.ref not in cols:
            idx = fb.binop("add", fb.binop("mul", kv, const(n, "i32")), n_c)
            cols[n_c.ref] = cast_value(cg, b_elem, work_t, _smem_load(cg, b_ty, b_eb, b_base, idx))
        a, b = rows[i_c.ref], cols[n_c.ref]
        if work_t.is_float:
            prod = cg.intrinsic("float", "llvm.fma.f32", [a, b, phis[j]])
        else:
            prod = fb.binop("add", phis[j], fb.binop("mul", a, b))
        assert prod is not None
        new_vals.append(prod)
    k_next = fb.binop("add", kv, const(1, "i32"))
    latch = fb.current
    fb.br(head)
    head.lines[0:0] = [f"  {kv_name} = phi i32 [ 0, %{pre.label} ], [ {k_next.ref}, %{latch.label} ]"] + [
        f"  {nm} = phi {wty} [ {iv.ref}, %{pre.label} ], [ {nv.ref}, %{latch.label} ]"
        for nm, iv, nv in zip(phi_names, init, new_vals, strict=True)]
    fb.set_block(done)
    out_by_off = {offs[r]: (cast_value(cg, work_t, acc_t, phis[j]) if acc_t != work_t else phis[j])
                  for j, r in enumerate(uniq)}
    return DTile(acc.layout, [out_by_off[off] for off in offs], acc_t)


def round_to_tf32(cg: CodeGen, x: DTile) -> DTile:
    """Round f32 operands to tf32, as the tensor cores read them."""
    if x.elem not in (T.f32, T.tf32):
        return x
    return DTile(x.layout, [cast_value(cg, T.f32, T.tf32, r) for r in x.regs], x.elem)


@lowering("dot")
def lower_dot_portable(cg: CodeGen, op: Operation) -> None:
    a, b, acc = (cg.tile(v) for v in op.operands)
    m, k = T.shape_of(op.operand("a").type)
    n = T.shape_of(op.operand("b").type)[1]
    a, b = round_to_tf32(cg, a), round_to_tf32(cg, b)
    _, a_eb = storage_of(a.elem)
    _, b_eb = storage_of(b.elem)
    a_base = cg.smem_alloc(m * k * a_eb, 16)
    b_base = cg.smem_alloc(k * n * b_eb, 16)
    cg.barrier()
    stage_rowmajor(cg, a, (m, k), a_base)
    stage_rowmajor(cg, b, (k, n), b_base)
    cg.barrier()
    cg.set(op.result, fma_dot(cg, a_base, b_base, a.elem, b.elem, acc, m, n, k))  # type: ignore[arg-type]


@lowering("sparse_dot")
def lower_sparse_dot_portable(cg: CodeGen, op: Operation) -> None:
    vals, meta, b, acc = (cg.tile(v) for v in op.operands)
    m, kh = T.shape_of(op.operand("a").type)
    k = 2 * kh
    n = T.shape_of(op.operand("b").type)[1]
    vals, b = round_to_tf32(cg, vals), round_to_tf32(cg, b)
    _, a_eb = storage_of(vals.elem)
    _, b_eb = storage_of(b.elem)
    a_base = cg.smem_alloc(m * k * a_eb, 16)
    b_base = cg.smem_alloc(k * n * b_eb, 16)
    cg.barrier()
    _zero_fill(cg, a_base, (m * k * a_eb + 3) // 4 * 4)
    stage_rowmajor(cg, b, (k, n), b_base)
    cg.barrier()
    expand_sparse(cg, vals, meta, m, k, a_base)
    cg.barrier()
    cg.set(op.result, fma_dot(cg, a_base, b_base, vals.elem, b.elem, acc, m, n, k))  # type: ignore[arg-type]
