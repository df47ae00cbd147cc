"""Array arguments: what the launcher needs to know about an array (:class:`ArrayInfo`), read
from numpy arrays, torch tensors, ``__cuda_array_interface__`` objects and DLPack producers, and
the checks of an array passed for a pointer or tensor-map parameter. Pure Python (no CUDA calls).

Where arrays come from
    * numpy arrays and other **host** memory (a CPU torch tensor, a CPU DLPack export) are copied
      to the device before the launch and back after it (unless the parameter is read-only); the
      launch then synchronizes. A launcher built with ``allow_host_copies=False`` refuses them.
    * torch CUDA tensors, ``__cuda_array_interface__`` objects (CuPy, Numba, torch) and
      ``__dlpack__`` objects on a CUDA device (torch, JAX, CuPy) are used **in place**.
    * a Python int is taken as a raw device address (no checks possible).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ...frontend import dlpack
from ...frontend.diagnostics import LaunchError
from ...frontend.interp.dlpack_host import exported_copy_written, memory_view
from ...frontend.interp.host_arrays import array_copy_written, has_memory_interface
from .codes import (
    ARG_ALIGNMENT,
    ARG_CONTIGUOUS,
    ARG_DEVICE,
    ARG_DTYPE,
    ARG_HOST_MEMORY,
    ARG_KIND,
    ARG_NEGATED,
    READ_ONLY,
)
from .dtypes import (
    ARRAY_DTYPE_ALIASES,
    DTYPES,
    array_dtype_matches,
    byte_swapped,
    dtype_from_numpy,
    dtype_info,
    native_dtype,
    numpy_dtype,
    torch_dtype_info,
)

HOST = -1
"""``ArrayInfo.device`` of host memory."""
UNKNOWN_DEVICE = -2
"""A CUDA pointer whose device must be asked from the driver (``__cuda_array_interface__``)."""
FOREIGN_DEVICE = -3
"""Memory of a non-CUDA device (MPS, ROCm, XLA...)."""
ANY_DEVICE = -4
"""CUDA managed memory: usable from every device."""


class ArrayInfo(NamedTuple):
    """What the launcher needs to know about an array argument (a NamedTuple: cheap to build on
    every launch). ``strides`` are in elements; ``host`` is a numpy view of host memory (the
    source/target of the copies) or None for device memory; ``stream`` is the producer stream a
    ``__cuda_array_interface__`` asks us to order after; ``keepalive`` holds a DLPack capsule;
    ``negated``: a torch tensor whose negative or conjugate bit is set (its memory holds the values
    before a lazy negation / conjugation, which reading it by pointer would miss: refused, SP0751)."""

    ptr: int
    dtype: str | None
    dtype_label: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    contiguous: bool
    device: int
    device_label: str
    readonly: bool
    source: str
    stream: int | None = None
    host: np.ndarray | None = None
    keepalive: Any = None
    negated: bool = False
    immutable: bool = False
    """A JAX array (``readonly`` too): immutable, its memory possibly shared with other arrays."""
    array_copy: bool = False
    """An object read through its ``__array__`` (``readonly`` too): ``host`` is what that returned,
    possibly a copy, which nothing could write back (:func:`read_only_error` says so)."""
    exported_copy: bool = False
    """A DLPack export that is a copy the producer made (its IS_COPIED flag; ``readonly`` too): what a
    kernel wrote into it would never reach the producer's object."""

    @property
    def nbytes(self) -> int:
        itemsize = DTYPES[self.dtype].itemsize if self.dtype else 0
        return math.prod(self.shape) * itemsize


