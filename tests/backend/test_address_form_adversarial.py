"""Adversarial review of the constant-offset address form (backend/lower/address_form.py).

Every register of every pointer tile of the entry block, for every thread of two programs, is
compared with the interpreter's pointer at that register's coordinates (register_addresses.py),
so an address given to the wrong register shows, not only a wrong set of addresses. The kernels
attack the proof's premises: axis facts of every op that makes or breaks contiguity (odd and
negative ``arange`` starts, products by constants that are not powers of two, ``% // >> << & | ^``,
``where``, ``maximum``/``minimum``, casts through narrower types, reshapes and permutes of offset
tiles), run-time values that make the i32 offsets wrap (inside or between blocks, with and
without the launch's multiple-of-16 specialization), 1-, 2- and 3-D tiles in blocked layouts of
1, 4 and 8 warps, tiles smaller than the CTA (replicated elements), contiguity along dim 0,
sliced (reduction) and transposed layouts, mma (sm_80) and wgmma (sm_90a) accumulator layouts,
``(x + a) + b`` chains whose second ``addptr`` adds to a pointer tile, and atomics.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparsile.backend.lower import codegen, memory
from sparsile.frontend.diagnostics import InternalError
from sparsile.frontend.layout.tile import default_blocked
from sparsile.tests.backend.register_addresses import check_register_addresses

W = 1 << 31
WRAPS = (0, 5, W - 64, W - 100, -W + 16, (1 << 22) - 1)
"""Run-time s: 0 and W - 64 (multiples of 16: the launch specializes on them), small, near the i32
wrap (inside a tile of 1024 from s = W - 1024 on), and (1 << 22) - 1 (``(pid + s) * 1024`` wraps)."""

CONSTANT_OFFSET = re.compile(r"getelementptr (\w+), ptr addrspace\(1\) %\w+, i64 \d+\n")

ONE_D = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, t: i32, B: constexpr):
    offs = {expr}
    m = (offs >= 0) & (offs < n)
    store(out + offs, load(x + offs, mask=m), mask=m)
"""


def _f32(n: int) -> np.ndarray:
    return np.linspace(1, 2, n, dtype=np.float32)


@pytest.mark.parametrize("expr, planned", [
    ("arange(3, 3 + B) + s", False),                 # an odd start: no aligned block
    ("arange(-16, B - 16) + s", True),               # a negative start, a multiple of 16
    ("arange(0, B) + (s - 7)", False),
    ("(program_id(0) + s) * 48 + arange(0, B)", True),  # a multiplier that is not a power of two
    ("arange(0, B) * 3 + s", False),
    ("(arange(0, B) + s) // 4 * 4 + (arange(0, B) & 3)", False),
    ("(arange(0, B) >> 1) + (arange(0, B) << 1) + (arange(0, B) % 64) + s", False),
    ("(arange(0, B) | s) + (arange(0, B) ^ t)", False),
    ("where(arange(0, B) < t, arange(0, B), arange(0, B) + 5) + s", False),
    ("maximum(arange(0, B) + s, t) + minimum(arange(0, B), t)", False),
    ("s - arange(0, B)", False),                     # runs downwards
    ("(arange(0, B) - s) - t", True),
    ("(arange(0, B) + s).to(i64).to(i32) + (arange(0, B).to(i16) + s.to(i16)).to(i32)", False),
])
def test_every_register_of_a_1d_offset_tile_is_the_interpreters(expr: str, planned: bool) -> None:
    """1024 offsets over 4 warps (8 registers a thread): each register's address, for every thread
    of two programs and run-time values that make the offsets wrap, is the interpreter's; the
    constant-offset form is used where the facts allow it (for some of the values) and only there."""
    used = 0
    for s in WRAPS:
        for t in (0, 48, 7):
            c = check_register_addresses(ONE_D.format(expr=expr), (_f32(64), _f32(64), 64, s, t), {"B": 1024})
            assert c.tiles == 2 and c.skipped == 0
            used += len(CONSTANT_OFFSET.findall(c.llvm))
    assert (used > 0) == planned


