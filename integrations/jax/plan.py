"""What one traced ``sparsile.jax.call`` runs: its :class:`CallPlan` (the specialized kernel, where each
parameter's value comes from, the grid), launched on XLA's stream with XLA's device buffers
(:class:`DeviceView` describes such a buffer to the launcher) or run in the numpy interpreter on
XLA's host buffers."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...driver.kernel import Kernel
from ...driver.kernel_options import KERNEL_OPTIONS
from ...driver.prepared import PREPARED_STALE
from ...frontend.diagnostics import LaunchError
from ...frontend.interp.fpenv import default_fp_environment
from ...frontend.interp.host_arrays import interpreter_params
from ...frontend.interp.interpreter import Interpreter
from . import ffi


@dataclass(eq=False)
class CallPlan:
    """One traced call: the specialized kernel, where each parameter's value comes from, the grid.

    ``sources[i]`` is ``("in", k)`` (operand k), ``("out", k)`` (result k) or ``("value", v)``
    (a static scalar or constexpr). Launchers are built per device ordinal on first use.

    ``func`` and ``captures``: the kernel's IR at trace time and the Python values it captured then.
    A traced program keeps running with those values, on every path (as ``jax.jit`` keeps the
    Python values a traced function read): the CPU handler and ``interpret=True`` run ``func``, and
    a GPU launcher is built only while the captured values are still the traced ones (SP0735 else:
    the native fast path launches without Python, so it could not follow a later change)."""

    kernel: Kernel
    bindings: dict[str, Any]
    key: tuple
    launch_options: dict[str, Any]  # kernel options given with the call (num_warps=...)
    grid: tuple[int, int, int]
    sources: list[tuple[str, str, Any]]
    out_dtypes: list[np.dtype]
    aliases: dict[int, int]  # input index -> output index sharing its buffer
    func: Any = None  # the IR at trace time
    captures: Any = None  # what it captured from Python (a CaptureSet)
    _launchers: dict[int, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the GPU ---------------------------------------------------------------------------------
    def launcher(self, ordinal: int) -> Any:
        """The runtime Launcher of the compiled kernel on device ``ordinal`` (built once)."""
        found = self._launchers.get(ordinal)
        if found is not None:
            return found
        with self._lock:
            if ordinal not in self._launchers:
                self.check_captures()
                from ...backend import runtime
                from ...driver import launch
                from ...target.targets import target_for_capability

                options = {**KERNEL_OPTIONS, **self.kernel.options, **self.launch_options}
                # the module is loaded on the device XLA runs on; sparsile's current device (process-wide:
                # other threads' launches of host arrays read it) is left alone
                dev = runtime.current_device(ordinal)
                target = launch._target(options["target"]) if options.get("target") else \
                    target_for_capability(*dev.compute_capability)
                built = launch._build_launcher(self.kernel, self.bindings, self.key, target, options, ordinal)
                built.jax_needs_info = needs_info(built.spec)
                self._launchers[ordinal] = built
        return self._launchers[ordinal]

    def check_captures(self) -> None:
        """SP0735 when a Python value the kernel captured has changed since the call was traced: a
        launcher compiled now would run the new value while the traced program (and its CPU path)
        runs the old one."""
        if self.captures is not None and not self.captures.still_valid():
            raise LaunchError(PREPARED_STALE, f"a Python value kernel `{self.kernel.name}` captured (a global, a "
                              "closure value or a helper) changed after this sparsile.jax.call was traced; the "
                              "traced program runs with the values it was traced with",
                              help="trace the program again (a new jax.jit, or jax.clear_caches()): the new "
                                   "trace compiles for the new value")

    def run_cuda(self, ins: list[ffi.XlaBuffer], outs: list[ffi.XlaBuffer], stream: int, ordinal: int) -> None:
        """Launch on XLA's ``stream`` with XLA's device buffers (called by the FFI handler)."""
        launcher = self.launcher(ordinal)
        values = self.launch_values(launcher.spec, launcher.jax_needs_info, ins, outs, ordinal)
        launcher(self.grid, values, stream=stream)

    def launch_values(self, spec: Any, needs_info: set[str], ins: list[ffi.XlaBuffer], outs: list[ffi.XlaBuffer],
                      ordinal: int) -> list[Any]:
        """The launcher's argument list: a raw device address for a pointer, a :class:`DeviceView`
        for an array whose tensor maps or shape the launcher derives, the static values."""
        from ...driver.launch import user_values

        bound: dict[str, Any] = {}
        for name, kind, where in self.sources:
            if kind == "value":
                bound[name] = where
                continue
            buf = (ins if kind == "in" else outs)[where]
            bound[name] = DeviceView(buf, ordinal) if name in needs_info else buf.ptr
        return user_values(spec, bound)

    # -- the interpreter -------------------------------------------------------------------------
    def interpret(self, ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        """Run the kernel in the numpy interpreter on host arrays (outputs written in place), in the
        default floating-point environment: XLA's CPU threads flush subnormals to zero, the language
        keeps them (frontend/interp/fpenv.py)."""
        with default_fp_environment():
            self._interpret(ins, outs)

    def _interpret(self, ins: list[np.ndarray], outs: list[np.ndarray]) -> None:
        for k, out in enumerate(outs):
            if k not in self.aliases.values():
                _poison(out)
        bound = {}
        for name, kind, where in self.sources:
            bound[name] = where if kind == "value" else (ins if kind == "in" else outs)[where]
        if self.func is None:  # (a plan made without its trace-time IR)
            self.kernel.interpret[self.grid](**bound, **self.launch_options)
            return
        params, writeback = interpreter_params(self.func, bound)  # the IR traced: not today's globals
        Interpreter(self.func).run(self.grid, params)
        for fn in writeback:
            fn()

    def run_host(self, ins: list[ffi.XlaBuffer], outs: list[ffi.XlaBuffer]) -> None:
        """The CPU FFI handler: the interpreter on views of XLA's own host buffers (no copy)."""
        outs_view = [b.host_view(writable=True) for b in outs]
        ins_view = [outs_view[self.aliases[i]] if i in self.aliases else b.host_view(writable=False)
                    for i, b in enumerate(ins)]  # XLA gives an aliased pair one buffer
        self.interpret(ins_view, outs_view)


