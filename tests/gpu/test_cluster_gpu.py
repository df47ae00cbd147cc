"""Clusters on the H200 (sm_90a): a TMA multicast kernel (the one tests/frontend/test_ops_cluster.py
runs in the interpreter) on the GPU, and the same kernel in the interpreter. The GPU test was written
after the session's GPU time was spent: not run yet."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp

MULTICAST = """
@kernel(num_warps=4, cluster=(2, 1, 1))
def k(X: tensor[f16, 2], Out: ptr[f16]):
    rank = cluster.rank()
    s = smem.alloc(f16, (2, 32, 64), swizzle=128)
    bars = mbarrier.alloc(1)
    cluster.sync()
    mbarrier.expect(bars[0], 2 * 32 * 64 * 2)
    tma.load(X, (32 * rank, 0), s[rank], bars[0], multicast=3)
    mbarrier.wait(bars[0], 0)
    t = s.slice(0, 0, 1).load()
    u = s.slice(0, 1, 1).load()
    base = Out + program_id(0) * 64 * 64
    store(base + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], t.reshape((32, 64)))
    store(base + 2048 + arange(0, 32)[:, None] * 64 + arange(0, 64)[None, :], u.reshape((32, 64)))
    cluster.sync()
"""


@pytest.mark.gpu
def test_tma_multicast_on_the_gpu():
    """Every CTA of each 2-CTA cluster receives its own half of the box and its partner's."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.full(4 * 64 * 64, np.nan, np.float16)
    sp.loads(MULTICAST, "multicast.spk").k[(4,)](x, out)
    for pid in range(4):
        assert np.array_equal(out[pid * 4096:(pid + 1) * 4096].reshape(64, 64), x), pid


def test_the_same_kernel_in_the_interpreter():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float16)
    out = np.full(4 * 64 * 64, np.nan, np.float16)
    sp.loads(MULTICAST, "multicast.spk").k.interpret[(4,)](x, out)
    assert all(np.array_equal(out[p * 4096:(p + 1) * 4096].reshape(64, 64), x) for p in range(4))


def test_it_compiles_for_sm90a_with_a_multicast_tma_load():
    kernel = sp.loads(MULTICAST, "multicast.spk").k
    ck = kernel[(4,)].compile_for("sm_90a", np.zeros((64, 64), np.float16), np.zeros(4 * 4096, np.float16))
    assert "multicast::cluster" in ck.ptx and ".reqnctapercluster 2, 1, 1" in ck.ptx
