"""Blackwell (sm_100a / sm_103a / sm_110a): the ``tcgen05`` issue path (PTX ISA 9.7.16;
docs/hardware.md §1, §6), the lowering of ``tcgen05.mma`` / ``copy`` / ``commit`` / ``fence_*`` of
``frontend/ops/blackwell.py``. Tensor memory itself (allocation, views, loads and stores) and the
helpers shared with the tile-level MMA are in ``blackwell.py``.

* **Single-thread issue.** ``tcgen05.mma`` / ``cp`` / ``commit`` run in one thread: ``elect.sync``
  in warp 0 of the current partition, evaluated once at the partition's entry so that the MMAs
  and the commit that tracks them come from the same thread (commit arrives when the async ops
  *of its thread* are done, §2; ``blackwell.emit_in_issuer``).
* **MMA splitting** (:func:`mma_plan`): one ``tcgen05.mma`` call becomes K steps x M tiles (128
  rows) x N tiles (<= 256 columns); the metadata column of step ``ks`` in M tile ``mt`` is
  ``mt·tile_stride + (ks // p)·2`` with selector ``ks % p``, ``p = 2 // columns-per-instruction``
  (docs/hardware.md §11: 16-bit/tf32 column pairs with selector 0/1; 8-bit selector 0 and two
  columns per instruction). Instruction descriptors come from ``descriptors.encode_idesc``,
  shared-memory descriptors from ``descriptors.encode_tcgen05_smem_desc`` (version bit 46).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...frontend.ops.blackwell_operands import (
    D_DTYPE,
    PTX_DTYPE,
    instr_k,
    meta_columns_per_instr,
    split_n,
    tmem_packing,
)
from ...target.idesc import InstrDesc, encode_idesc
from ...target.smem_desc import SmemDesc
from ...target.targets import Feature, require
from .asynchronous import SmemRef, bar_ptr
from .blackwell import TmemRef, emit_in_issuer, intrinsic, require_tcgen05, smem_desc_at, smem_descriptor, tmem_ptr
from .codegen import CodeGen, lowering
from .llvm_text import const

KIND_CODE = {"f16": 0, "tf32": 1, "f8f6f4": 2, "i8": 3}  # intrinsic immarg (docs/hardware.md §6)


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
    descriptor M = 256. ``m = 64`` (the dense tile-level ``dot``, ``cta_group=1``): one M tile,
    descriptor M = 64.

    ``block_scale`` (kind::mxf8f6f4 ``.block_scale``, ``frontend/ops/tmem_scales.py``): K step ``ks``
    uses scale block ``ks``: scale-factor ids ``ks % 4`` for A and B in the descriptor, and the
    scale columns ``a_scale_col`` / ``b_scale_col`` (relative to the scale views)."""
    from ...frontend.ops.blackwell_operands import MMA_KIND
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
        for mt in range(max(1, m // 128)):
            for n0, nsz in split_n(n):
                scales = dict(scale_dtype="ue8m0", a_scale_id=scale_id(ks), b_scale_id=scale_id(ks),
                              block_size=32) if block_scale else {}
                d = InstrDesc(kind, PTX_DTYPE[a_elem.name], PTX_DTYPE[b_elem.name], D_DTYPE[acc_elem.name],
                              min(m, 128) * cta_group, nsz, sparse=sparse, selector=sel, cta_group=cta_group,
                              **scales)  # type: ignore[arg-type]
                out.append(MmaInstr(ks, mt, n0, nsz, 128 * mt, ks * a_step, n0, ks * step, mt * acc_tile_stride + n0,
                                    None if meta_in_tile is None else mt * meta_tile_stride + meta_in_tile, sel,
                                    encode_idesc(d), ks == 0,
                                    a_scale_column(ks, mt, m) if block_scale else None,
                                    b_scale_column(ks, n0, n) if block_scale else None))
    return out


@lowering("tcgen05.mma")
def lower_mma(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
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
            intrinsic(cg, "void", name, args + imm)

    emit_in_issuer(cg, issue, pair=group == 2)


@lowering("tcgen05.copy")
def lower_copy(cg: CodeGen, op: Operation) -> None:
    """``tcgen05.cp.cta_group::1.128x128b [tmem + 4i], desc`` per 2 KB atom (docs/hardware.md §1.4:
    no swizzle, SBO = 128 B, LBO unused, version bit 46; byte row r lands in lane r)."""
    require_tcgen05(cg, op)
    src: SmemRef = cg.get(op.operand("src"))
    dst: TmemRef = cg.get(op.operand("dst"))
    fields = SmemDesc(0, 0, 128, "none")
    g = op.attrs.get("cta_group", 1)
    if op.attrs.get("scale"):
        emit_in_issuer(cg, lambda: _copy_scale_atoms(cg, src, dst, op.attrs["atoms"]))
        return

    def issue() -> None:
        for i in range(op.attrs["atoms"]):
            off = cg.fb.binop("add", src.base, const(2048 * i, "i32")) if i else src.base
            intrinsic(cg, "void", f"llvm.nvvm.tcgen05.cp.128x128b.cg{g}",
                      [tmem_ptr(cg, dst.addr, 4 * i), smem_desc_at(cg, off, fields)])

    emit_in_issuer(cg, issue, pair=g == 2)


def _copy_scale_atoms(cg: CodeGen, src: SmemRef, dst: TmemRef, atoms: int) -> None:
    """``tcgen05.cp.cta_group::1.32x128b.warpx4 [tmem + 4i], desc`` per 512-byte scale atom (PTX ISA
    9.7.16.9.2: ``.warpx4`` multicasts the 32 lanes into all four warps' lane quarters, which block
    scaling needs, 9.7.16.10.7). The source is 32 lines of 16 bytes, K-major without swizzle: core
    matrices of 8 lines x 16 bytes, SBO = 128 B between 8-line groups, LBO unused (§1.5)."""
    fields = SmemDesc(0, 0, 128, "none")
    for i in range(atoms):
        off = cg.fb.binop("add", src.base, const(512 * i, "i32")) if i else src.base
        intrinsic(cg, "void", "llvm.nvvm.tcgen05.cp.32x128b_warpx4.cg1",
                  [tmem_ptr(cg, dst.addr, 4 * i), smem_desc_at(cg, off, fields)])


@lowering("tcgen05.commit")
def lower_commit(cg: CodeGen, op: Operation) -> None:
    """``tcgen05.commit.cta_group::N.mbarrier::arrive::one.shared::cluster[.multicast::cluster]``."""
    require_tcgen05(cg, op)
    bar = cg.get(op.operand("bar"))
    g = op.attrs.get("cta_group", 1)
    if op.attrs.get("multicast"):
        mask = cg.scalar(op.operand("mask"))

        def issue() -> None:
            m16 = cg.fb.cast("trunc", mask, "i16")
            intrinsic(cg, "void", f"llvm.nvvm.tcgen05.commit.mc.shared.cg{g}", [bar_ptr(cg, bar), m16])

        emit_in_issuer(cg, issue, pair=g == 2)
        return
    emit_in_issuer(cg, lambda: intrinsic(cg, "void", f"llvm.nvvm.tcgen05.commit.shared.cg{g}", [bar_ptr(cg, bar)]),
                   pair=g == 2)


@lowering("tcgen05.fence_before")
def lower_fence_before(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.before.thread.sync", [])


@lowering("tcgen05.fence_after")
def lower_fence_after(cg: CodeGen, op: Operation) -> None:
    require_tcgen05(cg, op)
    intrinsic(cg, "void", "llvm.nvvm.tcgen05.fence.after.thread.sync", [])


__all__ = ["KIND_CODE", "MmaInstr", "mma_plan"]
