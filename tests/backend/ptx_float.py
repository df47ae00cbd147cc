"""Test helper: the values of PTX's float instructions whose results the PTX ISA defines exactly,
for every thread at once (numpy), on ``.f64`` / ``.f32`` / ``.f16`` / ``.bf16`` (and the packed
``.f16x2`` / ``.bf16x2`` forms, lane by lane): ``add`` / ``sub`` / ``mul`` / ``fma`` (``mad.rn``
too) with ``.rn`` / ``.rz`` / ``.rm`` / ``.rp``, ``div`` / ``sqrt`` / ``rcp`` with those roundings
(the IEEE forms, not ``.approx`` / ``.full``), ``min`` / ``max`` (and ``.NaN``), ``abs`` / ``neg``,
``setp`` (ordered, unordered, ``num`` / ``nan``), ``selp``, ``testp``, ``copysign`` and ``mov``;
``cvt`` is tests/backend/ptx_fcvt.py's.

Results are exact: sums, products and fused multiply-adds of formats up to f32 by error-free
transformations in float64 (tests/backend/ptx_fround.py), ``.rn`` quotients and roots of them in
float64 rounded once more (correct: 53 >= 2 * 24 + 2 bits, so the second rounding cannot change
the result), f64's ``.rn`` arithmetic by numpy's IEEE float64, and everything else (f64 ``fma``,
directed roundings of f64 and of quotients and roots) from Python :class:`~fractions.Fraction`
values per lane. An instruction or modifier it does not model exactly (``.ftz``, ``.sat``,
``.approx``, ``ex2`` / ``lg2`` / ``sin`` / ``cos`` / ``tanh``, ``.relu``, ``.xorsign``) is an
:class:`UnknownInstruction`. NaN results are the canonical NaN; ``abs`` / ``neg`` / ``copysign``
change the sign bit only (the PTX ISA gives "an unspecified NaN" for a NaN input of ``abs`` /
``neg``: compare NaN-ness only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from .address_eval import UnknownInstruction
from .ptx_fcvt import convert
from .ptx_fround import U64, Fmt, decode, encode, fmt_of, two_sum, zero_sum_negative
from .ptx_ops import integer_op

FLOAT_TYPES = ("f16", "bf16", "f32", "f64", "f16x2", "bf16x2")
FLOAT_LITERAL = re.compile(r"0[fF]([0-9a-fA-F]{8})|0[dD]([0-9a-fA-F]{16})")
"""A float literal's hexadecimal bits (``0f``: f32, ``0d``: f64; 16-bit ones are written ``0x``)."""
_ROUNDINGS = ("rn", "rz", "rm", "rp")
_ARITY = {"mov": 1, "abs": 1, "neg": 1, "sqrt": 1, "rcp": 1, "testp": 1, "add": 2, "sub": 2, "mul": 2, "div": 2,
          "min": 2, "max": 2, "copysign": 2, "setp": 2, "fma": 3, "mad": 3, "selp": 3}
_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
        "ge": np.greater_equal}


def is_float_op(op: str) -> bool:
    """Whether ``op`` computes on (or converts) a float type."""
    parts = op.split(".")
    floats = ("f16", "bf16", "f32", "f64", "f16x2", "bf16x2", "tf32", "e4m3x2", "e5m2x2")
    return parts[0] in ("testp", "copysign") or any(p in floats for p in parts[1:])


def instruction_value(op: str, v: list[np.ndarray], active: np.ndarray) -> np.ndarray:
    """The result of instruction ``op`` (float, ``cvt`` with a float type, or integer:
    tests/backend/ptx_ops.py) on the operand values ``v`` in the ``active`` threads."""
    if not is_float_op(op):
        return integer_op(op, v, active)
    return convert(op, v) if op.startswith("cvt.") else float_op(op, v)


