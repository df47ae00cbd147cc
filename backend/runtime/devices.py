"""The CUDA driver, devices and contexts: driver results and errors, device discovery and
properties, each device's primary context made current per thread, stream ordering and the owner
of a pointer.

Built on ``cuda.bindings.driver`` (cuda-python 13). Every driver call returns a tuple whose first
element is a ``CUresult``; :func:`check` turns a failure into :class:`CudaError` (SP0715) naming
the call and the driver's own error string. Nothing here touches the driver at import time, so the
module imports (and its pure parts are tested) on machines without a GPU.

Contexts: each device's *primary* context is retained (the one the CUDA runtime, torch and CuPy
use too). An operation on a device makes its context current on the calling thread for its own
duration only (:func:`enter` or :func:`switch` ... :func:`leave`, or :func:`context_of`) and then restores the
context the thread had, as a torch op's device guard does: the CUDA runtime (torch among its users)
reads the thread's current context as its current device (docs/language.md, "Specialization and
launching"). :data:`tls` remembers per thread the context current as far as sparsile knows (the
launchers read it to skip every driver call when their context is already current, the one-GPU
common case); :data:`default_ordinal` is the device chosen by :func:`use_device`, whose context
stays current (an explicit choice, like ``torch.cuda.set_device``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver

from ...frontend.diagnostics import LaunchError
from .arrays import ANY_DEVICE, HOST
from .codes import CAPTURE_SYNC, DRIVER, NO_GPU

SUCCESS = driver.CUresult.CUDA_SUCCESS
RETRY_AFTER_CONTEXT_SWITCH = (driver.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                              driver.CUresult.CUDA_ERROR_INVALID_HANDLE)


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
        if err == SUCCESS and text:
            return name, text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    except Exception:
        pass
    return name, "no description available"


def check(call: str, out: Any) -> Any:
    """Unpack a driver result tuple: raise :class:`CudaError` unless ``out[0]`` is success;
    return None, the single value, or the tuple of values."""
    err = out[0]
    if err != SUCCESS:
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
class DeviceState:
    """A device the process uses: its properties, handle, retained primary context and the event
    that orders one stream after another."""

    info: DeviceInfo
    device: Any
    context: Any
    event: Any = None


_lock = threading.RLock()
tls = threading.local()
"""Per thread: ``context``, the context current on the thread as far as sparsile knows: the one it
made current or restored last (a retained primary context is always the very object of its
:class:`DeviceState`, so launchers compare it by identity); None: unknown or none."""
_devices: dict[int, DeviceState] = {}
_contexts: dict[int, Any] = {}
"""The retained primary contexts by handle address (what :func:`leave` caches for a restored one)."""
_initialized = False
default_ordinal = 0
"""The device later calls use by default (set by :func:`use_device`)."""


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


def device_state(ordinal: int | None = None) -> DeviceState:
    """The state of device ``ordinal`` (default :data:`default_ordinal`), initializing the driver
    and retaining the device's primary context the first time."""
    ordinal = default_ordinal if ordinal is None else ordinal
    state = _devices.get(ordinal)
    if state is not None:
        return state
    with _lock:
        if ordinal in _devices:
            return _devices[ordinal]
        count = _init_driver()
        if not 0 <= ordinal < count:
            raise LaunchError(NO_GPU, f"there is no CUDA device {ordinal} ({count} visible)",
                              f"use a device index from 0 to {count - 1} (nvidia-smi, CUDA_VISIBLE_DEVICES)"
                              if count else "check CUDA_VISIBLE_DEVICES and nvidia-smi")
        dev = check("cuDeviceGet", driver.cuDeviceGet(ordinal))
        ctx = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
        state = DeviceState(_query_device(ordinal, dev), dev, ctx)
        _contexts[int(ctx)] = ctx
        _devices[ordinal] = state
        return state


def enter(state: DeviceState) -> Any:
    """Make the device's primary context current on this thread for one operation: None when it
    already is as far as the per-thread cache knows (no driver call: the one-GPU common path),
    else :func:`switch`. Pass the result to :func:`leave` when the operation ends (also when it
    fails)."""
    if getattr(tls, "context", None) is state.context:
        return None
    return switch(state)


