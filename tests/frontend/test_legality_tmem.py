"""Legality of the Blackwell explicit level (frontend/legality/tmem.py): target gating of tcgen05 /
TMEM ops and of kind::i8 (docs/hardware.md §7), lane access per warp, the instruction descriptors of
an MMA split into instruction tiles (idesc_problems, which ptxas does not check), and the packed
TMEM allocation. Kernels use ``ops_blackwell`` (skipped where it is not installed); the rules are
also exercised on hand-built IR."""

from __future__ import annotations

import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.frontend.ir.core import Builder, Function, Region
from sparsile.frontend.legality.core import Context
from sparsile.frontend.legality.tmem import allocation_columns, instruction_tiles, tcgen05_descriptors, tmem_capacity
from sparsile.target.targets import get_target
from sparsile.tests.support import compile_src

MMA = """\
@kernel(num_warps=4)
def k(A: tensor[{dt}, 2], B: tensor[{dt}, 2], C: ptr[{acc}]):
    a = smem.alloc({dt}, (128, 64), swizzle=64)
    b = smem.alloc({dt}, (64, 64), swizzle=64)
    acc = tmem.alloc({acc}, (128, 64))
    bar = mbarrier.alloc(2)
    mbarrier.expect(bar[0], (128 * 64 + 64 * 64) * {dt}.bits // 8)
    tma.load(A, (0, 0), a, bar[0])
    tma.load(B, (0, 0), b, bar[0])
    mbarrier.wait(bar[0], 0)
    tcgen05.mma(a, b, acc, accumulate=False)
    tcgen05.commit(bar[1])
    mbarrier.wait(bar[1], 0)
    tcgen05.fence_after()
    {epilogue}
"""
EPILOGUE = "x = acc.load()\n    r = arange(0, 128)\n    store(C + r[:, None] * 64 + arange(0, 64)[None, :], x)"


@pytest.fixture(autouse=True, scope="module")
def _blackwell_ops():
    pytest.importorskip("sparsile.backend.lower.blackwell")


def errors(src: str, target: str) -> list:
    with pytest.raises(CompileError) as info:
        compile_src(src, target, stop_after="ir")
    return list(info.value.diagnostics)


def mma(dt: str = "f16", acc: str = "f32", epilogue: str = EPILOGUE) -> str:
    return MMA.format(dt=dt, acc=acc, epilogue=epilogue)


def test_tcgen05_compiles_on_blackwell_targets() -> None:
    for t in ("sm_100a", "sm_100f", "sm_103a", "sm_110a"):
        assert "tcgen05.mma" in compile_src(mma(), t).ptx


def test_tcgen05_on_hopper_is_reported_at_each_op() -> None:
    found = [(d.code, d.span.line) for d in errors(mma(), "sm_90a")]
    assert found == [("SP0602", 5), ("SP0602", 11), ("SP0602", 12), ("SP0602", 14), ("SP0602", 15)]


@pytest.mark.parametrize(("target", "ok"), [("sm_100a", True), ("sm_110a", True), ("sm_100f", False),
                                            ("sm_103a", False), ("sm_110f", False)])
