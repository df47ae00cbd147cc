"""The runtime: CUDA driver, devices, modules, device buffers and the kernel launcher.

This package is the runtime's public face (``from sparsile.backend import runtime``); each job
lives in a module of its own:

====================  =============================================================================
``devices.py``        driver results and errors (:func:`check`, :class:`CudaError`), devices and
                      their primary contexts, stream ordering, the owner of a pointer
``module.py``         :func:`load_module`, :class:`Module`, :class:`KernelFunction`
``memory.py``         :class:`DeviceBuffer` (device memory)
``release.py``        driver releases of collected resources, deferred to a safe point
``capture_mode.py``   the thread's stream-capture mode around eager allocations and releases
``launcher.py``       :class:`Launcher`: parameter packing and the launch
``staging.py``        host arrays copied in and out around a launch
``overhead.py``       :func:`measure_launch_overhead`
``arguments.py``      the launch arguments' public face, over ``codes.py`` (SP07xx), ``dtypes.py``,
                      ``scalars.py``, ``params.py`` (:class:`~.params.ParamSpec` and the parameter
                      kinds), ``arrays.py`` (numpy, torch, CUDA array interface and DLPack
                      arguments) and ``launch_config.py`` (grid, block, shared memory, cluster,
                      stream)
``tensormap.py``      TMA tensor maps
``cudalib.py``        libcuda through ctypes for the launch hot path
``native_launch.py``  launch records replayed by llvmlite-compiled code (the JAX handler,
                      the torch launch record)
``graph_objects.py``  knowing when a CUDA graph is destroyed (user objects, a native callback)
``dlpack``            DLPack capsules in and out (frontend/dlpack.py: the interpreter reads them too)
``bench.py``          timing kernels for the autotuner
====================  =============================================================================

Nothing here touches the driver at import time, so the package imports (and its pure parts are
tested) on machines without a GPU.
"""

from __future__ import annotations

from ...frontend import dlpack
from . import arguments, cudalib, devices, tensormap
from .devices import (
    RETRY_AFTER_CONTEXT_SWITCH,
    SUCCESS,
    CudaError,
    DeviceInfo,
    check,
    current_device,
    device_count,
    error_text,
    has_gpu,
    pointer_device,
    same_stream,
    stream_wait,
    synchronize,
    use_device,
)
from .launcher import Launcher
from .memory import DeviceBuffer
from .module import FunctionAttributes, KernelFunction, Module, load_module
from .overhead import LaunchOverhead, measure_launch_overhead
from .tensormap import make_tensor_map

__all__ = [
    "RETRY_AFTER_CONTEXT_SWITCH", "SUCCESS", "CudaError", "DeviceBuffer", "DeviceInfo", "FunctionAttributes",
    "KernelFunction", "LaunchOverhead", "Launcher", "Module", "arguments", "check", "cudalib", "current_device",
    "device_count", "devices", "dlpack", "error_text", "has_gpu", "load_module", "make_tensor_map",
    "measure_launch_overhead", "pointer_device", "same_stream", "stream_wait", "synchronize", "tensormap",
    "use_device",
]
