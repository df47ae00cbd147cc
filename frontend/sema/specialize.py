"""Specialization: from the arguments of a call to the compile-time description of a kernel.

The key records every constexpr value, the type of every run-time argument (pointer element type,
tensor element type and rank, scalar type), and — as Triton does — whether each pointer is
16-byte aligned and each integer a multiple of 16, so that the code generator may vectorize.
"""

from __future__ import annotations

import difflib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..diagnostics import CompileError, Diagnostic, LaunchError
from ..ir import types as T
from ..ir.scalar_range import check_float_fits
from ..spans import SourceFile
from .class_code import ClassKey
from .constexpr_dtypes import dtype_constexpr, dtype_of, unsupported_dtype_error
from .consts import typed_constant
from .core import ArgSpec
from .jit_globals import NUMPY_SCALARS_HELP, numpy_scalar_constant, numpy_type_without_type
from .values import Const


@dataclass(frozen=True)
class ParamInfo:
    """A kernel parameter as declared: ``annotation`` is a Type, ``T.CONSTEXPR``, or None."""

    name: str
    annotation: T.Type | None
    default: Any = None
    has_default: bool = False


def is_array_like(obj: Any) -> bool:
    return hasattr(obj, "dtype") and hasattr(obj, "shape") and not isinstance(obj, np.generic)


def data_pointer(obj: Any) -> int | None:
    """The address of an array's first element where it can be read cheaply."""
    if isinstance(obj, np.ndarray):
        return int(obj.__array_interface__["data"][0])
    ptr = getattr(obj, "data_ptr", None)  # torch: far cheaper than building its array interface
    if callable(ptr):
        return int(ptr())
    try:  # torch raises KeyError for dtypes the interface cannot describe (float8)
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception:
        cai = None
    if cai is not None:
        return int(cai["data"][0])
    return None


def arg_spec(p: ParamInfo, value: Any) -> ArgSpec:
    """The ArgSpec of a run-time argument, checked against the parameter's annotation."""
    unwrap = getattr(value, "sparsile_array", None)
    if unwrap is not None:
        value = unwrap()
    ann = p.annotation
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        raise LaunchError("SP0708", f"argument `{p.name}` is a masked array with {np.ma.count_masked(value)} masked "
                          "elements; a kernel reads and writes the memory under the mask and ignores the mask",
                          help=f"pass `{p.name}.filled(value)` (e.g. 0) for the masked elements, or "
                               f"`{p.name}.data` to use the values under the mask")
    if isinstance(ann, T.TensorType):
        elem = dtype_of(value)
        if not is_array_like(value) or elem is None:
            if is_array_like(value):
                raise LaunchError("SP0708", f"argument `{p.name}` expects a tensor, found an array of {value.dtype}, "
                                  "which has no sparsile element type",
                                  help=f"convert the array to {ann.elem} before the call")
            raise LaunchError("SP0708", f"argument `{p.name}` expects a tensor, found {type(value).__name__}",
                              help="pass a numpy array or a device tensor")
        if value.ndim != ann.rank:
            raise LaunchError("SP0720", f"argument `{p.name}` expects a tensor of rank {ann.rank}, found "
                              f"shape {tuple(value.shape)}")
        if elem != ann.elem and not (ann.elem == T.tf32 and elem == T.f32):
            raise LaunchError("SP0703", f"argument `{p.name}` expects a {ann} tensor, found {elem} elements",
                              help=f"convert the array to {ann.elem} before the call")
        return ArgSpec.of(ann, _aligned(value))
    if isinstance(ann, T.PointerType) or (ann is None and is_array_like(value)):
        elem = dtype_of(value)
        if not is_array_like(value) or elem is None:
            what = f"an array of {value.dtype}, which has no sparsile element type" if is_array_like(value) \
                else type(value).__name__
            raise LaunchError("SP0708", f"argument `{p.name}` expects an array (pointer), found {what}",
                              help="pass a numpy array or a device tensor")
        if isinstance(ann, T.PointerType) and elem != ann.elem and not (ann.elem == T.tf32 and elem == T.f32):
            raise LaunchError("SP0703", f"argument `{p.name}` expects a pointer to {ann.elem}, found an array of "
                              f"{elem}", help=f"convert the array to {ann.elem} before the call")
        t = ann if isinstance(ann, T.PointerType) else T.PointerType(elem)
        return ArgSpec.of(t, _aligned(value))
    if isinstance(ann, T.ScalarType) or ann is None:
        if ann is None and isinstance(value, np.generic) and not isinstance(value, np.bool_):
            return _numpy_scalar_spec(p, value)
        if isinstance(value, bool | np.bool_):
            if ann is not None and not ann.is_bool:  # (the launcher refuses it too: runtime/scalars.py)
                raise LaunchError("SP0708", f"argument `{p.name}` expects "
                                  f"{'an integer' if ann.is_int else 'a number'} ({ann}), got bool {value!r}",
                                  help="pass an int or a float (int(flag) for 0 / 1), or annotate the parameter "
                                       "`bool`")
            return ArgSpec.of(T.bool_, False)
        if isinstance(value, int | np.integer) and not isinstance(value, np.timedelta64):  # (an np.integer too)
            v = int(value)
            t = ann or (T.i32 if T.fits(v, T.i32) else T.i64)
            if not isinstance(t, T.ScalarType):
                raise LaunchError("SP0722", f"argument `{p.name}` has an unsupported annotation {t}")
            if t.is_int and not T.fits(v, t):
                raise LaunchError("SP0709", f"argument `{p.name}` = {v} does not fit in {t}")
            check_float_fits(p.name, v, t.name)
            return ArgSpec.of(t, t.is_int and v % 16 == 0)
        if isinstance(value, float | np.floating):
            t = ann or T.f32
            if not isinstance(t, T.ScalarType) or not t.is_float:
                raise LaunchError("SP0703", f"argument `{p.name}` expects {t}, found the float {value}")
            check_float_fits(p.name, value, t.name)
            return ArgSpec.of(t, False)
        raise LaunchError("SP0708", f"argument `{p.name}` expects a scalar{'' if ann is None else ' ' + str(ann)}, "
                          f"found {type(value).__name__}")
    raise LaunchError("SP0722", f"argument `{p.name}` has an unsupported annotation {ann}")


