"""A minimal DLPack reader and writer on ctypes (no dependency on any array library).

The launcher uses arrays from torch, JAX, CuPy and numpy in place through the DLPack protocol
(``__dlpack__`` / ``__dlpack_device__``, Python array API standard). This module reads the
``PyCapsule`` such an object returns, without consuming it: the capsule keeps its name, so its own
destructor releases the producer's tensor once the capsule is garbage collected. The caller keeps
the capsule (and the source object) alive for as long as it uses the pointer.

It also exports a device allocation as a capsule (:func:`export_capsule`), so that a
:class:`sparsile.backend.runtime.DeviceBuffer` can be handed to other frameworks without a copy.

Struct layouts and enum values follow ``dlpack.h`` (DLPack 1.1): ``DLTensor``, ``DLManagedTensor``
(capsule name ``"dltensor"``) and ``DLManagedTensorVersioned`` (``"dltensor_versioned"``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

# DLDeviceType (dlpack.h)
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3
DEVICE_CUDA_MANAGED = 13
DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host (pinned)", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI"}
HOST_DEVICE_TYPES = frozenset({DEVICE_CPU, DEVICE_CUDA_HOST})
"""Memory the host can read and write through a plain pointer."""

# DLDataTypeCode (dlpack.h)
CODE_INT = 0
CODE_UINT = 1
CODE_FLOAT = 2
CODE_BFLOAT = 4
CODE_BOOL = 6
CODE_FLOAT8_E4M3FN = 10
CODE_FLOAT8_E5M2 = 12

_DTYPE_BY_CODE: dict[tuple[int, int], str] = {
    (CODE_INT, 8): "i8", (CODE_INT, 16): "i16", (CODE_INT, 32): "i32", (CODE_INT, 64): "i64",
    (CODE_UINT, 8): "u8", (CODE_UINT, 16): "u16", (CODE_UINT, 32): "u32", (CODE_UINT, 64): "u64",
    (CODE_FLOAT, 16): "f16", (CODE_FLOAT, 32): "f32", (CODE_FLOAT, 64): "f64",
    (CODE_BFLOAT, 16): "bf16", (CODE_BOOL, 8): "bool",
    (CODE_FLOAT8_E4M3FN, 8): "e4m3", (CODE_FLOAT8_E5M2, 8): "e5m2",
}
_CODE_BY_DTYPE = {name: key for key, name in _DTYPE_BY_CODE.items()}
_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex", 6: "bool",
               7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz", 10: "float8_e4m3fn",
               11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz", 14: "float8_e8m0fnu",
               15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"}

READ_ONLY_FLAG = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
COPIED_FLAG = 2  # DLPACK_FLAG_BITMASK_IS_COPIED: the producer exported a copy, not its own memory


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Private prototypes of the capsule C API (not the shared ctypes.pythonapi attributes, whose
# argtypes other libraries may set differently). void* arguments, so that the capsule destructor
# can call them on an object whose reference count is already zero.
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))

_NAME_LEGACY = ctypes.create_string_buffer(b"dltensor")
_NAME_VERSIONED = ctypes.create_string_buffer(b"dltensor_versioned")


class DLPackError(ValueError):
    """The object's DLPack export could not be read (bad capsule, unsupported version)."""


@dataclass(frozen=True)
class DLPackTensor:
    """What a capsule describes. ``data`` already includes ``byte_offset``; ``strides`` are in
    elements (filled in as compact row-major when the producer left them NULL); ``dtype`` is the
    sparsile dtype name, or None when the language has no such type (``dtype_label`` names it)."""

    data: int
    device_type: int
    device_id: int
    dtype: str | None
    dtype_label: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    readonly: bool
    capsule: Any
    copied: bool = False
    """The producer exported a copy (a versioned capsule's IS_COPIED flag): what a kernel writes into it
    never reaches the producer's object."""

    @property
    def is_host(self) -> bool:
        return self.device_type in HOST_DEVICE_TYPES

    @property
    def device_label(self) -> str:
        kind = DEVICE_NAMES.get(self.device_type, f"device type {self.device_type}")
        return f"{kind}:{self.device_id}"


def dtype_from_code(code: int, bits: int, lanes: int = 1) -> str | None:
    """The sparsile dtype name of a DLDataType, or None (vector lanes, complex, fnuz floats...)."""
    if lanes != 1:
        return None
    return _DTYPE_BY_CODE.get((code, bits))


def dtype_label(code: int, bits: int, lanes: int = 1) -> str:
    """A readable name of a DLDataType for messages: ``float16``, ``bfloat16``, ``int32x4``."""
    base = _CODE_NAMES.get(code, f"code{code}")
    if not base.startswith(("float8", "float6", "float4", "bool")):
        base = f"{base}{bits}"
    return base if lanes == 1 else f"{base}x{lanes}"


def dtype_to_code(dtype: str) -> tuple[int, int]:
    """``(code, bits)`` of a sparsile dtype name (inverse of :func:`dtype_from_code`)."""
    try:
        return _CODE_BY_DTYPE[dtype]
    except KeyError:
        raise DLPackError(f"dtype {dtype!r} has no DLPack code") from None


