"""Float arithmetic of the interpreter that models the instructions the GPU backend emits, where
numpy's own function computes something else (``docs/language.md`` §Promotion and arithmetic):

* float ``%`` is ``x - trunc(x / y) * y`` with the quotient rounded and one fused multiply-add,
  ``x`` itself where ``y`` is infinite (what ``backend/lower/elementwise.py`` emits: ``div.rn``,
  ``cvt.rzi``, ``fma.rn``, ``abs`` and ``setp.eq`` with infinity, ``selp``), not the exact ``fmod``;
* float ``**`` is ``2 ** (y * log2(x))`` in f32 (``lg2.approx``, ``ex2.approx``): NaN for a
  negative base, and ``0 ** 0`` is NaN;
* float ``//`` is ``floor`` of the quotient rounded to the operands' type;
* float -> integer conversion saturates at every width (64-bit included) and maps NaN to 0;
* float ``maximum`` / ``minimum`` and the ``max`` / ``min`` reductions skip NaN and order
  ``+0.0 > -0.0`` (:func:`gpu_max`, :func:`gpu_min`, :func:`gpu_reduce_max_min`), as PTX ``max`` /
  ``min`` do, where numpy's ``fmax`` / ``fmin`` return either zero;
* the flushes to zero of the instructions that flush (``rcp.approx.ftz`` in ``sigmoid``, an
  ``atom.add.f32`` on global memory): :func:`flush_f32_subnormals`;
* the conversions of every type (:func:`cast_array`), tf32 rounding as ``cvt.rna`` and as a tensor
  core reads unrounded f32 (:func:`tf32_round`, :func:`tf32_truncate`), and the rounding of every
  float result to its type (:func:`round_float`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np

from ..ir import types as T


def float_to_int(a: np.ndarray, ddt: np.dtype) -> np.ndarray:
    """``a`` (floats) truncated toward zero and saturated to the integer dtype ``ddt``, NaN -> 0,
    as PTX ``cvt.rzi.sat`` (``cvt.rzi.s64.f32`` saturates too). The bounds are compared in float64
    where they are exact (-2**63, 2**64), so 64-bit results do not wrap."""
    x = np.trunc(np.asarray(a).astype(np.float64))
    info = np.iinfo(ddt)
    lo, hi = float(info.min), float(info.max) + 1.0  # both powers of two (or 0): exact in float64
    inside = (x >= lo) & (x < hi)
    out = np.where(inside, x, 0).astype(ddt)
    # the bounds as ``ddt`` values, not Python ints: numpy 1.x promoted a 0-d u64 with the int 0 to f64
    out = np.where(x >= hi, np.array(info.max, ddt), out)
    out = np.where(x < lo, np.array(info.min, ddt), out)
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


def tf32_round(a: Any) -> np.ndarray:
    """f32 values rounded to tf32 (10 mantissa bits) to nearest, ties away from zero: what
    ``x.to(tf32)`` computes on the GPU (``cvt.rna.tf32.f32``, PTX ISA 9.7.9.21). NaN stays NaN."""
    x = np.asarray(a, np.float32)
    # u64 constants: numpy 1.x made a 0-d u64 plus a Python int a float64 (and `&` then failed)
    bits = (x.view(np.uint32).astype(np.uint64) + np.uint64(0x1000)) & np.uint64(0xFFFFE000)
    return np.where(np.isnan(x), x, bits.astype(np.uint32).view(np.float32))


def tf32_truncate(a: Any) -> np.ndarray:
    """f32 values as a tensor core reads them for a tf32 MMA when they were not rounded first:
    the low 13 mantissa bits are dropped (rounding toward zero). Measured on the H200 for
    ``wgmma.mma_async.sp`` with f32 data loaded by TMA: 1 + 3*2^-12 is read as 1 (docs/hopper.md).
    NaN stays NaN."""
    x = np.asarray(a, np.float32)
    bits = x.view(np.uint32) & np.uint32(0xFFFFE000)
    return np.where(np.isnan(x), x, bits.view(np.float32))


def round_float(r: Any, elem: T.ScalarType) -> np.ndarray:
    """A float result (any float dtype) rounded to the float type ``elem``: to nearest even, and
    for the 8-bit floats through f32 with saturation, as every op on them is lowered."""
    r = np.asarray(r)
    if elem.bits < 16:
        return cast_array(r, T.f32, elem)
    with np.errstate(over="ignore"):  # beyond the type's range: an infinity, as on the GPU
        if elem.bits == 32:  # tf32 values are held, and computed on, as f32 (as on the GPU)
            r = r.astype(np.float32)
        return r.astype(elem.numpy_dtype)


def cast_array(a: np.ndarray, src: T.ScalarType, dst: T.ScalarType) -> np.ndarray:
    """Elementwise conversion with GPU semantics: float->int truncates toward zero and saturates
    (PTX ``cvt.rzi.sat``, 64-bit integers included), NaN -> 0; int->float and float->float round
    to nearest even; to an 8-bit float saturates (from integers too). A value beyond the range of a
    float type becomes an infinity, as on the GPU, without numpy's overflow warning."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _cast_array(a, src, dst)


