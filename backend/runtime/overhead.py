"""Launch overhead: the host time per launch of an empty kernel (:func:`measure_launch_overhead`),
for the bare driver call and for the :class:`~sparsile.backend.runtime.launcher.Launcher` with each
kind of argument (needs a GPU)."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from cuda.bindings import driver

from .devices import check, synchronize
from .launcher import Launcher
from .memory import DeviceBuffer
from .module import load_module
from .params import ParamBuffer, ParamSpec, PointerParam, ScalarParam, layout_slots

_U64 = struct.Struct("<Q")


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