def numpy_scalar_type(name: str, value: np.generic, what: str, code: str = "SP0708") -> T.ScalarType:
    """The language type of NumPy (or ml_dtypes) scalar ``value`` given at a launch for ``name``,
    ``what`` the parameter's kind (``argument``, ``constexpr argument``): ``np.int8(100)`` is ``i8``,
    as the call written in a kernel or a default that computes it is (docs/language.md,
    "Specialization and launching"). LaunchError ``code`` (SP0708 for a run-time argument, SP0723
    for a constexpr) for a type the language has none for (``np.complex64``, ``np.longdouble``,
    ``np.timedelta64``), with the scalar types it has."""
    missing = numpy_type_without_type(value)
    t = None if missing else T.from_numpy_dtype(np.dtype(type(value)))
    if t is None:
        raise LaunchError(code, f"{what} `{name}` is NumPy's `{missing or type(value).__name__}`, which has no "
                          "type in the language", help=NUMPY_SCALARS_HELP)
    return t


def _numpy_scalar_spec(p: ParamInfo, value: np.generic) -> ArgSpec:
    """The ArgSpec of NumPy scalar ``value`` given for unannotated run-time parameter ``p``: a scalar
    of its own type (``np.int8(100)``: ``i8``, ``np.float64(0.5)``: ``f64``), as NumPy computes with it."""
    t = numpy_scalar_type(p.name, value, "argument")
    if t.is_float and t.bits == 8:
        raise LaunchError("SP0708", f"argument `{p.name}` is the 8-bit float scalar {type(value).__name__}"
                          f"({float(value)!r}): 8-bit float scalars cannot be kernel parameters",
                          help=f"annotate `{p.name}: sp.f16` (or pass np.float16 / a Python float) and convert "
                               "in the kernel, or make it `sp.constexpr`")
    return ArgSpec.of(t, t.is_int and int(value) % 16 == 0)


def _aligned(value: Any) -> bool:
    """Whether an array argument's data starts on a 16-byte boundary on the device, judged by its own
    address for every kind (a numpy array and a CPU torch tensor too): host arrays that overlap share
    one device copy that keeps each one's host alignment (backend/runtime/host_groups.py), so a host
    address's alignment is the device address's."""
    ptr = data_pointer(value)
    return ptr is not None and ptr % 16 == 0


