"""Pointer tiles as constant offsets from one base address (backend/lower/address_form.py).

``x + offs`` used to extend every register's i32 offset and add it to ``x`` on its own; LLVM's NVPTX
straight-line strength reduction then compared every address with every earlier one (quadratic:
3 s of code generation for 256 elements per thread). Where axis analysis proves that a register's
offset is another's plus a constant without wrapping, the address is that constant from the other's.

The checks: the IR form (one extension per pointer for a masked ``program_id(0) * B + arange(0, B)``
tile of 256 elements per thread, not one per element: a quadratic regression shows here, without a
timed test), and the semantics: the addresses the emitted IR computes for every thread, including
offsets whose i32 arithmetic wraps, are those of the interpreter's offsets (address_eval.py); where
the offsets may wrap inside a block, the IR is the per-register form as before.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower import memory
from sparsile.frontend.ir.axis_info import AxisInfo
from sparsile.frontend.layout.tile import default_blocked
from sparsile.frontend.sema.core import ArgSpec
from sparsile.tests.backend.address_eval import element_addresses, global_accesses

MASKED = """
@kernel
def k(x: ptr[f32], out: ptr[f16], n: i32, B: constexpr):
    offs = program_id(0) * B + arange(0, B)
    m = offs < n
    a = load(x + offs, mask=m)
    store(out + offs, a.to(f16), mask=m)
"""


def _llvm(src: str, sig: dict, name: str = "k") -> str:
    kern = sp.loads(src, "case.spk").kernels[name]
    return kern.compile(sig, target="sm_90a", stop_after="llvm", cache=False).llvm


def test_a_masked_program_id_tile_extends_its_offset_once_per_pointer() -> None:
    """256 f32 elements per thread (B = 32768, 4 warps): one sext and one variable address per
    pointer, every other address a constant offset from it (was: 256 of each per pointer)."""
    ir = _llvm(MASKED, {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f16], "n": sp.i32, "B": 32768})
    assert len(re.findall(r"= sext i32 ", ir)) == 2
    variable = re.findall(r"getelementptr (?:inbounds )?(\w+), ptr addrspace\(1\) %p_\w+, i64 %", ir)
    assert sorted(variable) == ["float", "half"]
    constant = re.findall(r"getelementptr (\w+), ptr addrspace\(1\) %\w+, i64 (\d+)\n", ir)
    assert len(constant) == 2 * 255
    assert len({int(k) for _, k in constant}) == 255


OFFSETS = """
@kernel
def offsets(o: ptr[i32], s: i32, B: constexpr):
    offs = {expr}
    store(o + program_id(0) * B + arange(0, B), offs)
"""

ACCESS = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, B: constexpr):
    offs = {expr}
    m = offs < n
    store(out + offs, load(x + offs, mask=m), mask=m)
"""

X_ADDR, OUT_ADDR = 1 << 40, 1 << 44


def _interpreter_offsets(expr: str, s: int, programs: int, b: int) -> np.ndarray:
    kern = sp.loads(OFFSETS.format(expr=expr), "case.spk").kernels["offsets"]
    o = np.full(programs * b, -7, np.int32)
    kern.interpret[(programs,)](o, s, B=b)
    return o.reshape(programs, b)


def _check_addresses(llvm: str, expr: str, s: int, n: int, b: int) -> None:
    """Per program: the elements the IR loads and stores are at x/out + 4 * (the interpreter's
    offset), for the offsets below n, and nowhere else."""
    offs = _interpreter_offsets(expr, s, 2, b)
    for pid in range(2):
        acc = global_accesses(llvm, 128, pid, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s})
        want = offs[pid][offs[pid] < n].astype(np.int64)
        for store, base in ((False, X_ADDR), (True, OUT_ADDR)):
            assert element_addresses(acc, store, 4) == sorted(int(base + 4 * o) for o in want)


def _per_register_llvm(monkeypatch: pytest.MonkeyPatch, src: str, sig: dict) -> str:
    """The IR with the constant-offset form off: every register's address on its own."""
    with monkeypatch.context() as m:
        m.setattr(memory, "address_plan", lambda *a: None)
        return _llvm(src, sig)


SIG = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "n": sp.i32, "s": sp.i32, "B": 1024}


@pytest.mark.parametrize("s, n", [
    (0, 1500),                       # a tail
    ((1 << 22) - 1, (1 << 31) - 1),  # (pid + s) * B wraps: -1024, then 0
    ((1 << 21) - 1, (1 << 31) - 1),  # 2**31 - 1024 (the last block below 2**31), then -2**31
    ((1 << 21) - 1, -5),             # masked off: only offsets below -5 (program 1's first ones)
])
def test_program_id_tile_addresses_match_the_interpreter_when_the_product_wraps(s: int, n: int) -> None:
    """``(program_id(0) + s) * B`` is a multiple of B even when the i32 product wraps, so every block
    of B offsets is ``base | i``: constant offsets from one extended base give the same addresses."""
    expr = "(program_id(0) + s) * B + arange(0, B)"
    llvm = _llvm(ACCESS.format(expr=expr), SIG)
    assert len(re.findall(r"= sext i32 ", llvm)) == 2
    _check_addresses(llvm, expr, s, n, 1024)


