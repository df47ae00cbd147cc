"""The PTX executor's shared memory, barriers, shuffles and atomics (tests/backend/ptx_shared.py,
tests/backend/ptx_atomic.py) on hand-written PTX: the values the PTX ISA gives, and the refusals
(a race between barriers, an undefined shared byte reaching global memory, a barrier exited
threads never reach, a shuffle whose member mask names a thread that does not execute it, atomics
whose result depends on their order) instead of a guess."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.backend.address_eval import UnknownInstruction
from sparsile.tests.backend.ptx_exec import MemoryFault, run_grid, run_program
from sparsile.tests.backend.ptx_ops import UndefinedResult

HEAD = """.extern .shared .align 1024 .b8 sparsile_smem[];
.visible .entry k(.param .u64 k_param_0, .param .u64 k_param_1, .param .u32 k_param_2)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    ld.param.b64 %rd1, [k_param_0];
    ld.param.b64 %rd2, [k_param_1];
    ld.param.b32 %r9, [k_param_2];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    mov.b64 %rd6, sparsile_smem;
    add.s64 %rd7, %rd6, %rd3;
    ld.global.b32 %r2, [%rd4];
"""


def _run(body: str, x: list[int], smem: int = 0, scalar: int = 0, grid: int = 1) -> list[int]:
    """``out[tid]`` := ``%r3`` after the body, in ``grid`` programs of ``len(x)`` threads on the same
    arrays (``x[tid]`` in ``%r2``; programs must store equal values)."""
    xs = np.array(x, np.int32)
    out = np.full(len(x), 0x5A5A5A5A, np.int32)
    ptx = HEAD + body + "    st.global.b32 [%rd5], %r3;\n    ret;\n}\n"
    if grid == 1:
        run_program(ptx, len(x), 0, [xs, out, scalar], smem_bytes=smem)
    else:
        run_grid(ptx, len(x), grid, [xs, out, scalar], smem_bytes=smem)
    return out.tolist()


def _cuda_shuffle(mode: str, lane: int, b: int, width: int) -> int:
    """The source lane of CUDA's ``__shfl*_sync(mask, v, b, width)`` (CUDA C++ Programming Guide,
    "Warp Shuffle Functions"): the reference the PTX ISA's pseudo-code must agree with."""
    start = lane - lane % width
    if mode == "idx":
        return start + b % width
    if mode == "up":
        return lane - b if lane % width >= b else lane
    if mode == "down":
        return lane + b if lane % width + b < width else lane
    return lane ^ b if (lane ^ b) < start + width else lane  # bfly: earlier groups only


@pytest.mark.parametrize("width", [32, 8, 4])
@pytest.mark.parametrize("mode, b", [("idx", 5), ("idx", 2), ("up", 1), ("up", 3), ("down", 2), ("down", 7),
                                     ("bfly", 1), ("bfly", 6), ("bfly", 16)])
def test_shuffles_take_the_source_lane_cuda_gives(mode: str, b: int, width: int) -> None:
    """Two warps; ``c`` as CUDA encodes ``width`` (segment mask ``32 - width``, clamp 31 or 0 for
    ``up``); the predicate output (here adding 1000000) is set where the source lane is in range."""
    c = ((32 - width) << 8) | (0 if mode == "up" else 31)
    body = (f"    shfl.sync.{mode}.b32 %r4|%p1, %r2, {b}, {c}, -1;\n"
            "    selp.b32 %r5, 1000000, 0, %p1;\n    add.s32 %r3, %r4, %r5;\n")
    x = [7 * t + 3 for t in range(64)]
    want = [x[t - t % 32 + _cuda_shuffle(mode, t % 32, b, width)] for t in range(64)]
    got = _run(body, x)
    assert [g % 1000000 for g in got] == want
    if mode != "idx":  # (idx's source is always in range here)
        in_range = [_cuda_shuffle(mode, t % 32, b, width) != t % 32 for t in range(64)]
        assert [g >= 1000000 for g in got] == in_range


