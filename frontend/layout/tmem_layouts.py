"""Named tensor-memory (TMEM) layouts: where ``tcgen05.mma`` keeps D (or a packed A) and the sparse
metadata in TMEM (PTX ISA §9.7.16.10.5 "Data Path Layout Organization"; ``docs/hardware.md``
§1.4), and the ``tcgen05.ld/st`` access atoms (``docs/hardware.md`` §2; PTX §9.7.16.2.3.1).

Provenance tags as in ``library.py`` ([D] PTX ISA text, [C] CUTLASS, [J] JAX, [T] TVM's
transcription of PTX figures).  Metadata layouts use the logical dims ``("m", M), ("chunk", K/G)``
(``hardware_dims.CHUNK_ELEMS``).
"""

from __future__ import annotations

from .gf2 import LayoutError, is_power_of_two, log2_exact, next_power_of_two
from .hardware_dims import CHUNK_ELEMS, COL, CTA, LANE, REG, SUB, WARP, layout_from_bases, operand_class, unit_bases
from .layouts import UNUSED_DIM, LinearLayout


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
    cols = unit_bases("n", packing - 1, col_bits)
    out = [("m", m), ("n", n_pad)]
    if per_cta == 128 and m in (128, 256):
        lanes = unit_bases("m", 0, 7)
    elif per_cta == 64 and (m == 64 or sparse):
        lanes = [*unit_bases("m", 0, 4), {UNUSED_DIM: 1}, {"m": 16}, {"m": 32}]
        out.append((UNUSED_DIM, 2))
    elif per_cta == 64 and m == 128:
        if n_pad // packing < 2:
            raise LayoutError("SP0401", "Layout B splits N in two halves; N must be at least 2 columns")
        lanes = [*unit_bases("m", 0, 6), {"n": n_pad // 2}]
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
        lanes = [*unit_bases("m", 0, 3), {"chunk": 4}, *unit_bases("m", 4, 3)]
        sub = [{"chunk": 1}, {"chunk": 2}, {"m": 8}]
    else:
        lanes = unit_bases("m", 0, 7)
        sub = unit_bases("chunk", 0, 3)
    rows = {LANE: lanes, COL: unit_bases("chunk", 3, col_bits), SUB: sub}
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
    reg_rows = [{"lane": lb, COL: cb} for lb, cb in reg_b] + unit_bases(COL, log2_exact(span), log2_exact(num))
    log2_exact(num_warps, "num_warps")
    warp_rows = [{"lane": 32}, {"lane": 64}][:log2_exact(min(num_warps, 4))]
    warp_rows += [{}] * (log2_exact(num_warps) - len(warp_rows))
    lanes = 32 * min(num_warps, 4)
    return layout_from_bases({REG: reg_rows, LANE: lane_rows, WARP: warp_rows},
                  [("lane", lanes), (COL, next_power_of_two(extent))])


__all__ = ["TCGEN05_MAX_NUM", "TCGEN05_SHAPES", "tcgen05_atom", "tcgen05_regs_per_num", "tmem_accumulator",
           "tmem_sparse_metadata"]
