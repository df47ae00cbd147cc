"""The warp simulator's model (tests/support/warp_sim.py, warp_cta.py, warp_fibers.py,
warp_races.py) on small hand-written kernels and access logs: a shuffle reads lane ``l ^ mask``,
a barrier only some threads reach or lanes that shuffle different numbers of times deadlock (an
error at once), a named barrier's counts must agree, and the vectorized race check flags exactly
what checking the accesses one by one in the order they ran flags.

tests/backend/test_argmax_sim.py runs the argmax kernels on it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparsile.tests.support import warp_fibers, warp_sim
from sparsile.tests.support.warp_fibers import LOG_FIELDS
from sparsile.tests.support.warp_races import races

_TID = "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n"
_SHFL = "declare i32 @llvm.nvvm.shfl.sync.bfly.i32(i32, i32, i32, i32)\n"
_BAR = "declare void @llvm.nvvm.barrier0()\n"

pytestmark = pytest.mark.skipif(not warp_fibers.SUPPORTED, reason="the warp simulator runs on Linux/glibc, "
                                                                 "x86_64 or aarch64")


def _kernel(body: str) -> str:
    return (f"define ptx_kernel void @k(ptr addrspace(1) %y) {{\nentry:\n"
            f"  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n{body}}}\n{_TID}{_SHFL}{_BAR}")


@pytest.mark.parametrize("lane_mask", [1, 5, 16, 31, 32])
def test_a_shuffle_reads_lane_l_xor_mask(lane_mask: int) -> None:
    """Every lane publishes ``3 * tid + 1`` and reads lane ``l ^ mask`` of its warp; a lane past 31
    (mask 32) reads its own value (PTX ISA, "shfl.sync")."""
    text = _kernel(f"""  %v = mul i32 %t, 3
  %v1 = add i32 %v, 1
  %r = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %v1, i32 {lane_mask}, i32 31)
  %t64 = zext i32 %t to i64
  %p = getelementptr i32, ptr addrspace(1) %y, i64 %t64
  store i32 %r, ptr addrspace(1) %p
  ret void
""")
    got = np.full(64, -1, np.int32)
    warp_sim.run_cta(text, 0, 2, [got])
    t = np.arange(64)
    src = np.where((t % 32) ^ lane_mask < 32, (t // 32) * 32 + ((t % 32) ^ lane_mask), t)
    assert np.array_equal(got, 3 * src + 1)


def test_a_barrier_only_some_threads_reach_deadlocks() -> None:
    text = _kernel("""  %c = icmp ult i32 %t, 32
  br i1 %c, label %wait, label %done
wait:
  call void @llvm.nvvm.barrier0()
  br label %done
done:
  ret void
""")
    with pytest.raises(AssertionError, match=r"deadlock: every unfinished thread waits \(bar\.sync 0, 64\)"):
        warp_sim.run_cta(text, 0, 2, [np.zeros(1, np.int32)])


def test_lanes_that_shuffle_different_numbers_of_times_deadlock() -> None:
    text = _kernel("""  %r = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %t, i32 1, i32 31)
  %odd = and i32 %t, 1
  %c = icmp eq i32 %odd, 1
  br i1 %c, label %again, label %done
again:
  %r2 = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %t, i32 1, i32 31)
  br label %done
done:
  ret void
""")
    with pytest.raises(AssertionError, match=r"deadlock: every unfinished thread waits \(warp 0's shuffle\)"):
        warp_sim.run_cta(text, 0, 1, [np.zeros(1, np.int32)])


def test_a_named_barrier_with_two_counts_is_an_error() -> None:
    text = _kernel("""  %c = icmp ult i32 %t, 32
  br i1 %c, label %a, label %b
a:
  call void asm sideeffect "bar.sync 1, 64;", ""()
  ret void
b:
  call void asm sideeffect "bar.sync 1, 32;", ""()
  ret void
