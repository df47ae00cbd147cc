"""Host views of one memory passed together to ``kernel[grid](...)`` on the GPU, against the
interpreter's bits and a float64 reference (random inputs, poisoned outputs):

* a view and its byte-swapped reading (``x``, ``x.view('>f4')``): two inputs of different values
  (the staging shared one device copy, so the kernel read ``x`` twice);
* a read-only twin read and the writable view written (the copy back went to the read-only view
  first seen: an internal ValueError after the launch);
* two strided views over one span with one strides tuple but different shapes (shared one copy:
  the second read the first one's elements).

The CPU versions (the launch path on a faked device): tests/backend/test_launch_host_view_order.py,
tests/backend/test_launch_read_only_twin.py, tests/backend/test_launch_same_span_views.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import vadd

pytestmark = pytest.mark.gpu

N = 4099
BLOCK = 256
GRID = (-(-N // BLOCK),)


def _both_ways_finite(seed: int, length: int) -> np.ndarray:
    """Random float32 whose byte-swapped readings are modest normal floats too."""
    rng = np.random.default_rng(seed)
    found: list[np.ndarray] = []
    while sum(len(f) for f in found) < length:
        candidates = rng.uniform(-100, 100, 8 * length).astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            swapped = candidates.view(">f4").astype(np.float64)
        found.append(candidates[np.isfinite(swapped) & (np.abs(swapped) > 1e-20) & (np.abs(swapped) < 1e20)])
    return np.concatenate(found)[:length]


def _agree(run_args: tuple, ref: np.ndarray, out_index: int = 2) -> None:
    """Run vadd on the GPU and in the interpreter on fresh copies of ``run_args()``; compare."""
    k = vadd()
    results = []
    for run in (k, k.interpret):
        args = run_args()
        run[GRID](*args, N, BLOCK=BLOCK)
        got = np.asarray(args[out_index]).reshape(-1)[:N].astype(np.float64)
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-30)
        results.append(got.tobytes())
    assert results[0] == results[1]


def test_a_view_and_its_byte_swapped_reading() -> None:
    memory = _both_ways_finite(1, N)
    ref = memory.astype(np.float64) + memory.view(">f4").astype(np.float64)
    _agree(lambda: (memory, memory.view(">f4"), np.full(N, np.nan, np.float32)), ref)
    with pytest.raises(LaunchError) as info:
        vadd()[GRID](memory.view(">f4"), memory, memory, N, BLOCK=BLOCK)
    assert info.value.code == "SP0750"


@pytest.mark.parametrize("step", [1, 2])
def test_a_read_only_twin_read_and_the_view_written(step: int) -> None:
    rng = np.random.default_rng(2)
    y = rng.uniform(-100, 100, N).astype(np.float32)
    start = rng.uniform(-100, 100, N * step).astype(">f4")

    def args() -> tuple:
        view = start.copy()[::step]
        twin = view.view()
        twin.flags.writeable = False
        return twin, y, view

    _agree(args, start[::step].astype(np.float64) + y)


def test_two_shapes_over_one_span() -> None:
    memory = np.random.default_rng(3).uniform(-100, 100, 2 * N).astype(np.float32)
    row = np.lib.stride_tricks.as_strided(memory, shape=(1, N), strides=(4, 8))
    column = np.lib.stride_tricks.as_strided(memory, shape=(2 * N - 1, 1), strides=(4, 8))
    ref = row.reshape(-1).astype(np.float64) + column.reshape(-1)[:N].astype(np.float64)
    _agree(lambda: (row, column, np.full(N, np.nan, np.float32)), ref)
