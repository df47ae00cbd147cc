"""An independent model of what every elementwise op and conversion computes (docs/language.md
§Promotion and arithmetic, rules 5 to 10), for the op table (tests/support/op_table_cases.py):
exact rational arithmetic (:class:`fractions.Fraction`) rounded by :func:`round_to`, Python integers
wrapped by :func:`wrap`, and for the approximate math functions the exact value (float64 ``math``)
with the bound the PTX ISA states for the instructions the GPU uses (:func:`approx_bound`). Nothing
here calls the interpreter or its numerics module, so a test comparing the two catches a bug of
either."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

NAN = float("nan")
INF = float("inf")


@dataclass(frozen=True)
class Fmt:
    """A binary float format: ``p`` significand bits (the leading one included), exponents
    ``emin``..``emax`` of normal numbers, ``top`` the largest finite value (None: ``2**emax`` times
    the largest significand), ``saturates`` (no infinity: out-of-range values clamp to ``top``)."""

    p: int
    emin: int
    emax: int
    top: float | None = None
    saturates: bool = False

    @property
    def max(self) -> float:
        return self.top if self.top is not None else float((2 - Fraction(1, 2 ** (self.p - 1))) * 2**self.emax)

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.p + 1)

    def ulp(self, x: float) -> float:
        """The spacing of the format at ``|x|`` (the subnormal spacing below the normal range)."""
        if not math.isfinite(x) or x == 0:
            return self.min_subnormal
        e = max(math.frexp(abs(x))[1] - 1, self.emin)
        return 2.0 ** (e - self.p + 1)


FMTS = {"f64": Fmt(53, -1022, 1023), "f32": Fmt(24, -126, 127), "tf32": Fmt(11, -126, 127),
        "f16": Fmt(11, -14, 15), "bf16": Fmt(8, -126, 127), "e4m3": Fmt(4, -6, 8, 448.0, True),
        "e5m2": Fmt(3, -14, 15, None, True)}
"""The float formats by type name (e4m3: the ``fn`` variant, no infinity, 448 the largest value;
both 8-bit formats saturate, as every conversion to them does: ``cvt.rn.satfinite``)."""

INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def int_range(t: str) -> tuple[int, int]:
    """(min, max) of the integer type ``t`` (``bool``: 0, 1)."""
    if t == "bool":
        return 0, 1
    w = INT_BITS[t]
    return (-(2 ** (w - 1)), 2 ** (w - 1) - 1) if t[0] == "i" else (0, 2**w - 1)


def wrap(v: int, t: str) -> int:
    """``v`` wrapped to the integer type ``t`` (two's complement)."""
    if t == "bool":
        return int(v != 0)
    w = INT_BITS[t]
    m = v & ((1 << w) - 1)
    return m - (1 << w) if t[0] == "i" and m >> (w - 1) else m


def _exponent(q: Fraction) -> int:
    """floor(log2(q)) of a positive rational."""
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > q else e


def round_to(x: Fraction | float | int, t: str, *, negative_zero: bool = False, ties_away: bool = False) -> float:
    """The real ``x`` (a Fraction, an int, or a float: infinities and NaN pass through, saturated
    for the 8-bit formats) rounded once to the float type ``t``: to nearest, ties to even (or away
    from zero), overflowing to infinity or, for 8-bit floats, to the largest value. A zero result
    (exact or underflowed) is ``-0.0`` when ``x`` is negative or ``negative_zero``."""
    fmt = FMTS[t]
    if isinstance(x, float):
        if math.isnan(x):
            return NAN
        if math.isinf(x):
            return math.copysign(fmt.max, x) if fmt.saturates else x
        negative_zero = negative_zero or (x == 0 and math.copysign(1.0, x) < 0)
    q = Fraction(x)
    if q == 0:
        return -0.0 if negative_zero else 0.0
    sign, q = (-1.0 if q < 0 else 1.0), abs(q)
    e = max(_exponent(q), fmt.emin)
    quantum = Fraction(2) ** (e - fmt.p + 1)
    n, rem = divmod(q, quantum)
    half = Fraction(1, 2) * quantum
    if rem > half or (rem == half and (ties_away or n % 2 == 1)):
        n += 1
    r = n * quantum
    if r > Fraction(fmt.max):
        r = Fraction(fmt.max) if fmt.saturates else None  # type: ignore[assignment]
        if r is None:
            return sign * INF
    return sign * float(r) if r != 0 else math.copysign(0.0, sign)


COMPUTE = {"e4m3": "f32", "e5m2": "f32", "tf32": "f32"}
"""The type a float type's arithmetic rounds to first (8-bit floats compute in f32 and round as a
cast to them; tf32 values are held and computed on as f32, docs/language.md rule 8)."""


def round_op(x: Fraction | float, t: str, *, negative_zero: bool = False) -> float:
    """The exact result ``x`` of an op on type ``t`` as the op gives it: rounded to ``t``, or for an
    8-bit float first to f32 and then as a conversion to ``t``; tf32 results are f32 values."""
    c = COMPUTE.get(t, t)
    r = round_to(x, c, negative_zero=negative_zero)
    return round_to(r, t) if t in ("e4m3", "e5m2") else r


def is_neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def exact_binary(kind: str, x: float, y: float) -> Fraction | float:
    """``x <kind> y`` (add, sub, mul, div) exactly: a Fraction for a finite nonzero result, else
    the IEEE special value (NaN, a signed infinity or a signed zero)."""
    if kind == "sub":
        return exact_binary("add", x, -y)
    if math.isnan(x) or math.isnan(y):
        return NAN
    if kind == "div" and y == 0:
        return NAN if x == 0 else math.copysign(INF, 1.0 if is_neg(x) == is_neg(y) else -1.0)
    if not (math.isfinite(x) and math.isfinite(y)):  # Python floats follow IEEE here (inf - inf is NaN)
        return {"add": lambda: x + y, "mul": lambda: x * y, "div": lambda: x / y}[kind]()
    if kind == "add":
        s = Fraction(x) + Fraction(y)
        if s == 0:
            return -0.0 if is_neg(x) and is_neg(y) else 0.0
        return s
    neg = is_neg(x) != is_neg(y)
    r = Fraction(x) * Fraction(y) if kind == "mul" else Fraction(x) / Fraction(y)
    return r if r != 0 else (-0.0 if neg else 0.0)


def ref_float_binary(kind: str, t: str, x: float, y: float) -> float:
    """A float binary op on values of type ``t`` (docs/language.md rules 6, 8, 9)."""
    if kind in ("add", "sub", "mul", "div"):
        r = exact_binary(kind, x, y)
        return round_op(r, t, negative_zero=isinstance(r, float) and is_neg(r))
    if kind in ("max", "min"):
        if math.isnan(x) or math.isnan(y):  # NaN skipped
            return round_op(y if math.isnan(x) else x, t)
        if x == 0 and y == 0:  # +0.0 > -0.0
            neg = (is_neg(x) and is_neg(y)) if kind == "max" else (is_neg(x) or is_neg(y))
            return -0.0 if neg else 0.0
        return round_op(max(x, y) if kind == "max" else min(x, y), t)  # 8-bit floats: as a cast (inf saturates)
    if kind == "floordiv":
        return round_op(_floor(ref_float_binary("div", t, x, y)), t)  # the quotient rounded to the type
    if kind == "mod":
        return round_op(_fmod(x, y, "f64" if t == "f64" else "f32"), t)
    raise KeyError(kind)


def _floor(q: float) -> float:
    if not math.isfinite(q) or q == 0:
        return q
    f = float(math.floor(q))
    return f if f != 0 else (-0.0 if is_neg(q) else 0.0)


def _trunc(q: float) -> float:
    if not math.isfinite(q) or q == 0:
        return q
    f = float(math.trunc(q))
    return f if f != 0 else (-0.0 if is_neg(q) else 0.0)


def _fmod(x: float, y: float, c: str) -> float:
    """``x % y`` as docs/language.md rule 6 defines it, in the compute type ``c`` (f32 or f64):
    ``fma(-trunc(x / y), y, x)`` with the quotient rounded to ``c`` and the fma rounded once, ``x``
    where ``y`` is infinite."""
    if math.isinf(y):
        return x
    q = round_to(exact_binary("div", x, y), c, negative_zero=_neg_div(x, y))
    nt = -_trunc(q)
    p = exact_binary("mul", nt, y)
    if isinstance(p, float) or not math.isfinite(x):  # a special product or x: IEEE float arithmetic
        pv = p if isinstance(p, float) else float(p)
        s = exact_binary("add", pv, x)
        return round_to(s, c, negative_zero=isinstance(s, float) and is_neg(s))
    s = p + Fraction(x)
    if s == 0:  # an exact zero sum of nonzero addends is +0.0 (x == 0 and p == 0 handled above as floats)
        return 0.0
    return round_to(s, c)


def _neg_div(x: float, y: float) -> bool:
    return is_neg(x) != is_neg(y)


def ref_int_binary(kind: str, t: str, a: int, b: int) -> int:
    """An integer binary op on values of type ``t`` (docs/language.md rules 6, 7)."""
    if kind in ("floordiv", "mod"):
        if b == 0:
            return 0
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        return wrap(q if kind == "floordiv" else a - b * q, t)
    if kind in ("shl", "shr"):
        w = INT_BITS[t]
        if b < 0 or b >= w:
            return -1 if kind == "shr" and a < 0 else 0
        return wrap(a << b, t) if kind == "shl" else a >> b  # Python's >> is arithmetic; unsigned a >= 0
    fn = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "and": lambda: a & b,
          "or": lambda: a | b, "xor": lambda: a ^ b, "max": lambda: max(a, b), "min": lambda: min(a, b)}[kind]
    return wrap(fn(), t)


