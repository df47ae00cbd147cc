"""A stand-in for cupy on a faked two-GPU host, as strict as cupy without peer access: an array lives
on one device (numpy data underneath); creating an array (``zeros``, ``empty``, ``full``,
``asarray``, a copying ``ascontiguousarray``) or computing one (``astype``, a comparison, ``sum``,
an assignment into it) happens on cupy's *current* device, and an operation that reads or writes an
array of another device raises, as cupy's "The device where the array resides (1) is different from
the current device (0). Peer access is unavailable between these devices." Views (``view``,
``reshape``, ``transpose``, indexing) stay on their array's device. ``Device(n)`` as a context
makes n current, as ``cupy.cuda.Device`` and an array's ``.device`` do.

Install it with :func:`install` (a monkeypatch of ``sys.modules["cupy"]``); arrays are made with
:func:`on`."""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np

CURRENT = [0]
"""cupy's current device (a stack: the last entry)."""


class PeerAccessError(ValueError):
    """What cupy raises for an operation on an array of another device than the current one."""


class Device:
    def __init__(self, index: int) -> None:
        self.id = index

    def __enter__(self) -> Device:
        CURRENT.append(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        CURRENT.pop()


class _Memory:
    def __init__(self, array: ndarray) -> None:
        self.ptr = array._a.__array_interface__["data"][0] if array._a.size else 0


def _here(*arrays: Any) -> int:
    """The current device, checked against every array an operation touches."""
    device = CURRENT[-1]
    for a in arrays:
        if isinstance(a, ndarray) and a.device.id != device:
            raise PeerAccessError(f"The device where the array resides ({a.device.id}) is different from the current "
                                  f"device ({device}). Peer access is unavailable between these devices.")
    return device


def _raw(v: Any) -> Any:
    return v._a if isinstance(v, ndarray) else v


class ndarray:
    __module__ = "cupy"

    def __init__(self, a: np.ndarray, device: int) -> None:
        self._a, self.device = a, Device(device)

    # attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    data = property(lambda self: _Memory(self))

    @property
    def flags(self) -> Any:
        return _Flags(bool(self._a.flags["C_CONTIGUOUS"]))

    # views: on the array's own device, nothing computed
    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._a.view(dtype), self.device.id)

    def reshape(self, *shape: Any) -> ndarray:
        out = self._a.reshape(*shape)
        if not np.shares_memory(out, self._a) and out.size:
            _here(self)  # (a copy)
        return ndarray(out, self.device.id)

    def transpose(self, *axes: int) -> ndarray:
        return ndarray(self._a.transpose(*axes), self.device.id)

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(self._a[key], self.device.id)

    # computations: on the current device, reading only arrays there
    def __setitem__(self, key: Any, value: Any) -> None:
        _here(self, value)
        self._a[key] = _raw(value)

    def astype(self, dtype: Any) -> ndarray:
        return ndarray(self._a.astype(dtype), _here(self))

    def sum(self) -> ndarray:
        return ndarray(np.asarray(self._a.sum()), _here(self))

    def item(self) -> Any:
        return self._a.item()

    def __int__(self) -> int:  # (a 0-d array, as cupy's: read back to the host)
        return int(self._a)

    def get(self) -> np.ndarray:
        return self._a.copy()

    def _compute(self, other: Any, op: Any) -> ndarray:
        return ndarray(op(self._a, _raw(other)), _here(self, other))

    def __ge__(self, other: Any) -> ndarray:
        return self._compute(other, np.greater_equal)

    def __le__(self, other: Any) -> ndarray:
        return self._compute(other, np.less_equal)

    def __and__(self, other: Any) -> ndarray:
        return self._compute(other, np.logical_and)

    def __invert__(self) -> ndarray:
        return ndarray(~self._a, _here(self))


class _Flags:
    def __init__(self, c: bool) -> None:
        self.c_contiguous = c

    def __getitem__(self, name: str) -> bool:
        assert name == "C_CONTIGUOUS"
        return self.c_contiguous


def on(device: int, a: np.ndarray) -> ndarray:
    """``a`` as an array on ``device``."""
    return ndarray(np.array(a), device)


def _empty(shape: Any, dtype: Any = np.float64) -> ndarray:
    return ndarray(np.zeros(shape, dtype), _here())  # (zeros: the tests read no garbage)


def _full(shape: Any, fill: Any, dtype: Any = None) -> ndarray:
    return ndarray(np.full(shape, fill, dtype), _here())


def _asarray(a: Any, dtype: Any = None) -> ndarray:
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    return ndarray(np.array(a, dtype), _here())


def _ascontiguousarray(a: ndarray) -> ndarray:
    if a._a.flags["C_CONTIGUOUS"]:
        return a  # (cupy returns the array itself)
    return ndarray(np.ascontiguousarray(a._a), _here(a))


def _trunc(a: ndarray) -> ndarray:
    return ndarray(np.trunc(a._a), _here(a))


def install(monkeypatch: Any) -> types.ModuleType:
    """Put the stand-in in ``sys.modules["cupy"]`` (undone with the monkeypatch); current device 0."""
    fake = types.ModuleType("cupy")
    fake.ndarray = ndarray
    fake.empty, fake.zeros, fake.full, fake.asarray = _empty, _empty, _full, _asarray
    fake.ascontiguousarray, fake.trunc = _ascontiguousarray, _trunc
    fake.dtype, fake.uint32 = np.dtype, np.uint32
    fake.cuda = types.SimpleNamespace(Device=Device)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(sys.modules[__name__], "CURRENT", [0])
    return fake
