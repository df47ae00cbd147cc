"""Layout pins and accumulator stores (frontend/ops/layout.py, frontend/legality/layout.py).

Issue 5 acceptance 3 (seed 002): an MMA accumulator — from wgmma, or loaded from TMEM by
tcgen05.ld — stored to a swizzled shared-memory buffer with ``buf.store(acc)`` compiles with no
user-written conversion: inference keeps the accumulator layout, and it is storable. Only a
user-pinned layout that does not fit gives a diagnostic, with a help line.
"""

from __future__ import annotations

import itertools

import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.frontend.layout.library import smem_tile, tmem_accumulator
from sparsile.frontend.layout.smem import storable_layout
from sparsile.frontend.legality.layout import smem_layout_of, storable
from sparsile.tests.support import compile_src

WGMMA_STORE = """\
@kernel(num_warps=4)
def k(A: tensor[f16, 2], B: tensor[f16, 2], C: tensor[f32, 2]):
    a = smem.alloc(f16, (64, 64), swizzle=128)
    b = smem.alloc(f16, (64, 64), swizzle=128)
    c = smem.alloc(f32, (64, 64), swizzle=SW)
    bar = mbarrier.alloc(1)
    mbarrier.expect(bar[0], 2 * 64 * 64 * 2)
    tma.load(A, (0, 0), a, bar[0])
    tma.load(B, (0, 0), b, bar[0])
    mbarrier.wait(bar[0], 0)
    acc = hopper.wgmma(a, b, INIT)
    acc = hopper.wgmma_wait(0, acc)
    c.store(VALUE)
    fence.async_shared()
    barrier()
    tma.store(C, (0, 0), c)
    tma.store_wait()
"""
ZEROS = "zeros((64, 64), f32)"
BLOCKED = "layout.blocked((64, 64), (1, 4), (8, 4), (4, 1))"


def wgmma_accumulator_layout(m: int, n: int, warps: int):
    from sparsile.frontend.ops.layout import wgmma_accumulator_layout as build  # (inside the fixture's window)

    return build(m, n, warps)


def src(value: str = "acc", init: str = ZEROS, sw: int = 128) -> str:
    return WGMMA_STORE.replace("VALUE", value).replace("INIT", init).replace("SW", str(sw))


def error(source: str, target: str = "sm_90a"):
    with pytest.raises(CompileError) as info:
        compile_src(source, target, stop_after="ir")
    return info.value.diagnostics[0], info.value


# ------------------------------------------------------------------------------------------------
# Acceptance 3: accumulators stored to swizzled shared memory
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sw", [0, 32, 64, 128])
def test_wgmma_accumulator_stores_without_conversion(sw: int) -> None:
    ck = compile_src(src(sw=sw))
    assert "convert_layout" not in ck.ir  # inference kept the accumulator's own layout
    assert "wgmma.mma_async" in ck.ptx and "cp.async.bulk.tensor" in ck.ptx
    assert storable(wgmma_accumulator_layout(64, 64, 4), T.SmemType(T.f32, (64, 64), sw))


def test_tcgen05_accumulator_stores_without_conversion() -> None:
    pytest.importorskip("sparsile.backend.lower.blackwell")
    source = """\
@kernel(num_warps=4)
def k(C: tensor[f32, 2]):
    acc = tmem.alloc(f32, (128, 64))
    acc.store(zeros((128, 64), f32))
    x = acc.load()
    c = smem.alloc(f32, (128, 64), swizzle=128)
    c.store(x)
    fence.async_shared()
    barrier()
    tma.store(C, (0, 0), c)
    tma.store_wait()
"""
    ck = compile_src(source, "sm_100a")
    assert "convert_layout" not in ck.ir and "tcgen05.ld" in ck.ptx


def test_tcgen05_ld_layouts_are_storable_to_every_swizzle() -> None:
    """The algebra behind the previous test: the register layout a 32x32b tcgen05.ld gives a
    128 x N accumulator (thread t = TMEM lane t) stores to every swizzled tile with st.shared."""
    from sparsile.frontend.layout.tmem_access import tmem_register_layout

    for n, sw in itertools.product((32, 64, 128), ("none", "32B", "64B", "128B")):
        reg = tmem_register_layout(tmem_accumulator(128, n), "32x32b")
        reg = reg.rename_outs({"m": "dim0", "n": "dim1"})
        plan = storable_layout(reg, smem_tile(128, n, 32, sw, dims=("dim0", "dim1")), 32)
        assert plan.ok and plan.vector_elems >= 1, (n, sw, plan.reason)


