"""Direct ``ctypes`` entry points into libcuda for the launch hot path (opt-in: ``SPARSILE_RAW_DRIVER=1``).

``cuda.bindings.driver`` converts and type-checks every argument of every call; the three calls a
launch can make per call (``cuLaunchKernel``, ``cuLaunchKernelEx`` and, when a tensor-map input
moved, ``cuTensorMapEncodeTiled``) are also bound here straight from ``libcuda`` with fixed
``argtypes``: plain ints in, a ``CUresult`` int out. That was meant to be faster; measured, it is
not (the ``argtypes`` conversions cost about what cuda.bindings' checks do), so it is opt-in.

They are used only when the binding in ``cuda.bindings.driver`` is the genuine one
(:func:`bindings_untouched`): a test or a tracing tool that monkeypatches ``driver.cuLaunchKernel``
keeps seeing every launch. Without libcuda (a machine without the NVIDIA driver) :func:`library`
returns None and the runtime keeps using ``cuda.bindings``.

Struct layouts follow ``cuda.h`` (CUDA 12/13): ``CUlaunchConfig`` and ``CUlaunchAttribute`` (a
4-byte id, 4 bytes of padding, a 64-byte value union whose ``clusterDim`` is three unsigned ints and
whose ``programmaticStreamSerializationAllowed`` is its first int);
``tests/backend/test_prepared.py`` checks them against ``cuda.bindings``' own structs.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver

_BOUND = {name: getattr(driver, name) for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuTensorMapEncodeTiled")}
"""The bindings as imported: a call is routed to libcuda only while these are still in place."""

CLUSTER_DIMENSION = int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
PROGRAMMATIC_STREAM_SERIALIZATION = int(
    driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
"""The launch attribute of programmatic dependent launch (``pdl=True``: docs/language.md, "Programmatic
dependent launch"): the kernel
may start while the previous kernel in the stream still runs (it waits with ``griddepcontrol.wait``)."""
LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
"""The driver library's file name (what the ctypes paths load)."""
_OK = driver.CUresult.CUDA_SUCCESS
_OK_TUPLE = (_OK,)


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: id, padding to 8 bytes, the 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("_pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``; field names as in ``cuda.bindings`` so the launcher sets either one."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _result(code: int) -> tuple[Any]:
    """``restype`` of the raw calls: the ``(CUresult,)`` tuple cuda.bindings returns."""
    return _OK_TUPLE if code == 0 else (driver.CUresult(code),)


class Library:
    """The raw entry points (each returns a ``(CUresult,)`` tuple, like cuda.bindings)."""

    def __init__(self, lib: Any):
        vp, u32 = ctypes.c_void_p, ctypes.c_uint
        self.cuLaunchKernel = lib.cuLaunchKernel
        self.cuLaunchKernel.argtypes = [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp]
        self.cuLaunchKernel.restype = _result
        self.cuLaunchKernelEx = lib.cuLaunchKernelEx
        self.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), vp, vp, vp]
        self.cuLaunchKernelEx.restype = _result
        self.cuTensorMapEncodeTiled = lib.cuTensorMapEncodeTiled
        self.cuTensorMapEncodeTiled.argtypes = [vp, ctypes.c_int, u32, vp, vp, vp, vp, vp, ctypes.c_int,
                                                ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.cuTensorMapEncodeTiled.restype = ctypes.c_int


_lock = threading.Lock()
_library: Library | None = None
_tried = False


def library() -> Library | None:
    """libcuda's raw entry points when ``SPARSILE_RAW_DRIVER=1``, else None (every call stays on
    ``cuda.bindings``); None without the driver library too. Loaded once. Off by default: measured on
    the H200 machine a bare ``cuLaunchKernel`` through this path took 5.3–6.3 µs against 4.0–5.7 µs
    through ``cuda.bindings`` (benchmarks/RESULTS.md, bench_launch.py), so it is no win there."""
    global _library, _tried
    if _tried:
        return _library
    with _lock:
        if not _tried and os.environ.get("SPARSILE_RAW_DRIVER", "0") != "1":
            _tried = True
        if not _tried:
            try:
                _library = Library(ctypes.CDLL(LIBCUDA))
            except (OSError, AttributeError):
                _library = None
            _tried = True
    return _library


def bindings_untouched(*names: str) -> bool:
    """Whether ``driver.<name>`` is still the binding imported with the module for every name."""
    return all(getattr(driver, n) is _BOUND[n] for n in names)


def raw(name: str) -> Any:
    """The raw entry point ``name`` when libcuda is loaded and the binding is untouched, else None."""
    lib = library() if bindings_untouched(name) else None
    return getattr(lib, name) if lib is not None else None


def attribute_list(cluster: Sequence[int], pdl: bool) -> list[LaunchAttribute]:
    """The launch attributes of a launch: the cluster dimensions when the cluster has more than one
    CTA, then programmatic stream serialization when ``pdl`` (empty: a plain ``cuLaunchKernel``)."""
    attrs = []
    if math.prod(cluster) > 1:
        attr = LaunchAttribute()
        attr.id = CLUSTER_DIMENSION
        attr.value[0], attr.value[1], attr.value[2] = cluster
        attrs.append(attr)
    if pdl:
        attr = LaunchAttribute()
        attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value[0] = 1  # programmaticStreamSerializationAllowed
        attrs.append(attr)
    return attrs


def launch_config(block: tuple[int, int, int], shared: int, attributes: Sequence[LaunchAttribute]) -> LaunchConfig:
    """A ``CUlaunchConfig`` with ``attributes`` (copied into an array the config keeps alive); the
    caller sets the grid and the stream per launch."""
    array = (LaunchAttribute * len(attributes))(*attributes)
    config = LaunchConfig()
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared
    config.attrs = ctypes.cast(array, ctypes.POINTER(LaunchAttribute))
    config.numAttrs = len(attributes)
    config._attributes = array  # type: ignore[attr-defined]  # the config points at it
    return config


def handle_int(handle: Any) -> int:
    """A driver handle (``CUfunction``, ``CUstream``...) or int as an int."""
    return handle if type(handle) is int else int(handle)
