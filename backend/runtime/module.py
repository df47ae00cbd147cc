"""Loaded modules and their kernels: :func:`load_module` loads a cubin (or a fatbin, or PTX text
which the driver JIT-compiles) into a device's primary context, a :class:`Module` finds its
kernels, and a :class:`KernelFunction` reports its attributes and opts in to more dynamic shared
memory when a launch needs it."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver

from ...frontend.diagnostics import LaunchError
from .codes import KERNEL_NOT_FOUND
from .devices import CudaError, DeviceInfo, DeviceState, check, context_of, device_state, enter, in_context, switch
from .release import defer

DEFAULT_SHARED_LIMIT = 48 * 1024
"""Dynamic + static shared memory a kernel gets without opting in (CUDA programming guide)."""


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

    def __init__(self, handle: Any, state: DeviceState):
        self.handle = handle
        self._state = state
        self.device: DeviceInfo = state.info
        self.context_key = state.context
        self._functions: dict[str, KernelFunction] = {}
        self._finalizer = weakref.finalize(self, _collected, handle, state.context)

    def activate(self, force: bool = False) -> Any:
        """Make the module's context current on this thread for one operation (``force``: also
        when the per-thread cache says it is); returns what ``devices.leave`` restores after it
        (None: nothing, the common case)."""
        return switch(self._state) if force else enter(self._state)

    def function(self, name: str) -> KernelFunction:
        """The kernel ``name`` (cached)."""
        fn = self._functions.get(name)
        if fn is None:
            with context_of(self._state):
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
        """Unload now (its kernels must not be launched afterwards)."""
        if self._finalizer.detach() is not None:
            _unload_module(self.handle, self._state.context)


def _unload_module(handle: Any, context: Any) -> None:
    in_context(context, lambda: driver.cuModuleUnload(handle))


def _collected(handle: Any, context: Any) -> None:
    """The finalizer: ``cuModuleUnload`` inside a CUDA graph capture would invalidate it, so the
    unload waits for the next safe point (release.py)."""
    defer(lambda: _unload_module(handle, context))


def _looks_like_text(image: bytes) -> bool:
    return not image.startswith(b"\x7fELF") and not image.startswith(b"\x50\xed\x55\xba")


def load_module(image: bytes | str, device: int | None = None) -> Module:
    """Load a cubin (or a fatbin, or PTX text which the driver JIT-compiles) on a device."""
    if isinstance(image, str):
        image = image.encode()
    if _looks_like_text(image) and not image.endswith(b"\0"):
        image += b"\0"
    state = device_state(device)
    with context_of(state):
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

            def get(name: str) -> int:
                return int(check(f"cuFuncGetAttribute({name})",
                                 driver.cuFuncGetAttribute(getattr(A, name), self.handle)))

            with context_of(self.module._state):
                self._attributes = self._read_attributes(get)
        return self._attributes

    @staticmethod
    def _read_attributes(get: Callable[[str], int]) -> FunctionAttributes:
        return FunctionAttributes(
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

    def set_max_dynamic_shared(self, nbytes: int) -> None:
        """Opt in to ``nbytes`` of dynamic shared memory (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_
        SIZE_BYTES``); only done when the default (48 KB minus static) is too small and a larger
        value was not set already."""
        default = DEFAULT_SHARED_LIMIT - self.attributes.static_shared_bytes
        if nbytes <= max(self._dynamic_shared_set, default):
            return
        with context_of(self.module._state):
            check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", driver.cuFuncSetAttribute(
                self.handle, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes))
        self._dynamic_shared_set = nbytes
