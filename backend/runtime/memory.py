"""Device memory: :class:`DeviceBuffer`, a ``cuMemAlloc`` allocation that torch, CuPy and the
launcher use in place (``__cuda_array_interface__``, ``__dlpack__``), freed in its own context."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ...frontend import dlpack
from ...frontend.diagnostics import LaunchError
from .arrays import ArrayInfo, register_array_type
from .capture_mode import thread_local_capture_mode
from .codes import ARG_SHAPE
from .devices import check, context_of, device_state, in_context
from .dtypes import DTYPES, byte_swapped, dtype_from_numpy, native_dtype, native_order, numpy_dtype
from .launch_config import stream_handle
from .release import defer, drain


def _free_device_memory(ptr: int, context: Any) -> None:
    in_context(context, lambda: driver.cuMemFree(ptr))


def _collected(ptr: int, context: Any) -> None:
    """The finalizer: garbage collection may run inside a CUDA graph capture, where ``cuMemFree``
    would invalidate the capture, so the free waits for the next safe point (release.py)."""
    defer(lambda: _free_device_memory(ptr, context))


class DeviceBuffer:
    """A device allocation (``cuMemAlloc``), optionally typed (``dtype``: a language dtype
    name, ``shape``). It exposes ``__cuda_array_interface__`` and ``__dlpack__``, so torch / CuPy
    / the launcher use it in place. Freed by :meth:`free` (at once), or after garbage collection at
    the next allocation or ``synchronize`` (backend/runtime/release.py)."""

    def __init__(self, nbytes: int, *, dtype: str | None = None, shape: Sequence[int] | None = None,
                 device: int | None = None):
        state = device_state(device)
        self.nbytes = int(nbytes)
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.device = state.info.ordinal
        self._state = state
        # THREAD_LOCAL capture mode: neither the frees nor cuMemAlloc may invalidate another thread's
        # global-mode capture (torch.cuda.graph); in a capture of this thread they stay refused (capture_mode.py)
        with thread_local_capture_mode():
            drain()  # memory of collected buffers first: cuMemAlloc is no more legal in a capture than cuMemFree
            with context_of(state):  # (the thread's own context restored after, as torch.empty(device=) does)
                self.ptr = int(check("cuMemAlloc", driver.cuMemAlloc(max(self.nbytes, 1))))
        self._finalizer = weakref.finalize(self, _collected, self.ptr, state.context)

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: str, device: int | None = None) -> DeviceBuffer:
        return cls(math.prod(shape) * DTYPES[dtype].itemsize, dtype=dtype, shape=shape, device=device)

    @classmethod
    def from_numpy(cls, array: np.ndarray, device: int | None = None, stream: Any = None) -> DeviceBuffer:
        """A buffer holding a copy of ``array`` (its values: a byte-swapped array, ``dtype('>f4')``, in
        the device's byte order, typed as the native dtype)."""
        array = native_order(np.ascontiguousarray(array))
        buf = cls(array.nbytes, dtype=dtype_from_numpy(array.dtype), shape=array.shape, device=device)
        buf.copy_from_host(array, stream)
        return buf

    def _numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype) if self.dtype else np.dtype(np.uint8)

    def copy_from_host(self, array: np.ndarray, stream: Any = None) -> None:
        """Copy the values of ``array`` (a byte-swapped one converted) to the start of the buffer."""
        array = native_order(np.ascontiguousarray(array))
        if array.nbytes > self.nbytes:
            raise LaunchError(ARG_SHAPE, f"cannot copy {array.nbytes} bytes into a {self.nbytes}-byte buffer")
        copy_host_to_device(self.ptr, array, stream, self.device)

    def copy_to_host(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        """Copy to ``out`` (or a new array of the buffer's dtype and shape) and synchronize. A
        byte-swapped ``out`` (``dtype('>f4')``) gets the values (through a native copy): the device's
        bytes copied into it raw would read as other numbers."""
        if out is None:
            shape = self.shape if self.shape is not None else (self.nbytes,)
            out = np.empty(shape, dtype=self._numpy_dtype())
        if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes > self.nbytes:
            raise LaunchError(ARG_SHAPE, "copy_to_host needs a writable C-contiguous array of at most "
                              f"{self.nbytes} bytes")
        if not byte_swapped(out.dtype):
            copy_device_to_host(self.ptr, out, stream, self.device)
        else:
            native = np.empty(out.shape, native_dtype(out.dtype))
            copy_device_to_host(self.ptr, native, stream, self.device)
            out[...] = native
        return out

    to_numpy = copy_to_host

    def fill_byte(self, value: int, stream: Any = None) -> None:
        """Set every byte to ``value``. Without ``stream`` (poisoning outputs in tests) the memset
        runs on the legacy default stream, which is then synchronized (not the whole device: that
        would invalidate another thread's CUDA graph capture in any mode; in THREAD_LOCAL mode this
        call does not, capture_mode.py). With ``stream`` (a handle or stream object, as a launch's
        ``stream=``; 0 is the legacy default stream) the memset is queued on that stream, ordered
        after the work queued there before and before the work queued after, and not waited for
        (the autotuner's ``reset_to_zero``, docs/autotune.md)."""
        if stream is None:
            with thread_local_capture_mode(), context_of(self._state):
                check("cuMemsetD8", driver.cuMemsetD8(self.ptr, value & 0xFF, max(self.nbytes, 1)))
                check("cuStreamSynchronize", driver.cuStreamSynchronize(0))
        else:
            fill_device_bytes(self.ptr, self.nbytes, value, stream, self.device)

    def free(self) -> None:
        """Free the memory now (the buffer must not be used afterwards)."""
        if self._finalizer.detach() is not None:
            _free_device_memory(self.ptr, self._state.context)

    def __enter__(self) -> DeviceBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    @property
    def ndim(self) -> int:
        """The rank of the typed shape (1 for an untyped buffer of bytes)."""
        return len(self._typed_shape())

    def _typed_shape(self) -> tuple[int, ...]:
        if self.dtype is None:
            return (self.nbytes,)
        return self.shape if self.shape is not None else (self.nbytes // DTYPES[self.dtype].itemsize,)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        dt = self._numpy_dtype()
        return {"shape": self._typed_shape(), "typestr": dt.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        return dlpack.export_capsule(self.ptr, self._typed_shape(), self.dtype or "u8", dlpack.DEVICE_CUDA,
                                     self.device, owner=self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack.DEVICE_CUDA, self.device

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.nbytes} bytes at {self.ptr:#x} on cuda:{self.device}, " \
               f"dtype={self.dtype}, shape={self.shape})"


def copy_host_to_device(ptr: int, array: np.ndarray, stream: Any = None, device: int | None = None) -> None:
    """Copy the C-contiguous host ``array`` to device memory at ``ptr`` (of GPU ``device``; None:
    the current one) on ``stream`` (None: the legacy default stream) and wait for that stream."""
    handle = stream_handle(stream)
    # THREAD_LOCAL capture mode: the copy and the synchronize of the caller's stream neither fail nor
    # invalidate another thread's global-mode capture (capture_mode.py); this thread's own capture refuses them
    with thread_local_capture_mode(), context_of(device_state(device)):
        check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(ptr, array.ctypes.data, array.nbytes, handle))
        check("cuStreamSynchronize", driver.cuStreamSynchronize(handle))


def copy_device_to_host(ptr: int, out: np.ndarray, stream: Any = None, device: int | None = None) -> None:
    """Copy ``out.nbytes`` bytes of device memory at ``ptr`` (of GPU ``device``; None: the current
    one) into the C-contiguous ``out`` on ``stream`` (None: the legacy default stream) and wait for
    that stream."""
    handle = stream_handle(stream)
    with thread_local_capture_mode(), context_of(device_state(device)):  # (as copy_host_to_device)
        check("cuMemcpyDtoHAsync", driver.cuMemcpyDtoHAsync(out.ctypes.data, ptr, out.nbytes, handle))
        check("cuStreamSynchronize", driver.cuStreamSynchronize(handle))


def fill_device_bytes(ptr: int, nbytes: int, value: int, stream: Any, device: int | None = None) -> None:
    """Queue a memset of ``nbytes`` bytes at ``ptr`` (of GPU ``device``; None: the current one) to
    ``value`` on ``stream`` (a handle or stream object; None or 0: the legacy default stream),
    ``cuMemsetD8Async``: ordered with the stream's other work, not waited for. In THREAD_LOCAL
    capture mode, as the copies (capture_mode.py)."""
    handle = stream_handle(stream)
    with thread_local_capture_mode(), context_of(device_state(device)):
        check("cuMemsetD8Async", driver.cuMemsetD8Async(ptr, value & 0xFF, max(nbytes, 1), handle))


def _describe_device_buffer(buf: DeviceBuffer, stream: int) -> ArrayInfo:
    shape = buf._typed_shape()
    return ArrayInfo(buf.ptr, buf.dtype, buf.dtype or "untyped", shape,
                     dlpack.compact_strides(shape), True, buf.device, f"cuda:{buf.device}", False,
                     "DeviceBuffer")


register_array_type(DeviceBuffer, _describe_device_buffer)
