"""``sparsile.jax.call``: a compiled sparsile kernel as one JAX operation, usable inside ``jax.jit``.

    y = sparsile.jax.call(kernel, grid, x, n=n, out_shapes={"out": jax.ShapeDtypeStruct(x.shape, x.dtype)})

Arguments fill the kernel's parameters: JAX (or numpy) arrays become XLA buffers, Python numbers
are static scalars, constexprs are static; the outputs are buffers XLA allocates from
``out_shapes``. At trace time the call is checked (argument kinds, dtypes against the kernel's
annotations, which parameters the kernel writes) and the kernel is specialized and type-checked; a
``sparsile_call`` primitive is bound whose lowering

* on CUDA compiles the kernel for the GPU's target (through the compile cache), loads it, and emits
  an XLA custom call to the ``sparsile_call`` FFI target (:mod:`.ffi`): at run time the kernel is
  launched on XLA's stream with XLA's device pointers;
* on the CPU emits the same custom call, whose handler runs the numpy interpreter on XLA's host
  buffers (the path the CPU tests take);
* with ``interpret=True`` (any platform) runs the interpreter through ``jax.pure_callback`` instead
  (on a GPU the buffers are copied to the host and back).

Differentiation and ``jax.vmap`` of the primitive raise SP0934 / SP0935. docs/jax.md has the details.

The plan a call builds is :class:`~.plan.CallPlan` (:mod:`.plan`), the primitive it binds
``sparsile_call_p`` (:mod:`.primitive`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ...driver.grid import grid_meta, normalize_grid
from ...driver.kernel import Kernel
from ...driver.kernel_options import KERNEL_OPTIONS
from ...frontend.diagnostics import CompileError, LaunchError, Severity
from ...frontend.interp.host_arrays import stored_params
from ...frontend.ir import types as T
from ...frontend.ir.scalar_range import check_float_fits
from ...frontend.legality.meta import check_metadata_argument
from ...stdlib.sparsity.hostarray import checked_flag
from . import ffi
from .errors import SP_JAX_ARGUMENT, SP_JAX_OUT_SHAPES, SP_JAX_WRITES_INPUT, JaxCallError
from .plan import CallPlan, DeviceView, needs_info
from .primitive import sparsile_call_p

__all__ = ["X64_HELP", "CallPlan", "DeviceView", "call", "check_concrete", "needs_info", "sparsile_call_p"]


class _Stand:
    """An array stand-in for specializing a kernel at trace time: shape, dtype, and an address
    XLA guarantees to be aligned (XLA aligns every buffer to at least 16 bytes). A grid function
    reads it as a numpy or jax array: ``shape``, ``dtype``, ``ndim``, ``size``, ``itemsize``,
    ``nbytes``, ``len()``."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.itemsize = self.dtype.itemsize
        self.nbytes = self.size * self.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __bool__(self) -> bool:  # (truthy, as before it had a length: an empty array is still an argument)
        return True

    def __repr__(self) -> str:
        return f"<array stand-in: shape={self.shape}, dtype={self.dtype}>"

    def data_ptr(self) -> int:
        return 0


# ------------------------------------------------------------------------------------------------
# call()


def _is_struct(s: Any) -> bool:
    return hasattr(s, "shape") and hasattr(s, "dtype") and not isinstance(s, jax.Array | np.ndarray)


