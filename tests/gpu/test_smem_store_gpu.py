"""Shared-memory stores of register tiles, vectorized (backend/lower/smem_access.py): a tile loaded
from global memory is written into swizzled and plain shared buffers, then leaves by TMA store and
by smem.load; the output must be the input, bit for bit. In the interpreter and compiled for sm_90a
on the CPU (the PTX stores 16-byte vectors); on the GPU (marked). The GPU test was written after
the tenth session's GPU time was spent: not run yet."""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp

ROUND_TRIP = """
@kernel(num_warps=4)
def k(X: ptr[f16], Y: tensor[f16, 2], Z: ptr[f16]):
    rows = arange(0, 64)
    cols = arange(0, 128)
    x = load(X + rows[:, None] * 128 + cols[None, :])
    swizzled = smem.alloc(f16, (64, 128), swizzle=128)
    plain = smem.alloc(f16, (64, 128))
    swizzled.store(x)
    plain.store(x * 2.0)
    fence.async_shared()
    barrier()
    tma.store(Y, (0, 0), swizzled)
    tma.store_wait(0)
    z = plain.load()
    store(Z + rows[:, None] * 128 + cols[None, :], z)
"""


def _run(interpret: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 128)).astype(np.float16)
    y = np.full((64, 128), np.nan, np.float16)
    z = np.full((64, 128), np.nan, np.float16)
    kernel = sp.loads(ROUND_TRIP, "smem_round_trip.spk").k
    (kernel.interpret[(1,)] if interpret else kernel[(1,)])(x, y, z)
    return x, y, z


def test_round_trip_in_the_interpreter():
    x, y, z = _run(True)
    assert np.array_equal(y, x) and np.array_equal(z, x * np.float16(2))


def test_the_ptx_stores_16_byte_vectors():
    kernel = sp.loads(ROUND_TRIP, "smem_round_trip.spk").k
    z = np.zeros((64, 128), np.float16)
    ptx = kernel[(1,)].compile_for("sm_90a", z, z, z).ptx
    stores = re.findall(r"st\.shared\.(\S+)", ptx)
    assert stores and set(stores) == {"v4.b32"}, stores


@pytest.mark.gpu
def test_round_trip_on_the_gpu():
    x, y, z = _run(False)
    assert np.array_equal(y, x) and np.array_equal(z, x * np.float16(2))


ROW_VIEW = """
@kernel(num_warps=1)
def k(X: ptr[f32], Out: ptr[f32]):
    s = smem.alloc(f32, (4, 32))
    rows = arange(0, 4)
    cols = arange(0, 32)
    s.store(load(X + rows[:, None] * 32 + cols[None, :]))
    barrier()
    for i in static_range(0, 4):
        store(Out + i * 32 + cols, s[3 - i].load())
"""


@pytest.mark.gpu
def test_rows_of_a_2d_buffer_on_the_gpu():
    """``buf[i]`` of a 2-D buffer is row i on the GPU as in the interpreter (it moved by a whole
    matrix before the tenth session's fix)."""
    x = np.arange(128, dtype=np.float32)
    out = np.full(128, np.nan, np.float32)
    sp.loads(ROW_VIEW, "row_view.spk").k[(1,)](x, out)
    assert np.array_equal(out.reshape(4, 32), x.reshape(4, 32)[::-1])


def test_rows_of_a_2d_buffer_in_the_interpreter():
    x = np.arange(128, dtype=np.float32)
    out = np.full(128, np.nan, np.float32)
    sp.loads(ROW_VIEW, "row_view.spk").k.interpret[(1,)](x, out)
    assert np.array_equal(out.reshape(4, 32), x.reshape(4, 32)[::-1])
