"""``kernel[grid](*args)``: specialize, compile (cached), and launch on the GPU its arrays live on
(the current device for host arrays only: driver/array_devices.py).

The compiled kernel's parameter list (:class:`~sparsile.backend.lower.codegen.KernelParam`) becomes the
runtime's :class:`~sparsile.backend.runtime.arguments.ParamSpec`: pointers and scalars pass through, a
``tensor[T, rank]`` argument becomes its base pointer plus shape and strides the launcher reads
from the array itself (derived parameters), and constexpr parameters are checked, not passed.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend.lower.codegen import KernelParam, llvm_name
from ..backend.runtime.arguments import ARG_DEVICE, is_torch_type
from ..frontend.diagnostics import LaunchError
from ..frontend.interp.host_arrays import stored_params
from ..frontend.ir import types as T
from ..frontend.sema.specialize import call_grid
from ..frontend.sema.values import is_constant_binding
from ..target.targets import get_target, target_for_capability
from . import fast_launch
from .array_devices import launch_device
from .grid import grid_meta
from .kernel_options import KERNEL_OPTIONS
from .recording import ACTIVE, record_launch


def param_spec(kernel: Any, bindings: dict[str, Any], params: list[KernelParam], stores: set[str]) -> Any:
    """The runtime ParamSpec for one compiled specialization."""
    from ..backend.runtime.arguments import ConstexprParam, DerivedParam, ParamSpec, PointerParam, ScalarParam
    from ..backend.runtime.tensormap import TensorMapParam

    by_name: dict[str, list[KernelParam]] = {}
    for p in params:
        by_name.setdefault(p.name, []).append(p)
    spec: list[Any] = []
    for p in kernel.params:
        b = bindings[p.name]
        if is_constant_binding(b):
            spec.append(ConstexprParam(p.name, _constexpr_expected(b)))
            continue
        for kp in by_name[p.name]:
            if kp.kind == "ptr":
                spec.append(PointerParam(p.name, kp.dtype, aligned16=b.divisible_16, readonly=p.name not in stores))
            elif kp.kind == "scalar":
                spec.append(ScalarParam(p.name, kp.dtype, 16 if b.divisible_16 else 1))
            elif kp.kind == "tensor_ptr":
                spec.append(PointerParam(p.name, kp.dtype, aligned16=b.divisible_16, readonly=p.name not in stores))
            elif kp.kind in ("tensor_dim", "tensor_stride"):
                spec.append(DerivedParam(f"{p.name}.{kp.kind}{kp.index}", p.name,
                                         "shape" if kp.kind == "tensor_dim" else "stride", kp.index))
            elif kp.kind == "tensormap":
                box, swizzle = kp.extra
                spec.append(_tensormap_param(TensorMapParam, p.name, kp, box, swizzle, p.name not in stores))
            else:
                raise LaunchError("SP0730", f"unsupported kernel parameter kind {kp.kind}")
    return ParamSpec(tuple(spec), kernel.name)


def _constexpr_expected(b: Any) -> Any:
    """The value the launcher checks a constexpr argument against, from its binding: a typed
    constant (``np.int8(3)``, ``sp.i8(3)``) as its NumPy scalar, not ``3``; a tuple of bindings
    (``(np.int8(3), 2)``) element by element."""
    if isinstance(b, tuple):
        return tuple(_constexpr_expected(x) for x in b)
    if b.dtype is None or b.value is None:
        return b.value
    if b.dtype is T.tf32:  # (NumPy's would be f32's)
        return T.TypedConstant(b.value, b.dtype)
    return T.numpy_dtype(b.dtype).type(b.value)


def _tensormap_param(cls: Any, source: str, kp: KernelParam, box: tuple[int, ...], swizzle: int,
                     readonly: bool) -> Any:
    """A tensor map of argument ``source`` for one TMA box; the launch passes ``source``'s array
    again for it (see :func:`user_values`)."""
    from ..backend.runtime.tensormap import Swizzle

    sw = {0: Swizzle.NONE, 32: Swizzle.B32, 64: Swizzle.B64, 128: Swizzle.B128}[swizzle]
    return cls(tmap_param_name(source, kp.index), kp.dtype, tuple(box), sw, readonly=readonly)


def tmap_param_name(source: str, index: int) -> str:
    return f"{source}.tmap{index}"


def argument_of(param_name: str) -> str:
    """The kernel argument a launcher parameter takes its value from: ``A`` for the tensor map
    ``A.tmap0`` of ``tensor[...]`` argument ``A`` (:func:`tmap_param_name`), else the name itself."""
    return param_name.split(".tmap")[0] if ".tmap" in param_name else param_name


def user_values(spec: Any, bound: dict[str, Any]) -> list[Any]:
    """The argument list the launcher expects: each user parameter's value, a tensor's array
    repeated for each of its tensor maps."""
    return [bound[argument_of(p.name)] for p in spec.user_params]


class GpuLaunch:
    """``kernel[grid]``: call it with the kernel's arguments (and ``stream=``, launch options);
    ``prepare(...)`` binds them once for a hot loop (:class:`~sparsile.driver.prepared.PreparedLaunch`)."""

    def __init__(self, kernel: Any, grid: Any):
        self.kernel = kernel
        self.grid = grid

    def compile_for(self, target: str, *args: Any, **kwargs: Any) -> Any:
        """Compile the specialization these arguments would launch, for ``target`` (no GPU needed)."""
        from .compiler import compile_cached

        _, bindings, key = self.kernel.bind(args, dict(kwargs))
        options = {**KERNEL_OPTIONS, **self.kernel.options,
                   **{k: kwargs[k] for k in kwargs if k in KERNEL_OPTIONS and k not in bindings}}
        return compile_cached(self.kernel, bindings, key, _target(target), options)

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        kernel = self.kernel
        fast = kernel.__dict__.get("_fast_launches")
        if fast is not None and fast.params is kernel._params and fast.options == kernel.options:
            key = fast.key(args, kwargs)
            entry = fast.entries.get(key) if key is not None else None
            # the common path: arguments of a kind seen before, and the Python values the kernel
            # captured (a @jit kernel's globals: frontend/sema/captures.py) unchanged (one check of
            # the entry's captures: the launcher's and the parameters', joined once)
            if entry is not None and (entry.captures is None or entry.captures.still_valid()):
                try:
                    entry.launch(self.grid, args, stream)
                except LaunchError as exc:  # arrays on two GPUs: the full path names both (SP0707)
                    if exc.code != ARG_DEVICE:
                        raise
                else:
                    if ACTIVE.get() is not None:
                        record_launch(self, args, kwargs, stream)
                    return
        launcher, bound, bindings = self._launcher(args, kwargs)
        grid = call_grid(self.grid, grid_meta(bound, bindings), self.kernel.name) if callable(self.grid) \
            else self.grid
        if launcher.spec_has_tensormaps and any(isinstance(v, np.ndarray) for v in bound.values()):
            staged = _stage_tma_host_arrays(launcher, bound, _is_empty(grid))
        else:
            staged = []
            fast_launch.remember(self.kernel, args, kwargs, launcher, bound, bindings, grid)
        values = user_values(launcher.spec, bound)
        given = stream  # None: torch's current stream, found again by each call
        if stream is None and any(is_torch_type(type(v)) and v.is_cuda for v in bound.values()):
            stream = fast_launch.torch_current_stream(launcher.device.ordinal)
        launcher(grid, values, stream=stream)
        for host, dev in staged:  # tensors read through TMA were copied to the device as a whole
            _copy_back(host, dev, stream)  # on the launch's stream: after the kernel, whatever the stream
        if ACTIVE.get() is not None:
            record_launch(self, args, kwargs, given)

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        """Bind, specialize, compile and build the launcher once; returns a
        :class:`~sparsile.driver.prepared.PreparedLaunch` taking the same positional arguments
        per call (keyword arguments, constexprs and options among them, are fixed).

        ``per_call=("x", "out")`` (unless the kernel has a parameter of that name) names the
        run-time parameters a call passes, in that order, instead of the leading positional ones:
        every other argument is fixed at prepare time, and its checks are not repeated per call
        (SP0734 for a name that is no run-time parameter, or named twice).

        ``vary=("n", "x")`` (unless the kernel has a parameter of that name) names run-time
        arguments that change per call in ways the specialization would otherwise assume fixed:
        their 16-divisibility (integers) or 16-byte alignment (arrays) is not assumed, so any value
        is accepted per call (SP0734 for a name that is no run-time parameter)."""
        from .prepared import PreparedLaunch

        names = {p.name for p in self.kernel.params}
        vary: Any = ()
        if "vary" in kwargs and "vary" not in names:
            vary = kwargs.pop("vary")
        per_call: Any = None
        if "per_call" in kwargs and "per_call" not in names:
            per_call = kwargs.pop("per_call")
        launcher, bound, bindings = self._launcher(args, kwargs, _vary_names(self.kernel, vary))
        grid = call_grid(self.grid, grid_meta(bound, bindings), self.kernel.name) if callable(self.grid) \
            else self.grid
        order = list(range(len(args))) if per_call is None else _per_call_indices(self.kernel, per_call)
        return PreparedLaunch(self.kernel, launcher, bound, bindings, order, grid)

    def _launcher(self, args: tuple[Any, ...], kwargs: dict[str, Any], vary: tuple[str, ...] = ()
                  ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(launcher, bound arguments, sema bindings) of a call: the launcher is built (compiled)
        once per specialization and device, the device being the one the call's GPU arrays live on
        (the current device where there are none; SP0707 for arrays on two GPUs). ``vary``:
        run-time parameters specialized without the divisibility/alignment assumption."""
        from ..backend import runtime

        if not runtime.has_gpu():
            raise LaunchError("SP0731", f"kernel `{self.kernel.name}` cannot run: no NVIDIA GPU is available",
                              help=f"run it on the CPU with `{self.kernel.name}.interpret[grid](...)`, or compile "
                                   f"it ahead of time (no GPU needed) with `{self.kernel.name}.compile(...)`")
        bound, bindings, key = self.kernel.bind(args, dict(kwargs))
        dev = runtime.current_device(launch_device(bound, bindings))  # (no context made current: the launcher does)
        if vary:
            bindings, key = _without_divisibility(bindings, key, vary)
        # the specialization key already holds the options (a target among them), so the key and the
        # device name one launcher: the common path is this one lookup and the check that the Python
        # values the kernel captured are unchanged (cached_launcher)
        launcher = cached_launcher(self.kernel, key, dev.ordinal, lambda: self._build(dev, bindings, key, kwargs))
        return launcher, bound, bindings

    def _build(self, dev: Any, bindings: dict[str, Any], key: tuple, kwargs: dict[str, Any]) -> Any:

        options = {**KERNEL_OPTIONS, **self.kernel.options,
                   **{k: kwargs[k] for k in kwargs if k in KERNEL_OPTIONS and k not in bindings}}
        target = target_for_capability(*dev.compute_capability) if not options.get("target") else \
            _target(options["target"])
        return _build_launcher(self.kernel, bindings, key, target, options, dev.ordinal)


