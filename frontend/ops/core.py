"""Core tile ops: creation, elementwise arithmetic and math, comparisons, casts and pointer
arithmetic — each IR op with its typing rule and interpreter semantics, next to the builtin(s)
that create it. Global loads and stores are in :mod:`.global_memory`, shapes and reductions in
:mod:`.shape`.

Semantics shared by the interpreter and every backend (``docs/language.md`` §Promotion):

* integer ``//`` and ``%`` round toward zero, by zero give 0 (``MIN // -1`` is SP0790); ``/`` on
  integers gives ``f32``; on floats ``//`` is ``floor`` of the rounded quotient, ``%`` and ``**``
  are the GPU's instruction sequences (:mod:`..interp.numerics`), not numpy's fmod and power;
* shifts by the width or more give 0 (-1 for an arithmetic right shift of a negative value), as
  PTX ``shl``/``shr`` clamp the shift amount;
* float -> integer conversion truncates toward zero and saturates, NaN -> 0 (``cvt.rzi.sat``);
  conversion to an 8-bit float saturates (``cvt.rn.satfinite``);
* every operation on a 16-bit or 8-bit float rounds its result to that type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..interp.numerics import (
    cast_array,
    flush_f32_subnormals,
    gpu_fmod,
    gpu_max,
    gpu_min,
    gpu_pow,
    round_float,
)
from ..interp.values import INT_OVERFLOW, UNSUPPORTED, InterpreterError, PtrVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import BROADCAST, ELEMENTWISE
from ..sema.builtins import builtin
from ..sema.emitter import Emitter, c_floordiv, describe
from ..sema.values import Arg, Const
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, TYPED_BY_SEMA, define_op, none

# ------------------------------------------------------------------------------------------------
# IR ops
# ------------------------------------------------------------------------------------------------
constant = define_op("arith.constant", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                     doc="A scalar constant or a tile filled with one value.")
program_id_op = define_op("program_id", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                          doc="The index of this program along a grid axis.")
num_programs_op = define_op("num_programs", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                            doc="The number of programs along a grid axis.")
arange_op = define_op("arange", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                      doc="The tile [start, start+1, ..., end-1] of i32.")
splat = define_op("splat", operands=("x",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                  doc="A tile whose elements all equal a scalar.")
broadcast = define_op("broadcast", operands=("x",), verify=TYPED_BY_SEMA, layout=BROADCAST, legality=NO_LEGALITY,
                      doc="Repeat size-1 dimensions of a tile to a larger shape.")
# arith.binary, arith.cmp, math, arith.cast and reduce: legality in frontend/legality/fp8.py
binary = define_op("arith.binary", operands=("lhs", "rhs"), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                   doc="Elementwise binary arithmetic.")
compare = define_op("arith.cmp", operands=("lhs", "rhs"), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                    doc="Elementwise comparison giving bool.")
unary = define_op("arith.unary", operands=("x",), verify=TYPED_BY_SEMA, layout=ELEMENTWISE, legality=NO_LEGALITY,
                  doc="Elementwise negation, logical not, bitwise not.")
math_op = define_op("math", operands=("x",), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                    doc="Elementwise math function (exp, log, sqrt, ...).")
select = define_op("arith.select", operands=("cond", "x", "y"), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                   legality=NO_LEGALITY, doc="Elementwise choice: where(cond, x, y).")
cast_op = define_op("arith.cast", operands=("x",), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                    doc="Elementwise conversion to another scalar type.")
addptr = define_op("addptr", operands=("ptr", "offset"), verify=TYPED_BY_SEMA, layout=ELEMENTWISE,
                   legality=NO_LEGALITY, doc="Pointer plus element offset.")
convert_layout = define_op("convert_layout", operands=("x",),
                           verify=none("inserted by layout inference with its operand's type"), layout=NO_LAYOUT_RULE,
                           legality=NO_LEGALITY, doc="The same tile in another layout (inserted by inference).")

BINARY_OPS = {"add", "sub", "mul", "div", "floordiv", "mod", "and", "or", "xor", "shl", "shr", "max", "min", "pow"}
UNARY_OPS = ("neg", "not", "invert")
"""The kinds of ``arith.unary``: ``-x``, ``not x`` (and ``~`` of a bool), ``~x`` of an integer."""
PY_BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "mod", "&": "and",
             "|": "or", "^": "xor", "<<": "shl", ">>": "shr", "**": "pow"}
PY_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
MATH_FUNCS = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "sin", "cos", "floor", "ceil", "sigmoid", "tanh",
              "erf")
F64_MATH = ("sqrt", "rsqrt", "abs", "floor", "ceil")
"""The math builtins that take f64 (docs/language.md, rule 10): computed in f64 with IEEE-exact
instructions (``sqrt.rn.f64``, ``div.rn.f64``, ``cvt.rmi``/``cvt.rpi``, ``abs``). PTX has no f64
``ex2``/``lg2``/``sin``/``cos``, so the others refuse f64 (SP0347) rather than compute in f32."""

F64_ORIGIN_HINT = ("an unannotated parameter given a NumPy float64 at the launch (`1 / np.sqrt(d)`) is f64: "
                   "pass `float(v)` or annotate the parameter `f32`")
"""Where an f64 operand of SP0347 most often comes from without the user writing f64: a NumPy float64
scalar at a launch is typed f64, as NumPy computes with it (docs/language.md, "Specialization and
launching"), unlike a Python float (f32)."""


def numpy_dtype_of(t: T.Type) -> np.dtype:
    """The numpy dtype the interpreter holds a value of type ``t`` in (pointers: ``int64`` offsets)."""
    e = T.element_type(t)
    return e.numpy_dtype if isinstance(e, T.ScalarType) else np.dtype(np.int64)


# ------------------------------------------------------------------------------------------------
# Interpreter semantics
# ------------------------------------------------------------------------------------------------
@constant.interpreter
def _i_constant(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t = op.result.type
    e = T.element_type(t)
    if isinstance(e, T.ScalarType) and e.is_float and (e.bits < 16 or e.name == "bf16"):
        # 8-bit floats: encoded as a cast to it; bf16: rounded once (numpy fills a bf16 array from a
        # Python float through f32, twice), as the LLVM literal (llvm_text.float_literal)
        return [cast_array(np.full(T.shape_of(t), op.attrs["value"], np.float64), T.f64, e)]
    with np.errstate(over="ignore"):  # a float beyond the type's range is its infinity, as compiled
        return [np.full(T.shape_of(t), op.attrs["value"], dtype=numpy_dtype_of(t))]


@program_id_op.interpreter
def _i_program_id(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.array(ctx.program_id[op.attrs["axis"]], dtype=np.int32)]


@num_programs_op.interpreter
def _i_num_programs(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.array(ctx.grid[op.attrs["axis"]], dtype=np.int32)]


@arange_op.interpreter
def _i_arange(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.arange(op.attrs["start"], op.attrs["end"], dtype=np.int32)]


def map_tile(x: Any, fn: Any) -> Any:
    """``fn`` applied to an interpreter tile: to the offsets of a pointer tile (same buffer), else to
    the array itself; for ops that move elements around (broadcast, reshape, permute)."""
    return PtrVal(x.buf, fn(x.off)) if isinstance(x, PtrVal) else fn(x)


@splat.interpreter
@broadcast.interpreter
def _i_broadcast(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    shape = T.shape_of(op.result.type)
    return [map_tile(args[0], lambda a: np.broadcast_to(a, shape).copy())]


def _typed(v: int, like: np.ndarray) -> np.ndarray:
    """The integer ``v`` as a 0-d array of ``like``'s dtype. Interpreter scalars are 0-d arrays, and
    numpy 1.x promoted a 0-d u64 with a Python int to f64 (``np.where(c, 0, u64_scalar)`` lost the low
    bits); with both operands of one dtype, numpy 1.x and 2.x agree."""
    return np.array(v, like.dtype)


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        bs = np.where(b == 0, _typed(1, b), b)
        q = np.floor_divide(a, bs)
        fix = (np.remainder(a, bs) != 0) & ((a < 0) != (bs < 0))
        return np.where(b == 0, _typed(0, q), q + fix.astype(q.dtype)).astype(a.dtype)


def _check_no_overflow(ctx: Any, op: Operation, a: np.ndarray, b: np.ndarray, elem: T.ScalarType) -> None:
    """SP0790 where a signed ``//`` or ``%`` divides the type's minimum by -1: the quotient does not
    fit, and the GPU's ``div.s`` / ``rem.s`` (LLVM ``sdiv`` / ``srem``) leave the result undefined, as C
    does, so the interpreter reports it rather than pick a value the GPU need not give."""
    lo = np.iinfo(elem.numpy_dtype).min
    if np.any((np.asarray(a) == lo) & (np.asarray(b) == -1)):
        sign = "//" if op.attrs["op"] == "floordiv" else "%"
        raise InterpreterError(INT_OVERFLOW, f"{elem} overflow: {lo} {sign} -1 has no {elem} result (undefined on "
                               "the GPU)", op.span, ctx.program_id,
                               help="widen the operands first (e.g. `x.to(i64)`), or keep the divisor positive")


@binary.interpreter
def _i_binary(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    a, b = args
    kind = op.attrs["op"]
    dt = numpy_dtype_of(op.result.type)
    elem = T.element_type(op.result.type)
    with np.errstate(all="ignore"):
        if elem.is_float:
            if kind == "pow":
                return [round_float(gpu_pow(a, b), elem)]
            if kind == "mod":
                return [round_float(gpu_fmod(a, b, elem.bits), elem)]
            wa, wb = a.astype(np.float64), b.astype(np.float64)
            # single rounding of the exact f64 result matches IEEE add/sub/mul/div of every width
            # max / min: NaN skipped and +0.0 > -0.0, as PTX max / min (numerics.gpu_max)
            r = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": gpu_max,
                 "min": gpu_min, "floordiv": np.divide}[kind](wa, wb)
            if kind == "floordiv":  # floor of the quotient rounded to the type, as the GPU's div.rn + floor
                r = np.floor(round_float(r, elem))
            return [round_float(r, elem)]
        if kind in ("floordiv", "mod") and elem.is_signed:
            _check_no_overflow(ctx, op, a, b, elem)
        if kind == "floordiv":
            return [_c_div(a, b)]
        if kind == "mod":  # 0 for a zero divisor, as `//` (and the GPU's select)
            return [np.where(b == 0, _typed(0, a), a - b * _c_div(a, b)).astype(dt)]
        if kind in ("shl", "shr"):
            bits = elem.bits
            sh = b.astype(np.int64)
            big = (sh < 0) | (sh >= bits)
            shs = np.where(big, 0, sh).astype(a.dtype)
            r = np.left_shift(a, shs) if kind == "shl" else np.right_shift(a, shs)
            fill = (np.where(a < 0, _typed(-1, a), _typed(0, a)) if elem.is_signed and kind == "shr"
                    else _typed(0, a))
            return [np.where(big, fill, r).astype(dt)]
        if kind == "div":
            raise AssertionError("integer `/` is lowered to f32 by sema")
        fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "and": np.bitwise_and, "or": np.bitwise_or,
              "xor": np.bitwise_xor, "max": np.maximum, "min": np.minimum, "pow": np.power}[kind]
        return [np.asarray(fn(a, b)).astype(dt)]


@compare.interpreter
def _i_compare(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    a, b = args
    if isinstance(a, PtrVal):
        a, b = a.off, b.off
    fn = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
          "ne": np.not_equal}[op.attrs["pred"]]
    return [np.asarray(fn(a, b))]


@unary.interpreter
def _i_unary(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    (a,) = args
    kind = op.attrs["op"]
    with np.errstate(all="ignore"):
        if kind == "neg":
            return [np.asarray(-a).astype(a.dtype)]
        if kind == "not":
            return [np.logical_not(a)]
        return [np.asarray(~a)]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in f32, a result below 2**-126 flushed to +0.0: the GPU's last step is
    ``rcp.approx.ftz.f32`` (backend/lower/elementwise.py; PTX ISA 9.1, §9.7.3.13 "Floating Point
    Instructions: rcp"), which flushes a subnormal result to zero (x below about -87.34)."""
    one = np.float32(1)  # not 1.0: numpy 1.x computed a 0-d f32 with a Python float in f64
    return flush_f32_subnormals(one / (one + np.exp(-x)))


_erf64 = np.frompyfunc(math.erf, 1, 1)


def _in_f64(fn: Any) -> Any:
    """``fn`` (of float64 arrays) on f32 values, rounded to f32: the correctly rounded result but
    for float64's own error, far below an f32 ulp (the GPU's kernels are within a few ulp of it,
    docs/language.md rule 10)."""
    return lambda v: np.asarray(fn(v.astype(np.float64)), np.float64).astype(np.float32)


@math_op.interpreter
def _i_math(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    (a,) = args
    fn = op.attrs["fn"]
    dt = numpy_dtype_of(op.result.type)
    with np.errstate(all="ignore"):
        if fn == "abs":  # an 8-bit float's |x| rounded as a cast to it, as every op on one: +-inf saturates
            elem = T.element_type(op.result.type)
            return [round_float(np.abs(a), elem) if elem.is_float else np.abs(a).astype(dt)]
        x = a.astype(np.float64 if dt == np.float64 else np.float32)  # only F64_MATH take f64
        table = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
                 "rsqrt": lambda v: v.dtype.type(1) / np.sqrt(v), "sin": np.sin, "cos": np.cos, "floor": np.floor,
                 "ceil": np.ceil, "sigmoid": _sigmoid, "tanh": _in_f64(np.tanh), "erf": _in_f64(_erf64)}
        r = np.asarray(table[fn](x))
        if dt == np.float64:  # sqrt, 1 / sqrt (two IEEE roundings, as the GPU's sqrt.rn + div.rn), floor, ceil
            return [r.astype(np.float64)]
        return [round_float(r.astype(np.float32), T.element_type(op.result.type))]


@select.interpreter
def _i_select(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    c, x, y = args
    if isinstance(x, PtrVal):
        if x.buf is not y.buf:
            raise InterpreterError(UNSUPPORTED, "`where` between pointers into different arguments", op.span,
                                   ctx.program_id, help="select offsets and add them to one pointer: "
                                                        "`p + where(c, i, j)`")
        return [PtrVal(x.buf, np.where(c, x.off, y.off))]
    return [np.where(c, x, y).astype(numpy_dtype_of(op.result.type))]


@cast_op.interpreter
def _i_cast(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    src = T.element_type(op.operand("x").type)
    dst = T.element_type(op.result.type)
    assert isinstance(src, T.ScalarType) and isinstance(dst, T.ScalarType)
    with np.errstate(all="ignore"):
        return [np.asarray(cast_array(np.asarray(args[0]), src, dst))]


@addptr.interpreter
def _i_addptr(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    p, off = args
    return [PtrVal(p.buf, (p.off + off.astype(np.int64)))]


@convert_layout.interpreter
def _i_convert_layout(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [args[0]]


# ------------------------------------------------------------------------------------------------
# Builtins
# ------------------------------------------------------------------------------------------------
def _axis(em: Emitter, arg: Arg) -> int:
    ax = em.constexpr(arg, "the grid axis")
    if ax not in (0, 1, 2):
        em.error("SP0306", f"the grid axis must be 0, 1 or 2, found {ax}", arg.span)
    return ax


@builtin("program_id")
def program_id(em: Emitter, axis: Arg) -> Value:
    """The index of this program along grid axis ``axis`` (0, 1 or 2)."""
    return em.op1("program_id", [], T.i32, axis=_axis(em, axis))


@builtin("num_programs")
def num_programs(em: Emitter, axis: Arg) -> Value:
    """The number of programs along grid axis ``axis``."""
    return em.op1("num_programs", [], T.i32, axis=_axis(em, axis))


@builtin("arange")
def arange(em: Emitter, start: Arg, end: Arg) -> Value:
    """The 1-D tile ``[start, ..., end-1]`` of i32; ``end - start`` must be a power of two."""
    s = em.constexpr(start, "`start` of arange")
    e = em.constexpr(end, "`end` of arange")
    n = e - s
    if not T.is_power_of_two(n):
        em.error("SP0301", f"arange length end - start must be a power of two, found {n}", em.span,
                 help="round the range up to a power of two and mask the extra elements")
    return em.op1("arange", [], T.TileType(T.i32, (n,)), start=s, end=e)


@builtin("full")
def full(em: Emitter, shape: Arg, value: Arg, dtype: Arg) -> Value:
    """A tile of ``shape`` filled with ``value`` converted to ``dtype``."""
    dims = em.shape_arg(shape)
    dt = em.dtype_arg(dtype)
    v = em.unwrap(value)
    if isinstance(v, Const) and v.dtype is None:  # a typed constant converts as a value of its type (below)
        if not isinstance(v.value, bool | int | float):
            em.error("SP0304", f"the fill value must be a number, found {describe(v)}", value.span)
        em.span = value.span  # a value that does not fit in `dtype` is reported at the value
        return em.constant(v.value, T.TileType(dt, dims))
    scalar = em.cast(em.tile_or_scalar(value), dt)
    if T.shape_of(scalar.type):
        em.error("SP0307", "the fill value of `full` must be a scalar", value.span)
    return em.broadcast_to(scalar, dims)


@builtin("zeros")
def zeros(em: Emitter, shape: Arg, dtype: Arg) -> Value:
    """A tile of ``shape`` and ``dtype`` filled with zeros."""
    return em.constant(0, T.TileType(em.dtype_arg(dtype), em.shape_arg(shape)))


def emit_binary(em: Emitter, pyop: str, a: Arg, b: Arg) -> Value:
    """``a <pyop> b`` on run-time values: promotion, broadcasting, pointer arithmetic."""
    va, vb = em.unwrap(a), em.unwrap(b)
    ta = em.tile_or_scalar(a).type if isinstance(va, Value) else None
    tb = em.tile_or_scalar(b).type if isinstance(vb, Value) else None
    pa = ta is not None and isinstance(T.element_type(ta), T.PointerType)
    pb = tb is not None and isinstance(T.element_type(tb), T.PointerType)
    if pa or pb:
        return _pointer_arith(em, pyop, a, b, pa)
    if pyop in PY_COMPARE:
        x, y = em.binary_operands(a, b)
        return em.op1("arith.cmp", [x, y], T.with_shape(T.bool_, T.shape_of(x.type)), pred=PY_COMPARE[pyop])
    if pyop == "@":
        em.error("SP0308", "`@` is not defined on tiles", em.span, help="use `dot(a, b, acc)`")
    kind = PY_BINARY[pyop]
    x, y = em.binary_operands(a, b, keep_bool=kind in ("and", "or", "xor"))
    elem = T.element_type(x.type)
    assert isinstance(elem, T.ScalarType)
    if kind in ("and", "or", "xor", "shl", "shr") and elem.is_float:
        em.error("SP0309", f"`{pyop}` needs integer operands, found {elem}", em.span)
    if kind == "div" and elem.is_int:
        x, y = em.cast(x, T.f32), em.cast(y, T.f32)
    if kind == "pow" and elem.is_int:
        em.error("SP0309", "`**` on run-time integers is not supported", em.span,
                 help="multiply explicitly, or use a float type")
    if kind == "pow" and elem == T.f64:  # `**` is ex2(y * lg2(x)) in f32 (rule 6), as the builtins without F64_MATH
        em.error("SP0347", "`**` of f64 is not supported: the GPU computes it only with f32 approximations "
                 "(PTX has no f64 ex2, lg2, sin or cos)", em.span,
                 help="compute in f32: `x.to(f32) ** y.to(f32)` (and `.to(f64)` the result if needed), or "
                      "multiply explicitly for a whole power; " + F64_ORIGIN_HINT)
    return em.op1("arith.binary", [x, y], x.type, op=kind)


def _pointer_arith(em: Emitter, pyop: str, a: Arg, b: Arg, ptr_is_left: bool) -> Value:
    if pyop in PY_COMPARE:
        x, y = em.binary_operands(a, b, pointers=True)
        return em.op1("arith.cmp", [x, y], T.with_shape(T.bool_, T.shape_of(x.type)), pred=PY_COMPARE[pyop])
    if pyop not in ("+", "-") or (pyop == "-" and not ptr_is_left):
        em.error("SP0310", f"`{pyop}` is not defined on pointers", em.span,
                 help="pointers support `ptr + offset` and `ptr - offset` with integer offsets")
    ptr_arg, off_arg = (a, b) if ptr_is_left else (b, a)
    p = em.tile_or_scalar(ptr_arg)
    off = em.tile_or_scalar(off_arg, like=T.i32)
    oe = T.element_type(off.type)
    if isinstance(oe, T.PointerType) or not oe.is_int:
        em.error("SP0310", f"a pointer offset must be an integer, found {off.type}", off_arg.span)
    if oe.bits < 32 or oe.is_bool:
        off = em.cast(off, T.i32)
    elif oe.bits == 32 and not oe.is_signed:  # zero-extended, as the interpreter's int64 offsets
        off = em.cast(off, T.i64)             # (the GPU sign-extends a 32-bit offset)
    if pyop == "-":
        off = em.op1("arith.unary", [off], off.type, op="neg")
    shape = em.broadcast_shapes(T.shape_of(p.type), T.shape_of(off.type))
    p, off = em.broadcast_to(p, shape), em.broadcast_to(off, shape)
    return em.op1("addptr", [p, off], p.type)


def emit_unary(em: Emitter, pyop: str, a: Arg) -> Value:
    v = em.tile_or_scalar(a)
    elem = T.element_type(v.type)
    if isinstance(elem, T.PointerType):
        em.error("SP0310", f"unary `{pyop}` is not defined on pointers", a.span)
    if pyop == "+":
        return v
    if pyop == "-":
        if elem.is_bool:  # bool is an integer in arithmetic (-True == -1): negate it as i32
            v = em.cast(v, T.i32)
        return em.op1("arith.unary", [v], v.type, op="neg")
    if pyop == "~":
        if elem.is_float:
            em.error("SP0309", f"`~` needs an integer operand, found {elem}", a.span)
        return em.op1("arith.unary", [v], v.type, op="not" if elem.is_bool else "invert")
    # not
    if getattr(elem, "name", "") in ("e4m3", "e5m2"):  # `.to(bool)`'s bit test (no `cvt`: SP0577 below sm_89)
        v = em.cast(v, T.bool_)
    elif not elem.is_bool:
        zero = em.value(Arg(Const(0), a.span), like=v.type)
        shape = T.shape_of(v.type)
        v = em.op1("arith.cmp", [v, em.broadcast_to(zero, shape)], T.with_shape(T.bool_, shape), pred="ne")
    return em.op1("arith.unary", [v], v.type, op="not")


_MATH_DOCS = {"exp": "``e**x``", "exp2": "``2**x``", "log": "natural logarithm", "log2": "base-2 logarithm",
              "sqrt": "square root", "rsqrt": "``1 / sqrt(x)``", "abs": "absolute value", "sin": "sine (radians)",
              "cos": "cosine (radians)", "floor": "rounding down to an integer value",
              "ceil": "rounding up to an integer value", "sigmoid": "``1 / (1 + exp(-x))``",
              "tanh": "hyperbolic tangent",
              "erf": "error function (exact GELU is ``0.5 * x * (1 + erf(x / sqrt(2)))``)"}


def _math(name: str) -> None:
    def impl(em: Emitter, x: Arg) -> Value:
        v = em.tile_or_scalar(x)
        elem = T.element_type(v.type)
        if isinstance(elem, T.PointerType):
            em.error("SP0311", f"`{name}` needs a numeric operand, found {v.type}", x.span)
        if name != "abs" and elem.is_int:
            v = em.cast(v, T.f32)
        if elem == T.f64 and name not in F64_MATH:
            em.error("SP0347", f"`{name}` of f64 is not supported: the GPU computes it only with f32 approximations "
                     "(PTX has no f64 ex2, lg2, sin or cos)", x.span,
                     help=f"compute in f32: `{name}(x.to(f32))` (and `.to(f64)` the result if needed); "
                          f"{', '.join(F64_MATH)} take f64; {F64_ORIGIN_HINT}")
        return em.op1("math", [v], v.type, fn=name)

    what = _MATH_DOCS[name]
    f64 = "f64 computes in f64" if name in F64_MATH else "f64 is an error (SP0347: convert to f32 first)"
    impl.__doc__ = (f"Elementwise {what}; keeps the type of ``x``." if name == "abs" else
                    f"Elementwise {what}. Integer inputs are converted to f32 first; 16-bit floats compute in f32 "
                    f"and round once; {f64}.")
    builtin(name, also=(), method_of=())(impl)


for _name in MATH_FUNCS:
    _math(_name)


def _minmax(name: str) -> None:
    def impl(em: Emitter, x: Arg, y: Arg) -> Value:
        a, b = em.binary_operands(x, y)
        return em.op1("arith.binary", [a, b], a.type, op=name[:3])

    impl.__doc__ = f"Elementwise {name} of two tiles (broadcast, promoted)."
    builtin(name)(impl)


_minmax("maximum")
_minmax("minimum")


@builtin("where")
def where(em: Emitter, cond: Arg, x: Arg, y: Arg) -> Value:
    """Elementwise ``x`` where ``cond`` is true, else ``y`` (of two bools, a bool: a mask)."""
    c = em.tile_or_scalar(cond)
    if T.element_type(c.type) != T.bool_:
        em.error("SP0312", f"the condition of `where` must be bool, found {c.type}", cond.span,
                 help="compare explicitly, e.g. `x != 0`")
    a, b = em.binary_operands(x, y, keep_bool=True, pointers=True)
    shape = em.broadcast_shapes(T.shape_of(c.type), T.shape_of(a.type))
    c, a, b = em.broadcast_to(c, shape), em.broadcast_to(a, shape), em.broadcast_to(b, shape)
    return em.op1("arith.select", [c, a, b], a.type)


@builtin("to", method_of=(T.TileType, T.ScalarType))
def to(em: Emitter, x: Arg, dtype: Arg) -> Value:
    """``x.to(dtype)``: elementwise conversion (float->int truncates toward zero, saturating)."""
    v = em.tile_or_scalar(x)
    if isinstance(T.element_type(v.type), T.PointerType):
        em.error("SP0313", "pointers cannot be converted with `.to`", x.span)
    return em.cast(v, em.dtype_arg(dtype))


@builtin("cdiv")
def cdiv(em: Emitter, a: Arg, b: Arg) -> Any:
    """``(a + b - 1) // b`` for positive integers (folded when both are constants)."""
    va, vb = em.unwrap(a), em.unwrap(b)
    if isinstance(va, Const) and isinstance(vb, Const):
        if not isinstance(va.value, int) or not isinstance(vb.value, int) or vb.value == 0:
            em.error("SP0314", f"cdiv needs integers with a nonzero divisor, found {va.value!r}, {vb.value!r}", em.span)
        return Const(c_floordiv(va.value + vb.value - 1, vb.value))
    x, y = em.binary_operands(a, b)
    if not T.element_type(x.type).is_int:
        em.error("SP0314", f"cdiv needs integer operands, found {x.type}", em.span)
    one = em.constant(1, x.type)
    s = em.op1("arith.binary", [x, y], x.type, op="add")
    s = em.op1("arith.binary", [s, one], x.type, op="sub")
    return em.op1("arith.binary", [s, y], x.type, op="floordiv")


def _host_cdiv(a: int, b: int) -> int:
    """``sparsile.cdiv(a, b)`` called from Python (a grid function's ``cdiv(n, meta["BLOCK"])``, as
    ``triton.cdiv``): the ceiling of ``a / b`` for integers."""
    if not all(isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_) for v in (a, b)):
        raise TypeError(f"cdiv needs integers, found {a!r}, {b!r}")
    return -(-int(a) // int(b))


cdiv.host = _host_cdiv


@builtin("static_assert")
def static_assert(em: Emitter, cond: Arg, msg: Arg | None = None) -> None:
    """Fail compilation with ``msg`` unless the constant ``cond`` is true."""
    c = em.constexpr(cond, "the condition of static_assert", (bool, int))
    if not c:
        text = em.constexpr(msg, "the message", (str,)) if msg is not None else "static_assert failed"
        em.error("SP0320", f"static assertion failed: {text}", cond.span)
    return None


@builtin("static_print")
def static_print(em: Emitter, *values: Arg) -> None:
    """Print constants at compile time (for debugging kernels)."""
    print(*(describe(em.unwrap(v)) for v in values))
    return None


# Shapes and reductions are defined next door; importing them here keeps one import registering the
# core language.
from . import shape as ops_shape  # noqa: E402, F401
