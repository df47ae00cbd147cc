"""The Blackwell explicit level: tensor memory (namespace ``tmem``) and the fifth-generation tensor
core (namespace ``tcgen05``) of sm_100a / sm_103a / sm_110a (PTX ISA 9.7.16; docs/hardware.md
§1-2, §6-7).

Semantics (``frontend/interp/blackwell.py`` implements them; the backend is
``backend/lower/blackwell.py``, ``tcgen05`` in ``backend/lower/blackwell_mma.py``):

* ``tmem.alloc(dtype, shape, kind="acc", meta_dtype=None)`` — a region of tensor memory. ``shape``
  is ``(rows, cols)`` or ``(stages, rows, cols)``; rows are 128 (one TMEM lane per row) or 256 (two
  128-row tiles side by side in columns, for a 1-CTA M=256 MMA). ``kind``: ``"acc"`` (an MMA
  accumulator: f32, f16 or i32, one 32-bit column per element), ``"a"`` (an A operand, packed:
  two 16-bit / four 8-bit values per column), ``"meta"`` (sparse metadata words, u32, for A
  operands of type ``meta_dtype``; columns in multiples of 4 = one 2 KB ``tcgen05.cp`` atom).
  ``"scale"`` (UE8M0 block scale factors of a block-scaled MMA, u32 words of 4 bytes, columns in
  multiples of 4 = one ``tcgen05.cp.32x128b.warpx4`` atom; ``frontend/ops/tmem_scales.py``).
  Every allocation of a kernel is placed, in program order, inside ONE power-of-two allocation
  of at most 512 columns (SP0540 past that); allocations must be at the kernel's top level.
  Contents are undefined until written (NaN / a poison pattern in the interpreter).
* ``ref[i]`` picks one stage; ``ref.slice(dim, start, size)`` a row tile (dim 0: 128 rows at a
  constant multiple of 128) or columns (dim 1, of a 128-row view).
* ``ref.load()`` / ``ref.store(tile)`` — ``tcgen05.ld`` / ``tcgen05.st`` by every thread of the
  current partition (whole warpgroups), through the access atom the layout algebra derives; a
  metadata ref loads its words (the "sm90" word matrix of docs/sparse-metadata.md: a TMEM cell of
  a 128-row tile is exactly that word), ``meta.load_chunks()`` the logical 4-bit codes
  (``(rows, 8·cols)`` u8, chunk ``j`` of row ``m`` at ``[m, j]``), which needs the true TMEM
  image of the metadata (rows m and m+8 share a cell for 16-bit operands; seed 000).
* ``tcgen05.mma(a, b, acc, a_meta=None, accumulate=True, a_scale=None, b_scale=None)`` — ``acc =
  A @ B^T (+ acc)`` issued by
  one elected thread; A is a shared-memory buffer (M x K, or M x K/2 compressed values when
  ``a_meta`` is given) or a TMEM ``"a"`` ref, B a shared-memory buffer N x K (K-major); ``acc``
  an M x N accumulator ref. One call may span several instruction tiles (M = 256 as two M = 128
  tiles, N > 256 as N chunks); the compiler splits it and addresses the metadata per M tile and K
  step (docs/hardware.md §11; seed 001). Asynchronous: completion is observed with
  ``tcgen05.commit(bar)`` (one mbarrier arrival once every earlier tcgen05 operation of the
  issuing thread is done). With ``a_scale`` / ``b_scale`` (``kind="scale"`` refs) the MMA is
  block-scaled (kind::mxf8f6f4 ``.block_scale``, e4m3/e5m2 operands, f32 accumulator):
  ``acc = (A · SA) @ (B · SB)^T (+ acc)`` with one UE8M0 scale per row and instruction K (32 dense,
  64 logical K sparse); see ``tmem_scales.py`` for where the scales live.
* ``tcgen05.copy(src, dst)`` — ``tcgen05.cp.128x128b``: 2 KB metadata atoms ``(128, 4)`` u32 (or a
  stack ``(n, 128, 4)``) from shared memory into the columns of a metadata ref; into a scale ref,
  ``tcgen05.cp.32x128b.warpx4``: 512-byte scale atoms ``(32, 4)`` u32 (or ``(32n, 4)`` /
  ``(n, 32, 4)``), each duplicated into the four lane quarters of 4 columns.
* ``tcgen05.fence_before()`` / ``tcgen05.fence_after()`` — ``tcgen05.fence::before_thread_sync``
  (before signalling other threads about TMEM) and ``::after_thread_sync`` (after such a wait,
  before ``tcgen05.ld`` / ``mma``).

The interpreter semantics live in ``frontend/interp/blackwell.py``: an MMA (and a copy) runs when
it is issued, a valid order of the asynchronous hardware, since its completion is only observable
through ``commit`` + ``mbarrier.wait``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.layouts import LinearLayout, log2_exact
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .opdefs import NO_LAYOUT_RULE, TYPED_BY_SEMA, define_op, flagged, none

TMEM_COLUMNS = 512
TMEM_LANES = 128



def mma_operands(op: Operation) -> tuple[str, ...]:
    """``a, b, d`` (the TMEM accumulator), ``a_meta`` when sparse, ``a_scale, b_scale`` when
    block-scaled, and last ``enable`` (accumulate into d, or overwrite it)."""
    names = ("a", "b", "d") + (("a_meta",) if op.attrs.get("sparse") else ())
    return names + (("a_scale", "b_scale") if op.attrs.get("block_scale") else ()) + ("enable",)


tmem_alloc_op = define_op("tmem.alloc", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                          doc="A region of tensor memory (placed at compile time).")
tmem_index_op = define_op("tmem.index", operands=("ref", "index"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          doc="One stage of a stacked TMEM region.")
tmem_slice_op = define_op("tmem.slice", operands=("ref", "start"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          doc="A row tile or a column range of a TMEM region.")
tmem_load_op = define_op("tmem.load", operands=("ref",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                         doc="tcgen05.ld: a TMEM region into registers.")
tmem_load_chunks_op = define_op("tmem.load_chunks", operands=("ref",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                                doc="tcgen05.ld of metadata as logical 4-bit codes.")
tmem_store_op = define_op("tmem.store", operands=("ref", "value"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          side_effects=True, doc="tcgen05.st: registers into a TMEM region.")
tmem_init_op = define_op("tmem.init", verify=none("added by the backend, without operands or results"),
                         layout=NO_LAYOUT_RULE, side_effects=True,
                         doc="Kernel start: allocate all TMEM (added by the backend).")
tmem_release_op = define_op("tmem.release", verify=none("added by the backend, without operands or results"),
                            layout=NO_LAYOUT_RULE, side_effects=True,
                            doc="Kernel end: free all TMEM (added by the backend).")
mma_op = define_op("tcgen05.mma", operands=mma_operands, verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                   side_effects=True, doc="Asynchronous tcgen05.mma[.sp] issued by one thread.")
copy_op = define_op("tcgen05.copy", operands=("src", "dst"), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                    side_effects=True, doc="tcgen05.cp.128x128b: metadata atoms SMEM -> TMEM.")
commit_op = define_op("tcgen05.commit", operands=flagged(("bar",), ("mask", "multicast")), verify=TYPED_BY_SEMA,
                      layout=NO_LAYOUT_RULE, side_effects=True,
                      doc="tcgen05.commit: arrive on an mbarrier when done.")
fence_before_op = define_op("tcgen05.fence_before", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                            doc="tcgen05.fence::before_thread_sync")
fence_after_op = define_op("tcgen05.fence_after", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, side_effects=True,
                           doc="tcgen05.fence::after_thread_sync")

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
    16-bit packing as JAX ``tmem_default_layout(2)``). Both dims must be powers of two."""
    rows, cols = t.shape
    p = tmem_packing(t)
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
    from ..layout.library import tmem_sparse_metadata

    rows, cols = t.shape
    per_tile = tmem_sparse_metadata(128, cols * 8 * {16: 4, 32: 2, 8: 4}[t.meta_bits], CLASS_DTYPE[t.meta_bits])
    bases: dict[str, list[tuple[int, int]]] = {}
    for name in per_tile.in_names:
        bases[name] = [tuple(per_tile.basis(name, b).values()) for b in range(per_tile.in_bits(name))]  # type: ignore[misc]
    if rows == 2 * TMEM_LANES:
        bases["col"].append((TMEM_LANES, 0))
    return LinearLayout.from_bases(bases, [("dim0", rows), ("dim1", cols * 8)])


