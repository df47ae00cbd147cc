"""``kernel[grid](*args)``: specialize, compile (cached), and launch on the current GPU.

The compiled kernel's parameter list (:class:`~sparsile.backend.lower.codegen.KernelParam`) becomes the
runtime's :class:`~sparsile.backend.runtime.arguments.ParamSpec`: pointers and scalars pass through, a
``tensor[T, rank]`` argument becomes its base pointer plus shape and strides the launcher reads
from the array itself (derived parameters), and constexpr parameters are checked, not passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backend.lower.codegen import KernelParam, llvm_name
from ..frontend.diagnostics import LaunchError
from ..frontend.interp.host_arrays import stored_params
from ..frontend.sema.values import Const
from ..target.targets import get_target, target_for_capability
from .kernel import KERNEL_OPTIONS


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
        if isinstance(b, Const):
            spec.append(ConstexprParam(p.name, b.value))
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


def _tensormap_param(cls: Any, source: str, kp: KernelParam, box: tuple[int, ...], swizzle: int,
                     readonly: bool) -> Any:
    """A tensor map of argument ``source`` for one TMA box; the launch passes ``source``'s array
    again for it (see :func:`user_values`)."""
    from ..backend.runtime.tensormap import Swizzle

    sw = {0: Swizzle.NONE, 32: Swizzle.B32, 64: Swizzle.B64, 128: Swizzle.B128}[swizzle]
    return cls(tmap_param_name(source, kp.index), kp.dtype, tuple(box), sw, readonly=readonly)


def tmap_param_name(source: str, index: int) -> str:
    return f"{source}.tmap{index}"


def user_values(spec: Any, bound: dict[str, Any]) -> list[Any]:
    """The argument list the launcher expects: each user parameter's value, a tensor's array
    repeated for each of its tensor maps."""
    out = []
    for p in spec.user_params:
        name = p.name.split(".tmap")[0] if ".tmap" in p.name else p.name
        out.append(bound[name])
    return out


class GpuLaunch:
    """``kernel[grid]``: call it with the kernel's arguments (and ``stream=``, launch options)."""

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
        from ..backend import runtime

        if not runtime.has_gpu():
            raise LaunchError("SP0731", f"kernel `{self.kernel.name}` cannot run: no NVIDIA GPU is available",
                              help=f"run it on the CPU with `{self.kernel.name}.interpret[grid](...)`, or compile "
                                   "ahead of time with `kernel.compile(...)`")
        dev = runtime.current_device()
        bound, bindings, key = self.kernel.bind(args, dict(kwargs))
        # the specialization key already holds the options (a target among them), so the key and the
        # device name one launcher: the common path is this one lookup and the check that the Python
        # values the kernel captured are unchanged (cached_launcher)
        launcher = cached_launcher(self.kernel, key, dev.ordinal, lambda: self._build(dev, bindings, key, kwargs))
        staged = _stage_tma_host_arrays(launcher, bound) if launcher.spec_has_tensormaps else []
        values = user_values(launcher.spec, bound)
        grid = self.grid({k: v.value for k, v in bindings.items() if isinstance(v, Const)}) if callable(self.grid) \
            else self.grid
        launcher(grid, values, stream=stream)
        for host, dev in staged:  # tensors read through TMA were copied to the device as a whole
            dev.copy_to_host(host)

    def _build(self, dev: Any, bindings: dict[str, Any], key: tuple, kwargs: dict[str, Any]) -> Any:

        options = {**KERNEL_OPTIONS, **self.kernel.options,
                   **{k: kwargs[k] for k in kwargs if k in KERNEL_OPTIONS and k not in bindings}}
        target = target_for_capability(*dev.compute_capability) if not options.get("target") else \
            _target(options["target"])
        return _build_launcher(self.kernel, bindings, key, target, options)


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


def _build_launcher(kernel: Any, bindings: dict[str, Any], key: tuple, target: Any, options: dict[str, Any]) -> Any:
    from ..backend import runtime
    from .compiler import compile_cached

    ck = compile_cached(kernel, bindings, key, target, options)
    stores = stored_params(kernel.ir_for(bindings, key, options))
    spec = param_spec(kernel, bindings, ck.params, stores)
    module = runtime.load_module(ck.cubin)
    fn = module.function(llvm_name(ck.name))
    launcher = runtime.Launcher(fn, spec, num_warps=ck.num_warps, dynamic_shared=ck.smem_bytes, cluster=ck.cluster)
    launcher.spec_has_tensormaps = any(p.kind == "tensormap" for p in spec.params)
    launcher.written = stores
    launcher.captures = kernel.captures_for(bindings, key, options)
    return launcher


def _stage_tma_host_arrays(launcher: Any, bound: dict[str, Any]) -> list[tuple[Any, Any]]:
    """A host array passed for a tensor read by TMA must be one device copy shared by its pointer
    and its tensor maps: copy it once here (and back afterwards if the kernel writes it)."""
    import numpy as np

    from ..backend.runtime import DeviceBuffer

    back = []
    names = {p.name.split(".tmap")[0] for p in launcher.spec.params if p.kind == "tensormap"}
    for name in names:
        v = bound[name]
        if isinstance(v, np.ndarray):
            dev = DeviceBuffer.from_numpy(np.ascontiguousarray(v))
            bound[name] = dev
            if name in launcher.written:
                back.append((v, dev))
    return back
