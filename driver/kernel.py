"""Kernels: what ``@sparsile.jit`` returns and what a ``.spk`` module holds.

A :class:`Kernel` knows its AST, where its global names resolve, and its options. Calling
``kernel[grid](*args)`` specializes on the arguments, compiles (cached) and launches on the GPU;
``kernel.interpret[grid](*args)`` runs the same IR in the numpy interpreter; ``kernel.ir(...)``,
``kernel.compile(...)`` give the IR and the compiled artefacts for a signature.
"""

from __future__ import annotations

import numbers
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
    register_function_type,
)
from ..frontend.sema.core import Sema
from ..frontend.sema.emitter import describe
from ..frontend.sema.jit_globals import computed_default, default_diagnostic
from ..frontend.sema.specialize import (
    ParamInfo,
    bind_arguments,
    call_grid,
    constant_notes,
    constexpr_binding,
    constexpr_value,
    none_pointer,
    specialize_memo,
)
from ..frontend.sema.type_ctors import InvalidAnnotation, annotation_help
from ..frontend.sema.values import Const, HelperFunction
from ..frontend.spans import UNKNOWN_SPAN
from ..frontend.syntax import ast as A
from .param_roles import param_roles

_GpuLaunch: Any = None
"""``driver.launch.GpuLaunch``, once a kernel was first indexed with a grid."""

KERNEL_OPTIONS = {"num_warps": 4, "num_stages": 3, "target": None, "maxnreg": None, "num_ctas": 1,
                  "cluster": (1, 1, 1), "pdl": False}

SP_SIGNATURE_MISSING = "SP0740"
"""An ahead-of-time compile whose signature lacks an unannotated run-time parameter or a constexpr
without a default (everything else comes from the source)."""

SP_BAD_OPTION = "SP0242"
"""A kernel option whose value cannot work (``num_warps=0``, ``maxnreg="x"``): refused before the
compiler turns it into an LLVM attribute that LLVM cannot parse (it exits the process)."""
MAX_CLUSTER_CTAS = 8
"""The portable cluster size limit (docs/blackwell.md, SP0558): each dimension and the product."""
SP_CLUSTER_SHAPE = "SP0558"
MAXNREG_RANGE = (24, 255)
"""ptxas raises a ``.maxnreg`` below 24 to 24 and ignores one above 255 (checked with ptxas 13.0)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def cluster_problem(value: Any) -> tuple[str, str] | None:
    """(message, help) when ``value`` is no cluster shape: 1 to 3 positive ints of at most
    MAX_CLUSTER_CTAS CTAs in all (checked before sema, which computes masks from the shape)."""
    dims = (value,) if _is_int(value) else value
    ok = isinstance(dims, tuple | list) and 1 <= len(dims) <= 3 and all(_is_int(d) for d in dims)
    size = 1
    if ok:
        for d in dims:
            ok = ok and d >= 1
            size = size * d if ok else 0
    if ok and size <= MAX_CLUSTER_CTAS:
        return None
    return (f"a cluster is 1 to 3 positive ints of at most {MAX_CLUSTER_CTAS} CTAs in all, found cluster={value!r}",
            f"e.g. cluster=(2, 1, 1); {MAX_CLUSTER_CTAS} CTAs is the portable limit")


def option_problem(name: str, value: Any) -> tuple[str, str] | None:
    """(message, help) when kernel option ``name`` cannot take ``value``, else None (``cluster``:
    :func:`cluster_problem`, code SP0558); unknown names are SP0236."""
    if name == "num_warps" and not (_is_int(value) and value >= 1):
        return (f"num_warps must be a positive integer, found {value!r}",
                "use the number of warps per CTA, e.g. num_warps=4 (one warpgroup)")
    if name == "cluster" and value is not None:
        return cluster_problem(value)
    if name == "num_stages" and not (_is_int(value) and value >= 0):
        return f"num_stages must be a non-negative integer, found {value!r}", "e.g. num_stages=3"
    if name == "num_ctas" and not (_is_int(value) and value >= 1):
        return (f"num_ctas must be a positive integer, found {value!r}",
                "leave it at 1; CTA clusters are asked for with cluster=(x, y, z)")
    low, high = MAXNREG_RANGE
    if name == "maxnreg" and value is not None and not (_is_int(value) and low <= value <= high):
        return (f"maxnreg must be an integer from {low} to {high} registers per thread, found {value!r}",
                f"ptxas raises budgets below {low} to {low} and ignores budgets above {high}; "
                "leave maxnreg unset to let ptxas choose")
    if name == "pdl" and not isinstance(value, bool):
        return (f"pdl must be True or False, found {value!r}",
                "pdl=True launches the kernel as a programmatic dependent launch (sm_90+): it may start "
                "while the previous kernel in the stream runs and must call pdl.wait() before it reads "
                "that kernel's results (docs/language.md, \"Programmatic dependent launch\")")
    if name == "target" and value is not None and not isinstance(value, str):
        return (f"target must be a target name such as \"sm_90a\", found {value!r}",
                "pass the name as a string, or leave target unset")
    return None


def check_options(options: dict[str, Any], spans: Callable[[str], Any] | None = None) -> None:
    """Raise CompileError SP0242 for every kernel option in ``options`` whose value cannot work
    (SP0236 for a name that is no option); ``spans(name)`` gives the user's span of an option where
    there is one (a decorator)."""
    diags = []
    for name, value in options.items():
        span = (spans(name) if spans is not None else None) or UNKNOWN_SPAN
        if name not in KERNEL_OPTIONS:
            diags.append(Diagnostic("SP0236", f"unknown kernel option `{name}`", span,
                                    help=f"options: {', '.join(KERNEL_OPTIONS)}"))
            continue
        problem = option_problem(name, value)
        if problem is not None:
            code = SP_CLUSTER_SHAPE if name == "cluster" else SP_BAD_OPTION
            diags.append(Diagnostic(code, problem[0], span, help=problem[1]))
    if diags:
        raise CompileError(diags)


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
                dv = python_default(self.globals, p.name)  # a nested function's default: Python's value
                try:
                    if dv is MISSING:
                        dv = sema.evaluate(p.default)
                    else:  # `np.int8(100)` computed there: typed, as sema's evaluation of the call
                        dv = computed_default(python_default_value(self.globals, p.name), p.default, dv)
                except CompileError as e:
                    errors.extend(in_a_default(e.diagnostics, p.name))
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
        if self._param_captures.reads:
            self._refresh_params()
        launch_opts = {k: kwargs.pop(k) for k in list(kwargs) if k in KERNEL_OPTIONS and
                       k not in {p.name for p in self.params}}
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
        without running sema)."""
        return EMPTY if self.is_closed else self.ir_entry(bindings, key, options)[1]

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
        (constexpr). A parameter the signature leaves out takes its annotation (a run-time type)
        or its default (a constexpr); the others are missing: LaunchError SP0740 names them all."""
        from ..frontend.sema.core import ArgSpec

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
            elif p.has_default:
                v = p.default
            else:
                v = p.annotation
            if p.annotation is T.CONSTEXPR or none_pointer(p, v):
                v = constexpr_value(p, v)  # as a launch's (np.True_ a bool, a list a tuple; SP0723)
                bindings[p.name] = constexpr_binding(v)
                key.append((p.name, "c", repr(v)))
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
                                           f"\"{_as_text(signature)}\")")
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


def missing_signature_message(kernel: str, missing: list[ParamInfo]) -> str:
    """SP0740's message: each missing parameter and why the source does not give it."""
    parts = [f"`{p.name}` ({'constexpr without a default' if p.annotation is T.CONSTEXPR else 'no annotation'})"
             for p in missing]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"the signature of `{kernel}` must give {listed}"


