"""TMEM access plans: how ``tcgen05.ld/st`` move a TMEM layout to or from a register layout.

Pure functions of the layout algebra returning frozen plan objects (never hand-written tables):

- :func:`tmem_access_plan` — the ``tcgen05.ld/st`` shape, ``.num``, instructions and per-thread
  (un)packing that move a TMEM layout to or from a register layout, or the reason none exists;
- :func:`tmem_register_layout` — the register layout a given shape produces.

A register layout no shape can access is converted first (:func:`conversion.conversion_plan`).
A plan that cannot be made has ``ok == False``, a ``reason`` and a ``help`` line; ``require()``
turns it into a :class:`CompileError` (SP0404).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..spans import UNKNOWN_SPAN, Span
from .gf2 import GF2Span, LayoutError, bit_list, log2_exact
from .hardware_dims import BLOCK, COL, CTA, LANE, REG, SUB, WARP, layout_from_bases
from .layouts import UNUSED_DIM, LinearLayout
from .smem import require_plan
from .tmem_layouts import TCGEN05_MAX_NUM, TCGEN05_SHAPES, tcgen05_regs_per_num

_LANE_SHIFT = 0   # W vectors: TMEM lane in bits 0..7, column in bits 8..
_COL_SHIFT = 8


def _w(lane: int, col: int) -> int:
    return lane << _LANE_SHIFT | col << _COL_SHIFT


def _w_split(v: int) -> tuple[int, int]:
    return v & 0xFF, v >> _COL_SHIFT


def _describe_w(v: int) -> str:
    lane, col = _w_split(v)
    return f"(TMEM lane +{lane}, column +{col})"


@dataclass(frozen=True)
class TmemInstruction:
    """One ``tcgen05.ld/st`` issued by every warp: TMEM address = warp base + these offsets."""

    lane_offset: int
    col_offset: int


@dataclass(frozen=True)
class RegisterSource:
    """Where one element of the register layout lives in the instructions' 32-bit registers."""

    instruction: int
    slot: int
    bit_offset: int
    bits: int


@dataclass(frozen=True)
class TmemAccessPlan:
    """How to move a TMEM layout to (``load``) or from (``store``) a register layout.

    ``warp_bases[w]`` is the (lane, column) base of warp ``w`` (lane base ``32·(w%4)`` plus the
    lane offset: warp ``w`` may only touch lanes ``32(w%4)..+31``, docs/hardware.md §2).  It is
    affine in ``w``: ``warp_bases[0]`` (the lane offset) plus the XOR of the per-bit images
    ``warp_bases[1 << b] - warp_bases[0]`` over the set bits ``b`` of ``w``.
    ``sources[r][s]`` locates element (``reg`` r, ``sub`` s) of the register layout; an element
    that is a sub-field of a 32-bit word is extracted (load) or inserted (store) with shifts:
    the per-thread unpacking.
    ``predicate`` (stores only) names the (``warp``, bit) pairs that must be 0 for a warp to
    issue the stores: a register layout that replicates over warps (a warp bit with no TMEM
    image) holds every element in several warps, and only one copy is written, so that each
    TMEM cell has one writer (PTX ISA "tcgen05.st": the instruction is ``.sync.aligned``, so
    the predicate is uniform over a warp and whole warps skip).
    """

    ok: bool
    reason: str | None = None
    help: str | None = None
    direction: str = "load"
    shape: str | None = None
    num: int = 0
    half_split: int | None = None
    regs_per_instruction: int = 0
    instructions: tuple[TmemInstruction, ...] = ()
    warp_bases: tuple[tuple[int, int], ...] = ()
    sources: tuple[tuple[RegisterSource, ...], ...] = ()
    element_bits: int = 32
    predicate: tuple[tuple[str, int], ...] = ()

    @property
    def ptx(self) -> str:
        op = "ld" if self.direction == "load" else "st"
        return f"tcgen05.{op}.sync.aligned.{self.shape}.x{self.num}.b32"

    @property
    def unpacks(self) -> bool:
        """True when some register element is not a whole 32-bit word at bit 0."""
        return any(src.bit_offset or src.bits != 32 for row in self.sources for src in row)

    def require(self, span: Span = UNKNOWN_SPAN) -> TmemAccessPlan:
        require_plan(self.ok, "SP0404", self.reason, self.help, span)
        return self


