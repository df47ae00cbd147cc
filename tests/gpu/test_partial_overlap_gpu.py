"""Host arrays that overlap in part on a GPU (backend/runtime/host_groups.py): one device copy of
their union, each at its offset, so the launch gives the interpreter's result bit for bit. One
program of one warp: its loads come before its stores, as in the interpreter's program order.
CPU counterpart: tests/backend/test_launch_partial_overlap.py."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu

SOURCE = """
@kernel
def shift(dst: ptr[f32], src: ptr[f32], n: i32, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    m = offs < n
    store(dst + offs, load(src + offs, mask=m) * 2.0 + 1.0, mask=m)

@kernel
def bits(x: ptr[f32], out: ptr[u32], n: i32, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    m = offs < n
    store(out + offs, load(x + offs, mask=m).to(u32, bitcast=True) ^ 0x80000000, mask=m)
"""


def _kernels():
    return sp.loads(SOURCE, "overlap_gpu.spk").kernels


@pytest.mark.parametrize("start", [0, 1, 3])
def test_gpu_in_place_shift_matches_the_interpreter(start: int) -> None:
    rng = np.random.default_rng(start)
    memory = np.full(start + 257, np.nan, np.float32)  # poisoned outside the values
    memory[start:] = rng.uniform(-10, 10, 257).astype(np.float32)
    x = memory[start:]
    interp, gpu = memory.copy(), memory.copy()
    k = _kernels()["shift"]
    k.interpret[(1,)](interp[start:][:-1], interp[start:][1:], 256, BLOCK=256, num_warps=1)
    k[(1,)](gpu[start:][:-1], gpu[start:][1:], 256, BLOCK=256, num_warps=1)
    ref = x[1:].astype(np.float64) * 2 + 1
    np.testing.assert_allclose(interp[start:][:-1].astype(np.float64), ref, rtol=1e-6)
    assert gpu.tobytes() == interp.tobytes()


def test_gpu_float_and_u32_views_of_overlapping_bytes_match_the_interpreter() -> None:
    rng = np.random.default_rng(9)
    memory = rng.uniform(-10, 10, 192).astype(np.float32)
    interp, gpu = memory.copy(), memory.copy()
    k = _kernels()["bits"]
    k.interpret[(1,)](interp[64:], interp.view(np.uint32)[:128], 128, BLOCK=128, num_warps=1)
    k[(1,)](gpu[64:], gpu.view(np.uint32)[:128], 128, BLOCK=128, num_warps=1)
    assert gpu.tobytes() == interp.tobytes()
    np.testing.assert_array_equal(gpu[:128], -memory[64:])  # (the sign bit flipped)
