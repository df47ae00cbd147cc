"""The runtime: CUDA driver, devices, modules, device buffers and the kernel launcher.

Built on ``cuda.bindings.driver`` (cuda-python 13). Every driver call returns a tuple whose first
element is a ``CUresult``; :func:`check` turns a failure into :class:`CudaError` (SP0715) naming
the call and the driver's own error string. Nothing here touches the driver at import time, so the
module imports (and its pure parts are tested) on machines without a GPU.

Contexts: each device's *primary* context is retained (the one the CUDA runtime, torch and CuPy
use too) and made current on the calling thread when needed.

Launch path (:class:`Launcher`): per-parameter converters and the parameter buffer are built
once; a call binds the arguments, converts each one straight into its slot of the buffer, and
calls ``cuLaunchKernel`` (``cuLaunchKernelEx`` with a cluster-dimension attribute when the cluster
is not 1x1x1) with ``kernelParams`` = the address of a ``void*`` array pointing at the slots:
for a loaded kernel straight from libcuda through ctypes (``cudalib.py``: cuda.bindings' argument
conversion costs microseconds per call), else through cuda.bindings. Host arrays are copied in and
out around the launch, which then synchronizes; device arrays are used in place and the launch
stays asynchronous. ``prepared.py`` builds on it the prepared launches of ``kernel[grid].prepare``.
"""

from __future__ import annotations

import math
import struct
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver

from ...frontend.diagnostics import LaunchError
from . import cudalib, dlpack
from .arguments import (
    ANY_DEVICE,
    ARG_DEVICE,
    ARG_KIND,
    ARG_RANGE,
    ARG_SHAPE,
    CLUSTER,
    CONSTEXPR,
    DRIVER,
    DTYPES,
    HOST,
    KERNEL_NOT_FOUND,
    MISSING,
    NO_GPU,
    UNKNOWN_DEVICE,
    ArgumentBinder,
    ArrayInfo,
    ParamBuffer,
    ParamSpec,
    check_array_argument,
    check_cluster,
    check_grid_fits_cluster,
    check_shared_memory,
    derived_value,
    describe_array,
    dtype_from_numpy,
    encode_scalar,
    is_derived,
    is_torch_type,
    layout_slots,
    normalize_block,
    normalize_grid,
    numpy_dtype,
    register_array_type,
    scalar_writer,
    shared_host_copy,
    stream_handle,
    torch_device_pointer,
)
from .tensormap import (
    TENSOR_MAP_BYTES,
    TENSOR_MAP_CACHE_SIZE,
    TensorMap,
    TensorMapCache,
    TensorMapParam,
    make_tensor_map,
)

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_RETRY_AFTER_CONTEXT_SWITCH = (driver.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                               driver.CUresult.CUDA_ERROR_INVALID_HANDLE)
DEFAULT_SHARED_LIMIT = 48 * 1024
"""Dynamic + static shared memory a kernel gets without opting in (CUDA programming guide)."""


class CudaError(LaunchError):
    """A CUDA driver call failed. ``call`` names it, ``result`` is the ``CUresult``."""

    def __init__(self, call: str, result: Any, help: str | None = None):
        self.call = call
        self.result = result
        name, text = error_text(result)
        super().__init__(DRIVER, f"{call} failed: {name}: {text}", help)


def error_text(result: Any) -> tuple[str, str]:
    """``(CUDA_ERROR_NAME, description)`` of a ``CUresult`` via ``cuGetErrorString``."""
    name = getattr(result, "name", str(result))
    try:
        err, text = driver.cuGetErrorString(result)
        if err == _SUCCESS and text:
            return name, text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    except Exception:
        pass
    return name, "no description available"


def check(call: str, out: Any) -> Any:
    """Unpack a driver result tuple: raise :class:`CudaError` unless ``out[0]`` is success;
    return None, the single value, or the tuple of values."""
    err = out[0]
    if err != _SUCCESS:
        raise CudaError(call, err)
    if len(out) == 1:
        return None
    return out[1] if len(out) == 2 else tuple(out[1:])


# ---------------------------------------------------------------------------------------------
# Devices and contexts