def _images(layout: LinearLayout, dim: str) -> list[dict[str, int]]:
    return [layout.basis(dim, b) for b in range(layout.in_bits(dim))] if dim in layout.in_names else []


def _check_dims(layout: LinearLayout, allowed: set[str], what: str) -> str | None:
    extra = [n for n in layout.in_names if n not in allowed]
    if extra:
        return f"the {what} layout has input dims {extra}; expected only {sorted(allowed)}"
    return None


def tmem_access_plan(tmem_layout: LinearLayout, reg_layout: LinearLayout, num_warps: int = 4, *,
                     direction: str = "load", lane_offset: int = 0,
                     max_regs_per_instruction: int = 32) -> TmemAccessPlan:
    """Find the ``tcgen05.ld/st`` atom, ``.num`` and instructions moving ``tmem_layout`` (input
    dims ``lane``, ``col``[, ``sub``][, ``cta``]) to/from ``reg_layout`` (``reg``[, ``sub``],
    ``lane``, ``warp``[, ``block``]) over the same logical dims.

    Method: ``H = reg_layout ∘ tmem_layout⁻¹`` maps register/thread bits to TMEM address bits.
    The thread (``lane``) bits of ``H`` must be one shape's per-thread mapping (docs/hardware.md
    §2); the warp bits must select the warp's own lane quarter; the per-thread bits must span the
    shape's own register bits, then ``.num`` repetitions (capped by
    ``max_regs_per_instruction``), then instruction offsets (lane + 16 for 16-lane shapes, higher
    columns).  Sub-word positions become shifts (the per-thread unpacking of packed 16-bit values
    or metadata nibbles).

    ``lane_offset`` moves every access that many lanes into each warp's quarter: 16 addresses the
    "lane alignment 16" variant of the half-datapath layouts (PTX ISA "Data Path Layout
    Organization", layouts C and F at a base 16 lanes higher).  Only a 16-lane shape whose
    instructions all stay in the upper half of the quarter can take it (PTX ISA "Tensor Memory"
    access restrictions: warp ``w`` reaches lanes ``32(w%4)..+31``); otherwise the plan fails.
    A store plan whose register layout replicates over warps carries a ``predicate``: only the
    warps whose replicated bits are 0 store.
    """
    def fail(reason: str, help: str | None = None) -> TmemAccessPlan:
        return TmemAccessPlan(False, reason, help or "convert the register layout first: "
                              "conversion_plan(reg_layout, tmem_register_layout(tmem_layout, shape))",
                              direction)

    if direction not in ("load", "store"):
        raise LayoutError("SP0404", f"direction must be 'load' or 'store', found {direction!r}")
    for msg in (_check_dims(tmem_layout, {LANE, COL, SUB, CTA}, "TMEM"),
                _check_dims(reg_layout, {REG, SUB, LANE, WARP, BLOCK}, "register")):
        if msg:
            return fail(msg, "TMEM layouts use (lane, col, sub, cta); register layouts (reg, sub, lane, warp, block)")
    logical = sorted(d for d in tmem_layout.out_dims if d[0] != UNUSED_DIM)
    if logical != sorted(reg_layout.out_dims):
        return fail(f"the layouts describe different tensors: TMEM {logical}, registers "
                    f"{sorted(reg_layout.out_dims)}", "give both layouts the same logical dims and sizes")
    if not tmem_layout.is_bijective():
        return fail("the TMEM layout is not a bijection between TMEM positions and elements",
                    "a TMEM layout must place every element exactly once")
    if reg_layout.in_size(WARP) != num_warps:
        return fail(f"the register layout spans {reg_layout.in_size(WARP)} warps, the kernel has {num_warps}",
                    "build the register layout for the kernel's number of warps")
    if reg_layout.in_size(LANE) != 32:
        return fail("the register layout does not span the 32 lanes of a warp")
    t_sub = tmem_layout.in_size(SUB)
    r_sub = reg_layout.in_size(SUB)
    if r_sub > 1 and r_sub != t_sub:
        return fail(f"element widths differ: {32 // r_sub}-bit elements in registers, "
                    f"{32 // t_sub}-bit elements in TMEM cells")
    ebits = 32 // t_sub
    h = reg_layout.compose(tmem_layout.invert())

    def img(b: dict[str, int]) -> tuple[int, int, int]:
        return _w(b.get(LANE, 0), b.get(COL, 0)), b.get(SUB, 0), b.get(CTA, 0)

    # --- threads: block -> cta, warps -> lane quarters, lanes -> one shape --------------------
    blocks = [img(b) for b in _images(h, BLOCK)]
    if tmem_layout.in_size(CTA) != reg_layout.in_size(BLOCK) or any(
            bw or bs or bc != 1 << i for i, (bw, bs, bc) in enumerate(blocks)):
        return fail("CTA bits do not line up: each CTA of the pair must access its own TMEM at the same "
                    "addresses (register dim 'block' <-> TMEM dim 'cta')")
    per_thread = [img(b) for b in _images(h, REG)] + [img(b) for b in _images(h, SUB)]
    lanes = [img(b) for b in _images(h, LANE)]
    warps = [img(b) for b in _images(h, WARP)]
    if any(c for _, _, c in per_thread + lanes + warps):
        return fail("a thread would need TMEM of the other CTA of the pair")
    if any(s for _, s, _ in lanes + warps):
        return fail("two threads would share one 32-bit TMEM word (a word goes to exactly one thread)")
    quarter_bits = min(2, log2_exact(num_warps))  # warp w%4 owns TMEM lanes 32(w%4)..+31
    warp_cols = 0
    for i, (ww, _, _) in enumerate(warps):
        wl, wc = _w_split(ww)
        want = 32 << i if i < quarter_bits else 0
        if wl != want:
            return fail(f"warp bit {i} moves to TMEM lane +{wl}; warp w may only touch lanes 32*(w%4)..+31 "
                        f"(docs/hardware.md §2), so it must move by +{want}",
                        "assign warp w%4 to the rows held in TMEM lanes 32*(w%4)..+31")
        warp_cols |= wc
    shape, half_split = _match_shape([w for w, _, _ in lanes])
    if shape is None:
        got = ", ".join(_describe_w(w) for w, _, _ in lanes)
        return fail(f"no tcgen05.ld/st shape has this thread mapping: lane bits 0..4 move to {got}")
    _lane_b, reg_b, span = TCGEN05_SHAPES[shape]
    native = [_w(lb, cb) for lb, cb in reg_b]
    lane_used = 0
    for w, _, _ in lanes:
        lane_used |= w
    # --- per-thread words --------------------------------------------------------------------
    words = GF2Span(w for w, _, _ in per_thread)
    for v in native:
        if not words.contains(v):
            return fail(f"the {shape} shape gives every thread the word at {_describe_w(v)} as well, "
                        "but the register layout does not hold it")
    max_num = TCGEN05_MAX_NUM[shape]
    num = 1
    while (num * 2 <= max_num and tcgen05_regs_per_num(shape) * num * 2 <= max_regs_per_instruction
           and words.contains(_w(0, span * num))
           and (half_split is None or span * num * 2 <= half_split)):
        num *= 2
    inside = native + [_w(0, span << i) for i in range(log2_exact(num))]
    inside_mask = 0
    for v in inside:
        inside_mask |= v
    offset_mask = _w(16 if shape != "32x32b" else 0, 0)
    col_limit = span * num
    for c in range(16):
        if (1 << c) >= col_limit and (half_split is None or (1 << c) != half_split):
            offset_mask |= _w(0, 1 << c)
    instr_span = GF2Span()
    for w, _, _ in per_thread:
        rest = w & ~inside_mask
        if rest & ~offset_mask:
            return fail(f"a register would hold the word at {_describe_w(w)}, which the {shape} shape "
                        f"cannot give to the same thread (.x{num})")
        instr_span.add(rest)
    instr_basis = instr_span.basis()
    offset_used = 0
    for v in instr_basis:
        offset_used |= v
    if warp_cols & ((inside_mask | offset_used | lane_used) >> _COL_SHIFT):
        return fail("the warps' column offsets overlap the columns each warp reads",
                    "give warps >= 4 disjoint column ranges")
    instructions = []
    for i in range(1 << len(instr_basis)):
        v = 0
        for j, bv in enumerate(instr_basis):
            if i >> j & 1:
                v ^= bv
        lane, col = _w_split(v)
        instructions.append(TmemInstruction(lane, col))
    instr_index = GF2Span(instr_basis)
    # --- the lane offset: every instruction stays in the warp's lane quarter -----------------
    footprint = 32 if shape == "32x32b" else 16
    for ins in instructions:
        start = lane_offset + ins.lane_offset
        if start not in range(0, 33 - footprint, 16):
            return fail(f"lane_offset {lane_offset} puts a {shape} access at lanes {start}..{start + footprint - 1} "
                        "of the warp's lane quarter; warp w may only touch lanes 32*(w%4)..+31, and a 16-lane "
                        "shape starts at lane 0 or 16 of its quarter",
                        "use lane_offset 16 only with a 16-lane shape (16x64b, 16x128b, 16x256b, 16x32bx2) "
                        "over a layout that fills at most 16 lanes of each quarter; otherwise lane_offset 0")
    # --- where every register element comes from ----------------------------------------------
    slot_of_bit = {}
    for j, v in enumerate(inside):
        slot_of_bit[v] = j
    reg_cols = h.flat_columns()
    offs = h.in_bit_offsets()
    sources = []
    for r in range(reg_layout.in_size(REG)):
        row = []
        for s in range(r_sub):
            w_img, sub_img = 0, 0
            for b in bit_list(r):
                wi, si, _ = img(h.decode_out(reg_cols[offs[REG] + b]))
                w_img ^= wi
                sub_img ^= si
            for b in bit_list(s):
                wi, si, _ = img(h.decode_out(reg_cols[offs[SUB] + b]))
                w_img ^= wi
                sub_img ^= si
            slot = 0
            for v, j in slot_of_bit.items():
                if w_img & v:
                    slot |= 1 << j
            instr = instr_index.solve(w_img & ~inside_mask)
            assert instr is not None
            row.append(RegisterSource(instr, slot, sub_img * ebits, ebits))
        sources.append(tuple(row))
    warp_bases = []
    for wv in range(num_warps):
        v = 0
        for b in bit_list(wv):
            v ^= warps[b][0]
        lane, col = _w_split(v)
        warp_bases.append((lane + lane_offset, col))
    # a warp bit with no TMEM image only copies the data: one copy stores (each cell one writer)
    predicate = tuple((WARP, b) for b, (ww, _, _) in enumerate(warps) if not ww) if direction == "store" else ()
    return TmemAccessPlan(True, None, None, direction, shape, num, half_split,
                          tcgen05_regs_per_num(shape) * num, tuple(instructions), tuple(warp_bases),
                          tuple(sources), ebits, predicate)


