"""Derivations from the layout algebra: plans the code generator consumes.

Pure functions returning frozen plan objects (never hand-written tables):

- :func:`tmem_access_plan` — the ``tcgen05.ld/st`` shape, ``.num``, instructions and per-thread
  (un)packing that move a TMEM layout to or from a register layout, or the reason none exists;
  :func:`tmem_register_layout` — the register layout a given shape produces;
- :func:`conversion_plan` — register layout to register layout: no-op, register permutation,
  intra-warp shuffles or a round trip through shared memory, chosen by a small cost model;
- :func:`smem_descriptor_fields` — swizzle mode, LBO and SBO implied by a SMEM layout;
- :func:`store_plan`, :func:`storable_layout`, :func:`storable_register_layout` — whether a value
  in a register layout can be written to a SMEM layout with vectorized ``st.shared``/``stmatrix``
  and at what bank-conflict cost (seed 002: the tcgen05.ld accumulator stored to swizzled SMEM).

A plan that cannot be made has ``ok == False``, a ``reason`` and a ``help`` line; ``require()``
turns it into a :class:`CompileError` (codes SP0404-SP0409).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .diagnostics import error
from .layout_library import (
    BLOCK,
    COL,
    CTA,
    LANE,
    OFFSET,
    REG,
    SUB,
    SWIZZLE_BYTES,
    TCGEN05_MAX_NUM,
    TCGEN05_SHAPES,
    WARP,
    _bases,
    tcgen05_regs_per_num,
)
from .layouts import UNUSED_DIM, GF2Span, LayoutError, LinearLayout, bit_list, log2_exact
from .spans import UNKNOWN_SPAN, Span

_LANE_SHIFT = 0   # W vectors: TMEM lane in bits 0..7, column in bits 8..
_COL_SHIFT = 8


def _w(lane: int, col: int) -> int:
    return lane << _LANE_SHIFT | col << _COL_SHIFT


def _w_split(v: int) -> tuple[int, int]:
    return v & 0xFF, v >> _COL_SHIFT


def _describe_w(v: int) -> str:
    lane, col = _w_split(v)
    return f"(TMEM lane +{lane}, column +{col})"


def _require(ok: bool, code: str, reason: str | None, help: str | None, span: Span) -> None:
    if not ok:
        raise error(code, reason or "no plan", span, help=help)


# ============================================================================================
# TMEM <-> registers
# ============================================================================================

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
    lane offset: warp ``w`` may only touch lanes ``32(w%4)..+31``, hardware-facts §2).
    ``sources[r][s]`` locates element (``reg`` r, ``sub`` s) of the register layout; an element
    that is a sub-field of a 32-bit word is extracted (load) or inserted (store) with shifts:
    the per-thread unpacking.
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

    @property
    def ptx(self) -> str:
        op = "ld" if self.direction == "load" else "st"
        return f"tcgen05.{op}.sync.aligned.{self.shape}.x{self.num}.b32"

    @property
    def unpacks(self) -> bool:
        """True when some register element is not a whole 32-bit word at bit 0."""
        return any(src.bit_offset or src.bits != 32 for row in self.sources for src in row)

    def require(self, span: Span = UNKNOWN_SPAN) -> TmemAccessPlan:
        _require(self.ok, "SP0404", self.reason, self.help, span)
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
    The thread (``lane``) bits of ``H`` must be one shape's per-thread mapping (hardware-facts
    §2); the warp bits must select the warp's own lane quarter; the per-thread bits must span the
    shape's own register bits, then ``.num`` repetitions (capped by
    ``max_regs_per_instruction``), then instruction offsets (lane + 16 for 16-lane shapes, higher
    columns).  Sub-word positions become shifts (the per-thread unpacking of packed 16-bit values
    or metadata nibbles).
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
    tlanes = tmem_layout.in_size(LANE)
    quarter_bits = min(2, log2_exact(num_warps), max(0, log2_exact(tlanes) - 5))
    warp_cols = 0
    for i, (ww, _, _) in enumerate(warps):
        wl, wc = _w_split(ww)
        want = 32 << i if i < quarter_bits else 0
        if wl != want:
            return fail(f"warp bit {i} moves to TMEM lane +{wl}; warp w may only touch lanes 32*(w%4)..+31 "
                        f"(hardware-facts §2), so it must move by +{want}",
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
    return TmemAccessPlan(True, None, None, direction, shape, num, half_split,
                          tcgen05_regs_per_num(shape) * num, tuple(instructions), tuple(warp_bases),
                          tuple(sources), ebits)


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

    Threads follow the shape's mapping (hardware-facts §2), warp ``w`` its lane quarter; registers
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
    used = set(thread)
    quarter_bits = min(2, log2_exact(num_warps), max(0, log2_exact(tlanes) - 5))
    warps = [_w(32 << i, 0) for i in range(quarter_bits)]
    spare_cols = [c for c in reversed(col_bits) if c not in used and c in data_bits]
    for _ in range(log2_exact(num_warps) - quarter_bits):
        if spare_cols and len(spare_cols) > 1:
            c = spare_cols.pop(0)
            warps.append(c)
        else:
            warps.append(0)
    used |= set(warps)
    regs = [_w(lb, cb) for lb, cb in reg_b]
    used |= set(regs)
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
    atom = _bases(rows, out)
    result = atom.compose(tmem_layout)
    result = result.sublayout(result.in_names, [n for n in result.out_names if n != UNUSED_DIM])
    if unpack and SUB in result.in_names:
        result = result.merge_ins([REG, SUB], REG)
    return result


# ============================================================================================
# Shared memory accesses and bank conflicts
# ============================================================================================

def smem_wavefronts(byte_addresses: Sequence[int], access_bytes: int) -> int:
    """Shared-memory wavefronts of one warp-wide access (32 banks of 4 bytes).

    Accesses wider than 4 bytes are served in phases of ``128 / access_bytes`` consecutive lanes;
    within a phase the cost is the largest number of distinct 4-byte words any bank must serve
    (identical words are broadcast).  Narrower accesses are one phase at word granularity.
    """
    nbytes = max(4, access_bytes)
    per_phase = max(1, 128 // nbytes)
    total = 0
    for start in range(0, len(byte_addresses), per_phase):
        banks: dict[int, set[int]] = {}
        for addr in byte_addresses[start:start + per_phase]:
            first = addr // 4
            for word in range(first, first + nbytes // 4):
                banks.setdefault(word % 32, set()).add(word)
        total += max(len(ws) for ws in banks.values())
    return total


@dataclass(frozen=True)
class StorePlan:
    """A vectorized shared-memory access of a register layout (``st.shared``, ``ld.shared``,
    ``stmatrix``).  ``register_groups[i]`` lists the element (``reg``) indices of instruction
    ``i`` in vector order; ``predicate`` names the (dim, bit) that must be 0 for a thread to
    store (the other replicas skip).  Wavefronts are per warp for all instructions."""

    ok: bool
    reason: str | None = None
    help: str | None = None
    method: str = "st.shared"
    vector_elems: int = 0
    element_bits: int = 0
    transpose: bool = False
    matrices_per_instruction: int = 0
    register_groups: tuple[tuple[int, ...], ...] = ()
    wavefronts: int = 0
    ideal_wavefronts: int = 0
    predicate: tuple[tuple[str, int], ...] = ()

    @property
    def instructions(self) -> int:
        return len(self.register_groups)

    @property
    def vector_bits(self) -> int:
        return self.vector_elems * self.element_bits

    @property
    def conflict_factor(self) -> float:
        return self.wavefronts / self.ideal_wavefronts if self.ideal_wavefronts else 0.0

    def require(self, span: Span = UNKNOWN_SPAN) -> StorePlan:
        _require(self.ok, "SP0407", self.reason, self.help, span)
        return self


def _thread_to_offset(value: LinearLayout, smem: LinearLayout) -> LinearLayout | str:
    if sorted(value.out_dims) != sorted(d for d in smem.out_dims if d[0] != UNUSED_DIM):
        return (f"the value has logical dims {sorted(value.out_dims)}, the shared-memory layout "
                f"{sorted(smem.out_dims)}")
    if smem.in_names != (OFFSET,) or not smem.is_bijective():
        return "the shared-memory layout must be a bijection from 'offset' to the elements"
    if SUB in value.in_names:
        value = value.merge_ins([REG, SUB], REG)
    return value.compose(smem.invert())


def _offset_images(h: LinearLayout, dim: str) -> list[int]:
    return [h.basis(dim, b)[OFFSET] for b in range(h.in_bits(dim))] if dim in h.in_names else []


def store_plan(value: LinearLayout, smem: LinearLayout, elem_bits: int, *, method: str = "st.shared",
               width_bits: int | None = None) -> StorePlan:
    """Can ``value`` (a register layout) be stored to ``smem`` with ``method`` of ``width_bits``?

    ``method`` is ``st.shared``/``ld.shared`` (a vector of ``width_bits``: 8..128; ``None`` picks
    the widest possible) or ``stmatrix``/``stmatrix.trans`` (``m8n8.x{1,2,4}.b16``: each thread
    holds 2 adjacent 16-bit elements of row ``lane/4`` of an 8x8 matrix at columns
    ``2·(lane%4)``, PTX §9.7.14.5.16; lanes ``8i..8i+7`` give the row addresses of matrix ``i``).
    """
    def fail(reason: str, help: str | None = None) -> StorePlan:
        return StorePlan(False, reason, help, method)

    h = _thread_to_offset(value, smem)
    if isinstance(h, str):
        return fail(h)
    log2_exact(elem_bits, "element bits")
    regs = _offset_images(h, REG)
    lanes = _offset_images(h, LANE)
    warps = _offset_images(h, WARP)
    predicate = tuple((d, b) for d, imgs in ((LANE, lanes), (WARP, warps)) for b, v in enumerate(imgs) if not v)
    live_regs = [b for b, v in enumerate(regs) if v]
    if method.startswith("stmatrix"):
        return _stmatrix_plan(method, elem_bits, regs, lanes, warps, live_regs, predicate)
    if method not in ("st.shared", "ld.shared"):
        raise LayoutError("SP0407", f"unknown shared-memory access method {method!r}",
                          help="use 'st.shared', 'ld.shared', 'stmatrix' or 'stmatrix.trans'")
    # vector bits: registers holding offsets 1, 2, 4, ... (contiguous elements)
    vec_bits: list[int] = []
    max_elems = max(1, 128 // elem_bits)
    while (1 << len(vec_bits)) < max_elems:
        want = 1 << len(vec_bits)
        hit = next((b for b in live_regs if regs[b] == want and b not in vec_bits), None)
        if hit is None:
            break
        vec_bits.append(hit)
    # a vector must be aligned: every other basis (further registers, lanes, warps) a multiple of it
    others = [regs[b] for b in live_regs if b not in vec_bits] + lanes + warps
    while vec_bits and any(v & ((1 << len(vec_bits)) - 1) for v in others):
        others.append(regs[vec_bits.pop()])
    if width_bits is not None:
        need = width_bits // elem_bits
        if width_bits % elem_bits or need < 1 or need & (need - 1) or width_bits > 128:
            return fail(f"{width_bits}-bit accesses cannot hold whole {elem_bits}-bit elements")
        if need > (1 << len(vec_bits)):
            return fail(f"a {width_bits}-bit {method} needs {need} consecutive elements in one thread's "
                        f"registers; this layout gives each thread runs of {1 << len(vec_bits)}",
                        "use a narrower access or convert to a layout with longer per-thread runs")
        vec_bits = vec_bits[:log2_exact(need)]
    if (1 << len(vec_bits)) * elem_bits < 8:
        return fail(f"{elem_bits}-bit elements must be stored at least a byte at a time, and no thread holds "
                    "two adjacent ones")
    rest = [b for b in live_regs if b not in vec_bits]
    groups = []
    wavefronts = 0
    access_bytes = (1 << len(vec_bits)) * elem_bits // 8
    for i in range(1 << len(rest)):
        base = sum(1 << rest[j] for j in range(len(rest)) if i >> j & 1)
        group = tuple(base ^ sum(1 << vec_bits[j] for j in range(len(vec_bits)) if e >> j & 1)
                      for e in range(1 << len(vec_bits)))
        groups.append(group)
        base_off = _xor_images(regs, base)
        addrs = [(base_off ^ _xor_images(lanes, lane)) * elem_bits // 8 for lane in range(32)]
        wavefronts += smem_wavefronts(addrs, access_bytes)
    ideal = len(groups) * max(1, 32 * access_bytes // 128)
    return StorePlan(True, None, None, method, 1 << len(vec_bits), elem_bits, False, 0, tuple(groups),
                     wavefronts, ideal, predicate if method == "st.shared" else ())


def _xor_images(images: Sequence[int], index: int) -> int:
    v = 0
    for b in bit_list(index):
        v ^= images[b]
    return v


def _stmatrix_plan(method: str, elem_bits: int, regs: list[int], lanes: list[int], warps: list[int],
                   live_regs: list[int], predicate: tuple[tuple[str, int], ...]) -> StorePlan:
    trans = method == "stmatrix.trans"

    def fail(reason: str) -> StorePlan:
        return StorePlan(False, reason, "use st.shared, or convert to the mma/wgmma fragment layout",
                         method, transpose=trans)

    if elem_bits != 16:
        return fail(f"stmatrix stores 16-bit elements, found {elem_bits}-bit")
    if len(lanes) != 5:
        return fail("stmatrix needs a layout over the 32 lanes of a warp")
    if trans:
        # .trans: lane/4 steps along a stored 16-byte row; the register pair and lane%4 pick rows
        if lanes[2:] != [1, 2, 4] or any(v % 8 for v in lanes[:2]):
            return fail("with .trans, lane/4 must step one element along a stored 16-byte row")
        pair = next((b for b in live_regs if regs[b] % 8 == 0), None)
    else:
        if lanes[:2] != [2, 4] or any(v % 8 for v in lanes[2:]):
            return fail("stmatrix needs lane%4 to step 2 elements along a 16-byte row and lane/4 to pick "
                        "the row")
        pair = next((b for b in live_regs if regs[b] == 1), None)
    if pair is None:
        return fail("each thread must hold 2 elements of the 8x8 matrix in one register")
    others = [b for b in live_regs if b != pair]
    if any(regs[b] % 8 for b in others):
        return fail("every further register must start another 16-byte row (matrix)")
    if any(v % 8 for v in warps):
        return fail("every warp must start its own 16-byte rows")
    n_mats = 1 << len(others)
    per_instr = min(4, n_mats)
    groups = []
    wavefronts = 0
    for i in range(n_mats):
        base = sum(1 << others[j] for j in range(len(others)) if i >> j & 1)
        groups.append((base, base ^ (1 << pair)))
        if trans:
            rows = [_xor_images(regs, base ^ (x << pair)) ^ _xor_images(lanes, y)
                    for x in range(2) for y in range(4)]
        else:
            rows = [_xor_images(regs, base) ^ _xor_images(lanes, 4 * j) for j in range(8)]
        byte_rows = [r * elem_bits // 8 for r in rows]
        counts: dict[int, int] = {}
        for a in byte_rows:
            counts[(a // 16) % 8] = counts.get((a // 16) % 8, 0) + 1
        wavefronts += max(counts.values())
    instr_groups = tuple(sum(groups[k:k + per_instr], ()) for k in range(0, n_mats, per_instr))
    return StorePlan(True, None, None, method, 2, elem_bits, trans, per_instr, instr_groups, wavefronts,
                     n_mats, predicate)


def storable_layout(value: LinearLayout, smem: LinearLayout, elem_bits: int, *,
                    methods: Sequence[str] = ("stmatrix", "stmatrix.trans", "st.shared")) -> StorePlan:
    """The cheapest way to store ``value`` into ``smem`` (fewest wavefronts, then instructions),
    or a failed plan listing why each method was refused.  ``st.shared`` of single elements always
    works for byte-sized elements, so a failure means the layouts do not describe the same tensor
    (or sub-byte elements with no adjacent pair)."""
    plans = [store_plan(value, smem, elem_bits, method=m) for m in methods]
    good = [p for p in plans if p.ok]
    if good:
        return min(good, key=lambda p: (p.wavefronts, p.instructions))
    reasons = "; ".join(f"{p.method}: {p.reason}" for p in plans)
    return StorePlan(False, reasons, "insert convert_layout to a storable layout "
                     "(storable_register_layout)", "none")


def storable_register_layout(smem: LinearLayout, elem_bits: int, num_warps: int = 4,
                             width_bits: int = 128) -> LinearLayout:
    """A register layout that stores to ``smem`` with ``width_bits`` vectors and no bank
    conflicts from the data placement itself: thread ``t`` owns the ``t``-th run of
    ``width_bits`` (consecutive offsets), then warps, then further runs in registers."""
    total = smem.in_size(OFFSET)
    vec = min(total, max(1, width_bits // elem_bits))
    rows: dict[str, list[int]] = {REG: [], LANE: [], WARP: []}
    bit = 0
    nbits = log2_exact(total)
    for dim, count in ((REG, log2_exact(vec)), (LANE, 5), (WARP, log2_exact(num_warps))):
        for _ in range(count):
            rows[dim].append(1 << bit if bit < nbits else 0)
            bit += 1
    while bit < nbits:
        rows[REG].append(1 << bit)
        bit += 1
    o = LinearLayout.from_bases(rows, [(OFFSET, total)])
    return o.compose(smem)


# ============================================================================================
# Register layout conversions
# ============================================================================================

@dataclass(frozen=True)
class LinearIndex:
    """A run-time index ``const ^ XOR(masks[dim][i] for each set bit i of dim)``."""

    const: int
    masks: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def eval(self, **dims: int) -> int:
        v = self.const
        for dim, masks in self.masks:
            x = dims.get(dim, 0)
            for i, m in enumerate(masks):
                if x >> i & 1:
                    v ^= m
        return v

    @property
    def is_static(self) -> bool:
        return not any(m for _, ms in self.masks for m in ms)


@dataclass(frozen=True)
class ShuffleRound:
    """One ``shfl.sync.idx``: the receiver fills element ``dst_reg`` from lane ``src_lane`` (its own
    lane/warp); the sender passes its element ``src_reg`` (evaluated with the sender's lane/warp).
    ``local`` rounds read the thread's own registers and need no shuffle.  With ``accept`` set,
    the receiver keeps the value only if ``accept.eval(lane=own lane) == accept_value`` (a
    sender owes different registers to several receivers, so ``dst_reg`` takes several rounds)."""

    dst_reg: int
    src_lane: LinearIndex
    src_reg: LinearIndex
    local: bool = False
    accept: LinearIndex | None = None
    accept_value: int = 0


@dataclass(frozen=True)
class SmemExchange:
    smem_layout: LinearLayout
    swizzle: str
    store: StorePlan
    load: StorePlan


@dataclass(frozen=True)
class ConversionPlan:
    """How to convert a register layout ``src`` to ``dst`` over the same logical tensor.

    ``kind``: ``noop``; ``registers`` (same thread ownership: ``register_map[r]`` gives the source
    element of destination element ``r``); ``shuffle`` (same warp: ``rounds``); ``shared_memory``
    (``smem``: store with ``src``, barrier, load with ``dst``); or ``none`` with ``reason``.
    Element indices merge ``reg`` and ``sub`` (``reg·S + sub``).  ``cost`` is in issue slots per
    warp (register move 0, select 1, shuffle 2, shared-memory wavefront 2, barrier 8);
    ``considered`` lists every strategy with its cost or why it does not apply.
    """

    kind: str
    cost: float = 0.0
    reason: str | None = None
    register_map: tuple[LinearIndex, ...] = ()
    rounds: tuple[ShuffleRound, ...] = ()
    smem: SmemExchange | None = None
    considered: tuple[tuple[str, float | None, str], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.kind != "none"

    def require(self, span: Span = UNKNOWN_SPAN) -> ConversionPlan:
        _require(self.ok, "SP0409", self.reason, "the two layouts must describe the same tensor", span)
        return self


_THREAD_DIMS = (LANE, WARP, BLOCK)


def _normalize_reg_layout(layout: LinearLayout, out_order: Sequence[str]) -> LinearLayout:
    if SUB in layout.in_names:
        layout = layout.merge_ins([REG, SUB], REG)
    extra = [n for n in layout.in_names if n not in (REG, *_THREAD_DIMS)]
    if extra:
        raise LayoutError("SP0409", f"register layouts have input dims reg/sub/lane/warp/block, found {extra}")
    for n in (REG, *_THREAD_DIMS):
        if n not in layout.in_names:
            layout = layout * LinearLayout.zeros(n, 1, ())
    return layout.transpose_ins([REG, *_THREAD_DIMS]).transpose_outs(list(out_order))


STRATEGIES = ("registers", "shuffle", "shared_memory")


def conversion_plan(src: LinearLayout, dst: LinearLayout, *, elem_bits: int = 32,
                    allow: Sequence[str] = STRATEGIES) -> ConversionPlan:
    """Plan ``convert_layout(src -> dst)`` (Triton's strategy ladder, arXiv 2505.23819 §5.4, with a
    simple cost model): the cheapest of the ``allow``-ed strategies that apply (registers when
    every thread already holds what it needs, shuffles when elements stay in their warp, shared
    memory otherwise)."""
    unknown = set(allow) - set(STRATEGIES)
    if unknown:
        raise LayoutError("SP0409", f"unknown conversion strategies {sorted(unknown)}", help=f"use {STRATEGIES}")
    if sorted(src.out_dims) != sorted(dst.out_dims):
        return ConversionPlan("none", reason=f"different tensors: {sorted(src.out_dims)} vs {sorted(dst.out_dims)}")
    order = [n for n, _ in src.out_dims]
    s = _normalize_reg_layout(src, order)
    d = _normalize_reg_layout(dst, order)
    if s == d:
        return ConversionPlan("noop", 0.0, considered=(("noop", 0.0, "identical layouts"),))
    considered: list[tuple[str, float | None, str]] = []
    candidates: list[ConversionPlan] = []
    same_threads = all(s.in_size(n) == d.in_size(n) for n in _THREAD_DIMS)
    if not same_threads:
        considered.append(("registers", None, "different numbers of lanes/warps/CTAs"))
        considered.append(("shuffle", None, "different numbers of lanes/warps/CTAs"))
    else:
        reg_plan = _register_plan(s, d)
        considered.append(("registers", reg_plan.cost if reg_plan else None,
                           "same thread ownership" if reg_plan else "elements change threads"))
        if reg_plan:
            candidates.append(reg_plan)
        shfl = _shuffle_plan(s, d, elem_bits) if s.in_size(LANE) == 32 else None
        considered.append(("shuffle", shfl.cost if shfl else None,
                           "elements stay in their warp" if shfl else "elements change warps"))
        if shfl:
            candidates.append(shfl)
    smem = _smem_plan(s, d, elem_bits)
    if isinstance(smem, str):
        considered.append(("shared_memory", None, smem))
    else:
        considered.append(("shared_memory", smem.cost, f"{smem.smem.swizzle} swizzle"))
        candidates.append(smem)
    if not candidates:
        return ConversionPlan("none", reason="; ".join(f"{k}: {why}" for k, _, why in considered),
                              considered=tuple(considered))
    candidates = [c for c in candidates if c.kind in allow]
    if not candidates:
        return ConversionPlan("none", reason="no allowed strategy applies: " + "; ".join(
            f"{k}: {why}" for k, _, why in considered), considered=tuple(considered))
    best = min(candidates, key=lambda p: p.cost)
    return ConversionPlan(best.kind, best.cost, None, best.register_map, best.rounds, best.smem, tuple(considered))


def _cols(layout: LinearLayout, dim: str) -> list[int]:
    cols = layout.flat_columns()
    start = layout.in_bit_offsets()[dim]
    return list(cols[start:start + layout.in_bits(dim)])


def _register_plan(s: LinearLayout, d: LinearLayout) -> ConversionPlan | None:
    span = GF2Span(_cols(s, REG))
    const_cols = []
    for v in _cols(d, REG):
        sol = span.solve(v)
        if sol is None:
            return None
        const_cols.append(sol)
    masks = []
    for dim in _THREAD_DIMS:
        dim_masks = []
        for dv, sv in zip(_cols(d, dim), _cols(s, dim)):
            sol = span.solve(dv ^ sv)
            if sol is None:
                return None
            dim_masks.append(sol)
        masks.append((dim, tuple(dim_masks)))
    reg_map = tuple(LinearIndex(_xor_images(const_cols, r), tuple(masks)) for r in range(d.in_size(REG)))
    selects = sum(1 for m in reg_map if not m.is_static)
    return ConversionPlan("registers", float(selects), register_map=reg_map)


def _shuffle_plan(s: LinearLayout, d: LinearLayout, elem_bits: int) -> ConversionPlan | None:
    nr = s.in_bits(REG)
    span = GF2Span(_cols(s, REG) + _cols(s, LANE))

    def solve(v: int) -> tuple[int, int] | None:
        sol = span.solve(v)
        return None if sol is None else (sol & ((1 << nr) - 1), sol >> nr)

    parts: dict[str, list[tuple[int, int]]] = {}
    for dim in (REG, LANE, WARP, BLOCK):
        out = []
        for i, dv in enumerate(_cols(d, dim)):
            sv = _cols(s, dim)[i] if dim in (WARP, BLOCK) else 0
            sol = solve(dv ^ sv)
            if sol is None:
                return None
            out.append(sol)
        parts[dim] = out
    a = [r for r, _ in parts[REG]]
    e = [lane for _, lane in parts[REG]]
    b = [r for r, _ in parts[LANE]]
    f = [lane for _, lane in parts[LANE]]
    # Receivers l' with the same F·l' read the same sender; they want different registers when B
    # does not vanish on ker(F).  Then one round per value v of B on ker(F): the sender passes the
    # register for v and only receivers whose B·P_ker(l') == v keep it.
    kernel = []
    f_span = GF2Span()
    for i, col in enumerate(f):
        if not f_span.add(col):
            sol = f_span.solve(col)
            assert sol is not None
            kernel.append((1 << i) ^ sol)
    f_plus = _pseudo_inverse(f, 5)
    bk_span = GF2Span(_xor_images(b, k) for k in kernel)
    values = _span_elements(bk_span.basis())
    p_ker = [(1 << i) ^ _xor_images(f_plus, f[i]) for i in range(5)]
    accept = LinearIndex(0, ((LANE, tuple(_xor_images(b, v) for v in p_ker)),)) if len(values) > 1 else None
    shfl_cost = 2 * max(1, -(-elem_bits // 32))
    recv_masks = ((LANE, tuple(f)), (WARP, tuple(x[1] for x in parts[WARP])),
                  (BLOCK, tuple(x[1] for x in parts[BLOCK])))
    send_lane = tuple(_xor_images(b, f_plus[i]) for i in range(5))
    send_warp = tuple(_xor_images(b, _xor_images(f_plus, lane)) ^ reg for reg, lane in parts[WARP])
    send_block = tuple(_xor_images(b, _xor_images(f_plus, lane)) ^ reg for reg, lane in parts[BLOCK])
    identity_lanes = f == [1 << i for i in range(5)] and not any(x[1] for x in parts[WARP] + parts[BLOCK])
    rounds = []
    cost = 0.0
    for r in range(d.in_size(REG)):
        lane_const = _xor_images(e, r)
        base_reg = _xor_images(a, r) ^ _xor_images(b, _xor_images(f_plus, lane_const))
        src_lane = LinearIndex(lane_const, recv_masks)
        local = lane_const == 0 and identity_lanes
        for v in values:
            src_reg = LinearIndex(base_reg ^ v, ((LANE, send_lane), (WARP, send_warp), (BLOCK, send_block)))
            rounds.append(ShuffleRound(r, src_lane, src_reg, local, accept, v))
            cost += (0 if local else shfl_cost) + (0 if src_reg.is_static else 1) + (1 if accept else 0)
    return ConversionPlan("shuffle", cost, rounds=tuple(rounds))


def _span_elements(basis: Sequence[int]) -> list[int]:
    """Every XOR combination of ``basis`` (0 first)."""
    out = [0]
    for v in basis:
        out += [x ^ v for x in out]
    return out


def _pseudo_inverse(columns: Sequence[int], nbits: int) -> list[int]:
    """``P`` with ``M·P·y == y`` for ``y`` in the image of ``M`` (columns over ``nbits``-bit
    inputs); returned as the images of the unit vectors of the output space."""
    span = GF2Span(columns)
    image = [columns[i] for i in span.pivots]
    pre = [1 << i for i in span.pivots]
    basis = GF2Span(image)
    completion = list(image)
    for j in range(nbits):
        if basis.add(1 << j):
            completion.append(1 << j)
    full = GF2Span(completion)
    out = []
    for j in range(nbits):
        sol = full.solve(1 << j)
        v = 0
        for k in bit_list(sol or 0):
            if k < len(pre):
                v ^= pre[k]
        out.append(v)
    return out


def _row_major_smem(logical: Sequence[tuple[str, int]], elem_bits: int, swizzle: str,
                    order: Sequence[int]) -> LinearLayout:
    """``offset -> logical`` with logical dims flattened in ``order`` (first fastest), then a
    hardware swizzle on byte addresses."""
    addr: dict[str, list[int]] = {n: [] for n, _ in logical}
    shift = 0
    for i in order:
        name, size = logical[i]
        for _ in range(log2_exact(size)):
            addr[name].append((1 << shift) * elem_bits)
            shift += 1
    from .layout_library import _smem_from_address_map
    return _smem_from_address_map(list(logical), addr, elem_bits, swizzle)


def _smem_plan(s: LinearLayout, d: LinearLayout, elem_bits: int) -> ConversionPlan | str:
    if s.in_size(BLOCK) > 1 or d.in_size(BLOCK) > 1:
        return "the layouts span several CTAs; shared memory is per CTA"
    logical = list(s.out_dims)
    total_bytes = 1
    for _, size in logical:
        total_bytes *= size
    total_bytes = total_bytes * elem_bits // 8
    best: ConversionPlan | None = None
    rank = len(logical)
    orders = [list(range(rank - 1, -1, -1)), list(range(rank))] if rank > 1 else [[0]]
    s_sub = s.sublayout([REG, LANE, WARP], s.out_names)
    d_sub = d.sublayout([REG, LANE, WARP], d.out_names)
    for order in orders:
        for sw in ("none", "32B", "64B", "128B"):
            if sw != "none" and total_bytes < 8 * SWIZZLE_BYTES[sw]:
                continue
            smem = _row_major_smem(logical, elem_bits, sw, order)
            st = store_plan(s_sub, smem, elem_bits, method="st.shared")
            ld = store_plan(d_sub, smem, elem_bits, method="ld.shared")
            if not (st.ok and ld.ok):
                continue
            warps = s.in_size(WARP)
            cost = 2.0 * (st.wavefronts + ld.wavefronts) * warps + 8.0
            if best is None or cost < best.cost:
                best = ConversionPlan("shared_memory", cost, smem=SmemExchange(smem, sw, st, ld))
    return best if best is not None else "no shared-memory layout could hold both access patterns"


# ============================================================================================
# SMEM matrix descriptors
# ============================================================================================

SM90_SWIZZLE_CODE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
SM100_SWIZZLE_CODE = {"none": 0, "128B": 2, "64B": 4, "32B": 6}


@dataclass(frozen=True)
class SmemDescriptorFields:
    """The matrix-descriptor fields a SMEM layout implies (hardware-facts §1.5, §4.3, §9).

    ``lbo``/``sbo`` are byte strides (``lbo`` is ``None`` where the canonical layout does not use
    it; the field is then encoded as 1).  The descriptor covers ``mn_extent`` × ``k_extent``
    elements; further K (or MN) steps are start-address advances listed in ``k_offsets``
    (``mn_offsets``) as (coordinate, bytes).  ``base_alignment`` is the alignment of the tile's
    start for base offset 0 (the swizzle pattern period).
    """

    ok: bool
    reason: str | None = None
    help: str | None = None
    major: str = "K"
    swizzle: str = "none"
    lbo: int | None = None
    sbo: int = 0
    mn_extent: int = 0
    k_extent: int = 0
    k_offsets: tuple[tuple[int, int], ...] = ()
    mn_offsets: tuple[tuple[int, int], ...] = ()
    base_alignment: int = 16

    @property
    def lbo_field(self) -> int:
        return 1 if self.lbo is None else self.lbo >> 4

    @property
    def sbo_field(self) -> int:
        return self.sbo >> 4

    @property
    def swizzle_code_sm90(self) -> int:
        return SM90_SWIZZLE_CODE[self.swizzle]

    @property
    def swizzle_code_sm100(self) -> int:
        return SM100_SWIZZLE_CODE[self.swizzle]

    def require(self, span: Span = UNKNOWN_SPAN) -> SmemDescriptorFields:
        _require(self.ok, "SP0406", self.reason, self.help, span)
        return self


def _uniform_run(addrs: Sequence[int], start: int) -> tuple[int | None, int]:
    """(stride, length) of the longest prefix of ``addrs[start:]`` equal to stride·2^j."""
    if start >= len(addrs):
        return None, 0
    stride = addrs[start]
    n = 0
    while start + n < len(addrs) and addrs[start + n] == stride << n:
        n += 1
    return stride, n


def _canonical(major: str, span: int, mn: list[int], k: list[int], elem_bits: int
               ) -> SmemDescriptorFields | str:
    """Match bit addresses (in bits) of the MN and K coordinate bits against the canonical
    layouts of PTX §9.7.16.3.3 (the swizzle already undone)."""
    row_bits = span * 8 if span else 128
    contig, strided = (k, mn) if major == "K" else (mn, k)
    n_row = log2_exact(row_bits // elem_bits) if row_bits >= elem_bits else 0
    if len(contig) < n_row:
        return (f"the contiguous ({'K' if major == 'K' else 'MN'}) extent is {1 << len(contig)} elements; "
                f"a {'core-matrix' if not span else f'{span}-byte swizzle'} row needs {1 << n_row}")
    for i in range(n_row):
        if contig[i] != elem_bits << i:
            return f"element {1 << i} along the contiguous dim is not adjacent to element 0"
    if len(strided) < 3 or strided[:3] != [row_bits, 2 * row_bits, 4 * row_bits]:
        return f"8 consecutive rows must be {row_bits // 8} bytes apart"
    # strided dim beyond the 8-row group, contiguous dim beyond one row
    s_stride, s_run = _uniform_run(strided, 3)
    c_stride, c_run = _uniform_run(contig, n_row)
    for v in (s_stride, c_stride):
        if v is not None and v % 128:
            return "a core-matrix stride is not a multiple of 16 bytes"
    if major == "K":
        sbo, mn_run = s_stride, s_run
        if span:
            lbo, k_run = None, 0  # swizzled K-major: LBO unused; K beyond the row = address advance
        else:
            lbo, k_run = c_stride, c_run
        mn_ext = 8 << mn_run
        k_ext = (1 << n_row) << k_run
        k_rest = [(1 << (n_row + k_run + j), a // 8) for j, a in enumerate(contig[n_row + k_run:])]
        mn_rest = [(8 << (mn_run + j), a // 8) for j, a in enumerate(strided[3 + mn_run:])]
    else:
        if span:   # swizzled MN-major: LBO = MN step between atoms, SBO = K step between 8-row groups
            lbo, mn_run = c_stride, c_run
            sbo, k_run = s_stride, s_run
        else:      # no swizzle: LBO = K step, SBO = MN step (hardware-facts §9)
            sbo, mn_run = c_stride, c_run
            lbo, k_run = s_stride, s_run
        mn_ext = (1 << n_row) << mn_run
        k_ext = 8 << k_run
        mn_rest = [(1 << (n_row + mn_run + j), a // 8) for j, a in enumerate(contig[n_row + mn_run:])]
        k_rest = [(8 << (k_run + j), a // 8) for j, a in enumerate(strided[3 + k_run:])]
    sbo_bytes = (sbo or 0) // 8
    lbo_bytes = None if lbo is None else lbo // 8
    for name, v in (("SBO", sbo_bytes), ("LBO", lbo_bytes or 0)):
        if v >> 4 >= 1 << 14:
            return f"{name} = {v} bytes does not fit the 14-bit descriptor field"
    period = 8 * span if span else 16
    return SmemDescriptorFields(True, None, None, major, "none" if not span else f"{span}B", lbo_bytes,
                                sbo_bytes, mn_ext, k_ext, tuple(k_rest), tuple(mn_rest), period)


def smem_descriptor_fields(smem_layout: LinearLayout, elem_bits: int, major: str = "K", *,
                           mn_dim: str | None = None, k_dim: str | None = None) -> SmemDescriptorFields:
    """Swizzle mode, LBO and SBO of the wgmma/tcgen05 matrix descriptor that describes
    ``smem_layout`` (``offset`` -> (MN, K)), or the reason none does.

    The layout's byte addresses are un-swizzled with each mode (:func:`swizzle_address`, linear
    over GF(2)) and matched against the canonical layouts of PTX §9.7.16.3.3 /
    §9.7.15.5.1.2.1.3 with the LBO/SBO roles of hardware-facts §9: K-major swizzled: SBO = step
    between 8-row groups, LBO unused; K-major no swizzle: LBO = K step between core matrices,
    SBO = MN step; MN-major swizzled: LBO = MN step between swizzle atoms, SBO = K step between
    8-row groups; MN-major no swizzle: LBO = K step, SBO = MN step.  ``mn_dim``/``k_dim`` default
    to the first/second output dim.
    """
    major = major.upper()
    if major not in ("K", "MN"):
        raise LayoutError("SP0406", f"major must be 'K' or 'MN', found {major!r}")

    def fail(reason: str) -> SmemDescriptorFields:
        return SmemDescriptorFields(False, reason, "lay the tile out as TMA does with a 32/64/128-byte swizzle "
                                    "(smem_tile) or as 8x16-byte core matrices (smem_core_matrices)", major)

    names = smem_layout.out_names
    if len(names) != 2:
        return fail(f"a matrix descriptor describes a 2-D tile; the layout has output dims {list(names)}")
    mn_dim = mn_dim or names[0]
    k_dim = k_dim or (names[1] if mn_dim == names[0] else names[0])
    if {mn_dim, k_dim} != set(names):
        return fail(f"dims {mn_dim!r}/{k_dim!r} are not the layout's output dims {list(names)}")
    if smem_layout.in_names != (OFFSET,) or not smem_layout.is_bijective():
        return fail("the layout must be a bijection from 'offset' to the tile")
    try:
        log2_exact(elem_bits, "element bits")
    except LayoutError:
        return fail(f"{elem_bits}-bit elements are not a power of two bits; describe the packed container")
    inv = smem_layout.invert()
    mn = [inv.basis(mn_dim, b)[OFFSET] * elem_bits for b in range(inv.in_bits(mn_dim))]
    k = [inv.basis(k_dim, b)[OFFSET] * elem_bits for b in range(inv.in_bits(k_dim))]
    reasons = []
    for sw in ("128B", "64B", "32B", "none"):
        mask = SWIZZLE_BYTES[sw] // 16 - 1 if SWIZZLE_BYTES[sw] else 0

        def unswizzle(a: int, mask: int = mask) -> int:
            return a ^ (((a >> 10) & mask) << 7)

        umn = [unswizzle(a) for a in mn]
        uk = [unswizzle(a) for a in k]
        if any(a & (a - 1) for a in umn + uk):
            reasons.append(f"{sw}: the addresses are not a power-of-two strided layout")
            continue
        got = _canonical(major, SWIZZLE_BYTES[sw], umn, uk, elem_bits)
        if isinstance(got, SmemDescriptorFields):
            return got
        reasons.append(f"{sw}: {got}")
    return fail(f"no {major}-major canonical layout matches: " + "; ".join(reasons))


__all__ = [
    "ConversionPlan", "LinearIndex", "RegisterSource", "ShuffleRound", "SmemDescriptorFields",
    "SmemExchange", "StorePlan", "TmemAccessPlan", "TmemInstruction",
    "conversion_plan", "smem_descriptor_fields", "smem_wavefronts", "storable_layout",
    "storable_register_layout", "store_plan", "tmem_access_plan", "tmem_register_layout",
]