def _vary_names(kernel: Any, vary: Any) -> tuple[str, ...]:
    """The ``vary=`` names of :meth:`GpuLaunch.prepare`, checked (SP0734)."""
    names = (vary,) if isinstance(vary, str) else vary
    if not isinstance(names, tuple | list) or not all(isinstance(n, str) for n in names):
        raise LaunchError("SP0734", f"vary= takes parameter names (a tuple of strings), got {vary!r}",
                          help='e.g. vary=("n",) for an integer that changes per call')
    runtime_params = {p.name for p in kernel.params if p.annotation is not T.CONSTEXPR}
    bad = [n for n in names if n not in runtime_params]
    if bad:
        raise LaunchError("SP0734", f"vary= names `{bad[0]}`, which is not a run-time parameter of "
                          f"`{kernel.name}`", help=f"run-time parameters: {', '.join(sorted(runtime_params))}")
    return tuple(names)


def _per_call_indices(kernel: Any, per_call: Any) -> list[int]:
    """The parameter indices of :meth:`GpuLaunch.prepare`'s ``per_call=`` names, in their order,
    checked (SP0734)."""
    names = (per_call,) if isinstance(per_call, str) else per_call
    if not isinstance(names, tuple | list) or not all(isinstance(n, str) for n in names):
        raise LaunchError("SP0734", f"per_call= takes parameter names (a tuple of strings), got {per_call!r}",
                          help='e.g. per_call=("x", "out") for the arrays that change per call')
    index = {p.name: i for i, p in enumerate(kernel.params) if p.annotation is not T.CONSTEXPR}
    for i, n in enumerate(names):
        if n not in index:
            raise LaunchError("SP0734", f"per_call= names `{n}`, which is not a run-time parameter of "
                              f"`{kernel.name}`", help=f"run-time parameters: {', '.join(sorted(index))}")
        if n in names[:i]:
            raise LaunchError("SP0734", f"per_call= names `{n}` twice", help="name each parameter once")
    return [index[n] for n in names]