def test_the_shuffle_predicate_says_whether_the_source_lane_was_in_range() -> None:
    body = ("    shfl.sync.down.b32 %r4|%p1, %r2, 3, 31, -1;\n"
            "    selp.b32 %r5, 1000, 0, %p1;\n    add.s32 %r3, %r4, %r5;\n")
    x = list(range(32))
    assert _run(body, x) == [(t + 3) + 1000 if t + 3 <= 31 else t for t in range(32)]


def test_a_shuffle_needs_every_thread_of_its_member_mask() -> None:
    """Lanes 0-15 shuffling among themselves (``0xffff``) is defined; a mask naming a lane that does
    not execute the shuffle, or one lacking the executing lane, is not; a source lane outside the
    mask gives an undefined value (a fault once stored)."""
    guard = "    setp.lt.u32 %p2, %r1, 16;\n    mov.b32 %r3, %r2;\n"
    assert _run(guard + "    @%p2 shfl.sync.bfly.b32 %r3, %r2, 1, 31, 0xffff;\n", list(range(32))) == \
        [t ^ 1 if t < 16 else t for t in range(32)]
    with pytest.raises(UndefinedResult, match="does not execute it"):
        _run(guard + "    @%p2 shfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;\n", list(range(32)))
    with pytest.raises(UndefinedResult, match="lacks it"):
        _run("    shfl.sync.bfly.b32 %r3, %r2, 1, 31, 0xffff;\n", list(range(32)))
    with pytest.raises(MemoryFault, match="undefined value"):
        _run(guard + "    @%p2 shfl.sync.bfly.b32 %r3, %r2, 16, 31, 0xffff;\n", list(range(32)))


EXCHANGE = """    st.shared.b32 [%rd7], %r2;
{bar}    xor.b32 %r4, %r1, 33;
    mul.wide.u32 %rd8, %r4, 4;
    add.s64 %rd9, %rd6, %rd8;
    ld.shared.b32 %r3, [%rd9];
"""


def test_shared_memory_between_barriers() -> None:
    """Thread t reads what thread t ^ 33 stored (another warp) after a barrier; without one it is a
    race; each program has its own shared memory."""
    x = [11 * t - 50 for t in range(64)]
    assert _run(EXCHANGE.format(bar="    bar.sync 0;\n"), x, smem=256) == [x[t ^ 33] for t in range(64)]
    assert _run(EXCHANGE.format(bar="    barrier.sync 0;\n"), x, smem=256, grid=3) == [x[t ^ 33] for t in range(64)]
    with pytest.raises(MemoryFault, match="another thread wrote with no barrier between"):
        _run(EXCHANGE.format(bar=""), x, smem=256)
    with pytest.raises(MemoryFault, match="outside the 128 bytes"):
        _run(EXCHANGE.format(bar="    bar.sync 0;\n"), x, smem=128)


def test_a_write_after_another_threads_read_needs_a_barrier() -> None:
    body = EXCHANGE.format(bar="    bar.sync 0;\n") + "{bar}    st.shared.b32 [%rd7], %r1;\n"
    x = list(range(64))
    assert _run(body.format(bar="    bar.sync 0;\n"), x, smem=256) == [t ^ 33 for t in range(64)]
    with pytest.raises(MemoryFault, match="another thread read with no barrier between"):
        _run(body.format(bar=""), x, smem=256)


def test_an_unwritten_shared_byte_is_undefined() -> None:
    body = "    setp.ne.b32 %p1, %r1, 3;\n    @%p1 st.shared.b32 [%rd7], %r2;\n    bar.sync 0;\n" \
           "    ld.shared.b32 %r3, [sparsile_smem+12];\n"
    with pytest.raises(MemoryFault, match="undefined value"):
        _run(body, list(range(32)), smem=128)
    assert _run(body.replace("+12", "+8"), list(range(10, 42)), smem=128) == [12] * 32


