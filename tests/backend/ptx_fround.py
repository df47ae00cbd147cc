"""Test helper: the float formats of PTX registers and the exact rounding of a value to one of them,
for every thread at once (numpy), as the PTX ISA defines it (IEEE 754 rounding: ``.rn`` to nearest
even, ``.rz`` toward zero, ``.rm`` down, ``.rp`` up, ``.rna`` to nearest with ties away from zero).

A float register value is a ``uint64`` array of its bits (tests/backend/ptx_ops.py);
:func:`decode` gives the values as float64 (exact for every format here). An exact result is
passed to :func:`encode` as a float64 ``s`` and a ``sticky`` sign: the exact value is ``s`` plus
something of sign ``sticky`` smaller than half an ulp of ``s`` (an error-free transformation's
error term, or the sign of ``exact - s`` from a rational computation). Together they decide every
rounding to a format of at most 53 significand bits exactly, with no second rounding: the
coarser format's rounding only needs to know on which side of ``s`` the exact value lies.

NaN results are given as the format's canonical NaN (:data:`Fmt.nan`); tests compare NaN-ness only
where the language promises "a NaN" (docs/language.md rule 9).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .address_eval import UnknownInstruction

U64 = np.uint64
MODES = ("rn", "rz", "rm", "rp", "rna")


@dataclass(frozen=True)
class Fmt:
    """A binary float format: ``ebits`` exponent bits, ``mbits`` stored significand bits; ``has_inf``
    False for e4m3 (the ``fn`` variant: no infinity, ``S.1111.111`` is NaN, 448 the largest value)."""

    name: str
    ebits: int
    mbits: int
    has_inf: bool = True

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    @property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @property
    def sign(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def inf(self) -> int:
        """The bits of +infinity (e4m3: of its NaN, the first pattern past the largest value)."""
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else (1 << (self.bits - 1)) - 1

    @property
    def max(self) -> int:
        """The bits of the largest finite value."""
        return self.inf - 1

    @property
    def nan(self) -> int:
        """The canonical NaN's bits (the quiet NaN with every payload bit set)."""
        return (1 << (self.bits - 1)) - 1


FORMATS = {"f64": Fmt("f64", 11, 52), "f32": Fmt("f32", 8, 23), "f16": Fmt("f16", 5, 10), "bf16": Fmt("bf16", 8, 7),
           "tf32": Fmt("tf32", 8, 10), "e4m3": Fmt("e4m3", 4, 3, has_inf=False), "e5m2": Fmt("e5m2", 5, 2)}
"""The formats by PTX type name (tf32: its 19 bits; in a register they are the top of an f32)."""


def fmt_of(name: str) -> Fmt:
    if name not in FORMATS:
        raise UnknownInstruction(f"the float type .{name}")
    return FORMATS[name]


def decode(bits: np.ndarray, fmt: Fmt) -> np.ndarray:
    """The values of ``bits`` (the low ``fmt.bits`` of each element) as float64."""
    bits = np.asarray(bits, U64) & U64((1 << fmt.bits) - 1 if fmt.bits < 64 else 0xFFFFFFFFFFFFFFFF)
    if fmt.name == "f64":
        return bits.view(np.float64).copy()
    if fmt.name == "f32":
        with np.errstate(invalid="ignore"):  # (a signaling NaN stays a NaN)
            return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    e = ((bits >> U64(fmt.mbits)) & U64((1 << fmt.ebits) - 1)).astype(np.int64)
    f = (bits & U64((1 << fmt.mbits) - 1)).astype(np.int64)
    normal = e > 0
    sig = np.where(normal, f + (1 << fmt.mbits), f).astype(np.float64)
    mag = np.ldexp(sig, np.maximum(e, 1) - fmt.bias - fmt.mbits)
    top = e == (1 << fmt.ebits) - 1
    if fmt.has_inf:
        mag = np.where(top, np.where(f == 0, np.inf, np.nan), mag)
    else:
        mag = np.where(top & (f == (1 << fmt.mbits) - 1), np.nan, mag)
    neg = (bits & U64(fmt.sign)) != 0
    return np.where(neg, -mag, mag)


