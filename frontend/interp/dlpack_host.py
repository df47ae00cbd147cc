"""Host memory another library exports through DLPack, as a numpy view for the interpreter.

``np.from_dlpack`` views what numpy can type; an element type numpy lacks (bfloat16, float8 from
torch or another producer) is read with sparsile's own DLPack reader (frontend/dlpack.py, the one
the GPU launcher stages such memory with: backend/runtime/arrays.py) and viewed as the ml_dtypes
type the interpreter holds it in, in its own shape and strides, read-only where the export says so.
So both paths read (and write) the same memory with its dtype kept.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from .. import dlpack
from ..diagnostics import LaunchError
from ..ir import types as T


def dlpack_host_view(obj: Any) -> np.ndarray | None:
    """A numpy view of the host memory ``obj`` exports through DLPack, or None: not a DLPack
    producer on the CPU, an element type the language has none for, or a JAX array (immutable,
    though its export does not say so: the interpreter reads it through a read-only copy)."""
    if type(obj).__module__.split(".")[0] in ("jax", "jaxlib") or not hasattr(obj, "__dlpack__"):
        return None
    try:
        if int(obj.__dlpack_device__()[0]) != dlpack.DEVICE_CPU:
            return None
    except Exception:  # (what the producer raises: then it is no host array to view)
        return None
    try:  # (sparsile's reader: it sees DLPack 1.0's flags, which np.from_dlpack ignores)
        tensor: dlpack.DLPackTensor | None = dlpack.from_object(obj)
    except Exception:  # (what the producer raises: numpy's reader, which follows, reports it or not)
        tensor = None
    if tensor is None or not tensor.copied:
        try:
            return np.from_dlpack(obj)
        except Exception:  # (BufferError, TypeError, ...: a dtype numpy lacks; sparsile's reader decides)
            pass
    if tensor is None or not tensor.is_host or tensor.dtype is None:
        return None
    return _view(tensor, T.numpy_dtype(T.SCALAR_TYPES[tensor.dtype]), obj)


def exports_copy(obj: Any) -> bool:
    """Whether ``obj``'s DLPack export is a copy the producer made (DLPack 1.0's IS_COPIED flag: a
    producer may copy where it cannot export its memory), which results written by a kernel would
    never leave: both paths read it and refuse a write (SP0719, :func:`exported_copy_written`)."""
    try:
        return dlpack.from_object(obj).copied
    except Exception:  # (what the producer raises: the readers that follow report it)
        return False


def exported_copy_written(name: str, type_name: str) -> LaunchError:
    """SP0719 for an object whose DLPack export is a copy (:func:`exports_copy`) passed for parameter
    ``name``, which the kernel writes: the words of both paths (backend/runtime/arrays.py)."""
    return LaunchError("SP0719", f"argument `{name}` (a {type_name}) exports a copy through DLPack (its IS_COPIED "
                       "flag), which cannot be written back, but the kernel writes through it",
                       help="pass a numpy array or a torch tensor (e.g. `np.array(x)`) and read the results from it")


def _view(tensor: dlpack.DLPackTensor, dt: np.dtype, owner: Any) -> np.ndarray:
    """The memory ``tensor`` describes as a numpy array of ``dt``, keeping the capsule and ``owner``
    alive as long as the view; read-only where the export says so or is a copy."""
    view = memory_view(tensor.data, dt, tensor.shape, tensor.strides, keep=(tensor.capsule, owner))
    if tensor.readonly or tensor.copied:  # (a copy: what a kernel wrote would never leave it)
        view.flags.writeable = False
    return view


def memory_view(address: int, dt: np.dtype, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
                keep: Any = None) -> np.ndarray:
    """A writable numpy array of ``dt`` over host memory at ``address``: dense row-major, or with
    ``strides`` (in elements, any sign) where given; ``keep`` is held as long as the array (the GPU
    launcher views CPU tensors and DLPack exports with it too: backend/runtime/arrays.py ``host_view``)."""
    count = math.prod(shape)
    if count == 0 or address == 0:
        return np.empty(shape, dtype=dt)
    if strides is None or _dense(shape, strides):  # (the fast path: a launch views every CPU tensor)
        raw = (ctypes.c_ubyte * (count * dt.itemsize)).from_address(address)
        if keep is not None:
            raw.keep = keep  # type: ignore[attr-defined]
        return np.frombuffer(raw, dtype=dt).reshape(shape)
    low = sum(min(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    high = sum(max(0, (n - 1) * st) for n, st in zip(shape, strides, strict=True))
    raw = (ctypes.c_ubyte * ((high - low + 1) * dt.itemsize)).from_address(address + low * dt.itemsize)
    if keep is not None:
        raw.keep = keep  # type: ignore[attr-defined]  # (the numpy array holds raw)
    bits = np.dtype(f"u{dt.itemsize}")  # (as_strided loses an ml_dtypes type: e5m2's '<f1' is not understood)
    first = np.frombuffer(raw, dtype=bits)[-low:]
    return np.lib.stride_tricks.as_strided(first, shape, tuple(st * dt.itemsize for st in strides)).view(dt)


def _dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Row-major dense (strides in elements); extents of 1 may carry any stride."""
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides), strict=True):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True
