"""The interpreter's conversions (``frontend/interp/numerics.py`` ``cast_array``) for every pair of
scalar types, against exact rational arithmetic that models what the GPU code computes
(docs/language.md rule 8; ``backend/lower/elementwise.py`` ``cast_value``):

* float -> integer truncates toward zero and saturates, NaN gives 0; integer -> integer wraps;
  anything -> bool is ``!= 0`` (NaN is true);
* to ``e4m3`` / ``e5m2``: to f32 to nearest even first (one ``cvt.rn.f32``; exact from the 16-bit
  floats and small integers), then to nearest even and saturating (``cvt.rn.satfinite``);
* to ``tf32``: to f32 as above, then to 10 mantissa bits, ties away from zero (``cvt.rna.tf32.f32``);
* every other conversion rounds once to nearest even, overflowing to infinity.

Inputs and outputs are built and read from their bits here, so neither the reference nor the
check depends on how the installed numpy or ml_dtypes round (one GPU host's ml_dtypes rounded
f64 -> bf16 through f32, twice). The inputs sit on, and next to, the ties of every destination, where
one rounding and two part ways."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import NamedTuple

import numpy as np
import pytest

from sparsile.frontend.interp.numerics import cast_array
from sparsile.frontend.ir import types as T
from sparsile.tests.support import program_gen


class Fmt(NamedTuple):
    """A binary float format: exponent and stored mantissa bits, and whether the all-ones exponent
    is infinity/NaN (IEEE) or ordinary values with only all-ones bits NaN (``e4m3``, "fn")."""

    ebits: int
    mbits: int
    ieee: bool = True

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @property
    def p(self) -> int:
        return self.mbits + 1

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def max(self) -> Fraction:
        top = (1 << self.ebits) - (2 if self.ieee else 1)
        m = (1 << self.mbits) - (1 if self.ieee else 2)  # e4m3: S.1111.111 is NaN
        return Fraction((1 << self.mbits) + m, 1 << self.mbits) * Fraction(2) ** (top - self.bias)


FMT = {"f64": Fmt(11, 52), "f32": Fmt(8, 23), "tf32": Fmt(8, 23), "f16": Fmt(5, 10), "bf16": Fmt(8, 7),
       "e4m3": Fmt(4, 3, ieee=False), "e5m2": Fmt(5, 2)}
UINT = {64: np.uint64, 32: np.uint32, 16: np.uint16, 8: np.uint8}
FLOATS = ["f64", "f32", "tf32", "f16", "bf16", "e4m3", "e5m2"]
INTS = ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]
NAN = "nan"

Value = Fraction | float | str  # exact value; +-inf as floats; a zero's sign as float +-0.0; NaN


def _type(name: str) -> T.ScalarType:
    return T.bool_ if name == "bool" else getattr(T, name)


def decode(bits: int, f: Fmt) -> Value:
    """The value of the bit pattern ``bits`` of format ``f``."""
    sign = -1 if bits >> (f.ebits + f.mbits) & 1 else 1
    e = bits >> f.mbits & ((1 << f.ebits) - 1)
    m = bits & ((1 << f.mbits) - 1)
    if f.ieee and e == (1 << f.ebits) - 1:
        return NAN if m else sign * float("inf")
    if not f.ieee and e == (1 << f.ebits) - 1 and m == (1 << f.mbits) - 1:
        return NAN
    if e == 0 and m == 0:
        return 0.0 if sign > 0 else -0.0
    mant = Fraction(m if e == 0 else m + (1 << f.mbits), 1 << f.mbits)
    return sign * mant * Fraction(2) ** (max(e, 1) - f.bias)


def encode(v: Value, f: Fmt) -> int:
    """The bit pattern of the value ``v`` exactly representable in ``f`` (NaN: a quiet one)."""
    top = f.ebits + f.mbits
    if v == NAN:
        return (1 << top) - 1
    if isinstance(v, float) and v == 0:
        return int(np.signbit(v)) << top
    if isinstance(v, float):  # infinity
        return (int(v < 0) << top) | (((1 << f.ebits) - 1) << f.mbits)
    sign, a = int(v < 0), abs(Fraction(v))
    e = max(_exponent(a), f.emin)
    n = a / Fraction(2) ** (e - f.mbits)
    assert n.denominator == 1, (v, f)
    n = int(n)
    biased = e + f.bias if n >> f.mbits else 0
    return (sign << top) | (biased << f.mbits) | (n & ((1 << f.mbits) - 1))


def _exponent(a: Fraction) -> int:
    """floor(log2(a)) of a positive rational."""
    e = a.numerator.bit_length() - a.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > a else e


def round_to(v: Value, f: Fmt, *, away: bool = False, saturate: bool = False) -> Value:
    """``v`` rounded once to ``f``: to nearest, ties to even (or away from zero), overflowing to
    infinity (or, ``saturate``, to the largest finite value, infinities too). A zero keeps its sign;
    a nonzero value rounding to zero gets the value's sign."""
    if v == NAN:
        return NAN
    if isinstance(v, float):
        if v == 0 or not saturate:
            return v
        return f.max if v > 0 else -f.max
    a = abs(v)
    q = Fraction(2) ** (max(_exponent(a), f.emin) - f.mbits)
    n, r = divmod(a, q)
    n = int(n)
    if r * 2 > q or (r * 2 == q and (away or n % 2)):
        n += 1
    out = n * q
    if out > f.max:
        out = f.max if saturate else float("inf")
    if out == 0:
        return -0.0 if v < 0 else 0.0
    return -out if v < 0 else out