def _without_divisibility(bindings: dict[str, Any], key: tuple, vary: tuple[str, ...]) -> tuple[dict[str, Any], tuple]:
    """Bindings and key with the 16-divisibility / alignment assumption dropped for ``vary``."""
    from ..frontend.sema.core import ArgSpec

    bindings = dict(bindings)
    for name in vary:
        b = bindings[name]
        if isinstance(b, ArgSpec) and b.divisible_16:
            bindings[name] = ArgSpec.of(b.type, False)
    key = tuple((e[0], "v", bindings[e[0]].key()) if isinstance(e, tuple) and len(e) == 3 and e[1] == "v"
                and e[0] in vary else e for e in key)
    return bindings, key


def cached_launcher(kernel: Any, key: tuple, ordinal: int, build: Callable[[], Any]) -> Any:
    """The launcher of ``kernel`` for specialization ``key`` on device ``ordinal``: the cached one
    while every Python value the kernel captured is unchanged (``launcher.captures``, checked in a
    few hundred ns), else ``build()``'s, which replaces it."""
    cache = kernel.__dict__.setdefault("_launchers", {})
    launcher = cache.get((key, ordinal))
    if launcher is None or (launcher.captures and not launcher.captures.still_valid()):
        launcher = cache[(key, ordinal)] = build()
    return launcher