def _as_text(signature: dict[str, Any]) -> str:
    """A dict signature in the text form ``compile`` also takes (``"x=ptr[f32], BLOCK=32"``)."""
    return ", ".join(f"{name}={value}" for name, value in signature.items())


def missing_signature_help(fn: A.FunctionDef, params: list[ParamInfo], missing: list[ParamInfo]) -> str:
    """SP0740's help: an example signature for the ``missing`` parameters of kernel ``fn`` that fits
    how its body uses each (driver/param_roles.py): a pointer ``x=ptr[f32]`` (the element type of
    the annotated pointers when they agree), a scalar ``n=i32``, a constexpr ``BLOCK=64``; one the
    body does not show is written as a pointer, and the help says so and gives the scalar form."""
    runtime = [p.name for p in missing if p.annotation is not T.CONSTEXPR]
    maybe = [p.name for p in params if p.annotation is None or isinstance(p.annotation, T.PointerType)]
    roles = param_roles(fn, runtime, maybe)
    elems = {str(p.annotation.elem) for p in params if isinstance(p.annotation, T.PointerType)}
    elem = elems.pop() if len(elems) == 1 else "f32"
    example = ", ".join(f"{p.name}=64" if p.annotation is T.CONSTEXPR else
                        f"{p.name}=i32" if roles[p.name] == "scalar" else f"{p.name}=ptr[{elem}]" for p in missing)
    unknown = [n for n in runtime if roles[n] is None]
    text = f"give them with --signature (Kernel.compile: signature=), e.g. \"{example}\""
    if unknown:
        names = ", ".join(f"`{n}`" for n in unknown)
        text += (f" ({names}: the kernel does not show whether {'it is' if len(unknown) == 1 else 'each is'} a "
                 f"pointer or a scalar; a scalar is written {unknown[0]}=i32 or {unknown[0]}=f32)")
    return text + "; annotated run-time parameters and defaulted constexprs need nothing"


class GridMissing(LaunchError, RuntimeError):
    """SP0710: a kernel called without its grid (``k(...)``, ``k.interpret(...)``); a RuntimeError
    too, as ``k(...)`` raised before it had a code."""