ML_FLOAT_SCALARS = frozenset(getattr(ml_dtypes, n) for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2"))
"""ml_dtypes' scalar types (``ml_dtypes.bfloat16(1.5)``): numpy scalars that are no ``np.floating``, taken as the
Python float they hold (exact), as an ``np.float16`` is."""


def _ml_float(p: ParamInfo, value: Any) -> Any:
    """An ml_dtypes scalar given for a parameter annotated with a scalar type as the Python float it
    holds (exact; the annotation is its type); for any other parameter the scalar itself, typed by
    its own type as every NumPy scalar is (:func:`numpy_scalar_type`)."""
    return float(value) if type(value) in ML_FLOAT_SCALARS and isinstance(p.annotation, T.ScalarType) else value


def bind_arguments(kernel_name: str, params: list[ParamInfo], args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> dict[str, Any]:
    """Match positional and keyword arguments to parameters (defaults filled in)."""
    if len(args) > len(params):
        raise LaunchError("SP0701", f"`{kernel_name}` takes {len(params)} arguments but {len(args)} were given")
    bound: dict[str, Any] = {}
    for p, a in zip(params, args, strict=False):
        bound[p.name] = _ml_float(p, a)
    by_name = {p.name: p for p in params}
    for k, v in kwargs.items():
        if k not in by_name:
            raise LaunchError("SP0702", f"`{kernel_name}` has no parameter named `{k}`",
                              help=f"parameters: {', '.join(p.name for p in params)}")
        if k in bound:
            raise LaunchError("SP0702", f"`{kernel_name}` got two values for `{k}`")
        bound[k] = _ml_float(by_name[k], v)
    for p in params:
        if p.name not in bound:
            if not p.has_default:
                raise LaunchError("SP0701", f"`{kernel_name}` is missing the argument `{p.name}`")
            bound[p.name] = _ml_float(p, p.default)  # (a NumPy scalar default: as given at the launch)
    return bound


def grid_lookup_error(exc: KeyError, meta: Mapping[str, Any], kernel_name: str) -> LaunchError | None:
    """LaunchError SP0710 for a grid function ``grid(meta)`` that raised ``exc``, a KeyError for a
    name ``meta`` does not have (``meta["N"]`` where the argument is ``n``): it names the key and
    lists what the function is given. None for any other KeyError (one for a name ``meta`` has
    came from the user's own lookups: theirs to read). The caller raises it ``from exc``, so the
    user's line stays in the traceback; a ``try`` around the call costs nothing when nothing raises."""
    key = exc.args[0] if len(exc.args) == 1 else None
    if not isinstance(key, str) or key in meta:
        return None
    names = [str(n) for n in meta]
    given = f"the grid function is given {', '.join(f'`{n}`' for n in names)}" if names else \
        "the grid function is given no arguments"
    lowered = {n.lower(): n for n in names}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1)
    return LaunchError("SP0710", f"the grid function of `{kernel_name}` looks up `{key}`, which is not an argument "
                       "of the call", help=f"{given}; did you mean `{lowered[close[0]]}`?" if close else given)


def call_grid(grid: Callable[[dict[str, Any]], Any], meta: dict[str, Any], kernel_name: str) -> Any:
    """``grid(meta)``, a KeyError for a name ``meta`` lacks raised as :func:`grid_lookup_error`."""
    try:
        return grid(meta)
    except KeyError as exc:
        error = grid_lookup_error(exc, meta, kernel_name)
        if error is None:
            raise
        raise error from exc


def fingerprint(value: Any, constexpr: bool) -> Any:
    """What the specialization of one argument depends on, computed cheaply, or None when only
    :func:`specialize` itself can tell (unusual objects). A constexpr: its type and value. A
    run-time argument: an array's type, dtype, rank and 16-byte alignment; an integer's sign,
    two's-complement bit length (that of ``~value`` for a negative one, so every range check sees
    the same answer: -2**31 fits i32, -2**31 - 16 of the same ``bit_length()`` does not) and
    16-divisibility; a float's or bool's type."""
    kind = type(value)
    if constexpr:
        try:
            hash(value)
        except TypeError:
            return None
        return _exact(value)
    if kind is int:
        negative = value < 0
        return (int, negative, (~value if negative else value).bit_length(), value % 16 == 0)
    if kind is float or kind is bool:
        return (kind,)
    if kind is np.ndarray:
        return (np.ndarray, value.dtype, value.ndim, value.__array_interface__["data"][0] % 16 == 0)
    ptr = getattr(value, "data_ptr", None)
    if callable(ptr) and not hasattr(value, "sparsile_array"):  # torch tensors
        try:
            return (kind, value.dtype, value.ndim, ptr() % 16 == 0)
        except Exception:
            return None
    return None


def float_bits(value: float | np.floating) -> bytes:
    """The bits that key a float constant: a Python float's as an f64 (``struct``), a numpy
    float's in its own type. ``0.0 == -0.0`` yet ``x * V`` differs, and ``NaN != NaN`` (keyed by
    value a NaN constexpr matched no earlier launch: every launch ran sema again and the caches
    grew); by bits ``-0.0`` is not ``0.0`` and every NaN of one payload is one key. An ml_dtypes
    float (``ml_dtypes.bfloat16``, no ``np.floating``) is a NumPy scalar too: its own bits."""
    if isinstance(value, np.floating) or type(value) in ML_FLOAT_SCALARS:
        return value.tobytes()
    return struct.pack("<d", value)


def _exact(value: Any) -> Any:
    """A constexpr's value with the type of each element and the bits of a float: ``(2,)``,
    ``(2.0,)`` and ``(True,)`` are equal tuples, and ``0.0 == -0.0``, but each compiles to other
    code (``-7 // S[0]``, ``x * V``); a NaN equals no NaN, but is one specialization."""
    kind = type(value)
    if kind is tuple or kind is list:
        return (kind, *map(_exact, value))
    if kind is T.TypedConstant:  # `f32(-0.0)` equals `f32(0.0)` as a dataclass
        return (kind, str(value.dtype), _exact(value.value))
    if isinstance(value, float | np.floating) or kind in ML_FLOAT_SCALARS:  # (bfloat16(-0.0) == bfloat16(0.0))
        return (kind, float_bits(value))
    if kind is not int and kind is not str and isinstance(value, int | str):
        return (kind, base_value(value))  # (`class Loose(int)` with an `__eq__` of its own: not by it)
    return (kind, value)


def base_value(value: int | str) -> int | str:
    """The ``int`` or ``str`` an instance of a subclass of either is, as a plain value: what the
    kernel folds, whatever the subclass's own ``__eq__``, ``__hash__`` and ``__repr__`` say (an
    enum member's value too)."""
    return int.__int__(value) if isinstance(value, int) else str.__str__(value)


def specialize_memo(kernel_name: str, params: list[ParamInfo], bound: dict[str, Any],
                    memo: dict[Any, tuple[dict[str, Any], tuple[Any, ...]]]) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """:func:`specialize`, remembered per argument fingerprint (the launch path: the same kinds of
    arguments come back call after call). Arguments without a fingerprint, and any call that
    raises, go through :func:`specialize` every time."""
    prints = []
    for p in params:
        fp = fingerprint(bound[p.name], p.annotation is T.CONSTEXPR)
        if fp is None:
            return specialize(kernel_name, params, bound)
        prints.append(fp)
    key = tuple(prints)
    found = memo.get(key)
    if found is None:
        found = specialize(kernel_name, params, bound)
        if len(memo) < 4096:
            memo[key] = found
    return found


def specialize(kernel_name: str, params: list[ParamInfo],
               bound: dict[str, Any]) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """Bindings for sema (Const / ArgSpec per parameter) and the hashable specialization key."""
    bindings: dict[str, Any] = {}
    key: list[Any] = []
    for p in params:
        v = bound[p.name]
        if p.annotation is T.CONSTEXPR or none_pointer(p, v):
            c = constexpr_value(p, v)
            bindings[p.name] = constexpr_binding(c)
            key.append((p.name, "c", constexpr_key(c)))
        else:
            s = arg_spec(p, v)
            bindings[p.name] = s
            key.append((p.name, "v", s.key()))
    return bindings, tuple(key)


def constant_notes(params: list[ParamInfo], bindings: Mapping[str, Any]) -> dict[str, str]:
    """For each parameter bound to a compile-time constant (a constexpr, a pointer given None), the
    note a diagnostic at a use of its value gets (``Sema.kernel``'s ``notes``): what it was given,
    which a kernel failing deep inside (``arange(0, BLOCK)`` with ``BLOCK=256.0``) does not say."""
    notes: dict[str, str] = {}
    for p in params:
        b = bindings.get(p.name)
        if not isinstance(b, Const):
            continue
        if p.annotation is T.CONSTEXPR:
            v = b.value
            given = "None" if v is None else str(v) if isinstance(v, T.Type) else f"{v!r} ({type(v).__name__})"
            notes[p.name] = f"`{p.name}` is a constexpr parameter, given {given}"
        else:
            notes[p.name] = (f"`{p.name}` was given None, so it is the compile-time constant None here (an optional "
                             f"pointer is used under `if {p.name} is not None:`; docs/language.md, \"Specialization "
                             "and launching\")")
    return notes


def none_pointer(p: ParamInfo, v: Any) -> bool:
    """Whether ``v`` is None given for a parameter without annotation or of a pointer type: then,
    as in Triton, it is the compile-time constant None (an optional pointer: ``bias=None`` and
    ``if bias is not None:`` in the kernel; docs/language.md, "Specialization and launching")."""
    return v is None and (p.annotation is None or isinstance(p.annotation, T.PointerType))


def constexpr_value(p: ParamInfo, v: Any, depth: int = 0) -> Any:
    """The compile-time value of constexpr argument ``v``: a NumPy (or ml_dtypes) scalar as the typed
    constant of its type (``np.int8(100)`` is ``i8(100)``, as the call in the kernel and a default
    that computes it are; SP0708 for a type the language has none for), ``np.True_`` as Python's
    bool (a flag), a list as a tuple and each element of a tuple or list likewise (``[[1, 2]]`` is
    ``((1, 2),)``: a hashable key), a dtype as its element type; LaunchError SP0723 otherwise."""
    if isinstance(v, np.bool_):  # a flag, as Python's bool (np.dtype(np.True_) made it the type bool)
        return bool(v)
    if isinstance(v, np.generic) and not isinstance(v, str | bytes):
        numpy_scalar_type(p.name, v, "constexpr argument", "SP0723")  # (for a type without one)
        return numpy_scalar_constant(v)
    if isinstance(v, list | tuple):
        if depth >= _MAX_CONSTEXPR_DEPTH:
            raise LaunchError("SP0723", f"constexpr argument `{p.name}` nests tuples or lists more than "
                              f"{_MAX_CONSTEXPR_DEPTH} deep")
        return tuple(constexpr_value(p, x, depth + 1) for x in v)
    if isinstance(v, bool | int | float | str | T.Type) or v is None:
        return v
    if isinstance(v, Const) and v.dtype is not None:  # a typed default of a .spk kernel (`C: constexpr = u8(250)`)
        return v
    if isinstance(v, T.TypedConstant):  # `u8(250)` written in Python
        try:
            return typed_constant(v)
        except ValueError as e:
            raise LaunchError("SP0723", f"constexpr argument `{p.name}` = {v!r}: {e}") from None
    t = dtype_constexpr(v)
    if t is not None:
        return t
    unknown = unsupported_dtype_error(p.name, v, depth)
    if unknown is not None:
        raise unknown
    raise LaunchError("SP0723", f"constexpr argument `{p.name}` must be a number, bool, string, tuple or dtype, "
                      f"found {type(v).__name__}{' inside a tuple or list' if depth else ''}",
                      help="pass Python numbers, bools, strings, dtypes and tuples of them (a run-time value, "
                           "an array among them, goes to a parameter that is not constexpr)")


def constexpr_binding(c: Any) -> Any:
    """Sema's value of the constexpr value ``c`` (:func:`constexpr_value`): a constant; a typed
    constant stays one, also inside a tuple (which sema holds as a tuple of constants)."""
    if isinstance(c, Const):
        return c
    if isinstance(c, tuple) and _holds_typed(c):
        return tuple(constexpr_binding(x) for x in c)
    return Const(c)


def _holds_typed(c: tuple) -> bool:
    return any(isinstance(x, Const) or (isinstance(x, tuple) and _holds_typed(x)) for x in c)


_MAX_CONSTEXPR_DEPTH = 32
"""The deepest nesting of tuples a constexpr argument may have (deeper ones would only exhaust
Python's recursion in hashing and sema)."""


def constexpr_key(c: Any) -> Any:
    """The specialization key of constexpr value ``c`` (:func:`constexpr_value`), the same for a
    launch and an ahead-of-time signature: hashable, a float by its bits (``-0.0`` is not ``0.0``;
    NaNs of other payloads compile to other constants, and ``repr`` is ``nan`` for all)."""
    return _hashable(c)


def _hashable(v: Any) -> Any:
    if isinstance(v, T.Type):
        return ("type", str(v))
    if isinstance(v, tuple):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, Const):  # a typed constant: `Const(-0.0, f32)` equals `Const(0.0, f32)` as a dataclass
        return ("Const", str(v.dtype), _hashable(v.value))
    kind = type(v)
    if isinstance(v, float | np.floating):  # -0.0 is not 0.0 (x * -0.0), a NaN is one key (float_bits)
        if kind is float or isinstance(v, np.floating):
            return (kind.__name__, float_bits(v).hex())
        return (ClassKey(kind), float_bits(v).hex())  # (`class Scale(float)`: as `class Size(int)` below)
    if kind is not int and kind is not str and kind is not bool and isinstance(v, int | str):
        # `class Size(int)`: by its class and plain value (the disk key is the repr of this key, and
        # a subclass may spell itself, or compare, as it likes)
        return (ClassKey(kind), base_value(v))
    return (kind.__name__, v)



