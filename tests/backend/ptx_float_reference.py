"""Test helper: an independent model of PTX float results for the unit tests of
tests/backend/ptx_float.py and ptx_fcvt.py: exact rationals (:class:`fractions.Fraction`) rounded
once by every PTX rounding (tests/support/op_table_reference.py's formats), and the operands'
values read with numpy's and ml_dtypes' own types, not with tests/backend/ptx_fround.py."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from sparsile.tests.support.op_table_reference import FMTS

INF = math.inf
NUMPY_TYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16}
BITS = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8}


def values(bits: np.ndarray, t: str) -> list[float]:
    """The float values of ``t``'s bit patterns (numpy's types; bf16 as the top of an f32; the
    8-bit ones by ml_dtypes)."""
    bits = np.asarray(bits, np.uint64)
    with np.errstate(invalid="ignore"):  # (a signaling NaN stays a NaN)
        return _values(bits, t)


def _values(bits: np.ndarray, t: str) -> list[float]:
    if t in NUMPY_TYPES:
        dt = NUMPY_TYPES[t]
        return bits.astype(f"u{np.dtype(dt).itemsize}").view(dt).astype(np.float64).tolist()
    if t == "bf16":
        return (bits << np.uint64(16)).astype(np.uint32).view(np.float32).astype(np.float64).tolist()
    import ml_dtypes

    dt = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[t]
    return bits.astype(np.uint8).view(dt).astype(np.float64).tolist()


def _exponent(q: Fraction) -> int:
    e = q.numerator.bit_length() - q.denominator.bit_length()
    return e - 1 if Fraction(2) ** e > q else e


def round_mode(q: Fraction, t: str, mode: str, *, negative_zero: bool = False, satfinite: bool = False) -> float:
    """The exact real ``q`` rounded once to ``t`` by ``mode`` (``rn``, ``rna``, ``rz``, ``rm``,
    ``rp``); an exact zero is ``-0.0`` when ``negative_zero``; past the largest value: infinity if
    the mode rounds that way (and not ``satfinite``, and ``t`` has one), else the largest value."""
    fmt = FMTS[t]
    if q == 0:
        return -0.0 if negative_zero else 0.0
    sign, a = (-1 if q < 0 else 1), abs(q)
    quantum = Fraction(2) ** (max(_exponent(a), fmt.emin) - fmt.p + 1)
    n, rem = divmod(a, quantum)
    half = quantum / 2
    away = mode in ("rn", "rna") or (mode == "rp" and sign > 0) or (mode == "rm" and sign < 0)
    if mode == "rn":
        n += rem > half or (rem == half and n % 2 == 1)
    elif mode == "rna":
        n += rem >= half
    elif away:
        n += rem > 0
    r = n * quantum
    if r > Fraction(fmt.max):
        return sign * (INF if away and not satfinite and not fmt.saturates else fmt.max)
    return math.copysign(float(r), sign)


def sqrt_rounded(x: float, t: str, mode: str) -> float:
    """``sqrt(x)`` of a positive finite ``x`` rounded by ``mode``: from its floor to 700 fractional
    bits (finer than any rounding boundary of a square root in f64), nudged up when inexact."""
    q = Fraction(x)
    k = 700
    scaled = q * 4**k
    root = math.isqrt(scaled.numerator // scaled.denominator)
    exact = Fraction(root) ** 2 == scaled
    value = Fraction(root, 2**k) + (0 if exact else Fraction(1, 2 ** (k + 1)))
    return round_mode(value, t, mode)


def same(x: float, y: float) -> bool:
    """Equal values with equal zero signs, or both NaN."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