TWO_D = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, t: i32, BM: constexpr, BN: constexpr):
    rows = arange(0, BM)
    cols = arange(0, BN)
    offs = {expr}
    m = (offs >= 0) & (offs < n)
    store(out + offs, load(x + offs, mask=m), mask=m)
"""

TILES = [
    "rows[:, None] * s + cols[None, :] + t",
    "rows[:, None] + cols[None, :] * s + t * 16",    # contiguous along dim 0
    "(rows[:, None] * BN + cols[None, :] + s * 16).T",
    "(rows[:, None] * BN + cols[None, :] + s * 16).reshape((BN, BM))",
    "broadcast_to((rows * 32 + s * 16)[:, None], (BM, BN)) + cols[None, :]",
    "(s * 16 + cols)[None, :] + rows[:, None] * 0",  # equal rows
    "arange(0, 4)[:, None, None] * s + arange(0, 8)[None, :, None] * t + arange(0, 32)[None, None, :] + s * 16",
    "arange(0, 4)[:, None, None] + arange(0, 8)[None, :, None] * t + arange(0, 32)[None, None, :] * s",
    "(arange(0, 4)[:, None, None] * 256 + arange(0, 8)[None, :, None] * 32 + arange(0, 32)[None, None, :]"
    " + s * 16).permute((1, 2, 0))",
]


@pytest.mark.parametrize("num_warps", [1, 4, 8])
@pytest.mark.parametrize("expr", TILES)
def test_every_register_of_a_2d_or_3d_offset_tile_is_the_interpreters(expr: str, num_warps: int) -> None:
    """Rows and columns, contiguity along either dim, transposed, reshaped, broadcast and permuted
    offset tiles, 3-D tiles, in tiles larger and smaller (2 x 2: replicated) than the CTA."""
    for bm, bn in ((16, 64), (2, 2)):
        for s in (0, 5, W - 64, -W + 16):
            for t in (0, 7):
                c = check_register_addresses(TWO_D.format(expr=expr), (_f32(64), _f32(64), 64, s, t),
                                             {"BM": bm, "BN": bn}, num_warps=num_warps)
                assert c.tiles == 2 and c.skipped == 0


CHAIN = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, t: i32, BM: constexpr, BN: constexpr):
    rows = arange(0, BM)
    cols = arange(0, BN)
    q = (x + rows[:, None] * s) + (cols[None, :] + t)
    o = (out + (t + cols)[None, :]) + rows[:, None] * s
    m = (rows[:, None] * s + cols[None, :] + t >= 0) & (rows[:, None] * s + cols[None, :] + t < n)
    store(o, load(q, mask=m), mask=m)
    offs = s * 16 + arange(0, BM * BN)
    atomic_add(out + offs, 1.0, mask=(offs >= 0) & (offs < n))
"""


@pytest.mark.parametrize("t", [0, 7, 48])
def test_a_pointer_tile_plus_offsets_and_atomics_match_the_interpreter(t: int) -> None:
    """``(x + rows * s) + (cols + t)``: the second addptr's bases are each row pointer plus a
    column offset (one per row pointer), and ``(out + cols) + rows * s`` the other way round; an
    atomic's pointer tile; each pointer tile is checked on its own."""
    for s in (0, 5, W - 64, -W + 16, (1 << 22) - 1):
        c = check_register_addresses(CHAIN, (_f32(64), _f32(64), 64, s, t), {"BM": 16, "BN": 64})
        assert c.tiles == 5 and c.skipped == 0
        assert (len(CONSTANT_OFFSET.findall(c.llvm)) > 0) == (s % 16 == 0)


