"""The rules of a tiled TMA tensor map that depend only on the tensor it describes (docs/hardware.md
§5.4, the ``cuTensorMapEncodeTiled`` rules): each dimension in 1..2^32, each outer stride a
multiple of 16 bytes (32 for the interleaved and 16-byte-aligned packed types) below 2^40. The
launch checks them with the rest of a map's rules (backend/runtime/tensormap.py); the interpreter
checks them when it binds a ``tensor`` argument, so that a layout no GPU launch could take fails
on the CPU too (SP0714)."""

from __future__ import annotations

TENSOR_MAP = "SP0714"
"""The code of an invalid tensor map, at a launch (backend/runtime/codes.py) and in the interpreter."""
MAX_GLOBAL_DIM = 1 << 32
MAX_GLOBAL_STRIDE = 1 << 40


def global_layout_problems(shape: tuple[int, ...], strides_bytes: tuple[int, ...], align: int = 16) -> list[str]:
    """What the tensor's ``shape`` and byte ``strides_bytes`` (outermost first) break, as phrases."""
    out = []
    for axis, n in enumerate(shape):
        if not 1 <= n <= MAX_GLOBAL_DIM:
            out.append(f"global dimension {axis} = {n} is outside 1..2^32")
    for axis, s in enumerate(strides_bytes[:-1]):
        if s % align or not 0 <= s < MAX_GLOBAL_STRIDE:
            out.append(f"global stride of dimension {axis} = {s} bytes is not a multiple of {align} below 2^40")
    return out