def _cast_array(a: np.ndarray, src: T.ScalarType, dst: T.ScalarType) -> np.ndarray:
    ddt = dst.numpy_dtype
    if dst.is_bool:
        return a != 0
    if src.is_float and dst.is_int:
        return float_to_int(a, ddt)
    if dst.name == "tf32":
        return tf32_round(a)
    if dst.name == "bf16" and src.is_int and not src.is_bool and src.bits >= 32:
        return int_to_bf16(a)
    if dst.name == "bf16" and src.name == "f64":
        return f64_to_bf16(a)
    if dst.is_float and dst.bits < 16:
        # as the GPU: through f32, then cvt.rn.satfinite (out-of-range values and infinities
        # clamp to the largest finite value, NaN stays NaN), where a plain cast would give NaN/inf
        x = a.astype(np.float32)
        if dst.name in ("e4m3", "e5m2"):
            top = np.float32(ml_dtypes.finfo(ddt).max)
            x = np.clip(x, -top, top)
        return x.astype(ddt)
    return a.astype(ddt)


def gpu_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise maximum of two float arrays as PTX ``max.f32`` / ``max.f16`` / ``max.bf16`` /
    ``max.f64`` compute it (PTX ISA 9.1, §9.7.3.12 "Floating Point Instructions: max" and §9.7.4
    "Half Precision Floating Point Instructions: max"): a NaN operand gives the other operand (NaN
    only when both are), and "if values of both inputs are 0.0, then +0.0 > -0.0", so
    ``maximum(-0.0, 0.0)`` is ``+0.0`` in either order. numpy's ``fmax`` returns one of the two
    zeros depending on the order and the array's dtype (a ReLU ``maximum(x, 0.0)`` kept ``-0.0``)."""
    with np.errstate(all="ignore"):
        r = np.fmax(a, b)
        both_zero = (a == 0) & (b == 0)
        neg = np.signbit(a) & np.signbit(b)  # -0.0 only when both are -0.0
        return np.where(both_zero, np.where(neg, _zero(r, True), _zero(r, False)), r)


def gpu_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise minimum as PTX ``min`` computes it (PTX ISA 9.1, §9.7.3.11 "Floating Point
    Instructions: min", §9.7.4 for 16-bit floats): NaN skipped, and ``-0.0 < +0.0``, so
    ``minimum(0.0, -0.0)`` is ``-0.0`` in either order (see :func:`gpu_max`)."""
    with np.errstate(all="ignore"):
        r = np.fmin(a, b)
        both_zero = (a == 0) & (b == 0)
        neg = np.signbit(a) | np.signbit(b)  # -0.0 when either is -0.0
        return np.where(both_zero, np.where(neg, _zero(r, True), _zero(r, False)), r)


def gpu_reduce_max_min(a: np.ndarray, axis: int, kind: str) -> np.ndarray:
    """The ``max`` / ``min`` reduction of float array ``a`` along ``axis`` as the GPU's tree of
    ``max`` / ``min`` instructions computes it, in any order (:func:`gpu_max`): NaN skipped, and a
    zero result is ``+0.0`` for ``max`` when any element is ``+0.0`` (else ``-0.0``), ``-0.0`` for
    ``min`` when any element is ``-0.0``."""
    with np.errstate(all="ignore"):
        r = np.asarray((np.fmax if kind == "max" else np.fmin).reduce(a, axis=axis))
        zero = a == 0
        if kind == "max":
            neg = ~np.any(zero & ~np.signbit(a), axis=axis)
        else:
            neg = np.any(zero & np.signbit(a), axis=axis)
        return np.where(r == 0, np.where(neg, _zero(r, True), _zero(r, False)), r)


def _zero(like: np.ndarray, negative: bool) -> np.ndarray:
    """``-0.0`` or ``+0.0`` as a 0-d array of ``like``'s dtype."""
    return np.array(-0.0 if negative else 0.0).astype(like.dtype)


F32_MIN_NORMAL = np.float32(2.0**-126)


def flush_f32_subnormals(x: np.ndarray) -> np.ndarray:
    """f32 values with the subnormal ones replaced by a zero of their sign: what an instruction
    with ``.ftz`` does to its inputs and result (PTX ISA 9.1, §9.7.3 "Floating Point Instructions",
    "Subnormal numbers"), and ``atom.add.f32`` on global memory always (§9.7.13.5 "Parallel
    Synchronization and Communication Instructions: atom")."""
    x = np.asarray(x, np.float32)
    return np.where(np.abs(x) < F32_MIN_NORMAL, np.copysign(np.float32(0), x), x).astype(np.float32)


_SIGNIFICAND_AND_MAX_EXPONENT = {"f64": (53, 1023), "f32": (24, 127), "tf32": (24, 127), "bf16": (8, 127),
                                 "f16": (11, 15)}


def int_to_float(n: int, elem: T.ScalarType) -> float:
    """The Python integer ``n`` (any size) as a value of the float type ``elem``, rounded once to
    nearest even, overflowing to infinity: what converting an integer to ``elem`` gives
    (docs/language.md rule 8; PTX ``cvt.rn``). Going through ``float(n)`` first rounded twice above
    2**53 (``2**62 + 2**38 + 1`` became ``2**62`` in f32, not ``2**62 + 2**39``). 8-bit floats go
    through f32 (rounded once) and saturate, as a conversion to them does; tf32 is held as f32."""
    if elem.bits < 16:
        return float(cast_array(np.array(int_to_float(n, T.f32), np.float64), T.f64, elem)[()])
    p, emax = _SIGNIFICAND_AND_MAX_EXPONENT[elem.name]
    m = abs(int(n))
    shift = m.bit_length() - p
    if shift > 0:
        q, rem = m >> shift, m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and q & 1):
            q += 1
        m = q << shift
    if m >= 1 << (emax + 1):
        return -np.inf if n < 0 else np.inf
    return -float(m) if n < 0 else float(m)


