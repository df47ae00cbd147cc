"""Strided numpy arrays on the GPU: ``kernel[grid](...)`` stages them by value (a dense copy in, the
results copied back into a written view's own elements), as ``kernel.interpret[grid](...)`` does
(it refused them with SP0705 before). Random inputs, poisoned outputs, a float64 reference and the
interpreter's bits. The CPU version (the launch path on a faked device):
tests/backend/test_launch_strided_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import vadd

pytestmark = pytest.mark.gpu

N = 4099
BLOCK = 256
GRID = (-(-N // BLOCK),)
POISON = -12345.0


def _data(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, length).astype(np.float32)


@pytest.mark.parametrize("step", [2, -3])
def test_vector_add_of_strided_host_arrays(step: int) -> None:
    x, y = _data(41, N * abs(step))[::step][:N], _data(42, N * abs(step))[::step][:N]
    ref = x.astype(np.float64) + y.astype(np.float64)
    k = vadd()
    memories = []
    for run in (k, k.interpret):
        memory = np.full(N * abs(step), POISON, np.float32)
        out = memory[::step][:N]
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
        between = np.ones(memory.size, bool)
        between[np.arange(memory.size)[::step][:N]] = False
        assert (memory[between] == POISON).all()
        memories.append(memory.tobytes())
    assert memories[0] == memories[1]  # the two paths agree bit for bit


def test_a_strided_array_read_and_written_in_place_and_aliased() -> None:
    memory = _data(43, 2 * N)
    y = _data(44, N)
    before = memory.copy()
    inout = memory[1::2]
    ref = inout.astype(np.float64) + y
    vadd()[GRID](inout, y, inout, N, BLOCK=BLOCK)
    np.testing.assert_allclose(inout.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
    np.testing.assert_array_equal(memory[0::2], before[0::2])
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](memory[0::2], memory[0::2], out, N, BLOCK=BLOCK)  # the same view twice
    np.testing.assert_allclose(out.astype(np.float64), 2.0 * before[0::2].astype(np.float64), rtol=1e-6, atol=1e-5)


def test_a_written_view_whose_elements_share_memory_is_refused() -> None:
    repeating = np.lib.stride_tricks.as_strided(np.zeros(N, np.float32), (N,), (0,))
    with pytest.raises(LaunchError) as info:
        vadd()[GRID](_data(45, N), _data(46, N), repeating, N, BLOCK=BLOCK)
    assert info.value.code == "SP0750"