def needs_info(spec: Any) -> set[str]:
    """Parameters whose array the launcher must describe (tensor maps, tensor shapes and strides)."""
    names = {p.name.split(".tmap")[0] for p in spec.params if p.kind == "tensormap"}
    return names | {p.source for p in spec.params if p.kind == "derived"}


class DeviceView:
    """An XLA device buffer as the launcher sees an array: address, element type, shape, device."""

    __slots__ = ("buffer", "ordinal")

    def __init__(self, buffer: ffi.XlaBuffer, ordinal: int):
        self.buffer, self.ordinal = buffer, ordinal


def _describe_view(view: DeviceView, stream: int) -> Any:
    from ...backend.runtime.arguments import ArrayInfo, dtype_from_numpy
    from ...frontend.dlpack import compact_strides

    b = view.buffer
    dtype = dtype_from_numpy(ffi.numpy_dtype(b.dtype))
    return ArrayInfo(b.ptr, dtype, b.dtype, b.shape, compact_strides(b.shape), True, view.ordinal,
                     f"cuda:{view.ordinal}", False, "XLA buffer")


def _register_view() -> None:
    from ...backend.runtime.arguments import register_array_type

    register_array_type(DeviceView, _describe_view)


_register_view()


def _poison(out: np.ndarray) -> None:
    """Outputs start undefined on the GPU; the interpreter makes skipped elements visible."""
    if out.dtype.kind == "f" or out.dtype.name.startswith(("bfloat", "float8")):
        out[...] = np.nan
    elif out.size:
        out.view(np.uint8)[...] = 0xA5
