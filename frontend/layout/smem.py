"""Shared-memory derivations: bank conflicts, vectorized stores/loads and matrix descriptors.

- :func:`store_plan`, :func:`storable_layout`, :func:`storable_register_layout` — whether a value
  in a register layout can be written to a SMEM layout with vectorized ``st.shared``/``stmatrix``
  and at what bank-conflict cost (seed 002: the tcgen05.ld accumulator stored to swizzled SMEM);
- :func:`smem_descriptor_fields` — swizzle mode, LBO and SBO implied by a SMEM layout
  (docs/hardware.md §1.5, §4.3, §9; PTX ISA §9.7.16.3.3 canonical layouts);
- :func:`smem_wavefronts` — the bank model both use.

A plan that cannot be made has ``ok == False``, a ``reason`` and a ``help`` line; ``require()``
turns it into a :class:`CompileError` (SP0406 descriptors, SP0407 stores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..diagnostics import error
from ..spans import UNKNOWN_SPAN, Span
from .gf2 import LayoutError, bit_list, log2_exact
from .hardware_dims import LANE, OFFSET, REG, SUB, WARP
from .layouts import UNUSED_DIM, LinearLayout
from .smem_layouts import SWIZZLE_BYTES


def require_plan(ok: bool, code: str, reason: str | None, help: str | None, span: Span) -> None:
    """Raise diagnostic ``code`` at ``span`` with the plan's ``reason`` and ``help`` unless ``ok``."""
    if not ok:
        raise error(code, reason or "no plan", span, help=help)


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
        require_plan(self.ok, "SP0407", self.reason, self.help, span)
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
        base_off = xor_images(regs, base)
        addrs = [(base_off ^ xor_images(lanes, lane)) * elem_bits // 8 for lane in range(32)]
        wavefronts += smem_wavefronts(addrs, access_bytes)
    ideal = len(groups) * max(1, 32 * access_bytes // 128)
    return StorePlan(True, None, None, method, 1 << len(vec_bits), elem_bits, False, 0, tuple(groups),
                     wavefronts, ideal, predicate if method == "st.shared" else ())


def xor_images(images: Sequence[int], index: int) -> int:
    """The image of ``index`` under a linear map over GF(2): the XOR of ``images[b]`` over the set
    bits ``b`` of ``index``."""
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
            rows = [xor_images(regs, base ^ (x << pair)) ^ xor_images(lanes, y)
                    for x in range(2) for y in range(4)]
        else:
            rows = [xor_images(regs, base) ^ xor_images(lanes, 4 * j) for j in range(8)]
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
# SMEM matrix descriptors
# ============================================================================================

SM90_SWIZZLE_CODE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
SM100_SWIZZLE_CODE = {"none": 0, "128B": 2, "64B": 4, "32B": 6}


@dataclass(frozen=True)
class SmemDescriptorFields:
    """The matrix-descriptor fields a SMEM layout implies (docs/hardware.md §1.5, §4.3, §9).

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
        require_plan(self.ok, "SP0406", self.reason, self.help, span)
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
        else:      # no swizzle: LBO = K step, SBO = MN step (docs/hardware.md §9)
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
    §9.7.15.5.1.2.1.3 with the LBO/SBO roles of docs/hardware.md §9: K-major swizzled: SBO = step
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
    "SM90_SWIZZLE_CODE", "SM100_SWIZZLE_CODE", "SmemDescriptorFields", "StorePlan", "require_plan",
    "smem_descriptor_fields", "smem_wavefronts", "storable_layout", "storable_register_layout",
    "store_plan", "xor_images",
]
