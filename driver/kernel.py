"""Kernels: what ``@sparsile.jit`` returns and what a ``.spk`` module holds.

A :class:`Kernel` knows its AST, where its global names resolve, and its options. Calling
``kernel[grid](*args)`` specializes on the arguments, compiles (cached) and launches on the GPU;
``kernel.interpret[grid](*args)`` runs the same IR in the numpy interpreter; ``kernel.ir(...)``,
``kernel.compile(...)`` give the IR and the compiled artefacts for a signature.

The kernel options are checked in driver/kernel_options.py, grids in driver/grid.py, and the help
of an incomplete ahead-of-time signature is made in driver/signature_help.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..frontend.diagnostics import CompileError, Diagnostic, LaunchError
from ..frontend.dump import dump
from ..frontend.ir import types as T
from ..frontend.ir.core import Function
from ..frontend.ir.printer import print_function
from ..frontend.legality.meta import check_metadata_argument
from ..frontend.sema.call_help import in_a_default
from ..frontend.sema.captures import (
    EMPTY,
    MISSING,
    CaptureSet,
    PythonGlobals,
    annotation_resolver,
    python_annotation,
    python_default,
    python_default_value,
    recording,
)
from ..frontend.sema.class_code import runs_own_code
from ..frontend.sema.core import Sema
from ..frontend.sema.emitter import describe
from ..frontend.sema.fingerprints import register_function_type
from ..frontend.sema.jit_globals import default_as_argument, default_diagnostic, is_run_time_scalar
from ..frontend.sema.keyed_values import python_value
from ..frontend.sema.specialize import (
    ParamInfo,
    arg_spec,
    bind_arguments,
    constant_notes,
    constexpr_binding,
    constexpr_key,
    constexpr_value,
    none_pointer,
    specialize_memo,
)
from ..frontend.sema.type_ctors import InvalidAnnotation, annotation_help
from ..frontend.sema.values import Const, HelperFunction
from ..frontend.syntax import ast as A
from .grid import GRID_HELP, GRID_LIMITS, GridIndexer, GridMissing, constexpr_values, grid_meta, no_grid, normalize_grid
from .kernel_options import (
    KERNEL_OPTIONS,
    MAX_CLUSTER_CTAS,
    MAXNREG_RANGE,
    SP_BAD_OPTION,
    SP_CLUSTER_SHAPE,
    check_options,
    cluster_option,
    cluster_problem,
    is_int,
    option_problem,
)
from .signature_help import SP_SIGNATURE_MISSING, missing_signature_help, missing_signature_message, signature_as_text

__all__ = ["GRID_HELP", "GRID_LIMITS", "KERNEL_OPTIONS", "MAXNREG_RANGE", "MAX_CLUSTER_CTAS", "SP_BAD_OPTION",
           "SP_CLUSTER_SHAPE", "SP_SIGNATURE_MISSING", "GridIndexer", "GridMissing", "Kernel", "check_options",
           "cluster_option", "cluster_problem", "constexpr_values", "grid_meta", "missing_signature_help",
           "missing_signature_message", "no_grid", "normalize_grid", "option_problem"]

_GpuLaunch: Any = None
"""``driver.launch.GpuLaunch``, once a kernel was first indexed with a grid."""


class _FunctionSignature:
    """``Kernel.__signature__``, what ``inspect.signature`` reads: on a kernel, its ``@jit`` function's
    signature, with the defaults Python evaluated (the values a launch that leaves them out takes), or
    None (inspect's own reading) for a ``.spk`` kernel; on the class itself None, so that
    ``inspect.signature(Kernel)`` is the constructor's (a property gave the property object there:
    inspect's TypeError, "unexpected object <property ...> in __signature__ attribute")."""

    def __get__(self, kernel: Any, owner: type | None = None) -> inspect.Signature | None:
        fn = None if kernel is None else kernel.fn
        return None if fn is None else inspect.signature(fn)


@dataclass
class Kernel:
    """A kernel definition (not yet specialized)."""

    node: A.FunctionDef
    globals: Callable[[str], Any]
    options: dict[str, Any] = field(default_factory=dict)
    _params: list[ParamInfo] | None = None
    _param_captures: CaptureSet = EMPTY
    _ir_cache: dict[Any, tuple[Function, CaptureSet]] = field(default_factory=dict)
    _key_options: dict[Any, dict[str, Any]] = field(default_factory=dict)
    _default_options_key: tuple[dict[str, Any], tuple] | None = None
    _spec_memo: dict[Any, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    """The texts of the ``.spk`` modules the kernel's module imports, transitively (driver/imports.py)."""

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def source(self) -> Any:
        return self.node.span.source

    @property
    def source_key(self) -> str:
        """The source text a compile-cache key holds: the kernel's module text, followed by the text
        of every module it imports (so that an edited imported helper recompiles the kernel). A
        kernel without imports keys on its own text alone, as before imports existed."""
        if not self.imports:
            return self.source.text
        return "\0".join((self.source.text, *self.imports))

    def __repr__(self) -> str:
        return f"<sparsile kernel {self.name}>"

    @property
    def fn(self) -> Callable[..., Any] | None:
        """The Python function a ``@jit`` kernel was made from (its ``__defaults__`` are the
        kernel's parameter defaults); None for a ``.spk`` kernel."""
        return self.globals.function if isinstance(self.globals, PythonGlobals) else None

    __signature__ = _FunctionSignature()

    # -------------------------------------------------------------------------- parameters
    @property
    def params(self) -> list[ParamInfo]:
        if self._params is None:
            with recording() as r:
                self._params = self._declared_params()
            self._param_captures = r.captures
        return self._params

    @property
    def is_closed(self) -> bool:
        """Whether nothing outside the kernel's source text can change what it compiles to (a
        ``.spk`` kernel: its module's constants are fixed once loaded). A ``@jit`` kernel reads
        Python names, recorded per IR (frontend/sema/captures.py)."""
        return not isinstance(self.globals, PythonGlobals)

    def current_params(self) -> list[ParamInfo]:
        """:attr:`params`, read again first where a name their annotations or defaults read has
        changed since (``k.fn.__defaults__`` assigned): what a launch binds its arguments to."""
        if self._param_captures.reads:
            self._refresh_params()
        return self.params

    def _refresh_params(self) -> None:
        """Forget the parameters (and what was specialized on them) when a name their annotations
        or defaults read has changed."""
        if self._param_captures and not self._param_captures.still_valid():
            self._params, self._param_captures = None, EMPTY
            self._spec_memo.clear()

    def _declared_params(self) -> list[ParamInfo]:
        sema = Sema(self.globals)
        annotations = Sema(annotation_resolver(self.globals))  # names as Python reads them there
        out = []
        errors: list[Diagnostic] = []
        for p in self.node.params:
            ann: T.Type | None = None
            if p.annotation is not None:
                v = python_annotation(self.globals, p.name)  # a nested function's annotation: Python's value
                try:
                    v = (annotations.evaluate(p.annotation, f"the annotation of `{p.name}`") if v is MISSING
                         else _python_value(v))
                except CompileError as e:
                    errors.extend(e.diagnostics)
                    continue
                if isinstance(v, InvalidAnnotation):  # Python's `ptr[...]` of a nested function: its reason
                    errors.append(Diagnostic("SP0302", v.message, p.annotation.span))
                    continue
                if not isinstance(v, T.Type):
                    errors.append(Diagnostic("SP0302", f"the annotation of `{p.name}` must be a type such as "
                                             "`i32`, `ptr[f16]`, `tensor[f16, 2]` or `constexpr`, found "
                                             f"{describe(Const(v))}",
                                             p.annotation.span, help=annotation_help(v)))
                    continue
                ann = v
            default, has_default = None, p.default is not None
            if has_default:
                assert p.default is not None
                dv = python_default(self.globals, p.name)  # a @jit function's default: Python's value
                raw = MISSING
                try:
                    if dv is MISSING:  # a .spk kernel's: the language's
                        dv = sema.evaluate(p.default)
                    else:  # typed as the same value given at a launch (`np.int8(100)`: the i8 constant)
                        raw = python_default_value(self.globals, p.name)
                        dv = default_as_argument(raw, p.default, dv)
                except CompileError as e:
                    errors.extend(in_a_default(e.diagnostics, p.name))
                    continue
                if ann is not T.CONSTEXPR and is_run_time_scalar(raw):  # the value itself, as a launch's
                    out.append(ParamInfo(p.name, ann, raw, True))
                    continue
                refused = default_diagnostic(p.name, ann is T.CONSTEXPR, dv, p.default.span)
                if refused is not None:
                    errors.append(refused)
                    continue
                default = _python_value(dv)
            out.append(ParamInfo(p.name, ann, default, has_default))
        if errors:
            raise CompileError(errors)
        return out

    # -------------------------------------------------------------------------- compilation
    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], tuple]:
        """(bound arguments, sema bindings, specialization key) for a call."""
        params = self.current_params()
        launch_opts = {k: kwargs.pop(k) for k in list(kwargs) if k in KERNEL_OPTIONS and
                       k not in {p.name for p in params}}
        if launch_opts:
            check_options(launch_opts)
        bound = bind_arguments(self.name, self.params, args, kwargs)
        for p in self.params:  # a tagged MetadataBuffer is checked against a meta[T] parameter, then unwrapped
            bound[p.name] = check_metadata_argument(p.name, p.annotation, bound[p.name])
        bindings, key = specialize_memo(self.name, self.params, bound, self._spec_memo)
        if launch_opts:
            full_key = (*key, self._options_key(launch_opts))
            self._key_options[full_key] = launch_opts
        else:  # the common case: the kernel's own options, whose key is reused while they are unchanged
            cached = self._default_options_key
            if cached is None or cached[0] != self.options:
                check_options(self.options)
                cached = self._default_options_key = (dict(self.options), self._options_key({}))
            full_key = (*key, cached[1])
        return bound, bindings, full_key

    def _options_key(self, launch_opts: dict[str, Any]) -> tuple:
        options = {**KERNEL_OPTIONS, **self.options, **launch_opts}
        return ("options", tuple(sorted((k, str(v)) for k, v in options.items())))

    def ir_for(self, bindings: dict[str, Any], key: tuple, options: dict[str, Any] | None = None) -> Function:
        """The IR for sema ``bindings`` (cached by specialization ``key`` and by what the kernel
        captured: a changed global, closure value or helper builds it anew); ``options`` override
        the kernel's options (by default those given at the launch that produced ``key``)."""
        return self.ir_entry(bindings, key, options)[0]

    def ir_entry(self, bindings: dict[str, Any], key: tuple, options: dict[str, Any] | None = None
                 ) -> tuple[Function, CaptureSet]:
        """:meth:`ir_for` and the Python values the IR captured (its parameters' included)."""
        entry = self._ir_cache.get(key)
        if entry is None or (entry[1] and not entry[1].still_valid()):
            given = options if options is not None else self._key_options.get(key, {})
            self.params  # noqa: B018 (evaluated first: its captures join the IR's)
            with recording() as r:
                func = self.fresh_ir(bindings, given)
            entry = self._ir_cache[key] = (func, self._param_captures + r.captures)
        return entry

    def captures_for(self, bindings: dict[str, Any], key: tuple, options: dict[str, Any] | None = None
                     ) -> CaptureSet:
        """What the IR for ``key`` captured from Python (nothing for a closed ``.spk`` kernel,
        without running sema, unless a constexpr argument's class has code of its own, whose folds
        are keyed by what they gave: frontend/sema/class_code.py)."""
        if self.is_closed and not runs_own_code(map(python_value, bindings.values())):
            return EMPTY
        return self.ir_entry(bindings, key, options)[1]

    def fresh_ir(self, bindings: dict[str, Any], options: dict[str, Any] | None = None) -> Function:
        """A new, uncached IR for ``bindings`` with ``options`` over the kernel's (the compiler's
        passes mutate the IR they are given, so each compile takes its own)."""
        merged = {**KERNEL_OPTIONS, **self.options, **(options or {})}
        check_options(merged, self._option_span)
        attrs = {k: v for k, v in merged.items() if v is not None and k in ("num_warps", "num_stages", "maxnreg")}
        cluster = cluster_option(merged.get("cluster"))
        if cluster != (1, 1, 1):  # only cluster kernels carry it (docs/blackwell.md §7)
            attrs["cluster"] = cluster
        if merged.get("pdl"):  # only programmatic dependent launches carry it (read by pdl.wait()'s check)
            attrs["pdl"] = True
        dump("specialize", self.name, lambda: "\n".join(f"{name} = {value!r}" for name, value in bindings.items()))
        notes = constant_notes(self.params, bindings)
        func = Sema(self.globals, self.source.name).kernel(self.node, bindings, attrs, notes)
        dump("sema", self.name, lambda: print_function(func))
        return func

    def _option_span(self, name: str) -> Any:
        """The span of ``name=`` in the kernel's decorator, else the kernel's (an option given at
        the launch or to ``compile``)."""
        for d in self.node.decorators:
            for k in getattr(d, "keywords", ()):
                if k.name == name:
                    return k.span
        return self.node.span

    def ir(self, *args: Any, **kwargs: Any) -> Function:
        """The IR specialized for these arguments (arrays, scalars, constexpr values)."""
        _, bindings, key = self.bind(args, dict(kwargs))
        return self.ir_for(bindings, key)

    def signature_bindings(self, signature: dict[str, Any]) -> tuple[dict[str, Any], tuple]:
        """Bindings from an ahead-of-time signature: each name maps to a Type (run-time) or a value
        (constexpr). A parameter the signature leaves out takes its annotation (a run-time type,
        default or not), its default (a constexpr), or the type a launch that leaves it out gives
        its default (an unannotated run-time parameter: ``a=3`` an ``i32``, ``a=np.float16(1.5)`` an
        ``f16``); the others are missing: LaunchError SP0740 names them all."""
        from ..frontend.sema.core import ArgSpec

        self.current_params()  # (a default assigned since, `k.fn.__defaults__`: as a launch's bind)
        missing = [p for p in self.params if p.name not in signature and not p.has_default and
                   (p.annotation is None or p.annotation is T.CONSTEXPR)]
        if missing:
            raise LaunchError(SP_SIGNATURE_MISSING, missing_signature_message(self.name, missing),
                              help=missing_signature_help(self.node, self.params, missing))
        bindings: dict[str, Any] = {}
        key: list[Any] = []
        for p in self.params:
            if p.name in signature:
                v = signature[p.name]
            elif p.has_default and (p.annotation is None or p.annotation is T.CONSTEXPR or p.default is None):
                v = p.default
                if p.annotation is None and not none_pointer(p, v):  # as a launch that leaves it out types it
                    v = arg_spec(p, v)
            else:  # (an annotated run-time parameter: its annotation, default or not)
                v = p.annotation
            if p.annotation is T.CONSTEXPR or none_pointer(p, v):
                v = constexpr_value(p, v)  # as a launch's (np.True_ a bool, a list a tuple; SP0723)
                bindings[p.name] = constexpr_binding(v)
                key.append((p.name, "c", constexpr_key(v)))  # (as a launch's: a NaN by its bits)
            else:
                if isinstance(v, ArgSpec):
                    spec = v
                elif isinstance(v, T.Type):
                    spec = ArgSpec(v, isinstance(v, T.PointerType | T.TensorType))
                elif isinstance(v, str):  # the CLI's spelling, in a dict: say which form goes where
                    raise LaunchError("SP0724", f"the signature gives `{p.name}` = {v!r}, a text; in a dict, a "
                                      "run-time parameter needs a type object such as sp.ptr[sp.f32] or sp.i32",
                                      help=f"write {{{p.name!r}: sp.{v.strip().replace('[', '[sp.')}}}, or give "
                                           f"the whole signature as one text: {self.name}.compile("
                                           f"\"{signature_as_text(signature)}\")")
                else:
                    raise LaunchError("SP0724", f"the signature gives `{p.name}` = {v!r}; a run-time parameter "
                                      "needs a type such as `ptr[f32]` or `i32`")
                if p.annotation is not None and p.annotation != spec.type:
                    raise LaunchError("SP0703", f"`{p.name}` is declared {p.annotation} but the signature says "
                                      f"{spec.type}")
                bindings[p.name] = spec
                key.append((p.name, "v", spec.key()))
        extra = set(signature) - {p.name for p in self.params}
        if extra:
            raise LaunchError("SP0702", f"`{self.name}` has no parameter named `{sorted(extra)[0]}`")
        return bindings, tuple(key)

    # -------------------------------------------------------------------------- launching
    @property
    def interpret(self) -> GridIndexer:
        """``kernel.interpret[grid](*args)`` runs the kernel on the CPU with numpy."""
        return GridIndexer(lambda grid: _InterpretLaunch(self, grid), f"{self.name}.interpret")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        global _GpuLaunch
        if _GpuLaunch is None:  # imported on first use (the backend needs cuda-python)
            from .launch import GpuLaunch

            _GpuLaunch = GpuLaunch
        return _GpuLaunch(self, grid)

    def compile(self, signature: dict[str, Any] | str | None = None, target: str | None = None,
                **kwargs: Any) -> Any:
        """Compile ahead of time (no GPU needed): returns a CompiledKernel with ``.ir``, ``.llvm``,
        ``.ptx`` and ``.cubin``. ``signature`` is a dict (name -> type or constexpr value) or the
        text ``sparsile compile --signature`` takes, e.g. ``"x=ptr[f32], n=i32, BLOCK=1024"``; it
        only needs the parameters the source does not type (no annotation, or a constexpr without a
        default: SP0740 otherwise). The result comes from the compile cache when it is there."""
        from .compiler import compile_kernel

        return compile_kernel(self, signature, target=target, **kwargs)

    def as_helper(self) -> HelperFunction:
        """Inline this kernel's body when another kernel calls it."""
        return HelperFunction(self.node, self.globals, self.name, self.imports)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise no_grid(self.name)


