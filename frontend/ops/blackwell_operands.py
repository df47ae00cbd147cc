"""The operand classes and tensor-memory geometry of the Blackwell explicit level (``blackwell.py``),
shared by its builtins (``tmem.py``, ``tcgen05.py``), the interpreter (``frontend/interp/blackwell.py``)
and the backend (``backend/lower/blackwell*.py``): the MMA kind, PTX type and metadata class of an
operand type and the K of one instruction (``docs/hardware.md`` §1.2-1.4), the columns a TMEM region
occupies, where each element of a TMEM view lives (PTX ISA 9.7.16.10.5), and the N tiles of a
``tcgen05.mma``.
"""

from __future__ import annotations

from ..ir import types as T
from ..layout.gf2 import log2_exact
from ..layout.layouts import LinearLayout

TMEM_COLUMNS = 512
TMEM_LANES = 128

# --------------------------------------------------------------------------------------------
# Operand classes (docs/hardware.md §1.2-1.4)
# --------------------------------------------------------------------------------------------
MMA_KIND = {"f16": "f16", "bf16": "f16", "tf32": "tf32", "f32": "tf32", "e4m3": "f8f6f4", "e5m2": "f8f6f4",
            "i8": "i8", "u8": "i8"}
PTX_DTYPE = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2",
             "i8": "s8", "u8": "u8"}
D_DTYPE = {"f32": "f32", "f16": "f16", "i32": "s32"}
META_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "f32": 32, "e4m3": 8, "e5m2": 8, "i8": 8, "u8": 8}
"""The metadata class of an A type: 16-bit, tf32 (32) or 8-bit; metadata of one class is wrong for
another (docs/sparse-metadata.md §6), so a metadata ref is tagged with it."""
WORD_K = {16: 32, 32: 16, 8: 32}
"""K elements one metadata word (one TMEM column) covers per row, by metadata class (§1.4)."""
CLASS_DTYPE = {16: "f16", 32: "tf32", 8: "e4m3"}
ACC_TYPES = ("f32", "f16", "i32")
A_TYPES = ("f16", "bf16", "tf32", "f32", "e4m3", "e5m2", "i8", "u8")


def instr_k(a_elem: T.ScalarType, sparse: bool) -> int:
    """Logical K of one tcgen05.mma (§1.2: sparse 32 / 16 / 64 for 16-bit / tf32 / 8-bit)."""
    dense = {16: 16, 32: 8, 8: 32}[META_BITS[a_elem.name]]
    return 2 * dense if sparse else dense


def meta_columns_per_instr(a_elem: T.ScalarType) -> int:
    """TMEM metadata columns one sparse instruction reads: 1 (16-bit, tf32) or 2 (8-bit) (§1.4)."""
    return instr_k(a_elem, True) // WORD_K[META_BITS[a_elem.name]]


def tmem_packing(t: T.TmemType) -> int:
    """Elements per 32-bit TMEM column: an A operand is packed, accumulators and metadata not."""
    return max(1, 32 // t.elem.bits) if t.kind == "a" else 1


def tmem_tile_columns(t: T.TmemType) -> int:
    """Columns of one 128-row tile of a (rows, cols) view."""
    return -(-t.shape[-1] // tmem_packing(t))


def tmem_alloc_columns(t: T.TmemType) -> int:
    """Columns a whole allocation occupies: stages x row tiles x tile columns."""
    stages = t.shape[0] if len(t.shape) == 3 else 1
    return stages * (t.shape[-2] // TMEM_LANES) * tmem_tile_columns(t)


# --------------------------------------------------------------------------------------------
# TMEM layouts of a view (for the layout algebra: lane, col[, sub] -> logical)
# --------------------------------------------------------------------------------------------
def tmem_view_layout(t: T.TmemType) -> LinearLayout:
    """Where each element of a 2-D view lives: ``lane`` = row % 128, ``col`` = (row // 128) * tile
    columns + col // packing, ``sub`` = col % packing (PTX ISA 9.7.16.10.5 Layout D for M = 128;
    16-bit packing as JAX ``tmem_default_layout(2)``). Both dims must be powers of two.

    A 64-row accumulator (only the tile-level dense ``dot`` makes one: ``tmem.alloc`` takes 128 or
    256 rows) is the M = 64 ``cta_group::1`` D, Layout F (``layout.tmem_layouts.tmem_accumulator``):
    row r in lane ``32·(r/16) + r%16``, lanes 16..31 of each quarter unused."""
    rows, cols = t.shape
    p = tmem_packing(t)
    if rows == TMEM_LANES // 2 and t.kind == "acc":
        from ..layout.tmem_layouts import tmem_accumulator

        f = tmem_accumulator(rows, cols)
        return LinearLayout(f.in_dims, (("dim0", rows), ("dim1", cols), f.out_dims[2]), f.bases)
    tile_cols = cols // p
    bases: dict[str, list[tuple[int, int]]] = {
        "lane": [(1 << i, 0) for i in range(7)],
        "col": [(0, p << i) for i in range(log2_exact(tile_cols, "TMEM columns"))],
    }
    if rows == 2 * TMEM_LANES:
        bases["col"].append((TMEM_LANES, 0))
    if p > 1:
        bases["sub"] = [(0, 1 << i) for i in range(log2_exact(p))]
    return LinearLayout.from_bases(bases, [("dim0", rows), ("dim1", cols)])


def tmem_chunk_layout(t: T.TmemType) -> LinearLayout:
    """The metadata image of a (rows, cols) metadata view in logical chunks: (lane, col, sub =
    nibble) -> (dim0 = row, dim1 = chunk), from ``layout_library.tmem_sparse_metadata``
    (docs/hardware.md §1.4), with a second 128-row tile in the next ``cols`` columns."""
    from ..layout.tmem_layouts import tmem_sparse_metadata

    rows, cols = t.shape
    per_tile = tmem_sparse_metadata(128, cols * 8 * {16: 4, 32: 2, 8: 4}[t.meta_bits], CLASS_DTYPE[t.meta_bits])
    bases: dict[str, list[tuple[int, int]]] = {}
    for name in per_tile.in_names:
        bases[name] = [tuple(per_tile.basis(name, b).values()) for b in range(per_tile.in_bits(name))]  # type: ignore[misc]
    if rows == 2 * TMEM_LANES:
        bases["col"].append((TMEM_LANES, 0))
    return LinearLayout.from_bases(bases, [("dim0", rows), ("dim1", cols * 8)])


def split_n(n: int) -> list[tuple[int, int]]:
    """(start, size) of the instruction N tiles of an N-wide accumulator: 256 columns each, then
    the rest (one instruction's N is at most 256, docs/hardware.md §1.2)."""
    out, start = [], 0
    while start < n:
        size = min(256, n - start)
        out.append((start, size))
        start += size
    return out