GRID_HELP = ("index the kernel with its grid first: the number of programs along x (y, z), e.g. "
             "(sp.cdiv(n, BLOCK),) (docs/language.md, \"Specialization and launching\")")


def no_grid(name: str) -> GridMissing:
    """The error of kernel ``name`` called without a grid."""
    return GridMissing("SP0710", f"kernel `{name}` must be launched with a grid: `{name}[grid](...)`, or run on "
                                 f"the CPU with `{name}.interpret[grid](...)`", help=GRID_HELP)


class GridIndexer:
    """``launcher[grid]``: the launch of ``make(grid)``; ``name`` is the launcher as the user spells
    it (``k.interpret``), for the error of a call without the grid."""

    def __init__(self, make: Callable[[Any], Any], name: str = "kernel.interpret"):
        self._make = make
        self._name = name

    def __getitem__(self, grid: Any) -> Any:
        return self._make(grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise GridMissing("SP0710", f"`{self._name}` runs the kernel for a grid: `{self._name}[grid](...)`",
                          help=GRID_HELP)


def cluster_option(value: Any) -> tuple[int, ...]:
    """The ``cluster=`` kernel option as a tuple of 3 ints (``2`` means ``(2, 1, 1)``); a value that
    is not 1 to 3 ints is kept as given for the legality pass to report (SP0552)."""
    if value is None:
        return (1, 1, 1)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if isinstance(value, tuple | list) and 1 <= len(value) <= 3 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple((*value, 1, 1)[:3])
    return tuple(value) if isinstance(value, tuple | list) else (value,)


GRID_LIMITS = (2**31 - 1, 65535, 65535)
"""The most CTAs along x, y, z of one launch on every CUDA GPU sparsile targets (compute capability
3.0 and later; CUDA C++ Programming Guide, "Technical Specifications per Compute Capability")."""


def constexpr_values(bindings: dict[str, Any]) -> dict[str, Any]:
    """The values of a call's constexpr arguments, by name."""
    return {k: v.value for k, v in bindings.items() if isinstance(v, Const)}


def grid_meta(bound: dict[str, Any], bindings: dict[str, Any]) -> dict[str, Any]:
    """What a grid function is given, on every launch path: every argument of the call by name,
    constexprs as their values (docs/language.md, "Specialization and launching")."""
    return {**bound, **constexpr_values(bindings)}


def normalize_grid(grid: Any, meta: dict[str, Any], kernel_name: str = "kernel") -> tuple[int, int, int]:
    """A grid given as an int, a tuple or list of up to 3 ints, or a callable of ``meta`` (the
    call's arguments: :func:`grid_meta`) returning one (LaunchError SP0710 otherwise, and for a
    grid function looking up a name ``meta`` lacks: ``specialize.call_grid``). A dimension may be 0:
    such a grid has no programs, and its launch runs nothing once the arguments are checked
    (docs/language.md, "Specialization and launching"); a negative one is SP0710."""
    if isinstance(grid, type):  # callable, yet no grid function (`np.int32` called with the arguments' dict)
        raise LaunchError("SP0710", f"the grid must be an int, a tuple of up to 3 ints or a function of the call's "
                          f"arguments, found the class {grid.__name__}")
    if callable(grid):
        grid = call_grid(grid, meta, kernel_name)
    if _is_int(grid):
        grid = (grid,)
    if not isinstance(grid, tuple | list):
        raise LaunchError("SP0710", f"the grid must be an int or a tuple of up to 3 ints, found {grid!r}")
    if not 1 <= len(grid) <= 3:
        raise LaunchError("SP0710", f"the grid must have 1 to 3 dimensions, found {len(grid)}")
    bad = [g for g in grid if not _is_int(g)]  # (a list: None is a dimension too, `(None,)`)
    if bad:
        raise LaunchError("SP0710", f"every grid dimension must be an integer, found {bad[0]!r} in {tuple(grid)!r}",
                          help="compute grid sizes with integer arithmetic, e.g. `(n + BLOCK - 1) // BLOCK`")
    dims = tuple(int(g) for g in grid)
    if any(d < 0 for d in dims):
        raise LaunchError("SP0710", f"a grid dimension cannot be negative, found {dims}",
                          help="compute grid sizes that are 0 or more, e.g. `sp.cdiv(n, BLOCK)` with n >= 0 "
                               "(a grid with a 0 dimension launches nothing)")
    for axis, (d, most) in enumerate(zip(dims, GRID_LIMITS, strict=False)):
        if d > most:
            raise LaunchError("SP0710", f"grid {dims} has {d} programs along {'xyz'[axis]}; CUDA allows at most "
                              f"{most}", help="use a persistent kernel or move work to another grid dimension")
    return ((*dims, 1, 1))[:3]  # type: ignore[return-value]


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
            if max_ops is not None and not (_is_int(max_ops) and max_ops >= 1):
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