def compact_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements (what a NULL ``strides`` field means)."""
    strides = [0] * len(shape)
    step = 1
    for axis in range(len(shape) - 1, -1, -1):
        strides[axis] = step
        step *= max(int(shape[axis]), 1)
    return tuple(strides)


def _read_dl_tensor(t: DLTensor) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    ndim = int(t.ndim)
    if ndim < 0 or ndim > 64:
        raise DLPackError(f"DLPack tensor has an invalid rank {ndim}")
    shape = tuple(int(t.shape[i]) for i in range(ndim)) if ndim else ()
    if ndim and bool(t.strides):
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        strides = compact_strides(shape)
    data = (t.data or 0) + int(t.byte_offset)
    return data, shape, strides


def read_capsule(capsule: Any) -> DLPackTensor:
    """Read (without consuming) a ``"dltensor"`` or ``"dltensor_versioned"`` capsule."""
    address = id(capsule)
    if _capsule_is_valid(address, _NAME_VERSIONED):
        managed = DLManagedTensorVersioned.from_address(_capsule_get_pointer(address, _NAME_VERSIONED))
        if managed.version.major != 1:
            raise DLPackError(f"unsupported DLPack version {managed.version.major}.{managed.version.minor}")
        readonly = bool(managed.flags & READ_ONLY_FLAG)
        copied = bool(managed.flags & COPIED_FLAG)
        tensor = managed.dl_tensor
    elif _capsule_is_valid(address, _NAME_LEGACY):
        tensor = DLManagedTensor.from_address(_capsule_get_pointer(address, _NAME_LEGACY)).dl_tensor
        readonly = copied = False
    else:
        raise DLPackError("not a DLPack capsule (expected a PyCapsule named 'dltensor' or "
                          "'dltensor_versioned'; was it consumed already?)")
    data, shape, strides = _read_dl_tensor(tensor)
    code, bits, lanes = int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes)
    return DLPackTensor(
        data=data, device_type=int(tensor.device.device_type), device_id=int(tensor.device.device_id),
        dtype=dtype_from_code(code, bits, lanes), dtype_label=dtype_label(code, bits, lanes),
        shape=shape, strides=strides, readonly=readonly, capsule=capsule, copied=copied,
    )


def dlpack_stream_argument(stream_handle: int) -> int:
    """The ``stream=`` value to pass to a CUDA producer's ``__dlpack__`` for a launch on
    ``stream_handle``: the array API standard reserves 0, and uses 1 for the legacy default
    stream (the driver's handle 0) and 2 for the per-thread default stream."""
    return stream_handle if stream_handle else 1


def from_object(obj: Any, stream_handle: int = 0) -> DLPackTensor:
    """Export ``obj`` through ``__dlpack__`` and read the capsule. For CUDA producers the launch
    stream is passed so that the producer orders its pending work before our use."""
    device_type, _ = obj.__dlpack_device__()
    device_type = int(device_type)
    stream = dlpack_stream_argument(stream_handle) if device_type in (DEVICE_CUDA, DEVICE_CUDA_MANAGED) \
        else None
    attempts = ({"stream": stream, "max_version": (1, 1)}, {"stream": stream}, {})
    last: Exception | None = None
    for kwargs in attempts:
        try:
            capsule = obj.__dlpack__(**kwargs)
        except TypeError as exc:  # an older producer without these keywords
            last = exc
            continue
        return read_capsule(capsule)
    raise DLPackError(f"__dlpack__ of {type(obj).__name__} failed: {last}")


# ---------------------------------------------------------------------------------------------
# Export (producer side)

_DELETER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CAPSULE_DESTRUCTOR_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_live_exports: dict[int, tuple[Any, ...]] = {}


def _release(managed_address: int) -> None:
    _live_exports.pop(managed_address, None)


_deleter = _DELETER_TYPE(_release)


def _destroy_capsule(capsule_address: int) -> None:
    # A capsule that nobody consumed (still named "dltensor") releases its tensor itself.
    if _capsule_is_valid(capsule_address, _NAME_LEGACY):
        _release(_capsule_get_pointer(capsule_address, _NAME_LEGACY))


_capsule_destructor = _CAPSULE_DESTRUCTOR_TYPE(_destroy_capsule)


def export_capsule(data: int, shape: tuple[int, ...], dtype: str, device_type: int, device_id: int,
                   owner: Any, strides: tuple[int, ...] | None = None) -> Any:
    """A legacy ``"dltensor"`` capsule describing memory at ``data``. ``owner`` is kept alive
    until the consumer calls the deleter (or the unconsumed capsule is collected)."""
    code, bits = dtype_to_code(dtype)
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    if strides is None:
        strides = compact_strides(shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    managed = DLManagedTensor()
    managed.dl_tensor.data = data or None
    managed.dl_tensor.device = DLDevice(device_type, device_id)
    managed.dl_tensor.ndim = ndim
    managed.dl_tensor.dtype = DLDataType(code, bits, 1)
    managed.dl_tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.byte_offset = 0
    managed.deleter = ctypes.cast(_deleter, ctypes.c_void_p).value
    address = ctypes.addressof(managed)
    _live_exports[address] = (managed, shape_arr, strides_arr, owner)
    destructor = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
    return _capsule_new(address, _NAME_LEGACY, destructor)


def live_export_count() -> int:
    """How many exported tensors are still held by a consumer or an uncollected capsule (tests)."""
    return len(_live_exports)
