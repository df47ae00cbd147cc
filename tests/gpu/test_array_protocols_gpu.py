"""On a GPU: host array objects with only ``__array_interface__`` / ``__array_struct__`` (viewed in
place, staged by value, written back) or only ``__array__`` (read through a copy; written, SP0719 in
the interpreter's words) at ``kernel[grid](...)``, against the interpreter's bits and a float64
reference (random inputs, poisoned outputs). The faked-device version:
tests/backend/test_launch_array_protocols.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_array_protocols import Converted, Interfaced, Structured
from sparsile.tests.backend.test_prepared import vadd

pytestmark = pytest.mark.gpu

N = 4099
BLOCK = 256
GRID = (-(-N // BLOCK),)


def _data(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, length).astype(np.float32)


@pytest.mark.parametrize("wrap", [Interfaced, Structured, Converted])
@pytest.mark.parametrize("step", [1, 3, -2])
def test_array_protocol_objects_on_the_gpu(wrap: type, step: int) -> None:
    k = vadd()
    x, y = _data(1, N * abs(step))[::step][:N], _data(2, N)
    ref = x.astype(np.float64) + y
    results = []
    for run in (k, k.interpret):
        memory = np.full(N * abs(step), -12345.0, np.float32)
        out = memory[::step][:N]
        out[...] = np.nan
        if wrap is Converted:
            run[GRID](wrap(x), y, out, N, BLOCK=BLOCK)
            with pytest.raises(LaunchError) as info:
                run[GRID](x, y, wrap(np.full(N, np.nan, np.float32)), N, BLOCK=BLOCK)
            assert info.value.code == "SP0719" and "__array__" in info.value.message
        else:
            run[GRID](wrap(x), y, wrap(out), N, BLOCK=BLOCK)
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1e-6, atol=1e-5)
        between = np.ones(memory.size, bool)
        between[np.arange(memory.size)[::step][:N]] = False
        assert (memory[between] == -12345.0).all()
        results.append(memory.tobytes())
    assert results[0] == results[1]
