"""Named layouts: register, tensor-memory (TMEM) and shared-memory (SMEM) layouts of the hardware.

Every constructor returns a :class:`~sparsile.frontend.layout.layouts.LinearLayout` from hardware index
bits to logical coordinates and cites where its formula comes from.  Provenance tags follow
``docs/hardware.md``: [H] checked on an H200, [D] PTX ISA text, [C] CUTLASS, [J] JAX,
[T] TVM tirx documentation's transcription of PTX figures, [U] unverified.

Metadata layouts use the logical dims ``("m", M), ("chunk", K/G)``: one *chunk* is the group of
``G`` consecutive K elements described by one 4-bit metadata nibble (G = 4 for 16-bit and 8-bit
operands, 2 for tf32, 8 for 4-bit operands; ``docs/hardware.md`` §1.4, §3).  Packed cells and
registers carry the nibble position in the input dim ``sub`` (8 nibbles per 32-bit word).

This module holds the register layouts (blocked, the wgmma and ``mma.sp`` fragments) and is the
catalogue of all of them (``sparsile layout --list`` lists its ``__all__``): it re-exports the TMEM
layouts of ``tmem_layouts.py``, the SMEM layouts of ``smem_layouts.py`` and the dimension names
and helpers of ``hardware_dims.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .gf2 import LayoutError, log2_exact, next_power_of_two, padded_shape
from .hardware_dims import (
    BLOCK,
    CHUNK_ELEMS,
    COL,
    CTA,
    LANE,
    OFFSET,
    REG,
    SUB,
    WARP,
    layout_from_bases,
    operand_class,
    unit_bases,
)
from .layouts import LinearLayout
from .smem_layouts import (
    SWIZZLE_BYTES,
    smem_core_matrices,
    smem_from_address_map,
    smem_from_strides,
    smem_tile,
    swizzle_address,
    swizzle_name,
)
from .tmem_layouts import (
    TCGEN05_MAX_NUM,
    TCGEN05_SHAPES,
    tcgen05_atom,
    tcgen05_regs_per_num,
    tmem_accumulator,
    tmem_sparse_metadata,
)

# --------------------------------------------------------------------------------------------
# Register layouts
# --------------------------------------------------------------------------------------------

def blocked(shape: Sequence[int], size_per_thread: Sequence[int], threads_per_warp: Sequence[int],
            warps_per_cta: Sequence[int], order: Sequence[int],
            dim_names: Sequence[str] | None = None) -> LinearLayout:
    """Triton's blocked layout (``BlockedEncodingAttr``; arXiv 2505.23819 §4.1).

    Each thread holds a ``size_per_thread`` block; ``threads_per_warp`` (product 32) and
    ``warps_per_cta`` tile those blocks; ``order[0]`` is the fastest-varying logical dim.  Register
    bits walk the per-thread block in ``order``, then lanes, then warps.  A shape larger than the
    CTA tile repeats it with more registers (again in ``order``); a shape smaller than the tile is
    broadcast: the bases that would leave the shape become zero (replication).  Non-power-of-two
    extents are padded (:func:`padded_shape`).  Output dims are ``dim0, dim1, ...`` unless named.
    """
    rank = len(shape)
    for what, seq in (("size_per_thread", size_per_thread), ("threads_per_warp", threads_per_warp),
                      ("warps_per_cta", warps_per_cta), ("order", order)):
        if len(seq) != rank:
            raise LayoutError("SP0401", f"blocked: {what} has {len(seq)} entries for a rank-{rank} shape")
    if sorted(order) != list(range(rank)):
        raise LayoutError("SP0401", f"blocked: order {list(order)} is not a permutation of 0..{rank - 1}")
    for what, seq in (("size_per_thread", size_per_thread), ("threads_per_warp", threads_per_warp),
                      ("warps_per_cta", warps_per_cta)):
        for v in seq:
            log2_exact(v, f"blocked: every {what} entry")
    tpw = 1
    for v in threads_per_warp:
        tpw *= v
    if tpw != 32:
        raise LayoutError("SP0401", f"blocked: threads_per_warp {list(threads_per_warp)} covers {tpw} "
                          "threads, a warp has 32")
    names = list(dim_names) if dim_names is not None else [f"dim{i}" for i in range(rank)]
    padded = padded_shape(shape)
    layout = LinearLayout.empty()
    for in_name, per_dim in ((REG, size_per_thread), (LANE, threads_per_warp), (WARP, warps_per_cta)):
        for d in order:
            layout = layout * LinearLayout.identity(in_name, per_dim[d], names[d])
    for d in order:
        cover = layout.out_size(names[d])
        if padded[d] > cover:
            layout = layout * LinearLayout.identity(REG, padded[d] // cover, names[d])
    # broadcast: clamp every coordinate to the shape (bases are single bits per dim)
    out_dims = [(names[d], padded[d]) for d in range(rank)]
    rows = {}
    for in_name in (REG, LANE, WARP):
        row = []
        for bit in range(layout.in_bits(in_name)):
            b = layout.basis(in_name, bit)
            row.append(tuple(b[n] if b[n] < s else 0 for n, s in out_dims))
        rows[in_name] = row
    return LinearLayout.from_bases(rows, out_dims)


def wgmma_accumulator(n: int, *, packed: bool = False, warpgroups: int = 1) -> LinearLayout:
    """The ``wgmma.mma_async`` m64nN accumulator fragment (f32 or f16 D).

    docs/hardware.md §4.2 [H]: warp ``w`` holds rows 16w..16w+15; with ``g = lane/4, t = lane%4``
    element ``d[4i + 2h + b]`` is (row ``16w + g + 8h``, column ``8i + 2t + b``) (PTX Fig. 149,
    repeated along N in blocks of 8 columns).  ``packed=True`` gives the f16-accumulator view:
    ``reg`` counts ``.f16x2`` registers and ``sub`` the half (element ``2·reg + sub``).  With
    ``warpgroups > 1`` warp bit 2+ stacks further 64-row blocks (M = 64·warpgroups).
    """
    n_pad = next_power_of_two(n)
    if n % 8:  # PTX ISA "Matrix shape" of wgmma.mma_async: N = 8, 16, ..., 256 (docs/hardware.md §4.2)
        raise LayoutError("SP0401", f"wgmma accumulator: N must be a multiple of 8 (wgmma's m64nNk shapes), found {n}")
    log2_exact(warpgroups, "warpgroups")
    elem = [{"n": 1}, {"m": 8}, *unit_bases("n", 3, log2_exact(n_pad // 8))]
    rows: dict[str, list[dict[str, int]]] = {}
    if packed:
        rows[REG] = elem[1:]
        rows[SUB] = elem[:1]
    else:
        rows[REG] = elem
    rows[LANE] = [{"n": 2}, {"n": 4}, {"m": 1}, {"m": 2}, {"m": 4}]
    rows[WARP] = [{"m": 16}, {"m": 32}, *unit_bases("m", 6, log2_exact(warpgroups))]
    return layout_from_bases(rows, [("m", 64 * warpgroups), ("n", n_pad)])


def wgmma_sparse_metadata(dtype: str, spsel: int | str = 0) -> LinearLayout:
    """The metadata register of sparse ``wgmma.mma_async.sp`` (one b32 per thread, 8 nibbles).

    docs/hardware.md §4.2 [H] (PTX Figs. 176-181).  Warp ``w`` covers A rows 16w..16w+15;
    ``g = lane/4, t = lane%4``.

    - 16-bit (k32) and tf32 (k16): the threads with ``t/2 == spsel`` supply the metadata; ``t%2``
      selects the instruction's K half (chunks 4·(t%2)..+3); bits [15:0] hold row ``16w+g``, bits
      [31:16] row ``16w+g+8``.  The other thread pair's register is ignored by the hardware, so
      the layout replicates over lane bit 1 for ``spsel`` 0 and 1 (the same map; only the pair
      the hardware reads differs).  ``spsel="alternate"`` is the two-instruction layout in which
      pair ``p`` holds the metadata of instruction ``p`` (selector ``p``): 16 chunks per row.
    - 8-bit (k64, selector must be 0): every thread contributes row ``16w + g + 8·(t%2)``, K
      ``[32·(t/2), +32)`` as 8 nibbles: 16 chunks per row.  [H for s8; e4m3 per the same figure]

    Output dims ``("m", 64), ("chunk", C)``; input dims ``reg`` (1), ``sub`` (8), ``lane``, ``warp``.
    """
    cls = operand_class(dtype)
    lane_gt = [{"m": 1}, {"m": 2}, {"m": 4}]
    warp = [{"m": 16}, {"m": 32}]
    if cls in ("16bit", "tf32"):
        if spsel not in (0, 1, "alternate"):
            raise LayoutError("SP0408", f"sparsity selector must be 0, 1 or 'alternate' for {dtype}, "
                              f"found {spsel!r}", help="selectors 2 and 3 are undefined for 16-bit/tf32")
        sub = [{"chunk": 1}, {"chunk": 2}, {"m": 8}]
        pair = {"chunk": 8} if spsel == "alternate" else {}
        rows = {REG: [], SUB: sub, LANE: [{"chunk": 4}, pair, *lane_gt], WARP: warp}
        chunks = 16 if spsel == "alternate" else 8
        return layout_from_bases(rows, [("m", 64), ("chunk", chunks)])
    if cls == "8bit":
        if spsel != 0:
            raise LayoutError("SP0408", f"sparsity selector must be 0 for 8-bit operands, found {spsel!r}")
        rows = {REG: [], SUB: unit_bases("chunk", 0, 3), LANE: [{"m": 8}, {"chunk": 8}, *lane_gt], WARP: warp}
        return layout_from_bases(rows, [("m", 64), ("chunk", 16)])
    raise LayoutError("SP0408", "sparse wgmma has no 4-bit operand kind (docs/hardware.md §4.1)",
                      help="use tcgen05 (sm_100a) for e2m1 operands")


#: K (stored columns) of one wgmma instruction's A fragment per operand class; the sparse
#: instruction covers twice this logical K (its A is compressed 2:4, or 1:2 for tf32).
WGMMA_A_COLS = {"16bit": 16, "tf32": 8, "8bit": 32}


def wgmma_a_fragment(dtype: str, *, sparse: bool = False, warpgroups: int = 1) -> LinearLayout:
    """Multiplicand A of ``wgmma.mma_async`` taken from registers: four b32 registers per thread.

    PTX ISA 9.7.15.5.1.1 (Figs. 148, 150, 152 dense; 9.7.15.5.1.2 sparse figures): warp ``w`` of
    the warpgroup holds rows ``16w..16w+15``; ``g = lane/4, t = lane%4``; element ``a_i``
    (low to high):

    - 16-bit (``m64nNk16``, sparse ``k32`` over the 16 stored columns): ``a0,a1 = (g, 2t..+1)``,
      ``a2,a3 = (g+8, ·)``, ``a4,a5 = (g, 2t+8..)``, ``a6,a7 = (g+8, 2t+8..)``; two per register.
    - tf32 (``k8``, sparse ``k16`` over 8 stored columns): ``a0 = (g, t)``, ``a1 = (g+8, t)``,
      ``a2 = (g, t+4)``, ``a3 = (g+8, t+4)``; one per register.
    - 8-bit (``k32``, sparse ``k64`` over 32 stored columns): ``a0..a3 = (g, 4t..+3)``,
      ``a4..a7 = (g+8, ·)``, ``a8..a11 = (g, 4t+16..)``, ``a12..a15 = (g+8, 4t+16..)``; four per
      register.

    Per warp these are the ``mma.m16n8k16`` / ``m16n8k8`` / ``m16n8k32`` A fragments (and the
    sparse forms follow ``mma.sp``'s A on the stored values, docs/hardware.md §4.2 [U]: not run on
    the H200 yet).  ``reg`` counts elements ``a_i`` in order.  Output ``("m", 64·warpgroups),
    ("k", WGMMA_A_COLS)``: ``k`` is the *stored* column (compressed for ``sparse=True``; the
    layout is the same, the flag documents which instruction reads it).  With ``warpgroups > 1``
    warp bits 2+ stack further 64-row blocks, as in :func:`wgmma_accumulator`.
    """
    cls = operand_class(dtype)
    del sparse  # the register fragment of the stored values does not depend on it (docstring)
    gt_rows = [{"m": 1}, {"m": 2}, {"m": 4}]
    if cls == "16bit":
        reg = [{"k": 1}, {"m": 8}, {"k": 8}]
        lane = [{"k": 2}, {"k": 4}, *gt_rows]
    elif cls == "tf32":
        reg = [{"m": 8}, {"k": 4}]
        lane = [{"k": 1}, {"k": 2}, *gt_rows]
    elif cls == "8bit":
        reg = [{"k": 1}, {"k": 2}, {"m": 8}, {"k": 16}]
        lane = [{"k": 4}, {"k": 8}, *gt_rows]
    else:
        raise LayoutError("SP0408", f"wgmma has no {dtype} register A (docs/hardware.md §4.1)",
                          help="use tcgen05 (sm_100a) for 4-bit operands")
    warp = [{"m": 16}, {"m": 32}, *unit_bases("m", 6, log2_exact(warpgroups, "warpgroups"))]
    return layout_from_bases({REG: reg, LANE: lane, WARP: warp}, [("m", 64 * warpgroups), ("k", WGMMA_A_COLS[cls])])


def mma_sp_fragment(operand: str, *, packed: bool = False) -> LinearLayout:
    """Fragments of ``mma.sp::ordered_metadata.m16n8k32`` with f16/bf16 operands (one warp).

    docs/hardware.md §4.4 [H] (g = lane/4, t = lane%4):

    - ``"a"`` (compressed A, 16×16): a0,a1 = (g, 2t..+1); a2,a3 = (g+8, ·); a4,a5 = (g, 2t+8..);
      a6,a7 = (g+8, 2t+8..).  Output ``("m", 16), ("k", 16)`` (compressed K).
    - ``"b"`` (32×8): element i holds row ``2t + (i&1) + 8·(i>>1)``, column g.  ``("k", 32), ("n", 8)``.
    - ``"c"``/``"d"`` (16×8): c0,c1 = (g, 2t..+1); c2,c3 = (g+8, ·).  ``("m", 16), ("n", 8)``.
    - ``"meta"``: as the wgmma f16 metadata within one warp (replicated over the thread pair;
      selector 0 reads lanes 4g+{0,1}, selector 1 lanes 4g+{2,3}).  ``("m", 16), ("chunk", 8)``.

    ``packed=True`` (A, B) counts ``.f16x2`` registers in ``reg`` and the half in ``sub``.
    """
    gt_rows = [{"m": 1}, {"m": 2}, {"m": 4}]
    if operand == "a":
        elem = [{"k": 1}, {"m": 8}, {"k": 8}]
        lane = [{"k": 2}, {"k": 4}, *gt_rows]
        out = [("m", 16), ("k", 16)]
    elif operand == "b":
        elem = [{"k": 1}, {"k": 8}, {"k": 16}]
        lane = [{"k": 2}, {"k": 4}, {"n": 1}, {"n": 2}, {"n": 4}]
        out = [("k", 32), ("n", 8)]
    elif operand in ("c", "d"):
        if packed:
            raise LayoutError("SP0408", "mma.sp C/D fragments are f32 registers; packed=True does not apply")
        return layout_from_bases({REG: [{"n": 1}, {"m": 8}], LANE: [{"n": 2}, {"n": 4}, *gt_rows]},
                      [("m", 16), ("n", 8)])
    elif operand == "meta":
        return wgmma_sparse_metadata("f16", 0).sublayout([REG, SUB, LANE], ["m", "chunk"]).with_out_dims(
            [("m", 16), ("chunk", 8)])
    else:
        raise LayoutError("SP0408", f"unknown mma.sp operand {operand!r}",
                          help="use 'a', 'b', 'c', 'd' or 'meta'")
    rows = {REG: elem[1:], SUB: elem[:1]} if packed else {REG: elem}
    rows[LANE] = lane
    return layout_from_bases(rows, out)


__all__ = [
    "BLOCK", "CHUNK_ELEMS", "COL", "CTA", "LANE", "OFFSET", "REG", "SUB", "SWIZZLE_BYTES",
    "TCGEN05_MAX_NUM", "TCGEN05_SHAPES", "WARP", "WGMMA_A_COLS",
    "blocked", "layout_from_bases", "mma_sp_fragment", "operand_class", "smem_core_matrices",
    "smem_from_address_map", "smem_from_strides", "smem_tile", "swizzle_address", "swizzle_name",
    "tcgen05_atom", "tcgen05_regs_per_num", "tmem_accumulator", "tmem_sparse_metadata",
    "wgmma_a_fragment", "wgmma_accumulator", "wgmma_sparse_metadata",
]
