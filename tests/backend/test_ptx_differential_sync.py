"""Integer kernels whose PTX uses shared memory, shuffles, barriers and atomics, executed on the CPU
(tests/backend/ptx_exec.py with tests/backend/ptx_shared.py and ptx_atomic.py) against the
interpreter, bit for bit, on random inputs with masks: reductions (``sum`` / ``max`` / ``min`` /
``argmax`` / ``argmin`` over 1-D and 2-D tiles, every integer type), atomics (``atomic_add`` /
``max`` / ``min`` / ``xchg`` / ``cas``, per element and scalar, their old values used, and a
histogram whose updates collide), and a handful of integer-only programs of the program generator
(tests/support/program_gen.py). Every array argument is compared after the run (outputs poisoned
first, their masked tails must keep the poison); a removed ``bar.sync`` is reported as a race.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.ir import types as T
from sparsile.tests.backend.ptx_exec import MemoryFault, run_grid
from sparsile.tests.support.compile import compile_src

INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
POISON = 0x5A


@functools.cache
def _compiled(src: str, target: str, consts: tuple[tuple[str, int], ...] = ()) -> tuple[str, int, int]:
    c = compile_src(src, target=target, cache=False, **dict(consts))
    return c.ptx, 32 * c.num_warps, c.smem_bytes


def run_both(src: str, grid: tuple[int, ...], args: list[np.ndarray | int], target: str = "sm_90a",
             consts: dict[str, int] | None = None, edit: Callable[[str], str] | None = None) -> list[str]:
    """Run kernel ``k`` of ``src`` on copies of ``args`` in the interpreter and as PTX for
    ``target`` (changed by ``edit``); a line per array element whose bytes differ afterwards."""
    consts = consts or {}
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    dev = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    sp.loads(src, "case.spk").kernels["k"].interpret[grid](*ref, **consts)
    ptx, threads, smem = _compiled(src, target, tuple(sorted(consts.items())))
    ptx = edit(ptx) if edit is not None else ptx
    run_grid(ptx, threads, grid, dev, smem_bytes=smem)
    rows = []
    for j, (d, r) in enumerate(zip(dev, ref, strict=True)):
        if not isinstance(d, np.ndarray):
            continue
        width = d.dtype.itemsize
        bad = np.flatnonzero((d.view(np.uint8) != r.view(np.uint8)).reshape(-1, width).any(axis=1))
        rows += [f"argument {j} [{i}]: ptx={d.reshape(-1)[i]!r} interp={r.reshape(-1)[i]!r}" for i in bad[:8]]
    return rows


def rand(t: str, n: int, rng: np.random.Generator, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """``n`` random values of integer type ``t`` (its whole range unless ``lo`` / ``hi``), never all zeros;
    few distinct values when ``lo`` / ``hi`` are small, so that ties occur."""
    dt = T.SCALAR_TYPES[t].numpy_dtype
    info = np.iinfo(dt)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    out = rng.integers(lo, hi, n, dtype=np.int64 if t != "u64" else np.uint64, endpoint=True).astype(dt)
    out[0] = hi  # (never all zeros)
    return out


def poisoned(t: str, n: int) -> np.ndarray:
    out = np.empty(n, T.SCALAR_TYPES[t].numpy_dtype)
    out.view(np.uint8)[:] = POISON
    return out


REDUCE_1D = """@kernel
def k(A: ptr[{t}], S: ptr[{st}], MX: ptr[{t}], MN: ptr[{t}], AX: ptr[i32], AN: ptr[i32], n: i32):
    i = program_id(0) * {B} + arange(0, {B})
    m = i < n
    a = load(A + i, mask=m, other={other})
    p = program_id(0)
    store(S + p, sum(a))
    store(MX + p, max(a))
    store(MN + p, min(a))
    store(AX + p, argmax(a))
    store(AN + p, argmin(a))
"""


def _sum_type(t: str) -> str:
    return {"i8": "i32", "i16": "i32", "u8": "i32", "u16": "i32"}.get(t, t)


@pytest.mark.parametrize("block", [64, 256, 1024])
@pytest.mark.parametrize("t", INT_TYPES)
def test_reductions_of_a_1d_tile(t: str, block: int) -> None:
    """``sum`` / ``max`` / ``min`` / ``argmax`` / ``argmin`` of a masked 1-D tile (lanes, warps
    through shared memory); ties among few distinct values decide the arg reductions' index."""
    rng = np.random.default_rng(hash((t, block)) % 2**32)
    grid = 3
    n = grid * block - block // 3
    src = REDUCE_1D.format(t=t, st=_sum_type(t), B=block, other=3 if t[0] == "u" else -3)
    for a in (rand(t, grid * block, rng), rand(t, grid * block, rng, 0, 5)):
        outs = [poisoned(_sum_type(t), grid + 1), *[poisoned(t, grid + 1) for _ in range(2)],
                *[poisoned("i32", grid + 1) for _ in range(2)]]
        rows = run_both(src, (grid,), [a, *outs, n])
        assert not rows, f"{t}, B={block}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


REDUCE_2D = """@kernel
def k(A: ptr[{t}], S0: ptr[{st}], X0: ptr[i32], S1: ptr[{st}], N1: ptr[{t}], X1: ptr[i32], nr: i32, nc: i32):
    r = program_id(0) * {R} + arange(0, {R})
    c = arange(0, {C})
    m = (r[:, None] < nr) & (c[None, :] < nc)
    a = load(A + r[:, None] * {C} + c[None, :], mask=m, other=2)
    p = program_id(0)
    store(S0 + p * {C} + c, sum(a, axis=0), mask=c < nc)
    store(X0 + p * {C} + c, argmax(a, axis=0))
    store(S1 + r, sum(a, axis=1), mask=r < nr)
    store(N1 + r, min(a, axis=1))
    store(X1 + r, argmin(a, axis=1))
"""


