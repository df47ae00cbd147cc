"""Vectorized shared-memory stores (backend/lower/smem_access.py): the run length a layout allows
into a buffer, and the stores of the sm_90a TMA-store epilogue (one 32-bit store per column pair of
the wgmma accumulator)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparsile as sp
from sparsile.backend.lower.smem_access import smem_run_width
from sparsile.frontend.layout.library import blocked, wgmma_accumulator

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


def test_the_wgmma_accumulator_stores_column_pairs():
    acc = wgmma_accumulator(256, warpgroups=2)
    assert smem_run_width(acc, 2, 64, 512) == 2   # f16 into a 128-byte-swizzled (BM, 256) tile
    assert smem_run_width(acc, 4, 32, 1024) == 2  # f32: 8-byte runs
    assert smem_run_width(acc, 2, 256, 510) == 1  # unswizzled rows of 255 halves: a pair may straddle


@pytest.mark.parametrize(("spt", "elem_bytes", "want"), [
    ((1, 8), 2, 8),   # 16 bytes per thread: one .v4.b32
    ((1, 8), 4, 4),   # 32 bytes per thread: runs of 16 bytes
    ((1, 4), 1, 4),   # 4 bytes
    ((1, 1), 2, 1),   # consecutive columns in consecutive lanes: no run
    ((2, 1), 2, 1),   # registers walk rows
])
def test_blocked_layouts(spt, elem_bytes, want):
    layout = blocked((64, 64), spt, (32 // (64 // spt[1]), 64 // spt[1]) if spt[1] > 1 else (1, 32), (4, 1),
                     (1, 0))
    assert smem_run_width(layout, elem_bytes, 64, 64 * elem_bytes) == want


def test_a_run_that_would_start_off_its_alignment_is_split():
    """Lanes that move the last coordinate by 2 while registers hold runs of 4 would start runs at
    odd multiples of 2: the runs are halved."""
    layout = blocked((8, 64), (1, 2), (1, 32), (8, 1), (1, 0))
    assert smem_run_width(layout, 2, 64, 128) == 2


def test_the_tma_store_epilogue_stores_32_bit_pairs():
    mod = sp.load(KERNELS / "sparse_gemm_sm90.spk")
    m = n = k = 1024
    args = (np.zeros((m, k // 2), ml_dtypes.bfloat16), np.zeros((m, k // 32), np.uint32),
            np.zeros((n, k), ml_dtypes.bfloat16), np.zeros((m, n), np.float16), m, n, k, k // 32, n)
    ptx = mod.sparse_gemm_bf16_pair_tma[(8,)].compile_for("sm_90a", *args).ptx
    stores = re.findall(r"st\.shared\.(\S+)", ptx)
    assert stores.count("b32") == 64 and "b16" not in stores and "u16" not in stores  # 128 halves per thread


# ------------------------------------------------------------------------------------------------
# property: every run the width allows is one contiguous, aligned piece of a swizzled row


def _byte_offset(row: int, col: int, elem_bytes: int, swizzle: int, rows: int, row_bytes: int) -> int:
    """The lowering's element address (asynchronous.element_offset), in Python: column panels of
    ``swizzle`` bytes, 16-byte chunks XORed with the row bits (PTX ISA 5.5.7)."""
    if not swizzle:
        return row * row_bytes + col * elem_bytes
    panel_cols = swizzle // elem_bytes
    off = (col // panel_cols) * rows * swizzle + row * swizzle + (col % panel_cols) * elem_bytes
    return off ^ (((off >> 7) & (swizzle // 16 - 1)) << 4)


@settings(max_examples=50, deadline=None)
@given(spt_c=st.sampled_from([1, 2, 4, 8, 16]), spt_r=st.sampled_from([1, 2]),
       lanes_c=st.sampled_from([1, 2, 4, 8, 32]), elem_bytes=st.sampled_from([1, 2, 4, 8]),
       swizzle=st.sampled_from([0, 32, 64, 128]),
       order=st.sampled_from([(1, 0), (0, 1)]), warps_c=st.sampled_from([1, 2]))
def test_every_run_is_contiguous_and_aligned(spt_c, spt_r, lanes_c, elem_bytes, swizzle, order, warps_c):
    rows, cols = 32, 128
    layout = blocked((rows, cols), (spt_r, spt_c), (32 // lanes_c, lanes_c), (4 // warps_c, warps_c), order)
    row_bytes = cols * elem_bytes
    if swizzle and row_bytes % swizzle:
        return
    panel_cols = swizzle // elem_bytes if swizzle else cols
    v = smem_run_width(layout, elem_bytes, panel_cols, row_bytes)
    assert v >= 1 and v & (v - 1) == 0 and v * elem_bytes <= 16
    nreg = layout.in_size("reg")
    for lane in range(32):
        for warp in range(4):
            for start in range(0, nreg, v):
                coords = [layout.apply(reg=start + i, lane=lane, warp=warp) for i in range(v)]
                names = list(coords[0])
                r0, c0 = coords[0][names[0]], coords[0][names[1]]
                assert all((c[names[0]], c[names[1]]) == (r0, c0 + i) for i, c in enumerate(coords))
                base = _byte_offset(r0, c0, elem_bytes, swizzle, rows, row_bytes)
                assert base % (v * elem_bytes) == 0
                assert all(_byte_offset(r0, c0 + i, elem_bytes, swizzle, rows, row_bytes) == base + i * elem_bytes
                           for i in range(v))


def test_8_byte_elements_are_stored_in_64_bit_words():
    """f64 pairs: one 16-byte vector of two 64-bit words (the word size follows the element)."""
    kernel = sp.loads("""
