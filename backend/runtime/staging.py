"""Host arrays staged for a launch: copied to fresh device buffers on the launch stream before the
launch and, where the kernel writes them, back after it; the launch then synchronizes. Which
arguments share which buffer, at which offset, is planned first, over all of the launch's host
arrays (host_groups.py): C-contiguous arrays of the machine's byte order that share memory, however
they overlap and whatever their element types, are one buffer over the union of their bytes, each
argument at its own offset (they alias on the GPU as in host memory, and as the interpreter, which
uses them in place, sees them); other host arrays are copied by their values
(:func:`device_values`: a strided numpy array's elements in C order, a byte-swapped one's in the
machine's byte order, as the interpreter reads them, frontend/interp/host_arrays.py), the same view
passed twice sharing one copy, and memory they share with another argument, one written, is
SP0750. A written group gets its written members' bytes back (a strided or byte-swapped one into its
own elements and order, the memory between a strided view's elements left alone) once the stream
has synchronized. :class:`Call` is a launcher's per-launch scratch that records the copies.

The launcher plans when it meets the first host array (:class:`PlanNeeded`): it then goes over the
arguments once checking them (:func:`check_host_array`, collecting the host arrays), plans, and
converts them again, staging each host array at its planned place (:func:`stage_host_array`).

A launch of an empty grid (a 0 dimension) runs nothing: its host arrays get every check of a staged
one (:func:`check_host_array`: the same SP0750; a plan that allocates nothing, ``StagingPlan.dry``,
for the alignment a member of a shared copy keeps) but no buffer, copy or synchronize, and host
outputs are left as they were (docs/language.md, "Specialization and launching")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from cuda.bindings import driver

from ...frontend import dlpack
from ...frontend.diagnostics import LaunchError
from .arrays import ANY_DEVICE, ArrayInfo, register_array_type
from .codes import ARG_ALIGNMENT
from .devices import check
from .dtypes import byte_swapped, dtype_from_numpy, native_dtype, native_order
from .host_groups import (
    ALIGNMENT,
    HostEntry,
    HostGroup,
    aliasable,
    check_self_overlap,
    plan_host_groups,
    relation,
    written_spans,
)
from .memory import DeviceBuffer


class PlanNeeded(Exception):
    """Raised by :func:`stage_host_array` when the launch has no staging plan yet: the launcher
    checks the arguments, collecting the host arrays, plans, and converts them again."""


class StagingPlan:
    """The device copies of one launch's host arrays (host_groups.plan_host_groups), by argument
    name: ``where[name]`` = (group index, byte offset into its data); ``buffers``: each group's
    buffer once its first member is staged."""

    __slots__ = ("buffers", "dry", "entries", "groups", "where")

    def __init__(self, entries: Sequence[HostEntry], dry: bool = False):
        self.dry = dry
        """The plan of a launch of an empty grid: nothing is allocated or copied, each host array is
        given the address its copy would have in a 256-aligned allocation next to its memory
        (:func:`planned_address`), which the alignment checks of its pointer and tensor maps see."""
        self.entries = list(entries)
        self.groups = plan_host_groups(self.entries)
        self.where: dict[str, tuple[int, int]] = {}
        for g, group in enumerate(self.groups):
            for i, offset in zip(group.members, group.offsets, strict=True):
                self.where[self.entries[i].name] = (g, offset)
        self.buffers: list[DeviceBuffer | None] = [None] * len(self.groups)


class Call:
    """Launch scratch (one per launcher, reused under its lock): the stream, the staging plan and
    the copies made, producer streams to wait on, objects to keep alive until the launch is queued,
    and array infos for derived parameters."""

    __slots__ = ("hosts", "infos", "keep", "plan", "staged", "stream", "waits")

    def __init__(self, stream: int, n_infos: int):
        self.stream = stream
        self.staged: list[tuple[DeviceBuffer, HostGroup]] | None = None
        self.plan: StagingPlan | None = None
        self.hosts: list[HostEntry] | None = None
        """Host arrays checked, not staged (an empty grid's, or those of the pass that plans):
        ``[]`` at first; None while arguments are staged (:func:`stage_host_array`)."""
        self.waits: list[int] | None = None
        self.keep: list[Any] | None = None
        self.infos: list[ArrayInfo | None] | None = [None] * n_infos if n_infos else None


def host_entry(name: str, info: ArrayInfo, writes: bool) -> HostEntry:
    """The plan's entry of a host array argument (``info.host``): aliasable unless strided,
    byte-swapped, or a CPU bfloat16 / float8 torch tensor (the interpreter reads those through a
    copy: frontend/interp/host_arrays.py ``_special_torch_view``). It keeps ``info.keepalive`` (a
    DLPack export's capsule, whose memory the plan's copies read after this pass has let it go)."""
    host = info.host
    assert host is not None
    converted = info.source == "CPU torch tensor" and host.dtype.kind == "V"
    return HostEntry(name, host, writes, aliasable(host, converted), info.keepalive)


def stage_host_array(name: str, info: ArrayInfo, writes: bool, call: Call, device: int) -> int:
    """The device address of host array argument ``name`` at its planned place: the first member of
    a group allocates the group's buffer and copies its bytes (on the launch stream); the kernel's
    writes come back after the launch (:func:`finish_host_copies`). :class:`PlanNeeded` when the
    launch has no plan yet."""
    plan = call.plan
    if plan is None:
        raise PlanNeeded
    g, offset = plan.where[name]
    group = plan.groups[g]
    if plan.dry:
        return planned_address(group, offset)
    buf = plan.buffers[g]
    if buf is None:
        buf = plan.buffers[g] = DeviceBuffer(group.nbytes, device=device)
        if call.staged is None:
            call.staged = []
        call.staged.append((buf, group))
        size = group.hi - group.lo
        if size:
            if group.raw:  # the raw bytes of the members' union
                source = group.lo
            else:
                first = plan.entries[group.members[0]].array
                values = device_values(first)
                if values is not first:
                    call.keep = [*(call.keep or ()), values]
                source = values.ctypes.data
            check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(buf.ptr + group.lead, source, size, call.stream))
    return buf.ptr + group.lead + offset


def planned_address(group: HostGroup, offset: int) -> int:
    """Where a member (``offset`` into the group's data) of a copy that is not made (an empty grid's)
    would be, alignment for alignment: in an allocation at ``group.lo`` rounded down to
    :data:`~.host_groups.ALIGNMENT` (its host address, where the members' spans differ and the copy
    keeps their alignment; else that aligned address)."""
    return group.lo - group.lo % ALIGNMENT + group.lead + offset


def staged_misaligned(name: str, host: int) -> LaunchError:
    """SP0704 for a host array whose device address, in a copy shared with host arrays it overlaps
    (which keeps its host address's alignment), is not 16-byte aligned where the kernel was
    specialized assuming it (a launcher built by hand: ``kernel[grid]`` specializes a host array by
    its address, frontend/sema/specialize.py). In the same words for a launch of an empty grid, which
    stages nothing (the device address is not named)."""
    return LaunchError(ARG_ALIGNMENT, f"argument `{name}` is a host array at {host:#x}, which is not 16-byte "
                       "aligned, staged in one device copy with the host arrays it overlaps (keeping its "
                       "alignment), but the kernel was specialized assuming 16-byte alignment",
                       "specialize the kernel for this argument's alignment (kernel[grid](...) does), or pass a "
                       "copy that starts on a 16-byte boundary")


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
    """:func:`stage_host_array` for a launch of an empty grid, or for the pass that plans
    (``call.hosts`` is a list): every check (SP0750, host_groups.relation with the host arrays before
    it), no buffer and no copy; records the array and returns its host address (never launched)."""
    hosts = call.hosts
    assert hosts is not None
    entry = host_entry(name, info, writes)
    if writes:
        check_self_overlap(name, entry.array)
    for other in hosts:
        relation(other, entry)
    hosts.append(entry)
    return info.ptr


class Unstaged:
    """The device copy of a host array that a launch of an empty grid does not make: what
    ``kernel[grid](...)`` passes the launcher in place of a host array read through TMA, which it
    copies to the device as a whole (driver/launch.py). Described as that copy would be (dense,
    writable, of the host array's dtype and shape, on the launcher's device) at the address it would
    have, alignment for alignment (:func:`planned_address`; 0 by default): its tensor maps are
    validated, never encoded (:func:`is_unstaged`)."""

    __slots__ = ("address", "host")

    def __init__(self, host: np.ndarray, address: int = 0):
        self.host, self.address = host, address
        """``address``: where the copy would be, alignment for alignment (:func:`planned_address`)."""


def _describe_unstaged(value: Unstaged, stream: int) -> ArrayInfo:
    host = value.host
    dtype = dtype_from_numpy(native_dtype(host.dtype))  # (as DeviceBuffer.from_numpy types the copy: '>f2' f16)
    return ArrayInfo(value.address, dtype, dtype or "untyped", host.shape, dlpack.compact_strides(host.shape), True,
                     ANY_DEVICE, "cuda", False, "DeviceBuffer", None, host)


class StagedView:
    """A host array's place in a device copy shared with host arrays it overlaps (host_groups.py):
    ``kernel[grid](...)`` passes it to the launcher in place of a host array read through TMA (or of
    an argument overlapping one), described as a dense array of the host array's dtype and shape at
    ``ptr`` on the buffer's device, ``buffer`` kept alive (driver/launch.py)."""

    __slots__ = ("buffer", "host", "ptr")

    def __init__(self, buffer: DeviceBuffer, ptr: int, host: np.ndarray):
        self.buffer, self.ptr, self.host = buffer, ptr, host

    def copy_to_host(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        """Copy its bytes into the C-contiguous ``out`` (of its nbytes; default: a new dense array of
        the host array's shape and dtype in the machine's byte order, what the copy holds) on
        ``stream``, then wait for it."""
        from .memory import copy_device_to_host

        if out is None:
            out = np.empty(self.host.shape, native_dtype(self.host.dtype))
        copy_device_to_host(self.ptr, out, stream, device=self.buffer.device)
        return out


def _describe_staged_view(value: StagedView, stream: int) -> ArrayInfo:
    host = value.host
    dtype = dtype_from_numpy(native_dtype(host.dtype))
    return ArrayInfo(value.ptr, dtype, dtype or "untyped", host.shape, dlpack.compact_strides(host.shape), True,
                     value.buffer.device, f"cuda:{value.buffer.device}", False, "DeviceBuffer", None, None,
                     value.buffer)


register_array_type(StagedView, _describe_staged_view)


def is_unstaged(info: ArrayInfo) -> bool:
    """Whether ``info`` describes a host array a launch of an empty grid did not stage: host memory
    itself or an :class:`Unstaged` copy (whose info keeps its host array with a device)."""
    return info.host is not None


register_array_type(Unstaged, _describe_unstaged)


def finish_host_copies(call: Call, launched: bool) -> None:
    """Copy the written members of each staged group back, synchronize the stream, free the
    staging buffers. After a failed launch (an exception is already propagating) only synchronize
    and free."""
    staged = call.staged or []
    try:
        if launched:
            plan = call.plan
            assert plan is not None
            converted: list[tuple[np.ndarray, np.ndarray]] = []  # (strided or byte-swapped host array, dense copy)
            for buf, group in staged:
                if not group.written or group.hi == group.lo:
                    continue
                data = buf.ptr + group.lead
                if group.raw:  # the bytes of the written members (never memory only read-only ones cover)
                    for lo, hi in written_spans(group, plan.entries):
                        check("cuMemcpyDtoHAsync",
                              driver.cuMemcpyDtoHAsync(lo, data + lo - group.lo, hi - lo, call.stream))
                    continue
                host = plan.entries[group.written[0]].array  # (a written member: writable, SP0719)
                target = host
                if byte_swapped(host.dtype) or not host.flags.c_contiguous:  # (the device holds dense values
                    target = np.empty(host.shape, native_dtype(host.dtype))  # in the machine's order)
                    converted.append((host, target))
                check("cuMemcpyDtoHAsync",
                      driver.cuMemcpyDtoHAsync(target.ctypes.data, data, host.nbytes, call.stream))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(call.stream))
            for host, target in converted:
                host[...] = target  # (into its own elements, converted to its own byte order)
        else:
            driver.cuStreamSynchronize(call.stream)
    finally:
        for buf, _ in staged:
            buf.free()