@dataclass(frozen=True)
class DeviceInfo:
    """The properties of one GPU the launcher checks against (pure data: tests build their own)."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_shared_per_block: int
    max_shared_per_block_optin: int
    max_threads_per_block: int
    max_block_dims: tuple[int, int, int]
    max_grid_dims: tuple[int, int, int]
    max_cluster_size: int
    l2_size: int
    total_memory: int = 0
    warp_size: int = 32

    @property
    def arch(self) -> str:
        """``sm_90`` style name (without the ``a``/``f`` suffix)."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


@dataclass
class _DeviceState:
    info: DeviceInfo
    device: Any
    context: Any
    event: Any = None


_lock = threading.RLock()
_tls = threading.local()
_devices: dict[int, _DeviceState] = {}
_initialized = False
_default_ordinal = 0


def _init_driver() -> int:
    """cuInit once; the number of devices. SP0716 when there is no driver or no device."""
    global _initialized
    try:
        out = driver.cuInit(0)
    except Exception as exc:  # the driver library itself is missing
        raise LaunchError(NO_GPU, f"the CUDA driver could not be loaded ({exc})",
                          "sparsile runs kernels on NVIDIA GPUs with the NVIDIA driver installed") from None
    if out[0] == driver.CUresult.CUDA_ERROR_NO_DEVICE:
        raise LaunchError(NO_GPU, "no CUDA device is visible", "check CUDA_VISIBLE_DEVICES and nvidia-smi")
    check("cuInit", out)
    _initialized = True
    return int(check("cuDeviceGetCount", driver.cuDeviceGetCount()))


def has_gpu() -> bool:
    """Whether a CUDA device can be used. Never raises. Once a device was found the answer is
    kept (the launch path asks on every call; devices do not disappear from a process)."""
    global _has_gpu
    if _has_gpu:
        return True
    try:
        _has_gpu = _init_driver() > 0
    except Exception:
        return False
    return _has_gpu


_has_gpu = False


def device_count() -> int:
    """Number of visible CUDA devices (0 without a driver)."""
    try:
        return _init_driver()
    except LaunchError:
        return 0


