"""Clusters in the language (frontend/ops/cluster.py): cluster.rank / size / sync, TMA multicast
and peer-CTA barriers, and the interpreter running the CTAs of a cluster concurrently (shared
memory per CTA, remote barriers, checks of remote use before cluster.sync and of bad ranks)."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.interp.values import InterpreterError


def load(src: str):
    return sp.loads(src, "case.spk")


RANKS = """
@kernel(num_warps=4, cluster=(2, 2, 1))
def k(Out: ptr[i32]):
    pid = program_id(0) + 4 * program_id(1)
    store(Out + 2 * pid, cluster.rank())
    store(Out + 2 * pid + 1, cluster.size())
"""


def test_rank_is_x_fastest_in_the_cluster_and_size_is_the_declared_shape():
    out = np.full(2 * 16, -1, np.int32)
    load(RANKS).k.interpret[(4, 4)](out)
    ranks, sizes = out[0::2].reshape(4, 4), out[1::2]
    want = np.array([[(x % 2) + 2 * (y % 2) for x in range(4)] for y in range(4)])
    assert (ranks == want).all() and (sizes == 4).all()


def test_cluster_shape_can_be_given_at_the_launch():
    src = RANKS.replace(", cluster=(2, 2, 1)", "")
    out = np.full(2 * 4, -1, np.int32)
    load(src).k.interpret[(4, 1)](out, cluster=(4, 1, 1))
    assert out[0::2].tolist() == [0, 1, 2, 3] and (out[1::2] == 4).all()


def test_grid_must_be_a_multiple_of_the_cluster():
    with pytest.raises(InterpreterError, match="not a multiple of the cluster"):
        load(RANKS).k.interpret[(3, 2)](np.zeros(64, np.int32))


MULTICAST = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(X: tensor[f16, 2], Out: ptr[f16]):
    rank = cluster.rank()
    s = smem.alloc(f16, (2, 32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    cluster.sync()
    mbarrier.expect(bars[0], 2 * 32 * 64 * 2)           # both halves arrive in every CTA
    tma.load(X, (32 * rank, 0), s[rank], bars[0], multicast=MASK)
    mbarrier.wait(bars[0], 0)
    t = s.slice(0, 0, 1).load()
    u = s.slice(0, 1, 1).load()
    base = Out + program_id(0) * 64 * 64
    store(base + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], t.reshape((32, 64)))
    store(base + 2048 + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], u.reshape((32, 64)))
    cluster.sync()
"""


def test_tma_multicast_writes_the_box_into_every_cta_of_the_mask():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.full(4 * 64 * 64, np.nan, np.float16)
    load(MULTICAST.replace("MASK", "3")).k.interpret[(4,)](x, out)
    for pid in range(4):  # two clusters; each CTA received its own half and its partner's
        assert np.array_equal(out[pid * 4096:(pid + 1) * 4096].reshape(64, 64), x)


def test_remote_access_before_any_cluster_sync_is_reported():
    src = MULTICAST.replace("MASK", "3").replace("    cluster.sync()\n    mbarrier.expect", "    mbarrier.expect", 1)
    with pytest.raises(InterpreterError, match=r"before any cluster\.sync"):
        load(src).k.interpret[(2,)](np.ones((64, 64), np.float16), np.zeros(2 * 4096, np.float16))


def test_runtime_multicast_mask_outside_the_cluster_is_reported():
    src = MULTICAST.replace("MASK", "4 * rank + 4")
    with pytest.raises(InterpreterError, match="outside the 2-CTA cluster"):
        load(src).k.interpret[(2,)](np.ones((64, 64), np.float16), np.zeros(2 * 4096, np.float16))