def reference(v: Value, src: str, dst: str) -> Value:
    """What converting the exact value ``v`` of type ``src`` to ``dst`` gives on the GPU (a conversion
    to the same type is none: ``cast_value`` returns the value, an e5m2 infinity too)."""
    if src == dst:
        return v
    if dst == "bool":
        return Fraction(int(v == NAN or v != 0))
    if dst in INTS:
        t = _type(dst)
        info = np.iinfo(t.numpy_dtype)
        if src in FLOATS:
            if v == NAN:
                return Fraction(0)
            if isinstance(v, float):
                return Fraction(0 if v == 0 else (int(info.max) if v > 0 else int(info.min)))
            n = int(v)  # toward zero
            return Fraction(max(int(info.min), min(int(info.max), n)))
        m = int(v) & ((1 << t.bits) - 1)
        return Fraction(m - (1 << t.bits) if t.is_signed and m >> (t.bits - 1) else m)
    if dst in ("e4m3", "e5m2", "tf32"):
        x = v if src in ("f32", "tf32") else round_to(v, FMT["f32"])
        if dst == "tf32":
            return round_to(x, FMT["tf32"]._replace(mbits=10), away=True)
        return round_to(x, FMT[dst], saturate=True)
    if src in INTS and v == 0:
        return 0.0
    return round_to(v, FMT[dst])


_REFERENCES: dict[str, dict[tuple, Value]] = {}
"""What :func:`reference` gave, by source type, then by value (its type and a float's sign in the key:
``0.0``, ``-0.0`` and ``Fraction(0)`` are equal and hash alike but convert differently) and destination
type. A source type's entries (some 20,000, a few MB) are dropped by the last test that reads them."""


def remembered_reference(v: Value, src: str, dst: str) -> Value:
    """:func:`reference`, computed once per value and pair of types in this process: both tests of a
    source type convert its thousands of values next to the ties (the same values in both) to nearly
    every type, which was most of their time (exact rational arithmetic in Python)."""
    known = _REFERENCES.setdefault(src, {})
    key = (type(v), v, math.copysign(1.0, v) if isinstance(v, float) else 1.0, dst)
    found = known.get(key)
    if found is None:
        found = known[key] = reference(v, src, dst)
    return found


@pytest.fixture(scope="module", autouse=True)
def _forget_references() -> Iterator[None]:
    """No remembered conversions outlive the module (where its last test did not run: ``-k``)."""
    yield
    _REFERENCES.clear()


def inputs(src: str, rng: np.random.Generator) -> list[Value]:
    """Values of ``src``: specials, random bit patterns, and values on and next to the ties of
    every destination format (and next to f32's, so that rounding through f32 lands on a tie)."""
    if src == "bool":
        return [Fraction(0), Fraction(1)]
    if src in INTS:
        t = _type(src)
        info = np.iinfo(t.numpy_dtype)
        lo, hi = int(info.min), int(info.max)
        vals = {lo, hi, 0, 1, -1, 7}
        vals |= {int(x) for x in rng.integers(lo, hi, 200, dtype=t.numpy_dtype, endpoint=True)}
        for mbits in (2, 3, 7, 10, 23):
            for k in range(mbits + 2, t.bits + 1):
                for d in (-1, 0, 1, 2 ** max(k - 25, 0) + 1):
                    base = 2**k + 2 ** (k - mbits - 1)  # a tie of mbits stored bits
                    vals |= {base + d, base + 2 ** (k - mbits) + d, -(base + d)}
        return [Fraction(v) for v in sorted(vals) if lo <= v <= hi]
    f = FMT[src]
    width = f.ebits + f.mbits + 1
    raw = rng.integers(0, 1 << width, 300, dtype=np.uint64, endpoint=False) if width < 64 else \
        rng.integers(0, np.iinfo(np.uint64).max, 300, dtype=np.uint64, endpoint=True)
    if src == "tf32":
        raw = raw & np.uint64(0xFFFFE000)
    vals: list[Value] = [decode(int(b), f) for b in raw]
    vals += [0.0, -0.0, NAN, f.max, -f.max, Fraction(2) ** (f.emin - f.mbits)]
    vals += [float("inf"), float("-inf")] if f.ieee else []
    near: list[Fraction] = []
    for mbits in (2, 3, 7, 10, 23):
        for e in range(-150, 130, 3):
            tie = (Fraction(2) ** mbits * 2 + 1) * Fraction(2) ** (e - mbits - 1)
            ulp = Fraction(2) ** (e - f.mbits)
            for d in (0, 1, -1, 3):
                near += [tie + d * ulp, -(tie - d * ulp)]
            near.append(tie + Fraction(2) ** (e - 24))  # rounds through f32 onto the tie
    for x in near:
        r = round_to(x, f if src != "tf32" else f._replace(mbits=10))
        if isinstance(r, Fraction) and r != 0:
            vals.append(r)
    return vals


