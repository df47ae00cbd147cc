"""Byte-swapped numpy arrays (``dtype('>f4')``) on the GPU: ``kernel[grid](...)`` stages them as
copies of their values in the device's byte order and writes a byte-swapped output back in its own
order, as ``kernel.interpret[grid](...)`` does (it refused them with SP0703 before). Random inputs,
a poisoned output, a float64 reference and the interpreter's bits. The CPU version (the launch
path on a faked device): tests/backend/test_launch_byte_order.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.backend.test_prepared import vadd

pytestmark = pytest.mark.gpu

N = 4099
BLOCK = 256
GRID = (-(-N // BLOCK),)


@pytest.mark.parametrize("x_order, out_order", [(">", ">"), (">", "="), ("=", ">")])
def test_vector_add_of_byte_swapped_host_arrays(x_order: str, out_order: str) -> None:
    rng = np.random.default_rng(31)
    x = rng.uniform(-100, 100, N).astype(np.float32)
    y = rng.uniform(-100, 100, N).astype(np.float32)
    ref = x.astype(np.float64) + y.astype(np.float64)
    out = np.full(N, np.nan, np.dtype(np.float32).newbyteorder(out_order))
    k = vadd()
    k[GRID](x.astype(x.dtype.newbyteorder(x_order)), y.astype(">f4"), out, N, BLOCK=BLOCK)
    assert out.dtype == np.dtype(np.float32).newbyteorder(out_order)
    got = out.astype(np.float64)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    interp = np.full(N, np.nan, out.dtype)
    k.interpret[GRID](x.astype(x.dtype.newbyteorder(x_order)), y.astype(">f4"), interp, N, BLOCK=BLOCK)
    assert out.tobytes() == interp.tobytes()  # the two paths agree bit for bit


def test_a_byte_swapped_array_read_and_written_in_place() -> None:
    rng = np.random.default_rng(32)
    x = rng.uniform(-100, 100, N).astype(np.float32)
    y = rng.uniform(-100, 100, N).astype(np.float32)
    inout = x.astype(">f4")
    vadd()[GRID](inout, y, inout, N, BLOCK=BLOCK)
    np.testing.assert_allclose(inout.astype(np.float64), x.astype(np.float64) + y, rtol=1e-6, atol=1e-5)