def ref_compare(pred: str, x: Any, y: Any) -> bool:
    """A comparison (NaN: false but ``!=``)."""
    return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[pred]


def ref_convert(x: Any, src: str, dst: str) -> Any:
    """``x.to(dst)`` of a value ``x`` of type ``src`` (docs/language.md rule 8)."""
    src_float = src in FMTS
    if src == dst:  # no conversion (a tf32 value is not rounded again)
        return x
    if dst == "bool":
        return bool(x != 0) if not (src_float and math.isnan(x)) else True
    if dst in INT_BITS:
        if not src_float:
            return wrap(int(x), dst)
        if math.isnan(x):
            return 0
        lo, hi = int_range(dst)
        if math.isinf(x):
            return hi if x > 0 else lo
        return max(lo, min(hi, math.trunc(x)))
    value: Fraction | float = x if src_float else Fraction(int(x))
    if dst in ("e4m3", "e5m2"):  # through f32, then satfinite
        return round_to(round_to(value, "f32"), dst)
    if dst == "tf32":  # through f32, then cvt.rna (ties away)
        return round_to(round_to(value, "f32"), "tf32", ties_away=True)
    return round_to(value, dst)


# ---------------------------------------------------------------------------------------------------
# approximate math functions
# ---------------------------------------------------------------------------------------------------
LOG2E = 1.4426950408889634
APPROX = ("exp", "exp2", "log", "log2", "rsqrt", "sin", "cos", "sigmoid", "tanh", "erf")
"""The math functions computed with approximate PTX instructions (docs/language.md rule 10)."""

