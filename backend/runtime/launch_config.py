"""The launch configuration: grid, block, shared memory, cluster and programmatic dependent launch,
checked against a device's limits (a :class:`~sparsile.backend.runtime.devices.DeviceInfo` or any object with the same
attributes, so that tests pass their own), and ``stream=`` arguments read as ``CUstream`` handles."""

from __future__ import annotations

import ctypes
import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...frontend.diagnostics import LaunchError
from .codes import BLOCK, CLUSTER, GRID, PDL, SHARED_MEMORY, STREAM
from .scalars import describe_value

if TYPE_CHECKING:
    from .devices import DeviceInfo


def _dims(value: Any, what: str, code: str) -> tuple[int, int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = [int(value)]
    elif isinstance(value, Sequence) and not isinstance(value, str) and 1 <= len(value) <= 3:
        items = list(value)
    else:
        raise LaunchError(code, f"{what} must be an int or a tuple of 1 to 3 ints, got "
                          f"{describe_value(value)}")
    for item in items:
        if not isinstance(item, numbers.Integral) or isinstance(item, bool):
            raise LaunchError(code, f"{what} {tuple(items)} contains the non-integer {item!r}")
    dims = [int(i) for i in items] + [1] * (3 - len(items))
    return dims[0], dims[1], dims[2]


INTS = frozenset((int,))
"""``INTS.issuperset(map(type, grid))``: whether every dimension of a sequence grid is a Python int.
A launch path that remembers the last grid it checked takes a new one for it only then (and when
equal): ``(4.0,)``, a numpy float or array, a torch scalar tensor compare equal to ``(4,)`` but are
SP0710 (and an array of several elements cannot be compared at all). Only such grids are
remembered (:func:`rememberable_grid`), so the very grid remembered (``grid is last``, a hoisted
or constant tuple: the common case, no check at all) is the one checked."""


def rememberable_grid(grid: Any) -> bool:
    """Whether a launch path may remember ``grid`` as the last one it checked: a Python int or a
    tuple of them (immutable: a list changed in place after a launch is still the same object, and
    equal to itself)."""
    return type(grid) is int or (type(grid) is tuple and INTS.issuperset(map(type, grid)))


def normalize_grid(grid: Any, limits: DeviceInfo) -> tuple[int, int, int]:
    """``grid`` as ``(x, y, z)``, checked against the device's maximum grid dimensions. A dimension
    may be 0 (an empty grid: see :func:`is_empty_grid`); a negative one is SP0710."""
    dims = _dims(grid, "grid", GRID)
    for axis, (n, most) in enumerate(zip(dims, limits.max_grid_dims)):
        if n < 0:
            raise LaunchError(GRID, f"grid {dims} has {n} blocks along {'xyz'[axis]}; a grid dimension cannot "
                              "be negative", "compute grid sizes that are 0 or more (a grid with a 0 dimension "
                              "launches nothing)")
        if n > most:
            raise LaunchError(GRID, f"grid {dims} exceeds the device limit along {'xyz'[axis]} "
                              f"({n} > {most} on {limits.name})",
                              "use a persistent kernel or move work to another grid dimension")
    return dims


def is_empty_grid(dims: tuple[int, int, int]) -> bool:
    """Whether the normalized grid ``dims`` has no blocks (a 0 dimension). Its launch checks every
    argument as any launch does and then launches nothing: CUDA refuses a 0 grid dimension
    (``CUDA_ERROR_INVALID_VALUE``), so no launch path passes one to the driver (docs/language.md,
    "Specialization and launching")."""
    return dims[0] == 0 or dims[1] == 0 or dims[2] == 0


def normalize_block(block: Any, limits: DeviceInfo, kernel_max_threads: int | None = None
                    ) -> tuple[int, int, int]:
    """``block`` as ``(x, y, z)``, checked against the device and the compiled kernel's maximum
    threads per block (lower than the device's when the kernel uses many registers)."""
    dims = _dims(block, "block", BLOCK)
    for axis, (n, most) in enumerate(zip(dims, limits.max_block_dims)):
        if n < 1 or n > most:
            raise LaunchError(BLOCK, f"block {dims} has {n} threads along {'xyz'[axis]}; the device "
                              f"allows 1..{most}")
    threads = math.prod(dims)
    if threads > limits.max_threads_per_block:
        raise LaunchError(BLOCK, f"block {dims} has {threads} threads; {limits.name} allows at most "
                          f"{limits.max_threads_per_block} per block", "use fewer warps")
    if kernel_max_threads is not None and threads > kernel_max_threads:
        raise LaunchError(BLOCK, f"block {dims} has {threads} threads, but the compiled kernel can run at "
                          f"most {kernel_max_threads} per block (register usage)",
                          "use fewer warps or reduce register pressure")
    return dims


def check_shared_memory(static_bytes: int, dynamic_bytes: int, limits: DeviceInfo) -> None:
    if dynamic_bytes < 0 or static_bytes < 0:
        raise LaunchError(SHARED_MEMORY, f"shared memory sizes must be >= 0 (static {static_bytes}, "
                          f"dynamic {dynamic_bytes})")
    total = static_bytes + dynamic_bytes
    if total > limits.max_shared_per_block_optin:
        raise LaunchError(SHARED_MEMORY, f"the kernel needs {total} bytes of shared memory per block "
                          f"({static_bytes} static + {dynamic_bytes} dynamic), but {limits.name} allows at "
                          f"most {limits.max_shared_per_block_optin}",
                          "use fewer pipeline stages or smaller tiles")


def check_cluster(cluster: Any, limits: DeviceInfo) -> tuple[int, int, int]:
    """Cluster dimensions, checked against the device (thread-block clusters need sm_90+ and at
    most ``max_cluster_size`` CTAs, 8 being the portable limit)."""
    dims = _dims(cluster, "cluster", CLUSTER)
    if min(dims) < 1:
        raise LaunchError(CLUSTER, f"cluster {dims} has a dimension below 1")
    size = math.prod(dims)
    if size > 1 and limits.max_cluster_size <= 1:
        major, minor = limits.compute_capability
        raise LaunchError(CLUSTER, f"{limits.name} (sm_{major}{minor}) does not support thread-block "
                          "clusters", "clusters need compute capability 9.0 or later")
    if size > limits.max_cluster_size:
        raise LaunchError(CLUSTER, f"cluster {dims} has {size} blocks; {limits.name} allows at most "
                          f"{limits.max_cluster_size}", "use a smaller cluster")
    return dims


PDL_CAPABILITY = (9, 0)
"""Programmatic dependent launch (``griddepcontrol``, the programmatic stream serialization launch
attribute) needs compute capability 9.0 or later (docs/language.md, "Programmatic dependent launch")."""


def check_pdl(pdl: Any, limits: DeviceInfo) -> bool:
    """The ``pdl`` launch option, checked against the device: a bool, and True only on compute
    capability 9.0 or later (LaunchError SP0726)."""
    if not isinstance(pdl, bool):
        raise LaunchError(PDL, f"pdl must be True or False, got {describe_value(pdl)}",
                          "pass pdl=True to let the kernel start while the previous kernel in the stream runs")
    if pdl and tuple(limits.compute_capability) < PDL_CAPABILITY:
        major, minor = limits.compute_capability
        raise LaunchError(PDL, f"programmatic dependent launch (pdl=True) needs compute capability 9.0 or later; "
                          f"{limits.name} is sm_{major}{minor}",
                          "launch without pdl=True on this device (the kernel then starts after the previous "
                          "kernel in the stream has finished)")
    return pdl


def check_grid_fits_cluster(grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> None:
    for axis, (g, c) in enumerate(zip(grid, cluster)):
        if g % c:
            raise LaunchError(CLUSTER, f"grid {grid} is not a multiple of the cluster {cluster} along "
                              f"{'xyz'[axis]}", f"round the grid up to a multiple of {c} and mask the "
                              "extra blocks")


def stream_handle(stream: Any) -> int:
    """A ``CUstream`` handle as an int from None (legacy default stream, 0), an int, a driver
    ``CUstream``, a ``__cuda_stream__`` object (cuda.core), torch (``.cuda_stream``), CuPy
    (``.ptr``) or Numba (``.handle``) streams."""
    if stream is None:
        return 0
    handle: Any = None
    if isinstance(stream, numbers.Integral) and not isinstance(stream, bool):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    elif hasattr(stream, "handle"):
        handle = stream.handle
        if isinstance(handle, ctypes.c_void_p):  # numba; None is its default stream
            handle = handle.value or 0
    elif type(stream).__name__ == "CUstream":  # cuda.bindings.driver.CUstream
        handle = int(stream)
    if not isinstance(handle, numbers.Integral) or isinstance(handle, bool) or handle < 0:
        raise LaunchError(STREAM, f"stream= expects a stream handle (int), a torch/CuPy/Numba stream or a "
                          f"CUstream, got {describe_value(stream)}")
    return int(handle)
