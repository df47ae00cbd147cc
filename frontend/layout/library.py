"""Named layouts: register, tensor-memory (TMEM) and shared-memory (SMEM) layouts of the hardware.

Every constructor returns a :class:`~sparsile.frontend.layout.layouts.LinearLayout` from hardware index
bits to logical coordinates and cites where its formula comes from.  Provenance tags follow
``docs/hardware.md``: [H] checked on an H200, [D] PTX ISA text, [C] CUTLASS, [J] JAX,
[T] TVM tirx documentation's transcription of PTX figures, [U] unverified.

Metadata layouts use the logical dims ``("m", M), ("chunk", K/G)``: one *chunk* is the group of
``G`` consecutive K elements described by one 4-bit metadata nibble (G = 4 for 16-bit and 8-bit
operands, 2 for tf32, 8 for 4-bit operands; ``docs/hardware.md`` §1.4, §3).  Packed cells and
registers carry the nibble position in the input dim ``sub`` (8 nibbles per 32-bit word).
"""

from __future__ import annotations

from collections.abc import Sequence

from .layouts import (
    UNUSED_DIM,
    LayoutError,
    LinearLayout,
    is_power_of_two,
    log2_exact,
    next_power_of_two,
    padded_shape,
)

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


def _units(dim: str, start: int, count: int) -> list[dict[str, int]]:
    """Bases ``dim = 2**start, 2**(start+1), ...`` (``count`` of them)."""
    return [{dim: 1 << (start + i)} for i in range(count)]


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
    if n_pad < 8:
        raise LayoutError("SP0401", f"wgmma accumulator: N must be at least 8, found {n}")
    log2_exact(warpgroups, "warpgroups")
    elem = [{"n": 1}, {"m": 8}, *_units("n", 3, log2_exact(n_pad // 8))]
    rows: dict[str, list[dict[str, int]]] = {}
    if packed:
        rows[REG] = elem[1:]
        rows[SUB] = elem[:1]
    else:
        rows[REG] = elem
    rows[LANE] = [{"n": 2}, {"n": 4}, {"m": 1}, {"m": 2}, {"m": 4}]
    rows[WARP] = [{"m": 16}, {"m": 32}, *_units("m", 6, log2_exact(warpgroups))]
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
        rows = {REG: [], SUB: _units("chunk", 0, 3), LANE: [{"m": 8}, {"chunk": 8}, *lane_gt], WARP: warp}
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
    warp = [{"m": 16}, {"m": 32}, *_units("m", 6, log2_exact(warpgroups, "warpgroups"))]
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


# --------------------------------------------------------------------------------------------
# Tensor memory
# --------------------------------------------------------------------------------------------

def tmem_accumulator(m: int, n: int, *, cta_group: int = 1, packing: int = 1,
                     sparse: bool = False) -> LinearLayout:
    """Where ``tcgen05.mma`` keeps D (or a packed A) in TMEM: (``lane``, ``col``[, ``sub``][, ``cta``])
    to ``("m", M), ("n", N)``.

    PTX ISA §9.7.16.10.5 "Data Path Layout Organization" [D] (figures as transcribed by [T]):

    - M=128, cta_group::1 (Layout D) and M=256, cta_group::2 (Layout A, per CTA): lane = row of
      the CTA's 128 rows, column = n.  CTA ``c`` of a pair holds rows ``128c..``.
    - M=64, cta_group::1 (Layout F) and M=128, cta_group::2 with sparse A (Layout C, per CTA):
      half datapath: row ``r`` of the CTA's 64 rows sits in lane ``32·(r/16) + r%16``; lanes
      16..31 of each warp quarter are unused (out dim ``unused``).  The "lane alignment 16"
      variant is the same layout at a base address 16 lanes higher.  [U for C]
    - M=128, cta_group::2 with dense A (Layout B, per CTA): row ``r`` < 64 and column ``j`` sit
      in lane ``r + 64·(j // (N/2))``, column ``j % (N/2)``.  [T][U]

    ``packing=2`` puts two 16-bit values in one 32-bit cell (``sub`` 0 = even n in the low half):
    the layout of an A operand in TMEM (JAX ``tmem_default_layout(2)`` [J]).  D itself is never
    packed (PTX §9.7.16.10.4.1: a 16-bit D sits in the low 16 bits of its cell).  Non-power-of-two
    N is padded to the next power of two.
    """
    if cta_group not in (1, 2):
        raise LayoutError("SP0408", f"cta_group must be 1 or 2, found {cta_group}")
    if packing not in (1, 2):
        raise LayoutError("SP0408", "TMEM packing must be 1 or 2 (16-bit values per 32-bit cell), "
                          f"found {packing}")
    n_pad = next_power_of_two(n)
    if n_pad < 2 * packing:
        raise LayoutError("SP0401", f"N={n} is too small for packing {packing}")
    per_cta = m // cta_group
    col_bits = log2_exact(n_pad // packing)
    sub = [{"n": 1}] if packing == 2 else []
    cols = _units("n", packing - 1, col_bits)
    out = [("m", m), ("n", n_pad)]
    if per_cta == 128 and m in (128, 256):
        lanes = _units("m", 0, 7)
    elif per_cta == 64 and (m == 64 or sparse):
        lanes = [*_units("m", 0, 4), {UNUSED_DIM: 1}, {"m": 16}, {"m": 32}]
        out.append((UNUSED_DIM, 2))
    elif per_cta == 64 and m == 128:
        if n_pad // packing < 2:
            raise LayoutError("SP0401", "Layout B splits N in two halves; N must be at least 2 columns")
        lanes = [*_units("m", 0, 6), {"n": n_pad // 2}]
        cols = cols[:-1]
    else:
        raise LayoutError("SP0408", f"no tcgen05 data-path layout for M={m} with cta_group::{cta_group}",
                          help="cta_group::1 takes M=64 or 128; cta_group::2 takes M=128 or 256")
    rows: dict[str, list[dict[str, int]]] = {LANE: lanes, COL: cols}
    if sub:
        rows[SUB] = sub
    if cta_group == 2:
        rows[CTA] = [{"m": per_cta}]
    return layout_from_bases(rows, out)


def tmem_sparse_metadata(m: int, k: int, dtype: str, *, cta_group: int = 1) -> LinearLayout:
    """The TMEM image of ``tcgen05.mma.sp`` metadata: (``lane``, ``col``, ``sub``[, ``cta``]) to
    ``("m", M), ("chunk", K/G)``.

    docs/hardware.md §1.4 (M=128 per CTA; CUTLASS ``tmem_e_frg`` and JAX
    ``format_tcgen05_sparse_metadata`` agree [C][J]):

    - 16-bit and tf32: row ``m`` and instruction K-half ``h`` live in lane
      ``16·(m/16) + 8h + m%8`` of the instruction's column; the cell's bits
      ``[16·((m/8)%2) + 4j, +4)`` hold chunk ``j`` of that half.  In chunk units (8 per column):
      lane bit 3 is chunk bit 2, nibble bits 0-1 are chunk bits 0-1, nibble bit 2 is row bit 3.
    - 8-bit and 4-bit: lane = m; nibble ``j`` of column ``c`` is chunk ``8c + j`` (bit k of the
      row for 8-bit, half a bit per element for 4-bit; 2 columns per instruction).

    M=256 (cta_group::2) is the M=128 image in each CTA.  **M=64 is not provided**: its layout
    exists only as PTX Figs. 262/264/266, which are images the fact sheet could not transcribe
    (docs/hardware.md §0 item 6, §8) — a :class:`LayoutError` SP0408 says so.
    """
    cls = operand_class(dtype)
    if cta_group not in (1, 2):
        raise LayoutError("SP0408", f"cta_group must be 1 or 2, found {cta_group}")
    if m // cta_group != 128 or m % cta_group:
        raise LayoutError(
            "SP0408", f"no known TMEM sparse-metadata layout for M={m} with cta_group::{cta_group}",
            help="use M=128 (cta_group::1) or M=256 (cta_group::2); the M=64 layout is only given as "
                 "PTX figures 262/264/266 and is unverified (docs/hardware.md §0 item 6)")
    g = CHUNK_ELEMS[cls]
    chunks = next_power_of_two(max(1, -(-k // g)))
    chunks = max(chunks, 8)  # one column holds 8 chunks; a narrower K still occupies the column
    col_bits = log2_exact(chunks // 8)
    if cls in ("16bit", "tf32"):
        lanes = [*_units("m", 0, 3), {"chunk": 4}, *_units("m", 4, 3)]
        sub = [{"chunk": 1}, {"chunk": 2}, {"m": 8}]
    else:
        lanes = _units("m", 0, 7)
        sub = _units("chunk", 0, 3)
    rows = {LANE: lanes, COL: _units("chunk", 3, col_bits), SUB: sub}
    if cta_group == 2:
        rows[CTA] = [{"m": 128}]
    return layout_from_bases(rows, [("m", m), ("chunk", chunks)])


#: (lane bases, native register bases, columns covered by one ``.num`` step) per tcgen05.ld/st
#: shape, relative to the warp's lane base; docs/hardware.md §2 per-thread mapping [C].
TCGEN05_SHAPES: dict[str, tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], int]] = {
    # 32x32b: lane t; register j = column j
    "32x32b": (((1, 0), (2, 0), (4, 0), (8, 0), (16, 0)), (), 1),
    # 16x64b: lane t/4 + 8(t%2); column (t/2)%2
    "16x64b": (((8, 0), (0, 1), (1, 0), (2, 0), (4, 0)), (), 2),
    # 16x128b: r0 = (lane t/4, column t%4); r1 = lane + 8
    "16x128b": (((0, 1), (0, 2), (1, 0), (2, 0), (4, 0)), ((8, 0),), 4),
    # 16x256b: r0,r1 = lane t/4, columns 2(t%4), +1; r2,r3 = lane + 8
    "16x256b": (((0, 2), (0, 4), (1, 0), (2, 0), (4, 0)), ((0, 1), (8, 0)), 8),
    # 16x32bx2: threads 0-15 lane t; threads 16-31 the same lanes at column + imm
    "16x32bx2": (((1, 0), (2, 0), (4, 0), (8, 0), (0, 0)), (), 1),
}

#: the largest ``.num`` per shape (docs/hardware.md §2: registers = num·k, at most 128; ptxas rejects
#: 16x256b.x64)
TCGEN05_MAX_NUM = {"32x32b": 128, "16x64b": 128, "16x128b": 64, "16x256b": 32, "16x32bx2": 128}


def tcgen05_regs_per_num(shape: str) -> int:
    return 1 << len(TCGEN05_SHAPES[shape][1])


def tcgen05_atom(shape: str, num: int = 1, *, num_warps: int = 4,
                 half_split: int | None = None) -> LinearLayout:
    """One ``tcgen05.ld/st.<shape>.x<num>`` per warp as a layout from (``reg``, ``lane``, ``warp``)
    to TMEM (``lane``, ``col``), relative to the TMEM base address.

    docs/hardware.md §2 [C] (PTX §9.7.16.2.3.1; TVM's table [T] agrees): ``.num`` repeats the
    shape's columns; warp ``w`` accesses lanes ``32·(w%4)..+31`` (16-lane shapes the first half
    of them).  Warps beyond a warpgroup repeat the same TMEM positions (zero bases).
    ``16x32bx2`` needs ``half_split``: the immediate column offset read by threads 16-31 (a power
    of two at least ``num`` so that the two halves do not overlap).
    """
    if shape not in TCGEN05_SHAPES:
        raise LayoutError("SP0404", f"unknown tcgen05.ld/st shape {shape!r}",
                          help=f"use one of {list(TCGEN05_SHAPES)}")
    if not is_power_of_two(num) or num > TCGEN05_MAX_NUM[shape]:
        raise LayoutError("SP0404", f"tcgen05 .{shape} takes .num = x1..x{TCGEN05_MAX_NUM[shape]} "
                          f"(powers of two), found x{num}")
    lane_b, reg_b, span = TCGEN05_SHAPES[shape]
    lane_rows = [{"lane": lb, COL: cb} for lb, cb in lane_b]
    extent = span * num
    if shape == "16x32bx2":
        if half_split is None or not is_power_of_two(half_split) or half_split < num:
            raise LayoutError("SP0404", f"16x32bx2 needs a power-of-two half_split >= num ({num}), "
                              f"found {half_split!r}")
        lane_rows[4] = {COL: half_split}
        extent = max(extent, 2 * half_split)
    reg_rows = [{"lane": lb, COL: cb} for lb, cb in reg_b] + _units(COL, log2_exact(span), log2_exact(num))
    log2_exact(num_warps, "num_warps")
    warp_rows = [{"lane": 32}, {"lane": 64}][:log2_exact(min(num_warps, 4))]
    warp_rows += [{}] * (log2_exact(num_warps) - len(warp_rows))
    lanes = 32 * min(num_warps, 4)
    return layout_from_bases({REG: reg_rows, LANE: lane_rows, WARP: warp_rows},
                  [("lane", lanes), (COL, next_power_of_two(extent))])


# --------------------------------------------------------------------------------------------
# Shared memory
# --------------------------------------------------------------------------------------------

SWIZZLE_BYTES = {"none": 0, "32B": 32, "64B": 64, "128B": 128}


def swizzle_name(swizzle: str | int | None) -> str:
    """Normalize ``"none"/None/0``, ``"32B"/32``, ``"64B"/64``, ``"128B"/128``."""
    if swizzle in (None, 0, 16, "none", "None"):
        return "none"
    for name, nbytes in SWIZZLE_BYTES.items():
        if swizzle in (name, nbytes, name.lower()):
            return name
    raise LayoutError("SP0406", f"unknown shared-memory swizzle {swizzle!r}",
                      help="use 'none', '32B', '64B' or '128B'")


def swizzle_address(byte_address: int, swizzle: str | int | None) -> int:
    """The hardware swizzle of a byte address (PTX ISA §5.5.7 tables; docs/hardware.md §5.3 [H]).

    The 16-byte chunk index (address bits 4..) is XORed with the 128-byte line index (bits 7..):
    ``bits[4, 4+s) ^= bits[7, 7+s)`` with s = 1, 2, 3 for 32B, 64B, 128B (CuTe Swizzle<s,4,3>).
    For 128B this is "chunk j of row r lands at j ^ (r % 8)" with 128-byte rows; for 64B and 32B
    the XOR uses the *128-byte line*, so 64-byte rows r and r+1 share a pattern.  The pattern
    repeats every 256/512/1024 bytes; bases must be aligned to that for base offset 0.
    """
    nbytes = SWIZZLE_BYTES[swizzle_name(swizzle)]
    if not nbytes:
        return byte_address
    s = log2_exact(nbytes // 16)
    return byte_address ^ (((byte_address >> 7) & ((1 << s) - 1)) << 4)


def smem_from_address_map(dims: Sequence[tuple[str, int]], bit_address_of_basis: dict[str, list[int]],
                           elem_bits: int, swizzle: str | int | None) -> LinearLayout:
    """Invert a logical -> (swizzled) address map into an ``offset -> logical`` layout."""
    ebits = log2_exact(elem_bits, "element bits")
    nbytes = SWIZZLE_BYTES[swizzle_name(swizzle)]
    mask = (nbytes // 16) - 1 if nbytes else 0
    cols = []
    for name, _ in dims:
        for addr_bits in bit_address_of_basis[name]:
            # swizzle_address on the byte part of a bit address (linear over GF(2))
            addr_bits ^= ((addr_bits >> 10) & mask) << 7
            cols.append(addr_bits >> ebits)
    total = 1
    for _, s in dims:
        total *= s
    logical_to_offset = LinearLayout._from_columns(tuple(dims), ((OFFSET, total),), cols)
    return logical_to_offset.invert()


def smem_tile(rows: int, cols: int, elem_bits: int, swizzle: str | int | None = "128B",
              dims: tuple[str, str] = ("m", "k")) -> LinearLayout:
    """A 2-D tile as TMA writes it: ``offset`` (elements) to ``(dims[0], rows), (dims[1], cols)``.

    ``dims[1]`` is contiguous.  With a swizzle of ``S`` bytes a row holds at most ``S`` bytes: a
    wider tile is stored as column panels of ``S`` bytes, each panel holding all rows (one TMA box
    per panel), panels one after another.  The swizzle is then applied to byte addresses
    (:func:`swizzle_address`).  Without swizzle the tile is plain row-major.  This is the K-major
    (dims = (mn, k)) or MN-major (dims = (k, mn)) operand tile of PTX §9.7.16.10.6 / §9.7.15.5.1.2
    when rows are packed (row pitch = min(row bytes, S)).
    """
    name = swizzle_name(swizzle)
    span = SWIZZLE_BYTES[name]
    rows_p, cols_p = padded_shape((rows, cols))
    row_bits = cols_p * elem_bits
    if name == "none":
        pitch_bits = row_bits
        panel_cols = cols_p
    else:
        pitch_bits = min(row_bits, span * 8)
        panel_cols = pitch_bits // elem_bits
        if pitch_bits < 128:
            raise LayoutError("SP0406", "a swizzled row must hold at least 16 bytes, "
                              f"found {pitch_bits // 8}")
    addr: dict[str, list[int]] = {dims[0]: [], dims[1]: []}
    for b in range(log2_exact(cols_p)):
        c = 1 << b
        if c < panel_cols:
            addr[dims[1]].append(c * elem_bits)
        else:
            addr[dims[1]].append((c // panel_cols) * rows_p * pitch_bits)
    for b in range(log2_exact(rows_p)):
        addr[dims[0]].append((1 << b) * pitch_bits)
    return smem_from_address_map([(dims[0], rows_p), (dims[1], cols_p)], addr, elem_bits, name)


def smem_core_matrices(rows: int, cols: int, elem_bits: int, *, k_major: bool = True,
                       k_groups_adjacent: bool = True, dims: tuple[str, str] = ("m", "k")) -> LinearLayout:
    """The no-swizzle ("interleaved") canonical layout of PTX §9.7.16.3.3 / §9.7.15.5.1.2.1.3.

    Core matrices are 8 rows × 16 bytes, stored contiguously (128 B).  ``dims`` are (MN, K).
    K-major: a core-matrix row runs along K; MN-major: along MN.  ``k_groups_adjacent`` chooses
    the arrangement of core matrices: K-direction neighbours adjacent (the H200-verified choice of
    docs/hardware.md §4.2, LBO = 128 B) or MN-direction neighbours adjacent (CUTLASS, §9).
    """
    mn_name, k_name = dims
    mn, k = padded_shape((rows, cols))
    t = 128 // elem_bits  # elements per 16 bytes
    contig, strided = (k, mn) if k_major else (mn, k)
    if contig < t or strided < 8:
        raise LayoutError("SP0406", f"core matrices need at least {t} contiguous elements and 8 rows")
    n_contig_groups = contig // t
    n_strided_groups = strided // 8
    addr_contig = [(1 << b) * elem_bits for b in range(log2_exact(t))]
    addr_strided = [(1 << b) * 128 for b in range(3)]
    # core-matrix grid: index (contig group, strided group)
    k_groups = n_contig_groups if k_major else n_strided_groups
    mn_groups = n_strided_groups if k_major else n_contig_groups
    k_step, mn_step = (1024, 1024 * k_groups) if k_groups_adjacent else (1024 * mn_groups, 1024)
    contig_step = k_step if k_major else mn_step
    strided_step = mn_step if k_major else k_step
    addr_contig += [(1 << b) * contig_step for b in range(log2_exact(n_contig_groups))]
    addr_strided += [(1 << b) * strided_step for b in range(log2_exact(n_strided_groups))]
    if k_major:
        addr = {k_name: addr_contig, mn_name: addr_strided}
    else:
        addr = {mn_name: addr_contig, k_name: addr_strided}
    return smem_from_address_map([(mn_name, mn), (k_name, k)], addr, elem_bits, "none")


def smem_from_strides(dims: Sequence[tuple[str, Sequence[tuple[int, int]]]], elem_bits: int,
                      swizzle: str | int | None = "none") -> LinearLayout:
    """A SMEM layout from CuTe-style ``(size, stride)`` modes per logical dim (strides in elements,
    powers of two), optionally composed with a hardware swizzle: ``Swizzle o layout`` as written
    in PTX §9.7.16.3.3.  Modes of one dim are listed minor first."""
    addr: dict[str, list[int]] = {}
    out = []
    for name, modes in dims:
        bits = []
        extent = 1
        for size, stride in modes:
            for b in range(log2_exact(size, f"mode size of {name!r}")):
                bits.append((1 << b) * stride * elem_bits)
            extent *= size
        addr[name] = bits
        out.append((name, extent))
    for name, _ in out:
        for a in addr[name]:
            if a and a & (a - 1):
                raise LayoutError("SP0401", f"stride of {name!r} is not a power of two")
    return smem_from_address_map(out, addr, elem_bits, swizzle)


__all__ = [
    "BLOCK", "CHUNK_ELEMS", "COL", "CTA", "LANE", "OFFSET", "REG", "SUB", "SWIZZLE_BYTES",
    "TCGEN05_MAX_NUM", "TCGEN05_SHAPES", "WARP",
    "blocked", "layout_from_bases", "mma_sp_fragment", "operand_class", "smem_core_matrices",
    "smem_from_address_map", "smem_from_strides", "smem_tile", "swizzle_address", "swizzle_name",
    "tcgen05_atom", "tcgen05_regs_per_num", "tmem_accumulator", "tmem_sparse_metadata",
    "wgmma_accumulator", "wgmma_sparse_metadata",
]