EX2_REL = 2.0**-22
"""``ex2.approx.f32``: maximum error 2 ulp over the whole range (PTX ISA 9.1, §9.7.3.21
"Floating Point Instructions: ex2"), at most 2 * 2**-23 relative."""
LG2_ABS = 2.0**-22.6
"""``lg2.approx.f32``: maximum absolute error 2**-22.6 for the mantissa (PTX ISA 9.1, §9.7.3.20
"Floating Point Instructions: lg2"); the f32 result adds its own rounding (half an ulp)."""
RSQRT_REL = 2.0**-22.9
"""``rsqrt.approx.f32``: maximum relative error 2**-22.9 over the whole range (PTX ISA 9.1,
§9.7.3.17 "Floating Point Instructions: rsqrt")."""
SIN_ABS = 2.0**-20.5
SIN_TURN_REL = 1.5 * 2.0**-23
"""``sin.approx.f32`` / ``cos.approx.f32``: the sine unit's own absolute error, 2**-20.5 (PTX ISA 9.1,
§9.7.3.18-19 "Floating Point Instructions: sin / cos"), on an argument already reduced to turns:
ptxas multiplies x by fl(1 / (2 pi)) rounding toward zero (one ulp, 2**-23 relative, plus the
constant's 2**-24) before the unit (SASS ``FMUL.RZ`` then ``MUFU.SIN``; there is no exact range
reduction), which moves the result by up to |x| * 1.5 * 2**-23. The first H100 run of this table
showed it (6.9e-6 off at x = 100, where the unit's bound alone is 7e-7)."""
RCP_REL = 2.0**-23
"""``rcp.approx.ftz.f32``: 1 ulp over the whole range (PTX ISA 9.1, §9.7.3.13 "rcp")."""
TANH_ULP, ERF_ULP = 3.0, 2.0
"""The bounds docs/language.md rule 10 derives for ``tanh`` / ``erf`` from the ex2 and rcp bounds."""


