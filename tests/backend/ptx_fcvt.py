"""Test helper: PTX ``cvt`` with a float source or destination, for every thread at once (numpy),
exactly as the PTX ISA defines it ("cvt", "cvt with .frnd2 / f8x2 types"):

* float to float: widening is exact; narrowing rounds by ``.rn`` / ``.rz`` / ``.rm`` / ``.rp``
  (``.rna`` to tf32: to nearest, ties away from zero, the 19 bits at the top of an f32 register);
  ``.rni`` / ``.rzi`` / ``.rmi`` / ``.rpi`` on one type round to an integral value;
  ``.satfinite`` clamps to the largest finite value (NaN stays NaN). The packed 8-bit forms:
  ``cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 d, a, b`` (``a`` in the upper byte) and
  ``cvt.rn.f16x2.{e4m3x2,e5m2x2} d, a`` (the low byte to the low half);
* float to integer (``.rni`` / ``.rzi`` / ``.rmi`` / ``.rpi``): rounded to an integer, clamped to
  the destination's range (PTX saturates every float-to-integer conversion), NaN gives 0;
* integer to float (``.rn`` / ``.rz`` / ``.rm`` / ``.rp``): the integer's exact value rounded.

``.ftz``, ``.relu`` and ``.sat`` to a float type are :class:`UnknownInstruction` (not modeled).
"""

from __future__ import annotations

import numpy as np

from .address_eval import UnknownInstruction
from .ptx_fround import FORMATS, U64, decode, encode, fmt_of, two_sum
from .ptx_ops import convert as integer_convert
from .ptx_ops import sext, wrap

_IRND = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}
_FRND = ("rn", "rz", "rm", "rp", "rna")
_F8X2 = ("e4m3x2", "e5m2x2")


def _is_int(t: str) -> bool:
    return t[:1] in ("s", "u") and t[1:].isdigit()


def convert(op: str, v: list[np.ndarray]) -> np.ndarray:
    """The result bits of ``cvt...`` ``op`` on the operand bits ``v``."""
    parts = op.split(".")
    dst, src, mods = parts[-2], parts[-1], parts[1:-2]
    if _is_int(dst) and _is_int(src):
        return integer_convert(op, v[0])
    rnd = [m for m in mods if m in _FRND or m in _IRND]
    flags = [m for m in mods if m not in rnd]
    if len(rnd) > 1 or any(f not in ("sat", "satfinite") for f in flags):
        raise UnknownInstruction(op)
    mode = rnd[0] if rnd else None
    sat, satfinite = "sat" in flags, "satfinite" in flags
    if sat and not _is_int(dst):
        raise UnknownInstruction(op)
    if dst in _F8X2 and src == "f32" and mode == "rn" and satfinite and not sat:
        fmt = fmt_of(dst[:-2])
        hi, lo = (encode(decode(a, FORMATS["f32"]), fmt, "rn", satfinite=True) for a in v[:2])
        return (hi << U64(8)) | lo
    if dst == "f16x2" and src in _F8X2 and mode == "rn" and not flags:
        fmt = fmt_of(src[:-2])
        halves = [encode(decode((v[0] >> U64(8 * j)) & U64(0xFF), fmt), FORMATS["f16"]) for j in (0, 1)]
        return halves[0] | (halves[1] << U64(16))
    if _is_int(dst):
        if mode not in _IRND or satfinite:
            raise UnknownInstruction(op)  # (a float-to-integer conversion needs an integer rounding)
        return _to_int(dst, _IRND[mode](decode(v[0], fmt_of(src))))
    if _is_int(src):
        if mode not in _FRND[:4] or satfinite:
            raise UnknownInstruction(op)
        s, sticky = _int_value(src, v[0])
        return encode(s, fmt_of(dst), mode, sticky)
    return _float_to_float(op, dst, src, mode, satfinite, v[0])


def _float_to_float(op: str, dst: str, src: str, mode: str | None, satfinite: bool,
                    x: np.ndarray) -> np.ndarray:
    fin, fout = fmt_of(src), fmt_of(dst)
    val = decode(x, fin)
    if mode in _IRND:
        if dst != src or satfinite:
            raise UnknownInstruction(op)
        with np.errstate(invalid="ignore"):
            return encode(_IRND[mode](val), fout)
    if dst == "tf32":  # (its 19 bits at the top of the f32 register)
        if src != "f32" or mode != "rna":
            raise UnknownInstruction(op)
        return encode(val, fout, "rna", satfinite=satfinite) << U64(13)
    widening = fout.mbits >= fin.mbits and fout.ebits >= fin.ebits
    if (mode is None) != widening or mode == "rna" or not fout.has_inf:
        raise UnknownInstruction(op)  # (narrowing needs a rounding; widening has none)
    return encode(val, fout, mode or "rn", satfinite=satfinite)


def _to_int(dst: str, r: np.ndarray) -> np.ndarray:
    """Integral float64 values ``r`` clamped to integer type ``dst`` (NaN: 0), as its bits."""
    width = int(dst[1:])
    lo, hi = (-(2.0 ** (width - 1)), 2.0 ** (width - 1)) if dst[0] == "s" else (0.0, 2.0**width)
    with np.errstate(invalid="ignore"):
        ok = (r >= lo) & (r < hi)  # (powers of two: exact bounds; false for NaN)
        safe = np.where(ok, r, 0.0)
        out = safe.astype(np.int64).astype(U64) if dst[0] == "s" else safe.astype(U64)
        top = (1 << (width - 1)) - 1 if dst[0] == "s" else (1 << width) - 1
        out = np.where(r >= hi, U64(top), out)
        out = np.where(r < lo, U64(((1 << 64) - (1 << (width - 1))) if dst[0] == "s" else 0), out)
    return wrap(out, width)


def _int_value(src: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer operand's exact value as (float64 nearest, sign of the rest): its high and low
    32 bits are exact in float64, and their sum is exact as ``s + e``."""
    width = int(src[1:])
    bits = sext(x, width) if src[0] == "s" else wrap(x, width)
    low = (bits & U64(0xFFFFFFFF)).astype(np.float64)
    high = (bits >> U64(32)).astype(np.uint32)
    high_val = high.view(np.int32).astype(np.float64) if src[0] == "s" else high.astype(np.float64)
    s, e = two_sum(high_val * 2.0**32, low)
    return s, np.sign(e).astype(np.int64)
