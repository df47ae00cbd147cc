"""The kernel launcher (:class:`Launcher`).

Per-parameter converters and the parameter buffer are built once; a call binds the arguments,
converts each one straight into its slot of the buffer, and calls ``cuLaunchKernel``
(``cuLaunchKernelEx`` with launch attributes when the cluster is not 1x1x1 or the launch is a
programmatic dependent one, ``pdl=True``: docs/language.md, "Programmatic dependent launch") with
``kernelParams`` = the address of a ``void*`` array pointing at the slots: for a loaded kernel
straight from libcuda through ctypes (``cudalib.py``: cuda.bindings' argument conversion costs
microseconds per call), else through cuda.bindings. Host arrays are copied in and out around the
launch (``staging.py``), which then synchronizes; device arrays are used in place and the launch
stays asynchronous. A grid with a 0 dimension converts and checks every argument as any launch
does, then launches nothing (CUDA refuses a 0 grid dimension; docs/language.md, "Specialization and
launching"): its host arrays are checked as staged ones are, but not copied (no allocation, copy or
synchronize), and the tensor maps of host arrays are validated, not encoded. ``driver/prepared.py``
builds on it the prepared launches of ``kernel[grid].prepare``.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cuda.bindings import driver

from ...frontend.diagnostics import LaunchError
from ...frontend.sema.specialize import call_grid
from . import cudalib, devices
from .arrays import (
    HOST,
    UNKNOWN_DEVICE,
    ArrayInfo,
    check_array_argument,
    describe_array,
    is_torch_type,
    torch_device_pointer,
)
from .codes import ARG_DEVICE, ARG_KIND, ARG_RANGE, CLUSTER, CONSTEXPR, TENSOR_MAP
from .devices import (
    RETRY_AFTER_CONTEXT_SWITCH,
    SUCCESS,
    CudaError,
    DeviceInfo,
    pointer_device,
    same_stream,
    stream_wait,
)
from .dtypes import DTYPES
from .launch_config import (
    INTS,
    check_cluster,
    check_grid_fits_cluster,
    check_pdl,
    check_shared_memory,
    normalize_block,
    normalize_grid,
    rememberable_grid,
    stream_handle,
)
from .module import KernelFunction
from .params import (
    MISSING,
    ArgumentBinder,
    ParamBuffer,
    ParamSpec,
    constexpr_equal,
    derived_value,
    is_derived,
    layout_slots,
)
from .scalars import describe_value, encode_scalar, scalar_writer
from .staging import (
    Call,
    PlanNeeded,
    StagingPlan,
    check_host_array,
    finish_host_copies,
    is_unstaged,
    stage_host_array,
    staged_info,
    staged_misaligned,
)
from .tensormap import (
    TENSOR_MAP_BYTES,
    TENSOR_MAP_CACHE_SIZE,
    TensorMap,
    TensorMapCache,
    TensorMapParam,
    TensorMapSpec,
    encoding_key,
    make_tensor_map,
    map_of,
)

_U64 = struct.Struct("<Q")


def _no_pack(view: Any, offset: Any, value: int) -> None:
    """Array-only arguments have no slot of their own."""


_MAP_FIELDS = (("box_shape", "box {}"), ("swizzle", "swizzle {}"), ("dtype", "dtype {}"),
               ("element_strides", "element strides {}"), ("interleave", "interleave {}"),
               ("oob_fill", "out-of-bounds fill {}"))
"""What a prebuilt map must share with the tensor-map parameter it is passed for (not its L2
promotion, a hint), and how a message names each."""


def _check_prebuilt_map(p: TensorMapParam, spec: TensorMapSpec) -> None:
    """LaunchError SP0714 when a prebuilt map was encoded for another box, swizzle, element type,
    element strides, interleave or out-of-bounds fill than parameter ``p``'s: the kernel would read
    its boxes as ones of its own (a silent wrong result)."""
    want = TensorMapSpec(p.dtype, spec.global_shape, spec.global_strides, p.box_shape,
                         element_strides=p.element_strides, swizzle=p.swizzle, interleave=p.interleave,
                         oob_fill=p.oob_fill)
    diff = [(text.format(_shown(getattr(spec, f))), text.format(_shown(getattr(want, f))))
            for f, text in _MAP_FIELDS if getattr(spec, f) != getattr(want, f)]
    if diff:
        have, wanted = ", ".join(h for h, _ in diff), ", ".join(w for _, w in diff)
        raise LaunchError(TENSOR_MAP, f"the tensor map passed for `{p.name}` was encoded for {have}, but the "
                          f"kernel reads it with {wanted}",
                          "encode the map with the kernel's box and options, or pass the array itself "
                          "(the launcher then encodes the map)")


def _shown(v: Any) -> Any:
    return v.name if hasattr(v, "name") else v


def _encoded(p: TensorMapParam, info: Any, ordinal: int, what: str) -> bytes:
    """The bytes of ``p``'s tensor map of the array ``info``, validated first: SP0714 naming the
    argument (``what``, :func:`~.tensormap.map_of`)."""
    spec = p.spec_for(info)
    spec.validate(info.ptr, what=what)
    return make_tensor_map(spec, info.ptr, device=ordinal, validated=True).data


def validated_only(call: Call, info: ArrayInfo) -> bool:
    """Whether a tensor map of ``info`` is validated, not encoded: a launch of an empty grid's, over
    a host array in the pass that checks them (host memory itself, or the ``Unstaged`` stand-in of
    one read through TMA: staging.is_unstaged), or over any array in its pass at the planned
    addresses (staging.StagingPlan.dry)."""
    return (call.hosts is not None and is_unstaged(info)) or (call.plan is not None and call.plan.dry)


def planned_address(info: ArrayInfo) -> int | None:
    """The address a map validated only (:func:`validated_only`) is checked at: that of its copy,
    alignment for alignment (a planned one, an ``Unstaged`` stand-in's), or none for host memory
    before the plan."""
    return None if info.device == HOST else info.ptr


class _NoGrid:
    """The type of the cached grid before the first launch (no grid is ever of this type)."""


class Launcher:
    """Launches one compiled kernel. Built once per compiled kernel; ``launcher(grid, args,
    kwargs, stream=...)`` converts the arguments into the preallocated parameter buffer and
    launches. ``block`` (or ``num_warps``), ``dynamic_shared`` and ``cluster`` are fixed at
    compile time; ``static_shared`` defaults to what the driver reports for the kernel. ``pdl``:
    every launch is a programmatic dependent launch (the programmatic stream serialization
    attribute: the kernel may start while the previous kernel in the stream runs; sm_90+, SP0726)."""

    def __init__(self, function: KernelFunction, spec: ParamSpec, *, num_warps: int | None = None,
                 block: Any = None, static_shared: int | None = None, dynamic_shared: int = 0,
                 cluster: Any = (1, 1, 1), pdl: bool = False, allow_host_copies: bool = True):
        self.function = function
        self.spec = spec
        self.device: DeviceInfo = function.module.device
        self._module = function.module
        attrs = function.attributes
        if block is None:
            block = 32 * (num_warps if num_warps is not None else 4)
        self.block = normalize_block(block, self.device, attrs.max_threads_per_block)
        self.static_shared = attrs.static_shared_bytes if static_shared is None else static_shared
        self.dynamic_shared = int(dynamic_shared)
        check_shared_memory(self.static_shared, self.dynamic_shared, self.device)
        self.cluster = check_cluster(cluster, self.device)
        self.pdl = check_pdl(pdl, self.device)
        required = attrs.required_cluster
        if any(required) and tuple(max(r, 1) for r in required) != self.cluster:
            raise LaunchError(CLUSTER, f"the kernel was compiled for cluster {required}, but the launcher "
                              f"uses {self.cluster}", f"launch with cluster={tuple(required)}")
        if self.dynamic_shared:
            function.set_max_dynamic_shared(self.dynamic_shared)
        self.allow_host_copies = allow_host_copies
        self._binder = ArgumentBinder(spec)
        self._lock = threading.Lock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        # libcuda straight through ctypes for a loaded kernel (cudalib.py); cuda.bindings otherwise
        raw = isinstance(function, KernelFunction)
        raw_launch = cudalib.raw("cuLaunchKernel") if raw else None
        raw_ex = cudalib.raw("cuLaunchKernelEx") if raw else None
        self._launch_kernel = raw_launch or driver.cuLaunchKernel
        self._launch_kernel_ex = raw_ex or driver.cuLaunchKernelEx
        self._tensor_maps = TensorMapCache(TENSOR_MAP_CACHE_SIZE)
        self._build_buffer()
        self._raw_ex = raw_ex is not None
        self._config = self.new_config()
        self._last_grid: Any = _NoGrid  # (no grid is this class: see _grid)
        self._last_grid_type: type = _NoGrid
        self._last_dims: tuple[int, int, int] = (1, 1, 1)
        self._n_user = len(self._binder.names)
        self._n_infos = len(self._needs_info)
        self._handle = cudalib.handle_int(function.handle) if raw_launch or raw_ex else function.handle
        self._bx, self._by, self._bz = self.block
        self._params_address = self._buffer.address
        self._context_key = self._module.context_key
        self._scratch = Call(0, self._n_infos)

    # -- construction -------------------------------------------------------------------------

    def _build_buffer(self) -> None:
        kernel_params = self.spec.kernel_params
        self._buffer = ParamBuffer(layout_slots([p.slot for p in kernel_params]))
        offsets = dict(zip((p.name for p in kernel_params), self._buffer.layout.offsets))
        users = self.spec.user_params
        user_index = {p.name: i for i, p in enumerate(users)}
        derived = [p for p in self.spec.params if is_derived(p)]
        self._needs_info = sorted({user_index[p.source] for p in derived})
        self._info_slot = {u: i for i, u in enumerate(self._needs_info)}
        self._converters: list[Callable[[Any, Call], None]] = []
        for i, p in enumerate(users):
            slot = self._info_slot.get(i)
            if p.kind in ("pointer", "array"):
                self._converters.append(self._pointer_converter(p, offsets.get(p.name), slot))
            elif p.kind == "tensormap":
                self._converters.append(self._tensormap_converter(p, offsets[p.name], slot))
            elif p.kind == "scalar":
                self._converters.append(self._scalar_converter(p, offsets[p.name]))
            else:
                self._converters.append(self._constexpr_converter(p))
        self._derived = [
            (self._derived_writer if p.kind == "derived" else self._derived_tensormap_writer)(
                p, offsets[p.name], self._info_slot[user_index[p.source]])
            for p in derived]

    def new_config(self) -> Any:
        """A fresh ``CUlaunchConfig`` of this launcher's block, shared memory and launch attributes
        (the cluster dimensions, programmatic stream serialization), of the kind its
        ``cuLaunchKernelEx`` takes (a ctypes one for libcuda, else cuda.bindings'); the caller sets
        the grid and the stream. None when no attribute is needed (a plain ``cuLaunchKernel``)."""
        if math.prod(self.cluster) <= 1 and not self.pdl:
            return None
        if self._raw_ex:
            attributes = cudalib.attribute_list(self.cluster, self.pdl)
            return cudalib.launch_config(self.block, self.dynamic_shared, attributes)
        attrs = []
        if math.prod(self.cluster) > 1:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = self.cluster
            attrs.append(attr)
        if self.pdl:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        config = driver.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.dynamic_shared
        config.attrs = attrs  # cuda.bindings copies the attributes into the config's own array
        config.numAttrs = len(attrs)
        return config

    def _array_info(self, name: str, value: Any, call: Call, what: str, info: ArrayInfo | None = None
                    ) -> ArrayInfo:
        if info is None:
            info = describe_array(value, call.stream)
        if info is None:
            raise LaunchError(ARG_KIND, f"argument `{name}` expects {what}, got {type(value).__name__}",
                              "pass a numpy array, a CUDA tensor/array (torch, CuPy, JAX) or a DeviceBuffer")
        if info.device == UNKNOWN_DEVICE:
            info = info._replace(device=pointer_device(info.ptr))
            if info.device == HOST:
                raise LaunchError(ARG_DEVICE, f"argument `{name}` ({info.source}) does not point to CUDA "
                                  "device memory")
        return info

    def _device_pointer(self, name: str, info: ArrayInfo, writes: bool, call: Call) -> int:
        if info.device == HOST:
            if call.hosts is not None:  # an empty grid's, or the pass that plans: checked, not staged
                return check_host_array(name, info, writes, call)
            return stage_host_array(name, info, writes, call, self.device.ordinal)
        if info.stream is not None and not same_stream(info.stream, call.stream):
            call.waits = [*(call.waits or ()), info.stream]
        if info.keepalive is not None:
            call.keep = [*(call.keep or ()), info.keepalive]
        return info.ptr

    def _pointer_converter(self, p: Any, offset: int | None, info_slot: int | None
                           ) -> Callable[[Any, Call], None]:
        """Converter of a pointer argument (``offset`` = its slot) or of an array-only argument
        (``offset`` None: checked, staged and recorded for derived parameters, not passed)."""
        view, ordinal = self._buffer.view, self.device.ordinal
        pack = _U64.pack_into if offset is not None else _no_pack
        name, dtype, writes = p.name, p.dtype, not p.readonly
        array_dtype = "f32" if dtype == "tf32" else dtype
        aligned16 = getattr(p, "aligned16", False)
        alignment_mask = 15 if aligned16 else 0
        need_contiguous = p.contiguous
        torch_types: set[type] = set()

        def convert(value: Any, call: Call) -> None:
            cls = type(value)
            if cls is int and info_slot is None:  # a raw device address
                if not 0 <= value < 1 << 64:
                    raise LaunchError(ARG_RANGE, f"argument `{name}` = {value} is not a 64-bit address")
                pack(view, offset, value)
                return
            if cls in torch_types and info_slot is None:
                ptr = torch_device_pointer(value, ordinal, array_dtype, need_contiguous)
                if ptr is not None and not ptr & alignment_mask:
                    pack(view, offset, ptr)
                    return
            elif is_torch_type(cls):
                torch_types.add(cls)
            info = describe_array(value, call.stream)
            if (info is not None and info.device == ordinal and info.dtype == array_dtype
                    and not info.ptr & alignment_mask and (info.contiguous or not need_contiguous)
                    and not (info.readonly and writes) and info.stream is None and info.keepalive is None
                    and not info.negated):
                pack(view, offset, info.ptr)  # the common case: a matching array on this device
            else:
                info = self._array_info(name, value, call, f"an array (pointer to {dtype})", info)
                check_array_argument(name, dtype, info, device=ordinal, allow_host=self.allow_host_copies,
                                     writes=writes, aligned16=aligned16, contiguous=p.contiguous)
                ptr = self._device_pointer(name, info, writes, call)
                if ptr & alignment_mask and call.hosts is None and info.device == HOST:
                    raise staged_misaligned(name, info.ptr)
                pack(view, offset, ptr)
                if info.device == HOST and call.hosts is None:  # staged host array (or planned, its `dry`):
                    # derived parameters describe the device copy
                    info = staged_info(info, ptr, ordinal)
            if info_slot is not None:
                call.infos[info_slot] = info

        return convert

    def _tensormap_converter(self, p: TensorMapParam, offset: int, info_slot: int | None
                             ) -> Callable[[Any, Call], None]:
        view, ordinal, cache = self._buffer.view, self.device.ordinal, self._tensor_maps
        end = offset + TENSOR_MAP_BYTES
        encodes = encoding_key(p)  # the cache is shared by this launcher's maps: the box, swizzle... key it too
        what = map_of(p.name)

        def convert(value: Any, call: Call) -> None:
            if isinstance(value, TensorMap):
                _check_prebuilt_map(p, value.spec)
                view[offset:end] = value.data
                if info_slot is not None:
                    spec, size = value.spec, value.spec.dtype.bits // 8
                    call.infos[info_slot] = ArrayInfo(value.address, p.dtype, p.dtype, spec.global_shape,
                                                      tuple(s // max(size, 1) for s in spec.global_strides),
                                                      False, ordinal, "", False, "TensorMap")
                return
            info = self._array_info(p.name, value, call, f"an array for a tensor map of {p.dtype}")
            check_array_argument(p.name, p.dtype, info, device=ordinal, allow_host=self.allow_host_copies,
                                 writes=not p.readonly, contiguous=False)
            ptr = self._device_pointer(p.name, info, not p.readonly, call)
            if info.device == HOST and call.hosts is None:  # (a staged host array's map describes its dense copy)
                info = staged_info(info, ptr, ordinal)._replace(host=info.host)
            if info_slot is not None:
                call.infos[info_slot] = info
            if validated_only(call, info):  # an empty grid's host array: as its copy's map
                p.spec_for(info).validate(planned_address(info), what=what)
                return
            key = (info.ptr, info.shape, info.strides, encodes)
            data = cache.get(key)
            if data is None:
                data = cache.put(key, _encoded(p, info, ordinal, what))
            view[offset:end] = data

        return convert

    def _scalar_converter(self, p: Any, offset: int) -> Callable[[Any, Call], None]:
        return scalar_writer(p, offset, self._buffer.view)

    def _constexpr_converter(self, p: Any) -> Callable[[Any, Call], None]:
        expected = p.value

        def convert(value: Any, call: Call) -> None:
            if expected is None or value is MISSING:
                return
            if not constexpr_equal(value, expected):
                raise LaunchError(CONSTEXPR, f"argument `{p.name}` = {describe_value(value)}, but the kernel was "
                                  f"compiled for {p.name} = {describe_value(expected)}",
                                  f"recompile for this value (or pass {expected!r})")

        return convert

    def _derived_tensormap_writer(self, p: TensorMapParam, offset: int, info_slot: int
                                  ) -> Callable[[Call], None]:
        view, ordinal, end = self._buffer.view, self.device.ordinal, offset + TENSOR_MAP_BYTES
        cache = TensorMapCache(TENSOR_MAP_CACHE_SIZE)

        what = map_of(p.name)

        def write(call: Call) -> None:
            info = call.infos[info_slot]
            if validated_only(call, info):  # an empty grid's host array: as its copy's map
                p.spec_for(info).validate(planned_address(info), what=what)
                return
            key = (info.ptr, info.shape, info.strides)
            data = cache.get(key)
            if data is None:
                data = cache.put(key, _encoded(p, info, ordinal, what))
            view[offset:end] = data

        return write

    def _derived_writer(self, p: Any, offset: int, info_slot: int) -> Callable[[Call], None]:
        view, size = self._buffer.view, DTYPES[p.dtype].itemsize
        packer = struct.Struct(DTYPES[p.dtype].struct_format)

        def write(call: Call) -> None:
            value = derived_value(p, call.infos[info_slot])
            try:
                packer.pack_into(view, offset, value)
            except struct.error:  # out of range for the parameter's type: the diagnostic
                view[offset:offset + size] = encode_scalar(p.dtype, value, p.name)

        return write

    # -- launching ----------------------------------------------------------------------------

    def _grid(self, grid: Any, values: Sequence[Any]) -> tuple[int, int, int]:
        if callable(grid):
            meta = dict(zip(self._binder.names, values))
            grid = call_grid(grid, meta, self.spec.kernel_name)  # (a name the call lacks: SP0710)
        # a grid of Python ints only (launch_config.INTS: a float or an array can equal one)
        cacheable = rememberable_grid(grid)
        if cacheable and type(grid) is self._last_grid_type and grid == self._last_grid:
            return self._last_dims
        dims = normalize_grid(grid, self.device)
        check_grid_fits_cluster(dims, self.cluster)
        if cacheable:
            self._last_grid, self._last_grid_type, self._last_dims = grid, type(grid), dims
        return dims

    def __call__(self, grid: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
                 stream: Any = None) -> None:
        values = args if not kwargs and len(args) == self._n_user else self._binder.bind(args, kwargs)
        handle = 0 if stream is None else stream if type(stream) is int and stream >= 0 else stream_handle(stream)
        self._acquire()  # one launch at a time per launcher: the parameter buffer is shared
        call = self._scratch
        call.stream = handle
        launched = False
        restore = None  # the thread's context, when the launch made another current (devices.enter)
        try:
            if grid is self._last_grid or (type(grid) is self._last_grid_type and (
                    type(grid) is int or INTS.issuperset(map(type, grid))) and grid == self._last_grid):
                dims = self._last_dims
            else:
                dims = self._grid(grid, values)
            empty = not (dims[0] and dims[1] and dims[2])
            self._convert(values, call, empty)  # (empty: host arrays checked as for a launch that runs, not staged)
            for write in self._derived:
                write(call)
            if empty:  # every argument checked, nothing to run (CUDA refuses a 0 grid dimension)
                return
            if call.staged or getattr(devices.tls, "context", None) is not self._context_key:
                restore = self._module.activate(force=True)
            if call.waits:
                for producer in call.waits:
                    stream_wait(self._module._state, handle, producer)
            if self._config is None:
                err = self._launch_kernel(self._handle, dims[0], dims[1], dims[2], self._bx, self._by,
                                          self._bz, self.dynamic_shared, handle, self._params_address, 0)[0]
                if err != SUCCESS:
                    restore = self._launch_failed(err, dims, handle, restore)
            else:
                restore = self._launch_ex(dims, handle, restore)
            launched = True
        finally:
            try:
                if call.staged:
                    finish_host_copies(call, launched)
            finally:
                call.staged = call.waits = call.keep = call.hosts = call.plan = None
                self._release()
                if restore is not None:  # (another GPU's launch: the thread's own context again, as torch's guard)
                    devices.leave(restore)

    def _convert(self, values: Sequence[Any], call: Call, empty: bool = False) -> None:
        """Convert every argument into the parameter buffer. Host arrays are staged by a plan made
        over all of them (staging.py): at the first one (:class:`~.staging.PlanNeeded`, nothing
        staged yet), the arguments are gone over once checking them and collecting the host arrays,
        the plan is made, and they are converted again. ``empty``: a grid with a 0 dimension, whose
        host arrays are checked, not staged (staging.check_host_array); where there are any, they are
        converted again at the addresses a plan that allocates nothing gives them (its ``dry``), for
        the alignment checks a launch that runs makes of them."""
        if not empty:
            try:
                for convert, value in zip(self._converters, values):
                    convert(value, call)
                return
            except PlanNeeded:
                pass
        call.waits = call.keep = None
        call.hosts = []
        for convert, value in zip(self._converters, values):
            convert(value, call)
        if empty and not call.hosts:
            return
        call.plan = StagingPlan(call.hosts, dry=empty)
        call.hosts = call.waits = call.keep = None
        for convert, value in zip(self._converters, values):
            convert(value, call)

    def launch(self, grid: Any, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        """``launcher.launch(grid, x, y, n=...)``: the same as ``launcher(grid, args, kwargs)``."""
        self(grid, args, kwargs, stream=stream)

    def _launch_ex(self, dims: tuple[int, int, int], stream: int, restore: Any) -> Any:
        config = self._config
        config.gridDimX, config.gridDimY, config.gridDimZ = dims
        config.hStream = stream
        err = self._launch_kernel_ex(config, self._handle, self._params_address, 0)[0]
        if err != SUCCESS:
            return self._launch_failed(err, dims, stream, restore)
        return restore

    def _launch_failed(self, err: Any, dims: tuple[int, int, int], stream: int, restore: Any) -> Any:
        """Retry once when another context was made current behind our back (torch/CuPy on
        another device), else raise. Returns the context to restore after the launch (``restore``,
        or the one the retry switched from)."""
        name = "cuLaunchKernelEx" if self._config is not None else "cuLaunchKernel"
        if err in RETRY_AFTER_CONTEXT_SWITCH:
            again = self._module.activate(force=True)
            if self._config is None:
                err = self._launch_kernel(self._handle, dims[0], dims[1], dims[2], self._bx, self._by, self._bz,
                                          self.dynamic_shared, stream, self._params_address, 0)[0]
            else:
                config = self._config
                err = self._launch_kernel_ex(config, self._handle, self._params_address, 0)[0]
            if err == SUCCESS:
                return again if restore is None else restore
            if restore is None:  # (the caller restores its own ``restore``, not the one of this retry)
                devices.leave(again)
        raise CudaError(name, err)

    def snapshot(self, args: Sequence[Any]) -> tuple[bytes, tuple[int, ...]] | None:
        """Pack ``args`` (every user argument, positionally) as a launch would, without launching:
        (the parameter buffer's bytes, each kernel parameter's byte offset in them), or None when the
        call would need host copies, stream waits or keep-alives (it cannot be replayed from bytes).
        For launches replayed outside Python (integrations/jax/native.py)."""
        call = Call(0, self._n_infos)
        self._acquire()
        try:
            try:
                for convert, value in zip(self._converters, args):
                    convert(value, call)
            except PlanNeeded:  # (a host array: it would need host copies)
                return None
            for write in self._derived:
                write(call)
            if call.staged:
                finish_host_copies(call, False)
            if call.staged or call.waits or call.keep:
                return None
            return bytes(self._buffer.view), self._buffer.layout.offsets
        finally:
            self._release()

    def param_bytes(self, index: int) -> bytes:
        """The current bytes of kernel parameter ``index`` (for tests and debugging)."""
        return self._buffer.slot_bytes(index)