@pytest.mark.parametrize("s", [0, (1 << 31) - 100, (1 << 31) - 1024 - 3, -5])
def test_offsets_that_may_wrap_keep_one_extension_per_register(monkeypatch: pytest.MonkeyPatch, s: int) -> None:
    """``s + arange(0, B)`` with an arbitrary s wraps past 2**31 - 1 inside the tile for some s: no
    block is proven, the IR is the per-register form exactly, and its addresses are the
    interpreter's wrapped offsets."""
    expr = "s + arange(0, B)"
    src = ACCESS.format(expr=expr)
    llvm = _llvm(src, SIG)
    _check_addresses(llvm, expr, s, (1 << 31) - 1, 1024)
    assert llvm == _per_register_llvm(monkeypatch, src, SIG)
    assert len(re.findall(r"= sext i32 ", llvm)) == 2 * 8


@pytest.mark.parametrize("s", [0, (1 << 31) - 64, -(1 << 31) + 16])
def test_blocks_of_a_divisible_scalar_wrap_between_blocks_only(s: int) -> None:
    """A scalar known divisible by 16 plus ``arange(0, B)``: blocks of 16 offsets are ``base | i``
    (the wrap of s = 2**31 - 64 falls between blocks), so each 16-element block of a thread's
    registers has one base; the addresses stay the interpreter's."""
    expr = "s + arange(0, B)"
    sig = dict(SIG, s=ArgSpec(sp.i32, True))
    llvm = _llvm(ACCESS.format(expr=expr), sig)
    _check_addresses(llvm, expr, s, (1 << 31) - 1, 1024)
    assert 2 < len(re.findall(r"= sext i32 ", llvm)) < 2 * 8


TILE_2D = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, s: i32, ld: i32, BM: constexpr, BN: constexpr):
    rows = arange(0, BM)
    cols = (program_id(0) + s) * BN + arange(0, BN)
    m = (rows[:, None] < n) & (cols[None, :] < n)
    a = load(x + rows[:, None] * ld + cols[None, :], mask=m)
    store(out + rows[:, None] * ld + cols[None, :], a, mask=m)
"""


@pytest.mark.parametrize("s", [0, (1 << 25) - 1, (1 << 24) - 1])
def test_a_row_pointer_tile_plus_wrapping_columns_matches_the_interpreter(s: int) -> None:
    """``x + rows * ld + cols``: per row pointer one base, the columns constant offsets from it;
    the addresses are x + 4 * (rows * ld + cols) of the interpreter's wrapped i32 values."""
    sig = {"x": sp.ptr[sp.f32], "out": sp.ptr[sp.f32], "n": sp.i32, "s": sp.i32, "ld": sp.i32,
           "BM": 16, "BN": 128}
    llvm = _llvm(TILE_2D, sig)
    ld, n = 1000, (1 << 31) - 1
    ref = sp.loads("""
@kernel
def offsets(o: ptr[i32], s: i32, ld: i32, BM: constexpr, BN: constexpr):
    rows = arange(0, BM)
    cols = (program_id(0) + s) * BN + arange(0, BN)
    store(o + program_id(0) * BM * BN + arange(0, BM)[:, None] * BN + arange(0, BN)[None, :], rows[:, None] * ld)
    store(o + (2 + program_id(0)) * BM * BN + arange(0, BM)[:, None] * BN + arange(0, BN)[None, :],
          cols[None, :] + 0 * rows[:, None])
""", "case.spk").kernels["offsets"]
    o = np.full(4 * 16 * 128, -7, np.int32)
    ref.interpret[(2,)](o, s, ld, BM=16, BN=128)
    o = o.reshape(4, 16 * 128).astype(np.int64)
    for pid in range(2):
        acc = global_accesses(llvm, 128, pid, {"x": X_ADDR, "out": OUT_ADDR, "n": n, "s": s, "ld": ld})
        # addptr twice: x + sext(rows * ld), then + sext(cols)
        addrs = sorted(int(X_ADDR + 4 * (r + c)) for r, c in zip(o[pid], o[2 + pid], strict=True) if c < n)
        assert element_addresses(acc, False, 4) == addrs


def test_the_plan_of_a_blocked_tile() -> None:
    """address_plan on its own: an 8-register blocked layout (registers 0-3 and 512-515 of 1024
    elements), offsets contiguous in runs of 1024 starting at multiples of 1024: one base
    register, the others at their coordinate differences; runs proven only of 4: two bases; a
    32-bit block bound: nothing proven past 2**31."""
    from sparsile.backend.lower.address_form import address_plan, aligned_block

    layout = default_blocked((1024,), 4, 4)
    assert address_plan(layout, AxisInfo((1024,), (1024,), (1,)), 32) == [
        (0, 0), (0, 1), (0, 2), (0, 3), (0, 512), (0, 513), (0, 514), (0, 515)]
    assert address_plan(layout, AxisInfo((1024,), (4,), (1,)), 32) == [
        (0, 0), (0, 1), (0, 2), (0, 3), (4, 0), (4, 1), (4, 2), (4, 3)]
    assert address_plan(layout, AxisInfo((1024,), (1,), (1,)), 32) is None
    assert address_plan(layout, AxisInfo((1,), (1024,), (1024,)), 32) is None
    assert aligned_block(AxisInfo((1 << 30,), (1 << 30,), (1,)), 0, 8) == 128