# --------------------------------------------------------------------------------------------
# Builtins: tmem
# --------------------------------------------------------------------------------------------
@dataclass
class _TmemPlacement:
    """Sema's running TMEM placement: the next free column and what was placed (for messages)."""

    next_col: int = 0
    placed: list[str] = field(default_factory=list)


def _placement(em: Emitter) -> _TmemPlacement:
    st = getattr(em.sema, "_tmem_placement", None)
    if st is None:
        st = _TmemPlacement()
        em.sema._tmem_placement = st
    return st


def _pow2_at_least(n: int, lo: int = 1) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def _tmem(em: Emitter, arg: Arg, kinds: tuple[str, ...] = ("acc", "a", "meta", "scale"), rank: int | None = 2,
          what: str = "a tensor-memory reference") -> tuple[Value, T.TmemType]:
    v = em.value(arg)
    t = v.type
    if not isinstance(t, T.TmemType) or t.kind not in kinds:
        em.error("SP0543", f"expected {what}, found {t}", arg.span)
    if rank is not None and len(t.shape) != rank:
        em.error("SP0543", f"expected a {rank}-D TMEM view, found {t}", arg.span,
                 help="pick one stage with `ref[i]` first" if len(t.shape) == 3 else None)
    return v, t


@builtin("alloc", ns="tmem")
def tmem_alloc(em: Emitter, dtype: Arg, shape: Arg, kind: Arg | None = None, meta_dtype: Arg | None = None) -> Value:
    """Tensor memory of ``shape`` = (rows, cols) or (stages, rows, cols); ``kind`` "acc", "a", "meta"
    (``meta_dtype`` = the sparse A type the metadata describes) or "scale" (block scale factors)."""
    dt = em.dtype_arg(dtype)
    dims = em.int_tuple(shape, "the TMEM shape")
    k = "acc" if kind is None else em.constexpr(kind, "the TMEM kind", (str,))
    span = shape.span
    if k not in ("acc", "a", "meta", "scale"):
        em.error("SP0542", f"the TMEM kind must be \"acc\", \"a\", \"meta\" or \"scale\", found {k!r}",
                 kind.span if kind else span)
    if len(dims) not in (2, 3) or any(d <= 0 for d in dims):
        em.error("SP0542", f"a TMEM region is (rows, cols) or (stages, rows, cols), found {dims}", span)
    rows = dims[-2]
    if rows not in (128, 256) or (k in ("a", "scale") and rows != 128):
        also = "" if k in ("a", "scale") else " or 256 (two 128-row tiles)"
        em.error("SP0542", f"a TMEM region has 128 rows (one per TMEM lane){also}, found {rows}", span,
                 help="M = 64 (half the data path) is not supported: its sparse metadata layout is undocumented "
                      "(docs/hardware.md §0 item 6)")
    meta_bits = 0
    if k == "acc" and dt.name not in ACC_TYPES:
        em.error("SP0542", f"a TMEM accumulator holds f32, f16 or i32, found {dt}", dtype.span)
    if k == "a" and dt.name not in A_TYPES:
        em.error("SP0542", f"a TMEM A operand holds {', '.join(A_TYPES)}, found {dt}", dtype.span)
    if k == "a" and dims[-1] % (32 // dt.bits if dt.bits < 32 else 1):
        em.error("SP0542", f"a packed A operand of {dt} needs a multiple of {32 // dt.bits} columns, found {dims[-1]}",
                 span)
    if k == "meta":
        if dt != T.u32:
            em.error("SP0542", f"TMEM metadata is held as u32 words, found {dt}", dtype.span,
                     help="write `tmem.alloc(u32, (128, cols), kind=\"meta\", meta_dtype=<A type>)`")
        if meta_dtype is None:
            em.error("SP0542", "TMEM metadata needs `meta_dtype=`: the A type it describes (its layout depends on it)",
                     em.span)
        md = em.dtype_arg(meta_dtype, "meta_dtype")
        if md.name not in META_BITS:
            em.error("SP0542", f"sparse A operands are {', '.join(META_BITS)}, found meta_dtype={md}", meta_dtype.span)
        meta_bits = META_BITS[md.name]
        if dims[-1] % 4:
            em.error("SP0542", f"TMEM metadata takes whole 2 KB atoms of 4 columns, found {dims[-1]} columns",
                     span, help=f"allocate {dims[-1] + (-dims[-1]) % 4} columns")
    elif meta_dtype is not None:
        em.error("SP0542", "`meta_dtype=` only applies to kind=\"meta\"", meta_dtype.span)
    if k == "scale":
        if dt != T.u32:
            em.error("SP0542", f"TMEM scale factors are held as u32 words (4 UE8M0 bytes each), found {dt}", dtype.span,
                     help="write `tmem.alloc(u32, (128, cols), kind=\"scale\")`")
        if dims[-1] % 4:
            em.error("SP0542", f"TMEM scale factors take whole copy atoms of 4 columns, found {dims[-1]} columns",
                     span, help=f"allocate {dims[-1] + (-dims[-1]) % 4} columns")
    t = T.TmemType(dt if dt != T.f32 or k != "a" else T.tf32, dims, k, meta_bits)
    if em.builder.block.parent is not None:
        em.error("SP0541", "tensor memory must be allocated at the kernel's top level, not in a loop, a branch "
                 "or a warp_specialize partition", help="allocate it before the loop (or warp_specialize) and pass "
                 "the reference on; all TMEM of a CTA is one allocation made at kernel start")
    st = _placement(em)
    ncols = tmem_alloc_columns(t)
    align = 4 if k in ("meta", "scale") else min(32, _pow2_at_least(tmem_tile_columns(t)))
    start = -(-st.next_col // align) * align
    end = start + ncols
    if end > TMEM_COLUMNS:
        placed = tuple(st.placed) or ("(nothing else)",)
        em.error("SP0540", f"tensor memory holds {TMEM_COLUMNS} columns per CTA; {t} needs {ncols} more columns "
                 f"at column {start}, up to {end}", em.span, notes=("already placed: " + "; ".join(placed),),
                 help="use fewer stages or a narrower N tile (an f16 accumulator still takes one column per "
                      "element: D is never packed)")
    if not em.sema.in_trial:
        st.next_col = end
        st.placed.append(f"{t} at columns [{start}, {end})")
    return em.op1("tmem.alloc", [], t, col=start, ncols=ncols)


@builtin("__getitem__", method_of=(T.TmemType,), method_only=True)
def tmem_getitem(em: Emitter, ref: Arg, index: Arg) -> Value:
    """``ref[i]``: stage ``i`` of a ``(stages, rows, cols)`` region."""
    v, t = _tmem(em, ref, rank=3)
    i = em.cast(em.value(index, like=T.i32), T.i32)
    if T.shape_of(i.type):
        em.error("SP0543", "a TMEM stage index must be a scalar", index.span)
    return em.op1("tmem.index", [v, i], T.TmemType(t.elem, t.shape[1:], t.kind, t.meta_bits))


@builtin("slice", method_of=(T.TmemType,), method_only=True)
def tmem_slice(em: Emitter, ref: Arg, dim: Arg, start: Arg, size: Arg) -> Value:
    """Rows ``[start, start + 128)`` (dim 0, of a 256-row view) or columns ``[start, start + size)``
    (dim 1, of a 128-row view)."""
    v, t = _tmem(em, ref)
    d = em.constexpr(dim, "the dimension")
    n = em.constexpr(size, "the slice size")
    rows, cols = t.shape
    s_val = em.unwrap(start)
    static = s_val.value if isinstance(s_val, Const) and isinstance(s_val.value, int) else None
    if d == 0:
        if rows != 256 or n != 128 or static is None or static not in (0, 128):
            em.error("SP0543", f"rows of a TMEM view are sliced as whole 128-row tiles at a constant 0 or 128 of a "
                     f"256-row view; found rows [{static if static is not None else '?'}, +{n}) of {t}", em.span)
        shape = (128, cols)
    elif d == 1:
        if rows != 128:
            em.error("SP0543", f"slice the 128-row tile first: columns of {t} are sliced per row tile", em.span,
                     help="write `ref.slice(0, 0, 128).slice(1, start, size)`")
        if not 0 < n <= cols or (static is not None and not 0 <= static <= cols - n):
            em.error("SP0543", f"cannot take columns [{static}, +{n}) of {t}", em.span)
        step = 4 if t.kind in ("meta", "scale") else tmem_packing(t)
        if step > 1 and (static is None or static % step or n % step):
            em.error("SP0543", f"{t.kind} columns are sliced at constant multiples of {step}", start.span,
                     help="metadata and scales in whole 4-column atoms; packed operands at whole 32-bit columns")
        shape = (rows, n)
    else:
        em.error("SP0543", f"a 2-D TMEM view has dims 0 and 1, found {d}", dim.span)
    s = em.cast(em.value(start, like=T.i32), T.i32)
    return em.op1("tmem.slice", [v, s], T.TmemType(t.elem, shape, t.kind, t.meta_bits), dim=d, size=n)


def _loadable(em: Emitter, t: T.TmemType, what: str) -> None:
    for x in t.shape:
        if not T.is_power_of_two(x):
            em.error("SP0543", f"{what} {t} into registers needs power-of-two dimensions", em.span,
                     help="slice the region into power-of-two column ranges with `ref.slice(1, start, size)`")


@builtin("load", method_of=(T.TmemType,), method_only=True)
def tmem_load(em: Emitter, ref: Arg) -> Value:
    """The region as a tile (``tcgen05.ld`` by every thread of the partition); metadata as words."""
    v, t = _tmem(em, ref)
    _loadable(em, t, "loading")
    return em.op1("tmem.load", [v], T.TileType(t.elem, t.shape))


@builtin("load_chunks", method_of=(T.TmemType,), method_only=True)
def tmem_load_chunks(em: Emitter, ref: Arg) -> Value:
    """Metadata as logical 4-bit codes: element ``[m, j]`` is the nibble of chunk ``j`` of row ``m``."""
    v, t = _tmem(em, ref, kinds=("meta",), what="a TMEM metadata reference")
    _loadable(em, t, "loading")
    return em.op1("tmem.load_chunks", [v], T.TileType(T.u8, (t.shape[0], 8 * t.shape[1])))


@builtin("store", method_of=(T.TmemType,), method_only=True)
def tmem_store(em: Emitter, ref: Arg, value: Arg) -> None:
    """Write a tile of the region's shape (``tcgen05.st``, converted to its element type)."""
    v, t = _tmem(em, ref)
    _loadable(em, t, "storing")
    x = em.value(value, like=t.elem)
    if T.shape_of(x.type) != t.shape:
        em.error("SP0543", f"cannot store a tile of shape {T.shape_of(x.type)} into {t}", value.span)
    em.create("tmem.store", [v, em.cast(x, t.elem)], [])
    return None


# --------------------------------------------------------------------------------------------
# Builtins: tcgen05
# --------------------------------------------------------------------------------------------
def split_n(n: int) -> list[tuple[int, int]]:
    """(start, size) of the instruction N tiles of an N-wide accumulator: 256 columns each, then
    the rest (one instruction's N is at most 256, docs/hardware.md §1.2)."""
    out, start = [], 0
    while start < n:
        size = min(256, n - start)
        out.append((start, size))
        start += size
    return out


def _smem2d(em: Emitter, arg: Arg, what: str) -> tuple[Value, T.SmemType]:
    v = em.value(arg)
    if not isinstance(v.type, T.SmemType) or len(v.type.shape) != 2:
        em.error("SP0544", f"{what} of tcgen05.mma must be a 2-D shared-memory buffer, found {v.type}", arg.span,
                 help="allocate it with `smem.alloc(dtype, (rows, cols), swizzle=128)` and pick a stage with `buf[s]`")
    return v, v.type


def _check_swizzle(em: Emitter, t: T.SmemType, bytes_per_instr: int, span: Any, what: str) -> None:
    """K-major canonical layouts (PTX ISA 9.7.16.3.3): every instruction's K bytes must lie in one
    swizzle atom row (docs/hardware.md §4.3; JAX's "B tiling too small")."""
    if not t.swizzle:
        em.error("SP0547", f"{what} of tcgen05.mma must be swizzled (32, 64 or 128 bytes), found {t}", span,
                 help="allocate it with swizzle=128 (or the row width in bytes)")
    if t.swizzle < bytes_per_instr:
        em.error("SP0547", f"{what} tiling too small: one instruction reads {bytes_per_instr} bytes of K per row but "
                 f"the {t.swizzle}-byte swizzle atom is narrower", span,
                 help=f"use swizzle={max(64, bytes_per_instr)} or more (rows of at least {bytes_per_instr} bytes)")


def _idesc_diagnostics(em: Emitter, kind: str, ea: T.ScalarType, eb: T.ScalarType, eacc: T.ScalarType, n: int,
                       sparse: bool, span: Any, cta_group: int = 1) -> None:
    from ...target.descriptors import InstrDesc, idesc_problems

    scaled = kind == "mxf8f6f4"
    for start, size in split_n(n):
        d = InstrDesc(kind, PTX_DTYPE[ea.name], PTX_DTYPE[eb.name], D_DTYPE[eacc.name], 128 * cta_group, size,
                      sparse=sparse, cta_group=cta_group, scale_dtype="ue8m0" if scaled else None,
                      block_size=32 if scaled else None)
        problems = idesc_problems(d)
        if problems:
            p = problems[0]
            where = f" (instruction N tile [{start}, {start + size}))" if n > 256 else ""
            em.error(p.code, p.message + where, span, help=p.help)


@builtin("mma", ns="tcgen05")
def mma(em: Emitter, a: Arg, b: Arg, acc: Arg, a_meta: Arg | None = None, accumulate: Arg | None = None,
        b_kmajor: Arg | None = None, cta_group: Arg | None = None, a_scale: Arg | None = None,
        b_scale: Arg | None = None) -> None:
    """``acc = A @ B^T (+ acc if accumulate)`` on the tensor cores, asynchronously (sparse A when
    ``a_meta`` is given; block-scaled, ``(A·SA) @ (B·SB)^T``, when ``a_scale`` / ``b_scale`` are);
    one call may span several instruction tiles."""
    va, vb, vacc = em.value(a), em.value(b), em.value(acc)
    group = _cta_group(em, cta_group, "tcgen05.mma")
    kmajor = True if b_kmajor is None else bool(em.constexpr(b_kmajor, "b_kmajor", (bool, int)))
    if not kmajor:
        em.error("SP0545", "an MN-major B is not supported by sparsile's tcgen05 lowering yet", b_kmajor.span,  # type: ignore[union-attr]
                 help="store B as N x K (K-major)")
    sparse = a_meta is not None and not (isinstance(a_meta.value, Const) and a_meta.value.value is None)
    if isinstance(va.type, T.TmemType):
        _, ta = _tmem(em, a, kinds=("a",), what="an A operand in TMEM (kind=\"a\")")
        a_shape, ea = ta.shape, ta.elem
    else:
        _, sa = _smem2d(em, a, "A")
        a_shape, ea = sa.shape, sa.elem
    _, tb = _smem2d(em, b, "B")
    _, tacc = _tmem(em, acc, kinds=("acc",), what="a TMEM accumulator (kind=\"acc\")")
    m, n = tacc.shape
    scaled = any(x is not None and not (isinstance(x.value, Const) and x.value.value is None)
                 for x in (a_scale, b_scale))
    if scaled:
        _check_scaled_form(em, a, b, a_scale, b_scale, va, ea, tb.elem, group)
    if ea.name not in MMA_KIND:
        em.error("SP0544", f"tcgen05.mma does not take {ea} operands", a.span, help=f"use one of {', '.join(A_TYPES)}")
    eb = tb.elem
    if MMA_KIND.get(eb.name) != MMA_KIND[ea.name] or (MMA_KIND[ea.name] in ("f16", "tf32") and
                                                     PTX_DTYPE[eb.name] != PTX_DTYPE[ea.name]):
        em.error("SP0544", f"A is {ea} but B is {eb}: the operands must have the same type (8-bit floats may mix, "
                 "and 8-bit integers may mix signedness)", b.span)
    if a_shape[0] != m:
        em.error("SP0544", f"A has {a_shape[0]} rows but the accumulator {tacc} has {m}", a.span)
    if isinstance(va.type, T.TmemType) and (m != 128 or group == 2):
        em.error("SP0545", "an A operand in TMEM needs M = 128 and cta_group=1", a.span)
    k = a_shape[1] * (2 if sparse else 1)
    if group == 2:
        _check_pair_shapes(em, m, n, k, tb, acc, b)
    elif tb.shape != (n, k):
        why = f" for compressed A of K/2 = {a_shape[1]}" if sparse else ""
        em.error("SP0544", f"B must be N x K = {n} x {k} (K-major){why}, found {tb}", b.span)
    step = instr_k(ea, sparse)
    if k % step:
        em.error("SP0544", f"K = {k} is not a multiple of the {'sparse ' if sparse else ''}tcgen05 K step {step} "
                 f"for {ea}", a.span)
    _idesc_diagnostics(em, "mxf8f6f4" if scaled else MMA_KIND[ea.name], ea, eb, tacc.elem, n, sparse, acc.span,
                       group)
    if m % 128:
        em.error("SP0545", f"M = {m} is not supported (sparsile issues M = 128 tiles)", acc.span)
    if not isinstance(va.type, T.TmemType):
        _check_swizzle(em, va.type, step // (2 if sparse else 1) * max(1, ea.bits // 8), a.span, "A")
    _check_swizzle(em, tb, step * max(1, eb.bits // 8), b.span, "B")
    operands = [va, vb, vacc]
    if sparse:
        assert a_meta is not None
        vm, tm = _tmem(em, a_meta, kinds=("meta",), what="sparse metadata in TMEM (kind=\"meta\")")
        want_bits = META_BITS[ea.name]
        if tm.meta_bits != want_bits:
            em.error("SP0546", f"the metadata was allocated for {CLASS_DTYPE[tm.meta_bits]}-class operands but A is "
                     f"{ea}: its layout differs", a_meta.span,
                     help=f"allocate it with meta_dtype={ea} and encode it for {ea}")
        words = k // WORD_K[want_bits]
        if tm.shape[0] != m or tm.shape[1] < words:
            em.error("SP0544", f"metadata for {m}x{k} {ea} A needs {m} rows and {words} word columns, found {tm}",
                     a_meta.span)
        operands.append(vm)
    if scaled:
        assert a_scale is not None and b_scale is not None
        steps = k // step
        operands += [_scale_operand(em, a_scale, "A", m, steps, step), _scale_operand(em, b_scale, "B", n, steps, step)]
    en = Const(True) if accumulate is None else em.unwrap(accumulate)
    if isinstance(en, Const):
        if not isinstance(en.value, bool | int):
            em.error("SP0551", f"`accumulate` must be a bool, found {en.value!r}",
                     accumulate.span if accumulate else em.span)
        ven = em.constant(bool(en.value), T.bool_)
    else:
        assert accumulate is not None
        ven = em.value(accumulate)
        if not isinstance(ven.type, T.ScalarType):
            em.error("SP0551", f"`accumulate` is one flag for the whole MMA, found {ven.type}", accumulate.span)
        ven = em.cast(ven, T.bool_)
    operands.append(ven)
    em.create("tcgen05.mma", operands, [], {"sparse": sparse, "kind": MMA_KIND[ea.name], "m": m, "n": n, "k": k,
                                            "a_tmem": isinstance(va.type, T.TmemType), "cta_group": group,
                                            "block_scale": scaled})
    return None


SCALED_TYPES = ("e4m3", "e5m2")
"""Operand types of the block-scaled kind::mxf8f6f4 sparsile can express (the kind also takes e2m3,
e3m2 and e2m1, which the language has no types for)."""


def _check_scaled_form(em: Emitter, a: Arg, b: Arg, a_scale: Arg | None, b_scale: Arg | None, va: Value,
                       ea: T.ScalarType, eb: T.ScalarType, group: int) -> None:
    """What sparsile supports of block-scaled MMAs (PTX ISA 9.7.16.10.7; docs/hardware.md §1.1-1.3):
    kind::mxf8f6f4 with ``scale_vec::1X`` (UE8M0, one scale per instruction K), both scales given,
    A and B in shared memory, cta_group::1, e4m3 / e5m2 operands."""
    missing = "a_scale" if a_scale is None else ("b_scale" if b_scale is None else None)
    if missing is not None:
        em.error("SP0559", f"a block-scaled tcgen05.mma needs both a_scale= and b_scale=; {missing}= is missing",
                 em.span, help="pass one kind=\"scale\" TMEM ref for each operand (a scale of 1.0 is byte 127)")
    for what, arg, e in (("A", a, ea), ("B", b, eb)):
        if e.name not in SCALED_TYPES:
            em.error("SP0559", f"block-scaled tcgen05.mma (kind::mxf8f6f4) takes e4m3 or e5m2 operands, but {what} is "
                     f"{e}", arg.span, help="quantize the operand with `stdlib.blockscale.quantize_mx`")
    if isinstance(va.type, T.TmemType):
        em.error("SP0559", "a block-scaled tcgen05.mma reads A from shared memory in sparsile (A in TMEM is not "
                 "lowered for kind::mxf8f6f4)", a.span)
    if group != 1:
        em.error("SP0559", "block-scaled tcgen05.mma with cta_group=2 is not supported by sparsile (its scale "
                 "layout over a CTA pair is not derived)", em.span, help="use cta_group=1 (M = 128 per instruction)")


def _scale_operand(em: Emitter, arg: Arg, what: str, rows: int, steps: int, step: int) -> Value:
    """A ``kind="scale"`` view wide enough for ``steps`` instructions over ``rows`` rows of the operand
    (``tmem_scales.scale_columns_needed``)."""
    from .tmem_scales import scale_columns_needed

    v, t = _tmem(em, arg, kinds=("scale",), what=f"the {what} scale factors in TMEM (kind=\"scale\")")
    need = scale_columns_needed(rows, steps)
    if t.shape[0] != 128 or t.shape[1] < need:
        em.error("SP0559", f"{what} scales for {rows} rows and {steps} instruction(s) of K {step} need a "
                 f"(128, >= {need}) scale view (4 columns per 128 rows and 4 K blocks), found {t}", arg.span,
                 help="copy one 512-byte scale atom per 128 rows and 4 instructions into it with tcgen05.copy")
    return v


def _cta_group(em: Emitter, arg: Arg | None, what: str) -> int:
    """The ``cta_group=`` of a tcgen05 op: 1, or 2 (a CTA pair of a cluster of even size)."""
    group = 1 if arg is None else em.constexpr(arg, "cta_group")
    span = arg.span if arg is not None else em.span
    if group not in (1, 2):
        em.error("SP0545", f"cta_group must be 1 or 2, found {group}", span)
    if group == 2:
        from .cluster import cluster_size, require_cluster

        shape = require_cluster(em, f"`{what}(..., cta_group=2)`", span)
        if cluster_size(shape) % 2:
            em.error("SP0557", f"cta_group=2 runs on CTA pairs (ranks differing in bit 0), but the cluster {shape} "
                     f"has an odd number of CTAs ({cluster_size(shape)})", span,
                     help="declare a cluster of an even size, e.g. cluster=(2, 1, 1)")
    return group


def _check_pair_shapes(em: Emitter, m: int, n: int, k: int, tb: T.SmemType, acc: Arg, b: Arg) -> None:
    """cta_group=2 (docs/hardware.md §1.2, PTX ISA 9.7.16.10.5.1 Layout A): M = 256 over the pair,
    each CTA holding 128 accumulator and A rows and half of B's N rows (the even CTA the first
    half); one instruction's N (sparsile does not split a 2-CTA MMA over N tiles)."""
    if m != 128:
        em.error("SP0555", f"with cta_group=2 each CTA holds 128 accumulator rows (M = 256 over the CTA pair), "
                 f"found {m}", acc.span, help="allocate `tmem.alloc(dtype, (128, N))` in each CTA")
    if n > 256 or n % 2:
        em.error("SP0555", f"a cta_group=2 MMA is one instruction of N <= 256 (even), found N = {n}", acc.span,
                 help="issue one MMA per 256-column slice of the accumulator")
    if tb.shape != (n // 2, k):
        em.error("SP0555", f"with cta_group=2 each CTA holds half of B: N/2 x K = {n // 2} x {k} (K-major), "
                 f"found {tb}", b.span, help="the even CTA of the pair holds B rows [0, N/2), the odd one [N/2, N)")


@builtin("copy", ns="tcgen05")
def copy(em: Emitter, src: Arg, dst: Arg, cta_group: Arg | None = None) -> None:
    """``tcgen05.cp.128x128b``: 2 KB metadata atoms ``(128, 4)`` u32 (or ``(n, 128, 4)``) from shared
    memory to the columns of a metadata ref (atom ``i`` to columns ``4i..4i+3``); with
    ``cta_group=2`` the even CTA of the pair copies in both CTAs (each from its own shared memory).
    Into a ``kind="scale"`` ref: ``tcgen05.cp.32x128b.warpx4`` of 512-byte scale atoms ``(32, 4)``
    u32 (or ``(32n, 4)``, ``(n, 32, 4)``), each duplicated into the four TMEM lane quarters."""
    group = _cta_group(em, cta_group, "tcgen05.copy")
    vs = em.value(src)
    ts = vs.type
    vd0 = em.value(dst)
    if isinstance(vd0.type, T.TmemType) and vd0.type.kind == "scale":
        _copy_scales(em, src, dst, vs, group)
        return None
    if not isinstance(ts, T.SmemType) or ts.elem != T.u32 or ts.shape[-2:] != (128, 4) or len(ts.shape) > 3 \
            or ts.swizzle:
        em.error("SP0548", f"tcgen05.copy copies 2 KB atoms: a shared buffer of (128, 4) or (n, 128, 4) u32 without "
                 f"swizzle, found {ts}", src.span, help="allocate `smem.alloc(u32, (128, 4))` and fill it by TMA from "
                 "metadata in the \"tcgen05\" format")
    vd, td = _tmem(em, dst, kinds=("meta",), what="a TMEM metadata reference")
    atoms = ts.shape[0] if len(ts.shape) == 3 else 1
    if td.shape != (128, 4 * atoms):
        em.error("SP0548", f"{atoms} atom(s) fill a (128, {4 * atoms}) metadata view, found {td}", dst.span)
    em.create("tcgen05.copy", [vs, vd], [], {"atoms": atoms, "cta_group": group})
    return None


def _copy_scales(em: Emitter, src: Arg, dst: Arg, vs: Value, group: int) -> None:
    """``tcgen05.cp.32x128b.warpx4`` per 512-byte scale atom (``tmem_scales.py``): a shared buffer of
    ``(32n, 4)`` or ``(n, 32, 4)`` u32 words into the ``4n`` columns of a scale ref."""
    from .tmem_scales import SCALE_ATOM_COLUMNS, SCALE_ATOM_LINES

    ts = vs.type
    ok = isinstance(ts, T.SmemType) and ts.elem == T.u32 and not ts.swizzle and (
        (len(ts.shape) == 2 and ts.shape[1] == 4 and ts.shape[0] % SCALE_ATOM_LINES == 0)
        or (len(ts.shape) == 3 and ts.shape[1:] == (SCALE_ATOM_LINES, 4)))
    if not ok:
        em.error("SP0548", f"tcgen05.copy of scale factors copies 512-byte atoms: a shared buffer of (32·n, 4) or "
                 f"(n, 32, 4) u32 without swizzle, found {ts}", src.span,
                 help="allocate `smem.alloc(u32, (32, 4))` per 128 rows and fill it by TMA from scales encoded by "
                      "`stdlib.blockscale.encode_scales`")
    if group != 1:
        em.error("SP0559", "block scale factors are copied with cta_group=1 only (sparsile has no block-scaled "
                 "CTA-pair MMA)", em.span)
    vd, td = _tmem(em, dst, kinds=("scale",), what="a TMEM scale reference")
    atoms = ts.shape[0] if len(ts.shape) == 3 else ts.shape[0] // SCALE_ATOM_LINES
    if td.shape != (128, SCALE_ATOM_COLUMNS * atoms):
        em.error("SP0548", f"{atoms} scale atom(s) fill a (128, {SCALE_ATOM_COLUMNS * atoms}) scale view, found {td}",
                 dst.span)
    em.create("tcgen05.copy", [vs, vd], [], {"atoms": atoms, "cta_group": 1, "scale": True})


@builtin("commit", ns="tcgen05")
def commit(em: Emitter, bar: Arg, cta_group: Arg | None = None, multicast: Arg | None = None) -> None:
    """Arrive once on ``bar`` when every tcgen05 operation issued so far by the issuing thread is
    done; ``multicast`` (a mask of cluster ranks): on the barrier at ``bar``'s offset in each of
    those CTAs instead."""
    group = _cta_group(em, cta_group, "tcgen05.commit")
    v = em.value(bar)
    if not isinstance(v.type, T.BarrierType) or v.type.count != 1:
        em.error("SP0549", f"tcgen05.commit arrives on one mbarrier, found {v.type}", bar.span,
                 help="pick one with `bars[i]`")
    operands = [v]
    if multicast is not None:
        from .cluster import cluster_size, require_cluster

        size = cluster_size(require_cluster(em, "`tcgen05.commit(..., multicast=)`", multicast.span))
        m = em.unwrap(multicast)
        if isinstance(m, Const) and isinstance(m.value, int) and not 0 < m.value < (1 << size):
            em.error("SP0554", f"the multicast mask {m.value:#x} must name CTAs of the {size}-CTA cluster "
                     f"(a non-zero mask below {1 << size:#x})", multicast.span)
        mv = em.value(multicast, like=T.i32)
        if not (isinstance(mv.type, T.ScalarType) and mv.type.is_int):
            em.error("SP0554", f"the multicast mask must be an integer scalar, found {mv.type}", multicast.span)
        operands.append(em.cast(mv, T.i32))
    em.create("tcgen05.commit", operands, [], {"cta_group": group, "multicast": multicast is not None})
    return None


@builtin("fence_before", ns="tcgen05")
def fence_before(em: Emitter) -> None:
    """``tcgen05.fence::before_thread_sync``: before an arrive/barrier that publishes TMEM work."""
    em.create("tcgen05.fence_before", [], [])
    return None


@builtin("fence_after", ns="tcgen05")
def fence_after(em: Emitter) -> None:
    """``tcgen05.fence::after_thread_sync``: after a wait, before ``tcgen05.ld`` / ``mma``."""
    em.create("tcgen05.fence_after", [], [])
    return None
