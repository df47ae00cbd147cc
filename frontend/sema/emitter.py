"""The emitter: what builtins use to check their arguments and create IR.

It wraps an :class:`~sparsile.frontend.ir.core.Builder`, knows the span of the call being lowered, and
turns every argument problem into a diagnostic pointing at that argument. Constant folding of
compile-time arithmetic also lives here, so that folding and run-time semantics agree.
"""

from __future__ import annotations

import functools
import math
import types
from typing import Any, NoReturn

import numpy as np

from ..diagnostics import CompileError, Diagnostic
from ..interp.numerics import gpu_fmod, int_to_float
from ..ir import types as T
from ..ir.core import Builder, Operation, Value
from ..spans import Span
from .call_help import library_of, python_method
from .constant_kinds import check_number_use, wrong_constant_help
from .type_ctors import TypeCtor, python_builtin_dtype
from .values import (
    POISON,
    Arg,
    BoundMethod,
    Builtin,
    Const,
    HelperFunction,
    Namespace,
    PoisonError,
    autotuned_kernel_name,
    is_untyped_number,
    kernel_object_name,
)

MAX_TILE_ELEMENTS = 1 << 20
"""The most elements one tile may have (as Triton's ``TRITON_MAX_TENSOR_NUMEL``)."""

Sema = Any  # the Sema instance (sema.py); typed loosely to avoid an import cycle