def _out_names(kernel: Kernel, n_args: int, out_shapes: Any) -> tuple[list[str], list[Any], str]:
    """(parameter names of the outputs, their structs, "single" / "sequence" / "mapping")."""
    names = [p.name for p in kernel.params]
    if not (isinstance(out_shapes, Mapping | Sequence) or _is_struct(out_shapes)) or isinstance(out_shapes, str):
        raise JaxCallError(SP_JAX_OUT_SHAPES, "out_shapes must be a jax.ShapeDtypeStruct, a sequence of them or a "
                           f"mapping {{parameter name: struct}}, got {type(out_shapes).__name__}",
                           help="describe each output as jax.ShapeDtypeStruct(shape, dtype)")
    if isinstance(out_shapes, Mapping):
        unknown = [k for k in out_shapes if k not in names]
        if unknown:
            raise JaxCallError(SP_JAX_OUT_SHAPES, f"out_shapes names `{unknown[0]}`, which is no parameter of "
                               f"`{kernel.name}`", help=f"parameters: {', '.join(names)}")
        keys, structs, form = list(out_shapes), list(out_shapes.values()), "mapping"
    else:
        form = "single" if _is_struct(out_shapes) else "sequence"
        structs = [out_shapes] if form == "single" else list(out_shapes)
        if n_args + len(structs) > len(names):
            raise JaxCallError(SP_JAX_OUT_SHAPES, f"`{kernel.name}` has {len(names)} parameters; {n_args} "
                               f"arguments and {len(structs)} outputs do not fit",
                               help="outputs fill the parameters right after the positional arguments; name "
                                    "them instead with out_shapes={'param': jax.ShapeDtypeStruct(...)}")
        keys = names[n_args:n_args + len(structs)]
    for key, s in zip(keys, structs):
        if not _is_struct(s):
            raise JaxCallError(SP_JAX_OUT_SHAPES, f"the output for `{key}` must be a jax.ShapeDtypeStruct, got "
                               f"{type(s).__name__}", help="describe outputs as jax.ShapeDtypeStruct(shape, dtype)")
    return keys, structs, form


def _is_traced(v: Any) -> bool:
    return isinstance(v, jax.Array | jax.core.Tracer)


