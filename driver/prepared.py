"""Prepared launches: bind, specialize and compile once, then launch in a few microseconds.

    launch = kernel[grid].prepare(x, y, out, n, BLOCK=1024)   # the slow work, once
    launch(x2, y2, out2, n2)                                  # per call: pointers, scalars, one launch
    launch(x2, y2, out2, n2, stream=s, grid=(8,))             # another stream / grid

``prepare`` takes the arguments a ``kernel[grid](...)`` call would take. Its positional arguments
are the per-call ones: every call passes the same number, in the same order. Keyword arguments
(constexprs, launch options, and any run-time argument that stays fixed) are fixed at prepare time.

Per call only cheap work is done, into a parameter buffer the prepared launch owns: each array's
pointer is read (``data_ptr()`` for torch, ``.data.ptr`` for CuPy, the generic protocols otherwise)
and checked against what the specialization assumed: same element type, same rank (tensor
parameters), same device, 16-byte alignment where the kernel was specialized for it, contiguity
where the parameter needs it (SP0703, SP0720, SP0707, SP0704, SP0705: the launcher's own checks
and codes). Integer scalars may change (range and divisibility checked, SP0709), but no scalar of
an unannotated parameter may change its type as ``kernel[grid]`` types it (SP0736,
``prepared_checks.py``). Tensor maps come
from a shared LRU keyed by everything a map encodes (a layer's weight is encoded once; a map is
rewritten into the buffer only when its array moved). Then one ``cuLaunchKernel`` (or
``cuLaunchKernelEx`` for clusters and programmatic dependent launches, ``pdl=True``: docs/language.md,
"Programmatic dependent launch")
through libcuda directly (``cudalib``).

Nothing per call allocates device memory, copies, or synchronizes, so a prepared launch can be
captured in a CUDA graph. Host arrays (numpy, CPU tensors) are refused (SP0733): they would need a
copy and a synchronize. The stream: ``stream=`` (a torch/CuPy stream, an int handle, a CUstream),
else torch's current stream when an argument is a torch CUDA tensor, else the legacy default stream.

``prepare(..., per_call=("x", "out"))`` makes the named parameters, in that order, the per-call
arguments instead of the leading positional ones; everything else is fixed, checked once.

A grid with a 0 dimension (``prepare`` time or ``grid=`` per call) is an empty launch: every
argument is checked as above and nothing is launched (docs/language.md, "Specialization and
launching"); :meth:`PreparedLaunch.native_record` makes no record of it.

``prepare(..., vary=("n",))`` drops the specialization's 16-divisibility (integers) or 16-byte
alignment (arrays) assumption for the named run-time arguments (SP0734 for other names). A prepared
``@jit`` kernel whose captured Python values changed refuses to launch (SP0735): prepare it again.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..backend.runtime.arguments import (
    ARG_KIND,
    ARG_SHAPE,
    DTYPES,
    HOST,
    UNKNOWN_DEVICE,
    ParamBuffer,
    check_array_argument,
    check_grid_fits_cluster,
    describe_array,
    encode_scalar,
    is_empty_grid,
    is_torch_type,
    normalize_grid,
    scalar_writer,
    stream_handle,
)
from ..backend.runtime.launch_config import INTS, rememberable_grid
from ..backend.runtime.tensormap import (
    TENSOR_MAP_BYTES,
    TensorMapCache,
    TensorMapParam,
    encoding_key,
    layout_spec,
    map_of,
)
from ..frontend.diagnostics import LaunchError
from ..frontend.ir import types as T
from .prepared_checks import constexpr_check, typed_scalar_writer
from .recording import mark_unreplayable

if TYPE_CHECKING:
    from ..backend.runtime.native_launch import NativeRecord

PREPARED_ARGS = "SP0732"
"""A prepared launch called with another number of arguments than it was prepared with."""
PREPARED_HOST = "SP0733"
"""Host memory (numpy, a CPU tensor) passed to a prepared launch, which uses device memory only."""
PREPARED_STALE = "SP0735"
"""A Python value a ``@jit`` kernel captured (a global, a closure value, a helper) changed after the
launch was prepared: its compiled kernel is stale."""

SHARED_MAPS = TensorMapCache()
"""The encoded maps of every prepared launch (a weight passed to several layers' launches, or to
re-prepared launches, is encoded once)."""

_U64 = struct.Struct("<Q")


def torch_current_stream(ordinal: int) -> int:
    """torch's current stream on device ``ordinal`` as an int handle."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(ordinal) if raw is not None else torch.cuda.current_stream(ordinal).cuda_stream


