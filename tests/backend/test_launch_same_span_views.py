"""Two strided host views with the same byte span and the same strides but different shapes, such
as ``as_strided(m, (1, N), (4, 8))`` (every other element) and ``as_strided(m, (2N - 1, 1), (4, 8))``
(every element): numpy lets a dimension of extent 1 carry any stride, so the strides tuple and the
span alone do not make two views the same.

The GPU path's staging (backend/runtime/staging.py ``shared_host_copy``) took such a pair for one
view and gave the second the first one's dense copy: out = x + y read the wrong elements of y (or
of x), silently, where the interpreter (the reference, whose views are keyed by shape too) reads
each by its own elements. Views of different shapes now get a copy each (a write through either,
with the two sharing elements, is SP0750 on both paths); identical views still share one copy.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory).
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)

as_strided = np.lib.stride_tricks.as_strided


def _views(memory: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(every other element as a (1, N) row, every element as a (2N - 1, 1) column): one byte span,
    one strides tuple (4, 8)."""
    row = as_strided(memory, shape=(1, N), strides=(4, 8))
    column = as_strided(memory, shape=(2 * N - 1, 1), strides=(4, 8))
    assert row.strides == column.strides and row.shape != column.shape
    return row, column


@pytest.mark.parametrize("row_first", [True, False])
def test_two_shapes_over_one_span_are_two_inputs(device: FakeDevice, row_first: bool) -> None:
    memory = np.random.default_rng(1).uniform(-100, 100, 2 * N).astype(np.float32)
    row, column = _views(memory)
    x, y = (row, column) if row_first else (column, row)
    ref = x.reshape(-1)[:N].astype(np.float64) + y.reshape(-1)[:N].astype(np.float64)
    k = vadd()
    results = []
    for run in (k, k.interpret):
        out = np.full(N, np.nan, np.float32)
        run[GRID](x, y, out, N, BLOCK=BLOCK)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
        results.append(out.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


def test_a_write_through_one_of_them_is_sp0750_on_both_paths(device: FakeDevice) -> None:
    y = np.random.default_rng(2).uniform(-100, 100, N).astype(np.float32)
    for run in (vadd(), vadd().interpret):
        memory = np.random.default_rng(3).uniform(-100, 100, 2 * N).astype(np.float32)
        before = memory.tobytes()
        row, column = _views(memory)
        with pytest.raises(LaunchError) as info:
            run[GRID](column, y, row, N, BLOCK=BLOCK)
        assert info.value.code == "SP0750"
        assert memory.tobytes() == before
    assert device.launches == 0


def test_the_same_strided_view_twice_still_shares_one_copy(device: FakeDevice) -> None:
    memory = np.random.default_rng(4).uniform(-100, 100, 2 * N).astype(np.float32)
    row, _ = _views(memory)
    again = as_strided(memory, shape=(1, N), strides=(4, 8))
    ref = 2 * row.reshape(-1).astype(np.float64)
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](row, again, out, N, BLOCK=BLOCK)
    assert len(device.mem) == 2  # the view and out
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