@pytest.mark.parametrize("shape", [(16, 32), (64, 8), (4, 128)])
@pytest.mark.parametrize("t", ["i32", "u32", "i64", "i16"])
def test_reductions_along_an_axis_of_a_2d_tile(t: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(hash((t, shape)) % 2**32)
    rows_, cols = shape
    grid = 2
    nr, nc = grid * rows_ - 1, cols - 3
    src = REDUCE_2D.format(t=t, st=_sum_type(t), R=rows_, C=cols)
    a = rand(t, grid * rows_ * cols, rng, 0, 7) if t[0] == "u" else rand(t, grid * rows_ * cols, rng, -4, 4)
    outs = [poisoned(_sum_type(t), grid * cols), poisoned("i32", grid * cols), poisoned(_sum_type(t), grid * rows_),
            poisoned(t, grid * rows_), poisoned("i32", grid * rows_)]
    rows = run_both(src, (grid,), [a, *outs, nr, nc])
    assert not rows, f"{t} {shape}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


ATOMIC_TILE = """@kernel
def k(A: ptr[{t}], C: ptr[{t}], BUF: ptr[{t}], OLD: ptr[{t}], n: i32):
    i = program_id(0) * {B} + arange(0, {B})
    m = i < n
    a = load(A + i, mask=m, other=1)
    old = atomic_{op}(BUF + i, {args}, mask=m, sem="{sem}")
    store(OLD + i, old, mask=m)
"""


@pytest.mark.parametrize("op", ["add", "max", "min", "xchg", "cas"])
@pytest.mark.parametrize("t", ["i32", "u32", "i64", "u64"])
def test_atomics_per_element_give_the_old_values(t: str, op: str) -> None:
    """Each element's atomic on its own address (no collisions: the old values are order-free)."""
    rng = np.random.default_rng(hash((t, op)) % 2**32)
    block, grid = 128, 3
    n = grid * block - 7
    args = "load(C + i, mask=m), a" if op == "cas" else "a"
    src = ATOMIC_TILE.format(t=t, B=block, op=op, args=args, sem="relaxed" if op == "add" else "acq_rel")
    a, buf = rand(t, grid * block, rng), rand(t, grid * block, rng)
    cmp = np.where(rng.random(grid * block) < 0.5, buf, rand(t, grid * block, rng))
    rows = run_both(src, (grid,), [a, cmp, buf, poisoned(t, grid * block), n])
    assert not rows, f"{op} {t}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


HISTOGRAM = """@kernel
def k(X: ptr[i32], V: ptr[{t}], BINS: ptr[{t}], TOTAL: ptr[{t}], n: i32):
    i = program_id(0) * {B} + arange(0, {B})
    m = i < n
    x = load(X + i, mask=m)
    v = load(V + i, mask=m)
    atomic_{op}(BINS + x, v, mask=m, sem="relaxed")
    atomic_add(TOTAL, 1)
"""


@pytest.mark.parametrize("op", ["add", "max", "min"])
@pytest.mark.parametrize("t", ["i32", "u32", "i64", "u64"])
def test_colliding_atomics_leave_the_interpreters_values(t: str, op: str) -> None:
    """A histogram (many elements of several programs update one bin; the old values unused) and a
    scalar counter, one update per program."""
    rng = np.random.default_rng(hash((t, op, "hist")) % 2**32)
    block, grid = 256, 3
    n = grid * block - 11
    src = HISTOGRAM.format(t=t, B=block, op=op)
    x = rng.integers(0, 9, grid * block).astype(np.int32)
    v = rand(t, grid * block, rng)
    bins, total = rand(t, 9, rng), rand(t, 1, rng, 0, 100)
    rows = run_both(src, (grid,), [x, v, bins, total, n])
    assert not rows, f"{op} {t}: {len(rows)} elements differ\n{src}\n" + "\n".join(rows)


SCALAR_ATOMIC = """@kernel
def k(CTR: ptr[i32], OUT: ptr[i32], n: i32):
    i = program_id(0) * 128 + arange(0, 128)
    old = atomic_cas(CTR + program_id(0), 5, program_id(0) + 100)
    store(OUT + i, old + i, mask=i < n)
"""


def test_a_scalar_atomic_gives_its_old_value_to_every_thread() -> None:
    """One thread performs it; the others read its old value through shared memory."""
    ctr = np.array([5, 7, 5], np.int32)
    rows = run_both(SCALAR_ATOMIC, (3,), [ctr, poisoned("i32", 3 * 128), 3 * 128 - 9])
    assert not rows, "\n".join(rows)


@pytest.mark.parametrize("which", [1, 3, None])
def test_a_removed_barrier_is_reported(which: int | None) -> None:
    """The 1-D reductions' PTX without the ``bar.sync`` between the warps' stores to the shared
    scratch and their loads (the second, the fourth, or every one): a race (the threads run in step
    here, so the values alone would not show it)."""
    src = REDUCE_1D.format(t="i32", st="i32", B=256, other=-3)
    rng = np.random.default_rng(5)
    args = [rand("i32", 768, rng), *[poisoned("i32", 4) for _ in range(5)], 700]
    assert not run_both(src, (3,), args)

    def edit(ptx: str) -> str:
        bars = [m.span() for m in re.finditer(r"\n\s*bar\.sync\s+0;", ptx)]
        assert len(bars) >= 4, ptx
        for lo, hi in reversed(bars if which is None else [bars[which]]):
            ptx = ptx[:lo] + "\n" + ptx[hi:]
        return ptx

    with pytest.raises(MemoryFault, match="no barrier between"):
        run_both(src, (3,), args, edit=edit)