def check_concrete(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as ints: SP0932 for a symbolic dimension (``jax.export`` with shape polymorphism),
    which failed as jax's InconclusiveDimensionOperation from inside the call. A sparsile call is
    planned for its shapes at trace time (the grid, the specialization, sparse_linear's tiles and
    split-K), so it cannot be exported for all sizes at once."""
    dims = tuple(shape)
    if all(isinstance(d, int | np.integer) for d in dims):
        return tuple(int(d) for d in dims)
    shown = "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
    raise JaxCallError(SP_JAX_ARGUMENT, f"`{name}` has the symbolic shape {shown}, but a sparsile call is planned "
                       "for the shapes it is traced with (its grid, its specialization)",
                       help="export with concrete shapes, one export per shape: jax.export.export(f)(jax."
                            "ShapeDtypeStruct((8, 512), jnp.float32)); shape polymorphism is not supported")


def _check_scalars(func: Any, sources: list[tuple[str, str, Any]]) -> None:
    """SP0709 while tracing for a float scalar that overflows its parameter type (``alpha: f32`` given
    1e40). The kernel's specialization checks it only when it is made, and it is memoized per value
    type: a later trace with another value skipped the check, and the launch (the CPU handler, the GPU
    launcher) refused it at run time inside XLA, as SP0936."""
    values = {name: where for name, kind, where in sources if kind == "value"}
    for p in func.runtime_params:
        t, value = p.type, values.get(p.name)
        if isinstance(t, T.ScalarType) and t.is_float and p.name in values and \
                not isinstance(value, bool | np.bool_):
            check_float_fits(p.name, value, t.name)


def _check_options(constexprs: Any, input_output_aliases: Any, interpret: Any) -> bool:
    """SP0932 / SP0933 for ``constexprs`` or ``input_output_aliases`` that are no mapping (Python's
    TypeError or AttributeError from inside the call), SP0932 for a traced ``interpret`` (jax's
    TracerBoolConversionError), SP0804 for one that is no bool ("no" turned the interpreter on);
    returns ``interpret`` as a bool."""
    if constexprs is not None and not isinstance(constexprs, Mapping):
        raise JaxCallError(SP_JAX_ARGUMENT, f"constexprs must be a mapping {{parameter name: value}}, got "
                           f"{type(constexprs).__name__}",
                           help="pass constexprs={'BLOCK': 128}, or the values as keywords")
    if input_output_aliases is not None and not isinstance(input_output_aliases, Mapping):
        raise JaxCallError(SP_JAX_WRITES_INPUT, "input_output_aliases must be a mapping {input index: output index}, "
                           f"got {type(input_output_aliases).__name__}", help="pass input_output_aliases={0: 0}")
    if isinstance(interpret, jax.core.Tracer):
        raise JaxCallError(SP_JAX_ARGUMENT, "interpret of call is static, but got a traced value",
                           help="pass interpret as a Python bool; a jitted function that takes it as an argument must "
                                "mark it static: jax.jit(f, static_argnames=('interpret',))")
    return checked_flag(interpret, "interpret")


def _not_an_array(name: str, value: Any) -> JaxCallError:
    """SP0932 for an array-like argument that is neither a jax nor a numpy array (a
    ``jax.ShapeDtypeStruct``, another library's tensor): it would be passed as a static value, and
    fail only when XLA runs the program (or reach the GPU launcher as it is)."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return JaxCallError(SP_JAX_ARGUMENT, f"`{name}` got a jax.ShapeDtypeStruct, which describes an array but "
                            "holds no data", help="pass the input as a jax or numpy array; a ShapeDtypeStruct "
                                                  "declares an output, in out_shapes")
    kind = f"{type(value).__module__}.{type(value).__name__}"
    return JaxCallError(SP_JAX_ARGUMENT, f"`{name}` got a {kind}, which is neither a jax nor a numpy array",
                        help="convert it first: jax.numpy.asarray(value)")


def _check_kernel(kernel: Any) -> None:
    """SP0932 for a ``kernel`` that is no sparsile kernel (a function without ``@sparsile.jit``, an
    autotuned kernel): it failed later with an AttributeError of a missing ``params``."""
    if isinstance(kernel, Kernel):
        return
    from ...driver.autotune import Autotuner

    if isinstance(kernel, Autotuner):
        what = f"an autotuned kernel (`{kernel.kernel.name}`)"
        help = (f"sparsile.jax does not tune: pass `{kernel.kernel.name}.kernel` with one config's constexprs "
                "(constexprs={...}) and options (num_warps=...)")
    else:
        name = getattr(kernel, "__name__", None)
        what = f"the function `{name}`" if callable(kernel) and name else f"a {type(kernel).__name__}"
        help = "decorate the function with @sparsile.jit (its parameters annotated), or load a .spk file with " \
               "sparsile.load(path) and pass module.<kernel>"
    raise JaxCallError(SP_JAX_ARGUMENT, f"call takes a sparsile kernel (@sparsile.jit, or one of a .spk module), "
                       f"got {what}", help=help)


_NARROWED = {T.f64: np.dtype(np.float32), T.i64: np.dtype(np.int32), T.u64: np.dtype(np.uint32)}
"""The dtype JAX without x64 holds an array of each 64-bit element type as."""
X64_HELP = ("JAX holds 64-bit arrays as 32-bit ones unless x64 is enabled: jax.config.update(\"jax_enable_x64\", "
            "True) before creating the arrays (docs/jax.md)")


def _check_width(key: str, dtype: np.dtype) -> None:
    """SP0931 for an output of a 64-bit type (float64, int64, uint64) while x64 is off, which JAX
    has no arrays of: the FFI path returned one that the next jnp operation made 32-bit, and
    ``interpret=True`` failed inside ``jax.pure_callback`` (jax's ValueError)."""
    narrow = jax.dtypes.canonicalize_dtype(dtype)
    if narrow != dtype:
        raise JaxCallError(SP_JAX_OUT_SHAPES, f"the output for `{key}` is {dtype}, but JAX without x64 has no 64-bit "
                           "arrays (it holds them as 32-bit ones)",
                           help=f"declare the output as {narrow}, or enable x64: jax.config.update("
                                "\"jax_enable_x64\", True) (docs/jax.md)")


def _x64_help(exc: LaunchError, kernel: Kernel, stand: Mapping[str, Any]) -> LaunchError | None:
    """SP0703 ``exc`` with :data:`X64_HELP` added when it is about an array parameter of a 64-bit
    element type given the 32-bit array JAX makes of a 64-bit one while x64 is off (a numpy f64
    array arrives as f32); None otherwise."""
    if exc.code != "SP0703" or jax.config.jax_enable_x64:
        return None
    for p in kernel.params:
        ann = p.annotation
        elem = ann.elem if isinstance(ann, T.PointerType | T.TensorType) else None
        given = stand.get(p.name)
        if elem in _NARROWED and isinstance(given, _Stand) and given.dtype == _NARROWED[elem] and \
                exc.message.startswith(f"argument `{p.name}` "):
            return LaunchError(exc.code, exc.message, help=f"{exc.help}; {X64_HELP}" if exc.help else X64_HELP)
    return None


def call(kernel: Kernel, grid: Any, *args: Any, out_shapes: Any, constexprs: Mapping[str, Any] | None = None,
         input_output_aliases: Mapping[int, int] | None = None, interpret: bool = False, **kwargs: Any) -> Any:
    """Call ``kernel`` on ``grid`` as one JAX operation (usable inside ``jax.jit``).

    ``args`` and ``kwargs`` fill the kernel's parameters (positionally, then by name): JAX or numpy
    arrays for pointer/tensor parameters, Python numbers for scalars (static: part of the compiled
    program), values for constexprs (also ``constexprs={...}``). ``out_shapes``: a
    ``jax.ShapeDtypeStruct`` (one output), a sequence of them (outputs fill the parameters right
    after the positional arguments, as jax-triton's ``triton_call`` does) or a mapping
    ``{parameter name: struct}``; the result has the same form (an array, a tuple, a dict). Output
    buffers start undefined: the kernel must write every element. ``input_output_aliases`` maps an
    array argument's index (among the array arguments) to an output index whose buffer it becomes
    (the output then starts with the input's values, and the kernel may write through either
    parameter). ``grid``: 1 to 3 ints or a callable of a dict of every argument of the call by name (run-time
    ones and constexprs: docs/language.md, "Specialization and launching"). Kernel options
    (``num_warps=``...) may be given as keywords. ``interpret=True`` runs the kernel in the
    interpreter through a host callback on any backend.
    """
    _check_kernel(kernel)
    interpret = _check_options(constexprs, input_output_aliases, interpret)
    out_keys, structs, form = _out_names(kernel, len(args), out_shapes)
    names = [p.name for p in kernel.params]
    positional = [n for n in names if n not in out_keys][:len(args)] if form == "mapping" else names[:len(args)]
    given: dict[str, Any] = dict(zip(positional, args))
    for key, value in {**kwargs, **(constexprs or {})}.items():
        if key in given or key in out_keys:
            raise JaxCallError(SP_JAX_ARGUMENT, f"`{kernel.name}` got two values for `{key}`")
        given[key] = value
    params = {p.name: p for p in kernel.params}
    operands: list[Any] = []
    sources: list[tuple[str, str, Any]] = []
    stand: dict[str, Any] = {}
    zero_d: list[str] = []  # unannotated parameters given a 0-d array (jax, numpy, traced)
    for name, value in given.items():
        p = params.get(name)
        if p is None:
            stand[name] = value  # a kernel option, or an unknown name bind() reports (SP0702)
            continue
        if type(value).__name__ == "MetadataBuffer":  # tagged metadata: checked against a meta[T] parameter
            value = check_metadata_argument(name, p.annotation, value)
        array = _is_traced(value) or isinstance(value, np.ndarray)
        if array and (p.annotation is T.CONSTEXPR or isinstance(p.annotation, T.ScalarType)):
            what = "constexpr" if p.annotation is T.CONSTEXPR else "scalar"
            kind = "traced" if isinstance(value, jax.core.Tracer) else "jax" if _is_traced(value) else "numpy"
            raise JaxCallError(SP_JAX_ARGUMENT, f"`{name}` is a {what} parameter of `{kernel.name}`, but got a "
                               f"{kind} array",
                               help=f"pass `{name}` as a Python number: scalars and constexprs are static "
                                    "(part of the compiled program); pass data as a pointer parameter")
        if array:
            check_concrete(name, np.shape(value))
            if p.annotation is None and np.ndim(value) == 0:  # (an array, as kernel[grid] takes np.array(3))
                zero_d.append(name)
            if isinstance(value, np.ndarray):  # the buffer JAX makes of it: 32-bit for float64 / int64 without x64
                with contextlib.suppress(TypeError):  # (a type JAX holds no buffer of: SP0708 below)
                    value = jax.numpy.asarray(value)
            sources.append((name, "in", len(operands)))
            operands.append(value)
            stand[name] = _Stand(np.shape(value), np.dtype(value.dtype))
        elif _is_struct(value) and not isinstance(value, np.generic):
            raise _not_an_array(name, value)
        elif isinstance(value, Sequence | Mapping) and not isinstance(value, str | tuple):
            raise JaxCallError(SP_JAX_ARGUMENT, f"`{name}` got a {type(value).__name__}; a sparsile kernel takes "
                               "arrays and numbers", help="pass a jax.Array, a numpy array or a Python number")
        else:
            sources.append((name, "value", value))
            stand[name] = value
    for k, (key, s) in enumerate(zip(out_keys, structs)):
        check_concrete(key, s.shape)
        sources.append((key, "out", k))
        stand[key] = _Stand(tuple(s.shape), np.dtype(s.dtype))
    aliases = _aliases(input_output_aliases, operands, structs)

    launch_options = {k: v for k, v in stand.items() if k in KERNEL_OPTIONS and k not in params}
    try:
        bound, bindings, key = kernel.bind((), dict(stand))
    except LaunchError as exc:
        wider = _x64_help(exc, kernel, stand)
        if wider is None:
            raise
        raise wider from None
    for out_key, s in zip(out_keys, structs):  # (after bind: a 64-bit input's SP0703 says why first)
        _check_width(out_key, np.dtype(s.dtype))
    for p in kernel.params:  # defaults (scalars, constexprs) the call left out are passed as bound
        if p.name not in given and p.name not in out_keys:
            sources.append((p.name, "value", bound[p.name]))
    func = _ir_for(kernel, bindings, key, zero_d)
    _check_scalars(func, sources)
    captures = kernel.captures_for(bindings, key)  # (cached with func: the values it was built with)
    written = stored_params(func)
    inputs = {name for name, kind, where in sources if kind == "in" and where not in aliases}
    overwritten = sorted(written & inputs)
    if overwritten:
        name = overwritten[0]
        raise JaxCallError(SP_JAX_WRITES_INPUT, f"`{kernel.name}` writes `{name}`, which is an input of this call",
                           help=f"declare `{name}` as an output (out_shapes), or alias the input to an output "
                                "with input_output_aliases={input index: output index}")
    # every argument, as on the other launch paths (docs/language.md): scalars and constexprs by value,
    # arrays as their trace-time stand-ins (shape, dtype)
    dims = normalize_grid(grid, grid_meta(bound, bindings), kernel.name)
    plan = CallPlan(kernel, bindings, key, launch_options, dims, sources, [np.dtype(s.dtype) for s in structs],
                    aliases, func, captures)
    number = ffi.add_plan(plan, _describe(plan, operands, structs))
    out_avals = tuple(jax.core.ShapedArray(tuple(s.shape), np.dtype(s.dtype)) for s in structs)
    arrays = [jax.numpy.asarray(a) for a in operands]
    results = sparsile_call_p.bind(*arrays, plan=number, out_avals=out_avals, interpret=bool(interpret),
                                   aliases=tuple(sorted(aliases.items())))
    if form == "single":
        return results[0]
    if form == "mapping":
        return dict(zip(out_keys, results))
    return tuple(results)


ZERO_D_NOTE = ("`{name}` was given a 0-d array, which a kernel takes as a one-element array (a pointer), as "
               "kernel[grid] does; pass a Python number for a scalar (under jax.jit, a static argument: "
               "static_argnums, static_argnames or a closure)")
"""The note a type error (SP03xx) gets for each unannotated parameter that was given a 0-d array."""


def _ir_for(kernel: Kernel, bindings: dict[str, Any], key: tuple, zero_d: list[str]) -> Any:
    """``kernel.ir_for(bindings, key)``; a type error (SP03xx, e.g. SP0310 of ``offs < n``) of a kernel
    whose unannotated parameters ``zero_d`` were given 0-d arrays gets :data:`ZERO_D_NOTE` for each:
    a jax.jit argument meant as a number arrives traced, a 0-d array (docs/jax.md)."""
    try:
        return kernel.ir_for(bindings, key)
    except CompileError as exc:
        errors = [i for i, d in enumerate(exc.diagnostics) if d.severity is Severity.ERROR]
        if not zero_d or not errors or not exc.diagnostics[errors[0]].code.startswith("SP03"):
            raise
        diagnostics = list(exc.diagnostics)
        first = diagnostics[errors[0]]
        notes = tuple(ZERO_D_NOTE.format(name=name) for name in zero_d)
        diagnostics[errors[0]] = dataclasses.replace(first, notes=first.notes + notes)
        raise CompileError(diagnostics) from None


def _describe(plan: CallPlan, operands: list[Any], structs: list[Any]) -> str:
    """The content of a plan as text (its number is a hash of it): the kernel's source and name, the
    specialization, the Python values a ``@jit`` kernel captured (a changed global is another plan:
    the registry keeps the first plan of a number, ffi.add_plan), grid, argument sources and static
    values, the operands' shapes and dtypes, options, outputs and aliases. The shapes count although
    the specialization leaves them out: the native CUDA path arms one record per number, holding the
    tensor maps (and derived shapes) of the buffers it first ran with, and re-encodes only moved
    addresses (native.py), so an operand of another shape must be another plan."""
    sources = [(n, k, w if k != "value" else repr(w)) for n, k, w in plan.sources]
    ins = [(tuple(int(d) for d in np.shape(a)), str(np.dtype(a.dtype))) for a in operands]
    outs = [(tuple(s.shape), str(np.dtype(s.dtype))) for s in structs]
    captures = (plan.captures if plan.captures is not None else
                plan.kernel.captures_for(plan.bindings, plan.key)).disk_key()
    return repr((plan.kernel.source_key, plan.kernel.name, plan.key, captures, plan.grid, sources, ins,
                 sorted(plan.launch_options.items()), sorted(plan.aliases.items()), outs))


def _aliases(given: Mapping[int, int] | None, operands: list[Any], structs: list[Any]) -> dict[int, int]:
    """Checked ``input_output_aliases``: operand index -> output index (Python ints; NumPy integers
    are taken too, as JAX takes them), same shape and dtype."""
    out: dict[int, int] = {}
    for i, o in (given or {}).items():
        if isinstance(i, numbers.Integral) and isinstance(o, numbers.Integral):
            i, o = int(i), int(o)  # (np.int64(0): the plan's key and XLA's attribute take Python ints)
        if not (isinstance(i, int) and 0 <= i < len(operands) and isinstance(o, int) and 0 <= o < len(structs)):
            raise JaxCallError(SP_JAX_WRITES_INPUT, f"input_output_aliases {{{i}: {o}}} names no array argument "
                               f"or no output (there are {len(operands)} array arguments and {len(structs)} outputs)",
                               help="map the index of an array argument to the index of an output")
        a, s = operands[i], structs[o]
        if tuple(np.shape(a)) != tuple(s.shape) or np.dtype(a.dtype) != np.dtype(s.dtype):
            raise JaxCallError(SP_JAX_WRITES_INPUT, f"input_output_aliases {{{i}: {o}}}: the input is "
                               f"{tuple(np.shape(a))} {np.dtype(a.dtype)} but the output is {tuple(s.shape)} "
                               f"{np.dtype(s.dtype)}",
                               help="an input becomes an output buffer of its own shape and dtype")
        if o in out.values():
            raise JaxCallError(SP_JAX_WRITES_INPUT, f"output {o} is aliased to two inputs")
        out[i] = o
    return out
