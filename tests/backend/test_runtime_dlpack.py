"""CPU tests of the ctypes DLPack reader/writer (frontend/dlpack.py), using numpy as the
independent producer and consumer."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from sparsile.backend.runtime import dlpack
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # (a fixture: autouse)


def _numpy_makes_versioned_capsules() -> bool:
    try:
        np.zeros(1).__dlpack__(max_version=(1, 0))
    except TypeError:  # numpy 2.0 (pyproject's floor) has no max_version: dlpack.py falls back for it
        return False
    return True


needs_versioned = pytest.mark.skipif(not _numpy_makes_versioned_capsules(),
                                     reason="this numpy makes no versioned DLPack capsules (max_version: numpy >= 2.1)")


def test_codes_follow_dlpack_h():
    # Values from dlpack.h (DLPack 1.1): kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLBool=6,
    # kDLFloat8_e4m3fn=10, kDLFloat8_e5m2=12; kDLCPU=1, kDLCUDA=2, kDLCUDAHost=3, kDLCUDAManaged=13.
    assert dlpack.dtype_from_code(0, 32) == "i32" and dlpack.dtype_from_code(1, 8) == "u8"
    assert dlpack.dtype_from_code(2, 16) == "f16" and dlpack.dtype_from_code(4, 16) == "bf16"
    assert dlpack.dtype_from_code(6, 8) == "bool" and dlpack.dtype_from_code(10, 8) == "e4m3"
    assert dlpack.dtype_from_code(12, 8) == "e5m2"
    assert dlpack.dtype_from_code(11, 8) is None  # e4m3fnuz is another format
    assert dlpack.dtype_from_code(2, 32, lanes=4) is None
    assert dlpack.dtype_label(2, 32, 4) == "float32x4" and dlpack.dtype_label(10, 8) == "float8_e4m3fn"
    assert (dlpack.DEVICE_CPU, dlpack.DEVICE_CUDA, dlpack.DEVICE_CUDA_HOST, dlpack.DEVICE_CUDA_MANAGED) == \
        (1, 2, 3, 13)
    assert ctypes.sizeof(dlpack.DLTensor) == 48 and ctypes.sizeof(dlpack.DLManagedTensorVersioned) == 80


@pytest.mark.parametrize("versioned", [False, pytest.param(True, marks=needs_versioned)])
def test_read_numpy_capsules(versioned):
    base = np.arange(60, dtype=np.int16).reshape(6, 10)
    view = base[1:5, ::3]
    capsule = view.__dlpack__(max_version=(1, 0)) if versioned else view.__dlpack__()
    t = dlpack.read_capsule(capsule)
    assert t.data == view.ctypes.data and t.shape == view.shape
    assert t.strides == tuple(s // 2 for s in view.strides) and t.dtype == "i16"
    assert t.device_type == dlpack.DEVICE_CPU and t.is_host and t.device_label == "CPU:0"


@needs_versioned
def test_versioned_capsule_carries_the_read_only_flag():
    a = np.ones(5, dtype=np.float32)
    a.flags.writeable = False
    assert dlpack.read_capsule(a.__dlpack__(max_version=(1, 0))).readonly
    t = dlpack.from_object(a)  # asks for a versioned capsule first
    assert t.readonly and t.dtype == "f32"


def test_from_object_falls_back_for_old_producers():
    inner = np.arange(4, dtype=np.uint8)

    class Old:
        def __dlpack__(self):  # no stream / max_version keywords
            return inner.__dlpack__()

        def __dlpack_device__(self):
            return (dlpack.DEVICE_CPU, 0)

    assert dlpack.from_object(Old()).shape == (4,)


def test_reading_rejects_non_capsules_and_wrong_versions():
    with pytest.raises(dlpack.DLPackError):
        dlpack.read_capsule(object())
    managed = dlpack.DLManagedTensorVersioned()
    managed.version.major = 2
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi))
    capsule = new(ctypes.addressof(managed), b"dltensor_versioned", None)
    with pytest.raises(dlpack.DLPackError, match="unsupported DLPack version 2"):
        dlpack.read_capsule(capsule)


def test_export_is_consumed_by_numpy_and_released():
    src = np.arange(12, dtype=np.float64)
    gc.collect()
    before = dlpack.live_export_count()

    class Exporter:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return dlpack.export_capsule(src.ctypes.data, (3, 4), "f64", dlpack.DEVICE_CPU, 0, owner=src)

        def __dlpack_device__(self):
            return (dlpack.DEVICE_CPU, 0)

    view = np.from_dlpack(Exporter())
    assert view.shape == (3, 4) and view[2, 3] == 11.0
    assert view.ctypes.data == src.ctypes.data  # no copy (numpy imports legacy capsules read-only)
    assert dlpack.live_export_count() == before + 1
    del view
    gc.collect()
    assert dlpack.live_export_count() == before  # numpy called our deleter


def test_unconsumed_export_is_released_by_the_capsule():
    gc.collect()
    before = dlpack.live_export_count()
    capsule = dlpack.export_capsule(0x1000, (2, 3), "bf16", dlpack.DEVICE_CUDA, 1, owner=None,
                                    strides=(1, 2))
    t = dlpack.read_capsule(capsule)
    assert (t.data, t.shape, t.strides, t.dtype, t.device_id) == (0x1000, (2, 3), (1, 2), "bf16", 1)
    assert not t.is_host and dlpack.live_export_count() == before + 1
    del capsule, t
    gc.collect()
    assert dlpack.live_export_count() == before


def test_compact_strides():
    assert dlpack.compact_strides((2, 3, 4)) == (12, 4, 1)
    assert dlpack.compact_strides(()) == ()
    assert dlpack.compact_strides((0, 5)) == (5, 1)
    assert dlpack.dlpack_stream_argument(0) == 1 and dlpack.dlpack_stream_argument(0x55) == 0x55
    with pytest.raises(dlpack.DLPackError):
        dlpack.dtype_to_code("tf32")
