"""The cast of a GPU toolkit input to its operand type, with the host toolkit's rules wherever the
array lives (``cast_to_operand`` of :mod:`sparsile.stdlib.sparsity.compress`):

* e4m3 saturates: |x| > 448 (infinities included) becomes ±448, with a ``SaturationWarning`` giving
  the count (ml_dtypes would make them NaN, torch clamps them silently); NaN stays NaN;
* an integer type refuses values it cannot hold (NaN, ±inf, beyond its range: SP0804), where a
  plain cast would wrap them (300 -> 44);
* a float64 (or integer) torch tensor is rounded once, to nearest even, as ml_dtypes and numpy do:
  torch rounds float64 through float32 first (twice, so that 1 + 2**-8 + 2**-30 became 1.0 in
  bf16 instead of 1 + 2**-7); here the float32 step rounds to odd, which makes the second rounding
  exact (float32 has more than two bits beyond every 16- and 8-bit operand's significand).

numpy arrays (what the interpreter and a CPU torch tensor give) go through ``cast_to_operand``
itself, so a weight on the CPU and the same weight on a GPU are cast to the same bits.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from ..sparsity.compress import cast_to_operand, out_of_range, warn_saturated
from ..sparsity.dtypes import OperandType
from .arrays import array_kind, bad_input

E4M3_MAX = 448.0


@cache
def torch_e4m3_cast_saturates() -> bool:
    """Whether torch's own cast to float8_e4m3fn saturates (|x| > 448, infinities included, becomes
    ±448; NaN stays NaN): torch 2.13 does; torch 2.11 and 2.12 make such values NaN (e4m3fn has no
    infinity). Probed once, on the CPU: torch's scalar conversion (c10's ``Float8_e4m3fn(float)``)
    is one host-and-device function, and where a GPU cast saturated on its own the clamp of
    :func:`to_e4m3_saturating` would only be a redundant elementwise pass."""
    import torch

    probe = torch.tensor([1e4, -float("inf")]).to(torch.float8_e4m3fn).float()
    return probe.tolist() == [E4M3_MAX, -E4M3_MAX]


def to_e4m3_saturating(x: Any, want: Any) -> Any:
    """Torch tensor ``x`` cast to e4m3 (``want``) with |x| > 448 saturated to ±448 and NaN kept,
    without a count (that would synchronize the device): torch's own cast where it saturates
    (:func:`torch_e4m3_cast_saturates`), else a clamp first (in float32 for the types clamp cannot
    hold ±448 in or does not take: int8 / uint8 would wrap it, float8 has no clamp). float64 rounds
    once, as the host does (torch's own float64 cast rounds through float32: module doc)."""
    import torch

    if not torch_e4m3_cast_saturates():
        wide = x if x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else x.to(torch.float32)
        x = torch.clamp(wide, -E4M3_MAX, E4M3_MAX)
    if x.dtype == torch.float64:
        x = _round_to_odd_f32(x)
    return x.to(want)


def _round_to_odd_f32(x: Any) -> Any:
    """float64 torch tensor ``x`` as float32, rounded to odd (truncated, last bit set if inexact)."""
    import torch

    near = x.to(torch.float32)
    back = near.to(torch.float64)
    inexact = (back != x) & ~torch.isnan(x)
    bits = near.view(torch.int32)
    bits = bits - (inexact & (back.abs() > x.abs())).to(torch.int32)  # one step toward zero
    return (bits | inexact.to(torch.int32)).view(torch.float32)


def _cast_torch(x: Any, op: OperandType, want: Any, what: str) -> Any:
    import torch

    if not x.dtype.is_floating_point and x.dtype != torch.bool and op.host_dtype.kind in "iu":
        info = np.iinfo(op.host_dtype)
        bad = int(((x < info.min) | (x > info.max)).sum().item())
        if bad:
            raise out_of_range(bad, op, what)
        return x.to(want)
    if op.host_dtype.kind in "iu":
        whole = torch.trunc(x.to(torch.float64))
        info = np.iinfo(op.host_dtype)
        bad = int((~((whole >= info.min) & (whole <= info.max))).sum().item())  # NaN and ±inf too
        if bad:
            raise out_of_range(bad, op, what)
        return x.to(want)
    if op.name == "e4m3":
        wide = x if x.dtype.is_floating_point else x.to(torch.float64)  # |int8 -128| wraps in torch
        over = int((wide.abs() > E4M3_MAX).sum().item())
        if over:
            warn_saturated(over, what)
            x = torch.clamp(wide, -E4M3_MAX, E4M3_MAX)  # NaN stays NaN
    if want != torch.float32 and x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        x = _round_to_odd_f32(_to_f64_odd(x))  # float64 and integers: round once (module doc)
    return x.to(want)


def _to_f64_odd(x: Any) -> Any:
    """Torch tensor ``x`` (float64 or integers) as float64, rounded to odd where inexact: an int64
    or uint64 beyond 2**53 is the exact sum of its high and low 32-bit parts (each exact in float64), whose
    rounding error (TwoSum) sets the sticky last bit. A plain cast rounded it to nearest, which
    could land on a midpoint of the narrower type (2**60 + 2**52 + 1 became 2**60 in bf16, where
    ml_dtypes gives 2**60 + 2**53)."""
    import torch

    if x.dtype not in (torch.int64, torch.uint64):
        return x.to(torch.float64)  # float64 itself, and integers of up to 32 bits: exact
    bits = x.view(torch.int64)
    high = torch.bitwise_right_shift(bits, 32)  # the high word, signed (int64) ...
    if x.dtype == torch.uint64:
        high = torch.bitwise_and(high, 0xFFFFFFFF)  # ... or unsigned (uint64: 2**63 and above)
    h = high.to(torch.float64) * 2.0**32  # both words exact in float64
    lo = torch.bitwise_and(bits, 0xFFFFFFFF).to(torch.float64)
    s = h + lo
    b = s - h
    err = (h - (s - b)) + (lo - b)  # s + err == x exactly
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, -float("inf")))
    return torch.where((err != 0) & even, torch.nextafter(s, toward), s)


def cast_input(x: Any, op: OperandType, want: Any, kind: str | None = None, what: str = "w") -> Any:
    """``x`` (numpy, a torch CUDA tensor or a cupy array: ``kind``, default ``array_kind(x)``) in
    the operand's element type, cast as the host toolkit casts (module doc); ``want`` is the torch
    dtype for a torch ``x``."""
    kind = kind or array_kind(x)
    if kind == "torch":
        return x if x.dtype == want else _cast_torch(x, op, want, what)
    if x.dtype == op.host_dtype:
        return x
    if kind == "numpy":
        return cast_to_operand(x, op, what)
    if op.name in ("bf16", "e4m3", "e5m2"):
        raise bad_input(f"cupy has no {op.name} arrays: cannot cast a {x.dtype} array to it",
                        help="pass torch tensors, or numpy arrays (ml_dtypes)")
    if op.host_dtype.kind in "iu" and np.dtype(x.dtype).kind != "b":
        import cupy

        info = np.iinfo(op.host_dtype)
        whole = x if np.dtype(x.dtype).kind in "iu" else cupy.trunc(x.astype(np.float64))
        bad = int((~((whole >= info.min) & (whole <= info.max))).sum())
        if bad:
            raise out_of_range(bad, op, what)
    return x.astype(op.host_dtype)
