"""Vectorized shared-memory stores (backend/lower/smem_access.py): the run length a layout allows
into a buffer, and the stores of the sm_90a TMA-store epilogue (one 32-bit store per column pair of
the wgmma accumulator)."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower.smem_access import smem_store_width
from sparsile.frontend.layout.library import blocked, wgmma_accumulator

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


def test_the_wgmma_accumulator_stores_column_pairs():
    acc = wgmma_accumulator(256, warpgroups=2)
    assert smem_store_width(acc, 2, 64, 512) == 2   # f16 into a 128-byte-swizzled (BM, 256) tile
    assert smem_store_width(acc, 4, 32, 1024) == 2  # f32: 8-byte runs
    assert smem_store_width(acc, 2, 256, 510) == 1  # unswizzled rows of 255 halves: a pair may straddle


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
    assert smem_store_width(layout, elem_bytes, 64, 64 * elem_bytes) == want


def test_a_run_that_would_start_off_its_alignment_is_split():
    """Lanes that move the last coordinate by 2 while registers hold runs of 4 would start runs at
    odd multiples of 2: the runs are halved."""
    layout = blocked((8, 64), (1, 2), (1, 32), (8, 1), (1, 0))
    assert smem_store_width(layout, 2, 64, 128) == 2


def test_the_tma_store_epilogue_stores_32_bit_pairs():
    mod = sp.load(KERNELS / "sparse_gemm_sm90.spk")
    m = n = k = 1024
    args = (np.zeros((m, k // 2), ml_dtypes.bfloat16), np.zeros((m, k // 32), np.uint32),
            np.zeros((n, k), ml_dtypes.bfloat16), np.zeros((m, n), np.float16), m, n, k, k // 32, n)
    ptx = mod.sparse_gemm_bf16_pair_tma[(8,)].compile_for("sm_90a", *args).ptx
    stores = re.findall(r"st\.shared\.(\S+)", ptx)
    assert stores.count("b32") == 64 and "b16" not in stores and "u16" not in stores  # 128 halves per thread
