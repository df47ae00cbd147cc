"""The vocabulary the named layouts (``library.py``, ``tmem_layouts.py``, ``smem_layouts.py``) are
written in: the hardware input-dimension names (the reference list is ``layouts.py``'s docstring),
the metadata operand classes with their chunk sizes (``docs/hardware.md`` §1.4, §3), and the
helpers that write a layout's bases as ``{out_dim: coord}`` dicts.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gf2 import LayoutError
from .layouts import LinearLayout

REG, SUB, LANE, WARP, BLOCK = "reg", "sub", "lane", "warp", "block"
COL, CTA, OFFSET = "col", "cta", "offset"

#: elements per metadata chunk (one 4-bit nibble) by operand class (docs/hardware.md §1.4, §3)
CHUNK_ELEMS = {"16bit": 4, "tf32": 2, "8bit": 4, "4bit": 8}

_DTYPE_CLASS = {
    "f16": "16bit", "bf16": "16bit", "16bit": "16bit",
    "tf32": "tf32", "f32": "tf32",
    "e4m3": "8bit", "e5m2": "8bit", "s8": "8bit", "u8": "8bit", "i8": "8bit", "8bit": "8bit",
    "e2m1": "4bit", "4bit": "4bit",
}


def operand_class(dtype: str) -> str:
    """The metadata class of an operand dtype: ``16bit``, ``tf32``, ``8bit`` or ``4bit``."""
    try:
        return _DTYPE_CLASS[dtype]
    except (KeyError, TypeError):
        raise LayoutError("SP0408", f"unknown sparse operand dtype {dtype!r}",
                          help=f"use one of {sorted(_DTYPE_CLASS)}") from None


def layout_from_bases(layout_in: dict[str, list[dict[str, int]]], out_dims: Sequence[tuple[str, int]]) -> LinearLayout:
    """Build a layout from bases written as ``{out_dim: coord}`` dicts (missing dims are 0)."""
    names = [n for n, _ in out_dims]
    rows = {k: [tuple(b.get(n, 0) for n in names) for b in v] for k, v in layout_in.items()}
    return LinearLayout.from_bases(rows, out_dims)


def unit_bases(dim: str, start: int, count: int) -> list[dict[str, int]]:
    """Bases ``dim = 2**start, 2**(start+1), ...`` (``count`` of them)."""
    return [{dim: 1 << (start + i)} for i in range(count)]


__all__ = ["BLOCK", "CHUNK_ELEMS", "COL", "CTA", "LANE", "OFFSET", "REG", "SUB", "WARP", "layout_from_bases",
           "operand_class", "unit_bases"]