def test_smem_layout_matches_the_lowering_addresses() -> None:
    """legality_layout's model of a buffer equals backend/lower_async.element_offset: column
    panels of one swizzle span, XOR of address bits [7, ...) into [4, ...)."""
    for (rows, cols), bits, sw in itertools.product([(16, 64), (64, 32), (8, 128)], (16, 32), (0, 32, 64, 128)):
        eb = bits // 8
        if sw and (cols * eb < 16 or cols * eb % sw):
            continue
        lay = smem_layout_of(T.SmemType(T.f16 if bits == 16 else T.f32, (rows, cols), sw))
        assert lay is not None
        inv = lay.invert()
        for r, c in itertools.product(range(rows), range(cols)):
            if sw:
                pc = sw // eb
                off = (c // pc) * rows * sw + r * sw + (c % pc) * eb
                off ^= ((off >> 7) & (sw // 16 - 1)) << 4
            else:
                off = r * cols * eb + c * eb
            assert inv.apply(dim0=r, dim1=c)["offset"] * eb == off, (rows, cols, bits, sw, r, c)


# ------------------------------------------------------------------------------------------------
# Pins
# ------------------------------------------------------------------------------------------------
def test_a_pinned_storable_layout_is_respected() -> None:
    ck = compile_src(src(value=f"pin(acc, {BLOCKED})"))
    convs = [ln for ln in ck.ir.splitlines() if "convert_layout" in ln]
    assert len(convs) == 1 and "pinned=True" in convs[0]  # the pin itself; the store takes it as is
    from sparsile.frontend.layout.library import blocked
    from sparsile.frontend.layout.tile import normalize, short_name

    want = short_name(normalize(blocked((64, 64), (1, 4), (8, 4), (4, 1), (1, 0)), 4))
    assert convs[0].endswith(f"#{want}")  # the pinned value has exactly the pinned layout


def test_pin_to_the_layout_it_already_has_moves_nothing() -> None:
    ck = compile_src(src(value="pin(acc, layout.wgmma_accumulator(64, 64, 4))"))
    assert len([ln for ln in ck.ir.splitlines() if "convert_layout" in ln]) == 1
    lowered = compile_src(src(), stop_after="llvm").llvm
    pinned = compile_src(src(value="pin(acc, layout.wgmma_accumulator(64, 64, 4))"), stop_after="llvm").llvm
    assert pinned.count("addrspace(3)") == lowered.count("addrspace(3)")  # no extra shared-memory traffic


def test_pin_for_other_warps_is_a_diagnostic() -> None:
    d, _ = error(src(value="pin(acc, layout.default((64, 64), 8))"))
    assert (d.code, d.span.line, d.span.col) == ("SP0421", 13, 13)
    assert "spreads the tile over 8 warps, only 4 run this code" in d.message
    assert d.help == "build the layout for num_warps=4"


def test_pin_of_the_wrong_shape_is_a_diagnostic_at_the_layout() -> None:
    d, _ = error(src(value="pin(acc, layout.default((64, 32), 4))"))
    assert (d.code, d.span.line, d.span.col) == ("SP0420", 13, 22)
    assert "describes a 64x32 tile, the value is 64x64" in d.message and d.help


def test_a_pin_that_is_not_a_layout() -> None:
    d, _ = error(src(value="pin(acc, 3)"))
    assert (d.code, d.span.line, d.span.col) == ("SP0423", 13, 22) and d.help


def test_pinned_accumulator_meeting_wgmma_is_a_diagnostic() -> None:
    d, _ = error(src(init=f"pin(zeros((64, 64), f32), {BLOCKED})"))
    assert (d.code, d.span.line, d.span.col) == ("SP0422", 11, 11)
    assert "is not the layout `hopper.wgmma` needs for this operand" in d.message
    assert d.labels and d.labels[0].message == "pinned here" and d.labels[0].span.line == 11
    assert "remove the pin" in d.help and "`layout.wgmma_accumulator(64, 64, 4)`" in d.help
    assert "L[reg=(0,1),(8,0)" in d.notes[0]  # the layout wgmma needs, spelled out
    # the layout wgmma needs, pinned, compiles with no conversion at the MMA
    ok = compile_src(src(init="pin(zeros((64, 64), f32), layout.wgmma_accumulator(64, 64, 4))"))
    assert "wgmma.mma_async" in ok.ptx


def test_pinned_accumulator_through_a_loop() -> None:
    source = src(init="acc").replace(
        "    acc = hopper.wgmma(a, b, acc)\n",
        f"    acc = pin(zeros((64, 64), f32), {BLOCKED})\n    for i in range(4):\n"
        "        acc = hopper.wgmma(a, b, acc)\n")
    d, _ = error(source)
    assert d.code == "SP0422" and d.span.line == 13 and "loop-carried" in d.message


def test_unpinned_values_get_conversions_not_errors() -> None:
    """A blocked accumulator (not pinned) meets wgmma: inference converts, nothing is reported."""
    source = src(init="acc").replace("    acc = hopper.wgmma(a, b, acc)\n",
                                     "    acc = zeros((64, 64), f32) + 1.0\n    acc = hopper.wgmma(a, b, acc)\n")
    ck = compile_src(source)
    assert "wgmma.mma_async" in ck.ptx


def test_convert_layout_is_an_explicit_pinned_conversion() -> None:
    ck = compile_src(src(value="convert_layout(acc, layout.default((64, 64), 4))"))
    convs = [ln for ln in ck.ir.splitlines() if "convert_layout" in ln]
    assert len(convs) == 1 and "pinned=True" in convs[0]


def test_pins_run_in_the_interpreter() -> None:
    source = """\
@kernel(num_warps=4)
def k(X: ptr[f32], Y: ptr[f32]):
    r = arange(0, 32)
    x = load(X + r[:, None] * 32 + r[None, :])
    y = pin(x * 2.0, layout.blocked((32, 32), (1, 1), (1, 32), (4, 1)))
    store(Y + r[:, None] * 32 + r[None, :], convert_layout(y + 1.0, layout.default((32, 32), 4)))
"""
    import numpy as np

    k = sp.loads(source, "case.spk").kernels["k"]
    x = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    y = np.zeros_like(x)
    k.interpret[(1,)](x, y)
    assert np.array_equal(y, x * 2 + 1)
    ptx = compile_src(source, "sm_80").ptx  # and compiles: conversions where the pins demand them
    assert "st.global" in ptx


def test_layout_constructors() -> None:
    from sparsile.backend.lower.hopper import acc_layout

    for m, n, w in ((64, 64, 4), (128, 256, 8), (128, 64, 4), (256, 128, 8)):
        assert wgmma_accumulator_layout(m, n, w) == acc_layout(m, n, w)
    with pytest.raises(ValueError):
        wgmma_accumulator_layout(64, 64, 6)