@kernel(num_warps=4)
def k(X: ptr[f64], Out: ptr[f64]):
    rows = arange(0, 16)
    cols = arange(0, 64)
    x = load(X + rows[:, None] * 64 + cols[None, :])
    s = smem.alloc(f64, (16, 64))
    s.store(x)
    barrier()
    store(Out + rows[:, None] * 64 + cols[None, :], s.load())
""", "f64_store.spk").k
    z = np.zeros(16 * 64, np.float64)
    ptx = kernel[(1,)].compile_for("sm_90a", z, z).ptx
    stores = set(re.findall(r"st\.shared\.(\S+)", ptx))
    assert stores <= {"v2.b64", "b64", "v2.u64", "u64"} and stores, stores
    x = np.arange(16 * 64, dtype=np.float64)
    out = np.zeros_like(x)
    kernel.interpret[(1,)](x, out)
    assert np.array_equal(out, x)


def test_a_row_of_a_2d_buffer_is_one_row_pitch_on():
    """``buf[i]`` of a 2-D buffer is row i (the interpreter's meaning): one row pitch from the
    buffer's start, not a whole matrix (which ran past the buffer before)."""
    kernel = sp.loads("""
@kernel(num_warps=1)
def k(X: ptr[f32], Out: ptr[f32]):
    s = smem.alloc(f32, (4, 32))
    rows = arange(0, 4)
    cols = arange(0, 32)
    s.store(load(X + rows[:, None] * 32 + cols[None, :]))
    barrier()
    store(Out + cols, s[1].load())
""", "row_view.spk").k
    x = np.arange(128, dtype=np.float32)
    out = np.zeros(32, np.float32)
    kernel.interpret[(1,)](x, out)
    assert np.array_equal(out, x[32:64])
    ptx = kernel[(1,)].compile_for("sm_90a", x, out).ptx
    loads = re.findall(r"ld\.shared[^\[]*\[([^\]]+)\]", ptx)
    assert loads and all(a.endswith("+128") for a in loads), loads  # row 1: 32 floats on


@pytest.mark.parametrize("swizzle", [0, 128])
def test_loads_take_the_runs_stores_take(swizzle):
    """smem.load reads the same runs smem.store writes: a bf16 tile of a blocked layout comes back
    in 16-byte loads (eight elements), through a swizzled buffer too, with no 2-byte load left."""
    kernel = sp.loads(f"""
@kernel(num_warps=4)
def k(X: ptr[bf16], Out: ptr[bf16]):
    rows = arange(0, 64)
    cols = arange(0, 128)
    s = smem.alloc(bf16, (64, 128), swizzle={swizzle})
    s.store(load(X + rows[:, None] * 128 + cols[None, :]))
    barrier()
    store(Out + rows[:, None] * 128 + cols[None, :], s.load())
""", "load_runs.spk").k
    x = np.arange(64 * 128).astype(ml_dtypes.bfloat16)
    out = np.zeros_like(x)
    ptx = kernel[(1,)].compile_for("sm_90a", x, out).ptx
    assert ptx.count("ld.shared.v4.b32") == 64 * 128 // 128 // 8 and "ld.shared.b16" not in ptx
    kernel.interpret[(1,)](x, out)
    assert np.array_equal(out.view(np.uint16), x.view(np.uint16))


# ------------------------------------------------------------------------------------------------
# columns of an unswizzled buffer: a strided view (smem.slice along the last dimension)

STRIDED = """
@kernel(num_warps=4)
def columns(X: ptr[u32], Y: ptr[u32], Z: ptr[u32]):
    buf = smem.alloc(u32, (64, 8))
    r = arange(0, 64)
    c = arange(0, 8)
    buf.store(load(X + r[:, None] * 8 + c[None, :]))
    barrier()
    two = arange(0, 2)
    store(Y + r[:, None] * 2 + two[None, :], buf.slice(1, 2, 2).load())
    store(Z + r[:, None] * 2 + two[None, :], buf.slice(1, 3, 2).load())
"""


def test_a_column_slice_reads_its_columns_at_their_alignment():
    """Columns [2, 4) start 8 bytes into each 32-byte row: 8-byte loads; columns [3, 5) start 12
    bytes in, so each element is read alone. The interpreter reads the same elements."""
    mod = sp.loads(STRIDED, "strided.spk")
    x = np.arange(64 * 8, dtype=np.uint32).reshape(64, 8) * 7 + 3
    y = np.zeros((64, 2), np.uint32)
    z = np.zeros((64, 2), np.uint32)
    mod.columns.interpret[(1,)](x, y, z)
    np.testing.assert_array_equal(y, x[:, 2:4])
    np.testing.assert_array_equal(z, x[:, 3:5])
    ptx = mod.columns[(1,)].compile_for("sm_90a", x, y, z).ptx
    loads = re.findall(r"ld\.shared(\.v\d)?\.[bu]32", ptx)
    assert sorted(loads) == ["", ".v2"], loads  # the even start: one 8-byte load; the odd one: 4-byte loads


LEADING = """
@kernel(num_warps=4)
def k(X: ptr[f32], Y: ptr[f32]):
    buf = smem.alloc(f32, (2, 4, 16, 16))
    r = arange(0, 16)
    for i in range(0, 2):
        for j in range(0, 4):
            buf[i][j].store(load(X + (i * 4 + j) * 256 + r[:, None] * 16 + r[None, :]))
    barrier()
    store(Y + r[:, None] * 16 + r[None, :], VIEW.load())
"""


@pytest.mark.parametrize("view", ["buf.slice(1, 1, 2)[1][0]", "buf.slice(0, 1, 1)[0].slice(0, 1, 2)[0]",
                                  "buf.slice(1, 1, 3).slice(1, 1, 2)[1][0]"])
def test_a_sliced_leading_dimension_keeps_the_buffers_strides(view):
    """A slice of a middle leading dimension of a rank-4 buffer narrows the view, not the strides:
    each view is one matrix of the buffer, read at the same shared addresses as that matrix indexed
    directly on the GPU and as the same elements in the interpreter (the strides were once taken
    from the view's shape)."""
    want = "buf[1][2]" if view.startswith("buf.slice(1, 1, 3)") else "buf[1][1]"
    x = np.arange(2 * 4 * 256, dtype=np.float32)

    def build(v: str):
        mod = sp.loads(LEADING.replace("VIEW", v), "leading.spk")
        y = np.zeros((16, 16), np.float32)
        mod.k.interpret[(1,)](x, y)
        ptx = mod.k[(1,)].compile_for("sm_90a", x, y).ptx
        return y, re.findall(r"ld\.shared[^\[\n]*\[([^\]]+)\]", ptx)

    got_y, got_loads = build(view)
    want_y, want_loads = build(want)
    np.testing.assert_array_equal(got_y, want_y)
    assert got_loads and got_loads == want_loads
