"""Lowering of the cluster ops (``frontend/ops/cluster.py``), sm_90+.

* ``cluster.rank`` -> ``%cluster_ctarank`` (``llvm.nvvm.read.ptx.sreg.cluster.ctarank``).
* ``cluster.sync`` -> ``barrier.cluster.arrive.aligned`` + ``barrier.cluster.wait.aligned`` by every
  thread (release / acquire are the defaults, PTX ISA 9.7.13.3).
* ``tma.load_cluster`` -> ``cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx
  ::bytes[.multicast::cluster][.cta_group::2] [dst], [tmap, {c..}], [mbar][, ctaMask]`` as inline
  asm, issued by the partition's first thread like ``tma.load``. The destination is this CTA's
  shared-memory offset (a ``.shared::cta`` address is the own CTA's ``.shared::cluster`` address;
  with ``.multicast::cluster`` the box lands at that offset in every CTA of the mask). With a peer
  barrier the mbarrier operand is the ``mapa`` of ``bar`` to CTA ``bar_cta`` (PTX ISA 9.7.9.23); the
  ``.cta_group::2`` qualifier lets it lie in the peer CTA (PTX ISA 9.7.9.25). Inline asm is gated
  here (``targets.require``): LLVM does not check it.
"""

from __future__ import annotations

from ...frontend.ir.core import Operation
from ...target.targets import Feature, require
from .asynchronous import bar_ptr, emit_in_leader
from .codegen import CodeGen, lowering
from .llvm_text import LLValue
from .tma import cache_policy, tma_panel_copies


def cluster_rank(cg: CodeGen) -> LLValue:
    """``%cluster_ctarank`` (read once in the entry block)."""
    return cg.sreg("cluster.ctarank")


def cluster_barrier(cg: CodeGen) -> None:
    """``barrier.cluster.arrive.aligned; barrier.cluster.wait.aligned`` (all threads)."""
    cg.intrinsic("void", "llvm.nvvm.barrier.cluster.arrive.aligned", [], convergent=True)
    cg.intrinsic("void", "llvm.nvvm.barrier.cluster.wait.aligned", [], convergent=True)


def map_shared(cg: CodeGen, ptr: LLValue, rank: LLValue) -> LLValue:
    """``mapa``: the 32-bit ``.shared::cluster`` address of ``ptr``'s offset in CTA ``rank``."""
    p7 = cg.intrinsic("ptr addrspace(7)", "llvm.nvvm.mapa.shared.cluster", [ptr, rank])
    assert p7 is not None
    return cg.fb.value(f"ptrtoint ptr addrspace(7) {p7.ref} to i32", "i32", "rbar")


@lowering("cluster.rank")
def lower_cluster_rank(cg: CodeGen, op: Operation) -> None:
    require(cg.target, Feature.CLUSTER, op.span, what="`cluster.rank()`")
    cg.set(op.result, cluster_rank(cg))


@lowering("cluster.sync")
def lower_cluster_sync(cg: CodeGen, op: Operation) -> None:
    require(cg.target, Feature.CLUSTER, op.span, what="`cluster.sync()`")
    cluster_barrier(cg)


def tma_load_cluster_text(rank: int, multicast: bool, peer_bar: bool, hinted: bool = False) -> str:
    """The PTX of one cluster TMA load: operands $0 dst, $1 tensor map, $2.. coordinates, then the
    mbarrier, (with multicast) the 16-bit CTA mask and (``hinted``) the 64-bit L2 cache policy."""
    coords = ", ".join(f"${2 + i}" for i in range(rank))
    mbar = f"${2 + rank}"
    quals = ((".multicast::cluster" if multicast else "") + (".cta_group::2" if peer_bar else "")
             + (".L2::cache_hint" if hinted else ""))
    tail = (f", ${3 + rank}" if multicast else "") + (f", ${3 + rank + int(multicast)}" if hinted else "")
    return (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes{quals} "
            f"[$0], [$1, {{{coords}}}], [{mbar}]{tail};")


@lowering("tma.load_cluster")
def lower_tma_load_cluster(cg: CodeGen, op: Operation) -> None:
    multicast, peer_bar = op.attrs["multicast"], op.attrs["peer_bar"]
    require(cg.target, Feature.CLUSTER, op.span, what="a TMA load in a cluster")
    if peer_bar:
        require(cg.target, Feature.TMA_CTA_GROUP, op.span, what="a TMA load counted on a peer CTA's mbarrier")
    bar = cg.get(op.operand("bar"))
    mask = cg.scalar(op.operand("mask"))
    bar_cta = cg.scalar(op.operand("rank"))
    fb = cg.fb

    def issue() -> None:
        tmap, rank, copies = tma_panel_copies(cg, op, op.operand_index("smem"))
        b = bar_ptr(cg, bar)
        mbar = map_shared(cg, b, bar_cta) if peer_bar else fb.value(f"ptrtoint ptr addrspace(3) {b.ref} to i32",
                                                                    "i32", "bar")
        m16 = fb.cast("trunc", mask, "i16") if multicast else None
        policy = cache_policy(cg, op.attrs.get("cache"))
        text = tma_load_cluster_text(rank, multicast, peer_bar, policy is not None)
        for coords, off in copies:
            dst = fb.value(f"ptrtoint ptr addrspace(3) {cg.smem_ptr(off).ref} to i32", "i32", "dst")
            args = [dst, tmap, *coords, mbar, *([m16] if m16 is not None else []),
                    *([policy] if policy is not None else [])]
            cons = ",".join(["r", "l", *(["r"] * rank), "r", *(["h"] if m16 is not None else []),
                             *(["l"] if policy is not None else []), "~{memory}"])
            cg.asm("void", text, cons, args, side_effect=True)

    emit_in_leader(cg, issue)


__all__ = ["cluster_barrier", "cluster_rank", "map_shared", "tma_load_cluster_text"]