def torch_stream_getter(ordinal: int) -> Callable[[], int]:
    """:func:`torch_current_stream` of ``ordinal`` as a function of no arguments, bound to torch's
    raw-stream accessor (the one Triton uses) where torch has it."""
    raw = getattr(sys.modules["torch"]._C, "_cuda_getCurrentRawStream", None)
    return functools.partial(raw, ordinal) if raw is not None else functools.partial(torch_current_stream, ordinal)


class _Call:
    """Per-call scratch (reused under the launch's lock): the stream, producer streams to wait
    on (``__cuda_array_interface__`` streams), objects to keep alive until the launch is queued."""

    __slots__ = ("keep", "stream", "waits")

    def __init__(self) -> None:
        self.stream = 0
        self.waits: list[int] | None = None
        self.keep: list[Any] | None = None


class _MapSlot:
    """One tensor-map parameter: rewritten only when its array's address or layout changes; the
    spec of the last layout is kept, validated once, so a new address of the same layout (a fresh
    activation buffer) costs its alignment check and the encoding only."""

    __slots__ = ("end", "key", "last", "layout", "offset", "ordinal", "param", "view")

    def __init__(self, param: TensorMapParam, offset: int, view: Any, ordinal: int):
        self.param, self.offset, self.end, self.view = param, offset, offset + TENSOR_MAP_BYTES, view
        self.ordinal, self.key, self.last = ordinal, encoding_key(param), None
        self.layout: tuple[Any, ...] | None = None

    def write(self, ptr: int, shape: Any, strides: Any) -> None:
        here = (ptr, shape, strides)
        if here == self.last:
            return
        shape, strides = tuple(shape), tuple(strides)
        full = (self.ordinal, ptr, shape, strides, self.key)
        data = SHARED_MAPS.get(full)
        if data is None:
            from ..backend import runtime

            layout = self.layout
            if layout is None or layout[0] != shape or layout[1] != strides:
                spec = layout_spec(self.param, shape, strides)
                spec.validate(what=map_of(self.param.name))
                layout = self.layout = (shape, strides, spec)
            spec = layout[2]
            if ptr % 32:  # below the strictest base alignment: the full check names the rule broken
                spec.validate(ptr, what=map_of(self.param.name))
            data = SHARED_MAPS.put(full, runtime.make_tensor_map(spec, ptr, device=self.ordinal, validated=True).data)
        self.view[self.offset:self.end] = data
        self.last = here


class _NoGrid:
    """What a prepared launch remembers as its last grid where it remembers none (no grid is this class)."""


