"""Random well-typed kernels for differential testing: a generator of small programs (as an AST that
renders to ``.spk`` text) and an independent numpy evaluator of that AST with the semantics of
docs/language.md, so that a program's outputs can be checked in the interpreter against the
reference (tests/frontend/test_program_fuzz.py) and on the GPU against the interpreter
(tests/gpu/test_program_fuzz_gpu.py).

A program works on one *main shape* (a 1-D ``(B,)`` tile or a 2-D ``(R, C)`` tile) per program of a
1-D or 2-D grid over a ragged, row-strided global array (masked loads with ``other=``, masked
stores). Its body: elementwise expression trees over i32 / u32 / i64 / f16 / bf16 / f32 (exact ops
only: ``+ - *`` and shifts / bit ops on integers, ``+ - * /`` on floats, comparisons, ``where``,
``maximum`` / ``minimum``, casts, promotion of mixed types), exact reductions (integer ``sum``,
``max`` / ``min`` / ``argmax`` / ``argmin``) broadcast back with ``[:, None]`` / ``keep_dims``,
transposes and reshapes of square tiles, run-time and ``static_range`` ``for`` loops (zero trips
included) and ``while`` loops carrying values, ``if`` / ``else`` on run-time scalars, ``program_id``,
integer ``atomic_add`` into a shared histogram, and outputs whose float summation order is not
defined (a float ``sum``, a ``dot`` of f16 / bf16 tiles), which are compared with the bound
``n * 2**-23 * sum |x|`` (:attr:`Program.tolerance`) instead of bit for bit.

The widened generator (a second pass) adds every scalar type (i8 / i16 / u8 / u16 / u64 / f64 and
the 8-bit floats e4m3 / e5m2, which compute in f32 and saturate as ``cvt.rn.satfinite``), integer
``//`` / ``%`` (C's, by zero 0; never ``MIN // -1``) and float ``//`` / ``%`` (rule 6, through
tests/support/op_table_reference.py), the exact math functions ``abs`` / ``floor`` / ``ceil`` /
``sqrt`` anywhere, the approximate ones (``exp``, ``log``, ``sin``, ``tanh``, ...) as outputs within
the PTX ISA's bounds, helper functions (nested ``def`` and module-level, a keyword argument), an
integer ``constexpr`` ``K`` used as a literal, a divisor and a ``static_range`` count, with each
program launched for two values of it (:meth:`Program.variants`), atomics whose old values are used
(``atomic_add`` / ``max`` / ``min`` / ``xchg`` / ``cas`` on a buffer of their own, in loops too),
scalar arguments of -0.0, and grids with more programs than the data (whole programs masked off).

``generate(seed)`` gives a :class:`Program`; ``program.source`` is its text, ``program.inputs(seed)``
its arguments (outputs poisoned), ``program.reference(args)`` the outputs numpy computes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .op_table_reference import approx_bound, ideal, ref_float_binary, ref_int_binary

NP: dict[str, Any] = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u8": np.uint8,
                      "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "f16": np.float16,
                      "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
                      "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "bool": np.bool_}
INTS = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")
FLOATS = ("f16", "bf16", "f32", "f64", "e4m3", "e5m2")
FP8 = ("e4m3", "e5m2")
BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64, "f16": 16,
        "bf16": 16, "f32": 32, "f64": 64, "e4m3": 8, "e5m2": 8, "bool": 1}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
POISON = 77
U_BOUND = 2.0**-23
"""Twice the unit roundoff of f32: the per-term bound of an f32 sum in any order."""


def promote(a: str, b: str) -> str:
    """The element type of a binary operation on ``a`` and ``b`` (docs/language.md, rules 2-4)."""
    if a == b:
        return a
    if a in FLOATS and b in FLOATS:
        if {a, b} == {"f16", "bf16"} or (a in FP8 and b in FP8):
            return "f32"
        return a if BITS[a] > BITS[b] else b
    if a in FLOATS or b in FLOATS:
        return a if a in FLOATS else b
    if BITS[a] != BITS[b]:
        return a if BITS[a] > BITS[b] else b
    return a if a.startswith("u") else b


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _int_to_float(x: np.ndarray, to: str) -> np.ndarray:
    """Integers to a float type, rounded once to nearest even (through f64 with round to odd where
    f64 is inexact)."""
    x = np.asarray(x)
    out = np.empty(x.shape, np.float64)
    for idx, v in np.ndenumerate(x):
        v = int(v)
        f = float(v)
        if int(f) != v:  # round to odd: truncate toward zero, then set the last bit
            if abs(int(f)) > abs(v):
                f = math.nextafter(f, 0.0)
            bits = np.array(f, np.float64).view(np.uint64) | np.uint64(1)
            f = float(bits.view(np.float64))
        out[idx] = f
    return to_bf16(out) if to == "bf16" else out.astype(NP[to])  # round to odd, then once to bf16


def _float_to_int(x: np.ndarray, to: str) -> np.ndarray:
    """Floats to an integer type: truncation toward zero, saturating, NaN to 0 (``cvt.rzi.sat``)."""
    x = _f64(x)
    info = np.iinfo(NP[to])
    lo, hi = float(info.min), float(info.max) + 1.0  # hi: 2**bits, exact in f64
    nan = np.isnan(x)
    t = np.trunc(np.where(nan, 0.0, x))
    small, big = t < lo, t >= hi
    safe = np.where(small | big, 0.0, t)
    out = np.asarray(safe.astype(NP[to]))
    out = np.where(small, NP[to](info.min), out)
    out = np.where(big, NP[to](info.max), out)
    return np.asarray(out, NP[to])


def convert(x: np.ndarray, frm: str, to: str) -> np.ndarray:
    """The conversion ``x.to(to)`` of docs/language.md rule 8."""
    with np.errstate(all="ignore"):
        return _convert(np.asarray(x), frm, to)


def to_fp8(x: np.ndarray, to: str) -> np.ndarray:
    """Floats (any numpy float type) to an 8-bit float as ``cvt.rn.satfinite`` after a rounding to
    f32: finite values beyond the largest saturate to it, infinities too, NaN stays NaN."""
    with np.errstate(all="ignore"):
        f = _f64(np.asarray(x).astype(np.float32))
        top = FP8_MAX[to]
        f = np.where(np.isnan(f), f, np.clip(f, -top, top))
        return np.asarray(f.astype(np.float32).astype(NP[to]))


def round_float(x: np.ndarray, t: str) -> np.ndarray:
    """The exact result ``x`` (held in f64, where an op's result on ``t`` rounds innocuously) of an
    operation on float type ``t``, as the operation gives it: rounded once to ``t``, and for the
    8-bit floats, which compute in f32, rounded as a conversion to them (saturating)."""
    if t in FP8:
        return to_fp8(x, t)
    if t == "bf16":
        return to_bf16(x)
    with np.errstate(all="ignore"):
        return np.asarray(_f64(x).astype(NP[t]))


def to_bf16(x: np.ndarray) -> np.ndarray:
    """f64 values rounded once to bf16, to nearest even, from their bits: to f32 rounding to odd
    (toward zero, the last bit set where inexact; f32 keeps 16 more bits than bf16 at every exponent),
    then the f32 bits to bf16's by integer rounding. ml_dtypes is not asked to round: one GPU host's
    rounded f64 -> bf16 through f32 to nearest, twice."""
    with np.errstate(all="ignore"):
        f = _f64(x)
        y = f.astype(np.float32)
        over = np.isfinite(f) & (np.abs(y.astype(np.float64)) > np.abs(f))  # went away from zero
        bits = y.view(np.uint32) - over.astype(np.uint32)
        inexact = np.isfinite(f) & (bits.view(np.float32).astype(np.float64) != f)
        bits = (bits | inexact.astype(np.uint32)).astype(np.uint64)
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
        nan = (bits >> np.uint64(16) & np.uint64(0x8000)) | np.uint64(0x7FC0)
        out = np.where(np.isnan(f), nan, rounded).astype(np.uint16)
    return np.asarray(out.view(NP["bf16"]).reshape(np.shape(x)))


def _convert(x: np.ndarray, frm: str, to: str) -> np.ndarray:
    if frm == to:
        return x
    if to == "bool":
        return np.asarray(x != 0)
    if frm == "bool":
        return np.asarray(x.astype(NP[to]))
    if to in FLOATS:
        if frm in INTS:
            if to == "f64":  # Python's int -> float rounds to nearest even, once
                return np.vectorize(lambda v: float(int(v)), otypes=[np.float64])(x) if x.size else x.astype(np.float64)
            if to in FP8:
                return to_fp8(_int_to_float(x, "f32"), to)
            return np.asarray(_int_to_float(x, to))
        return round_float(_f64(x), to)
    if frm in FLOATS:
        return _float_to_int(x, to)
    return np.asarray(x.astype(NP[to]))  # integer to integer: wraps


def sum_type(t: str) -> str:
    """The type of an integer ``sum``: integers narrower than 32 bits sum in i32."""
    return t if BITS[t] >= 32 else "i32"


def int_divmod(x: np.ndarray, y: np.ndarray, t: str, op: str) -> np.ndarray:
    """Integer ``//`` / ``%`` (rule 6: C's, toward zero; by zero 0) through exact Python integers."""
    kind = "floordiv" if op == "//" else "mod"
    x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
    out = [ref_int_binary(kind, t, int(a), int(b)) for a, b in zip(x.reshape(-1), y.reshape(-1), strict=True)]
    return np.asarray(np.array(out, dtype=object).astype(NP[t]).reshape(x.shape))


def float_mod(x: np.ndarray, y: np.ndarray, t: str) -> np.ndarray:
    """Float ``%`` (rule 6: ``x - trunc(x / y) * y`` with one fma, in f32 for narrow types)."""
    x, y = np.broadcast_arrays(_f64(x), _f64(y))
    out = [ref_float_binary("mod", t, float(a), float(b)) for a, b in zip(x.reshape(-1), y.reshape(-1), strict=True)]
    return np.asarray(np.array(out, np.float64).astype(NP[t]).reshape(x.shape))


def fmax(a: np.ndarray, b: np.ndarray, is_max: bool) -> np.ndarray:
    """``maximum`` / ``minimum`` of floats: NaN skipped, ``+0.0 > -0.0`` (rule 9)."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    af, bf = _f64(a), _f64(b)
    pick_a = (af > bf) if is_max else (af < bf)
    pick_a = pick_a | np.isnan(bf)
    zeros = (af == 0) & (bf == 0)
    a_first = ~np.signbit(af) if is_max else np.signbit(af)
    pick_a = np.where(zeros, a_first, pick_a)
    return np.asarray(np.where(pick_a, a, b))


# ---------------------------------------------------------------------------------------------
# the AST


@dataclass
class Node:
    """An expression: its element type, its shape (``()`` for a scalar)."""

    dtype: str
    shape: tuple[int, ...]

    def src(self) -> str:
        raise NotImplementedError

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError


@dataclass
class Var(Node):
    name: str = ""

    def src(self) -> str:
        return self.name

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(env[self.name])


@dataclass
class Lit(Node):
    """A literal right operand: it takes the type of the other operand (rule 1)."""

    value: float | int | str = 0
    """A number, or the name of an integer ``constexpr`` parameter (weakly typed as a literal)."""

    def src(self) -> str:
        return self.value if isinstance(self.value, str) else repr(self.value)

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        v = int(env[self.value]) if isinstance(self.value, str) else self.value
        if isinstance(v, float):
            return np.asarray(np.float64(v).astype(NP[self.dtype]))
        return convert(np.asarray(v, np.int64), "i64", self.dtype)


ARITH = ("+", "-", "*")
COMPARE = ("<", "<=", ">", ">=", "==", "!=")
BITOPS = ("&", "|", "^")


@dataclass
class Bin(Node):
    op: str = "+"
    a: Node | None = None
    b: Node | None = None

    def src(self) -> str:
        return f"({self.a.src()} {self.op} {self.b.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        t = promote(self.a.dtype, self.b.dtype) if not isinstance(self.b, Lit) else self.a.dtype
        x = convert(self.a.ev(env), self.a.dtype, t)
        y = convert(self.b.ev(env), self.b.dtype, t)
        with np.errstate(all="ignore"):
            if self.op in COMPARE:
                if t in FLOATS:
                    x, y = _f64(x), _f64(y)
                return np.asarray(eval(f"x {self.op} y", {"x": x, "y": y}))
            if t in FLOATS:
                if self.op == "//":  # floor of the quotient rounded to the type (rule 6)
                    return round_float(np.floor(_f64(round_float(_f64(x) / _f64(y), t))), t)
                if self.op == "%":
                    return float_mod(x, y, t)
                r = eval(f"x {self.op} y", {"x": _f64(x), "y": _f64(y)})
                return round_float(r, t)
            if self.op in BITOPS:
                return np.asarray(eval(f"x {self.op} y", {"x": x, "y": y}))
            if self.op in ("//", "%"):
                return int_divmod(x, y, t, self.op)
            u = np.dtype(f"u{BITS[t] // 8}")
            r = eval(f"x {self.op} y", {"x": np.asarray(x).astype(u), "y": np.asarray(y).astype(u)})
            return np.asarray(np.asarray(r).astype(u).astype(NP[t]))


@dataclass
class Shift(Node):
    op: str = "<<"
    a: Node | None = None
    amount: int | Node = 0

    def src(self) -> str:
        amt = self.amount if isinstance(self.amount, int) else f"({self.amount.src()} & {BITS[self.dtype] - 1})"
        return f"({self.a.src()} {self.op} {amt})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = self.a.ev(env)
        u = np.dtype(f"u{BITS[self.dtype] // 8}")
        if isinstance(self.amount, int):
            k = np.asarray(self.amount, u)
        else:
            k = np.asarray(self.amount.ev(env)).astype(u) & u.type(BITS[self.dtype] - 1)
        if self.op == "<<":
            return np.asarray((np.asarray(x).astype(u) << k).astype(NP[self.dtype]))
        return np.asarray(np.right_shift(x, k.astype(NP[self.dtype])))


@dataclass
class Neg(Node):
    a: Node | None = None
    op: str = "-"

    def src(self) -> str:
        return f"({self.op}{self.a.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = self.a.ev(env)
        with np.errstate(all="ignore"):
            if self.op == "~":
                return np.asarray(~x)
            if self.dtype in FLOATS:
                return np.asarray(-x)
            u = np.dtype(f"u{BITS[self.dtype] // 8}")
            return np.asarray((u.type(0) - np.asarray(x).astype(u)).astype(NP[self.dtype]))


@dataclass
class Cast(Node):
    a: Node | None = None
    style: int = 0

    def src(self) -> str:
        return f"{self.a.src()}.to({self.dtype})" if self.style == 0 else f"to({self.a.src()}, {self.dtype})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return convert(self.a.ev(env), self.a.dtype, self.dtype)


@dataclass
class Where(Node):
    c: Node | None = None
    a: Node | None = None
    b: Node | None = None

    def src(self) -> str:
        return f"where({self.c.src()}, {self.a.src()}, {self.b.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(np.where(self.c.ev(env), self.a.ev(env), self.b.ev(env)).astype(NP[self.dtype]))


@dataclass
class MinMax(Node):
    is_max: bool = True
    a: Node | None = None
    b: Node | None = None

    def src(self) -> str:
        return f"{'maximum' if self.is_max else 'minimum'}({self.a.src()}, {self.b.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x, y = self.a.ev(env), self.b.ev(env)
        if self.dtype in FLOATS:
            return round_float(_f64(fmax(x, y, self.is_max)), self.dtype)
        return np.asarray((np.maximum if self.is_max else np.minimum)(x, y))


EXACT_MATH = ("abs", "floor", "ceil", "sqrt")
"""Math functions whose result is exact (correctly rounded) on every path (rule 10)."""


def math_type(fn: str, t: str) -> str:
    """The result type of ``fn(x)`` for ``x`` of type ``t``: integers become f32 (``abs`` keeps them)."""
    return t if fn == "abs" or t in FLOATS else "f32"


@dataclass
class Unary(Node):
    """``abs`` / ``floor`` / ``ceil`` / ``sqrt``: 16- and 8-bit floats compute in f32 and round once
    (8-bit floats saturate as a conversion: ``abs`` of an e5m2 infinity is 57344), integers convert
    to f32 first (``abs`` of an integer keeps it, wrapping at the minimum), f64 computes in f64."""

    fn: str = "abs"
    a: Node | None = None

    def src(self) -> str:
        return f"{self.fn}({self.a.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = self.a.ev(env)
        if self.fn == "abs" and self.a.dtype in INTS:
            if self.a.dtype.startswith("u"):
                return np.asarray(x)
            u = np.dtype(f"u{BITS[self.a.dtype] // 8}")
            xu = np.asarray(x).astype(u)
            return np.asarray(np.where(x < 0, u.type(0) - xu, xu).astype(NP[self.a.dtype]))
        xf = _f64(convert(x, self.a.dtype, self.dtype))
        with np.errstate(all="ignore"):
            r = {"abs": np.abs, "floor": np.floor, "ceil": np.ceil, "sqrt": np.sqrt}[self.fn](xf)
        return round_float(r, self.dtype)


def _reduce_minmax(x: np.ndarray, axis: int | None, is_max: bool, dtype: str) -> np.ndarray:
    if axis is None:
        x, axis = x.reshape(-1), 0
    if dtype not in FLOATS:
        return np.asarray((np.max if is_max else np.min)(x, axis=axis))
    parts = np.moveaxis(x, axis, 0)
    acc = parts[0]
    for p in parts[1:]:
        acc = fmax(acc, p, is_max)
    return round_float(_f64(acc), dtype)


@dataclass
class Reduce(Node):
    """``fn(a, axis)`` of a main-shaped tile; a 2-D tile's reduction along an axis is broadcast back
    (``[:, None]`` / ``[None, :]`` or ``keep_dims=True``)."""

    fn: str = "max"
    a: Node | None = None
    axis: int | None = None
    keep: bool = False
    style: int = 0

    def src(self) -> str:
        ax = "" if self.axis is None else f", axis={self.axis}"
        kd = ", keep_dims=True" if self.keep and self.axis is not None and len(self.a.shape) == 2 else ""
        s = f"{self.fn}({self.a.src()}{ax}{kd})" if self.style == 0 else f"{self.a.src()}.{self.fn}({ax[2:]}{kd})"
        if self.axis is not None and len(self.a.shape) == 2 and not self.keep:
            s += "[None, :]" if self.axis == 0 else "[:, None]"
        return s

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = self.a.ev(env)
        t = self.a.dtype
        if self.fn == "sum":
            acc = sum_type(t)
            u = np.dtype(f"u{BITS[acc] // 8}")
            r = np.sum(x.astype(NP[acc]).astype(u), axis=self.axis).astype(NP[acc])
        elif self.fn in ("max", "min"):
            r = _reduce_minmax(x, self.axis, self.fn == "max", t)
        else:
            xf = _f64(x) if t in FLOATS else x
            if self.axis is None:
                r = (np.argmax if self.fn == "argmax" else np.argmin)(xf.reshape(-1))
            else:
                r = (np.argmax if self.fn == "argmax" else np.argmin)(xf, axis=self.axis)
            r = np.asarray(r).astype(np.int32)
        r = np.asarray(r)
        if self.axis is not None and len(self.a.shape) == 2:
            r = np.expand_dims(r, self.axis)
        return r


@dataclass
class Permute(Node):
    """A transpose of a square tile (``trans`` / ``.T`` / ``permute``), or the reshape round trip
    ``reshape(trans(reshape(a, (C, R))), (R, C))`` of any 2-D tile."""

    a: Node | None = None
    style: int = 0

    def src(self) -> str:
        r, c = self.a.shape
        if self.style == 0:
            return f"trans({self.a.src()})"
        if self.style == 1:
            return f"{self.a.src()}.T"
        if self.style == 2:
            return f"permute({self.a.src()}, (1, 0))"
        return f"reshape(trans(reshape({self.a.src()}, ({c}, {r}))), ({r}, {c}))"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x = self.a.ev(env)
        r, c = self.a.shape
        if self.style == 3:
            return np.asarray(x.reshape(c, r).T.reshape(r, c))
        return np.asarray(x.T)


@dataclass
class BroadcastTo(Node):
    a: Node | None = None

    def src(self) -> str:
        return f"broadcast_to({self.a.src()}, {self.shape})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(np.broadcast_to(self.a.ev(env), self.shape))


# ---------------------------------------------------------------------------------------------
# statements


@dataclass
class Stmt:
    def lines(self, ind: str) -> list[str]:
        raise NotImplementedError

    def run(self, env: dict[str, Any], prog: Program) -> None:
        raise NotImplementedError


@dataclass
class Assign(Stmt):
    name: str
    value: Node

    def lines(self, ind: str) -> list[str]:
        return [f"{ind}{self.name} = {self.value.src()}"]

    def run(self, env: dict[str, Any], prog: Program) -> None:
        env[self.name] = np.asarray(self.value.ev(env)).astype(NP[self.value.dtype])


@dataclass
class For(Stmt):
    var: str
    trip: str  # a scalar argument's name, or a constant count for static_range
    body: list[Stmt]
    static: int | str | None = None
    start: int = 0
    step: int = 1

    def lines(self, ind: str) -> list[str]:
        if self.static is not None:
            head = f"{ind}for {self.var} in static_range({self.static}):"
        else:
            stop = f"{self.start} + {self.trip} * {self.step}" if (self.start, self.step) != (0, 1) else self.trip
            args = f"{self.start}, {stop}" + (f", {self.step}" if self.step != 1 else "")
            head = f"{ind}for {self.var} in range({args}):"
        out = [head]
        for s in self.body:
            out += s.lines(ind + "    ")
        return out

    def run(self, env: dict[str, Any], prog: Program) -> None:
        static = int(env[self.static]) if isinstance(self.static, str) else self.static
        n = static if static is not None else int(env[self.trip])
        for k in range(n):
            env[self.var] = np.asarray(k if self.static is not None else self.start + k * self.step, np.int32)
            for s in self.body:
                s.run(env, prog)
        env.pop(self.var, None)


@dataclass
class While(Stmt):
    var: str
    trip: str
    body: list[Stmt]

    def lines(self, ind: str) -> list[str]:
        out = [f"{ind}{self.var} = 0", f"{ind}while {self.var} < {self.trip}:"]
        for s in self.body:
            out += s.lines(ind + "    ")
        out.append(f"{ind}    {self.var} = {self.var} + 1")
        return out

    def run(self, env: dict[str, Any], prog: Program) -> None:
        env[self.var] = np.asarray(0, np.int32)
        while int(env[self.var]) < int(env[self.trip]):
            for s in self.body:
                s.run(env, prog)
            env[self.var] = np.asarray(int(env[self.var]) + 1, np.int32)


@dataclass
class If(Stmt):
    cond: Node
    then: list[Stmt]
    other: list[Stmt]

    def lines(self, ind: str) -> list[str]:
        out = [f"{ind}if {self.cond.src()}:"]
        for s in self.then or []:
            out += s.lines(ind + "    ")
        if not self.then:
            out.append(f"{ind}    pass")
        if self.other:
            out.append(f"{ind}else:")
            for s in self.other:
                out += s.lines(ind + "    ")
        return out

    def run(self, env: dict[str, Any], prog: Program) -> None:
        for s in (self.then if bool(self.cond.ev(env)) else self.other):
            s.run(env, prog)


@dataclass
class Store(Stmt):
    """``store(OUT + offs, value, mask=m [& extra])`` into a main-shaped output."""

    out: str
    value: Node
    extra: Node | None = None

    def lines(self, ind: str) -> list[str]:
        mask = "m" if self.extra is None else f"m & {self.extra.src()}"
        return [f"{ind}store({self.out} + offs, {self.value.src()}, mask={mask})"]

    def run(self, env: dict[str, Any], prog: Program) -> None:
        spec = prog.outputs[self.out]
        v = np.broadcast_to(convert(self.value.ev(env), self.value.dtype, spec.dtype), prog.shape)
        m = env["m"] if self.extra is None else env["m"] & np.asarray(self.extra.ev(env))
        idx = env["offs"][m]
        env["@" + self.out][idx] = v[m]
        if spec.tol_of is not None:
            env["@tol:" + self.out][idx] = np.broadcast_to(spec.tol_of(env), prog.shape)[m]


@dataclass
class Atomic(Stmt):
    """``atomic_add(HIST + (index & (NB - 1)), value, mask=..., sem="relaxed")`` on i32 / u32 / i64."""

    index: Node
    value: Node
    extra: Node | None = None
    dtype: str = "i32"

    def lines(self, ind: str) -> list[str]:
        mask = "m" if self.extra is None else f"m & {self.extra.src()}"
        return [f"{ind}atomic_add(HIST + ({self.index.src()} & {HIST_BINS - 1}), {self.value.src()}, "
                f"mask={mask}, sem=\"relaxed\")"]

    def run(self, env: dict[str, Any], prog: Program) -> None:
        idx = np.broadcast_to(np.asarray(self.index.ev(env)).astype(np.int64) & (HIST_BINS - 1), prog.shape)
        val = np.broadcast_to(convert(self.value.ev(env), self.value.dtype, self.dtype), prog.shape)
        m = env["m"] if self.extra is None else env["m"] & np.asarray(self.extra.ev(env))
        u = np.dtype(f"u{BITS[self.dtype] // 8}")
        hist = env["@HIST"].view(u)
        np.add.at(hist, idx[m], val[m].astype(u))


HIST_BINS = 16

ATOMIC_TYPES = {"add": ("i32", "u32", "i64", "u64", "f16", "f32", "f64"), "max": ("i32", "u32", "i64", "u64"),
                "min": ("i32", "u32", "i64", "u64"), "xchg": ("i32", "u32", "i64", "u64", "f32", "f64"),
                "cas": ("i32", "u32", "i64", "u64")}
"""The element types of each atomic (docs/language.md, Atomics); ``cas`` only on integers here, since
a float ``cas`` compares bits and a computed NaN's payload is not defined."""


def _flush(x: np.ndarray) -> np.ndarray:
    """f32 subnormals to zeros of their sign (``atom.global.add.f32``)."""
    return np.where(np.abs(x) < 2.0**-126, np.copysign(0.0, x), x)


@dataclass
class AtomicRMW(Stmt):
    """``name = atomic_<fn>(BUF + offs, [cmp,] value, mask=m [& extra])`` on a buffer of its own that
    no other program and no other atomic touches: each element's old value (0 where masked) is the
    buffer's value before this statement, so it is defined even in a loop."""

    name: str
    fn: str
    buf: str
    value: Node
    cmp: Node | None = None
    extra: Node | None = None
    dtype: str = "i32"
    sem: str | None = None

    def lines(self, ind: str) -> list[str]:
        mask = "m" if self.extra is None else f"m & {self.extra.src()}"
        cmp = "" if self.cmp is None else f"{self.cmp.src()}, "
        sem = "" if self.sem is None else f", sem=\"{self.sem}\""
        return [f"{ind}{self.name} = atomic_{self.fn}({self.buf} + offs, {cmp}{self.value.src()}, mask={mask}{sem})"]

    def run(self, env: dict[str, Any], prog: Program) -> None:
        t = self.dtype
        val = np.broadcast_to(convert(self.value.ev(env), self.value.dtype, t), prog.shape)
        m = env["m"] if self.extra is None else env["m"] & np.asarray(self.extra.ev(env))
        m = np.broadcast_to(m, prog.shape)
        buf = env["@" + self.buf]
        idx = env["offs"][m]
        old = buf[idx].copy()
        v = val[m]
        with np.errstate(all="ignore"):
            if self.fn == "add":
                if t in FLOATS:
                    a, b = _f64(old), _f64(v)
                    new = round_float(_flush(_flush(a) + _flush(b)) if t == "f32" else a + b, t)
                else:
                    u = np.dtype(f"u{BITS[t] // 8}")
                    new = (old.astype(u) + v.astype(u)).astype(NP[t])
            elif self.fn in ("max", "min"):
                new = (np.maximum if self.fn == "max" else np.minimum)(old, v)
            elif self.fn == "xchg":
                new = v
            else:
                c = np.broadcast_to(convert(self.cmp.ev(env), self.cmp.dtype, t), prog.shape)[m]
                new = np.where(old == c, v, old)
        buf[idx] = new
        res = np.zeros(prog.shape, NP[t])
        res[m] = old
        env[self.name] = res


@dataclass
class OutSpec:
    """An output array: element type, and for inexact (order-dependent) values the function giving
    each element's error bound from the environment."""

    dtype: str
    tol_of: Any = None


@dataclass
class Program:
    """A generated kernel: source text, signature, launch grid, and the reference evaluator."""

    seed: int
    shape: tuple[int, ...]
    grid: tuple[int, ...]
    extent: tuple[int, ...]  # the global array's (rows, cols) or (n,)
    stride: int
    inputs_dt: list[str]
    others: list[float | int | None]
    scalars: dict[str, str]
    outputs: dict[str, OutSpec]
    body: list[Stmt]
    hist_dtype: str | None = None
    consts: dict[str, int] = field(default_factory=dict)
    helpers: list[Helper] = field(default_factory=list)
    atomic_bufs: dict[str, str] = field(default_factory=dict)
    k_values: tuple[int, ...] = (1,)

    def variants(self) -> list[Program]:
        """The program with each value of its ``constexpr`` ``K``: one kernel, specialized and
        launched once per value."""
        return [dataclasses.replace(self, consts={**self.consts, "K": k}) for k in self.k_values]

    # -- text ---------------------------------------------------------------------------------
    @property
    def params(self) -> list[str]:
        ps = [f"X{i}: ptr[{t}]" for i, t in enumerate(self.inputs_dt)]
        ps += [f"{o}: ptr[{s.dtype}]" for o, s in self.outputs.items()]
        if self.hist_dtype:
            ps.append(f"HIST: ptr[{self.hist_dtype}]")
        ps += [f"{b}: ptr[{t}]" for b, t in self.atomic_bufs.items()]
        ps += [f"{n}: {t}" for n, t in self.scalars.items()]
        ps += [f"{n}: constexpr" for n in self.consts]
        return ps

    @property
    def source(self) -> str:
        lines = [f"# program_gen seed {self.seed}"]
        for h in self.helpers:
            if not h.nested:
                lines += [*h.definition(""), ""]
        lines += ["@kernel", f"def k({', '.join(self.params)}):"]
        ind = "    "
        for h in self.helpers:
            if h.nested:
                lines += h.definition(ind)
        if len(self.shape) == 1:
            lines += [f"{ind}offs = program_id(0) * B + arange(0, B)", f"{ind}m = offs < n"]
        else:
            c0 = "program_id(1) * C + " if len(self.grid) == 2 else ""
            lines += [f"{ind}rows = program_id(0) * R + arange(0, R)", f"{ind}cols = {c0}arange(0, C)",
                      f"{ind}m = (rows[:, None] < nr) & (cols[None, :] < nc)",
                      f"{ind}offs = rows[:, None] * stride + cols[None, :]"]
        for i, o in enumerate(self.others):
            other = "" if o is None else f", other={o!r}"
            lines.append(f"{ind}x{i} = load(X{i} + offs, mask=m{other})")
        for s in self.body:
            lines += s.lines(ind)
        return "\n".join(lines) + "\n"

    # -- arguments ------------------------------------------------------------------------------
    def sizes(self) -> int:
        return self.extent[0] * self.stride if len(self.shape) == 2 else self.extent[0]

    def inputs(self, seed: int) -> dict[str, Any]:
        """The launch arguments by name (inputs random, never all zeros; outputs poisoned), and the
        constexprs."""
        rng = np.random.default_rng(seed)
        size = self.sizes()
        args: dict[str, Any] = {}
        for i, t in enumerate(self.inputs_dt):
            args[f"X{i}"] = random_values(rng, t, size)
        for o, spec in self.outputs.items():
            args[o] = np.full(size, POISON, np.float64).astype(NP[spec.dtype])
        if self.hist_dtype:
            args["HIST"] = random_values(rng, self.hist_dtype, HIST_BINS)
        for b, t in self.atomic_bufs.items():
            args[b] = random_values(rng, t, size)
        for n, t in self.scalars.items():
            args[n] = self.scalar_value(n, t, rng)
        args.update(self.consts)
        return args

    def scalar_value(self, name: str, t: str, rng: np.random.Generator) -> Any:
        if name == "n":
            return int(self.extent[0])
        if name in ("nr", "nc"):
            return int(self.extent[0 if name == "nr" else 1])
        if name == "stride":
            return int(self.stride)
        if name.startswith("trip"):
            return int(rng.integers(0, 4))
        if t in FLOATS:
            return float(rng.choice([-2.5, -1.0, 0.0, -0.0, 0.75, 3.0]))
        if t.startswith("u"):
            return int(rng.integers(0, 2 ** BITS[t], dtype=np.uint64))
        return int(rng.integers(-50, 50))

    # -- the reference --------------------------------------------------------------------------
    def reference(self, args: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The outputs (and each output's per-element error bound, zero where exact) after the
        launch, computed in numpy program by program."""
        with np.errstate(all="ignore"):
            return self._reference(args)

    def _reference(self, args: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        outs = {o: np.array(args[o], copy=True) for o in self.outputs}
        tols = {o: np.zeros(self.sizes(), np.float64) for o in self.outputs}
        hist = np.array(args["HIST"], copy=True) if self.hist_dtype else None
        bufs = {b: np.array(args[b], copy=True) for b in self.atomic_bufs}
        for pid in np.ndindex(*self.grid):
            env: dict[str, Any] = {n: np.asarray(args[n], NP[t]) for n, t in self.scalars.items()}
            env.update({"@" + o: outs[o] for o in outs})
            env.update({"@tol:" + o: tols[o] for o in outs})
            env["@HIST"] = hist
            env.update({"@" + b: a for b, a in bufs.items()})
            env.update({k: np.asarray(v) for k, v in self.consts.items()})
            env["pid0"] = np.asarray(pid[0], np.int32)
            env["pid1"] = np.asarray(pid[1] if len(pid) > 1 else 0, np.int32)
            if len(self.shape) == 1:
                (b,) = self.shape
                offs = pid[0] * b + np.arange(b)
                m = offs < self.extent[0]
            else:
                r, c = self.shape
                rows = pid[0] * r + np.arange(r)
                cols = (pid[1] * c if len(pid) > 1 else 0) + np.arange(c)
                m = (rows[:, None] < self.extent[0]) & (cols[None, :] < self.extent[1])
                offs = rows[:, None] * self.stride + cols[None, :]
                env["rows[:, None]"] = rows[:, None].astype(np.int32)
                env["cols[None, :]"] = cols[None, :].astype(np.int32)
            env["m"], env["offs"] = m, offs
            for i, t in enumerate(self.inputs_dt):
                o = self.others[i]
                x = np.full(self.shape, np.asarray(0 if o is None else o).astype(NP[t]), NP[t])
                x[m] = args[f"X{i}"][offs[m]]
                env[f"x{i}"] = x
            for s in self.body:
                s.run(env, self)
        if hist is not None:
            outs["HIST"] = hist
            tols["HIST"] = np.zeros(HIST_BINS)
        for b, a in bufs.items():
            outs[b] = a
            tols[b] = np.zeros(a.size)
        return outs, tols


def random_values(rng: np.random.Generator, t: str, size: int) -> np.ndarray:
    """Random values of type ``t``: small and large integers; floats of a few bits and random ones,
    with some zeros of both signs, infinities and NaNs among them (never all zeros)."""
    if t in INTS:
        info = np.iinfo(NP[t])
        small = rng.integers(-40 if t[0] == "i" else 0, 40, size).astype(NP[t])
        big = rng.integers(info.min, info.max, size, dtype=NP[t], endpoint=True)
        return np.where(rng.random(size) < 0.6, small, big).astype(NP[t])
    x = np.where(rng.random(size) < 0.5, rng.integers(-24, 24, size) / 4.0,
                 rng.standard_normal(size) * 8.0)
    special = rng.random(size)
    x = np.where(special < 0.02, -0.0, x)
    x = np.where((special >= 0.02) & (special < 0.03), np.inf * np.sign(rng.random(size) - 0.5), x)
    x = np.where((special >= 0.03) & (special < 0.04), np.nan, x)
    return round_float(x, t)


# ---------------------------------------------------------------------------------------------
# the generator


class Gen:
    """Builds one random program from a ``random.Random``."""

    def __init__(self, rnd: random.Random, seed: int) -> None:
        self.r = rnd
        self.seed = seed
        two_d = rnd.random() < 0.6
        if two_d:
            r, c = rnd.choice([(1, 16), (2, 8), (4, 4), (4, 32), (8, 8), (16, 16), (16, 16), (32, 32), (8, 64),
                               (32, 4), (64, 16), (2, 64)])
            self.shape: tuple[int, ...] = (r, c)
            self.grid: tuple[int, ...] = (rnd.randint(1, 3),) if rnd.random() < 0.4 else (rnd.randint(1, 3),
                                                                                          rnd.randint(1, 2))
            gc = self.grid[1] if len(self.grid) == 2 else 1
            self.extent: tuple[int, ...] = (max(1, self.grid[0] * r - rnd.randint(0, r - 1)),
                                            max(1, gc * c - rnd.randint(0, c - 1)))
            self.stride = gc * c + rnd.randint(0, 5)
        else:
            b = rnd.choice([4, 16, 32, 64, 128, 256, 1024])
            self.shape = (b,)
            self.grid = (rnd.randint(1, 3),)
            self.extent = (max(1, self.grid[0] * b - rnd.randint(0, b - 1)),)
            self.stride = 1
        if rnd.random() < 0.12:  # more programs than the data needs: the last ones see only false masks
            self.grid = (rnd.randint(2, 4), *self.grid[1:])
            self.extent = tuple(rnd.randint(1, n) for n in self.shape[:len(self.extent)])
            if two_d:
                self.extent = (self.extent[0], min(self.extent[1], self.stride))
        self.scalars: dict[str, str] = {"n": "i32"} if not two_d else {"nr": "i32", "nc": "i32", "stride": "i32"}
        s1 = rnd.choice(["u32", "i64", "f32", "i32", "i8", "u16", "u64", "f64"])
        self.scalars.update({"s0": "i32", "s1": s1, "trip0": "i32", "trip1": "i32"})
        n_in = rnd.randint(1, 3)
        self.inputs_dt = [self.any_type() for _ in range(n_in)]
        self.others: list[float | int | None] = []
        for t in self.inputs_dt:
            if rnd.random() < 0.3:
                self.others.append(None)
            elif t in FLOATS:
                self.others.append(rnd.choice([1.5, -2.0, 0.25, -0.0]))
            else:
                self.others.append(rnd.choice([7, 1, 3]) if t.startswith("u") else rnd.choice([-3, 7, 1]))
        self.vars: list[Var] = [Var(t, self.shape, f"x{i}") for i, t in enumerate(self.inputs_dt)]
        self.vars += [Var(t, (), n) for n, t in self.scalars.items() if n.startswith("s")]
        self.vars.append(Var("i32", (), "pid"))
        self.index_vars: list[Var] = []
        if two_d:
            self.index_vars = [Var("i32", (self.shape[0], 1), "rows[:, None]"),
                               Var("i32", (1, self.shape[1]), "cols[None, :]")]
        self.outputs: dict[str, OutSpec] = {}
        self.counter = 0
        self.hist_dtype: str | None = None
        self.consts = {"R": self.shape[0], "C": self.shape[1]} if two_d else {"B": self.shape[0]}
        self.k_values = tuple(rnd.sample([1, 2, 3, 5], 2))
        self.consts["K"] = self.k_values[0]
        self.helpers: list[Helper] = []
        self.atomic_bufs: dict[str, str] = {}
        self.in_helper = False
        self.helper_module = False

    # -- expressions ----------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def leaf(self, t: str, tile: bool) -> Node:
        pool = [v for v in self.vars + self.index_vars if (not tile or v.shape)]
        same = [v for v in pool if v.dtype == t]
        v = self.r.choice(same) if same and self.r.random() < 0.7 else self.r.choice(pool)
        if v.dtype != t:
            return Cast(t, v.shape, a=v, style=self.r.randint(0, 1))
        return v

    def lit(self, t: str) -> Lit:
        """A literal that fits ``t`` (rule 1), or the constexpr ``K`` (1 to 5, weakly typed)."""
        if self.r.random() < 0.1 and not (self.in_helper and self.helper_module):
            return Lit(t, (), value="K")
        if t in FLOATS:
            return Lit(t, (), value=self.r.choice([0.5, -1.25, 3.0, 2.0, -0.0, 1.0]))
        values = {"i8": [-1, 0, 1, 3, 127, -128], "u8": [0, 1, 3, 255], "u16": [0, 1, 3, 255, 4096],
                  "u32": [0, 1, 3, 255, 4096], "u64": [0, 1, 3, 255, 4096]}
        return Lit(t, (), value=self.r.choice(values.get(t, [-1, 0, 1, 3, 255, -4096])))

    def divisor(self, t: str, depth: int) -> Node:
        """A right operand of integer ``//`` / ``%``: never -1 (``MIN // -1`` is undefined, SP0790 in
        the interpreter), zero allowed (gives 0)."""
        r = self.r
        if r.random() < 0.4:
            signed = [-5, -3] if t[0] == "i" else []
            ks = [] if self.in_helper and self.helper_module else ["K"]
            return Lit(t, (), value=r.choice([2, 3, 7, 16, *ks, *signed]))
        b = self.expr(t, depth - 1)
        if t[0] == "i":
            b = Bin(t, b.shape, op="&", a=b, b=Lit(t, (), value=127))
        if all(n.startswith("it") for n in _var_names(b)):
            # of constants and loop counters only: constant in a static_range loop, where a zero
            # divisor is SP0330 (seed 23824: it2 // (it2 & 127)); never zero
            b = Bin(t, b.shape, op="|", a=b, b=Lit(t, (), value=1))
        return b

    def helper(self, t: str, depth: int, tile: bool) -> Node:
        """A call of a new helper function whose body is an expression of its two parameters."""
        r = self.r
        name = self.fresh("h")
        nested = r.random() < 0.5
        t2 = self.any_type()
        p0, p1 = Var(r.choice([t, self.any_type()]), self.shape, "a"), Var(t2, r.choice([(), self.shape]), "b")
        saved = self.vars, self.index_vars, self.in_helper, self.helper_module
        self.vars, self.index_vars, self.in_helper, self.helper_module = [p0, p1], [], True, not nested
        body = self.main(self.expr(t, depth - 1, True))
        self.vars, self.index_vars, self.in_helper, self.helper_module = saved
        a0 = self.main(self.expr(p0.dtype, depth - 1, True))
        a1 = self.expr(t2, depth - 1, True) if p1.shape else self.expr(t2, depth - 1)
        a1 = self.main(a1) if p1.shape else (a1 if not a1.shape else Reduce(t2, (), fn="max", a=self.main(a1)))
        h = Helper(t, self.shape, name=name, params=[p0, p1], body=body, args=[a0, a1], nested=nested,
                   keyword=r.random() < 0.3)
        self.helpers.append(h)
        return h

    def expr(self, t: str, depth: int, tile: bool = False) -> Node:
        """An expression of element type ``t`` (a tile when ``tile``)."""
        r = self.r
        if depth <= 0 or r.random() < 0.2:
            return self.leaf(t, tile)
        k = r.random()
        if t == "bool":
            ct = r.choice(INTS + FLOATS)
            a = self.expr(ct, depth - 1, tile)
            b = self.lit(ct) if r.random() < 0.4 else self.expr(ct, depth - 1)
            if r.random() < 0.2:
                c1, c2 = self.cmp(a, b, ct), self.cmp(self.expr(ct, depth - 1, tile), self.lit(ct), ct)
                return Bin("bool", _bshape(c1, c2), op=r.choice(("&", "|")), a=c1, b=c2)
            return self.cmp(a, b, ct)
        if k < 0.35:
            op = r.choice(ARITH + (("/", "//", "%") if t in FLOATS else (*BITOPS, "//", "%")))
            a = self.expr(t, depth - 1, tile)
            if op in ("//", "%") and t in INTS:
                b = self.divisor(t, depth)
                return Bin(t, _bshape(a, b), op=op, a=a, b=b)
            if r.random() < 0.3:
                return Bin(t, a.shape, op=op, a=a, b=self.lit(t))
            if r.random() < 0.25:  # mixed types that promote to t
                other = r.choice([x for x in INTS + FLOATS if x != t and promote(t, x) == t] or [t])
                b = self.expr(other, depth - 1)
                return Bin(t, _bshape(a, b), op=op, a=a, b=b)
            b = self.expr(t, depth - 1)
            return Bin(t, _bshape(a, b), op=op, a=a, b=b)
        if k < 0.45:
            a = self.expr(t, depth - 1, tile)
            if t in INTS and r.random() < 0.4:
                return Neg(t, a.shape, a=a, op="~")
            return Neg(t, a.shape, a=a)
        if k < 0.55 and t in INTS:
            a = self.expr(t, depth - 1, tile)
            amt: int | Node = r.randint(0, BITS[t] - 1) if r.random() < 0.6 else self.expr(t, depth - 1)
            s = Shift(t, a.shape if isinstance(amt, int) else _bshape(a, amt), op=r.choice(("<<", ">>")), a=a,
                      amount=amt)
            return s
        if k < 0.65:
            src = r.choice([x for x in INTS + FLOATS if x != t])
            a = self.expr(src, depth - 1, tile)
            return Cast(t, a.shape, a=a, style=r.randint(0, 1))
        if k < 0.75:
            c = self.expr("bool", depth - 1)
            a, b = self.expr(t, depth - 1, tile), self.expr(t, depth - 1)
            return Where(t, tuple(np.broadcast_shapes(c.shape, a.shape, b.shape)), c=c, a=a, b=b)
        if k < 0.83:
            a, b = self.expr(t, depth - 1, tile), self.expr(t, depth - 1)
            return MinMax(t, _bshape(a, b), is_max=r.random() < 0.5, a=a, b=b)
        if k < 0.88:
            return self.reduction(t, depth)
        if k < 0.93:
            if r.random() < 0.3 and not self.in_helper:
                return self.helper(t, depth, tile)
            fn = r.choice(EXACT_MATH if t in FLOATS else ("abs",))
            src = t if t in FLOATS or fn == "abs" else r.choice(INTS)
            if fn != "abs" and t == "f32" and r.random() < 0.3:
                src = r.choice(INTS)  # integers convert to f32 first
            a = self.expr(src, depth - 1, tile)
            return Unary(math_type(fn, src), a.shape, fn=fn, a=a)
        if len(self.shape) == 2:
            a = self.expr(t, depth - 1, True)
            a = self.main(a)
            style = r.randint(0, 3) if self.shape[0] == self.shape[1] else 3
            return Permute(t, self.shape, a=a, style=style)
        return self.leaf(t, tile)

    def main(self, a: Node) -> Node:
        """``a`` broadcast to the main shape where it is not already."""
        if a.shape == self.shape:
            return a
        return BroadcastTo(a.dtype, self.shape, a=a)

    def cmp(self, a: Node, b: Node, ct: str) -> Node:
        return Bin("bool", _bshape(a, b), op=self.r.choice(COMPARE), a=a, b=b)

    def reduction(self, t: str, depth: int) -> Node:
        r = self.r
        fn = r.choice(["max", "min", "argmax", "argmin"] + (["sum"] if t in INTS else []))
        src = t if fn not in ("argmax", "argmin") else r.choice(INTS + FLOATS)
        a = self.main(self.expr(src, depth - 1, True))
        axis = r.choice([None, 0, 1] if len(self.shape) == 2 else [None, 0])
        if len(self.shape) == 1 and axis == 0 and r.random() < 0.5:
            axis = None
        shape: tuple[int, ...] = ()
        if axis is not None and len(self.shape) == 2:
            shape = (1, self.shape[1]) if axis == 0 else (self.shape[0], 1)
        res_t = "i32" if fn in ("argmax", "argmin") else (sum_type(src) if fn == "sum" else src)
        node = Reduce(res_t, shape, fn=fn, a=a, axis=axis, keep=r.random() < 0.3, style=r.randint(0, 1))
        if res_t != t:
            return Cast(t, shape, a=node)
        return node

    # -- statements -----------------------------------------------------------------------------
    def any_type(self) -> str:
        """A type, the 32-bit and 16-bit float ones twice as likely as the others."""
        return self.r.choice(INTS + FLOATS + ("i32", "u32", "i64", "f16", "bf16", "f32"))

    def block(self, depth: int, n: int) -> list[Stmt]:
        out: list[Stmt] = []
        for _ in range(n):
            out += self.stmt(depth)
        return out

    def stmt(self, depth: int) -> list[Stmt]:
        r = self.r
        k = r.random()
        if depth <= 0 or k < 0.35:
            t = self.any_type()
            name = self.fresh("t")
            node = self.expr(t, 3)
            self.vars.append(Var(t, node.shape, name))
            return [Assign(name, node)]
        if k < 0.5 and self.r.random() < 0.5:
            return self.atomic_rmw()
        if k < 0.6:
            return self.loop(depth)
        if k < 0.8:
            return self.branch(depth)
        return self.loop(depth, use_while=True)

    def carried(self) -> tuple[str, str, Node]:
        t = self.any_type()
        init = self.expr(t, 2, True) if self.r.random() < 0.8 else self.expr(t, 1)
        return self.fresh("acc"), t, self.main(init) if init.shape else init

    def update(self, name: str, t: str, shape: tuple[int, ...]) -> Node:
        cur = Var(t, shape, name)
        e = self.expr(t, 2)
        r = self.r.random()
        if r < 0.4:
            ops = ("+", "-") if t in FLOATS else ARITH + BITOPS
            node: Node = Bin(t, _bshape(cur, e), op=self.r.choice(ops), a=cur, b=e)
        elif r < 0.7:
            node = MinMax(t, _bshape(cur, e), is_max=self.r.random() < 0.5, a=cur, b=e)
        else:
            c = self.expr("bool", 2)
            node = Where(t, tuple(np.broadcast_shapes(c.shape, cur.shape, e.shape)), c=c, a=e, b=cur)
        if node.shape != shape:
            node = BroadcastTo(t, shape, a=node) if shape else node
        if node.shape != shape:  # a scalar accumulator updated by a tile expression: reduce it
            node = Reduce(t, (), fn="max", a=self.main(node), axis=None)
        return node

    def loop(self, depth: int, use_while: bool = False) -> list[Stmt]:
        r = self.r
        acc, t, init = self.carried()
        out: list[Stmt] = [Assign(acc, init)]
        var = self.fresh("it")
        self.vars.append(Var("i32", (), var))
        body: list[Stmt] = [Assign(acc, self.update(acc, t, init.shape))]
        if depth > 1 and r.random() < 0.4:
            body += self.block(depth - 1, 1)
        self.vars = [v for v in self.vars if v.name != var]
        # names first bound in the body do not exist after it
        self.vars = [v for v in self.vars if v.name == acc or not _bound_in(v.name, body)]
        trip = r.choice(["trip0", "trip1"])
        if use_while:
            loop: Stmt = While(var, trip, body)
        elif r.random() < 0.3:
            loop = For(var, trip, body, static=r.choice([0, 1, 2, 3, "K"]))
        else:
            loop = For(var, trip, body, start=r.choice([0, 0, 2, -3]), step=r.choice([1, 1, 2, 3]))
        self.vars.append(Var(t, init.shape, acc))
        return [*out, loop]

    def branch(self, depth: int) -> list[Stmt]:
        r = self.r
        name = self.fresh("v")
        t = self.any_type()
        a = self.main(self.expr(t, 2, True))
        b = self.main(self.expr(t, 2, True))
        cs = r.choice([v for v in self.vars if not v.shape and v.dtype in INTS])
        cond = Bin("bool", (), op=r.choice(COMPARE), a=cs, b=self.lit(cs.dtype))
        then: list[Stmt] = [Assign(name, a)]
        other: list[Stmt] = [Assign(name, b)]
        if depth > 1 and r.random() < 0.4:
            inner = self.block(depth - 1, 1)
            self.vars = [v for v in self.vars if not _bound_in(v.name, inner)]
            then = inner + then
        self.vars.append(Var(t, self.shape, name))
        return [If(cond, then, other)]

    def output(self) -> Stmt:
        r = self.r
        name = f"OUT{len(self.outputs)}"
        k = r.random()
        extra = self.expr("bool", 1, True) if r.random() < 0.3 else None
        if k < 0.3 and self.has_dot():
            return self.dot_output(name)
        if k < 0.25:
            return self.sum_output(name, extra)
        if k < 0.35:
            return self.math_output(name, extra)
        t = r.choice(INTS + FLOATS)
        e = self.expr(t, 4, True)
        self.outputs[name] = OutSpec(r.choice([t, t, self.any_type()]))
        return Store(name, e, extra)

    def has_dot(self) -> bool:
        return len(self.shape) == 2 and self.shape[0] == self.shape[1] and self.shape[0] >= 16

    def sum_output(self, name: str, extra: Node | None) -> Stmt:
        """A float sum (order not defined): stored broadcast back, checked within its error bound."""
        t = self.r.choice((*FLOATS, "f16", "bf16", "f32"))
        a = self.main(self.expr(t, 2, True))
        axis = self.r.choice([None, 0, 1] if len(self.shape) == 2 else [None])
        node = FloatSum("f32", (), a=a, axis=axis)
        if axis is not None:
            node.shape = (1, self.shape[1]) if axis == 0 else (self.shape[0], 1)
        self.outputs[name] = OutSpec("f32", tol_of=node.bound)
        return Store(name, node, extra)

    def math_output(self, name: str, extra: Node | None) -> Stmt:
        """An approximate math function of an f32 tile (clamped where :data:`APPROX_CLAMP` says)."""
        fn = self.r.choice(["exp", "exp2", "log", "log2", "rsqrt", "sin", "cos", "sigmoid", "tanh", "erf"])
        a = self.main(self.expr("f32", 2, True))
        if fn in APPROX_CLAMP:
            lim = APPROX_CLAMP[fn]
            a = MinMax("f32", a.shape, is_max=False, a=MinMax("f32", a.shape, is_max=True, a=a,
                                                                b=Lit("f32", (), value=-lim)),
                       b=Lit("f32", (), value=lim))
        node = MathOut("f32", self.shape, fn=fn, a=a)
        self.outputs[name] = OutSpec("f32", tol_of=node.bound)
        return Store(name, node, extra)

    def atomic_rmw(self) -> list[Stmt]:
        """An atomic on a buffer of its own whose old values become a variable."""
        r = self.r
        fn = r.choice(list(ATOMIC_TYPES))
        t = r.choice(ATOMIC_TYPES[fn])
        buf = f"AT{len(self.atomic_bufs)}"
        self.atomic_bufs[buf] = t
        value = self.expr(r.choice([t, t, self.any_type()]), 2, r.random() < 0.7)
        cmp = None
        if fn == "cas":
            cmp = Var(t, self.shape, "x0") if self.inputs_dt[0] == t and r.random() < 0.5 else self.expr(t, 1)
        extra = self.expr("bool", 1, True) if r.random() < 0.4 else None
        name = self.fresh("old")
        stmt = AtomicRMW(name, fn, buf, value, cmp, extra, dtype=t, sem=r.choice([None, "relaxed", "acq_rel"]))
        self.vars.append(Var(t, self.shape, name))
        return [stmt]

    def dot_output(self, name: str) -> Stmt:
        t = self.r.choice(["f16", "bf16"])
        a = self.main(self.expr(t, 2, True))
        b = self.main(self.expr(t, 2, True))
        node = Dot("f32", self.shape, a=a, b=b)
        self.outputs[name] = OutSpec("f32", tol_of=node.bound)
        return Store(name, node)

    def atomic(self) -> Stmt:
        self.hist_dtype = self.r.choice(["i32", "u32", "i64"])
        idx = self.main(self.expr("i32", 2, True))
        val = self.expr(self.hist_dtype, 2)
        extra = self.expr("bool", 1, True) if self.r.random() < 0.5 else None
        return Atomic(idx, val, extra, dtype=self.hist_dtype)

    def program(self) -> Program:
        r = self.r
        body: list[Stmt] = [Assign("pid", PidNode("i32", (), grid2=len(self.grid) == 2))]
        body += self.block(2, r.randint(1, 4))
        if r.random() < 0.3:
            body.append(self.atomic())
        for _ in range(r.randint(1, 3)):
            body.append(self.output())
        return Program(self.seed, self.shape, self.grid, self.extent, self.stride, self.inputs_dt, self.others,
                       self.scalars, self.outputs, body, self.hist_dtype, self.consts, self.helpers,
                       self.atomic_bufs, self.k_values)


@dataclass
class PidNode(Node):
    """``program_id(0) * 3 + program_id(1)`` (a 2-D grid) or ``program_id(0)``."""

    grid2: bool = False

    def src(self) -> str:
        return "program_id(0) * 3 + program_id(1)" if self.grid2 else "program_id(0)"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(int(env["pid0"]) * 3 + int(env["pid1"]) if self.grid2 else int(env["pid0"]), np.int32)


REL = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24, "f64": 2.0**-24, "e4m3": 2.0**-4, "e5m2": 2.0**-3}
"""The relative rounding error of a result rounded to the type (half an ulp); for f64 that of the
final ``.to(f32)`` (the f64 rounding is far below it)."""


@dataclass
class FloatSum(Node):
    """``sum(a, axis).to(f32)`` of floats: accumulated in f32 in an undefined order and rounded once
    to ``a``'s type. The reference is the exact sum rounded to that type; the bound covers the f32
    accumulation (``n * 2**-23 * sum |x|``) and both roundings to the type."""

    a: Node | None = None
    axis: int | None = None

    def src(self) -> str:
        s = f"sum({self.a.src()}{'' if self.axis is None else f', axis={self.axis}'}).to(f32)"
        if self.axis is not None and len(self.a.shape) == 2:
            s += "[None, :]" if self.axis == 0 else "[:, None]"
        return s

    def _sums(self, env: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        x = _f64(self.a.ev(env))
        n = x.size if self.axis is None else x.shape[self.axis]
        keep = self.axis is not None
        with np.errstate(all="ignore"):
            return (np.sum(x, axis=self.axis, keepdims=keep), np.sum(np.abs(x), axis=self.axis, keepdims=keep), n)

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(round_float(self._sums(env)[0], self.a.dtype).astype(np.float32))

    def bound(self, env: dict[str, np.ndarray]) -> np.ndarray:
        s, a, n = self._sums(env)
        rel = REL[self.a.dtype]
        acc = n * U_BOUND * a
        with np.errstate(all="ignore"):
            return acc * (1 + rel) + 2 * rel * (np.abs(s) + acc) + 2.0**-24


@dataclass
class Dot(Node):
    """``dot(a, b)`` of f16 / bf16 tiles into f32; bound ``K * 2**-23 * sum |a_ik b_kj|``."""

    a: Node | None = None
    b: Node | None = None

    def src(self) -> str:
        return f"dot({self.a.src()}, {self.b.src()})"

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray((_f64(self.a.ev(env)) @ _f64(self.b.ev(env))).astype(np.float32))

    def bound(self, env: dict[str, np.ndarray]) -> np.ndarray:
        a, b = _f64(self.a.ev(env)), _f64(self.b.ev(env))
        exact = a @ b
        return a.shape[1] * U_BOUND * (np.abs(a) @ np.abs(b)) + np.abs(exact) * 2.0**-24


APPROX_CLAMP = {"exp": 60.0, "exp2": 60.0, "sigmoid": 60.0, "tanh": 60.0, "erf": 60.0, "sin": 300.0, "cos": 300.0}
"""Arguments of these are clamped to +-the value (NaN to the low end), inside ``sin.approx``'s
stated range and far from f32 overflow; ``log``, ``log2`` and ``rsqrt`` take any f32."""


@dataclass
class MathOut(Node):
    """An approximate math function (rule 10) of an f32 tile, stored as f32 and compared within the
    bound the PTX ISA's stated errors give (tests/support/op_table_reference.py): the reference is the
    exact value rounded to f32, which the interpreter (correctly rounded) and the GPU are both within."""

    fn: str = "exp"
    a: Node | None = None

    def src(self) -> str:
        return f"{self.fn}({self.a.src()})"

    def _ideal(self, env: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        x = _f64(self.a.ev(env))
        fn = self.fn
        return x, np.vectorize(lambda v: ideal(fn, float(v)), otypes=[np.float64])(x)

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(self._ideal(env)[1].astype(np.float32))

    def bound(self, env: dict[str, np.ndarray]) -> np.ndarray:
        x, v = self._ideal(env)
        fn = self.fn
        return np.vectorize(lambda a, b: approx_bound(fn, float(a), float(b)), otypes=[np.float64])(x, v)


@dataclass
class Helper(Node):
    """A call of a helper function (a nested ``def`` in the kernel, or an undecorated function of the
    module) whose body is an expression of its parameters; inlined at the call."""

    name: str = "h"
    params: list[Var] = field(default_factory=list)
    body: Node | None = None
    args: list[Node] = field(default_factory=list)
    nested: bool = True
    keyword: bool = False

    def src(self) -> str:
        args = [a.src() for a in self.args]
        if self.keyword:
            args[-1] = f"{self.params[-1].name}={args[-1]}"
        return f"{self.name}({', '.join(args)})"

    def definition(self, ind: str) -> list[str]:
        return [f"{ind}def {self.name}({', '.join(p.name for p in self.params)}):",
                f"{ind}    return {self.body.src()}"]

    def ev(self, env: dict[str, np.ndarray]) -> np.ndarray:
        inner = {p.name: a.ev(env) for p, a in zip(self.params, self.args, strict=True)}
        if "K" in env:
            inner["K"] = env["K"]
        return self.body.ev(inner)


def _bshape(a: Node, b: Node) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(a.shape, b.shape))


def _var_names(node: Any) -> set[str]:
    """The names of the variables an expression reads."""
    if isinstance(node, Var):
        return {node.name}
    out: set[str] = set()
    for f in dataclasses.fields(node) if isinstance(node, Node) else ():
        v = getattr(node, f.name)
        for x in v if isinstance(v, list | tuple) else (v,):
            if isinstance(x, Node):
                out |= _var_names(x)
    return out


def _bound_in(name: str, body: list[Stmt]) -> bool:
    for s in body:
        if isinstance(s, Assign | AtomicRMW) and s.name == name:
            return True
        if isinstance(s, For | While) and _bound_in(name, s.body):
            return True
        if isinstance(s, If) and (_bound_in(name, s.then) or _bound_in(name, s.other)):
            return True
    return False


def generate(seed: int) -> Program:
    """The program of ``seed`` (the same text and reference for the same seed)."""
    return Gen(random.Random(seed), seed).program()


def generate_from(rnd: random.Random, seed: int = -1) -> Program:
    """A program drawn from ``rnd`` (for hypothesis: ``st.randoms()``)."""
    return Gen(rnd, seed).program()