def _array(vals: list[Value], t: str) -> np.ndarray:
    """An array of type ``t`` holding ``vals``, built from bits (floats) or exact integers."""
    dt = _type(t).numpy_dtype
    if t in INTS:
        return np.array([int(v) for v in vals], dtype=object).astype(dt)
    f = FMT[t]
    bits = np.array([encode(v, f) for v in vals], UINT[f.ebits + f.mbits + 1])
    return bits.view(dt)


def _read(a: np.ndarray, t: str) -> list[Value]:
    """The values of the array ``a`` of type ``t``, from their bits."""
    if t == "bool":
        return [Fraction(int(x)) for x in a.ravel().tolist()]
    if t in INTS:
        return [Fraction(int(x)) for x in a.ravel().tolist()]
    f = FMT[t]
    bits = np.ascontiguousarray(a).view(UINT[f.ebits + f.mbits + 1])
    return [decode(int(b), f) for b in bits.ravel().tolist()]


def _same(a: Value, b: Value) -> bool:
    if isinstance(a, float) or isinstance(b, float) or a == NAN or b == NAN:
        return type(a) is type(b) and (a == b if a != NAN else True) and \
            (a == NAN or b == NAN or np.signbit(float(a)) == np.signbit(float(b)))
    return a == b


def test_the_reference_formats() -> None:
    """The format table decodes each type's largest value and smallest subnormal as documented."""
    assert FMT["e4m3"].max == 448 and FMT["e5m2"].max == 57344 and FMT["f16"].max == 65504
    assert FMT["bf16"].max == Fraction(255, 128) * Fraction(2) ** 127
    assert decode(0x0001, FMT["f16"]) == Fraction(2) ** -24 and decode(0x7F, FMT["e4m3"]) == NAN
    assert round_to(Fraction(2**24 + 2**16 + 1), FMT["bf16"]) == 2**24 + 2**17
    assert round_to(Fraction(464), FMT["e4m3"], saturate=True) == 448  # a tie to even, below the clamp


def test_the_remembered_reference_tells_equal_values_of_other_kinds_apart() -> None:
    """0.0, -0.0 and Fraction(0) (equal, hashed alike) each get their own conversion, whichever came first."""
    for order in ((0.0, -0.0, Fraction(0)), (Fraction(0), -0.0, 0.0)):
        _REFERENCES.clear()
        for v in order:
            for dst in ("f16", "i8", "e4m3"):
                got, want = remembered_reference(v, "f32", dst), reference(v, "f32", dst)
                assert type(got) is type(want) and _same(got, want), (v, dst, got, want)
    negative_zero = remembered_reference(-0.0, "f32", "f16")
    assert negative_zero == 0 and math.copysign(1, negative_zero) < 0
    _REFERENCES.clear()


@pytest.mark.parametrize("src", FLOATS + INTS)
def test_every_conversion_rounds_as_the_gpu_does(src: str) -> None:
    rng = np.random.default_rng(sum(map(ord, src)))
    vals = inputs(src, rng)
    x = _array(vals, src)
    assert all(_same(a, b) for a, b in zip(_read(x, src), vals, strict=True))  # the inputs hold the values
    bad = []
    for dst in [t for t in FLOATS + INTS if t != src]:  # sema emits no conversion to the same type
        got = _read(cast_array(x, _type(src), _type(dst)), dst)
        bad += [(dst, v, g, w) for v, g in zip(vals, got, strict=True)
                if not _same(g, w := remembered_reference(v, src, dst))]
    assert not bad, [(d, str(v), str(g), str(w)) for d, v, g, w in bad[:6]] + [len(bad)]


@pytest.mark.parametrize("src", [t for t in FLOATS + INTS if t != "tf32"])
def test_the_program_fuzzers_reference_converts_as_the_gpu_does(src: str) -> None:
    """The program fuzzer's own numpy reference (tests/support/program_gen.py ``convert``) against the
    same exact rounding, for every pair of the types it generates: its verdicts must not depend on the
    installed ml_dtypes either."""
    rng = np.random.default_rng(sum(map(ord, src)) + 1)
    vals = inputs(src, rng)
    x = _array(vals, src)
    bad = []
    for dst in [t for t in FLOATS + INTS if t != "tf32"]:
        got = _read(np.asarray(program_gen.convert(x, src, dst)).astype(_type(dst).numpy_dtype), dst)
        bad += [(dst, v, g, w) for v, g in zip(vals, got, strict=True)
                if not _same(g, w := remembered_reference(v, src, dst))]
    _REFERENCES.pop(src, None)  # (the last test that reads them)
    assert not bad, [(d, str(v), str(g), str(w)) for d, v, g, w in bad[:6]] + [len(bad)]