def float_op(op: str, v: list[np.ndarray]) -> np.ndarray:
    """The result bits of float instruction ``op`` (not ``cvt``) on the operand bits ``v``."""
    parts = op.split(".")
    base, ty, mods = parts[0], parts[-1], parts[1:-1]
    if ty not in FLOAT_TYPES or len(v) != _ARITY.get(base):  # (max.f32 d, a, b, c of sm_100: refused)
        raise UnknownInstruction(op)
    if ty.endswith("x2"):
        return _packed(op, ty, v)
    fmt = fmt_of(ty)
    if base in ("mov", "selp") and not mods:
        return v[0] if base == "mov" else np.where(v[2] != 0, v[0], v[1])
    if base == "setp":
        return _setp(op, mods, fmt, v).astype(U64)
    if base == "testp" and len(mods) == 1:
        return _testp(op, mods[0], decode(v[0], fmt)).astype(U64)
    if base in ("abs", "neg") and not mods:
        sign = U64(fmt.sign)
        return v[0] & ~sign if base == "abs" else v[0] ^ sign
    if base == "copysign" and not mods:  # copysign d, a, b: b's magnitude with a's sign
        sign = U64(fmt.sign)
        return (v[1] & ~sign) | (v[0] & sign)
    if base in ("min", "max") and mods in ([], ["NaN"]):
        return _min_max(base, bool(mods), fmt, v)
    x = [decode(a, fmt) for a in v]
    if base in ("add", "sub", "mul", "fma", "mad") and len(mods) == 1 and mods[0] in _ROUNDINGS:
        if base == "sub":
            base, x[1] = "add", -x[1]
        if base == "mad":  # mad.rn.f32 is fma.rn.f32 (PTX ISA: "mad.f32 ... identical to fma.f32")
            base = "fma"
        return _arith(base, mods[0], fmt, x)
    if base in ("div", "sqrt", "rcp") and len(mods) == 1 and mods[0] in _ROUNDINGS:
        if base == "rcp":
            x = [np.ones_like(x[0]), x[0]]
        return _div_sqrt("sqrt" if base == "sqrt" else "div", mods[0], fmt, x)
    raise UnknownInstruction(op)


def _packed(op: str, ty: str, v: list[np.ndarray]) -> np.ndarray:
    """A ``.f16x2`` / ``.bf16x2`` instruction: the scalar one on each half (the low half first)."""
    if op.startswith(("setp", "testp", "selp")):
        raise UnknownInstruction(op)
    scalar = op[: -len(ty)] + ty[:-2]
    lo = float_op(scalar, [a & U64(0xFFFF) for a in v])
    hi = float_op(scalar, [(a >> U64(16)) & U64(0xFFFF) for a in v])
    return (lo & U64(0xFFFF)) | ((hi & U64(0xFFFF)) << U64(16))


def _setp(op: str, mods: list[str], fmt: Fmt, v: list[np.ndarray]) -> np.ndarray:
    """``setp.<cmp>.<ftype>``: ordered comparisons are false and unordered (``...u``) true where an
    operand is NaN; ``num``: neither is, ``nan``: either is. ``-0.0 == +0.0``."""
    if len(mods) != 1:  # (setp.cmp.bop.type: combined with a predicate)
        raise UnknownInstruction(op)
    a, b = decode(v[0], fmt), decode(v[1], fmt)
    unordered = np.isnan(a) | np.isnan(b)
    cmp = mods[0]
    if cmp == "num":
        return ~unordered
    if cmp == "nan":
        return unordered
    if cmp in _CMP:
        return _CMP[cmp](a, b) & ~unordered
    if cmp.endswith("u") and cmp[:-1] in _CMP:
        return _CMP[cmp[:-1]](a, b) | unordered
    raise UnknownInstruction(op)


