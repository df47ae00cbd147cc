"""Host conversion of numpy, DLPack producers, and torch/cupy-like device objects (faked)."""

from __future__ import annotations

import sys
import types

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.sparsity import SparsityError, as_host_array, prune_2_4


class DLPackOnly:
    """A host DLPack producer (what torch CPU tensors and jax arrays look like to numpy)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class RefusingDLPack:
    """A device array: numpy.from_dlpack refuses it."""

    def __dlpack__(self, **kwargs):
        raise BufferError("device memory")

    def __dlpack_device__(self):
        return (2, 0)


class FakeCudaTensor(RefusingDLPack):
    def __init__(self, array, dtype_name="torch.float16"):
        self.array = array
        self.dtype = dtype_name

    def detach(self):
        return self

    def cpu(self):
        host = FakeHostTensor(self.array)
        host.dtype = self.dtype
        return host


class FakeHostTensor(DLPackOnly):
    def view(self, dtype):
        return DLPackOnly(self.array.view(dtype.numpy_type))


class FakeCupy(RefusingDLPack):
    def __init__(self, array):
        self.array = array

    def get(self):
        return self.array


def test_numpy_passes_through():
    a = np.ones(3)
    assert as_host_array(a) is a


def test_dlpack_producer():
    a = np.arange(6, dtype=np.float16).reshape(2, 3)
    assert np.array_equal(as_host_array(DLPackOnly(a)), a)


def test_cuda_tensor_goes_through_cpu():
    a = np.array([[1, 2, 3, 4]], dtype=np.float16)
    assert prune_2_4(FakeCudaTensor(a)).tolist() == [[0, 0, 3, 4]]


def test_cupy_array_goes_through_get():
    a = np.array([[4, 1, 3, 2]], dtype=np.float32)
    assert np.array_equal(as_host_array(FakeCupy(a)), a)


def test_torch_bfloat16_is_reinterpreted(monkeypatch):
    fake_torch = types.ModuleType("torch")
    fake_torch.int16 = types.SimpleNamespace(numpy_type=np.int16)
    fake_torch.uint8 = types.SimpleNamespace(numpy_type=np.uint8)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    values = np.array([1.5, -2.0, 0.0], dtype=ml_dtypes.bfloat16)
    host = as_host_array(FakeCudaTensor(values.view(np.int16), "torch.bfloat16"))
    assert host.dtype == ml_dtypes.bfloat16 and host.astype(np.float32).tolist() == [1.5, -2.0, 0.0]
    fp8 = np.array([0.5, -448.0], dtype=ml_dtypes.float8_e4m3fn)
    host = as_host_array(FakeCudaTensor(fp8.view(np.uint8), "torch.float8_e4m3fn"))
    assert host.dtype == ml_dtypes.float8_e4m3fn and host.astype(np.float32).tolist() == [0.5, -448.0]


def test_unreadable_object_is_a_clear_error():
    with pytest.raises(SparsityError) as info:
        as_host_array(RefusingDLPack(), "w")
    assert info.value.code == "SP0804" and "RefusingDLPack" in info.value.message


def test_ragged_list_is_a_clear_error():
    with pytest.raises(SparsityError) as info:
        as_host_array([[1, 2], [3]])
    assert info.value.code == "SP0804"


def test_checked_size_takes_non_negative_integers() -> None:
    from sparsile.stdlib.sparsity.hostarray import checked_size

    assert checked_size(0, "m") == 0
    assert checked_size(np.int64(48), "m") == 48
    for bad in (-1, 2.0, "16", None, True):
        with pytest.raises(SparsityError) as info:
            checked_size(bad, "k")
        assert info.value.code == "SP0804"
        assert info.value.message == f"k must be a non-negative integer, got {bad!r}"
        assert info.value.help == "pass k as an int (the operand's logical, unpadded size)"