def _match_shape(lane_w: Sequence[int]) -> tuple[str | None, int | None]:
    for shape, (lane_b, _, _) in TCGEN05_SHAPES.items():
        expect = [_w(lb, cb) for lb, cb in lane_b]
        if shape == "16x32bx2":
            lane, col = _w_split(lane_w[4])
            if list(lane_w[:4]) == expect[:4] and lane == 0 and col and not col & (col - 1):
                return shape, col
            continue
        if list(lane_w) == expect:
            return shape, None
    return None, None


def tmem_register_layout(tmem_layout: LinearLayout, shape: str = "32x32b", num_warps: int = 4, *,
                         unpack: bool = False, max_regs_per_instruction: int = 32) -> LinearLayout:
    """The register layout that ``tcgen05.ld.<shape>`` produces from ``tmem_layout`` (and that
    ``tcgen05.st`` consumes).

    Threads follow the shape's mapping (docs/hardware.md §2), warp ``w`` its lane quarter; registers
    walk the shape's own registers, then ``.num`` column steps, then the remaining TMEM address
    bits that hold data (lane + 16 for 16-lane shapes, then columns).  For ``16x32bx2`` the half
    split is the highest column bit.  Warps beyond the lane quarters take the highest columns.
    Packed cells keep their ``sub`` dim (one 32-bit register per cell); ``unpack=True`` folds it
    into ``reg`` (``reg = sub + S·word``), one element per register.
    """
    if shape not in TCGEN05_SHAPES:
        raise LayoutError("SP0404", f"unknown tcgen05.ld/st shape {shape!r}", help=f"use one of {list(TCGEN05_SHAPES)}")
    tlanes, tcols = tmem_layout.in_size(LANE), tmem_layout.in_size(COL)
    data_bits = []  # W unit vectors of TMEM address bits that hold data
    for dim, count in ((LANE, log2_exact(tlanes)), (COL, log2_exact(tcols))):
        for b in range(count):
            image = tmem_layout.basis(dim, b)
            if image.get(UNUSED_DIM, 0):
                if any(v for k, v in image.items() if k != UNUSED_DIM):
                    raise LayoutError("SP0404", "TMEM layout mixes data and unused positions in one address bit")
                continue
            data_bits.append(_w(1 << b, 0) if dim == LANE else _w(0, 1 << b))
    lane_b, reg_b, span = TCGEN05_SHAPES[shape]
    thread = [_w(lb, cb) for lb, cb in lane_b]
    col_bits = [_w(0, 1 << b) for b in range(log2_exact(tcols))]
    half_split = None
    if shape == "16x32bx2":
        half_split = 1 << (log2_exact(tcols) - 1) if tcols > 1 else 0
        if not half_split:
            raise LayoutError("SP0404", "16x32bx2 needs at least 2 TMEM columns")
        thread[4] = _w(0, half_split)
    regs = [_w(lb, cb) for lb, cb in reg_b]
    used = set(thread) | set(regs)
    quarter_bits = min(2, log2_exact(num_warps))  # warp w%4 owns TMEM lanes 32(w%4)..+31
    if tlanes < 32 << quarter_bits:
        raise LayoutError("SP0404", f"{num_warps} warps read TMEM lanes 0..{(32 << quarter_bits) - 1}, "
                          f"but the layout has only {tlanes} lanes",
                          help="use fewer warps or a layout over all 128 lanes")
    warps = [_w(32 << i, 0) for i in range(quarter_bits)]
    spare_cols = [c for c in reversed(col_bits) if c not in used and c in data_bits]
    for _ in range(log2_exact(num_warps) - quarter_bits):
        warps.append(spare_cols.pop(0) if spare_cols else 0)  # further warpgroups: highest columns
    used |= set(warps)
    num = 1
    while (num * 2 <= TCGEN05_MAX_NUM[shape]
           and tcgen05_regs_per_num(shape) * num * 2 <= max_regs_per_instruction
           and _w(0, span * num) in data_bits and _w(0, span * num) not in used):
        regs.append(_w(0, span * num))
        used.add(_w(0, span * num))
        num *= 2
    for v in data_bits:
        if v not in used:
            regs.append(v)
            used.add(v)
    covered = set(data_bits)
    if not set(regs) | set(thread) | {w for w in warps if w} >= covered or any(
            v and v not in covered for v in regs + thread + warps):
        raise LayoutError("SP0404", f"the {shape} shape cannot cover this TMEM layout "
                          "(it would touch unused lanes or miss data)",
                          help="use 16x32bx2, 16x64b, 16x128b or 16x256b for half-datapath layouts")

    def as_dict(v: int) -> dict[str, int]:
        lane, col = _w_split(v)
        return {LANE: lane, COL: col}

    rows: dict[str, list[dict[str, int]]] = {REG: [as_dict(v) for v in regs]}
    out = [(LANE, tlanes), (COL, tcols)]
    if tmem_layout.in_size(SUB) > 1:
        rows[SUB] = [{SUB: 1 << b} for b in range(tmem_layout.in_bits(SUB))]
        out.append((SUB, tmem_layout.in_size(SUB)))
    rows[LANE] = [as_dict(v) for v in thread]
    rows[WARP] = [as_dict(v) for v in warps]
    if tmem_layout.in_size(CTA) > 1:
        rows[BLOCK] = [{CTA: 1 << b} for b in range(tmem_layout.in_bits(CTA))]
        out.append((CTA, tmem_layout.in_size(CTA)))
    atom = layout_from_bases(rows, out)
    result = atom.compose(tmem_layout)
    result = result.sublayout(result.in_names, [n for n in result.out_names if n != UNUSED_DIM])
    if unpack and SUB in result.in_names:
        result = result.merge_ins([REG, SUB], REG)
    return result


__all__ = [
    "RegisterSource", "TmemAccessPlan", "TmemInstruction", "tmem_access_plan", "tmem_register_layout",
]
