"""Packing e2m1 (fp4) values two per byte, the way sub-byte operands sit in memory.

ml_dtypes keeps one float4_e2m1fn per byte (value in the low nibble); a kernel's global-memory
operand holds two per byte. Element 2i goes to the low nibble of byte i and element 2i+1 to the
high nibble: the same little-endian order as the metadata nibbles (docs/hardware.md §3) and as
CUTLASS's sub-byte arrays. This order is not yet checked on hardware (no fp4 MMA on the H200).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import SP_BAD_INPUT, SparsityError
from .hostarray import as_host_array

E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)


def pack_e2m1(values: Any) -> np.ndarray:
    """(..., 2n) float4_e2m1fn values -> (..., n) uint8, element 2i in the low nibble of byte i."""
    array = as_host_array(values, "values")
    if array.dtype != E2M1:
        raise SparsityError(SP_BAD_INPUT, f"pack_e2m1 needs float4_e2m1fn values, got {array.dtype}",
                            help="cast with .astype(ml_dtypes.float4_e2m1fn) or compress(w, 'e2m1') first")
    if array.ndim == 0 or array.shape[-1] % 2:
        raise SparsityError(SP_BAD_INPUT, f"pack_e2m1 needs an even last axis, got shape {array.shape}",
                            help="pad the last axis to an even length")
    nibbles = array.view(np.uint8) & np.uint8(0xF)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << np.uint8(4))


def unpack_e2m1(packed: Any) -> np.ndarray:
    """Inverse of :func:`pack_e2m1`: (..., n) uint8 -> (..., 2n) float4_e2m1fn."""
    array = as_host_array(packed, "packed")
    if array.dtype.kind not in "ui" or array.ndim == 0 or (array.size and not 0 <= array.min() <= array.max() <= 0xFF):
        raise SparsityError(SP_BAD_INPUT, f"unpack_e2m1 needs packed bytes (integers 0-255) with at least one "
                            f"axis, got {array.dtype} of shape {array.shape}", help="pass what pack_e2m1 returns")
    array = array.astype(np.uint8, copy=False)
    out = np.empty((*array.shape[:-1], array.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = array & np.uint8(0xF)
    out[..., 1::2] = array >> np.uint8(4)
    return out.view(E2M1)
