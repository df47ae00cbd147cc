"""The interpreter's deadlock report (frontend/ops_memory.Mbarrier.wait, interpreter._warp_specialize):
every arrival is made by a running thread, so when every live partition waits on an mbarrier
phase that has not completed, nothing can complete it. That must be reported at once (not after
the 20 s backstop), and a correct handshake under contention must never be reported."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.frontend.interp.values import InterpreterError

PING_PONG = """
def ping(bars, out, N):
    for i in range(0, N):
        mbarrier.wait(bars[0], i & 1)
        store(out + i, i)
        mbarrier.arrive(bars[1])


def pong(bars, N, SKIP: constexpr):
    for i in range(0, N - SKIP):
        mbarrier.arrive(bars[0])
        mbarrier.wait(bars[1], i & 1)


@kernel(num_warps=2)
def k(out: ptr[i32], N: i32, SKIP: constexpr = 0):
    bars = mbarrier.alloc(2, 1)
    warp_specialize(partition(ping, bars, out, N, warps=1), partition(pong, bars, N, SKIP, warps=1))
"""


def kernel(src: str):
    return next(iter(loads(src, "t.spk").kernels.values()))


def test_a_correct_handshake_is_never_reported():
    """2 x 1500 waits where each side arrives and at once waits for the other: a waiter that was
    woken but has not re-checked yet must not count as stuck."""
    out = np.full(1500, -1, np.int32)
    kernel(PING_PONG).interpret[(2,)](out, 1500)
    np.testing.assert_array_equal(out, np.arange(1500))


def test_a_partition_that_exits_without_arriving_deadlocks_the_other():
    out = np.full(50, -1, np.int32)
    start = time.monotonic()
    with pytest.raises(InterpreterError, match=r"deadlock: every partition waits .*line 4 \(parity 1\)"):
        kernel(PING_PONG).interpret[(1,)](out, 50, SKIP=1)
    assert time.monotonic() - start < 5
    np.testing.assert_array_equal(out[:49], np.arange(49))  # everything before the missing arrival ran


def test_a_wait_outside_warp_specialize_that_cannot_complete():
    src = """
@kernel(num_warps=4)
def k(out: ptr[i32]):
    bars = mbarrier.alloc(1, 2)
    mbarrier.arrive(bars[0])
    mbarrier.wait(bars[0], 0)
    store(out, 1)
"""
    start = time.monotonic()
    with pytest.raises(InterpreterError, match="deadlock"):
        kernel(src).interpret[(1,)](np.zeros(1, np.int32))
    assert time.monotonic() - start < 5


def test_a_completed_phase_is_not_waited_for():
    src = """
@kernel(num_warps=4)
def k(out: ptr[i32]):
    bars = mbarrier.alloc(1, 2)
    mbarrier.wait(bars[0], 1)   # parity 1: the phase before the first one counts as completed
    mbarrier.arrive(bars[0])
    mbarrier.arrive(bars[0])
    mbarrier.wait(bars[0], 0)
    store(out, 1)
"""
    out = np.zeros(1, np.int32)
    kernel(src).interpret[(1,)](out)
    assert out[0] == 1