# ------------------------------------------------------------------------------------------------
# Ahead-of-time signatures: "x=ptr[f32], n=i32, BLOCK=1024"
# ------------------------------------------------------------------------------------------------
def split_signature(text: str) -> list[tuple[str, str, int]]:
    """``name=expression`` items of a signature, split at top-level commas: (name, expression,
    offset of the expression in ``text``). Raises LaunchError SP0724 on a malformed item."""
    items: list[tuple[str, str, int]] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            part = text[start:i]
            if part.strip():
                name, eq, rhs = part.partition("=")
                if not eq or not name.strip().isidentifier() or not rhs.strip():
                    raise LaunchError("SP0724", f"malformed signature item `{part.strip()}`",
                                      help="write `name=type` for run-time parameters (`x=ptr[f32]`, `n=i32`) "
                                           "and `name=value` for constexpr ones (`BLOCK=1024`)")
                lead = len(rhs) - len(rhs.lstrip())  # `n = i32`: the expression starts after the blanks
                items.append((name.strip(), rhs[lead:], start + len(name) + 1 + lead))
            start = i + 1
    if depth != 0:
        raise LaunchError("SP0724", f"unbalanced brackets in the signature `{text}`")
    return items


def parse_signature(text: str, resolve: Any = None) -> dict[str, Any]:
    """A signature for :meth:`Kernel.signature_bindings` / ``compile_kernel``: each item's right-hand
    side is a constant expression of the language (``ptr[f16]``, ``tensor[f16, 2]``, ``i32``,
    ``1024``, ``2 * 64``, ``True``, ``f16``), evaluated with ``resolve`` (a kernel's global names)
    and then the builtins. Errors are CompileErrors pointing into the signature text."""
    from ..syntax.parser import parse_expression
    from .core import Sema

    def no_globals(name: str) -> Any:
        raise KeyError(name)

    out: dict[str, Any] = {}
    errors: list[Diagnostic] = []
    source = SourceFile("<signature>", text)
    for name, rhs, offset in split_signature(text):
        if name in out:
            raise LaunchError("SP0724", f"`{name}` appears twice in the signature")
        try:
            node = parse_expression(rhs.replace("\n", " "), "<signature>")
            value = _signature_value(Sema(resolve or no_globals).evaluate(node), f"the value of `{name}`", node.span)
        except CompileError as e:
            errors.extend(_retarget(d, source, offset) for d in e.diagnostics)
            continue
        out[name] = value
    if errors:
        raise CompileError(errors)
    return out


def _signature_value(v: Any, what: str, span: Any) -> Any:
    """A signature item's sema value as :meth:`Kernel.signature_bindings` takes it: an untyped
    constant's Python value, a typed constant (``u8(250)``) as its Const, which binds as that typed
    constant (as a parameter default or a launch's ``sp.u8(250)`` does), a tuple item by item. Else
    SP0201."""
    if isinstance(v, Const):
        return v if v.dtype is not None else v.value
    if isinstance(v, tuple) and all(isinstance(x, Const | tuple) for x in v):
        return tuple(_signature_value(x, what, span) for x in v)
    raise CompileError([Diagnostic("SP0201", f"{what} must be a compile-time constant", span)])


def _retarget(d: Any, source: Any, offset: int) -> Any:
    """A diagnostic about one item's expression, re-pointed at the whole signature text."""
    import dataclasses

    if d.span.line <= 0:
        return d
    span = dataclasses.replace(d.span, source=source, line=1, end_line=1, col=d.span.col + offset,
                               end_col=d.span.end_col + offset if d.span.end_line == 1 else len(source.text) + 1)
    return dataclasses.replace(d, span=span, labels=())