def test_kind_i8_only_where_the_target_has_it(target: str, ok: bool) -> None:
    """docs/hardware.md §0 item 5 / §7: kind::i8 exists on sm_100a and sm_110a only."""
    src = mma("i8", "i32")
    if ok:
        assert "kind::i8" in compile_src(src, target).ptx
        return
    d = errors(src, target)[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0602", 11, 5)
    assert "`tcgen05.mma` with kind::i8 is not available" in d.message and "sm_100a, sm_110a" in d.help


def test_tmem_loads_need_whole_warpgroups() -> None:
    src = """\
def epilogue(acc, C):
    x = acc.load()
    r = arange(0, 128)
    store(C + r[:, None] * 64 + arange(0, 64)[None, :], x)


def idle(C):
    pass


@kernel(num_warps=WARPS)
def k(C: ptr[f32]):
    acc = tmem.alloc(f32, (128, 64))
    warp_specialize(partition(epilogue, acc, C, warps=W), partition(idle, C, warps=1))
"""
    d = errors(src.replace("WARPS", "3").replace("W", "2"), "sm_100a")[0]
    assert (d.code, d.span.line, d.span.col) == ("SP0550", 2, 9)
    assert "by 2 warps" in d.message and "32(w%4)" in d.message and d.help
    compile_src(src.replace("WARPS", "5").replace("W", "4"), "sm_100a", stop_after="ptx")
    late = src.replace("WARPS", "5").replace("W", "4").replace(
        "partition(epilogue, acc, C, warps=4), partition(idle, C, warps=1)",
        "partition(idle, C, warps=1), partition(epilogue, acc, C, warps=4)")
    d = errors(late, "sm_100a")[0]
    assert (d.code, d.span.line) == ("SP0550", 2) and "starting at warp 1" in d.message


# ------------------------------------------------------------------------------------------------
# Rules on hand-built IR
# ------------------------------------------------------------------------------------------------
def _ctx(func: Function, target: str = "sm_100a") -> Context:
    return Context(get_target(target), 4, 4, -1, func)


def _mma_op(a_elem: T.ScalarType, acc_elem: T.ScalarType, m: int, n: int, kind: str, sparse: bool = True):
    func = Function("f", [], Region())
    b = Builder(func.body.block)
    a = b.create("x", [], [T.SmemType(a_elem, (m, 32))]).result
    bb = b.create("x", [], [T.SmemType(a_elem, (n, 64))]).result
    acc = b.create("x", [], [T.TmemType(acc_elem, (m, n))]).result
    op = b.create("tcgen05.mma", [a, bb, acc], [], {"kind": kind, "m": m, "n": n, "k": 64, "sparse": sparse})
    return func, op


def test_instruction_tiles() -> None:
    assert instruction_tiles(128, 256) == [(0, 128, 0, 256)]
    assert instruction_tiles(256, 512) == [(0, 128, 0, 256), (0, 128, 256, 256), (128, 128, 0, 256),
                                           (128, 128, 256, 256)]
    assert instruction_tiles(128, 320) == [(0, 128, 0, 256), (0, 128, 256, 64)]


def test_every_instruction_tile_is_a_valid_descriptor() -> None:
    """M = 256, N = 512 (seed 001) is four valid M = 128, N = 256 instructions; an s32 accumulator
    for f16 operands, or a last N chunk of 8 for sparse f8f6f4 (N % 16, docs/hardware.md §1.2), is not."""
    func, op = _mma_op(T.f16, T.f32, 256, 512, "f16")
    assert list(tcgen05_descriptors(op, _ctx(func))) == []
    func, op = _mma_op(T.f16, T.i32, 128, 64, "f16")
    found = list(tcgen05_descriptors(op, _ctx(func)))
    assert [d.code for d in found] == ["SP0503"]
    assert "instruction tile M=128, N=64, selector 0" in found[0].message
    func, op = _mma_op(T.e4m3, T.f32, 128, 264, "f8f6f4")  # last N chunk of 8: sparse f8f6f4 needs N % 16
    found = list(tcgen05_descriptors(op, _ctx(func)))
    assert [d.code for d in found] == ["SP0505"] and "N=8" in found[0].message


def test_tmem_capacity_of_the_packed_allocation() -> None:
    assert [allocation_columns(e) for e in (1, 32, 33, 200, 512)] == [32, 32, 64, 256, 512]
    func = Function("f", [], Region())
    b = Builder(func.body.block)
    b.create("tmem.alloc", [], [T.TmemType(T.f32, (128, 256))], {"col": 0, "ncols": 256})
    assert list(tmem_capacity(func, _ctx(func))) == []
    b.create("tmem.alloc", [], [T.TmemType(T.f32, (128, 512))], {"col": 256, "ncols": 512})
    (d,) = tmem_capacity(func, _ctx(func))
    assert d.code == "SP0575" and "end at column 768" in d.message and "has 512" in d.message