def switch(state: DeviceState) -> Any:
    """Make the device's primary context current on this thread whatever the per-thread cache
    says (``cuCtxGetCurrent`` first: torch or CuPy may have switched contexts behind it). Returns
    what :func:`leave` must restore: None when the context was current already, or when no context
    was and ``state`` is sparsile's current device (:func:`use_device`; its context then stays
    current, as the CUDA runtime would make it), else the context the thread had (a null one when
    it had none)."""
    context = state.context
    previous = check("cuCtxGetCurrent", driver.cuCtxGetCurrent())
    had = int(previous)
    if had == int(context):
        tls.context = context
        return None
    tls.context = None  # unknown until the switch succeeded
    check("cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
    tls.context = context
    if not had and state.info.ordinal == default_ordinal:
        return None
    return previous


def leave(previous: Any) -> None:
    """Restore the context :func:`enter` / :func:`switch` returned (nothing for None), and the
    per-thread cache with it."""
    if previous is None:
        return
    tls.context = None
    check("cuCtxSetCurrent", driver.cuCtxSetCurrent(previous))
    had = int(previous)
    tls.context = _contexts.get(had, previous) if had else None


@contextmanager
def context_of(state: DeviceState) -> Iterator[None]:
    """``with context_of(state):`` the device's context current inside, the thread's own after.
    For the operations off the launch path (allocations, copies, module loads, tensor-map
    encodes, synchronizations): it asks the driver which context is current (:func:`switch`)
    rather than trusting the per-thread cache, which torch may have made stale (a launch instead
    trusts it and retries once when the driver refuses it)."""
    previous = switch(state)
    try:
        yield
    finally:
        leave(previous)


def current_device(ordinal: int | None = None) -> DeviceInfo:
    """The :class:`DeviceInfo` of device ``ordinal`` (default: the one chosen by
    :func:`use_device`, initially 0), initializing the driver and retaining the device's primary
    context the first time. Cached; the thread's current context is left as it is."""
    return device_state(ordinal).info


def use_device(ordinal: int) -> DeviceInfo:
    """Choose the device later calls use by default (host arrays' launches among them) and make
    its primary context current on this thread, where it stays, as ``torch.cuda.set_device`` /
    ``cudaSetDevice`` do."""
    global default_ordinal
    state = device_state(ordinal)
    switch(state)  # (its result: the context stays current, nothing to restore)
    default_ordinal = ordinal
    return state.info


@contextmanager
def using_device(ordinal: int) -> Iterator[DeviceInfo]:
    """``with using_device(n):`` device ``n`` is sparsile's current device inside (as after
    :func:`use_device`: :data:`default_ordinal`, its context current on this thread), the previous
    choice and the thread's context after. For code that reads the current device rather than
    taking one, as a tuner's ``benchmarker=`` does (bench.py's :func:`~.bench.on_device`).
    :data:`default_ordinal` is the process's, like :func:`use_device`'s choice: other threads see
    ``n`` as current while it lasts too, and another thread's ``using_device`` waits for it to end
    (two blocks that overlapped restored each other's choice out of order: the first saw the
    second's device as current, the second the first's previous one, and the process was left on
    the first's device). A block inside one of the same thread nests."""
    global default_ordinal
    with _using_lock:
        state = device_state(ordinal)
        before = default_ordinal
        previous = switch(state)
        default_ordinal = ordinal
        try:
            yield state.info
        finally:
            default_ordinal = before
            leave(previous)


_using_lock = threading.RLock()
"""Held by :func:`using_device` for its block (one thread's block at a time; nested ones of the same thread)."""


def synchronize(ordinal: int | None = None) -> None:
    """Wait for all work on the device (``cuCtxSynchronize``), then release what garbage
    collection left behind (release.py). Refused (SP0752) while a stream of the device known to
    capture CUDA graphs is capturing (:func:`~.capture_mode.captures_under_way`): a device-wide
    synchronize would invalidate that capture, in any capture mode (capture_mode.py)."""
    from .capture_mode import captures_under_way
    from .release import drain

    state = device_state(ordinal)
    if captures_under_way(state.info.ordinal):
        raise LaunchError(
            CAPTURE_SYNC,
            f"runtime.synchronize() waits for all work on cuda:{state.info.ordinal}, where a CUDA graph is being "
            "captured (another thread's torch.cuda.graph, or this thread's); a device-wide synchronize now would "
            "invalidate that capture",
            help="synchronize the stream you launched on instead (torch.cuda.current_stream().synchronize(), "
                 "DeviceBuffer.copy_to_host), or call synchronize() after the capture has ended")
    with context_of(state):
        check("cuCtxSynchronize", driver.cuCtxSynchronize())
    drain()


def same_stream(a: int, b: int) -> bool:
    """Whether two stream handles name the same stream."""
    # 0 (the null stream) and 1 (CU_STREAM_LEGACY) both name the legacy default stream.
    return a == b or (a in (0, 1) and b in (0, 1))


def stream_wait(state: DeviceState, consumer: int, producer: int) -> None:
    """Order ``consumer`` after the work queued so far on ``producer`` (an event, no host wait)."""
    if state.event is None:
        state.event = check("cuEventCreate",
                            driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))
    check("cuEventRecord", driver.cuEventRecord(state.event, producer))
    check("cuStreamWaitEvent", driver.cuStreamWaitEvent(consumer, state.event, 0))


def pointer_device(ptr: int) -> int:
    """The device ordinal owning a CUDA pointer (``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL``)."""
    if ptr == 0:
        return ANY_DEVICE
    out = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    if out[0] != SUCCESS:
        return HOST  # not device memory the driver knows
    return int(out[1])


def in_context(context: Any, operation: Callable[[], Any]) -> None:
    """Run a cleanup ``operation`` with ``context`` pushed, restoring whatever context the
    thread had (finalizers run at arbitrary points, e.g. inside torch code on another device).
    Errors are ignored: this runs from garbage collection and at interpreter exit."""
    try:
        if driver.cuCtxPushCurrent(context)[0] != SUCCESS:
            return
        try:
            operation()
        finally:
            driver.cuCtxPopCurrent()
    except Exception:
        pass