def _target(name: str) -> Any:

    return get_target(name)


def _build_launcher(kernel: Any, bindings: dict[str, Any], key: tuple, target: Any, options: dict[str, Any],
                    ordinal: int | None = None) -> Any:
    """The launcher of one specialization, its module loaded on device ``ordinal`` (default: the
    current one)."""
    from ..backend import runtime
    from .compiler import compile_cached

    ck = compile_cached(kernel, bindings, key, target, options)
    stores = stored_params(kernel.ir_for(bindings, key, options))
    spec = param_spec(kernel, bindings, ck.params, stores)
    module = runtime.load_module(ck.cubin, ordinal)
    fn = module.function(llvm_name(ck.name))
    launcher = runtime.Launcher(fn, spec, num_warps=ck.num_warps, dynamic_shared=ck.smem_bytes, cluster=ck.cluster,
                                pdl=ck.pdl)
    launcher.spec_has_tensormaps = any(p.kind == "tensormap" for p in spec.params)
    launcher.written = stores
    launcher.captures = kernel.captures_for(bindings, key, options)
    return launcher


def _host_memory(value: Any) -> Any:
    """The description (``ArrayInfo``, its ``host`` a numpy view of the memory) of ``value`` when it
    is a numpy array, a CPU torch tensor or another DLPack array on the CPU (of any strides: the
    launcher stages it by value), else None."""
    device = getattr(value, "__dlpack_device__", None)  # (torch, cupy, JAX; a DeviceBuffer: CUDA)
    try:
        if device is None or int(device()[0]) != 1:  # kDLCPU
            return None
    except Exception:  # an object that cannot say: not host memory the launcher copies
        return None
    from ..backend.runtime.arguments import HOST, describe_array

    try:
        info = describe_array(value)
    except LaunchError:
        return None
    return info if info is not None and info.device == HOST and info.host is not None else None


def _is_empty(grid: Any) -> bool:
    """Whether a resolved grid has a 0 dimension (an integer, numpy's included, or a sequence of
    them, as the launcher takes; it checks the grid itself: SP0710)."""
    dims = (grid,) if isinstance(grid, numbers.Integral) else grid
    return isinstance(dims, tuple | list) and any(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) and d == 0 for d in dims)


