"""Lowering of the TMA ops (``tma.load``, ``tma.store``, ``tma.store_wait``; ``ops_memory.py``): bulk
tensor copies between global memory and the shared-memory buffers of :mod:`.asynchronous` through
tensor maps (``cp.async.bulk.tensor``, PTX ISA 9.7.9.25; docs/hardware.md §5.1), sm_90a and later.

A buffer with swizzle span S is copied as one box per S-byte column panel (:func:`tma_panel_copies`),
issued by the first thread of the current partition; a load completes on its mbarrier. Before the
parameters are declared, :func:`collect_tma_keys` lists the tensor maps each tensor parameter needs
(one ``tensormap`` kernel parameter each). A ``cache=`` hint is an L2 cache policy (PTX ISA,
`createpolicy`). ``tma.load_cluster`` (multicast, peer barriers) is lowered in :mod:`.cluster` with
the helpers here.
"""

from __future__ import annotations

from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from .asynchronous import BarRef, SmemRef, bar_ptr, emit_in_leader
from .codegen import CodeGen, lowering
from .llvm_text import LLValue, const


def tma_boxes(ref_type: T.SmemType) -> tuple[tuple[int, ...], int, int]:
    """(box shape in numpy order, panels, panel columns) of the TMA copies filling a buffer."""
    eb = max(1, ref_type.elem.bits // 8)
    cols = ref_type.shape[-1]
    pc = (ref_type.swizzle // eb) if ref_type.swizzle else cols
    panels = max(1, cols // pc)
    return (*ref_type.shape[:-1], pc), panels, pc


def tma_key(op: Operation, smem_index: int) -> tuple[tuple[int, ...], int]:
    t = op.operands[smem_index].type
    assert isinstance(t, T.SmemType)
    box, _, _ = tma_boxes(t)
    return box, t.swizzle


def collect_tma_keys(cg: CodeGen) -> None:
    """Before parameters are declared: the tensor maps each tensor parameter needs."""
    keys: dict[int, list[tuple[tuple[int, ...], int]]] = {}
    for op in cg.func.walk():
        if op.name in ("tma.load", "tma.store", "tma.load_cluster"):
            root = op.operand("tensor")
            k = tma_key(op, op.operand_index("smem"))
            lst = keys.setdefault(id(root), [])
            if k not in lst:
                lst.append(k)
    cg.state.tma_keys = keys


def _tmap(cg: CodeGen, op: Operation, smem_index: int) -> LLValue:
    t = cg.get(op.operand("tensor"))
    return t.tensormaps[tma_key(op, smem_index)]


def _coords(cg: CodeGen, offsets: list[LLValue]) -> list[LLValue]:
    return list(reversed(offsets))  # TMA coordinate 0 is the innermost dimension


def tma_panel_copies(cg: CodeGen, op: Operation, smem_index: int) -> tuple[LLValue, int, list[tuple[list[LLValue],
                                                                                                 LLValue]]]:
    """The tensor map, the rank, and for each S-byte column panel of the shared buffer: the TMA
    coordinates (innermost first) and the panel's shared-memory offset."""
    offs = [cg.scalar(v) for v in op.operand_group("offset")]
    ref: SmemRef = cg.get(op.operands[smem_index])
    st = op.operands[smem_index].type
    assert isinstance(st, T.SmemType)
    _, panels, pc = tma_boxes(st)
    fb = cg.fb
    copies = []
    for p in range(panels):
        coords = list(offs)
        if p:
            coords[-1] = fb.binop("add", coords[-1], const(p * pc, "i32"))
        off = fb.binop("add", ref.base, const(p * ref.full_rows * ref.swizzle, "i32")) if p else ref.base
        copies.append((_coords(cg, coords), off))
    return _tmap(cg, op, smem_index), len(offs), copies


def cache_policy(cg: CodeGen, hint: str | None) -> LLValue | None:
    """The 64-bit L2 cache policy of a ``cache=`` hint (``createpolicy.fractional.L2::<hint>.b64``
    with fraction 1.0: every line the copy touches; PTX ISA, `createpolicy`), or None for no hint."""
    if hint is None:
        return None
    return cg.asm("i64", f"createpolicy.fractional.L2::{hint}.b64 $0, 1.0;", "=l", [], side_effect=False)


@lowering("tma.load")
def lower_tma_load(cg: CodeGen, op: Operation) -> None:
    bar: BarRef = cg.get(op.operand("bar"))
    fb = cg.fb

    def issue() -> None:
        tmap, rank, copies = tma_panel_copies(cg, op, op.operand_index("smem"))
        policy = cache_policy(cg, op.attrs.get("cache"))
        hinted = policy is not None
        for coords, off in copies:
            d3 = cg.smem_ptr(off)
            d7 = fb.value(f"addrspacecast ptr addrspace(3) {d3.ref} to ptr addrspace(7)", "ptr addrspace(7)")
            # (..., i16 multicast mask, i64 cache policy, i1 multicast?, i1 cache policy?, i32 cta_group)
            args = [d7, bar_ptr(cg, bar), tmap, *coords, const(0, "i16"), policy if hinted else const(0, "i64"),
                    const(0, "i1"), const(1 if hinted else 0, "i1"), const(0, "i32")]
            cg.intrinsic("void", f"llvm.nvvm.cp.async.bulk.tensor.g2s.tile.{rank}d", args)

    emit_in_leader(cg, issue)


@lowering("tma.store")
def lower_tma_store(cg: CodeGen, op: Operation) -> None:
    def issue() -> None:
        tmap, rank, copies = tma_panel_copies(cg, op, op.operand_index("smem"))
        for coords, off in copies:
            args = [cg.smem_ptr(off), tmap, *coords, const(0, "i64"), const(0, "i1")]
            cg.intrinsic("void", f"llvm.nvvm.cp.async.bulk.tensor.s2g.tile.{rank}d", args)
        cg.intrinsic("void", "llvm.nvvm.cp.async.bulk.commit.group", [])

    emit_in_leader(cg, issue)


@lowering("tma.store_wait")
def lower_tma_store_wait(cg: CodeGen, op: Operation) -> None:
    n = op.attrs.get("pending", 0)
    emit_in_leader(cg, lambda: cg.intrinsic("void", "llvm.nvvm.cp.async.bulk.wait.group.read", [const(n, "i32")]))