class PreparedLaunch:
    """One specialization of a kernel, bound to a grid, launched with fresh arguments per call.
    Built by ``kernel[grid].prepare(...)`` (:meth:`sparsile.driver.launch.GpuLaunch.prepare`)."""

    def __init__(self, kernel: Any, launcher: Any, bound: dict[str, Any], bindings: dict[str, Any],
                 per_call: list[int], grid: Any):
        from ..backend import runtime

        self.kernel_name = kernel.name
        self.launcher = launcher
        self.device = launcher.device
        self.nargs = len(per_call)
        self._runtime = runtime
        self._tls = runtime.devices.tls
        self._module = launcher._module
        self._context_key = launcher._context_key
        self._buffer = ParamBuffer(launcher._buffer.layout)
        self._view = self._buffer.view
        self._offsets = dict(zip((p.name for p in launcher.spec.kernel_params), self._buffer.layout.offsets))
        self._lock = threading.Lock()
        self._call = _Call()
        self._fixed: list[Any] = []  # run-time arguments given by keyword: written once, kept alive
        self._captures = getattr(launcher, "captures", None) or None  # what the compiled IR read from Python
        self._dims = self._last_dims = self._checked_grid(grid)
        # (only an int or a tuple of ints is remembered: launch_config.rememberable_grid; _NoGrid is no grid)
        self._last_grid: Any = grid if rememberable_grid(grid) else _NoGrid
        self._handle = launcher._handle
        self._launch = launcher._launch_kernel
        self._launch_ex = launcher._launch_kernel_ex
        self._block = launcher.block
        self._shared = launcher.dynamic_shared
        self._config = launcher.new_config()  # its own (the grid and stream are set per launch)
        groups: dict[str, list[Any]] = {}
        for p in launcher.spec.params:
            groups.setdefault(_source_of(p), []).append(p)
        writers: dict[int, Callable[[Any, _Call], None]] = {}
        uses_torch = False
        self._call.stream = 0
        for j, kp in enumerate(kernel.params):
            value = bound[kp.name]
            uses_torch = uses_torch or (is_torch_type(type(value)) and value.is_cuda)
            writer = self._writer(kp, value, bindings[kp.name], groups.get(kp.name, []))
            writer(value, self._call)  # checks the prepared arguments themselves, fills the buffer
            if j in per_call:
                writers[j] = writer
            else:
                self._fixed.append(value)
        self._writers: list[Callable[[Any, _Call], None]] = [writers[j] for j in per_call]
        self._per_call_names = [kernel.params[j].name for j in per_call]
        self._groups = groups
        self._call.waits = self._call.keep = None
        self._default_stream: Callable[[], int] = (torch_stream_getter(self.device.ordinal) if uses_torch
                                                   else _legacy_stream)

    # -- construction ---------------------------------------------------------------------------

    def _checked_grid(self, grid: Any) -> tuple[int, int, int]:
        dims = normalize_grid(grid, self.device)
        check_grid_fits_cluster(dims, self.launcher.cluster)
        return dims

    def _writer(self, kp: Any, value: Any, binding: Any, params: list[Any]) -> Callable[[Any, _Call], None]:
        """The per-call writer of kernel parameter ``kp`` (a ``ParamInfo``), prepared for ``value``:
        a constexpr's check, a scalar's packing (behind the check that ``kernel[grid]`` types the
        value as the prepared type where ``kp`` has no annotation, SP0736), an array's."""
        from ..frontend.sema.values import is_constant_binding

        name = kp.name
        if is_constant_binding(binding):
            return constexpr_check(name, value)
        if not params:  # nothing of it reaches the kernel
            return _ignore
        if len(params) == 1 and params[0].kind == "scalar":
            write = scalar_writer(params[0], self._offsets[name], self._view)
            if kp.annotation is None and isinstance(binding.type, T.ScalarType):
                return typed_scalar_writer(name, binding.type, write)
            return write
        return self._array_writer(name, value, binding, params)

    def _array_writer(self, name: str, value: Any, binding: Any, params: list[Any]) -> Callable[[Any, _Call], None]:
        view, ordinal, offsets = self._view, self.device.ordinal, self._offsets
        pointer = next((p for p in params if p.kind in ("pointer", "array")), None)
        maps = [_MapSlot(p, offsets[p.name], view, ordinal) for p in params if p.kind == "tensormap"]
        derived = [(offsets[p.name], struct.Struct(DTYPES[p.dtype].struct_format), p.attribute == "shape", p.dim, p)
                   for p in params if p.kind == "derived"]
        typed = pointer if pointer is not None else params[0]
        dtype, writes = typed.dtype, not all(p.readonly for p in params if hasattr(p, "readonly"))
        aligned16 = bool(getattr(pointer, "aligned16", False))
        contiguous = bool(getattr(pointer, "contiguous", False))
        rank = getattr(getattr(binding, "type", None), "rank", None)
        ptr_offset = offsets.get(pointer.name) if pointer is not None and pointer.kind == "pointer" else None
        mask = 15 if aligned16 else 0
        runtime = self._runtime

        def emit(ptr: int, shape: Any, strides: Any) -> None:
            if ptr_offset is not None:
                _U64.pack_into(view, ptr_offset, ptr)
            for offset, packer, is_shape, dim, p in derived:
                v = shape[dim] if is_shape else strides[dim]
                try:
                    packer.pack_into(view, offset, v)
                except struct.error:
                    view[offset:offset + packer.size] = encode_scalar(p.dtype, v, p.name)  # raises SP0709
            for slot in maps:
                slot.write(ptr, shape, strides)

        def generic(v: Any, call: _Call) -> None:
            info = describe_array(v, call.stream)
            if info is None:
                raise LaunchError(ARG_KIND, f"argument `{name}` expects an array of {dtype}, got {type(v).__name__}",
                                  "pass a CUDA tensor/array (torch, CuPy, JAX) or a DeviceBuffer")
            if info.device == UNKNOWN_DEVICE:
                info = info._replace(device=runtime.pointer_device(info.ptr))
            if info.device == HOST:
                raise LaunchError(PREPARED_HOST, f"argument `{name}` is a {info.source} in host memory, but a "
                                  "prepared launch uses device memory in place only (no copies, no synchronize)",
                                  "move it to the GPU first (torch: x.cuda(), cupy: cupy.asarray(x)), or launch "
                                  "with kernel[grid](...), which copies host arrays")
            check_array_argument(name, dtype, info, device=ordinal, allow_host=False, writes=writes,
                                 aligned16=aligned16, contiguous=contiguous)
            if rank is not None and len(info.shape) != rank:
                raise LaunchError(ARG_SHAPE, f"argument `{name}` has rank {len(info.shape)}, but the launch was "
                                  f"prepared for a rank-{rank} tensor (shape {info.shape})",
                                  "prepare another launch for this rank")
            if info.stream is not None and not runtime.same_stream(info.stream, call.stream):
                call.waits = [*(call.waits or ()), info.stream]
            if info.keepalive is not None:
                call.keep = [*(call.keep or ()), info.keepalive]
            emit(info.ptr, info.shape, info.strides)

        cls = type(value)
        simple = ptr_offset is not None and not maps and not derived
        if is_torch_type(cls) and getattr(value, "is_cuda", False):
            tdt, pack = value.dtype, _U64.pack_into
            last: list[Any] = [None, None, None]  # the layout written last: unchanged slots are left alone

            def torch_array(v: Any, call: _Call) -> None:
                if (type(v) is cls and v.dtype is tdt and v.get_device() == ordinal
                        and (rank is None or v.dim() == rank) and not v.is_neg()):  # (a neg view: SP0751)
                    ptr = v.data_ptr()
                    if not ptr & mask and (not contiguous or v.is_contiguous()):
                        if simple:
                            pack(view, ptr_offset, ptr)
                            return
                        shape, strides = v.shape, v.stride()
                        if ptr != last[0] or shape != last[1] or strides != last[2]:
                            last[0] = None  # emit may raise: nothing is remembered then
                            emit(ptr, shape, strides)
                            last[0], last[1], last[2] = ptr, shape, strides
                        return
                last[0] = None
                generic(v, call)  # raises the diagnostic (or takes an unusual but valid array)

            return torch_array
        if cls is runtime.DeviceBuffer and simple and rank is None:  # sparsile's own: dense, never read-only
            bdt, pack = value.dtype, _U64.pack_into

            def device_buffer(v: Any, call: _Call) -> None:
                if type(v) is cls and v.dtype == bdt and v.device == ordinal and not v.ptr & mask:
                    pack(view, ptr_offset, v.ptr)
                    return
                generic(v, call)  # raises the diagnostic

            return device_buffer
        if cls.__module__.split(".")[0] == "cupy" and hasattr(value, "data") and hasattr(value.data, "ptr"):
            ndt, itemsize = value.dtype, value.itemsize

            def cupy_array(v: Any, call: _Call) -> None:
                if type(v) is cls and v.dtype == ndt and v.device.id == ordinal and (rank is None or v.ndim == rank):
                    ptr = v.data.ptr
                    if not ptr & mask and (not contiguous or v.flags.c_contiguous):
                        emit(ptr, v.shape, tuple(s // itemsize for s in v.strides))
                        return
                generic(v, call)

            return cupy_array
        return generic

    # -- launching ------------------------------------------------------------------------------

    def __call__(self, *args: Any, stream: Any = None, grid: Any = None) -> None:
        """Launch with ``args`` (the positional arguments of :meth:`prepare`, new values)."""
        if len(args) != self.nargs:
            raise LaunchError(PREPARED_ARGS, f"this prepared launch of `{self.kernel_name}` takes {self.nargs} "
                              f"argument{'s' if self.nargs != 1 else ''}, got {len(args)}",
                              "pass the same positional arguments as to prepare(...); constexprs and keyword "
                              "arguments are fixed when the launch is prepared")
        if self._captures is not None and not self._captures.still_valid():
            raise LaunchError(PREPARED_STALE, f"a Python value kernel `{self.kernel_name}` captured (a global, a "
                              "closure value or a helper) changed after this launch was prepared",
                              "prepare the launch again: kernel[grid].prepare(...) compiles for the new value")
        mark_unreplayable("a prepared launch")
        self.run(args, stream, grid)

    def run(self, args: tuple[Any, ...], stream: Any = None, grid: Any = None) -> None:
        """:meth:`__call__` for a caller that has checked the argument count and the captures
        itself (``kernel[grid](...)``'s fast path: its fingerprint holds the count)."""
        if stream is None:
            handle = self._default_stream()
        elif type(stream) is int and stream >= 0:
            handle = stream
        else:
            handle = stream_handle(stream)
        if grid is None:
            dims = self._dims
        elif grid is self._last_grid or (type(grid) is type(self._last_grid) and (
                type(grid) is int or INTS.issuperset(map(type, grid))) and grid == self._last_grid):
            dims = self._last_dims  # Python ints only: (4.0,) == (4,) (launch_config.INTS)
        else:
            dims = self._checked_grid(grid)
            if rememberable_grid(grid):
                self._last_grid, self._last_dims = grid, dims
        self._lock.acquire()
        call = self._call
        call.stream = handle
        restore = None  # the thread's context, when the launch made another current (restored after it)
        try:
            for write, value in zip(self._writers, args):
                write(value, call)
            if not (dims[0] and dims[1] and dims[2]):  # an empty grid: the arguments checked, nothing to run
                return
            if getattr(self._tls, "context", None) is not self._context_key:
                restore = self._module.activate(force=True)
            if call.waits:  # (the event and the consumer stream: in the kernel's context)
                for producer in call.waits:
                    self._runtime.stream_wait(self._module._state, handle, producer)
            if self._config is None:  # (_launch_once, inlined)
                bx, by, bz = self._block
                err = self._launch(self._handle, dims[0], dims[1], dims[2], bx, by, bz, self._shared, handle,
                                   self._buffer.address, 0)[0]
            else:
                err = self._launch_once(dims, handle)
            if err != self._runtime.SUCCESS:
                if err in self._runtime.RETRY_AFTER_CONTEXT_SWITCH:  # torch/CuPy switched contexts
                    again = self._module.activate(force=True)
                    restore = again if restore is None else restore
                    err = self._launch_once(dims, handle)
                if err != self._runtime.SUCCESS:
                    raise self._runtime.CudaError("cuLaunchKernelEx" if self._config is not None
                                                  else "cuLaunchKernel", err)
        finally:
            call.waits = call.keep = None
            self._lock.release()
            if restore is not None:  # (another GPU's launch: the thread's own context again, as torch's guard)
                self._runtime.devices.leave(restore)

    def _launch_once(self, dims: tuple[int, int, int], handle: int) -> Any:
        config = self._config
        if config is None:
            bx, by, bz = self._block
            return self._launch(self._handle, dims[0], dims[1], dims[2], bx, by, bz, self._shared, handle,
                                self._buffer.address, 0)[0]
        config.gridDimX, config.gridDimY, config.gridDimZ = dims
        config.hStream = handle
        return self._launch_ex(config, self._handle, self._buffer.address, 0)[0]

    def native_record(self, args: tuple[Any, ...], sources: tuple[int, ...], fixed_layout: tuple[bool, ...]
                      ) -> NativeRecord | None:
        """This launch as a record a native launcher replays (backend/runtime/native_launch.py):
        the parameters packed for ``args`` (the per-call arguments, written and checked as a call
        writes them, without launching); per call the native launch takes per-call argument i's
        address from its source ``sources[i]``, rewrites its pointer slot and re-encodes its tensor
        maps for a new address. Shapes and strides stay as packed: an argument whose
        ``fixed_layout[i]`` is False (the caller does not guarantee them) may reach the kernel only
        as a pointer. None when that does not hold, the call needs stream waits or keep-alives, or
        the prepared grid is empty (a 0 dimension: nothing to launch)."""
        from ..backend.runtime import cudalib
        from ..backend.runtime import native_launch as nl

        if not len(args) == len(sources) == len(fixed_layout) == self.nargs:
            return None
        if is_empty_grid(self._dims):  # nothing to launch: the prepared launch checks the arguments, launches nothing
            return None
        with self._lock:
            call = self._call
            call.stream = 0
            try:
                for write, value in zip(self._writers, args):
                    write(value, call)
                if call.waits or call.keep:
                    return None
                params = bytes(self._view)
            finally:
                call.waits = call.keep = None
        pointers: list[tuple[int, int, int]] = []
        tmaps: list[list[int]] = []
        for name, value, source, fixed in zip(self._per_call_names, args, sources, fixed_layout):
            info = describe_array(value, 0)
            for p in self._groups.get(name, ()):
                if p.kind == "pointer" and info is not None:
                    pointers.append((source, self._offsets[p.name], 15 if getattr(p, "aligned16", False) else 0))
                elif p.kind == "array":  # not a kernel parameter itself
                    continue
                elif not fixed or info is None or p.kind not in ("tensormap", "derived"):
                    return None
                elif p.kind == "tensormap":
                    spec = layout_spec(p, tuple(info.shape), tuple(info.strides))
                    tmaps.append(nl.tmap_entry(source, self._offsets[p.name], spec.driver_arguments(info.ptr),
                                               info.ptr))
        block = nl.launch_attributes(self.launcher.cluster, self.launcher.pdl)
        words = nl.record_words(cudalib.handle_int(self._handle), self._dims, self._block, self._shared,
                                ctypes.addressof(block) if block is not None else 0, params,
                                self._buffer.layout.offsets, pointers, tmaps, self.device.ordinal)
        return nl.NativeRecord(words, (self, block), self.make_context_current)

    def make_context_current(self, force: bool = False) -> Any:
        """Make the context this launch's kernel is loaded in current on the calling thread, if
        another is (what :meth:`run` does before it launches); ``force``: also when this thread's
        cache says it is (torch or CuPy may have switched contexts behind it). Returns the context
        to restore once the launches are done (``devices.leave``), None when there is none (the
        common case: no driver call)."""
        if force or getattr(self._tls, "context", None) is not self._context_key:
            return self._module.activate(force=True)
        return None

    def param_bytes(self, index: int) -> bytes:
        """The current bytes of kernel parameter ``index`` (tests, debugging)."""
        return self._buffer.slot_bytes(index)

    def __repr__(self) -> str:
        return f"<prepared launch of {self.kernel_name}, grid {self._dims}, {self.nargs} arguments per call>"


def _legacy_stream() -> int:
    return 0


def _ignore(value: Any, call: _Call) -> None:
    """The writer of an argument the kernel does not receive."""


def _source_of(p: Any) -> str:
    """The kernel parameter a launcher parameter comes from (``A.tmap0`` and derived ones: ``A``)."""
    if p.kind == "derived" or (p.kind == "tensormap" and getattr(p, "source", None) is not None):
        return p.source
    return p.name.split(".tmap")[0] if p.kind == "tensormap" else p.name


__all__ = ["PREPARED_ARGS", "PREPARED_HOST", "PREPARED_STALE", "SHARED_MAPS", "PreparedLaunch", "torch_current_stream",
           "torch_stream_getter"]
