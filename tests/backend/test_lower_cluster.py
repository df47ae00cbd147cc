"""Lowering of clusters (backend/lower/cluster.py) and of the cta_group::2 tcgen05 forms
(backend/lower/blackwell_mma.py): the emitted PTX, checked instruction by instruction, assembled by
ptxas where it is installed; the cluster shape reaches the PTX and the compiled kernel's launch
metadata."""

from __future__ import annotations

import re

import pytest

import sparsile as sp
from sparsile.backend.lower.cluster import tma_load_cluster_text
from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.target.targets import get_target
from sparsile.tests.frontend.test_ops_cluster import ARRIVALS as FRONTEND_ARRIVALS

X = {"X": sp.tensor[sp.f16, 2]}

MULTICAST = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(X: tensor[f16, 2]):
    rank = cluster.rank()
    s = smem.alloc(f16, (2, 32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    cluster.sync()
    mbarrier.expect(bars[0], 8192)
    tma.load(X, (32 * rank, 0), s[rank], bars[0], multicast=3)
    mbarrier.wait(bars[0], 0)
    cluster.sync()
"""

PEER = MULTICAST.replace("multicast=3", "bar_cta=0")


def ptx(src: str, target: str, sig=X):
    return sp.loads(src, "case.spk").k.compile(sig, target=target, stop_after="ptx")


def check_ptxas(text: str, target: str) -> None:
    if ptxas_available():
        proc = assemble_with_ptxas(text, get_target(target))
        assert proc.returncode == 0, proc.stderr


def test_tma_load_cluster_text():
    assert tma_load_cluster_text(2, True, False) == (
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[$0], [$1, {$2, $3}], [$4], $5;")
    assert tma_load_cluster_text(3, False, True) == (
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.cta_group::2 "
        "[$0], [$1, {$2, $3, $4}], [$5];")


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_multicast_kernel(target):
    ck = ptx(MULTICAST, target)
    text = ck.ptx
    assert ck.cluster == (2, 1, 1)
    assert ".explicitcluster" in text and re.search(r"\.reqnctapercluster 2, 1, 1", text)
    assert "%cluster_ctarank" in text
    assert text.count("barrier.cluster.arrive.aligned;") == 2 and text.count("barrier.cluster.wait.aligned;") == 2
    loads = [ln for ln in text.splitlines() if "cp.async.bulk.tensor" in ln]
    assert len(loads) == 1 and ".multicast::cluster" in loads[0] and "cta_group" not in loads[0]
    # Blackwell cluster kernels acquire at cluster scope (tcgen05 commits from the peer); on sm_90
    # the only remote arrivals are TMA completions and relaxed arrivals: CTA scope (lower_mbar_wait)
    if target == "sm_100a":
        assert "mbarrier.try_wait.parity.acquire.cluster.shared" in text
    else:
        assert "mbarrier.try_wait.parity.shared" in text and "acquire.cluster" not in text
    check_ptxas(text, target)


def test_peer_barrier_maps_the_barrier_to_the_peer():
    text = ptx(PEER, "sm_100a").ptx
    assert re.search(r"mapa\.shared::cluster\.u(32|64)\s+%\w+, %\w+, 0;", text)
    loads = [ln for ln in text.splitlines() if "cp.async.bulk.tensor" in ln]
    assert len(loads) == 1 and loads[0].strip().startswith(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.cta_group::2 ")
    check_ptxas(text, "sm_100a")


def test_kernel_without_cluster_keeps_cta_scope_waits():
    src = MULTICAST.replace(", cluster=(2, 1, 1)", "").replace("    cluster.sync()\n", "").replace(
        ", multicast=3", "").replace("rank = cluster.rank()", "rank = 0")
    ck = ptx(src, "sm_90a")
    assert ck.cluster == (1, 1, 1) and ".reqnctapercluster" not in ck.ptx
    assert "mbarrier.try_wait.parity.shared" in ck.ptx and "acquire.cluster" not in ck.ptx


PAIR = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(C: ptr[f32]):
    a_s = smem.alloc(f16, (128, 64), swizzle=128)
    b_s = smem.alloc(f16, (64, 128), swizzle=128)
    e_s = smem.alloc(u32, (128, 4))
    bars = mbarrier.alloc(2)
    acc = tmem.alloc(f32, (128, 128))
    meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)
    cluster.sync()
    if cluster.rank() == 0:
        tcgen05.copy(e_s, meta, cta_group=2)
        tcgen05.mma(a_s, b_s, acc, a_meta=meta, accumulate=False, cta_group=2)
        tcgen05.commit(bars[0], cta_group=2, multicast=3)
        tcgen05.commit(bars[1], cta_group=2)
    mbarrier.wait(bars[0], 0)
    tcgen05.fence_after()
    c = acc.load()
    store(C + arange(0, 128)[:, None] * 128 + arange(0, 128)[None, :], c)
    cluster.sync()
"""


def test_pair_forms_of_every_tcgen05_op():
    ck = ptx(PAIR, "sm_100a", {"C": sp.ptr[sp.f32]})
    text = ck.ptx
    for form in ("tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32",
                 "tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned",
                 "tcgen05.dealloc.cta_group::2.sync.aligned.b32",
                 "tcgen05.cp.cta_group::2.128x128b",
                 "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64",
                 "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.b64"):
        assert form in text, form
    assert "cta_group::1" not in text
    mma = [ln for ln in text.splitlines() if "tcgen05.mma" in ln]
    # sparse f16 K = 128: 4 instructions of K 32, M = 256 over the pair (one per K step, no M split)
    assert len(mma) == 4 and all("tcgen05.mma.sp.cta_group::2.kind::f16" in ln for ln in mma)
    # instruction descriptors: M>>4 = 16 at bit 24, N>>3 = 16 at bit 17, f32 D, sparse, selectors 0/1
    want = {(16 << 24) | (16 << 17) | (1 << 4) | (1 << 2) | sel for sel in (0, 1)}
    found = {int(x) for x in re.findall(r"mov\.b32\s+%r\d+, (\d+);", text)}
    assert want <= found
    # the dealloc follows a cluster barrier (the pair's TMEM accesses are over)
    tail = text[text.rindex("barrier.cluster.wait.aligned"):]
    assert "tcgen05.dealloc.cta_group::2" in tail
    check_ptxas(text, "sm_100a")


def test_pair_ops_are_issued_by_the_even_cta_only():
    text = ptx(PAIR.replace("    if cluster.rank() == 0:\n", "    if True:\n"), "sm_100a", {"C": sp.ptr[sp.f32]}).ptx
    # the issue predicate tests %cluster_ctarank even without the user's `if` (bit 0; LLVM knows the
    # rank is below 2 in a (2, 1, 1) cluster and may fold the mask into the warp test)
    rank_reg = re.search(r"mov\.u32\s+(%r\d+), %cluster_ctarank;", text).group(1)
    assert re.search(rf"\b(and|or)\.b32\s+%r\d+, [^;]*{rank_reg}\b", text)
    text4 = ptx(PAIR.replace("    if cluster.rank() == 0:\n", "    if True:\n").replace("(2, 1, 1)", "(4, 1, 1)"),
                "sm_100a", {"C": sp.ptr[sp.f32]}).ptx
    rank_reg = re.search(r"mov\.u32\s+(%r\d+), %cluster_ctarank;", text4).group(1)
    assert re.search(rf"and\.b32\s+%r\d+, {rank_reg}, 1;", text4)


def test_commit_multicast_with_cta_group_1():
    src = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k():
    bars = mbarrier.alloc(1)
    acc = tmem.alloc(f32, (128, 32))
    cluster.sync()
    tcgen05.commit(bars[0], multicast=3)
    cluster.sync()
"""
    text = ptx(src, "sm_100a", {}).ptx
    assert "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64" in text
    check_ptxas(text, "sm_100a")


ARRIVALS = FRONTEND_ARRIVALS.replace("COUNT", "2")  # a 2-CTA cluster; each barrier counts 2 arrivals


@pytest.mark.parametrize("mask", ["3", "1 << (cluster.rank() ^ 1)"])
def test_multicast_arrival_maps_the_barrier_to_each_cta(mask):
    """One elected thread per warpgroup arrives on the barrier's offset in CTAs 0 and 1, each
    arrival predicated on its mask bit, relaxed (it only releases a buffer whose reads completed)."""
    ck = ptx(ARRIVALS.replace("MASK", mask), "sm_90a", {"Out": sp.ptr[sp.i32]})
    text = ck.ptx
    assert re.search(r"mapa\.shared::cluster\.u(32|64)\s+%\w+, %\w+, 0;", text)
    assert re.search(r"mapa\.shared::cluster\.u(32|64)\s+%\w+, %\w+, 1;", text)
    arrivals = [ln for ln in text.splitlines() if "mbarrier.arrive" in ln]
    assert len(arrivals) == 2 and all("@p mbarrier.arrive.relaxed.cluster.shared::cluster.b64 _, [" in a
                                      for a in arrivals)
    check_ptxas(text, "sm_90a")
    cubin = sp.loads(ARRIVALS.replace("MASK", mask), "case.spk").k.compile({"Out": sp.ptr[sp.i32]},
                                                                           target="sm_90a").cubin
    assert cubin[:4] == b"\x7fELF"