""")
    with pytest.raises(AssertionError, match=r"bar\.sync 1, 32 while 32 threads wait with count 64"):
        warp_sim.run_cta(text, 0, 2, [np.zeros(1, np.int32)])


# ------------------------------------------------------------------------------------------------
# the vectorized race check against the accesses checked one by one


def _sequential(log: np.ndarray, base: int) -> list[str]:
    """Each access checked as it comes, byte by byte (the simulator's check before it was
    vectorized): the specification of warp_races.races."""
    f = {name: i for i, name in enumerate(LOG_FIELDS)}
    written: dict[int, tuple[tuple[int, int], int, int]] = {}
    read: dict[int, tuple[tuple[int, int], set[int]]] = {}
    errors: list[str] = []

    def conflict(a: tuple[int, int], b: tuple[int, int]) -> bool:
        return a == b or a[0] != b[0]

    for row in log:
        tid, ep, size, kind = int(row[f["tid"]]), (int(row[f["epoch_bar"]]), int(row[f["epoch_n"]])), \
            int(row[f["size"]]), int(row[f["kind"]])
        data = row[f["data"]:f["data"] + 2].tobytes()[:size]
        dt = {2: np.float16, 4: np.float32, 8: np.float64}.get(size)
        if kind == 2 and dt is not None and np.isnan(np.frombuffer(data, dt)[0]):
            data = bytes(size)
        for i in range(size):
            byte = int(row[f["ptr"]]) - base + i
            w = written.get(byte)
            if kind:
                r = read.get(byte)
                if r is not None and conflict(r[0], ep) and r[1] - {tid}:
                    errors.append(f"race: thread {tid} writes smem byte {byte} read by {sorted(r[1])[:4]} "
                                  f"in epoch {ep}")
                if w is not None and conflict(w[0], ep) and w[1] != tid and w[2] != data[i]:
                    errors.append(f"race: threads {w[1]} and {tid} write different values to smem byte {byte} "
                                  f"in epoch {ep} ({w[2]:#x}, {data[i]:#x})")
                written[byte] = (ep, tid, data[i])
            else:
                if w is None:
                    errors.append(f"thread {tid} reads smem byte {byte}, which no thread wrote")
                elif conflict(w[0], ep) and w[1] != tid:
                    errors.append(f"race: thread {tid} reads smem byte {byte} written by {w[1]} in epoch {ep}")
                r = read.get(byte)
                if r is None or r[0] != ep:
                    read[byte] = (ep, {tid})
                else:
                    r[1].add(tid)
    return errors


def _random_log(rng: np.random.Generator, base: int) -> np.ndarray:
    """Accesses of a few threads to a few bytes in a few epochs, values from a small pool (equal
    stores), float stores with NaNs of several payloads."""
    n = int(rng.integers(1, 40))
    log = np.zeros((n, len(LOG_FIELDS)), np.int64)
    f = {name: i for i, name in enumerate(LOG_FIELDS)}
    size = rng.choice([1, 2, 4, 8, 16], size=n, p=[0.2, 0.2, 0.3, 0.2, 0.1])
    log[:, f["size"]] = size
    log[:, f["ptr"]] = base + rng.integers(0, 12, size=n)
    log[:, f["kind"]] = rng.choice([0, 1, 2], size=n)
    log[:, f["tid"]] = rng.integers(0, rng.choice([1, 1, 2, 4]), size=n)
    log[:, f["epoch_bar"]] = rng.choice([0, 0, 0, 1], size=n)
    log[:, f["epoch_n"]] = rng.integers(1, 3, size=n)
    if n > 2 and rng.random() < 0.7:  # thread 0 stores every byte first, in an epoch before all others
        for j in (0, 1):
            log[j, f["ptr"]], log[j, f["size"]], log[j, f["kind"]], log[j, f["tid"]] = base + 16 * j, 16, 1, 0
            log[j, f["epoch_bar"]], log[j, f["epoch_n"]] = 0, 0
            size[j] = 16
    data = rng.choice(np.array([0, 1, 0x7F], np.uint8), size=(n, 16))
    for j in np.flatnonzero((log[:, f["kind"]] == 2) & (rng.random(n) < 0.5)):
        nan = {2: np.float16, 4: np.float32, 8: np.float64}.get(int(size[j]))
        if nan is not None:
            value = np.array([np.nan], nan).view(np.uint8).copy()
            value[0] ^= int(rng.integers(0, 3))  # another payload
            if rng.random() < 0.5:
                value[-1] ^= 0x80  # the other sign
            data[j, :len(value)] = value
    for j in range(n):
        data[j, int(size[j]):] = 0
    log[:, f["data"]:f["data"] + 2] = data.view(np.int64)
    return log


_KINDS = {"read race": r"race: thread \d+ writes smem byte \d+ read by \[[\d, ]+\] in epoch \(\d+, \d+\)",
          "store race": r"race: threads \d+ and \d+ write different values to smem byte \d+ in epoch \(\d+, \d+\) "
                        r"\(0x[\da-f]+, 0x[\da-f]+\)",
          "unwritten": r"thread \d+ reads smem byte \d+, which no thread wrote",
          "load race": r"race: thread \d+ reads smem byte \d+ written by \d+ in epoch \(\d+, \d+\)",
          "more": r"\.\.\. and \d+ more"}


def test_the_race_check_flags_what_the_sequential_check_flags() -> None:
    base = 0x10000
    flagged, seen = 0, set()
    for seed in range(400):
        log = _random_log(np.random.default_rng(seed), base)
        want = _sequential(log, base)
        shown = want[:8] + ([f"... and {len(want) - 8} more"] if len(want) > 8 else [])
        assert races(log, base) == shown, seed
        flagged += bool(want)
        seen |= {next(k for k, pattern in _KINDS.items() if re.fullmatch(pattern, e)) for e in shown}
    assert 40 < flagged < 360  # logs with and without errors, both
    assert seen == set(_KINDS)
