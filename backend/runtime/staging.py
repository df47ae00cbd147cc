"""Host arrays staged for a launch: each is copied to a fresh device buffer on the launch stream
before the launch and, when the kernel writes it, back after it; the launch then synchronizes.
The copy holds the array's values (:func:`device_values`): a strided numpy array's elements in C
order, a byte-swapped one's in the machine's byte order, as the interpreter reads them
(frontend/interp/host_arrays.py); a written one gets them back into its own elements and order
once the stream has synchronized, the memory between a strided view's elements left alone.
:func:`shared_host_copy` decides which host arguments share one copy (the same view passed
twice) and refuses, with a write, views sharing memory only in part and a view whose own elements
share memory (SP0750). :class:`Call` is a launcher's per-launch scratch that records the copies.

A launch of an empty grid (a 0 dimension) runs nothing: its host arrays get every check of a staged
one (:func:`check_host_array`: the same SP0750) but no buffer, copy or synchronize, and host
outputs are left as they were (docs/language.md, "Specialization and launching")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ...frontend import dlpack
from ...frontend.diagnostics import LaunchError
from ...frontend.interp.overlap import UNDECIDED, UNDECIDED_REASON, self_overlap
from .arrays import ANY_DEVICE, ArrayInfo, byte_range, register_array_type
from .codes import ARG_OVERLAP
from .devices import check
from .dtypes import byte_swapped, dtype_from_numpy, native_dtype, native_order
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
        call.staged[same] = (buf, writable_twin(h, host, writes), written or writes, first)
        return buf.ptr
    buf = DeviceBuffer(host.nbytes, device=device)
    call.staged.append((buf, host, writes, name))
    if host.nbytes:
        source = device_values(host)
        if source is not host:
            call.keep = [*(call.keep or ()), source]
        check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(buf.ptr, source.ctypes.data, host.nbytes,
                                                             call.stream))
    return buf.ptr


def writable_twin(staged: np.ndarray, host: np.ndarray, writes: bool) -> np.ndarray:
    """The array to copy a shared device copy back through: ``host`` where the kernel writes it
    and ``staged``, the same memory seen first, is read-only (a read-only view of the array
    written: copying the results back into it would fail), else ``staged``."""
    return host if writes and not staged.flags.writeable else staged


def device_values(host: np.ndarray) -> np.ndarray:
    """What the device copy of ``host`` holds: its elements in C order and the machine's byte order
    (``host`` itself where it is a C-contiguous array of native byte order, else a converted copy)."""
    return native_order(np.ascontiguousarray(host))


def staged_info(info: ArrayInfo, ptr: int, device: int) -> ArrayInfo:
    """``info`` of a host array staged at ``ptr`` on ``device``, as its copy is: dense, so the
    derived strides (and tensor maps) of a strided array describe the copy's C order."""
    return info._replace(ptr=ptr, device=device, host=None, strides=dlpack.compact_strides(info.shape),
                         contiguous=True)


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
    dtype = dtype_from_numpy(native_dtype(host.dtype))  # (as DeviceBuffer.from_numpy types the copy: '>f2' f16)
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
            converted: list[tuple[np.ndarray, np.ndarray]] = []  # (strided or byte-swapped host array, dense copy)
            for buf, host, written, _ in call.staged:
                if written and host.nbytes:
                    target = host
                    if byte_swapped(host.dtype) or not host.flags.c_contiguous:  # (the device holds dense values
                        target = np.empty(host.shape, native_dtype(host.dtype))  # in the machine's order)
                        converted.append((host, target))
                    check("cuMemcpyDtoHAsync",
                          driver.cuMemcpyDtoHAsync(target.ctypes.data, buf.ptr, host.nbytes, call.stream))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(call.stream))
            for host, target in converted:
                host[...] = target  # (into its own elements, converted to its own byte order)
        else:
            driver.cuStreamSynchronize(call.stream)
    finally:
        for buf, *_ in call.staged:
            buf.free()



def _byte_range(a: np.ndarray) -> tuple[int, int]:
    """(first byte, one past the last byte) of the memory a numpy array spans."""
    return byte_range(a.__array_interface__["data"][0], a.shape, a.strides, a.itemsize)


def _shares_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two host arrays share a byte (exactly, as the interpreter asks: interleaved strided
    views share none); a pair too hard to decide is taken as sharing."""
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))
    except np.exceptions.TooHardError:
        return True


def _same_copy(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the device copies of two host arrays over the same bytes (:func:`device_values`) hold
    the same bytes: not for a view and its byte-swapped reading (``x`` and ``x.view('>f4')``), whose
    copies hold two different sets of values (the interpreter reads each by its own). Two views in
    the machine's byte order share their raw bytes, whatever their element types; byte-swapped ones
    only of one dtype (a '>f4' and a '>u2' reading convert the bytes differently)."""
    return a.dtype == b.dtype or not (byte_swapped(a.dtype) or byte_swapped(b.dtype))


def check_self_overlap(name: str, host: np.ndarray) -> None:
    """SP0750 for a written host array whose own elements share memory (an ``as_strided`` view): its
    device copy has one element per index, and copying them back would keep only one of the values
    written to each shared address, silently. The interpreter refuses it in the same words."""
    if host.flags.c_contiguous:
        return
    verdict = self_overlap(host.shape, host.strides, host.itemsize)
    if verdict is not None:
        why = (f": {UNDECIDED_REASON}" if verdict == UNDECIDED else "; it is copied to the device and back, and "
               "copying it back would keep only one of the values written to each shared address")
        raise LaunchError(ARG_OVERLAP, f"elements of argument `{name}` {verdict} in memory (shape {host.shape}, "
                          f"byte strides {host.strides}), and the kernel writes through it{why}",
                          help="pass an array whose elements are distinct (e.g. `out.copy()`, or a slice of a new "
                               "array)")


def shared_host_copy(staged: Sequence[tuple[str, np.ndarray, bool]], name: str, host: np.ndarray,
                     writes: bool) -> int | None:
    """Where the host array ``host`` (argument ``name``) goes among the host arrays already staged
    for this launch, ``(name, array, written)`` each: the index of one covering the very same bytes
    with the same shape and strides (any shapes where both are dense), in the same byte order (share
    its device copy, as the GPU would share the memory), or None (a copy of its own: a byte-swapped
    reading of the same bytes has other values, and so has a view of another shape over the same
    span with the same strides, which a dimension of extent 1 allows). Memory shared only in part,
    with either written, is LaunchError SP0750: two copies would hide the writes through one from
    the other, and the last copied back would win; so is a written array whose own elements share
    memory (:func:`check_self_overlap`)."""
    if writes:
        check_self_overlap(name, host)
    lo, hi = _byte_range(host)
    for i, (other, array, written) in enumerate(staged):
        a, b = _byte_range(array)
        same_layout = (array.strides == host.strides and array.shape == host.shape) or (
            array.flags.c_contiguous and host.flags.c_contiguous)
        if hi > lo and (a, b) == (lo, hi) and same_layout and _same_copy(array, host):
            return i
        if a < hi and lo < b and (writes or written) and _shares_memory(array, host):
            raise LaunchError(ARG_OVERLAP, f"host arrays `{other}` and `{name}` overlap in memory but are not "
                              "the same array, and the kernel writes "
                              f"`{name if writes else other}`; each host array is copied to the device on "
                              "its own, so the writes would be lost",
                              "pass the same array for both, or separate arrays (e.g. `y.copy()`)")
    return None