PEER = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(X: tensor[f16, 2], Out: ptr[f16]):
    rank = cluster.rank()
    s = smem.alloc(f16, (32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    cluster.sync()
    if rank == 0:
        mbarrier.expect(bars[0], 2 * 32 * 64 * 2)        # rank 0 counts both CTAs' bytes
    tma.load(X, (32 * rank, 0), s, bars[0], bar_cta=BAR)
    if rank == 0:
        mbarrier.wait(bars[0], 0)
    cluster.sync()                                         # rank 1's box landed before rank 0 saw the bytes
    t = s.load()
    store(Out + rank * 2048 + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], t)
    cluster.sync()
"""


def test_tma_bytes_counted_on_the_peer_barrier():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.full(4096, np.nan, np.float16)
    load(PEER.replace("BAR", "0")).k.interpret[(2,)](x, out)
    assert np.array_equal(out.reshape(64, 64), x)


def test_peer_barrier_outside_the_cta_pair_is_reported():
    src = PEER.replace("cluster=(2, 1, 1)", "cluster=(4, 1, 1)").replace("BAR", "(rank + 2) % 4")
    with pytest.raises(InterpreterError, match="neither this CTA"):
        load(src).k.interpret[(4,)](np.ones((128, 64), np.float16), np.zeros(4 * 2048, np.float16))


def test_cluster_sync_completes_without_ctas_that_exited():
    """barrier.cluster waits for the non-exited threads only (PTX ISA 9.7.13.3)."""
    src = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(Out: ptr[i32]):
    r = cluster.rank()
    if r == 0:
        cluster.sync()
    store(Out + r, r + 10)
"""
    out = np.zeros(2, np.int32)
    load(src).k.interpret[(2,)](out)
    assert out.tolist() == [10, 11]


@pytest.mark.parametrize("body,fragment,col", [
    ("x = cluster.rank()", "`cluster.rank()` needs a thread-block cluster", 9),
    ("cluster.sync()", "`cluster.sync()` needs a thread-block cluster", 5),
    ("x = cluster.size()", "`cluster.size()` needs a thread-block cluster", 9),
])
def test_cluster_ops_need_a_declared_cluster(body, fragment, col):
    src = f"@kernel(num_warps=4)\ndef k(Out: ptr[i32]):\n    {body}\n"
    with pytest.raises(CompileError) as info:
        load(src).k.ir(np.zeros(1, np.int32))
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0552", 3, col) and fragment in d.message, d.render()


@pytest.mark.parametrize("call,code,col,fragment", [
    ("tma.load(X, (0, 0), s, b[0], multicast=4)", "SP0554", 44, "0x4 must name CTAs of the 2-CTA cluster"),
    ("tma.load(X, (0, 0), s, b[0], multicast=0)", "SP0554", 44, "non-zero"),
    ("tma.load(X, (0, 0), s, b[0], bar_cta=2)", "SP0554", 42, "bar_cta=2 is not a CTA"),
    ("tma.load(X, (0, 0), s, b[0], multicast=s)", "SP0554", 44, "integer scalar"),
])
def test_tma_cluster_argument_errors(call, code, col, fragment):
    src = ("@kernel(num_warps=4, cluster=(2, 1, 1))\ndef k(X: tensor[f16, 2]):\n"
           "    s = smem.alloc(f16, (32, 64), swizzle=128)\n    b = mbarrier.alloc(1)\n    " + call + "\n")
    with pytest.raises(CompileError) as info:
        load(src).k.ir(np.zeros((64, 64), np.float16))
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == (code, 5, col) and fragment in d.message, d.render()


def test_peer_barrier_needs_an_even_cluster():
    src = ("@kernel(num_warps=4, cluster=(3, 1, 1))\ndef k(X: tensor[f16, 2]):\n"
           "    s = smem.alloc(f16, (32, 64), swizzle=128)\n    b = mbarrier.alloc(1)\n"
           "    tma.load(X, (0, 0), s, b[0], bar_cta=0)\n")
    with pytest.raises(CompileError) as info:
        load(src).k.ir(np.zeros((64, 64), np.float16))
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0557", 5, 42) and "odd number of CTAs (3)" in d.message


def test_a_missing_arrival_in_a_cluster_is_reported_at_once_and_a_peer_arrival_is_not_one():
    """The deadlock check counts every running CTA of the cluster: a barrier its peer completes is
    not a deadlock; a barrier no CTA will complete is reported without the 20 s backstop."""
    import time

    complete = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(Out: ptr[i32]):
    bars = mbarrier.alloc(1)
    cluster.sync()
    mbarrier.arrive(bars[0])
    mbarrier.wait(bars[0], 0)
    cluster.sync()
    store(Out + program_id(0), cluster.rank())
"""
    out = np.full(2, -1, np.int32)
    load(complete).k.interpret[(2,)](out)
    assert out.tolist() == [0, 1]
    stuck = complete.replace("    mbarrier.arrive(bars[0])\n", "    if cluster.rank() == 1:\n"
                                                               "        mbarrier.arrive(bars[0])\n")
    start = time.perf_counter()
    with pytest.raises(InterpreterError, match="deadlock: every partition waits"):
        load(stuck).k.interpret[(2,)](np.zeros(2, np.int32))
    assert time.perf_counter() - start < 10


ARRIVALS = """
@kernel(num_warps=8, cluster=(2, 1, 1))
def k(Out: ptr[i32]):
    bars = mbarrier.alloc(1, COUNT)
    cluster.sync()
    warp_specialize(partition(waiter, Out, bars, warps=4), partition(arriver, bars, warps=4))
    cluster.sync()

def waiter(Out, bars):
    mbarrier.wait(bars[0], 0)
    store(Out + program_id(0), 10 + cluster.rank())

def arriver(bars):
    mbarrier.arrive(bars[0], per="warpgroup", multicast=MASK)
"""


@pytest.mark.parametrize("count,mask", [(2, "3"), (1, "1 << (cluster.rank() ^ 1)")])
def test_multicast_arrival_lands_on_the_barriers_of_the_mask(count, mask):
    """Each CTA's barrier completes only with the arrivals the masks send it: its own and its
    peer's (count 2, mask 3), or only its peer's (count 1, mask naming the other CTA)."""
    out = np.full(4, -1, np.int32)
    load(ARRIVALS.replace("COUNT", str(count)).replace("MASK", mask)).k.interpret[(4,)](out)
    assert out.tolist() == [10, 11, 10, 11]


def test_multicast_arrival_missing_its_peer_is_a_deadlock():
    """Count 2 but every CTA arrives only on its own barrier: no phase completes."""
    with pytest.raises(InterpreterError, match="deadlock"):
        load(ARRIVALS.replace("COUNT", "2").replace("MASK", "1 << cluster.rank()")).k.interpret[(2,)](
            np.zeros(2, np.int32))


@pytest.mark.parametrize("call,code,col,fragment", [
    ("mbarrier.arrive(b[0], multicast=4)", "SP0554", 37, "0x4 must name CTAs of the 2-CTA cluster"),
    ("mbarrier.arrive(b[0], multicast=0)", "SP0554", 37, "non-zero"),
])
def test_multicast_arrival_argument_errors(call, code, col, fragment):
    src = "@kernel(num_warps=4, cluster=(2, 1, 1))\ndef k(X: ptr[i32]):\n    b = mbarrier.alloc(1)\n    " + call + "\n"
    with pytest.raises(CompileError) as info:
        load(src).k.ir(np.zeros(4, np.int32))
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == (code, 4, col) and fragment in d.message, d.render()


def test_multicast_arrival_needs_a_cluster():
    src = ("@kernel(num_warps=4)\ndef k(X: ptr[i32]):\n    b = mbarrier.alloc(1)\n"
           "    mbarrier.arrive(b[0], multicast=1)\n")
    with pytest.raises(CompileError) as info:
        load(src).k.ir(np.zeros(4, np.int32))
    d = info.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0552", 4, 37), d.render()
    assert "`mbarrier.arrive` with multicast= needs a thread-block cluster" in d.message
