"""Host array objects of other libraries at ``kernel[grid](...)`` and ``kernel.interpret[grid](...)``.

* An object that exports host memory through DLPack only (``__dlpack__``/``__dlpack_device__``, no
  ``__array__``): the GPU path reads and writes it (backend/runtime/arrays.py views its memory and
  stages it by value), but the interpreter, the reference, turned it into a 0-d object array
  (``np.array(obj)``) and failed inside the run with an internal ``TypeError: float() argument must
  be ... not 'Exported'``; one the kernel writes was refused as a "read-only host copy" (SP0719).
  The interpreter now reads it through ``np.from_dlpack`` in place, so both paths read and write it
  alike; one exported read-only is SP0719 on both.
* An object with a ``dtype`` and a ``shape`` but no array protocol at all: the GPU path says SP0708
  "expects an array (pointer to f32), got Shapeless"; the interpreter failed with the same internal
  TypeError. It says SP0708 in the same words now.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


class Exported:
    """A host array seen only through DLPack (like an array of a library sparsile does not know)."""

    def __init__(self, array: np.ndarray):
        self.array, self.dtype, self.shape, self.ndim = array, array.dtype, array.shape, array.ndim

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


class Shapeless:
    """Something with a dtype and a shape but no way to reach its memory."""

    def __init__(self, array: np.ndarray):
        self.dtype, self.shape, self.ndim = array.dtype, array.shape, array.ndim


def _data(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, length).astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten outputs"
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


def _paths() -> list[Any]:
    k = vadd()
    return [k, k.interpret]


@pytest.mark.parametrize("step", [1, 2, -1])
def test_a_dlpack_host_array_is_read_on_both_paths(device: FakeDevice, step: int) -> None:
    x = _data(1, N * abs(step))[::step][:N]
    y = _data(2, N)
    ref = x.astype(np.float64) + y
    results = []
    for run in _paths():
        out = np.full(N, np.nan, np.float32)
        run[GRID](Exported(x), y, out, N, BLOCK=BLOCK)
        _close(out, ref)
        results.append(out.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


@pytest.mark.parametrize("step", [1, 3, -2])
def test_a_dlpack_host_array_is_written_on_both_paths(device: FakeDevice, step: int) -> None:
    """out is a DLPack view of a poisoned array: written in its elements on both paths, the memory
    between them left alone."""
    x, y = _data(3, N), _data(4, N)
    ref = x.astype(np.float64) + y
    results = []
    for run in _paths():
        memory = np.full(N * abs(step), -12345.0, np.float32)
        view = memory[::step][:N]
        view[...] = np.nan
        run[GRID](x, y, Exported(view), N, BLOCK=BLOCK)
        _close(view, ref)
        between = np.ones(memory.size, bool)
        between[np.arange(memory.size)[::step][:N]] = False
        assert (memory[between] == -12345.0).all(), "memory between the view's elements was written"
        results.append(memory.tobytes())
    assert results[0] == results[1]


def test_a_read_only_dlpack_host_array_written_is_sp0719_on_both_paths(device: FakeDevice) -> None:
    frozen = np.full(N, np.nan, np.float32)
    frozen.flags.writeable = False
    for run in _paths():
        with pytest.raises(LaunchError) as info:
            run[GRID](_data(5, N), _data(6, N), Exported(frozen), N, BLOCK=BLOCK)
        assert info.value.code == "SP0719"
        assert info.value.message.startswith("argument `out` is a read-only")
        assert "host copy" not in info.value.message  # (it is read in place, not through a copy)
    assert device.launches == 0 and np.isnan(frozen).all()


@pytest.mark.parametrize("position", [0, 2])
def test_an_object_without_an_array_protocol_is_sp0708_on_both_paths(device: FakeDevice, position: int) -> None:
    name = ("x", "y", "out")[position]
    for run in _paths():
        args: list[Any] = [_data(7, N), _data(8, N), np.full(N, np.nan, np.float32)]
        args[position] = Shapeless(args[position])
        with pytest.raises(LaunchError) as info:
            run[GRID](*args, N, BLOCK=BLOCK)
        assert (info.value.code, info.value.message, info.value.help) == (
            "SP0708", f"argument `{name}` expects an array (pointer to f32), got Shapeless",
            "pass a numpy array, a CUDA tensor/array (torch, CuPy, JAX) or a DeviceBuffer")
    assert device.launches == 0
