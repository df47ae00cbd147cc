"""Host array objects with only ``__array_interface__`` / ``__array_struct__`` or only ``__array__``
(no buffer protocol, no DLPack) at ``kernel[grid](...)`` and ``kernel.interpret[grid](...)``.

The interpreter, the reference, read them (through ``np.array``: a read-only copy), while the GPU
path refused them all (SP0708 "expects an array (pointer to f32), got Interfaced"). Now:

* an object that describes its memory (``__array_interface__``, ``__array_struct__``) is viewed in
  place on both paths (``np.asarray``): the GPU path stages it by value and copies the results back
  into its elements when written, as for a strided numpy array; the interpreter writes it in place
  (it refused a write, SP0719, "host copy"); one whose interface says read-only is SP0719 on both;
* an object with only ``__array__`` (what it returns may be a copy) is read through a copy on both
  paths, and a kernel writing it is SP0719 on both, in the same words.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory). On a
GPU: tests/gpu/test_array_protocols_gpu.py (not run here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


class Interfaced:
    """A host array seen only through ``__array_interface__`` (a library's array sparsile does not know)."""

    def __init__(self, array: np.ndarray):
        self.array, self.dtype, self.shape, self.ndim = array, array.dtype, array.shape, array.ndim

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self.array.__array_interface__


class Structured:
    """The same through ``__array_struct__`` (a capsule) only."""

    def __init__(self, array: np.ndarray):
        self.array, self.dtype, self.shape, self.ndim = array, array.dtype, array.shape, array.ndim

    @property
    def __array_struct__(self) -> Any:
        return self.array.__array_struct__


class Converted:
    """An object numpy reads only through ``__array__`` (here its own memory; nothing can tell)."""

    def __init__(self, array: np.ndarray):
        self.array, self.dtype, self.shape, self.ndim = array, array.dtype, array.shape, array.ndim

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return self.array


WRAPPERS = [Interfaced, Structured]


def _data(seed: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-100, 100, length).astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), "unwritten outputs"
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


def _paths() -> list[Any]:
    k = vadd()
    return [k, k.interpret]


@pytest.mark.parametrize("wrap", [*WRAPPERS, Converted])
@pytest.mark.parametrize("step", [1, 2, -1])
def test_an_array_protocol_object_is_read_on_both_paths(device: FakeDevice, wrap: type, step: int) -> None:
    x = _data(1, N * abs(step))[::step][:N]
    y = _data(2, N)
    ref = x.astype(np.float64) + y
    results = []
    for run in _paths():
        out = np.full(N, np.nan, np.float32)
        run[GRID](wrap(x), y, out, N, BLOCK=BLOCK)
        _close(out, ref)
        results.append(out.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


@pytest.mark.parametrize("wrap", WRAPPERS)
@pytest.mark.parametrize("step", [1, 3, -2])
def test_an_object_describing_its_memory_is_written_on_both_paths(device: FakeDevice, wrap: type, step: int) -> None:
    """out describes a strided view of a poisoned array: written in its elements on both paths, the
    memory between them left alone."""
    x, y = _data(3, N), _data(4, N)
    ref = x.astype(np.float64) + y
    results = []
    for run in _paths():
        memory = np.full(N * abs(step), -12345.0, np.float32)
        view = memory[::step][:N]
        view[...] = np.nan
        run[GRID](x, y, wrap(view), N, BLOCK=BLOCK)
        _close(view, ref)
        between = np.ones(memory.size, bool)
        between[np.arange(memory.size)[::step][:N]] = False
        assert (memory[between] == -12345.0).all(), "memory between the view's elements was written"
        results.append(memory.tobytes())
    assert device.launches == 1
    assert results[0] == results[1]


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_an_object_describing_read_only_memory_written_is_sp0719_on_both_paths(device: FakeDevice,
                                                                              wrap: type) -> None:
    frozen = np.full(N, np.nan, np.float32)
    frozen.flags.writeable = False
    for run in _paths():
        with pytest.raises(LaunchError) as info:
            run[GRID](_data(5, N), _data(6, N), wrap(frozen), N, BLOCK=BLOCK)
        assert info.value.code == "SP0719"
        assert info.value.message.startswith("argument `out` is a read-only")
    assert device.launches == 0 and np.isnan(frozen).all()


def test_an_array_method_object_written_is_sp0719_in_the_same_words_on_both_paths(device: FakeDevice) -> None:
    """What ``__array__`` returns may be a copy: nothing could write the results back."""
    out = np.full(N, np.nan, np.float32)
    for run in _paths():
        with pytest.raises(LaunchError) as info:
            run[GRID](_data(7, N), _data(8, N), Converted(out), N, BLOCK=BLOCK)
        assert (info.value.code, info.value.message, info.value.help) == (
            "SP0719", "argument `out` (a Converted) is read through its __array__, a host copy that cannot be "
            "written back, but the kernel writes through it",
            "pass a numpy array or a torch tensor (e.g. `np.array(x)`) and read the results from it")
        assert info.value.span is not None
    assert device.launches == 0 and np.isnan(out).all()


def test_an_instance_cuda_array_interface_still_wins_over_a_class_array_method() -> None:
    """The Numba-docs pattern (the interface set on the instance) on a class with ``__array__``: device
    memory, described by its CUDA array interface, not read through ``__array__``."""
    from sparsile.backend.runtime.arrays import describe_array

    class Both(Converted):
        pass

    obj = Both(np.zeros(8, np.float32))
    obj.__cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (0x7F00_0000_1000, False),
                                    "version": 3, "strides": None}
    info = describe_array(obj)
    assert info is not None and info.host is None and info.ptr == 0x7F00_0000_1000
    assert info.source == "Both (__cuda_array_interface__)"