def byte_range(address: int, shape: Sequence[int], byte_strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """(first byte, one past the last byte) of the memory an array at ``address`` spans (strides in
    bytes, any sign); (address, address) for an empty one."""
    lo = hi = address
    if any(n == 0 for n in shape):
        return lo, hi
    for n, st in zip(shape, byte_strides, strict=True):
        lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
    return lo, hi + itemsize


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major dense (strides in elements); extents of 1 may carry any stride."""
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent == 0:
            return True
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def host_view(ptr: int, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None = None) -> np.ndarray:
    """A writable numpy view of host memory at ``ptr``: dense row-major, or with ``strides`` (in
    elements, any sign) where given (a strided CPU tensor, which the launcher stages by value as a
    strided numpy array: staging.device_values); the interpreter's view of such memory is the same
    (frontend/interp/dlpack_host.py ``memory_view``)."""
    return memory_view(ptr, numpy_dtype(ARRAY_DTYPE_ALIASES.get(dtype, dtype)), shape, strides)


def _describe_numpy(arr: np.ndarray, stream: int) -> ArrayInfo:
    """A numpy array: host memory, copied to the device for a launch (backend/runtime/staging.py). A
    byte-swapped one (``dtype('>f4')``) has the element type of its values: it is staged as a copy
    converted to the machine's byte order and, when written, copied back converted to its own, as
    the interpreter does (frontend/interp/host_arrays.py)."""
    itemsize = arr.itemsize or 1
    dtype = dtype_from_numpy(arr.dtype)
    label = arr.dtype.name
    if byte_swapped(arr.dtype):
        dtype, label = dtype_from_numpy(native_dtype(arr.dtype)), f"{label} (byte-swapped)"
    return ArrayInfo(arr.ctypes.data, dtype, label, arr.shape,
                     tuple(s // itemsize for s in arr.strides), arr.flags.c_contiguous, HOST, "host",
                     not arr.flags.writeable, "numpy array", None, arr)


def _describe_masked(arr: np.ma.MaskedArray, stream: int) -> ArrayInfo:
    """A numpy masked array: its data, where no element is masked; LaunchError SP0708 otherwise (a
    launch reads and writes the memory under the mask: ``kernel[grid]`` refuses it when binding,
    frontend/sema/specialize.py, and a prepared launch's later calls here)."""
    if np.ma.is_masked(arr):
        raise LaunchError(ARG_KIND, f"a masked array with {np.ma.count_masked(arr)} masked elements: a kernel reads "
                          "and writes the memory under the mask and ignores the mask",
                          "pass x.filled(value) for the masked elements, or x.data to use the values under the mask")
    return _describe_numpy(arr.view(np.ndarray), stream)


def _describe_torch(t: Any, stream: int) -> ArrayInfo:
    if t.is_neg() or t.is_conj():
        return _describe_torch_plain(t, stream)._replace(negated=True)
    return _describe_torch_plain(t, stream)


def _describe_torch_plain(t: Any, stream: int) -> ArrayInfo:
    dtype, label = torch_dtype_info(t.dtype)
    if t.is_cuda:
        index = t.get_device()
        return ArrayInfo(t.data_ptr(), dtype, label, tuple(t.shape), tuple(t.stride()), t.is_contiguous(),
                         index, f"cuda:{index}", False, "torch tensor")
    device = t.device
    if device.type != "cpu":
        return ArrayInfo(t.data_ptr(), dtype, label, tuple(t.shape), tuple(t.stride()), t.is_contiguous(),
                         FOREIGN_DEVICE, str(device), False, "torch tensor")
    shape, contiguous = tuple(t.shape), t.is_contiguous()
    view = host_view(t.data_ptr(), dtype, shape, tuple(t.stride())) if dtype else None
    return ArrayInfo(t.data_ptr(), dtype, label, shape, tuple(t.stride()), contiguous, HOST, "cpu",
                     False, "CPU torch tensor", None, view, t)


def is_torch_type(cls: type) -> bool:
    """Whether instances of ``cls`` are described as torch tensors (the extractor of a class not
    seen before is chosen here, as :func:`describe_array` would: a class is torch's from its first
    use, not from its first description)."""
    extractor = _extractors.get(cls)
    if extractor is None:
        extractor = _extractors[cls] = _choose_extractor(cls)
    return extractor is _describe_torch


def torch_device_pointer(t: Any, device: int, dtype: str, contiguous: bool) -> int | None:
    """The launcher's fast path for a torch tensor: its data pointer when it is a CUDA tensor on
    ``device`` of language dtype ``dtype`` (and dense when ``contiguous``), else None (the
    caller then takes the general path, which also produces the error message). A tensor with its
    negative bit set takes the general path (SP0751); a conjugate bit needs a complex dtype, which
    fails the dtype test."""
    if t.is_cuda and t.get_device() == device and torch_dtype_info(t.dtype)[0] == dtype and (
            not contiguous or t.is_contiguous()) and not t.is_neg():
        return t.data_ptr()
    return None


def _describe_cai(obj: Any, stream: int) -> ArrayInfo:
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # e.g. torch raises for bfloat16: DLPack describes those
        if hasattr(type(obj), "__dlpack__"):
            return _describe_dlpack(obj, stream)
        raise
    if cai.get("mask") is not None:
        raise LaunchError(ARG_KIND, f"masked {type(obj).__name__} arrays are not supported")
    dt = np.dtype(cai["typestr"])
    dtype = dtype_from_numpy(dt)
    if dtype is None and hasattr(type(obj), "__dlpack__"):
        return _describe_dlpack(obj, stream)
    shape = tuple(int(s) for s in cai["shape"])
    ptr, readonly = cai["data"]
    itemsize = dt.itemsize or 1
    byte_strides = cai.get("strides")
    if byte_strides is None:
        strides, contiguous = dlpack.compact_strides(shape), True
    else:
        strides = tuple(int(s) // itemsize for s in byte_strides)
        contiguous = all(int(s) % itemsize == 0 for s in byte_strides) and is_c_contiguous(shape, strides)
    return ArrayInfo(int(ptr or 0), dtype, dt.name, shape, strides, contiguous, UNKNOWN_DEVICE, "cuda",
                     bool(readonly), f"{type(obj).__name__} (__cuda_array_interface__)", cai.get("stream"))


def _describe_dlpack(obj: Any, stream: int) -> ArrayInfo:
    try:
        t = dlpack.from_object(obj, stream)
    except (dlpack.DLPackError, BufferError, RuntimeError, ValueError) as exc:
        raise LaunchError(ARG_KIND, f"could not read {type(obj).__name__} through DLPack: {exc}") from None
    contiguous = is_c_contiguous(t.shape, t.strides)
    source = f"{type(obj).__name__} (DLPack)"
    if t.is_host:
        view = host_view(t.data, t.dtype, t.shape, t.strides) if t.dtype else None
        return ArrayInfo(t.data, t.dtype, t.dtype_label, t.shape, t.strides, contiguous, HOST,
                         t.device_label, t.readonly or t.copied, source, None, view, (t.capsule, obj),
                         exported_copy=t.copied)
    if t.device_type == dlpack.DEVICE_CUDA:
        device = t.device_id
    elif t.device_type == dlpack.DEVICE_CUDA_MANAGED:
        device = ANY_DEVICE
    else:
        device = FOREIGN_DEVICE
    return ArrayInfo(t.data, t.dtype, t.dtype_label, t.shape, t.strides, contiguous, device, t.device_label,
                     t.readonly or t.copied, source, None, None, t.capsule, exported_copy=t.copied)


def _describe_array_interface(obj: Any, stream: int) -> ArrayInfo:
    """An object that describes its host memory to numpy (``__array_interface__`` or
    ``__array_struct__``, no DLPack): that memory, viewed with ``np.asarray`` (read-only where the
    interface says so) and staged by value as a numpy array's, the results copied back into it, as the
    interpreter views it in place (frontend/interp/host_arrays.py)."""
    if hasattr(obj, "__cuda_array_interface__"):  # (an instance attribute: device memory, used in place)
        return _describe_cai(obj, stream)
    try:
        view = np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise LaunchError(ARG_KIND, f"could not read {type(obj).__name__} through its array interface: {exc}") from None
    info = _describe_numpy(view.view(np.ndarray) if type(view) is not np.ndarray else view, stream)
    return info._replace(source=f"{type(obj).__name__} (array interface)", keepalive=obj)


def _describe_array_copy(obj: Any, stream: int) -> ArrayInfo:
    """An object with only ``__array__`` (no buffer, DLPack or array interface): read through what
    ``__array__`` returns, copied (it may be the object's memory or a copy: nothing can tell), read-only,
    so that a kernel writing it is SP0719 in the interpreter's words (:func:`read_only_error`); the
    interpreter reads it the same way."""
    if hasattr(obj, "__cuda_array_interface__"):  # (an instance attribute: device memory, used in place)
        return _describe_cai(obj, stream)
    try:
        copy = np.array(obj)
    except (TypeError, ValueError) as exc:
        raise LaunchError(ARG_KIND, f"could not read {type(obj).__name__} through its __array__: {exc}") from None
    if copy.dtype == object:
        return _not_an_array(obj, stream)  # (SP0708 where the argument is checked)
    copy.flags.writeable = False
    return _describe_numpy(copy, stream)._replace(source=f"{type(obj).__name__} (__array__)", array_copy=True)


def is_jax_type(cls: type) -> bool:
    """Whether instances of ``cls`` are JAX arrays (``jax.Array``'s implementation lives in jaxlib)."""
    return cls.__module__.split(".")[0] in ("jax", "jaxlib")


def _immutable(extractor: Callable[[Any, int], ArrayInfo | None]) -> Callable[[Any, int], ArrayInfo | None]:
    """``extractor`` for a JAX array: read-only and immutable (JAX's DLPack and CUDA array
    interface exports do not mark it read-only), its host view too, so that a kernel writing it is
    SP0719 (:func:`read_only_error`) before any copy, as in the interpreter."""

    def describe(value: Any, stream: int) -> ArrayInfo | None:
        info = extractor(value, stream)
        if info is None:
            return None
        host = info.host
        if host is not None:
            host = host.view()
            host.flags.writeable = False
        return info._replace(readonly=True, immutable=True, host=host)

    return describe


def _not_an_array(value: Any, stream: int) -> ArrayInfo | None:
    # Objects may carry the protocol as an instance attribute (a common Numba-docs pattern).
    if hasattr(value, "__cuda_array_interface__"):
        return _describe_cai(value, stream)
    return None


_extractors: dict[type, Callable[[Any, int], ArrayInfo | None]] = {}


def _choose_extractor(cls: type) -> Callable[[Any, int], ArrayInfo | None]:
    extractor = _protocol_extractor(cls)
    return _immutable(extractor) if is_jax_type(cls) and extractor is not _not_an_array else extractor


def _protocol_extractor(cls: type) -> Callable[[Any, int], ArrayInfo | None]:
    if issubclass(cls, np.ndarray):
        return _describe_masked if issubclass(cls, np.ma.MaskedArray) else _describe_numpy
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(cls, torch.Tensor):
        return _describe_torch
    if hasattr(cls, "__cuda_array_interface__"):
        return _describe_cai
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _describe_dlpack
    if has_memory_interface(cls):
        return _describe_array_interface
    if hasattr(cls, "__array__"):
        return _describe_array_copy
    return _not_an_array


def register_array_type(cls: type, extractor: Callable[[Any, int], ArrayInfo | None]) -> None:
    """Describe instances of exactly ``cls`` with ``extractor`` (the runtime registers its
    ``DeviceBuffer`` this way, skipping the generic protocols)."""
    _extractors[cls] = extractor


def describe_array(value: Any, stream: int = 0) -> ArrayInfo | None:
    """Describe an array-like argument, or None if ``value`` is not one. ``stream`` is the launch
    stream handle (DLPack producers order their pending work before it)."""
    cls = type(value)
    extractor = _extractors.get(cls)
    if extractor is None:
        extractor = _extractors[cls] = _choose_extractor(cls)
    return extractor(value, stream)


# ---------------------------------------------------------------------------------------------
# Checks on array arguments


def read_only_error(name: str, info: ArrayInfo) -> LaunchError:
    """SP0719 for a read-only array (``info``) passed for parameter ``name``, which the kernel writes.
    A JAX array gets the interpreter's help (frontend/interp/host_arrays.py): JAX allocates the
    outputs of sparsile.jax.call."""
    if info.array_copy:
        return array_copy_written(name, info.source.split(" (")[0])
    if info.exported_copy:
        return exported_copy_written(name, info.source.split(" (")[0])
    if info.immutable:
        return LaunchError(READ_ONLY, f"argument `{name}` is a read-only {info.source.split(' (')[0]} (a JAX array: "
                           "immutable, and JAX may share its memory with other arrays, constants or caches), but "
                           "the kernel writes through it", "pass a numpy array or a torch tensor (e.g. `np.array(x)`), "
                           "or call the kernel through sparsile.jax.call, whose outputs JAX allocates")
    return LaunchError(READ_ONLY, f"argument `{name}` is a read-only {info.source}, but the kernel writes through it",
                       "pass a writable copy")


def check_array_argument(name: str, dtype: str, info: ArrayInfo, *, device: int, allow_host: bool,
                         writes: bool, aligned16: bool = False, contiguous: bool = True) -> None:
    """All checks of an array passed for a ``ptr[dtype]`` (or tensor-map) parameter of a kernel
    that runs on CUDA device ``device``; raises the first violation."""
    if not array_dtype_matches(dtype, info.dtype):
        expected = dtype_info(ARRAY_DTYPE_ALIASES.get(dtype, dtype)).numpy_name
        raise LaunchError(ARG_DTYPE, f"argument `{name}` expects a pointer to {dtype}, got a "
                          f"{info.dtype_label} {info.source}", f"convert it to {expected} first")
    if info.negated:
        raise LaunchError(ARG_NEGATED, f"argument `{name}` is a torch tensor with its negative (or conjugate) bit "
                          "set, a lazy view (e.g. torch._neg_view(t), z.conj().imag) whose memory holds the values "
                          "before the negation; a kernel reads the memory by pointer and would miss it",
                          f"pass `{name}.resolve_neg()` (a copy with the negation applied; resolve_conj() for a "
                          "conjugate bit)")
    if info.readonly and writes:
        raise read_only_error(name, info)
    if info.device == HOST:
        if not allow_host:
            raise LaunchError(ARG_HOST_MEMORY, f"argument `{name}` is a {info.source} in host memory, but "
                              "this launcher uses device memory in place only",
                              "move it to the GPU first (torch: x.cuda(), cupy: cupy.asarray(x)) or build "
                              "the launcher with allow_host_copies=True")
        if info.host is None:  # (host arrays of any strides are staged by value: staging.device_values)
            raise LaunchError(ARG_CONTIGUOUS, f"argument `{name}` is a {info.source} in host memory that the "
                              "launcher cannot view to copy it to the device", "pass np.ascontiguousarray(x) (and "
                              "copy results back yourself)")
        return
    if info.device == FOREIGN_DEVICE:
        raise LaunchError(ARG_DEVICE, f"argument `{name}` lives on {info.device_label}, not on a CUDA "
                          "device", "move it to the CUDA device the kernel runs on")
    if info.device >= 0 and info.device != device:
        raise LaunchError(ARG_DEVICE, f"argument `{name}` is on cuda:{info.device} but the kernel runs on "
                          f"cuda:{device}", f"move it to cuda:{device}: a launcher or prepared launch runs on the "
                          f"device it was built for (kernel[grid](...) runs on its arrays' device; prepare "
                          f"another launch, or load the kernel, on cuda:{info.device})")
    if contiguous and not info.contiguous:
        raise LaunchError(ARG_CONTIGUOUS, f"argument `{name}` is not contiguous (shape {info.shape}, "
                          f"strides {info.strides} elements)", "pass a contiguous copy (x.contiguous())")
    if aligned16 and info.ptr % 16:
        raise LaunchError(ARG_ALIGNMENT, f"argument `{name}` points to {info.ptr:#x}, which is not "
                          "16-byte aligned, but the kernel was specialized assuming 16-byte alignment",
                          "pass an array whose data starts on a 16-byte boundary (a fresh allocation, "
                          "or a slice at a multiple of 16 bytes)")