def _testp(op: str, kind: str, x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    tiny = np.abs(x) < np.float64(2.0 ** -126 if op.endswith("f32") else 2.0 ** -1022)
    table = {"finite": finite, "infinite": np.isinf(x), "number": ~np.isnan(x), "notanumber": np.isnan(x),
             "normal": finite & (x != 0) & ~tiny, "subnormal": finite & (x != 0) & tiny}
    if kind not in table or not op.endswith(("f32", "f64")):
        raise UnknownInstruction(op)
    return table[kind]


def _min_max(base: str, nan_mode: bool, fmt: Fmt, v: list[np.ndarray]) -> np.ndarray:
    """``min`` / ``max``: a NaN operand gives the other (both NaN, or either with ``.NaN``: the
    canonical NaN); ``+0.0`` is above ``-0.0`` (PTX ISA, "max": sm_80 and later orders them)."""
    a, b = decode(v[0], fmt), decode(v[1], fmt)
    an, bn = np.isnan(a), np.isnan(b)
    if base == "max":
        pick_a = (a > b) | ((a == b) & ~np.signbit(a))
    else:
        pick_a = (a < b) | ((a == b) & np.signbit(a))
    out = np.where(pick_a, v[0], v[1])
    out = np.where(an & ~bn, v[1], np.where(bn & ~an, v[0], out))
    nan = (an | bn) if nan_mode else (an & bn)
    return np.where(nan, U64(fmt.nan), out)


def _arith(base: str, mode: str, fmt: Fmt, x: list[np.ndarray]) -> np.ndarray:
    """``add`` (``sub`` with ``-b``), ``mul``, ``fma``: exactly rounded."""
    with np.errstate(invalid="ignore", over="ignore"):
        if base == "mul":
            special = np.float64(x[0] * x[1])
        else:
            special = x[0] + x[1] if base == "add" else x[0] * x[1] + x[2]
    finite = np.logical_and.reduce([np.isfinite(a) for a in x])
    if fmt.name == "f64":
        if mode == "rn" and base != "fma":
            return encode(special, fmt)
        ops = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "fma": lambda a, b, c: a * b + c}
        s, sticky = _rational(ops[base], x, finite)
    else:  # an f32 product is exact in float64; a sum of two float64 values is s + e exactly
        xs = [np.where(finite, a, 0.0) for a in x]
        if base == "mul":
            s, sticky = xs[0] * xs[1], np.zeros(len(xs[0]), np.int64)
        else:
            p, c = (xs[0], xs[1]) if base == "add" else (xs[0] * xs[1], xs[2])
            s, e = two_sum(p, c)
            sticky = np.sign(e).astype(np.int64)
    zero = finite & (s == 0) & (sticky == 0)  # an exact zero: its sign by IEEE 754's rules
    if base == "mul":
        s = np.where(zero, special, s)  # (the product of finite values, zero: the signs' xor)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            p, c = (x[0], x[1]) if base == "add" else (x[0] * x[1], x[2])
        s = np.where(zero, np.where(zero_sum_negative(p, c, mode), -0.0, 0.0), s)
    s = np.where(finite, s, special)
    return encode(s, fmt, mode, np.where(finite, sticky, 0))


def _div_sqrt(base: str, mode: str, fmt: Fmt, x: list[np.ndarray]) -> np.ndarray:
    """``div`` (``rcp``: ``1 / x``) and ``sqrt``: exactly rounded."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        special = np.sqrt(x[0]) if base == "sqrt" else x[0] / x[1]
    if mode == "rn":  # float64 (IEEE), then once more to a format of at most 24 bits: exact
        return encode(special, fmt)
    if base == "sqrt":
        regular = np.isfinite(x[0]) & (x[0] > 0)
        s = np.where(regular, special, 0.0)
        sticky = np.array([_sign(Fraction(float(a)) - Fraction(float(r)) ** 2) if ok else 0
                           for a, r, ok in zip(x[0], s, regular, strict=True)], np.int64)
        return encode(np.where(regular, s, special), fmt, mode, sticky)
    regular = np.isfinite(x[0]) & np.isfinite(x[1]) & (x[0] != 0) & (x[1] != 0)
    s, sticky = _rational(lambda a, b: a / b, x, regular)
    return encode(np.where(regular, s, special), fmt, mode, np.where(regular, sticky, 0))


def _rational(fn: Callable[..., Fraction], x: list[np.ndarray], lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per lane of ``lanes``: the exact value of ``fn`` on the operands as (float64 nearest, sign of
    the rest); a nearest value past float64's range is infinite with a nonzero rest. Elsewhere 0."""
    s, sticky = np.zeros(len(x[0])), np.zeros(len(x[0]), np.int64)
    for lane in np.flatnonzero(lanes):
        q = fn(*(Fraction(float(a[lane])) for a in x))
        try:
            near = q.numerator / q.denominator
        except OverflowError:
            s[lane], sticky[lane] = math.inf * _sign(q), -_sign(q)
            continue
        s[lane], sticky[lane] = near, _sign(q - Fraction(near))
    return s, sticky


def _sign(q: Fraction) -> int:
    return (q > 0) - (q < 0)