def _query_device(ordinal: int, dev: Any) -> DeviceInfo:
    A = driver.CUdevice_attribute

    def attr(name: str) -> int:
        return int(check(f"cuDeviceGetAttribute({name})", driver.cuDeviceGetAttribute(getattr(A, name), dev)))

    name = check("cuDeviceGetName", driver.cuDeviceGetName(256, dev))
    name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
    cluster_ok = attr("CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH")
    return DeviceInfo(
        ordinal=ordinal, name=name,
        compute_capability=(attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                            attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")),
        sm_count=attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        max_shared_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK"),
        max_shared_per_block_optin=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        max_threads_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
        max_block_dims=tuple(attr(f"CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_{a}") for a in "XYZ"),
        max_grid_dims=tuple(attr(f"CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_{a}") for a in "XYZ"),
        max_cluster_size=8 if cluster_ok else 1,  # 8 = the portable cluster size limit
        l2_size=attr("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        total_memory=int(check("cuDeviceTotalMem", driver.cuDeviceTotalMem(dev))),
        warp_size=attr("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
    )


def _state(ordinal: int | None = None) -> _DeviceState:
    ordinal = _default_ordinal if ordinal is None else ordinal
    state = _devices.get(ordinal)
    if state is not None:
        return state
    with _lock:
        if ordinal in _devices:
            return _devices[ordinal]
        count = _init_driver()
        if not 0 <= ordinal < count:
            raise LaunchError(NO_GPU, f"there is no CUDA device {ordinal} ({count} visible)")
        dev = check("cuDeviceGet", driver.cuDeviceGet(ordinal))
        ctx = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
        state = _DeviceState(_query_device(ordinal, dev), dev, ctx)
        _devices[ordinal] = state
        return state


def _make_current(state: _DeviceState, force: bool = False) -> None:
    """Make the device's primary context current on this thread (cached per thread)."""
    if force or getattr(_tls, "context", None) is not state.context:
        check("cuCtxSetCurrent", driver.cuCtxSetCurrent(state.context))
        _tls.context = state.context


def current_device(ordinal: int | None = None) -> DeviceInfo:
    """The :class:`DeviceInfo` of device ``ordinal`` (default: the one chosen by
    :func:`use_device`, initially 0), initializing the driver and making its primary context
    current on this thread. Cached."""
    state = _state(ordinal)
    _make_current(state)
    return state.info


def use_device(ordinal: int) -> DeviceInfo:
    """Choose the device later calls use by default."""
    global _default_ordinal
    info = current_device(ordinal)
    _default_ordinal = ordinal
    return info


def synchronize(ordinal: int | None = None) -> None:
    """Wait for all work on the device (``cuCtxSynchronize``)."""
    _make_current(_state(ordinal))
    check("cuCtxSynchronize", driver.cuCtxSynchronize())


def _same_stream(a: int, b: int) -> bool:
    # 0 (the null stream) and 1 (CU_STREAM_LEGACY) both name the legacy default stream.
    return a == b or (a in (0, 1) and b in (0, 1))


def _stream_wait(state: _DeviceState, consumer: int, producer: int) -> None:
    """Order ``consumer`` after the work queued so far on ``producer`` (an event, no host wait)."""
    if state.event is None:
        state.event = check("cuEventCreate",
                            driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    check("cuEventRecord", driver.cuEventRecord(state.event, producer))
    check("cuStreamWaitEvent", driver.cuStreamWaitEvent(consumer, state.event, 0))


def _pointer_device(ptr: int) -> int:
    """The device ordinal owning a CUDA pointer (``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``)."""
    if ptr == 0:
        return ANY_DEVICE
    out = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    if out[0] != _SUCCESS:
        return HOST  # not device memory the driver knows
    return int(out[1])


# ---------------------------------------------------------------------------------------------
# Modules and functions


@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports about a loaded kernel (``cuFuncGetAttribute``)."""

    max_threads_per_block: int
    static_shared_bytes: int
    max_dynamic_shared_bytes: int
    num_regs: int
    local_bytes: int
    const_bytes: int
    ptx_version: int
    binary_version: int
    required_cluster: tuple[int, int, int]


class Module:
    """A loaded cubin (or PTX, JIT-compiled by the driver) in a device's primary context."""

    def __init__(self, handle: Any, state: _DeviceState):
        self.handle = handle
        self._state = state
        self.device: DeviceInfo = state.info
        self.context_key = state.context
        self._functions: dict[str, KernelFunction] = {}
        self._finalizer = weakref.finalize(self, _unload_module, handle, state.context)

    def activate(self, force: bool = False) -> None:
        _make_current(self._state, force)

    def function(self, name: str) -> KernelFunction:
        """The kernel ``name`` (cached)."""
        fn = self._functions.get(name)
        if fn is None:
            self.activate()
            out = driver.cuModuleGetFunction(self.handle, name.encode())
            if out[0] == driver.CUresult.CUDA_ERROR_NOT_FOUND:
                known = self.kernel_names()
                raise LaunchError(KERNEL_NOT_FOUND, f"the module has no kernel named `{name}`",
                                  f"kernels in this module: {', '.join(known) or '(none)'}")
            fn = self._functions[name] = KernelFunction(self, name, check("cuModuleGetFunction", out))
        return fn

    def kernel_names(self) -> list[str]:
        """Names of the module's kernels (empty if the driver cannot enumerate them)."""
        try:
            count = check("cuModuleGetFunctionCount", driver.cuModuleGetFunctionCount(self.handle))
            funcs = check("cuModuleEnumerateFunctions", driver.cuModuleEnumerateFunctions(count, self.handle))
            names = [check("cuFuncGetName", driver.cuFuncGetName(f)) for f in funcs]
            return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)
        except Exception:
            return []

    def unload(self) -> None:
        self._finalizer()


def _in_context(context: Any, operation: Callable[[], Any]) -> None:
    """Run a cleanup ``operation`` with ``context`` pushed, restoring whatever context the
    thread had (finalizers run at arbitrary points, e.g. inside torch code on another device).
    Errors are ignored: this runs from garbage collection and at interpreter exit."""
    try:
        if driver.cuCtxPushCurrent(context)[0] != _SUCCESS:
            return
        try:
            operation()
        finally:
            driver.cuCtxPopCurrent()
    except Exception:
        pass


def _unload_module(handle: Any, context: Any) -> None:
    _in_context(context, lambda: driver.cuModuleUnload(handle))


def _looks_like_text(image: bytes) -> bool:
    return not image.startswith(b"\x7fELF") and not image.startswith(b"\x50\xed\x55\xba")


def load_module(image: bytes | str, device: int | None = None) -> Module:
    """Load a cubin (or a fatbin, or PTX text which the driver JIT-compiles) on a device."""
    if isinstance(image, str):
        image = image.encode()
    if _looks_like_text(image) and not image.endswith(b"\0"):
        image += b"\0"
    state = _state(device)
    _make_current(state)
    out = driver.cuModuleLoadData(image)
    if out[0] == driver.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU:
        raise CudaError("cuModuleLoadData", out[0], f"the binary was built for another architecture than "
                        f"{state.info.arch} ({state.info.name}); compile for this GPU")
    return Module(check("cuModuleLoadData", out), state)


class KernelFunction:
    """One kernel of a module (``CUfunction``)."""

    def __init__(self, module: Module, name: str, handle: Any):
        self.module = module
        self.name = name
        self.handle = handle
        self._attributes: FunctionAttributes | None = None
        self._dynamic_shared_set = 0

    @property
    def attributes(self) -> FunctionAttributes:
        if self._attributes is None:
            A = driver.CUfunction_attribute
            self.module.activate()

            def get(name: str) -> int:
                return int(check(f"cuFuncGetAttribute({name})",
                                 driver.cuFuncGetAttribute(getattr(A, name), self.handle)))

            self._attributes = FunctionAttributes(
                max_threads_per_block=get("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
                static_shared_bytes=get("CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
                max_dynamic_shared_bytes=get("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"),
                num_regs=get("CU_FUNC_ATTRIBUTE_NUM_REGS"),
                local_bytes=get("CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
                const_bytes=get("CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES"),
                ptx_version=get("CU_FUNC_ATTRIBUTE_PTX_VERSION"),
                binary_version=get("CU_FUNC_ATTRIBUTE_BINARY_VERSION"),
                required_cluster=tuple(get(f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{a}")
                                       for a in ("WIDTH", "HEIGHT", "DEPTH")))
        return self._attributes

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Opt in to ``nbytes`` of dynamic shared memory (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_
        SIZE_BYTES``); only done when the default (48 KB minus static) is too small and a larger
        value was not set already."""
        default = DEFAULT_SHARED_LIMIT - self.attributes.static_shared_bytes
        if nbytes <= max(self._dynamic_shared_set, default):
            return
        self.module.activate()
        check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", driver.cuFuncSetAttribute(
            self.handle, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))
        self._dynamic_shared_set = nbytes


# ---------------------------------------------------------------------------------------------
# Device memory


def _free_device_memory(ptr: int, context: Any) -> None:
    _in_context(context, lambda: driver.cuMemFree(ptr))


class DeviceBuffer:
    """A device allocation (``cuMemAlloc``), optionally typed (``dtype``: a language dtype
    name, ``shape``). It exposes ``__cuda_array_interface__`` and ``__dlpack__``, so torch / CuPy
    / the launcher use it in place. Freed by :meth:`free` or when garbage collected."""

    def __init__(self, nbytes: int, *, dtype: str | None = None, shape: Sequence[int] | None = None,
                 device: int | None = None):
        state = _state(device)
        _make_current(state, force=True)
        self.nbytes = int(nbytes)
        self.dtype = dtype
        self.shape = tuple(int(s) for s in shape) if shape is not None else None
        self.device = state.info.ordinal
        self._state = state
        self.ptr = int(check("cuMemAlloc", driver.cuMemAlloc(max(self.nbytes, 1))))
        self._finalizer = weakref.finalize(self, _free_device_memory, self.ptr, state.context)

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: str, device: int | None = None) -> DeviceBuffer:
        return cls(math.prod(shape) * DTYPES[dtype].itemsize, dtype=dtype, shape=shape, device=device)

    @classmethod
    def from_numpy(cls, array: np.ndarray, device: int | None = None, stream: Any = None) -> DeviceBuffer:
        array = np.ascontiguousarray(array)
        buf = cls(array.nbytes, dtype=dtype_from_numpy(array.dtype), shape=array.shape, device=device)
        buf.copy_from_host(array, stream)
        return buf

    def _numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype) if self.dtype else np.dtype(np.uint8)

    def copy_from_host(self, array: np.ndarray, stream: Any = None) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes > self.nbytes:
            raise LaunchError(ARG_SHAPE, f"cannot copy {array.nbytes} bytes into a {self.nbytes}-byte buffer")
        handle = stream_handle(stream)
        _make_current(self._state)
        check("cuMemcpyHtoDAsync",
              driver.cuMemcpyHtoDAsync(self.ptr, array.ctypes.data, array.nbytes, handle))
        check("cuStreamSynchronize", driver.cuStreamSynchronize(handle))

    def copy_to_host(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        """Copy to ``out`` (or a new array of the buffer's dtype and shape) and synchronize."""
        if out is None:
            shape = self.shape if self.shape is not None else (self.nbytes,)
            out = np.empty(shape, dtype=self._numpy_dtype())
        if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes > self.nbytes:
            raise LaunchError(ARG_SHAPE, "copy_to_host needs a writable C-contiguous array of at most "
                              f"{self.nbytes} bytes")
        handle = stream_handle(stream)
        _make_current(self._state)
        check("cuMemcpyDtoHAsync", driver.cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, handle))
        check("cuStreamSynchronize", driver.cuStreamSynchronize(handle))
        return out

    to_numpy = copy_to_host

    def fill_byte(self, value: int) -> None:
        """Set every byte to ``value`` (poisoning outputs in tests) and synchronize."""
        _make_current(self._state)
        check("cuMemsetD8", driver.cuMemsetD8(self.ptr, value & 0xFF, max(self.nbytes, 1)))
        check("cuCtxSynchronize", driver.cuCtxSynchronize())

    def free(self) -> None:
        self._finalizer()

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


def _describe_device_buffer(buf: DeviceBuffer, stream: int) -> ArrayInfo:
    shape = buf._typed_shape()
    return ArrayInfo(buf.ptr, buf.dtype, buf.dtype or "untyped", shape,
                     dlpack.compact_strides(shape), True, buf.device, f"cuda:{buf.device}", False,
                     "DeviceBuffer")


register_array_type(DeviceBuffer, _describe_device_buffer)


# ---------------------------------------------------------------------------------------------
# The launcher


class _Call:
    """Launch scratch (one per launcher, reused under its lock): the stream, host copies to undo,
    producer streams to wait on, objects to keep alive until the launch is queued, and array
    infos for derived parameters."""

    __slots__ = ("infos", "keep", "staged", "stream", "waits")

    def __init__(self, stream: int, n_infos: int):
        self.stream = stream
        self.staged: list[tuple[DeviceBuffer, np.ndarray, bool, str]] | None = None  # (copy, host, written, name)
        self.waits: list[int] | None = None
        self.keep: list[Any] | None = None
        self.infos: list[ArrayInfo | None] | None = [None] * n_infos if n_infos else None


def _stage_host_array(name: str, info: ArrayInfo, writes: bool, call: _Call, device: int) -> int:
    """Copy a host array to a fresh device buffer (on the launch stream); remember to copy it
    back after the launch when the kernel writes it. The same host memory passed twice shares one
    copy; a partial overlap with a write is SP0750 (``arguments.shared_host_copy``)."""
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
        check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(buf.ptr, host.ctypes.data, host.nbytes,
                                                             call.stream))
    return buf.ptr


def _finish_host_copies(call: _Call, launched: bool) -> None:
    """Copy written host arrays back, synchronize the stream, free the staging buffers. After a
    failed launch (an exception is already propagating) only synchronize and free."""
    try:
        if launched:
            for buf, host, written, _ in call.staged:
                if written and host.nbytes:
                    check("cuMemcpyDtoHAsync",
                          driver.cuMemcpyDtoHAsync(host.ctypes.data, buf.ptr, host.nbytes, call.stream))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(call.stream))
        else:
            driver.cuStreamSynchronize(call.stream)
    finally:
        for buf, *_ in call.staged:
            buf.free()


_U64 = struct.Struct("<Q")


def _no_pack(view: Any, offset: Any, value: int) -> None:
    """Array-only arguments have no slot of their own."""


class _NoGrid:
    """The type of the cached grid before the first launch (no grid is ever of this type)."""


class Launcher:
    """Launches one compiled kernel. Built once per compiled kernel; ``launcher(grid, args,
    kwargs, stream=...)`` converts the arguments into the preallocated parameter buffer and
    launches. ``block`` (or ``num_warps``), ``dynamic_shared`` and ``cluster`` are fixed at
    compile time; ``static_shared`` defaults to what the driver reports for the kernel."""

    def __init__(self, function: KernelFunction, spec: ParamSpec, *, num_warps: int | None = None,
                 block: Any = None, static_shared: int | None = None, dynamic_shared: int = 0,
                 cluster: Any = (1, 1, 1), allow_host_copies: bool = True):
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
        self._config = None
        if math.prod(self.cluster) > 1:
            self._config = (cudalib.cluster_config(self.block, self.dynamic_shared, self.cluster) if raw_ex
                            else self._cluster_config())
        self._last_grid: Any = None
        self._last_grid_type: type = _NoGrid
        self._last_dims: tuple[int, int, int] = (1, 1, 1)
        self._n_user = len(self._binder.names)
        self._n_infos = len(self._needs_info)
        self._handle = cudalib.handle_int(function.handle) if raw_launch or raw_ex else function.handle
        self._bx, self._by, self._bz = self.block
        self._params_address = self._buffer.address
        self._context_key = self._module.context_key
        self._scratch = _Call(0, self._n_infos)

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
        self._converters: list[Callable[[Any, _Call], None]] = []
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

    def _cluster_config(self) -> Any:
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = self.cluster
        config = driver.CUlaunchConfig()
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block
        config.sharedMemBytes = self.dynamic_shared
        config.attrs = [attr]
        config.numAttrs = 1
        self._cluster_attribute = attr  # kept alive alongside the config that refers to it
        return config

    def _array_info(self, name: str, value: Any, call: _Call, what: str, info: ArrayInfo | None = None
                    ) -> ArrayInfo:
        if info is None:
            info = describe_array(value, call.stream)
        if info is None:
            raise LaunchError(ARG_KIND, f"argument `{name}` expects {what}, got {type(value).__name__}",
                              "pass a numpy array, a CUDA tensor/array (torch, CuPy, JAX) or a DeviceBuffer")
        if info.device == UNKNOWN_DEVICE:
            info = info._replace(device=_pointer_device(info.ptr))
            if info.device == HOST:
                raise LaunchError(ARG_DEVICE, f"argument `{name}` ({info.source}) does not point to CUDA "
                                  "device memory")
        return info

    def _device_pointer(self, name: str, info: ArrayInfo, writes: bool, call: _Call) -> int:
        if info.device == HOST:
            return _stage_host_array(name, info, writes, call, self.device.ordinal)
        if info.stream is not None and not _same_stream(info.stream, call.stream):
            call.waits = [*(call.waits or ()), info.stream]
        if info.keepalive is not None:
            call.keep = [*(call.keep or ()), info.keepalive]
        return info.ptr

    def _pointer_converter(self, p: Any, offset: int | None, info_slot: int | None
                           ) -> Callable[[Any, _Call], None]:
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

        def convert(value: Any, call: _Call) -> None:
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
                    and not (info.readonly and writes) and info.stream is None and info.keepalive is None):
                pack(view, offset, info.ptr)  # the common case: a matching array on this device
            else:
                info = self._array_info(name, value, call, f"an array (pointer to {dtype})", info)
                check_array_argument(name, dtype, info, device=ordinal, allow_host=self.allow_host_copies,
                                     writes=writes, aligned16=aligned16, contiguous=p.contiguous)
                ptr = self._device_pointer(name, info, writes, call)
                pack(view, offset, ptr)
                if ptr != info.ptr:  # staged host array: derived parameters describe the device copy
                    info = info._replace(ptr=ptr, device=ordinal, host=None)
            if info_slot is not None:
                call.infos[info_slot] = info

        return convert

    def _tensormap_converter(self, p: TensorMapParam, offset: int, info_slot: int | None
                             ) -> Callable[[Any, _Call], None]:
        view, ordinal, cache = self._buffer.view, self.device.ordinal, self._tensor_maps
        end = offset + TENSOR_MAP_BYTES

        def convert(value: Any, call: _Call) -> None:
            if isinstance(value, TensorMap):
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
            if ptr != info.ptr:
                info = info._replace(ptr=ptr, device=ordinal)
            key = (info.ptr, info.shape, info.strides)
            data = cache.get(key)
            if data is None:
                data = cache.put(key, make_tensor_map(p.spec_for(info), info.ptr, device=ordinal).data)
            view[offset:end] = data
            if info_slot is not None:
                call.infos[info_slot] = info

        return convert

    def _scalar_converter(self, p: Any, offset: int) -> Callable[[Any, _Call], None]:
        return scalar_writer(p, offset, self._buffer.view)

    def _constexpr_converter(self, p: Any) -> Callable[[Any, _Call], None]:
        expected = p.value

        def convert(value: Any, call: _Call) -> None:
            if expected is None or value is MISSING:
                return
            try:
                same = bool(value == expected)
            except Exception:
                same = False
            if not same:
                raise LaunchError(CONSTEXPR, f"argument `{p.name}` = {value!r}, but the kernel was compiled "
                                  f"for {p.name} = {expected!r}", "recompile for this value (or pass "
                                  f"{expected!r})")

        return convert

    def _derived_tensormap_writer(self, p: TensorMapParam, offset: int, info_slot: int
                                  ) -> Callable[[_Call], None]:
        view, ordinal, end = self._buffer.view, self.device.ordinal, offset + TENSOR_MAP_BYTES
        cache = TensorMapCache(TENSOR_MAP_CACHE_SIZE)

        def write(call: _Call) -> None:
            info = call.infos[info_slot]
            key = (info.ptr, info.shape, info.strides)
            data = cache.get(key)
            if data is None:
                data = cache.put(key, make_tensor_map(p.spec_for(info), info.ptr, device=ordinal).data)
            view[offset:end] = data

        return write

    def _derived_writer(self, p: Any, offset: int, info_slot: int) -> Callable[[_Call], None]:
        view, size = self._buffer.view, DTYPES[p.dtype].itemsize
        packer = struct.Struct(DTYPES[p.dtype].struct_format)

        def write(call: _Call) -> None:
            value = derived_value(p, call.infos[info_slot])
            try:
                packer.pack_into(view, offset, value)
            except struct.error:  # out of range for the parameter's type: the diagnostic
                view[offset:offset + size] = encode_scalar(p.dtype, value, p.name)

        return write

    # -- launching ----------------------------------------------------------------------------

    def _grid(self, grid: Any, values: Sequence[Any]) -> tuple[int, int, int]:
        if callable(grid):
            grid = grid(dict(zip(self._binder.names, values)))
        cacheable = type(grid) is int or type(grid) is tuple
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
        try:
            if type(grid) is self._last_grid_type and grid == self._last_grid:
                dims = self._last_dims
            else:
                dims = self._grid(grid, values)
            for convert, value in zip(self._converters, values):
                convert(value, call)
            for write in self._derived:
                write(call)
            if call.staged or getattr(_tls, "context", None) is not self._context_key:
                self._module.activate(force=True)
            if call.waits:
                for producer in call.waits:
                    _stream_wait(self._module._state, handle, producer)
            if self._config is None:
                err = self._launch_kernel(self._handle, dims[0], dims[1], dims[2], self._bx, self._by,
                                          self._bz, self.dynamic_shared, handle, self._params_address, 0)[0]
                if err != _SUCCESS:
                    self._launch_failed(err, dims, handle)
            else:
                self._launch_cluster(dims, handle)
            launched = True
        finally:
            try:
                if call.staged:
                    _finish_host_copies(call, launched)
            finally:
                call.staged = call.waits = call.keep = None
                self._release()

    def launch(self, grid: Any, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        """``launcher.launch(grid, x, y, n=...)``: the same as ``launcher(grid, args, kwargs)``."""
        self(grid, args, kwargs, stream=stream)

    def _launch_cluster(self, dims: tuple[int, int, int], stream: int) -> None:
        config = self._config
        config.gridDimX, config.gridDimY, config.gridDimZ = dims
        config.hStream = stream
        err = self._launch_kernel_ex(config, self._handle, self._params_address, 0)[0]
        if err != _SUCCESS:
            self._launch_failed(err, dims, stream)

    def _launch_failed(self, err: Any, dims: tuple[int, int, int], stream: int) -> None:
        """Retry once when another context was made current behind our back (torch/CuPy on
        another device), else raise."""
        name = "cuLaunchKernelEx" if self._config is not None else "cuLaunchKernel"
        if err in _RETRY_AFTER_CONTEXT_SWITCH:
            self._module.activate(force=True)
            if self._config is None:
                err = self._launch_kernel(self._handle, dims[0], dims[1], dims[2], self._bx, self._by, self._bz,
                                          self.dynamic_shared, stream, self._params_address, 0)[0]
            else:
                config = self._config
                err = self._launch_kernel_ex(config, self._handle, self._params_address, 0)[0]
            if err == _SUCCESS:
                return
        raise CudaError(name, err)

    def param_bytes(self, index: int) -> bytes:
        """The current bytes of kernel parameter ``index`` (for tests and debugging)."""
        return self._buffer.slot_bytes(index)


# ---------------------------------------------------------------------------------------------
# Launch overhead


_EMPTY_KERNEL_PTX = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry sparsile_empty(.param .u64 x, .param .u64 y, .param .u32 n)
{
    ret;
}
"""


@dataclass(frozen=True)
class LaunchOverhead:
    """Host time per launch of an empty kernel, in microseconds: the bare ``cuLaunchKernel``
    call with prebuilt parameters, the :class:`Launcher` with raw addresses, with DeviceBuffers
    and (when torch with CUDA is importable) with torch tensors."""

    n: int
    driver_us: float
    launcher_int_us: float
    launcher_buffer_us: float
    launcher_torch_us: float | None


def _time_per_call(fn: Callable[[], None], n: int) -> float:
    for _ in range(min(n, 50)):
        fn()
    synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    synchronize()
    return (time.perf_counter() - start) / n * 1e6


def measure_launch_overhead(n: int = 2000) -> LaunchOverhead:
    """Measure per-launch host overhead on the current device (needs a GPU)."""
    from .arguments import PointerParam, ScalarParam

    module = load_module(_EMPTY_KERNEL_PTX)
    fn = module.function("sparsile_empty")
    spec = ParamSpec((PointerParam("x", "f32", aligned16=True), PointerParam("y", "f32", aligned16=True),
                      ScalarParam("n", "i32")), kernel_name="sparsile_empty")
    launcher = Launcher(fn, spec, num_warps=1)
    x, y = DeviceBuffer.empty((1024,), "f32"), DeviceBuffer.empty((1024,), "f32")
    raw = ParamBuffer(layout_slots([(8, 8), (8, 8), (4, 4)]))
    _U64.pack_into(raw.view, 0, x.ptr)
    _U64.pack_into(raw.view, 8, y.ptr)

    def bare() -> None:
        check("cuLaunchKernel", driver.cuLaunchKernel(fn.handle, 1, 1, 1, 32, 1, 1, 0, 0, raw.address, 0))

    driver_us = _time_per_call(bare, n)
    int_us = _time_per_call(lambda: launcher(1, (x.ptr, y.ptr, 1024)), n)
    buffer_us = _time_per_call(lambda: launcher(1, (x, y, 1024)), n)
    torch_us = None
    try:
        import torch

        if torch.cuda.is_available():
            tx = torch.empty(1024, device=f"cuda:{module.device.ordinal}")
            ty = torch.empty_like(tx)
            torch_us = _time_per_call(lambda: launcher(1, (tx, ty, 1024)), n)
    except ImportError:
        pass
    x.free()
    y.free()
    module.unload()
    return LaunchOverhead(n, driver_us, int_us, buffer_us, torch_us)


__all__ = [
    "CudaError", "DeviceBuffer", "DeviceInfo", "FunctionAttributes", "KernelFunction", "LaunchOverhead",
    "Launcher", "Module", "check", "current_device", "device_count", "error_text", "has_gpu", "load_module",
    "measure_launch_overhead", "synchronize", "use_device",
]