register_function_type(Kernel, "kernel")


class _InterpretLaunch:
    """``kernel.interpret[grid]``: call it with the kernel's arguments. ``max_ops`` (a keyword of
    the call, not a kernel parameter) bounds the operations the interpreter may execute."""

    def __init__(self, kernel: Kernel, grid: Any):
        self.kernel = kernel
        self.grid = grid

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        from ..frontend.interp.fpenv import default_fp_environment
        from ..frontend.interp.host_arrays import interpreter_params
        from ..frontend.interp.interpreter import Interpreter
        from .recording import record_launch

        given = dict(kwargs)
        max_ops = None
        if "max_ops" in kwargs and "max_ops" not in {p.name for p in self.kernel.params}:
            max_ops = kwargs.pop("max_ops")
            if max_ops is not None and not (is_int(max_ops) and max_ops >= 1):
                raise LaunchError("SP0725", f"max_ops must be a positive integer or None, found {max_ops!r}",
                                  help="max_ops bounds the operations the interpreter may run; leave it unset "
                                       "for no bound")

        bound, bindings, key = self.kernel.bind(args, dict(kwargs))
        func = self.kernel.ir_for(bindings, key)
        grid = normalize_grid(self.grid, grid_meta(bound, bindings), self.kernel.name)
        with default_fp_environment():  # subnormals kept, whatever the caller set (interp/fpenv.py)
            params, writeback = interpreter_params(func, bound)
            Interpreter(func, max_ops).run(grid, params)
            for fn in writeback:
                fn()
        record_launch(self, args, given)


def _python_value(v: Any) -> Any:
    """A parameter default's value: a typed constant (``u8(250)``) stays the constant of its type."""
    if isinstance(v, Const):
        return v if v.dtype is not None else v.value
    if isinstance(v, tuple):
        return tuple(_python_value(x) for x in v)
    return v
