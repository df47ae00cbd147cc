"""Tile-level ``dot`` / ``sparse_dot`` on the Blackwell tensor core (sm_100a / sm_103a / sm_110a).

A tile MMA whose operands are register tiles runs as one synchronous ``tcgen05.mma`` sequence:

1. the ``prepare`` hook reserves TMEM columns for it (the accumulator's N, then the metadata in whole
   4-column atoms) after the kernel's own ``tmem.alloc`` regions, shared by every eligible op (they
   run one after the other);
2. the anchor hook gives its accumulator and result the ``32x32b`` register layout of that TMEM
   region (``16x32bx2`` for a 64-row one; the metadata words theirs), so that they move to and from
   TMEM without conversion;
3. the lowering stages A and B into K-major swizzled shared memory, stores the accumulator (and the
   metadata words: a TMEM cell of a 128-row tile is exactly the "sm90" word of that row,
   docs/sparse-metadata.md §5) with ``tcgen05.st``, and after ``fence::before_thread_sync``,
   ``bar.sync`` and ``fence::after_thread_sync`` one elected thread issues the MMAs of
   :func:`~.blackwell_mma.mma_plan` and ``tcgen05.commit`` to an mbarrier of its own; every
   thread waits for it, and the accumulator comes back with ``tcgen05.ld``.

Eligible: M = 128 (a dense op also M = 64: one M = 64 MMA per K step, D in Layout F, the first 16
lanes of each quarter), a kernel of whole warpgroups, the op outside ``warp_specialize``, a legal
instruction descriptor for N <= 256, K a multiple of the instruction K, and rows wide enough for a
swizzle atom holding one instruction's K. Anything else takes the portable lowering. There is no
pipelining (each op waits for its MMAs): the explicit level is the way to a fast kernel.

**An f16 accumulator runs with an f32 D** (:func:`d_elem`): the tile-level op rounds its f32 sum
once (``ops.dot.mma_reference``), while a ``tcgen05.mma`` with an f16 D would round D to f16 after
every instruction (a partial sum past 65504 would be inf). The accumulator tile is widened to f32 in
registers (exact), stored with ``tcgen05.st``, the MMAs run with the descriptor's D type f32, and
the f32 sum comes back with ``tcgen05.ld`` and is rounded once (``cvt.rn.f16.f32``), as on
``mma.sync`` / wgmma / the portable path. It takes the same TMEM columns (an accumulator has one
32-bit column per element whatever its type) and the same ``32x32b`` register layout.
"""

from __future__ import annotations

from typing import Any

from ...frontend.ir import types as T
from ...frontend.ir.core import Function, Operation
from ...frontend.layout.inference import walk_partition
from ...frontend.layout.layouts import LinearLayout
from ...frontend.ops.blackwell_operands import D_DTYPE, META_BITS, MMA_KIND, PTX_DTYPE, WORD_K, instr_k
from ...target.targets import Feature
from .asynchronous import kmajor_swizzle, stage_kmajor
from .codegen import CodeGen, DTile, lowering
from .llvm_text import const, llvm_type

M_TILE = 128
DENSE_M = (64, 128)
"""Tile rows a dense op may have: one ``cta_group::1`` MMA of M = 128 (Layout D) or M = 64 (Layout F,
16 lanes of each quarter); a sparse one has 128 (the M = 64 metadata layout is unknown)."""


def _parts(op: Operation) -> tuple[Any, Any, Any, Any | None]:
    """(A, B, accumulator, metadata) values of a dot / sparse_dot."""
    meta = op.operand("a_meta") if op.name == "sparse_dot" else None
    return op.operand("a"), op.operand("b"), op.operand("acc"), meta


def d_elem(acc: T.ScalarType) -> T.ScalarType:
    """The element type of D in TMEM for a tile MMA with accumulator ``acc``: f32 for f16 (rounded
    once at the end, see the module docstring), else the accumulator's own."""
    return T.f32 if acc == T.f16 else acc


def acc_region(op: Operation) -> T.TmemType:
    """The TMEM region of a tile MMA's D: (M, N) of :func:`d_elem`."""
    m = T.shape_of(op.operand("a").type)[0]
    n = T.shape_of(op.operand("b").type)[1]
    return T.TmemType(d_elem(T.element_type(op.result.type)), (m, n), "acc")  # type: ignore[arg-type]