def c_floordiv(a: int, b: int) -> int:
    """Integer division rounding toward zero (C, PTX ``div.s32``, Triton)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a: int, b: int) -> int:
    """Remainder with the sign of the dividend (C ``%``, PTX ``rem``)."""
    return a - b * c_floordiv(a, b)


def plain_number(value: Any) -> Any:
    """An instance of a subclass of ``int`` or ``float`` (an ``IntEnum`` member, ``class Size(int)``)
    as its plain value, whatever its own ``__int__`` / ``__float__`` says: what its compile cache key
    holds (frontend/sema/fingerprints.py), and what NumPy computes with."""
    kind = type(value)
    if kind is int or kind is float or kind is bool or not isinstance(value, int | float) or isinstance(value, bool):
        return value
    return int.__int__(value) if isinstance(value, int) else float.__float__(value)


class Emitter:
    def __init__(self, builder: Builder, sema: Sema):
        self.builder = builder
        self.sema = sema
        self.span: Span = sema.current_span if sema is not None else None  # type: ignore[assignment]

    # -- diagnostics ---------------------------------------------------------------------------
    def error(self, code: str, message: str, span: Span | None = None, help: str | None = None,
              notes: tuple[str, ...] = ()) -> NoReturn:
        raise CompileError([Diagnostic(code, message, span or self.span, help=help, notes=notes)])

    # -- IR creation ---------------------------------------------------------------------------
    def create(self, name: str, operands: list[Value], result_types: list[T.Type],
               attrs: dict[str, Any] | None = None, regions: int = 0) -> Operation:
        for t in result_types:
            if isinstance(t, T.TileType) and t.numel > MAX_TILE_ELEMENTS:
                self.error("SP0344", f"a tile of shape {t.shape} has {t.numel} elements; the limit is "
                           f"{MAX_TILE_ELEMENTS} (2**20)", help="split the work over more programs or a loop")
        return self.builder.create(name, operands, result_types, attrs, self.span, regions)

    def op1(self, name: str, operands: list[Value], result_type: T.Type, **attrs: Any) -> Value:
        return self.create(name, operands, [result_type], attrs).result

    def constant(self, value: Any, type: T.Type) -> Value:
        value = plain_number(value)
        elem = T.element_type(type)
        if isinstance(elem, T.ScalarType):
            if elem.is_float:  # an integer rounds once to the type (rule 8), not through float64 first
                exact_int = isinstance(value, int) and not isinstance(value, bool)
                value = int_to_float(value, elem) if exact_int else float(value)
            elif elem.is_bool:
                value = bool(value)
            else:
                if isinstance(value, float) and not math.isfinite(value):
                    self.error("SP0303", f"the constant {value} has no value in {elem}")
                value = int(value)
                if not T.fits(value, elem):
                    self.error("SP0303", f"the constant {value} does not fit in {elem}",
                               help=f"the range of {elem} is {_int_range(elem)}")
        return self.op1("arith.constant", [], type, value=value)

    # -- argument coercion ---------------------------------------------------------------------
    def unwrap(self, arg: Arg) -> Any:
        if arg.value is POISON:
            raise PoisonError()
        return arg.value

    def constexpr(self, arg: Arg, what: str, kinds: tuple[type, ...] = (int,)) -> Any:
        """The Python value of a compile-time-constant argument, or an SP0201 diagnostic."""
        v = self.unwrap(arg)
        kind_names = " or ".join(k.__name__ for k in kinds)
        if isinstance(v, Const) and isinstance(v.value, kinds):
            if isinstance(v.value, bool) and bool not in kinds:  # an int subclass, yet no number (SP0723)
                check_number_use(self.sema, v, what, arg.span)
                self.error("SP0201", f"{what} must be a compile-time constant {kind_names}, found the bool {v.value!r}",
                           arg.span, help=wrong_constant_help(v.value, kind_names))
            return v.value
        if isinstance(v, tuple) and tuple in kinds:
            return tuple(self.constexpr(Arg(x, arg.span), what, tuple(k for k in kinds if k is not tuple) or (int,))
                         for x in v)
        if isinstance(v, Const):  # a constant of another type: say so (the help below is for run-time values)
            self.error("SP0201", f"{what} must be a compile-time constant {kind_names}, found `{_describe(v)}`",
                       arg.span, help=wrong_constant_help(v.value, kind_names))
        found = "a run-time value" if isinstance(v, Value) else f"`{_describe(v)}`"
        self.error("SP0201", f"{what} must be a compile-time constant {kind_names}, found {found}", arg.span,
                   help="pass a literal, a `constexpr` parameter, or an expression of them")

    def shape_arg(self, arg: Arg, what: str = "shape") -> tuple[int, ...]:
        v = self.unwrap(arg)
        if isinstance(v, Const) and isinstance(v.value, int):
            check_number_use(self.sema, v, f"the {what}", arg.span)
            dims = (v.value,)
        elif isinstance(v, Const) and isinstance(v.value, tuple):
            dims = tuple(v.value)
        elif isinstance(v, tuple):
            dims = tuple(self.constexpr(Arg(x, arg.span), f"each dimension of the {what}") for x in v)
        elif isinstance(v, Const):
            self.error("SP0201", f"the {what} must be a compile-time tuple of integers, found {_describe(v)}",
                       arg.span, help=wrong_constant_help(v.value, "tuple of integers"))
        else:
            self.error("SP0201", f"the {what} must be a compile-time tuple of integers, found {_describe(v)}",
                       arg.span, help="write the shape as a tuple of constants, e.g. `(BLOCK_M, BLOCK_N)`")
        for d in dims:
            if not isinstance(d, int) or isinstance(d, bool) or not T.is_power_of_two(d):
                self.error("SP0301", f"tile dimensions must be powers of two, found {d} in {what} {dims}",
                           arg.span, help="round the tile up to a power of two and mask the extra elements")
        return dims

    def int_tuple(self, arg: Arg, what: str) -> tuple[int, ...]:
        """A compile-time tuple of integers (a single integer is a 1-tuple)."""
        v = self.unwrap(arg)
        if isinstance(v, tuple):
            return tuple(self.constexpr(Arg(x, arg.span), f"each element of {what}") for x in v)
        if isinstance(v, Const) and isinstance(v.value, tuple):
            return tuple(self.constexpr(Arg(Const(x), arg.span), f"each element of {what}") for x in v.value)
        return (self.constexpr(arg, what),)

    def dtype_arg(self, arg: Arg, what: str = "dtype") -> T.ScalarType:
        v = self.unwrap(arg)
        if isinstance(v, Const) and isinstance(v.value, T.ScalarType):
            return v.value
        if isinstance(v, Const) and isinstance(v.value, str) and T.scalar_type(v.value):
            return T.scalar_type(v.value)  # type: ignore[return-value]
        builtin = python_builtin_dtype(v)  # Python's `float`: f64, as NumPy reads it (and `DT=float`)
        if builtin is not None:
            return builtin
        self.error("SP0302", f"{what} must be a scalar type such as `f32`, found {_describe(v)}", arg.span)

    def value(self, arg: Arg, like: T.Type | None = None, what: str = "operand") -> Value:
        """A run-time value for ``arg``; constants are materialized (typed like ``like`` if given)."""
        v = self.unwrap(arg)
        if isinstance(v, Value):
            return v
        if isinstance(v, Const) and v.dtype is not None:  # a typed constant: a value of its type, not weak
            return self.constant(v.value, v.dtype)
        if isinstance(v, Const) and isinstance(v.value, bool | int | float) and v.value is not None:
            v = Const(plain_number(v.value))
            if isinstance(like, T.ScalarType | T.PointerType | T.TileType):
                elem = T.element_type(like)
                if isinstance(elem, T.ScalarType):
                    t = T.Promotion.with_literal(elem, v.value)
                    if t.is_int and not t.is_bool and not T.fits(int(v.value), t):
                        self.error("SP0303", f"the literal {v.value} does not fit in {t}", arg.span)
                    return self.constant(v.value, t)
            self._check_lone_literal(v.value, arg.span)
            return self.constant(v.value, T.literal_type(v.value))
        self.error("SP0304", f"expected a value as {what}, found {_describe(v)}", arg.span)

    def tile_or_scalar(self, arg: Arg, what: str = "operand", like: T.Type | None = None) -> Value:
        """Like :meth:`value`, but the value must be a scalar, a pointer or a tile (not a tensor,
        a memory reference or a token): elementwise ops and most builtins take only those."""
        v = self.value(arg, like=like, what=what)
        if not isinstance(v.type, T.ScalarType | T.PointerType | T.TileType):
            self.error("SP0304", f"expected a number, pointer or tile as {what}, found a value of type {v.type}",
                       arg.span)
        return v

    # -- shapes and casts ----------------------------------------------------------------------
    def broadcast_shapes(self, a: tuple[int, ...], b: tuple[int, ...], span: Span | None = None) -> tuple[int, ...]:
        """numpy broadcasting of two tile shapes, or SP0305."""
        n = max(len(a), len(b))
        pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        out = []
        for x, y in zip(pa, pb, strict=True):
            if x == y or y == 1:
                out.append(x)
            elif x == 1:
                out.append(y)
            else:
                self.error("SP0305", f"cannot broadcast shapes {a} and {b}", span,
                           help="insert size-1 dimensions with `x[:, None]` / `x[None, :]`")
        return tuple(out)

    def broadcast_to(self, v: Value, shape: tuple[int, ...]) -> Value:
        cur = T.shape_of(v.type)
        if cur == shape:
            return v
        elem = T.element_type(v.type)
        if not cur:
            return self.op1("splat", [v], T.TileType(elem, shape))
        while len(cur) < len(shape):
            cur = (1, *cur)
            v = self.op1("expand_dims", [v], T.TileType(elem, cur), axis=0)
        return self.op1("broadcast", [v], T.TileType(elem, shape))

    def cast(self, v: Value, elem: T.ScalarType) -> Value:
        if not isinstance(v.type, T.ScalarType | T.PointerType | T.TileType):
            self.error("SP0304", f"expected a number or a tile, found a value of type {v.type}")
        cur = T.element_type(v.type)
        if cur == elem:
            return v
        if isinstance(cur, T.PointerType):
            self.error("SP0313", f"a pointer cannot be converted to {elem}",
                       help="load the value it points at with `load(...)`")
        return self.op1("arith.cast", [v], T.with_shape(elem, T.shape_of(v.type)), to=elem.name)

    def literal_pair(self, a: Arg, b: Arg, span: Span | None = None) -> tuple[Value, Value]:
        """Two untyped number constants materialized in the one type they take together
        (:func:`~sparsile.frontend.ir.types.literals_type`: ``2**63`` and ``1`` are both ``u64``, as
        ``2**63 + 1`` folds to a constant that is), or SP0303 where no integer type holds both."""
        t = self.literals_type(a, b, span)
        return self.constant(self.unwrap(a).value, t), self.constant(self.unwrap(b).value, t)

    def literals_type(self, a: Arg, b: Arg, span: Span | None = None) -> T.ScalarType:
        """The type two untyped number constants take together, or SP0303 (one that no integer type
        holds, or two that no one integer type holds)."""
        x, y = self.unwrap(a).value, self.unwrap(b).value
        self._check_lone_literal(x, a.span)
        self._check_lone_literal(y, b.span)
        t = T.literals_type((x, y))
        if t is None:
            self.error("SP0303", f"no integer type holds both {x} and {y}", span or self.span,
                       help="two integer literals take the first of i32, i64 and u64 that holds both: "
                            "convert one of them to the type you mean (`i64(...)`, `u64(...)`)")
        return t

    def _check_lone_literal(self, value: Any, span: Span) -> None:
        """SP0303 for an integer literal that no integer type holds (its :func:`literal_type` is the
        nearer of i64 and u64)."""
        if isinstance(value, int) and not isinstance(value, bool):
            t = T.literal_type(value)
            if not T.fits(value, t):
                lo, hi = INTEGER_CONSTANT_RANGE
                self.error("SP0303", f"the literal {value} does not fit in {t}", span,
                           help=f"integers at run time lie in [{lo}, {hi}] (i64 and u64)")

    def binary_operands(self, a: Arg, b: Arg, span: Span | None = None, *,
                        keep_bool: bool = False, pointers: bool = False) -> tuple[Value, Value]:
        """Materialize, promote and broadcast two operands of an elementwise op. With
        ``keep_bool``, two bool operands stay bool (``&``, ``|``, ``^``, ``and``, ``or``) instead of
        being promoted to ``i32`` (promotion rule 5). Pointers are accepted only with ``pointers``
        (a choice between two pointers of one type), never mixed with numbers."""
        va, vb = self.unwrap(a), self.unwrap(b)
        # a typed constant is a value of its type: a literal next to it takes that type (rule 1)
        if isinstance(va, Const) and va.dtype is not None:
            va = self.value(a)
            a = Arg(va, a.span)
        if isinstance(vb, Const) and vb.dtype is not None:
            vb = self.value(b)
            b = Arg(vb, b.span)
        if is_untyped_number(va) and is_untyped_number(vb):  # `where(c, 2**63, 1)`: one type for both
            va_, vb_ = self.literal_pair(a, b, span)
        elif isinstance(va, Const) and isinstance(vb, Value):
            vb_ = self.tile_or_scalar(b)
            va_ = self.tile_or_scalar(a, like=vb.type)
        elif isinstance(vb, Const) and isinstance(va, Value):
            va_ = self.tile_or_scalar(a)
            vb_ = self.tile_or_scalar(b, like=va.type)
        else:
            va_, vb_ = self.tile_or_scalar(a), self.tile_or_scalar(b)
        ea, eb = T.element_type(va_.type), T.element_type(vb_.type)
        if isinstance(ea, T.PointerType) or isinstance(eb, T.PointerType):
            if not pointers:
                bad = a if isinstance(ea, T.PointerType) else b
                self.error("SP0310", "this operation is not defined on pointers", bad.span,
                           help="pointers support `ptr + offset`, `ptr - offset`, comparisons and `where`")
            if ea != eb:
                self.error("SP0310", f"cannot combine {ea} with {eb}", span,
                           help="both operands must be pointers to the same type")
        else:
            assert isinstance(ea, T.ScalarType) and isinstance(eb, T.ScalarType)
            elem = ea if keep_bool and ea.is_bool and eb.is_bool else T.Promotion.binary(ea, eb)
            va_, vb_ = self.cast(va_, elem), self.cast(vb_, elem)
        shape = self.broadcast_shapes(T.shape_of(va_.type), T.shape_of(vb_.type), span)
        return self.broadcast_to(va_, shape), self.broadcast_to(vb_, shape)


def _int_range(t: T.ScalarType) -> str:
    if t.kind == "uint":
        return f"[0, {2**t.bits - 1}]"
    return f"[{-(2 ** (t.bits - 1))}, {2 ** (t.bits - 1) - 1}]"


MAX_CONSTANT_BITS = 4096
"""Compile-time integers (and repeated strings and tuples) are kept this small, so that a typo such
as ``2 ** 10**9`` is a diagnostic rather than a hang."""


class ConstantTooLarge(ValueError):
    """A compile-time expression whose result would exceed :data:`MAX_CONSTANT_BITS`."""


def _check_size(op: str, a: Any, b: Any) -> None:
    ints = isinstance(a, int) and isinstance(b, int)
    if op == "**" and ints and abs(a) > 1 and b > 0 and abs(a).bit_length() * b > MAX_CONSTANT_BITS:
        raise ConstantTooLarge
    if op == "<<" and ints and b > MAX_CONSTANT_BITS:
        raise ConstantTooLarge
    if op == "*" and isinstance(b, int) and isinstance(a, str | tuple) and len(a) * b > MAX_CONSTANT_BITS:
        raise ConstantTooLarge
    if op == "*" and isinstance(a, int) and isinstance(b, str | tuple) and len(b) * a > MAX_CONSTANT_BITS:
        raise ConstantTooLarge


def fold_binary(op: str, a: Any, b: Any) -> Any:
    """Compile-time arithmetic with run-time semantics (C division and remainder for integers).
    Raises ZeroDivisionError, TypeError/ValueError for undefined operations and
    :class:`ConstantTooLarge`."""
    _check_size(op, a, b)
    r = _fold(op, a, b)
    if isinstance(r, int) and r.bit_length() > MAX_CONSTANT_BITS:
        raise ConstantTooLarge
    return r


def _fold(op: str, a: Any, b: Any) -> Any:
    if op in ("//", "%", "/"):  # the language's rules read plain values (not a subclass's `__float__`)
        a, b = plain_number(a), plain_number(b)
    if op in ("//", "%") and isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError
        return c_floordiv(a, b) if op == "//" else c_mod(a, b)
    if op == "%" and isinstance(a, float | int) and isinstance(b, float | int):
        if b == 0:
            raise ZeroDivisionError
        # as the run-time f64 `%` (rule 6): fma(-trunc(x / y), y, x) with the quotient rounded, not
        # the exact fmod (they differ where x / y rounds: 1e300 % 3.0)
        return float(gpu_fmod(np.array(float(a)), np.array(float(b)), 64)[()])
    if op == "/" and isinstance(a, int) and isinstance(b, int):
        return int_true_division(a, b)
    if op == "//" and isinstance(a, float | int) and isinstance(b, float | int):
        q = a / b  # floor(x / y) as at run time, not Python's `//` (7.0 // 0.1 is 69.0 there, 70.0 here)
        return math.copysign(0.0, q) if q == 0 else float(math.floor(q)) if math.isfinite(q) else q  # -0.0 kept
    import operator

    table = {
        "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
        "**": operator.pow, "<<": operator.lshift, ">>": operator.rshift, "&": operator.and_, "|": operator.or_,
        "^": operator.xor, "%": operator.mod, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne,
    }
    r = table[op](a, b)
    if isinstance(r, complex):  # Python's (-2.0) ** 0.5: no value of any scalar type
        raise ValueError
    return r


INTEGER_CONSTANT_RANGE = (-(2**63), 2**64 - 1)
"""The integers some integer type holds (``i64``'s minimum to ``u64``'s maximum)."""


def check_integer_constant(value: Any, span: Span, use: str) -> None:
    """SP0303 for an untyped integer constant that no integer type holds (beyond ``i64``'s and ``u64``'s
    range) where ``use`` (integer ``/``, a conversion to an integer type) takes it as the run-time
    integer it cannot be: ``(2**200) / 3`` divided inf by 3 in f32, ``2**130 / 2**129`` gave NaN,
    ``u8(2**200)`` wrapped to 0. Exact Python integers stay legal elsewhere (``2**200 // 2**190``)."""
    if isinstance(value, int) and not isinstance(value, bool) \
            and not INTEGER_CONSTANT_RANGE[0] <= value <= INTEGER_CONSTANT_RANGE[1]:
        lo, hi = INTEGER_CONSTANT_RANGE
        raise CompileError([Diagnostic(
            "SP0303", f"{use} of the integer constant {value}, which no integer type holds", span,
            help=f"integers at run time lie in [{lo}, {hi}] (i64 and u64); write a float constant "
                 "(e.g. `2.0 ** 200`) for float arithmetic")])


def int_true_division(a: int, b: int) -> float:
    """``a / b`` of integer constants (bools included) as at run time (docs/language.md rule 6): both
    convert to ``f32``, each rounded once (an integer beyond ``f32``'s range becomes infinite, as
    the conversion gives), and the quotient is the ``f32`` division's, rounded to ``f32``. Python's
    true division, exact then rounded to float64, gave ``(2**24 + 1) / 1 == 16777217.0`` where the
    run-time division gives ``16777216.0``. A zero divisor raises ZeroDivisionError (SP0330)."""
    if b == 0:
        raise ZeroDivisionError
    x, y = np.float32(int_to_float(a, T.f32)), np.float32(int_to_float(b, T.f32))
    with np.errstate(all="ignore"):  # inf / inf is NaN, as at run time
        return float(x / y)


def _is_numpy_function(x: Any) -> bool:
    """Whether ``x`` is one of NumPy's functions (a ufunc, a dispatcher such as ``np.max``, a C
    function such as ``np.zeros``), told by its library (call_help.library_of) and a name; not a
    class such as ``np.ndarray``."""
    try:
        return (not isinstance(x, type) and callable(x) and library_of(x) == "numpy"
                and isinstance(getattr(x, "__name__", None), str))
    except Exception:  # an object whose attributes raise: not NumPy's
        return False


def _describe(v: Any) -> str:
    """A short phrase naming a sema value in a diagnostic."""
    if isinstance(v, Const):
        x = v.value
        if isinstance(x, T.Type):
            return f"the type {x}"
        if isinstance(x, types.ModuleType):
            return f"the module `{x.__name__}`"
        if _is_numpy_function(x):  # `np.max` is an `_ArrayFunctionDispatcher`, `np.sqrt` a ufunc
            return f"the NumPy function `{x.__name__}`"
        method = python_method(x)
        if method is not None:
            return f"the Python method `{method.__qualname__}`"
        if isinstance(x, types.FunctionType | types.BuiltinFunctionType | types.MethodType):
            return f"the Python function `{getattr(x, '__qualname__', x.__name__)}`"
        if isinstance(x, bool | int | float | str | None) or x is None:
            return repr(x)
        if isinstance(x, TypeCtor):
            return f"the type constructor `{x.name}`"
        if isinstance(x, type):  # not its repr, `<class 'module.C'>`
            return f"the Python class `{x.__qualname__}`"
        if isinstance(x, functools.partial):  # not its repr, `functools.partial(<function f at 0x7f...>, 1)`
            return f"a `functools.partial` of {_describe(Const(x.func))}"
        kernel = kernel_object_name(x)
        if kernel is not None:  # not `<sparsile kernel k>`
            return f"the kernel `{kernel}`"
        tuned = autotuned_kernel_name(x)
        if tuned is not None:  # not `<sparsile autotuned kernel k: 2 configs, key [...]>`
            return f"the autotuned kernel `{tuned}`"
        if type(x).__repr__ is object.__repr__:  # not `<module.C object at 0x7f...>`, an address
            return f"a Python `{type(x).__qualname__}` object"
        text = repr(x)
        if len(text) > 60 or " at 0x" in text:  # long, or holding an address that changes from run to run
            return f"a Python `{type(x).__name__}` object"
        return text
    if isinstance(v, Value):
        return f"a run-time value of type {v.type}"
    if isinstance(v, tuple):
        return "a tuple"
    if isinstance(v, Builtin):
        return f"the builtin `{v.name}`"
    if isinstance(v, BoundMethod):  # not the dataclass's repr, with the receiver's span
        return f"the method `{v.builtin.name.rpartition('.')[2]}` of {_describe(v.self_arg.value)}"
    if isinstance(v, Namespace):
        return f"the namespace `{v.name}`"
    if isinstance(v, HelperFunction):
        return f"the helper function `{v.name or v.node.name}`"
    return getattr(v, "__repr__", lambda: str(v))()


describe = _describe
