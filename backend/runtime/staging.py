"""Host arrays staged for a launch: each is copied to a fresh device buffer on the launch stream
before the launch and, when the kernel writes it, back after it; the launch then synchronizes.
:func:`shared_host_copy` decides which host arguments share one copy (the same memory passed
twice) and refuses a partial overlap with a write (SP0750). :class:`Call` is a launcher's
per-launch scratch that records the copies.

A launch of an empty grid (a 0 dimension) runs nothing: its host arrays get every check of a staged
one (:func:`check_host_array`: the same SP0750) but no buffer, copy or synchronize, and host
outputs are left as they were (docs/language.md, "Specialization and launching")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ...frontend.diagnostics import LaunchError
from . import dlpack
from .arrays import ANY_DEVICE, ArrayInfo, byte_range, register_array_type
from .codes import ARG_OVERLAP
from .devices import check
from .dtypes import byte_swapped, dtype_from_numpy, native_order
from .memory import DeviceBuffer


class Call:
    """Launch scratch (one per launcher, reused under its lock): the stream, host copies to undo,
    producer streams to wait on, objects to keep alive until the launch is queued, and array
    infos for derived parameters."""

    __slots__ = ("hosts", "infos", "keep", "staged", "stream", "waits")

    def __init__(self, stream: int, n_infos: int):
        self.stream = stream
        self.staged: list[tuple[DeviceBuffer, np.ndarray, bool, str]] | None = None  # (copy, host, written, name)
        self.hosts: list[tuple[str, np.ndarray, bool]] | None = None
        """A launch of an empty grid: ``[]``, then the host arrays checked (not staged), (name,
        host, written) each; None for a launch that runs."""
        self.waits: list[int] | None = None
        self.keep: list[Any] | None = None
        self.infos: list[ArrayInfo | None] | None = [None] * n_infos if n_infos else None


def stage_host_array(name: str, info: ArrayInfo, writes: bool, call: Call, device: int) -> int:
    """Copy a host array to a fresh device buffer (on the launch stream); remember to copy it
    back after the launch when the kernel writes it. The same host memory passed twice shares one
    copy; a partial overlap with a write is SP0750 (:func:`shared_host_copy`)."""
    host = info.host
    if call.staged is None:
        call.staged = []
    same = shared_host_copy([(n, h, w) for _, h, w, n in call.staged], name, host, writes)
    if same is not None:
        buf, h, written, first = call.staged[same]
        call.staged[same] = (buf, h, written or writes, first)
        return buf.ptr
    buf = DeviceBuffer(host.nbytes, device=device)
    call.staged.append((buf, host, writes, name))
    if host.nbytes:
        source = native_order(host)  # (a byte-swapped array: its values, in the device's byte order)
        if source is not host:
            call.keep = [*(call.keep or ()), source]
        check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(buf.ptr, source.ctypes.data, host.nbytes,
                                                             call.stream))
    return buf.ptr


def check_host_array(name: str, info: ArrayInfo, writes: bool, call: Call) -> int:
    """:func:`stage_host_array` for a launch of an empty grid (``call.hosts`` is a list): the same
    checks (SP0750), no buffer and no copy; returns the host address (never launched)."""
    hosts = call.hosts
    assert hosts is not None
    same = shared_host_copy(hosts, name, info.host, writes)
    if same is None:
        hosts.append((name, info.host, writes))
    elif writes:
        first, host, _ = hosts[same]
        hosts[same] = (first, host, True)
    return info.ptr


class Unstaged:
    """The device copy of a host array that a launch of an empty grid does not make: what
    ``kernel[grid](...)`` passes the launcher in place of a host array read through TMA, which it
    copies to the device as a whole (driver/launch.py). Described as that copy would be (dense,
    writable, of the host array's dtype and shape, on the launcher's device) at address 0: its
    tensor maps are validated, never encoded (:func:`is_unstaged`)."""

    __slots__ = ("host",)

    def __init__(self, host: np.ndarray):
        self.host = host


def _describe_unstaged(value: Unstaged, stream: int) -> ArrayInfo:
    host = value.host
    native = host.dtype.newbyteorder("=") if byte_swapped(host.dtype) else host.dtype
    dtype = dtype_from_numpy(native)  # (typed as DeviceBuffer.from_numpy types the copy: '>f2' as f16)
    return ArrayInfo(0, dtype, dtype or "untyped", host.shape, dlpack.compact_strides(host.shape), True, ANY_DEVICE,
                     "cuda", False, "DeviceBuffer", None, host)


def is_unstaged(info: ArrayInfo) -> bool:
    """Whether ``info`` describes a host array a launch of an empty grid did not stage: host memory
    itself or an :class:`Unstaged` copy (whose info keeps its host array with a device)."""
    return info.host is not None


register_array_type(Unstaged, _describe_unstaged)


def finish_host_copies(call: Call, launched: bool) -> None:
    """Copy written host arrays back, synchronize the stream, free the staging buffers. After a
    failed launch (an exception is already propagating) only synchronize and free."""
    try:
        if launched:
            converted: list[tuple[np.ndarray, np.ndarray]] = []  # (byte-swapped host array, native copy)
            for buf, host, written, _ in call.staged:
                if written and host.nbytes:
                    target = host
                    if byte_swapped(host.dtype):  # the device's bytes are values in the machine's order
                        target = np.empty(host.shape, host.dtype.newbyteorder("="))
                        converted.append((host, target))
                    check("cuMemcpyDtoHAsync",
                          driver.cuMemcpyDtoHAsync(target.ctypes.data, buf.ptr, host.nbytes, call.stream))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(call.stream))
            for host, target in converted:
                host[...] = target  # (converted to the host array's own byte order)
        else:
            driver.cuStreamSynchronize(call.stream)
    finally:
        for buf, *_ in call.staged:
            buf.free()



def _byte_range(a: np.ndarray) -> tuple[int, int]:
    """(first byte, one past the last byte) of the memory a numpy array spans."""
    return byte_range(a.__array_interface__["data"][0], a.shape, a.strides, a.itemsize)


def shared_host_copy(staged: Sequence[tuple[str, np.ndarray, bool]], name: str, host: np.ndarray,
                     writes: bool) -> int | None:
    """Where the host array ``host`` (argument ``name``) goes among the host arrays
    already staged for this launch, ``(name, array, written)`` each: the index of one covering the
    very same bytes (share its device copy, as the GPU would share the memory), or None (a copy of
    its own). Bytes shared only in part, with either written, are LaunchError SP0750: two copies
    would hide the writes through one from the other, and the last copied back would win."""
    lo, hi = _byte_range(host)
    for i, (other, array, written) in enumerate(staged):
        a, b = _byte_range(array)
        if hi > lo and (a, b) == (lo, hi) and (array.strides == host.strides or (array.flags.c_contiguous
                                               and host.flags.c_contiguous)):
            return i
        if a < hi and lo < b and (writes or written):
            raise LaunchError(ARG_OVERLAP, f"host arrays `{other}` and `{name}` overlap in memory but are not "
                              "the same array, and the kernel writes "
                              f"`{name if writes else other}`; each host array is copied to the device on "
                              "its own, so the writes would be lost",
                              "pass the same array for both, or separate arrays (e.g. `y.copy()`)")
    return None