def test_a_barrier_that_exited_threads_never_reach_is_refused() -> None:
    body = "    setp.eq.b32 %p1, %r1, 5;\n    @%p1 ret;\n    bar.sync 0;\n    mov.b32 %r3, 1;\n"
    with pytest.raises(UnknownInstruction, match="exited threads never reach"):
        _run(body, list(range(32)))
    with pytest.raises(UnknownInstruction, match="a barrier for 64 of 32 threads"):
        _run("    bar.sync 1, 64;\n    mov.b32 %r3, 1;\n", list(range(32)))


ATOM = """    and.b32 %r4, %r1, {mask};
    mul.wide.u32 %rd8, %r4, 4;
    add.s64 %rd9, %rd1, %rd8;
    {inst}
"""


def _atomic(inst: str, x: list[int], mask: int = 1, threads: int | None = None) -> tuple[list[int], list[int]]:
    """Threads 0..n-1 run ``inst`` on ``x[tid & mask]`` (``%rd9``); (x after, out = ``%r3``)."""
    xs = np.array(x, np.int32)
    n = threads or len(x)
    out = np.full(n, 0x5A5A5A5A, np.int32)
    head = HEAD.replace("    ld.global.b32 %r2, [%rd4];\n", "    add.s32 %r2, %r1, 10;\n")
    ptx = head + ATOM.format(mask=mask, inst=inst) + "    st.global.b32 [%rd5], %r3;\n    ret;\n}\n"
    run_program(ptx, n, 0, [xs, out, 0])
    return xs.tolist(), out.tolist()


def test_colliding_atomic_adds_apply_in_lane_order() -> None:
    """Threads 0, 2 add to x[0] (10, 12), threads 1, 3 to x[1] (11, 13): the old values in thread order."""
    x, out = _atomic("atom.acq_rel.gpu.global.add.u32 %r3, [%rd9], %r2;", [100, 200, 0, 0])
    assert x == [122, 224, 0, 0] and out == [100, 200, 110, 211]
    x, out = _atomic("atom.global.max.s32 %r3, [%rd9], %r2;", [-5, 11, 0, 0])
    assert x == [12, 13, 0, 0] and out == [-5, 11, 10, 11]
    x, _ = _atomic("red.relaxed.gpu.global.add.s32 [%rd9], %r2;\n    mov.b32 %r3, 0;", [1, 2, 0, 0])
    assert x == [23, 26, 0, 0]


def test_an_exchange_or_cas_race_and_mixed_operations_are_refused() -> None:
    """Two threads exchanging (or compare-and-swapping) one word leave a value that depends on their
    order, as an add and a max on one word do; one thread's own updates are ordered."""
    with pytest.raises(MemoryFault, match="depends on their order"):
        _atomic("atom.global.exch.b32 %r3, [%rd9], %r2;", [1, 2, 3, 4])
    with pytest.raises(MemoryFault, match="depends on their order"):
        _atomic("atom.global.cas.b32 %r3, [%rd9], 1, %r2;", [1, 2, 3, 4])
    with pytest.raises(MemoryFault, match="depends on their order"):
        _atomic("atom.global.add.u32 %r5, [%rd9], %r2;\n    atom.global.max.u32 %r3, [%rd9], %r2;", [1, 2, 3, 4])
    x, out = _atomic("atom.global.exch.b32 %r5, [%rd9], %r2;\n    atom.global.cas.b32 %r3, [%rd9], %r2, 7;",
                     [1, 2, 3, 4], mask=3)
    assert x == [7, 7, 7, 7] and out == [10, 11, 12, 13]


@pytest.mark.parametrize("inst", ["atom.global.add.f32 %r3, [%rd9], %r2;", "atom.add.u32 %r3, [%rd9], %r2;",
                                  "atom.global.inc.u32 %r3, [%rd9], %r2;", "atom.shared.add.u32 %r3, [%rd9], %r2;",
                                  "vote.sync.ballot.b32 %r3, %p1, -1;", "shfl.sync.bfly.b64 %r3, %r2, 1, 31, -1;"])
def test_unknown_synchronization_instructions_are_refused(inst: str) -> None:
    with pytest.raises(UnknownInstruction):
        _atomic(inst, [1, 2, 3, 4])