def eligible(op: Operation, num_warps: int) -> int | None:
    """The TMEM columns a tile MMA needs on the tcgen05 path, or None when it does not qualify."""
    from ...target.idesc import InstrDesc, idesc_problems
    from .blackwell import register_layout

    if op.name not in ("dot", "sparse_dot") or num_warps % 4:
        return None
    sparse = op.name == "sparse_dot"
    a, b, _, meta = _parts(op)
    ea, eb, eacc = T.element_type(a.type), T.element_type(b.type), T.element_type(op.result.type)
    if not all(isinstance(e, T.ScalarType) for e in (ea, eb, eacc)):
        return None
    if ea.name not in MMA_KIND or MMA_KIND.get(eb.name) != MMA_KIND[ea.name] or eacc.name not in D_DTYPE:
        return None
    ed = d_elem(eacc)
    m, ka = T.shape_of(a.type)
    k, n = T.shape_of(b.type)
    if m not in ((M_TILE,) if sparse else DENSE_M) or n > 256 or k % instr_k(ea, sparse):
        return None
    desc = InstrDesc(MMA_KIND[ea.name], PTX_DTYPE[ea.name], PTX_DTYPE[eb.name], D_DTYPE[ed.name], m, n,
                     sparse=sparse)
    if idesc_problems(desc) or register_layout(acc_region(op), num_warps) is None:
        return None
    step = instr_k(ea, sparse)
    a_bytes = ka * max(1, ea.bits // 8)
    b_bytes = k * max(1, eb.bits // 8)
    if kmajor_swizzle(a_bytes) < (step // (2 if sparse else 1)) * max(1, ea.bits // 8) or \
            kmajor_swizzle(b_bytes) < step * max(1, eb.bits // 8):
        return None
    if meta is None:
        return n
    words = T.shape_of(meta.type)[1]
    if words != k // WORD_K[META_BITS[ea.name]]:
        return None
    return n + -(-words // 4) * 4


def reserve(func: Function, target: Any, num_warps: int, user_end: int, capacity: int = 512) -> int:
    """Mark the eligible tile MMAs outside ``warp_specialize`` with their TMEM columns (``tc_col``,
    after the user's regions, 32-aligned; kind::i8 only where the target has it); the end column
    of the reservation (``user_end`` when none qualifies or the columns do not fit)."""
    start = -(-user_end // 32) * 32
    found = []
    for op in walk_partition(func.body.block):
        n = eligible(op, num_warps)
        if n is None or start + n > capacity:
            continue
        if MMA_KIND[T.element_type(op.operand("a").type).name] == "i8" and not target.has(Feature.TCGEN05_I8):  # type: ignore[union-attr]
            continue
        op.attrs["tc_col"] = start
        op.attrs["tc_ncols"] = n
        found.append(start + n)
    return max(found, default=user_end)


def anchor(op: Operation, num_warps: int) -> dict[int, LinearLayout]:
    """Accumulator/result (and metadata words) of a reserved tile MMA: their TMEM region's layout."""
    from .blackwell import register_layout

    if "tc_col" not in op.attrs:
        return {}
    _, _, acc, meta = _parts(op)
    lay = register_layout(acc_region(op), num_warps)
    out = {} if lay is None else {id(op.result): lay, id(acc): lay}
    if meta is not None:
        ea = T.element_type(op.operand("a").type)
        mt = T.TmemType(T.u32, T.shape_of(meta.type), "meta", META_BITS[ea.name])  # type: ignore[union-attr]
        ml = register_layout(mt, num_warps)
        if ml is not None:
            out[id(meta)] = ml
    return out


# ------------------------------------------------------------------------------------------------
def _tile_mma(cg: CodeGen, op: Operation) -> bool:
    from . import blackwell as bw
    from .asynchronous import emit_in_leader
    from .blackwell_mma import KIND_CODE, mma_plan

    if "tc_col" not in op.attrs or cg.part.index >= 0 or cg.state.tmem_base is None:
        return False
    sparse = op.name == "sparse_dot"
    a_v, b_v, acc_v, meta_v = _parts(op)
    acc = cg.tile(acc_v)
    eacc = T.element_type(op.result.type)
    m, ka = T.shape_of(a_v.type)
    k, n = T.shape_of(b_v.type)
    acc_t = acc_region(op)
    ed = acc_t.elem
    want = bw.register_layout(acc_t, cg.num_warps)
    if want is None or acc.layout != want or op.result.layout != want:
        return False
    a, b = cg.tile(a_v), cg.tile(b_v)
    ea = T.element_type(a_v.type)
    if ea in (T.f32, T.tf32):
        from .dot import round_to_tf32

        a, b = round_to_tf32(cg, a), round_to_tf32(cg, b)
    fb = cg.fb
    cg.barrier()  # the previous MMA reading these buffers has completed (its waiters are past this point)
    a_ref, b_ref = stage_kmajor(cg, a, False, m, ka), stage_kmajor(cg, b, True, n, k)
    assert a_ref is not None and b_ref is not None  # eligible() checked the swizzles
    cg.intrinsic("void", "llvm.nvvm.fence.proxy.async.shared_cta", [])
    base = fb.binop("add", cg.state.tmem_base, const(op.attrs["tc_col"], "i32"))
    acc_ref = bw.TmemRef(base, acc_t, n)
    bw.store_tile(cg, acc_ref, _convert(cg, acc, ed), op.span)
    meta_ref = None
    if sparse:
        assert meta_v is not None
        words = T.shape_of(meta_v.type)[1]
        mt = T.TmemType(T.u32, (M_TILE, words), "meta", META_BITS[ea.name])  # type: ignore[union-attr]
        meta_ref = bw.TmemRef(fb.binop("add", base, const(n, "i32")), mt, words)
        bw.store_tile(cg, meta_ref, cg.tile(meta_v), op.span)
    bar = cg.smem_alloc(8, 8)

    def init() -> None:
        cg.intrinsic("void", "llvm.nvvm.mbarrier.init.shared", [cg.smem_ptr(bar), const(1, "i32")])
        cg.intrinsic("void", "llvm.nvvm.fence.mbarrier_init.release.cluster", [])

    emit_in_leader(cg, init)
    bw.intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])
    cg.barrier()
    bw.intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
    plan = mma_plan(ea, T.element_type(b_v.type), ed, m, n, k, sparse, n,  # type: ignore[arg-type]
                    meta_ref.tile_stride if meta_ref else 0)
    name = f"llvm.nvvm.tcgen05.mma{'.sp' if sparse else ''}.shared"
    imm = [const(KIND_CODE[MMA_KIND[ea.name]], "i32"), const(1, "i32"), const(0, "i32")]  # type: ignore[union-attr]

    def issue() -> None:
        for ins in plan:
            args = [bw.tmem_ptr(cg, acc_ref.addr, ins.d_col), bw.smem_descriptor(cg, a_ref, ins.a_row, ins.a_col),
                    bw.smem_descriptor(cg, b_ref, ins.b_row, ins.b_col), const(ins.idesc, "i32"), const(1, "i1")]
            if meta_ref is not None:
                args.append(bw.tmem_ptr(cg, meta_ref.addr, ins.meta_col or 0))
            bw.intrinsic(cg, "void", name, args + imm)
        bw.intrinsic(cg, "void", "llvm.nvvm.tcgen05.commit.shared.cg1", [cg.smem_ptr(bar)])

    bw.emit_in_issuer(cg, issue)
    loop, done = fb.new_block("tc_tile_wait"), fb.new_block("tc_tile_done")
    fb.br(loop)
    fb.set_block(loop)
    ok = cg.intrinsic("i1", "llvm.nvvm.mbarrier.try.wait.parity.scope.cta.space.cta",
                      [cg.smem_ptr(bar), const(0, "i32")])
    assert ok is not None
    fb.cond_br(ok, done, loop)
    fb.set_block(done)
    bw.intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])
    result = _convert(cg, bw.load_tile(cg, acc_ref, want, ed, op.span), eacc)  # type: ignore[arg-type]
    cg.barrier()  # every thread is past the wait: the barrier may be invalidated (and re-initialized)
    emit_in_leader(cg, lambda: cg.intrinsic("void", "llvm.nvvm.mbarrier.inval.shared", [cg.smem_ptr(bar)]))
    cg.set(op.result, result)
    return True


def _convert(cg: CodeGen, x: DTile, elem: T.ScalarType) -> DTile:
    """``x`` with its elements widened (f16 -> f32, exact) or rounded (f32 -> f16, ``cvt.rn``) to
    ``elem``, in the same layout; ``x`` itself when it has that type."""
    if x.elem == elem:
        return x
    op = "fpext" if elem.bits > x.elem.bits else "fptrunc"  # type: ignore[union-attr]
    return DTile(x.layout, [cg.fb.cast(op, r, llvm_type(elem)) for r in x.regs], elem)


def _has_tcgen05(cg: CodeGen) -> bool:
    return cg.target.has(Feature.TCGEN05)


@lowering("dot", "sparse_dot", when=_has_tcgen05)
def lower_tile_mma(cg: CodeGen, op: Operation) -> None:
    from . import dot as lower_dot

    if not _tile_mma(cg, op):
        (lower_dot.lower_sparse_dot_portable if op.name == "sparse_dot" else lower_dot.lower_dot_portable)(cg, op)
