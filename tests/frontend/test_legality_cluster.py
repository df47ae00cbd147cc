"""Legality of clusters and CTA pairs (frontend/legality/cluster.py, and the cta_group=2 rules of
ops_blackwell): each diagnostic's code, message and span, and target gating."""

from __future__ import annotations

import textwrap

import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError


def kernel(body: str, cluster: str = "(2, 1, 1)", warps: int = 4, params: str = "") -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    opt = f", cluster={cluster}" if cluster else ""
    return f"@kernel(num_warps={warps}{opt})\ndef k({params}):\n" + "\n".join("    " + ln for ln in lines) + "\n"


def first_error(src: str, target: str = "sm_100a"):
    with pytest.raises(CompileError) as info:
        sp.loads(src, "case.spk").k.compile({}, target=target, stop_after="ir")
    return info.value.diagnostics[0]


# a cta_group=2 MMA: per CTA 128 rows of A and D, N/2 rows of B (the body starts on line 3, col 5)
PAIR = """\
a_s = smem.alloc(f16, (128, 64), swizzle=128)
b_s = smem.alloc(f16, (64, 128), swizzle=128)
acc = tmem.alloc(f32, (128, 128))
meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)
"""


def test_pair_mma_compiles_for_the_pair():
    sp.loads(kernel(PAIR + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)"), "case.spk").k.compile(
        {}, target="sm_100a", stop_after="ir")


@pytest.mark.parametrize("body,code,line,col,fragment", [
    (PAIR.replace("(128, 128))", "(256, 128))") + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)",
     "SP0544", 7, 17, "A has 128 rows but the accumulator"),
    (PAIR.replace("(128, 64), swizzle", "(256, 64), swizzle").replace("(128, 128))", "(256, 128))")
     .replace('(128, 4), kind', '(256, 4), kind') + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)",
     "SP0555", 7, 27, "each CTA holds 128 accumulator rows"),
    (PAIR.replace("(64, 128), swizzle", "(128, 128), swizzle") + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)",
     "SP0555", 7, 22, "each CTA holds half of B: N/2 x K = 64 x 128"),
    (PAIR.replace("(64, 128), swizzle", "(192, 128), swizzle").replace("(128, 128))", "(128, 384))")
     + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)", "SP0555", 7, 27, "N <= 256"),
    (PAIR.replace("(64, 128), swizzle", "(4, 128), swizzle").replace("(128, 128))", "(128, 8))")
     + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)", "SP0505", 7, 27, "cta_group::2"),
])
def test_pair_mma_shapes(body, code, line, col, fragment):
    d = first_error(kernel(body))
    text = d.message + " " + (d.help or "")
    assert (d.code, d.span.line, d.span.col) == (code, line, col) and fragment in text, d.render()


def test_pair_mma_needs_an_even_cluster():
    d = first_error(kernel(PAIR + "tcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)", cluster="(3, 1, 1)"))
    assert (d.code, d.span.line, d.span.col) == ("SP0557", 7, 55) and "odd number of CTAs (3)" in d.message


def test_mixed_cta_groups_are_reported_at_the_minority():
    body = PAIR + ("b = mbarrier.alloc(1)\ntcgen05.mma(a_s, b_s, acc, a_meta=meta, cta_group=2)\n"
                   "tcgen05.commit(b[0], cta_group=2, multicast=3)\ntcgen05.commit(b[0])")
    d = first_error(kernel(body))
    assert (d.code, d.span.line, d.span.col) == ("SP0556", 10, 5), d.render()
    assert d.message == ("all tcgen05 operations of a kernel use one cta_group, but this one uses cta_group=1 and "
                         "another uses cta_group=2")


def test_commit_multicast_mask_must_name_cluster_ctas():
    d = first_error(kernel("b = mbarrier.alloc(1)\ntcgen05.commit(b[0], multicast=5)"))
    assert (d.code, d.span.line, d.span.col) == ("SP0554", 4, 36) and "0x5 must name CTAs" in d.message


def test_commit_multicast_needs_a_cluster():
    d = first_error(kernel("b = mbarrier.alloc(1)\ntcgen05.commit(b[0], multicast=1)", cluster=""))
    assert (d.code, d.span.line, d.span.col) == ("SP0552", 4, 36), d.render()


def test_cluster_sync_inside_a_partition():
    src = """
def part():
    cluster.sync()


@kernel(num_warps=4, cluster=(2, 1, 1))
def k():
    warp_specialize(partition(part, warps=4))
"""
    d = first_error(src, "sm_90a")
    assert (d.code, d.span.line, d.span.col) == ("SP0553", 3, 5), d.render()
    assert "inside a warp_specialize partition" in d.message


@pytest.mark.parametrize("cluster,shown", [("(3, 3, 1)", "(3, 3, 1)"), ("(0, 1, 1)", "(0, 1, 1)"),
                                           ("(2, 2, 2, 2)", "(2, 2, 2, 2)")])
def test_cluster_shape(cluster, shown):
    d = first_error(kernel("x = 1", cluster=cluster), "sm_90a")
    assert (d.code, d.span.line) == ("SP0558", 1) and f"found cluster={shown}" in d.message, d.render()  # the option


def test_clusters_need_sm90():
    with pytest.raises(CompileError) as info:
        sp.loads(kernel("x = cluster.rank()"), "case.spk").k.compile({}, target="sm_80", stop_after="ir")
    found = [(d.code, d.span.line, d.message) for d in info.value.diagnostics]
    assert found == [("SP0602", 2, "a kernel declaring cluster=(2, 1, 1) is not available on sm_80"),
                     ("SP0602", 3, "`cluster.rank` (thread-block clusters) is not available on sm_80")]


def test_peer_barrier_tma_needs_the_cta_group_qualifier():
    body = "s = smem.alloc(f16, (32, 64), swizzle=128)\nb = mbarrier.alloc(1)\ntma.load(X, (0, 0), s, b[0], bar_cta=0)"
    src = kernel(body, params="X: tensor[f16, 2]")
    with pytest.raises(CompileError) as info:
        sp.loads(src, "case.spk").k.compile({"X": sp.tensor[sp.f16, 2]}, target="sm_90a", stop_after="ir")
    d = info.value.diagnostics[0]
    assert d.code == "SP0602" and "peer CTA's mbarrier" in d.message and (d.span.line, d.span.col) == (5, 5)
