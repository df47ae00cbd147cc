"""Float arithmetic of the interpreter that models the instructions the GPU backend emits, where
numpy's own function computes something else (``docs/language.md`` §Promotion and arithmetic):

* float ``%`` is ``x - trunc(x / y) * y`` with the quotient rounded and one fused multiply-add,
  ``x`` itself where ``y`` is infinite (what ``backend/lower/elementwise.py`` emits: ``div.rn``,
  ``cvt.rzi``, ``fma.rn``, ``abs`` and ``setp.eq`` with infinity, ``selp``), not the exact ``fmod``;
* float ``**`` is ``2 ** (y * log2(x))`` in f32 (``lg2.approx``, ``ex2.approx``): NaN for a
  negative base, and ``0 ** 0`` is NaN;
* float ``//`` is ``floor`` of the quotient rounded to the operands' type;
* float -> integer conversion saturates at every width (64-bit included) and maps NaN to 0.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def float_to_int(a: np.ndarray, ddt: np.dtype) -> np.ndarray:
    """``a`` (floats) truncated toward zero and saturated to the integer dtype ``ddt``, NaN -> 0,
    as PTX ``cvt.rzi.sat`` (``cvt.rzi.s64.f32`` saturates too). The bounds are compared in float64
    where they are exact (-2**63, 2**64), so 64-bit results do not wrap."""
    x = np.trunc(np.asarray(a).astype(np.float64))
    info = np.iinfo(ddt)
    lo, hi = float(info.min), float(info.max) + 1.0  # both powers of two (or 0): exact in float64
    inside = (x >= lo) & (x < hi)
    out = np.where(inside, x, 0).astype(ddt)
    out = np.where(x >= hi, info.max, out)
    out = np.where(x < lo, info.min, out)
    return np.asarray(out, ddt)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` of float32 arrays rounded once to float32 (PTX ``fma.rn.f32``): the product is
    exact in float64; the sum is rounded to odd in float64 (its lost bits kept as a sticky last
    bit), which makes the final rounding to float32 a correct single rounding."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    with np.errstate(all="ignore"):
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)  # s + err == p + c exactly (TwoSum)
        even = (s.view(np.uint64) & np.uint64(1)) == 0
        nudge = np.isfinite(s) & (err != 0) & even
        s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def _fma_exact(a: float, b: float, c: float) -> float:
    """``a * b + c`` rounded once to float64 (exact rational arithmetic; inf/NaN as IEEE)."""
    if not all(np.isfinite((a, b, c))):
        return a * b + c
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def gpu_fmod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """Float ``%`` as the GPU computes it: ``fma(-trunc(x / y), y, x)``, or ``x`` where ``|y|`` is
    infinite. Types under 32 bits compute in f32 (the caller rounds the result to its type), f64
    in f64. Equals ``fmod`` while the quotient is small; off by multiples of ``y`` when ``x / y``
    rounds (``1e10 % 3.0`` is 256 in f32, where fmod gives 1)."""
    with np.errstate(all="ignore"):
        if bits == 64:
            x, y = a.astype(np.float64), b.astype(np.float64)
            t = np.trunc(x / y)
            r = np.vectorize(_fma_exact, otypes=[np.float64])(-t, y, x) if x.size else x.copy()
        else:
            x, y = a.astype(np.float32), b.astype(np.float32)
            t = np.trunc((x.astype(np.float64) / y.astype(np.float64)).astype(np.float32))
            r = fma_f32(-t, y, x)
        return np.where(np.isinf(y), x, r)


def gpu_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Float ``x ** y`` as the GPU computes it, in f32: ``exp2(y * log2(x))`` (PTX ``lg2.approx``
    and ``ex2.approx``; this model rounds each step correctly, the GPU's are within 2 ulp)."""
    with np.errstate(all="ignore"):
        x, y = a.astype(np.float32), b.astype(np.float32)
        return np.exp2((y * np.log2(x)).astype(np.float32)).astype(np.float32)
