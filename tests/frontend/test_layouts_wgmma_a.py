"""``layout_library.wgmma_a_fragment`` (A of ``wgmma.mma_async`` from registers) checked index by
index against the PTX ISA fragment tables, written out here independently of the implementation
(PTX ISA 9.7.15.5.1.1: Fig. 148 for 16-bit ``k16``, Fig. 150 for tf32 ``k8``, Fig. 152 for 8-bit
``k32``; each warp of the warpgroup holds 16 rows, in the pattern of the warp-level ``mma``
fragment tables of §9.7.14.5 with ``groupID = lane >> 2``, ``threadID_in_group = lane % 4``),
and ``lower_hopper.a_layout`` (whole tiles: K steps, m64 blocks, warpgroups)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.backend.lower.hopper import a_layout
from sparsile.frontend.ir import types as T
from sparsile.frontend.layout.layouts import LayoutError
from sparsile.frontend.layout.library import wgmma_a_fragment


def ptx_a_element(cls: str, warp: int, lane: int, i: int) -> tuple[int, int]:
    """(row, stored column) of element ``a_i`` held by ``lane`` of warp ``warp`` (of the
    warpgroup), transcribed from the PTX tables."""
    group, tig = lane >> 2, lane % 4
    if cls == "16bit":  # a0..a7, two per .f16x2 register
        row = group + 8 * ((i >> 1) & 1)
        col = tig * 2 + (i & 1) + 8 * (i >= 4)
    elif cls == "tf32":  # a0..a3, one per .b32 register
        row = group + 8 * (i & 1)
        col = tig + 4 * (i >= 2)
    else:  # 8-bit: a0..a15, four per .b32 register
        row = group + 8 * ((i >> 2) & 1)
        col = tig * 4 + (i & 3) + 16 * (i >= 8)
    return 16 * warp + row, col


CLASSES = {"f16": ("16bit", 8), "bf16": ("16bit", 8), "tf32": ("tf32", 4), "f32": ("tf32", 4),
           "e4m3": ("8bit", 16), "e5m2": ("8bit", 16), "i8": ("8bit", 16), "u8": ("8bit", 16)}


@pytest.mark.parametrize("dtype", sorted(CLASSES))
@pytest.mark.parametrize("sparse", [False, True])
def test_every_element_matches_the_ptx_table(dtype: str, sparse: bool) -> None:
    cls, per_thread = CLASSES[dtype]
    lay = wgmma_a_fragment(dtype, sparse=sparse)
    assert lay.in_size("reg") == per_thread  # four b32 registers per thread
    assert lay.out_shape == (64, {"16bit": 16, "tf32": 8, "8bit": 32}[cls])
    assert lay.is_bijective()  # every A element in exactly one register of one thread
    for warp in range(4):
        for lane in range(32):
            for i in range(per_thread):
                got = lay.apply(reg=i, lane=lane, warp=warp)
                assert (got["m"], got["k"]) == ptx_a_element(cls, warp, lane, i), (dtype, warp, lane, i)


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(sorted(CLASSES)), wg_log=st.integers(0, 2), data=st.data())
def test_warpgroups_stack_64_row_blocks(dtype: str, wg_log: int, data: st.DataObject) -> None:
    cls, per_thread = CLASSES[dtype]
    g = 1 << wg_log
    lay = wgmma_a_fragment(dtype, warpgroups=g)
    warp = data.draw(st.integers(0, 4 * g - 1))
    lane = data.draw(st.integers(0, 31))
    i = data.draw(st.integers(0, per_thread - 1))
    row, col = ptx_a_element(cls, warp % 4, lane, i)
    got = lay.apply(reg=i, lane=lane, warp=warp)
    assert (got["m"], got["k"]) == (64 * (warp // 4) + row, col)


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(["f16", "bf16", "tf32", "e4m3", "i8"]), wg_log=st.integers(0, 1),
       r_log=st.integers(0, 1), steps_log=st.integers(0, 2), data=st.data())
def test_tile_layout_repeats_k_steps_then_m64_blocks(dtype: str, wg_log: int, r_log: int, steps_log: int,
                                                      data: st.DataObject) -> None:
    """Register ``j + per·(ks + steps·r)`` of a thread is element ``a_j`` of K step ``ks`` of
    the m64 block ``r``; block ``r`` of warpgroup ``g`` covers rows ``64(r·G + g)`` (the rows
    of the accumulator that instruction writes)."""
    cls, per_thread = CLASSES[dtype]
    g, r, steps = 1 << wg_log, 1 << r_log, 1 << steps_log
    cols = {"16bit": 16, "tf32": 8, "8bit": 32}[cls]
    lay = a_layout(64 * g * r, cols * steps, getattr(T, dtype), 4 * g)
    assert lay is not None and lay.is_bijective()
    warp = data.draw(st.integers(0, 4 * g - 1))
    lane = data.draw(st.integers(0, 31))
    j = data.draw(st.integers(0, per_thread - 1))
    ks = data.draw(st.integers(0, steps - 1))
    rr = data.draw(st.integers(0, r - 1))
    row, col = ptx_a_element(cls, warp % 4, lane, j)
    got = lay.apply(reg=j + per_thread * (ks + steps * rr), lane=lane, warp=warp)
    assert (got["dim0"], got["dim1"]) == (64 * (rr * g + warp // 4) + row, cols * ks + col)


def test_shapes_that_do_not_fit() -> None:
    assert a_layout(64, 24, T.f16, 4) is None  # 1.5 K steps
    assert a_layout(96, 16, T.f16, 4) is None  # M not 64 x a power of two
    assert a_layout(64, 16, T.f16, 6) is None  # not whole warpgroups
    assert a_layout(64, 16, T.f64, 4) is None  # no wgmma of f64
    with pytest.raises(LayoutError):
        wgmma_a_fragment("e2m1")  # no 4-bit wgmma