def _stage_tma_host_arrays(launcher: Any, bound: dict[str, Any], empty: bool = False) -> list[tuple[Any, Any]]:
    """A host array passed for a tensor read by TMA must be one device copy shared by its pointer
    and its tensor maps: copy it once here (and back afterwards if the kernel writes it). The host
    arrays of the launch are planned as the launcher plans them (``runtime.host_groups``): another
    argument of the same host memory (a numpy array, a CPU torch tensor) gets the same copy, one
    that overlaps it in part gets its place in one copy of their union where both are C-contiguous
    and of the machine's byte order (a :class:`~sparsile.backend.runtime.staging.StagedView` at its
    offset), else, with a write, is LaunchError SP0750 (members copied by their values, strided or
    byte-swapped views of one memory, share one copy of those values, each described as itself; a
    CPU tensor read through TMA is planned with the rest); one the kernel writes that is read-only is
    SP0719 (its copy would be writable). Returns (host, device copy) to copy back, in that order.
    ``empty``: the grid has a 0 dimension, nothing runs: the same checks, but each copy is an
    :class:`~sparsile.backend.runtime.staging.Unstaged` stand-in (nothing allocated or copied, and
    nothing to copy back)."""
    import numpy as np

    from ..backend import runtime
    from ..backend.runtime.arrays import host_view
    from ..backend.runtime.host_groups import HostEntry, aliasable, plan_host_groups, written_spans
    from ..backend.runtime.staging import StagedView, Unstaged, planned_address

    names = sorted({p.name.split(".tmap")[0] for p in launcher.spec.params if p.kind == "tensormap"})
    hosts = [n for n in names if isinstance(bound[n], np.ndarray)]
    if not hosts:
        return []
    others = [(n, _host_memory(v)) for n, v in bound.items() if n not in hosts]  # (a CPU tensor read by TMA too)
    arrays = [(n, bound[n], False) for n in hosts] + [(n, info.host, info.source == "CPU torch tensor" and
                                                       info.host.dtype.kind == "V") for n, info in others if info]
    for name, v, _ in arrays:  # (the launcher sees the copy, which is writable: SP0719 here, before any copy)
        if name in launcher.written and not v.flags.writeable:
            raise _read_only(name, bound[name])
    entries = [HostEntry(n, v, n in launcher.written, aliasable(v, converted)) for n, v, converted in arrays]
    back: list[tuple[Any, Any]] = []
    for group in plan_host_groups(entries):
        members = [entries[i] for i in group.members]
        if not any(e.name in hosts for e in members):
            continue  # (staged by the launcher)
        one_view = not any(group.offsets) and len({(e.array.dtype, e.array.shape) for e in members}) == 1
        if empty:  # (each at the address its copy would have, alignment for alignment)
            stand_in = Unstaged(members[0].array, planned_address(group, 0))
            for e, offset in zip(members, group.offsets, strict=True):
                bound[e.name] = stand_in if one_view else Unstaged(e.array, planned_address(group, offset))
            continue
        if one_view or not group.raw:  # one view (its members' copies by value hold the same bytes): one copy,
            first = members[0].array  # as the array it is, each member described as itself
            dev = runtime.DeviceBuffer.from_numpy(np.ascontiguousarray(first), device=launcher.device.ordinal)
            for e in members:
                bound[e.name] = dev if one_view else StagedView(dev, dev.ptr, e.array)
            if group.written:
                host = entries[group.written[0]].array
                back.append((host, dev if one_view else StagedView(dev, dev.ptr, host)))
            continue
        buf = runtime.DeviceBuffer(group.nbytes, device=launcher.device.ordinal)  # the union of partial overlaps
        data = buf.ptr + group.lead
        span = host_view(group.lo, "u8", (group.hi - group.lo,))
        runtime.memory.copy_host_to_device(data, span, device=launcher.device.ordinal)
        for e, offset in zip(members, group.offsets, strict=True):
            bound[e.name] = StagedView(buf, data + offset, e.array)
        for lo, hi in written_spans(group, entries):
            written = host_view(lo, "u8", (hi - lo,))
            back.append((written, StagedView(buf, data + lo - group.lo, written)))
    return back


def _read_only(name: str, value: Any) -> LaunchError:
    """SP0719 for a read-only host array the kernel writes, as the launcher words it
    (``arrays.check_array_argument``)."""
    from ..backend.runtime.arguments import READ_ONLY, describe_array, read_only_error

    info = describe_array(value)
    if info is None:
        return LaunchError(READ_ONLY, f"argument `{name}` is a read-only {type(value).__name__}, but the kernel "
                           "writes through it", "pass a writable copy")
    return read_only_error(name, info)


def _copy_back(host: Any, dev: Any, stream: Any = None) -> None:
    """Copy a staged device buffer back into its host array (a strided or byte-swapped one through a
    dense copy of its values, which the device holds in the machine's byte order) on
    ``stream``, the launch's (then synchronized): the legacy default stream would not wait for a
    kernel on a non-blocking stream."""
    from ..backend.runtime.dtypes import byte_swapped

    if host.flags.c_contiguous and not byte_swapped(host.dtype):
        dev.copy_to_host(host, stream=stream)
    else:
        host[...] = dev.copy_to_host(stream=stream).reshape(host.shape)