def float_to_type(x: float, elem: T.ScalarType) -> float:
    """The Python float ``x`` converted to the float type ``elem`` as a run-time conversion from
    f64 does (rounded once to nearest even; through f32 and saturating for 8-bit floats), as a
    Python float."""
    return float(cast_array(np.array(x, np.float64), T.f64, elem)[()])


def int_to_int(n: int, elem: T.ScalarType) -> int:
    """The Python integer ``n`` converted to the integer type ``elem`` as a run-time conversion
    does: wrapped to its width (two's complement; LLVM ``trunc``, PTX ``cvt`` without ``.sat``)."""
    if elem.is_bool:
        return int(n != 0)
    m = int(n) & ((1 << elem.bits) - 1)
    return m - (1 << elem.bits) if elem.is_signed and m >> (elem.bits - 1) else m


def finite_float_to_int(x: float, elem: T.ScalarType) -> int:
    """The finite float ``x`` converted to the integer type ``elem`` as at run time: truncated toward
    zero and saturated (PTX ``cvt.rzi.sat``, docs/language.md rule 8)."""
    info = np.iinfo(elem.numpy_dtype)
    return max(int(info.min), min(int(info.max), int(x)))


def int_to_bf16(a: np.ndarray) -> np.ndarray:
    """A 32- or 64-bit integer array rounded once to bf16 (to nearest even), as ``cvt.rn.bf16.s32``
    and its kin round (PTX ISA 9.1, §9.7.9.21 "cvt"; docs/language.md rule 8): :func:`int_to_float`
    per element. numpy / ml_dtypes may convert through f32 and round twice (the GPU host's did):
    ``2**24 + 2**16 + 1`` became ``2**24`` (the tie f32 lands on goes to even), not ``2**24 + 2**17``."""
    a = np.asarray(a)
    values = [int_to_float(int(v), T.bf16) for v in a.ravel().tolist()]
    return np.array(values, np.float64).reshape(a.shape).astype(ml_dtypes.bfloat16)  # exact: bf16 values


def f64_to_bf16(a: np.ndarray) -> np.ndarray:
    """An f64 array rounded once to bf16 (to nearest even; ``cvt.rn.bf16.f64``, PTX ISA 9.1 §9.7.9.21
    "cvt"; docs/language.md rule 8). ml_dtypes may convert through f32 and round twice (the GPU host's
    did: ``2**24 + 2**16 + 1`` became ``2**24``, not ``2**24 + 2**17``). Here the f32 step rounds to
    odd (toward zero, the last bit set when inexact), which keeps the one bf16 rounding exact: f32
    has 16 more significand bits than bf16 and the same exponent range."""
    x = np.asarray(a, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        y = x.astype(np.float32)
        finite = np.isfinite(x)
        back = y.astype(np.float64)
        bits = y.view(np.uint32).copy()
        away = finite & (np.abs(back) > np.abs(x))  # RNE went away from zero (to inf, too): one step back
        bits -= away.astype(np.uint32)
        inexact = finite & (bits.view(np.float32).astype(np.float64) != x)
        bits |= inexact.astype(np.uint32)
    return bits.view(np.float32).astype(ml_dtypes.bfloat16)
