"""The kernels of the ``hopper.wgmma``-with-A-from-registers tests: X is loaded from global memory,
scaled and cast (``a = (x * scale).to(dt)``) and multiplied by a B tile brought by TMA. Used by
tests/gpu/test_wgmma_register_a.py (interpreter and GPU runs) and
tests/backend/test_wgmma_register_a.py (PTX, ptxas, SASS and diagnostics of the same kernels)."""

from __future__ import annotations

import functools

import sparsile as sp

SRC = """\
@kernel(num_warps={warps})
def k(X: ptr[{xt}], scale: {xt}, B: tensor[{dt}, 2], E: ptr[u32], C: ptr[{acc}]):
    b = smem.alloc({dt}, ({n}, {k}), swizzle={swb})
    bar = mbarrier.alloc(1)
    mbarrier.expect(bar[0], {n} * {k} * {dt}.bits // 8)
    tma.load(B, (0, 0), b, bar[0])
    mbarrier.wait(bar[0], 0)
    rows = arange(0, {m})
    x = load(X + rows[:, None] * {ka} + arange(0, {ka})[None, :])
    {pin}
    a = (x * scale).to({dt})
    {meta}
    acc = hopper.wgmma(a, b, zeros(({m}, {n}), {acc}){args})
    acc = hopper.wgmma_wait(0, acc)
    store(C + rows[:, None] * {n} + arange(0, {n})[None, :], acc)
"""
WGMMA_LINE = 13
EB = {"f16": 2, "bf16": 2, "tf32": 4, "e4m3": 1, "e5m2": 1, "i8": 1}


def source(dt: str = "f16", *, m: int = 64, n: int = 64, k: int = 64, sparse: bool = False, warps: int = 4,
           pinned: bool = False) -> str:
    """The fused-prologue kernel ``k`` for these sizes (A is ``m x k``, or ``m x k/2`` values);
    ``pinned``: the loaded tile is pinned to the default blocked layout first, so the compiler
    converts it to the A fragment layout."""
    ka = k // 2 if sparse else k
    per_word = 16 if dt == "tf32" else 32
    meta = f"meta = load(E + rows[:, None] * {k // per_word} + arange(0, {k // per_word})[None, :])" if sparse \
        else "meta = 0"
    return SRC.format(warps=warps, xt="i32" if dt == "i8" else "f32", dt=dt, acc="i32" if dt == "i8" else "f32",
                      m=m, n=n, k=k, ka=ka, swb=min(128, k * EB[dt]), meta=meta,
                      args=", a_meta=meta" if sparse else "",
                      pin=f"x = convert_layout(x, layout.default(({m}, {ka}), {warps}))" if pinned else "")


@functools.cache
def kernel(dt: str, m: int, n: int, k: int, sparse: bool, warps: int, pinned: bool = False):
    return sp.loads(source(dt, m=m, n=n, k=k, sparse=sparse, warps=warps, pinned=pinned),
                    f"rega_{dt}_{m}_{n}_{k}_{sparse}_{pinned}.spk").kernels["k"]


LOOP_SRC = """\
@kernel(num_warps={warps})
def kloop(X: ptr[f32], scale: f32, B: tensor[{dt}, 2], E: ptr[u32], C: ptr[f32], K: i32):
    b = smem.alloc({dt}, ({n}, {bk}), swizzle={swb})
    bar = mbarrier.alloc(1)
    rows = arange(0, {m})
    acc = zeros(({m}, {n}), f32)
    for i in range(0, K // {bk}):
        barrier()
        mbarrier.expect(bar[0], {n} * {bk} * {dt}.bits // 8)
        tma.load(B, (0, i * {bk}), b, bar[0])
        mbarrier.wait(bar[0], i & 1)
        x = load(X + rows[:, None] * (K // {div}) + i * {bka} + arange(0, {bka})[None, :])
        a = (x * scale).to({dt})
        {meta}
        acc = hopper.wgmma(a, b, acc{args})
        acc = hopper.wgmma_wait(0, acc)
    store(C + rows[:, None] * {n} + arange(0, {n})[None, :], acc)
"""


@functools.cache
def loop_kernel(dt: str, m: int, n: int, bk: int, sparse: bool, warps: int):
    """A K loop: each step loads and converts the next A columns and brings the next B block by
    TMA (the fused-prologue GEMM main loop, one stage)."""
    div = 2 if sparse else 1
    words = bk // (16 if dt == "tf32" else 32)
    meta = (f"meta = load(E + rows[:, None] * (K // {16 if dt == 'tf32' else 32}) + i * {words} "
            f"+ arange(0, {words})[None, :])") if sparse else "meta = 0"
    src = LOOP_SRC.format(warps=warps, dt=dt, m=m, n=n, bk=bk, bka=bk // div, div=div, swb=min(128, bk * EB[dt]),
                          meta=meta, args=", a_meta=meta" if sparse else "")
    return sp.loads(src, f"rega_loop_{dt}_{sparse}.spk").kernels["kloop"]
