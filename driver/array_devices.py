"""Which GPU a ``kernel[grid](...)`` launch runs on: the device its GPU arrays live on.

A launch runs on the CUDA device of its GPU array arguments (torch CUDA tensors, CuPy arrays,
DLPack or ``__cuda_array_interface__`` arrays, ``DeviceBuffer``), as a torch op runs on its tensors'
device; with host arrays only (numpy, CPU tensors) or no arrays, on sparsile's current device
(``runtime.use_device``, cuda:0 by default), where host arrays are staged. Arrays on two GPUs in one
launch are SP0707 (docs/language.md, "Specialization and launching"; docs/diagnostics.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..frontend.diagnostics import LaunchError
from ..frontend.sema.values import is_constant_binding

DLPACK_CUDA = 2
"""DLPack's ``kDLCUDA`` (managed memory, ``kDLCUDAManaged``, is usable from every device)."""
_PLAIN = (int, float, bool, str, type(None), np.ndarray)


def array_device(value: Any) -> int | None:
    """The CUDA device ``value`` lives on, or None: host memory, managed memory, not an array, or
    an array that cannot say (the launcher then reports what is wrong with it)."""
    cls = type(value)
    if cls in _PLAIN:
        return None
    from ..backend.runtime.arguments import is_torch_type  # (the CUDA runtime: not at `import sparsile`)

    try:
        if is_torch_type(cls):
            return value.get_device() if value.is_cuda else None
        query = getattr(cls, "__dlpack_device__", None)
        if query is not None:
            kind, ordinal = query(value)
            return int(ordinal) if int(kind) == DLPACK_CUDA else None
        interface = getattr(value, "__cuda_array_interface__", None)
        if isinstance(interface, dict) and interface.get("data") and interface["data"][0]:
            from ..backend import runtime

            ordinal = runtime.pointer_device(int(interface["data"][0]))
            return ordinal if ordinal >= 0 else None
    except Exception:  # (an array of an unusual kind: the launcher's own checks describe it)
        return None
    return None


def launch_device(bound: Mapping[str, Any], bindings: Mapping[str, Any] | None = None) -> int | None:
    """The device a launch with these bound arguments runs on: the one its GPU arrays live on, None
    (the current device) where there are none; SP0707 naming both devices where two arguments live
    on different GPUs. ``bindings``: constexpr arguments (a ``Const``, or a tuple of them) are not
    passed to the kernel and do not count."""
    found: tuple[str, int] | None = None
    for name, value in bound.items():
        if bindings is not None and is_constant_binding(bindings.get(name)):
            continue
        ordinal = array_device(value)
        if ordinal is None:
            continue
        if found is None:
            found = (name, ordinal)
        elif ordinal != found[1]:
            raise mixed_devices(found[0], found[1], name, ordinal)
    return None if found is None else found[1]


_COUNT: list[int] = []  # the number of visible GPUs, once asked


def several_gpus() -> bool:
    """Whether more than one GPU is visible (asked once: devices do not come and go in a process).
    Paths whose per-call cost matters ask this before looking for their arrays' device."""
    if not _COUNT:
        from ..backend import runtime

        _COUNT.append(runtime.device_count())
    return _COUNT[0] > 1


def mixed_devices(first: str, first_device: int, other: str, other_device: int) -> LaunchError:
    """SP0707 for a launch whose arguments ``first`` and ``other`` live on two GPUs."""
    from ..backend.runtime.arguments import ARG_DEVICE

    return LaunchError(ARG_DEVICE, f"argument `{other}` is on cuda:{other_device} but argument `{first}` is on "
                       f"cuda:{first_device}: a launch runs on the one GPU its arrays live on",
                       f"move them to one device, e.g. `{other}` to cuda:{first_device} "
                       f"(torch: {other}.to('cuda:{first_device}'))")