def is_nan(bits: np.ndarray, fmt: Fmt) -> np.ndarray:
    return np.isnan(decode(bits, fmt))


def encode(s: np.ndarray, fmt: Fmt, mode: str = "rn", sticky: np.ndarray | None = None,
           satfinite: bool = False) -> np.ndarray:
    """The bits of the exact value (``s``, ``sticky``: see the module) rounded to ``fmt`` by
    ``mode``. An infinite ``s`` with a nonzero ``sticky`` stands for a finite value past float64's
    range (it rounds as an overflow). Overflow gives infinity where the mode rounds away from zero
    (``.rn``, ``.rna``, and ``.rp`` / ``.rm`` on their side), else the largest finite value;
    ``satfinite`` clamps infinities (and overflows) to the largest finite value, NaN staying NaN.
    A format without infinity (e4m3) is only rounded ``satfinite``."""
    if mode not in MODES:
        raise UnknownInstruction(f"the rounding .{mode}")
    if not fmt.has_inf and not satfinite:
        raise UnknownInstruction(f"a conversion to .{fmt.name} without .satfinite")
    s = np.asarray(s, np.float64)
    sticky = np.zeros(s.shape, np.int64) if sticky is None else np.asarray(sticky, np.int64)
    neg = np.signbit(s)
    nan = np.isnan(s)
    inf = np.isinf(s)
    mag = np.where(nan | inf, 0.0, np.abs(s))
    smag = np.where(neg, -sticky, sticky)  # the sticky sign in magnitude terms
    emin = 1 - fmt.bias
    _, e = np.frexp(mag)
    top = np.maximum(np.where(mag > 0, e - 1, emin), emin)  # the binade's exponent (subnormals: emin's)
    scaled = np.ldexp(mag, -(top - fmt.mbits))  # exact: a power-of-two scaling into [0, 2**(mbits+1))
    n = np.floor(scaled)
    frac = scaled - n
    trunc = (((top - emin).astype(np.int64) << fmt.mbits).astype(U64) + n.astype(U64))
    up = np.where(neg, mode == "rm", mode == "rp")  # rounds the magnitude up
    down = np.where(neg, mode == "rp", mode == "rm") | (mode == "rz")
    if mode == "rn":
        half_up = (frac > 0.5) | ((frac == 0.5) & ((smag > 0) | ((smag == 0) & ((trunc & U64(1)) == U64(1)))))
        inc = half_up
    elif mode == "rna":
        inc = (frac > 0.5) | ((frac == 0.5) & (smag >= 0))
    else:
        inc = up & ((frac > 0) | (smag > 0))
    dec = down & (frac == 0) & (smag < 0) & (trunc > U64(0))
    out = trunc + inc.astype(U64) - dec.astype(U64)
    away = (mode in ("rn", "rna")) | up
    over = (out > U64(fmt.max)) | (inf & (sticky != 0))
    out = np.where(over, np.where(away & (not satfinite) & fmt.has_inf, U64(fmt.inf), U64(fmt.max)), out)
    out = np.where(inf & (sticky == 0), U64(fmt.max if satfinite or not fmt.has_inf else fmt.inf), out)
    out = out | np.where(neg, U64(fmt.sign), U64(0))
    return np.where(nan, U64(fmt.nan), out)


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's error-free sum: ``s = fl(a + b)`` and ``e`` with ``a + b == s + e`` exactly (finite
    values whose sum does not overflow float64)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def zero_sum_negative(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """The sign of an exact zero sum ``a + b`` (IEEE 754 §6.3): that of the operands if both are
    zeros of one sign, else negative only when rounding down."""
    same = (a == 0) & (b == 0) & (np.signbit(a) == np.signbit(b))
    return np.where(same, np.signbit(a), mode == "rm")
