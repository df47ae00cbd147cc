"""The builtins of tensor memory (namespace ``tmem`` and the methods of TMEM references), the typing
rules of the ``tmem.*`` ops of ``blackwell.py`` (whose docstring gives their semantics): allocation
placed at compile time in one allocation of at most 512 columns, stages, row and column slices,
``tcgen05.ld`` / ``tcgen05.st`` (PTX ISA 9.7.16; ``docs/hardware.md`` §1-2, §6-7). Codes SP0540-SP0543.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import types as T
from ..ir.core import Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .blackwell_operands import (
    A_TYPES,
    ACC_TYPES,
    META_BITS,
    TMEM_COLUMNS,
    tmem_alloc_columns,
    tmem_packing,
    tmem_tile_columns,
)


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


def tmem_arg(em: Emitter, arg: Arg, kinds: tuple[str, ...] = ("acc", "a", "meta", "scale"), rank: int | None = 2,
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
    v, t = tmem_arg(em, ref, rank=3)
    i = em.cast(em.value(index, like=T.i32), T.i32)
    if T.shape_of(i.type):
        em.error("SP0543", "a TMEM stage index must be a scalar", index.span)
    return em.op1("tmem.index", [v, i], T.TmemType(t.elem, t.shape[1:], t.kind, t.meta_bits))


@builtin("slice", method_of=(T.TmemType,), method_only=True)
def tmem_slice(em: Emitter, ref: Arg, dim: Arg, start: Arg, size: Arg) -> Value:
    """Rows ``[start, start + 128)`` (dim 0, of a 256-row view) or columns ``[start, start + size)``
    (dim 1, of a 128-row view)."""
    v, t = tmem_arg(em, ref)
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
    v, t = tmem_arg(em, ref)
    _loadable(em, t, "loading")
    return em.op1("tmem.load", [v], T.TileType(t.elem, t.shape))


@builtin("load_chunks", method_of=(T.TmemType,), method_only=True)
def tmem_load_chunks(em: Emitter, ref: Arg) -> Value:
    """Metadata as logical 4-bit codes: element ``[m, j]`` is the nibble of chunk ``j`` of row ``m``."""
    v, t = tmem_arg(em, ref, kinds=("meta",), what="a TMEM metadata reference")
    _loadable(em, t, "loading")
    return em.op1("tmem.load_chunks", [v], T.TileType(T.u8, (t.shape[0], 8 * t.shape[1])))


@builtin("store", method_of=(T.TmemType,), method_only=True)
def tmem_store(em: Emitter, ref: Arg, value: Arg) -> None:
    """Write a tile of the region's shape (``tcgen05.st``, converted to its element type)."""
    v, t = tmem_arg(em, ref)
    _loadable(em, t, "storing")
    x = em.value(value, like=t.elem)
    if T.shape_of(x.type) != t.shape:
        em.error("SP0543", f"cannot store a tile of shape {T.shape_of(x.type)} into {t}", value.span)
    em.create("tmem.store", [v, em.cast(x, t.elem)], [])
    return None