def _exp2(z: float) -> float:
    try:
        return 2.0**z
    except OverflowError:
        return INF


def ideal(fn: str, x: float) -> float:
    """The exact (float64) value of math function ``fn`` at the f32 value ``x``, with the special
    values of the instruction sequence the GPU runs (docs/language.md rule 10)."""
    if math.isnan(x):
        return NAN
    if fn in ("exp", "exp2"):
        if math.isinf(x):
            return 0.0 if x < 0 else INF
        return _exp2(x * LOG2E) if fn == "exp" else _exp2(x)
    if fn in ("log", "log2"):
        lg = -INF if x == 0 else (NAN if x < 0 else (INF if math.isinf(x) else math.log2(x)))
        return lg * math.log(2) if fn == "log" and math.isfinite(lg) else lg
    if fn == "rsqrt":
        if x == 0:
            return math.copysign(INF, x)
        return NAN if x < 0 else (0.0 if math.isinf(x) else 1.0 / math.sqrt(x))
    if fn in ("sin", "cos"):
        return NAN if math.isinf(x) else (math.sin(x) if fn == "sin" else math.cos(x))
    if fn == "sigmoid":
        if x == -INF:
            return 0.0
        return 1.0 / (1.0 + _exp2(-x * LOG2E))
    if fn == "tanh":
        return math.tanh(x)
    if fn == "erf":
        return math.erf(x)
    raise KeyError(fn)


def approx_bound(fn: str, x: float, value: float) -> float:
    """The largest ``|result - ideal(fn, x)|`` the PTX ISA's stated errors allow a device result of
    ``fn`` at the f32 value ``x`` (``value``: the ideal value), before any rounding to a narrower
    type. The interpreter (each step correctly rounded) is within it as well."""
    ulp32 = FMTS["f32"].ulp(value)
    half = ulp32 / 2
    sub = 2 * FMTS["f32"].min_subnormal  # ex2's 2 ulp where the result is subnormal
    a = abs(value)
    if fn == "exp2":
        return EX2_REL * a + sub + half
    if fn == "exp":  # fl(x * fl(log2 e)): two relative roundings of 2**-24 move 2**z by |x| 2**-23
        return (abs(x) * 2.0**-23 * 1.01 + EX2_REL) * a + sub + half
    if fn == "log2":
        return LG2_ABS + ulp32
    if fn == "log":  # lg2 * fl(ln 2), rounded: the lg2 bound times ln 2, the constant's and the product's roundings
        return (LG2_ABS + ulp32) * math.log(2) + abs(value) * 2.0**-24 + ulp32
    if fn == "rsqrt":
        return RSQRT_REL * a + half
    if fn in ("sin", "cos"):
        return SIN_ABS + abs(x) * SIN_TURN_REL + half
    if fn == "sigmoid":  # exp's argument and ex2, 1 + e rounded, rcp: relative; flushed to 0 below 2**-126
        return (abs(x) * 2.0**-23 * 1.01 + EX2_REL + 2.0**-24 + RCP_REL) * a + 2.0**-125
    if fn == "tanh":
        return TANH_ULP * ulp32
    if fn == "erf":
        return ERF_ULP * ulp32
    raise KeyError(fn)


def pow_ideal_and_bound(x: float, y: float) -> tuple[float, float]:
    """``x ** y`` as ``2 ** (y * log2(x))`` (docs/language.md rule 6: NaN for x < 0 and for 0 ** 0),
    and the bound the PTX errors allow a device result: the lg2 error (:data:`LG2_ABS` and the
    rounding of the f32 lg2) times ``|y|`` plus the product's rounding moves the exponent ``z``,
    which moves ``2**z`` by the factor ``2**dz``; ex2 adds :data:`EX2_REL`."""
    lg = NAN if (math.isnan(x) or x < 0) else (-INF if x == 0 else (INF if math.isinf(x) else math.log2(x)))
    z = y * lg  # inf * 0 is NaN (0 ** 0, 1 ** inf)
    if math.isnan(z):
        return NAN, 0.0
    if math.isinf(z):
        return (INF if z > 0 else 0.0), 0.0
    value = _exp2(z)
    dz = abs(y) * (LG2_ABS + FMTS["f32"].ulp(lg)) + FMTS["f32"].ulp(z)
    grow = _exp2(dz) - 1 if dz < 64 else INF
    return value, (grow + EX2_REL) * abs(value) + 2 * FMTS["f32"].min_subnormal + FMTS["f32"].ulp(value) / 2