LAYOUTS = """
@kernel
def k(a: ptr[f16], b: ptr[f16], out: ptr[f32], s: i32, ld: i32, M: constexpr, N: constexpr, K: constexpr):
    rm = arange(0, M)
    rn = arange(0, N)
    rk = arange(0, K)
    acc = dot(load(a + rm[:, None] * K + rk[None, :]), load(b + rk[:, None] * N + rn[None, :]))
    offs = rm[:, None] * ld + rn[None, :] + s
    store(out + offs, acc, mask=(offs >= 0) & (offs < 64))
    offs2 = rm[:, None] + rn[None, :] * ld + s * 16
    store(out + offs2, acc, mask=(offs2 >= 0) & (offs2 < 64))
    r = sum(acc, axis=1)
    rows = arange(0, M) + 0 * s
    store(out + s * 16 + rows, r, mask=(s * 16 + rows >= 0) & (s * 16 + rows < 64))
    offs3 = arange(0, N)[:, None] * M + arange(0, M)[None, :] + s * 16 + 0 * s
    store(out + offs3, acc.T, mask=(offs3 >= 0) & (offs3 < 64))
"""


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("mnk", [(64, 64, 32), (16, 16, 16)])
def test_accumulator_sliced_and_transposed_layouts_match_the_interpreter(target: str, mnk: tuple[int, int, int]
                                                                         ) -> None:
    """Pointer tiles in an mma (sm_80) or wgmma (sm_90a) accumulator layout, row-major and
    column-major, in the sliced layout of a row sum and in the transposed accumulator's layout."""
    m, n, k = mnk
    for s in (0, 5, W - 64, -W + 16):
        for ld in (n, 3, W - 1):
            c = check_register_addresses(LAYOUTS, (np.ones(m * k, np.float16), np.ones(k * n, np.float16), _f32(64), s,
                                                   ld), {"M": m, "N": n, "K": k}, target=target)
            assert c.tiles >= 6


def test_the_check_sees_a_wrong_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a plan that trusts contiguity without divisibility (offsets that wrap
    inside a block) and one that swaps two registers' constant offsets both fail it."""
    orig = memory.address_plan

    def swapped(*a: object) -> list[tuple[int, int]] | None:
        plan = orig(*a)
        assert plan is not None
        plan[1], plan[2] = plan[2], plan[1]
        return plan

    from sparsile.frontend.ir.axis_info import AxisInfo

    def no_divisibility(layout: object, info: AxisInfo, width: int) -> list[tuple[int, int]] | None:
        return orig(layout, AxisInfo(info.contiguity, (1 << 30,) * len(info.contiguity), info.constancy), width)

    args = (_f32(64), _f32(64), 64, W - 3, 0)
    for plan, expr in ((swapped, "program_id(0) * B + arange(0, B)"), (no_divisibility, "s + arange(0, B)")):
        with monkeypatch.context() as mp:
            mp.setattr(memory, "address_plan", plan)
            with pytest.raises(AssertionError, match="IR addresses"):
                check_register_addresses(ONE_D.format(expr=expr), args, {"B": 1024})


UNMASKED = """
@kernel
def k(x: ptr[f32], out: ptr[f32], B: constexpr):
    offs = program_id(0) * B + arange(0, B)
    store(out + offs, load(x + offs))
"""


def test_offsets_in_another_layout_than_the_pointer_tile_are_an_internal_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's registers are those of the offset tile's layout: where the generated offset tile
    is not in the layout of the addptr (a code generator bug), compilation stops with an internal
    error, as the register-by-register form does, rather than give registers other registers'
    addresses."""
    import sparsile as sp

    set_value = codegen.CodeGen.set

    def relabel(self: codegen.CodeGen, v: object, x: object) -> None:
        owner = getattr(v, "owner", None)
        if isinstance(x, codegen.DTile) and owner is not None and owner.name == "arith.binary":
            other = next(lay for vec in (1, 2) if (lay := default_blocked((1024,), 4, vec)) != x.layout)
            x = codegen.DTile(other, x.regs, x.elem)
        set_value(self, v, x)

    monkeypatch.setattr(codegen.CodeGen, "set", relabel)
    kern = sp.loads(UNMASKED, "case.spk").kernels["k"]
    with pytest.raises(InternalError, match="different layouts"):
        kern.compile({"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "B": 1024}, target="sm_90a", stop_after="llvm",
                     cache=False)
