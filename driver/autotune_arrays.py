"""What the autotuner does to a call's arrays around its timed launches (``reset_to_zero`` zeroing,
``restore_value`` saving and restoring, a config's ``pre_hook``), ordered on the stream the launches
run on (docs/autotune.md, "Streams").

The timer queues launches back to back on the launch stream, which may be a non-blocking stream:
work queued anywhere else (the legacy default stream, torch's current stream) is not ordered with
them, so a zeroing there could run while the previous repetition's kernel still accumulates, or
after the next one started. Here every such operation goes to the launch stream itself:

* a :class:`~sparsile.backend.runtime.memory.DeviceBuffer`: ``fill_byte(0, stream=)`` (a
  ``cuMemsetD8Async`` there, no host wait) and its copies on that stream;
* a torch CUDA tensor: its own operations with the launch stream as torch's current stream;
* another dense device array (CuPy, Numba, DLPack): a memset / copies by its pointer on that stream;
* host memory (numpy, a CPU tensor): in place on the host (the launcher copies host arrays to the
  device at each launch and synchronizes);
* another device array that is not dense: in place, between a synchronize of the launch stream
  and one of its device (its own library's stream is unknown here).

The CUDA runtime is imported only when a device array is met (``import sparsile`` loads none).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np


def launch_stream(bound: Mapping[str, Any], stream: Any) -> int:
    """The handle of the stream a launch with the ``bound`` arguments and ``stream=`` runs on, as
    driver/launch.py resolves it: the given stream; without one, torch's current stream of the
    launch's GPU where an argument is a torch CUDA tensor, else the legacy default stream (0)."""
    from ..backend.runtime.arrays import is_torch_type
    from ..backend.runtime.launch_config import stream_handle

    if stream is not None:
        return stream_handle(stream)
    for value in bound.values():
        if is_torch_type(type(value)) and value.is_cuda:
            from .prepared import torch_current_stream

            return torch_current_stream(value.get_device())
    return 0


@contextlib.contextmanager
def torch_on_stream(handle: int, device: Any) -> Iterator[None]:
    """``handle`` as torch's current stream of ``device`` (a torch device or ordinal) inside the
    block, so that torch operations there are queued on it; nothing to do without torch with CUDA,
    or where it is the current stream already."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or device is None:
        yield
        return
    if torch.cuda.current_stream(device).cuda_stream == handle:
        yield
        return
    # handle 0: the legacy default stream, torch's default stream (ExternalStream takes no null handle)
    stream = torch.cuda.default_stream(device) if handle == 0 else torch.cuda.ExternalStream(handle, device=device)
    with torch.cuda.stream(stream):
        yield


def _is_torch(x: Any) -> bool:
    from ..backend.runtime.arrays import is_torch_type

    return is_torch_type(type(x))


def _dense_device_array(x: Any, handle: int) -> tuple[int, int, int | None] | None:
    """(pointer, bytes, device ordinal or None) of a dense device array other than torch's and a
    DeviceBuffer; None for host memory, an array that is not dense, or one that cannot say. A DLPack
    producer is told the launch stream ``handle`` (it orders its pending work before it)."""
    from ..backend.runtime import arrays
    from ..backend.runtime.devices import pointer_device

    info = arrays.describe_array(x, handle)
    if info is None or info.device == arrays.HOST or info.device == arrays.FOREIGN_DEVICE:
        return None
    if not info.contiguous or info.dtype is None:
        return None
    device = info.device
    if device == arrays.UNKNOWN_DEVICE:
        device = pointer_device(info.ptr)
    return info.ptr, info.nbytes, device if device >= 0 else None


def _is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray) or (_is_torch(x) and not x.is_cuda)


@contextlib.contextmanager
def _fenced(handle: int, x: Any) -> Iterator[None]:
    """For a device array that is not dense (its library's stream unknown): the launch stream's work
    finished before the block, every stream of its device after."""
    from ..backend import runtime
    from ..driver.array_devices import array_device

    runtime.check("cuStreamSynchronize", _driver().cuStreamSynchronize(handle))
    yield
    runtime.synchronize(array_device(x))


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def zero(x: Any, handle: int) -> None:
    """Zero the array ``x`` on the launch stream ``handle`` (queued there, not waited for, where it
    is device memory)."""
    if _is_host(x):
        if _is_torch(x):
            x.zero_()
        else:
            x[...] = 0
    elif _is_torch(x):
        with torch_on_stream(handle, x.device):
            x.zero_()
    elif hasattr(x, "fill_byte"):
        x.fill_byte(0, stream=handle)
    elif (dense := _dense_device_array(x, handle)) is not None:
        from ..backend.runtime.memory import fill_device_bytes

        fill_device_bytes(dense[0], dense[1], 0, handle, dense[2])
    else:
        with _fenced(handle, x):
            x[...] = 0


def snapshot(x: Any, handle: int) -> Callable[[], None]:
    """A function that puts ``x``'s current contents back; the copy and the restore are ordered on
    the launch stream ``handle`` (after the caller's work queued there, before the launch after)."""
    if _is_torch(x):
        device = x.device if x.is_cuda else None
        with torch_on_stream(handle, device):
            saved = x.clone()

        def restore_tensor() -> None:
            with torch_on_stream(handle, device):
                x.copy_(saved)
        return restore_tensor
    if hasattr(x, "copy_to_host") and hasattr(x, "copy_from_host"):  # DeviceBuffer
        host = x.copy_to_host(stream=handle)
        return lambda: x.copy_from_host(host, stream=handle)
    dense = None if isinstance(x, np.ndarray) else _dense_device_array(x, handle)
    if dense is not None:
        from ..backend.runtime.memory import copy_device_to_host, copy_host_to_device

        ptr, nbytes, device = dense
        kept = np.empty(nbytes, np.uint8)
        copy_device_to_host(ptr, kept, handle, device)
        return lambda: copy_host_to_device(ptr, kept, handle, device)
    if isinstance(x, np.ndarray):
        saved = x.copy()

        def restore_host() -> None:
            x[...] = saved
        return restore_host
    with _fenced(handle, x):
        copied = x.copy()

    def restore_fenced() -> None:
        with _fenced(handle, x):
            x[...] = copied
    return restore_fenced


def hook_stream(handle: int, device: int | None) -> contextlib.AbstractContextManager[None]:
    """Where a config's ``pre_hook`` runs: with the launch stream as torch's current stream of the
    launch's GPU (``device``; None: torch's current device), so that the torch operations of a hook
    (``args["out"].zero_()``) are ordered before the launch it precedes."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch_on_stream(handle, torch.cuda.current_device() if device is None else device)
