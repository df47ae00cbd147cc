"""``tcgen05.ld`` / ``tcgen05.st`` thread mappings checked against the PTX ISA, end to end.

The reference below, :func:`isa_cell`, is written from the PTX ISA, chapter "Tensor Memory"
(tcgen05 family), section "Data Movement Shape", subsection "Memory Layout" ("Matrix fragments
for shape .32x32b / .16x64b / .16x128b / .16x256b / .16x32bx2", Figures 183-187), plus the
register-count table of the ``tcgen05.ld`` description (Table 49) and the "Tensor Memory access
restrictions" paragraph (warp ``w`` of a warpgroup reaches lanes ``32(w%4)..32(w%4)+31``). It is
not taken from ``docs/hardware.md`` or from the project's ``TCGEN05_SHAPES`` table. The ISA states
the thread-to-cell assignment only in figures; NVIDIA's CUTLASS copy traits
(``SM100_TMEM_LOAD_{32dp32b,16dp64b,16dp128b,16dp256b,16dp32b}1x``, thread/value -> bit layouts)
and TVM's transcription of the same figures were read to confirm the transcription (docs/blackwell.md
§10.1).

What is compared with it, over every thread and every register:

1. ``layout.tmem_layouts.tcgen05_atom`` (the per-instruction model), every shape and ``.num``;
2. ``layout.tmem_access.tmem_register_layout`` + ``tmem_access_plan`` (what code generation
   consumes), simulated as loads and as stores for several TMEM layouts;
3. the LLVM IR that ``backend/lower/blackwell.load_tile`` / ``store_tile`` emit: a small evaluator
   (``tests/backend/simt_ir.py``) runs the straight-line IR of all threads at once, executing each
   ``llvm.nvvm.tcgen05.ld/st`` call with :func:`isa_cell` against a simulated TMEM, and the loaded
   registers / stored cells are compared with the register and TMEM layouts. The PTX is then
   assembled with ptxas (sm_100a) when present.

The CPU interpreter does not model threads for TMEM (``frontend/interp/blackwell.py`` copies the
whole region), so it cannot share a wrong thread mapping with the code generator; these tests are
what check the mapping.
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest

from sparsile.backend.lower import blackwell as bw
from sparsile.backend.lower.codegen import CodeGen, DTile
from sparsile.backend.lower.llvm_text import FunctionBuilder, const
from sparsile.frontend.ir import types as T
from sparsile.frontend.ir.core import Block, Function, Region
from sparsile.frontend.layout.library import tmem_accumulator, tmem_sparse_metadata
from sparsile.frontend.layout.tmem_access import tmem_access_plan, tmem_register_layout
from sparsile.frontend.layout.tmem_layouts import TCGEN05_MAX_NUM, tcgen05_atom
from sparsile.frontend.ops.blackwell_operands import tmem_chunk_layout, tmem_view_layout
from sparsile.target.targets import get_target
from sparsile.tests.backend.simt_ir import SimtIR, apply_all

SHAPES = ("32x32b", "16x64b", "16x128b", "16x256b", "16x32bx2")


# ---------------------------------------------------------------------------------------------
# the reference, from the PTX ISA
# ---------------------------------------------------------------------------------------------

#: PTX ISA, ``tcgen05.ld`` description, Table 49 ("registers per thread"): ``regs = k * .num`` and
#: the ``.num`` range of each shape (at most 128 registers).
ISA_REGS_PER_NUM = {"32x32b": 1, "16x64b": 1, "16x128b": 2, "16x256b": 4, "16x32bx2": 1}
ISA_MAX_NUM = {"32x32b": 128, "16x64b": 128, "16x128b": 64, "16x256b": 32, "16x32bx2": 128}
#: lanes x bits of one repetition ("Data Movement Shape": shape = lanes x bits per lane)
ISA_FOOTPRINT = {"32x32b": (32, 1), "16x64b": (16, 2), "16x128b": (16, 4), "16x256b": (16, 8),
                 "16x32bx2": (16, 1)}


def isa_cell(shape: str, t: int, r: int, half_split: int | None = None) -> tuple[int, int]:
    """(lane, column) relative to ``taddr`` of register ``r`` of thread ``t`` (0..31) of one
    ``tcgen05.{ld,st}.<shape>.x<num>``; one column is 32 bits.

    PTX ISA "Matrix fragments for shape ..." (Figures 183-187). Repetition ``k`` of ``.num``
    covers the next ``bits/32`` columns of the same lanes; registers count up repetition by
    repetition. In the notation of the ISA's mma fragments, ``group = t >> 2`` and
    ``quad = t % 4``:

    - ``.32x32b`` (Fig. 183): 32 lanes, thread t owns lane t; its registers are the lane's
      consecutive 32-bit columns.
    - ``.16x64b`` (Fig. 184): 16 lanes x 2 columns, one cell per thread: lanes 0-7 belong to the
      even threads and lanes 8-15 to the odd ones; a group of four threads covers lane ``group``
      and lane ``group + 8``, the first two threads column 0, the next two column 1.
    - ``.16x128b`` (Fig. 185): 16 lanes x 4 columns, two registers: the first at lane ``group``,
      the second at lane ``group + 8``, both in column ``quad``.
    - ``.16x256b`` (Fig. 186): 16 lanes x 8 columns, four registers, arranged like the m16n8
      accumulator fragment of mma: registers 0-1 at lane ``group``, 2-3 at ``group + 8``,
      columns ``2*quad`` and ``2*quad + 1``.
    - ``.16x32bx2`` (Fig. 187): two 16-lane x 32-bit accesses: threads 0-15 own lanes 0-15 at
      ``taddr``, threads 16-31 the same lanes ``immHalfSplitoff`` columns further.
    """
    group, quad = t >> 2, t % 4
    per = ISA_REGS_PER_NUM[shape]
    rep, j = divmod(r, per)
    width = ISA_FOOTPRINT[shape][1]
    if shape == "32x32b":
        lane, col = t, 0
    elif shape == "16x64b":
        lane = group + (8 if t % 2 else 0)
        col = 1 if quad >= 2 else 0
    elif shape == "16x128b":
        lane, col = group + 8 * j, quad
    elif shape == "16x256b":
        lane, col = group + 8 * (j >> 1), 2 * quad + (j & 1)
    elif shape == "16x32bx2":
        assert half_split is not None
        lane, col = t % 16, (half_split if t >= 16 else 0)
    else:
        raise AssertionError(shape)
    return lane, col + width * rep


def test_isa_reference_covers_each_shape_footprint_exactly_once():
    """Every cell of ``lanes x (bits*num)`` is one (thread, register) pair, and the register count
    is Table 49's (a check of the transcription against the ISA's prose)."""
    for shape in SHAPES:
        lanes, width = ISA_FOOTPRINT[shape]
        for num in (1, 2, 8):
            regs = ISA_REGS_PER_NUM[shape] * num
            split = num if shape == "16x32bx2" else None
            seen = {isa_cell(shape, t, r, split) for t in range(32) for r in range(regs)}
            cols = 2 * num if shape == "16x32bx2" else width * num
            assert len(seen) == 32 * regs == lanes * cols, shape
            assert seen == set(itertools.product(range(lanes), range(cols))), shape


@functools.cache
def isa_table(shape: str, regs: int, half_split: int | None = None) -> np.ndarray:
    """:func:`isa_cell` of threads 0..31 and registers 0..regs-1, tabulated: a read-only int64 array
    of shape (32, regs, 2) holding (lane, column). The tests index it for all threads at once."""
    table = np.array([[isa_cell(shape, t, r, half_split) for r in range(regs)] for t in range(32)],
                     dtype=np.int64).reshape(32, regs, 2)
    table.setflags(write=False)
    return table


def grid(*sizes: int) -> tuple[np.ndarray, ...]:
    """Index arrays over ``range(sizes[0]) x range(sizes[1]) x ...``, broadcastable together."""
    return np.ix_(*(np.arange(n) for n in sizes))


def first_mismatch(got: np.ndarray, want: np.ndarray) -> tuple[int, ...] | None:
    """The index of the first element where ``got`` and ``want`` (broadcast) differ, or None."""
    got, want = np.broadcast_arrays(got, want)
    bad = np.argwhere(got != want)
    return tuple(int(i) for i in bad[0]) if len(bad) else None


# ---------------------------------------------------------------------------------------------
# 1. the atom model
# ---------------------------------------------------------------------------------------------

def _nums(shape: str) -> list[int]:
    return [1 << i for i in range(ISA_MAX_NUM[shape].bit_length())]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_warps", [4, 8])
def test_atom_layout_is_the_isa_mapping(shape, num_warps):
    assert TCGEN05_MAX_NUM[shape] == ISA_MAX_NUM[shape]
    for num in _nums(shape):
        splits = [num, 2 * num, 64] if shape == "16x32bx2" else [None]
        for split in splits:
            if split is not None and split < num:
                continue
            atom = tcgen05_atom(shape, num, num_warps=num_warps, half_split=split)
            regs = ISA_REGS_PER_NUM[shape] * num
            assert atom.in_size("reg") == regs, (shape, num)
            assert sorted(atom.out_names) == ["col", "lane"], (shape, num, atom.out_names)
            w, t, r = grid(num_warps, 32, regs)
            got = apply_all(atom, reg=r, lane=t, warp=w)
            isa = isa_table(shape, regs, split)
            for dim, want in (("lane", 32 * (w % 4) + isa[t, r, 0]), ("col", isa[t, r, 1])):
                bad = first_mismatch(got[dim], want)
                assert bad is None, (shape, num, split, dim, "(w, t, r) =", bad)


# ---------------------------------------------------------------------------------------------
# 2. register layouts and access plans, simulated with the ISA reference
# ---------------------------------------------------------------------------------------------

def simulate(plan, num_warps) -> np.ndarray:
    """Run ``plan``'s instructions on every thread with :func:`isa_cell`: an int64 array of shape
    (warp, thread, instruction, slot, 2) holding the TMEM (lane, column) each slot reaches. Checks
    the ISA's lane-quarter restriction on the way."""
    cells = isa_table(plan.shape, plan.regs_per_instruction, plan.half_split)  # (thread, slot, 2)
    out = np.empty((num_warps, 32, len(plan.instructions), plan.regs_per_instruction, 2), dtype=np.int64)
    for w in range(num_warps):
        lane0, col0 = plan.warp_bases[w]
        for i, ins in enumerate(plan.instructions):
            base_lane = lane0 + ins.lane_offset
            # the instruction's lanes must all lie in warp w's quarter
            lanes = ISA_FOOTPRINT[plan.shape][0]
            assert 32 * (w % 4) <= base_lane and base_lane + lanes <= 32 * (w % 4) + 32, (w, base_lane)
            out[w, :, i, :, 0] = base_lane + cells[:, :, 0]
            out[w, :, i, :, 1] = col0 + ins.col_offset + cells[:, :, 1]
    return out


def storing_warps(plan, num_warps):
    """The warps that issue a store plan's instructions: those whose ``predicate`` bits are 0."""
    mask = sum(1 << b for dim, b in plan.predicate if dim == "warp")
    return [w for w in range(num_warps) if not w & mask]


def check_plan(tmem_layout, regs, num_warps=4, lane_offset=0):
    """Load and store through the plan; each register element must meet its own TMEM cell, and
    every cell the stores reach has exactly one writer."""
    plan = tmem_access_plan(tmem_layout, regs, num_warps, lane_offset=lane_offset)
    assert plan.ok, plan.reason
    store = tmem_access_plan(tmem_layout, regs, num_warps, direction="store", lane_offset=lane_offset)
    assert store.ok and store.instructions == plan.instructions and store.warp_bases == plan.warp_bases
    word_at = simulate(plan, num_warps)
    n_sub = regs.in_size("sub")
    ebits = 32 // tmem_layout.in_size("sub")
    stored = word_at[storing_warps(store, num_warps)].reshape(-1, 2)
    cells, writers = np.unique(stored, axis=0, return_counts=True)
    assert (writers == 1).all(), f"two threads store TMEM cell {tuple(cells[np.argmax(writers > 1)])}"
    assert np.array_equal(cells, np.unique(word_at.reshape(-1, 2), axis=0)), "a cell that is loaded is not stored"
    inv = tmem_layout.invert()
    w, t, r = grid(num_warps, 32, regs.in_size("reg"))
    for s in range(max(1, n_sub)):
        srcs = [plan.sources[i][s] for i in range(regs.in_size("reg"))]
        instruction, slot, bit_offset, bits = (np.array([getattr(src, f) for src in srcs])[r]
                                               for f in ("instruction", "slot", "bit_offset", "bits"))
        point = {"reg": r, "lane": t, "warp": w}
        if "sub" in regs.in_names:
            point["sub"] = s
        want = apply_all(inv, **apply_all(regs, **point))
        got = word_at[w, t, instruction, slot]
        for dim, k in (("lane", 0), ("col", 1)):
            bad = first_mismatch(got[..., k] - (lane_offset if k == 0 else 0), want[dim])
            assert bad is None, (dim, "(w, t, r) =", bad, s)
        assert (bit_offset == ebits * want.get("sub", 0)).all() and (bits == ebits).all()
    return plan


PLAN_CASES = [
    ("acc m128 n64", tmem_accumulator(128, 64), SHAPES),
    ("acc m128 n256", tmem_accumulator(128, 256), SHAPES),
    ("acc m64 (half datapath)", tmem_accumulator(64, 32), ("16x64b", "16x128b", "16x256b", "16x32bx2")),
    ("A f16 packed", tmem_accumulator(128, 64, packing=2), SHAPES),
    ("meta f16", tmem_sparse_metadata(128, 256, "f16"), SHAPES),
    ("meta e4m3", tmem_sparse_metadata(128, 256, "e4m3"), SHAPES),
]


@pytest.mark.parametrize("name, tmem_layout, shapes", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
@pytest.mark.parametrize("unpack", [False, True])
def test_register_layout_and_plan_follow_the_isa(name, tmem_layout, shapes, unpack):
    for shape in shapes:
        try:
            regs = tmem_register_layout(tmem_layout, shape, unpack=unpack)
        except Exception as e:  # pragma: no cover - reported below
            raise AssertionError(f"{name}: {shape}: {e}") from e
        plan = check_plan(tmem_layout, regs)
        assert plan.shape == shape


def test_plans_with_eight_warps_and_a_lane_offset():
    acc = tmem_accumulator(128, 64)
    for shape in SHAPES:
        check_plan(acc, tmem_register_layout(acc, shape, num_warps=8), num_warps=8)
    half = tmem_accumulator(64, 32)  # the "lane alignment 16" variant: rows in lanes 16..31 of each quarter
    for shape in ("16x64b", "16x128b", "16x256b", "16x32bx2"):
        check_plan(half, tmem_register_layout(half, shape), lane_offset=16)
        check_plan(half, tmem_register_layout(half, shape, num_warps=8), num_warps=8, lane_offset=16)


def test_eight_warps_on_a_narrow_region_store_once():
    """A 4-column metadata region read by 16x128b leaves warpgroup 2 no columns of its own: the
    register layout replicates over warp bit 2. Loads give both warpgroups the data; the store
    plan's predicate lets only warpgroup 1 write, so each cell has one writer."""
    meta = tmem_view_layout(T.TmemType(T.u32, (128, 4), "meta", 16))
    regs = tmem_register_layout(meta, "16x128b", num_warps=8)
    assert not any(regs.basis("warp", 2).values())
    load = tmem_access_plan(meta, regs, 8)
    store = tmem_access_plan(meta, regs, 8, direction="store")
    assert load.predicate == () and store.predicate == (("warp", 2),)
    assert storing_warps(store, 8) == [0, 1, 2, 3]
    check_plan(meta, regs, num_warps=8)


@pytest.mark.parametrize("shape", SHAPES)
def test_lane_offset_that_leaves_the_quarter_is_refused(shape):
    """lane_offset 16 is the upper half of each quarter: a layout that fills all 32 lanes of a
    quarter (every 128-lane accumulator) or a 32x32b access cannot take it, and neither can an
    offset other than 0 or 16 (SP0404, with the rule in the reason and a help line)."""
    from sparsile.frontend.diagnostics import CompileError

    full = tmem_accumulator(128, 32)
    half = tmem_accumulator(64, 32)
    cases = [(full, tmem_register_layout(full, shape), 16)]
    if shape != "32x32b":
        cases.append((half, tmem_register_layout(half, shape), 8))
    for layout, regs, offset in cases:
        plan = tmem_access_plan(layout, regs, lane_offset=offset)
        assert not plan.ok, (shape, offset)
        assert f"lane_offset {offset} puts a {shape} access at lanes" in plan.reason
        assert "32*(w%4)..+31" in plan.reason and "lane 0 or 16" in plan.reason
        assert plan.help.startswith("use lane_offset 16 only with a 16-lane shape")
        with pytest.raises(CompileError) as info:
            plan.require()
        assert info.value.codes == ["SP0404"]


# ---------------------------------------------------------------------------------------------
# 3. the emitted LLVM IR, evaluated thread by thread
# ---------------------------------------------------------------------------------------------

def isa_access(name: str, tids: np.ndarray, addr: np.ndarray, split: int | None):
    """The TMEM cells of the ``tcgen05.ld/st`` intrinsic ``name`` at ``addr`` (lane << 16 | column)
    for the threads ``tids``, from :func:`isa_cell`: (lanes, columns), arrays of shape (thread,
    register). Checks that each warp stays in its lane quarter."""
    m = re.match(r"llvm\.nvvm\.tcgen05\.(ld|st)\.(\w+)\.x(\d+)$", name)
    assert m, name
    shape, num = m.group(2), int(m.group(3))
    lane0, col0 = addr >> 16, addr & 0xFFFF
    warp = tids // 32
    bad = lane0 // 32 != warp % 4
    assert not bad.any(), f"warp {warp[bad][0]} addresses TMEM lane {lane0[bad][0]} (outside its quarter)"
    cells = isa_table(shape, ISA_REGS_PER_NUM[shape] * num, split)[tids % 32]
    lanes, cols = lane0[:, None] + cells[..., 0], col0[:, None] + cells[..., 1]
    bad = lanes // 32 != (warp % 4)[:, None]
    assert not bad.any(), f"warp {warp[bad.any(axis=1)][0]} leaves its lane quarter"
    return lanes, cols


def _body(cg: CodeGen) -> list[str]:
    text = cg.fb.render()
    return [ln for ln in text.splitlines()[1:] if ln.strip() not in ("}", "ret void")]


def _codegen(num_warps: int) -> CodeGen:
    cg = CodeGen(Function("k", [], Region(Block()), {"num_warps": num_warps}), get_target("sm_100a"), num_warps)
    cg._load_lowerings()
    cg.fb = FunctionBuilder("k", [], "ptx_kernel")
    return cg


REGIONS = [
    ("f32 acc 128x64", T.TmemType(T.f32, (128, 64), "acc", 0), T.f32, False),
    ("f32 acc 256x32", T.TmemType(T.f32, (256, 32), "acc", 0), T.f32, False),
    ("f16 acc 128x32", T.TmemType(T.f16, (128, 32), "acc", 0), T.f16, False),
    ("f32 acc 64x32 (M = 64, Layout F)", T.TmemType(T.f32, (64, 32), "acc", 0), T.f32, False),
    ("f16 A packed 128x64", T.TmemType(T.f16, (128, 64), "a", 0), T.f16, False),
    ("meta words 128x4", T.TmemType(T.u32, (128, 4), "meta", 16), T.u32, False),
    ("meta chunks f16 128x4", T.TmemType(T.u32, (128, 4), "meta", 16), T.u8, True),
    ("meta chunks e4m3 128x4", T.TmemType(T.u32, (128, 4), "meta", 8), T.u8, True),
]


@pytest.mark.parametrize("n", [8, 64, 256])
def test_a_64_row_accumulator_view_is_layout_f(n):
    """The M = 64 ``cta_group::1`` D (PTX ISA "Data Path Layout Organization", Layout F), written out:
    row r in lane 32·(r // 16) + r % 16, column c in column c; lanes 16..31 of each quarter hold
    nothing. The register layout is ``16x32bx2``: thread t row t % 16 of its warp's 16 rows, threads
    16..31 the columns from N/2 on (the ISA table, ``isa_cell``)."""
    t = T.TmemType(T.f32, (64, n), "acc", 0)
    tl = tmem_view_layout(t)
    r, c = np.meshgrid(np.arange(64), np.arange(n), indexing="ij")
    where = apply_all(_inverse(tl), dim0=r, dim1=c)
    assert (where["lane"] == 32 * (r // 16) + r % 16).all() and (where["col"] == c).all()
    regs = bw.register_layout(t, 4)
    plan = tmem_access_plan(tl, regs, 4)
    assert plan.ok and plan.shape == "16x32bx2" and plan.half_split == n // 2
    w, th, reg = grid(4, 32, regs.in_size("reg"))
    got = apply_all(regs, reg=reg, lane=th, warp=w)
    cells = isa_table("16x32bx2", regs.in_size("reg"), n // 2)[th, reg]
    assert (got["dim0"] == 16 * w + cells[..., 0]).all() and (got["dim1"] == cells[..., 1]).all()


def _cases():
    """Every region with every shape at 4 and at 8 warps (all threads of a case run at once, in
    numpy: the whole cross product takes about a second)."""
    for name, t, elem, chunks in REGIONS:
        for shape in SHAPES:
            for nw in (4, 8):
                yield pytest.param(t, elem, chunks, shape, nw, id=f"{name}-{shape}-w{nw}")


def _ref_layouts(t, chunks, shape, nw):
    tl = tmem_chunk_layout(t) if chunks else tmem_view_layout(t)
    try:
        regs = tmem_register_layout(tl, shape, nw, unpack=True)
    except Exception:
        return tl, None
    return tl, regs


_INVERSES: dict[int, tuple] = {}


def _inverse(tl):
    """``tl.invert()``, once per layout object (it was inverted for every element: most of a case's time)."""
    key = id(tl)
    if key not in _INVERSES or _INVERSES[key][0] is not tl:
        _INVERSES[key] = (tl, tl.invert())
    return _INVERSES[key][1]


def _cells(tl, regs, nw, lane_offset=0):
    """TMEM (lane, col, sub) of every element (warp, thread, register): the layouts' answer,
    ``lane_offset`` lanes further; int64 arrays of shape (nw, 32, registers)."""
    w, t, r = grid(nw, 32, regs.in_size("reg"))
    where = apply_all(_inverse(tl), **apply_all(regs, reg=r, lane=t, warp=w))
    return where["lane"] + lane_offset, where["col"], where.get("sub", np.zeros_like(where["lane"]))


def _elements(tl, elem, tmem_words, cells):
    """The element each of ``cells`` holds in ``tmem_words`` ([lane, col] -> 32-bit word)."""
    lane, col, sub = cells
    sub_bits = 32 // tl.in_size("sub")
    field = (tmem_words[lane, col] >> (sub_bits * sub)) & ((1 << sub_bits) - 1)
    return field & ((1 << min(elem.bits, sub_bits)) - 1)


def _wlr(shape, bad):
    """A mismatch at (thread, register) as the (shape, warp, lane, register) of an assertion message."""
    return None if bad is None else (shape, bad[0] // 32, bad[0] % 32, bad[1])


def check_emitted(t, tl, regs, elem, chunks, nw, lane_offset=0):
    """Emit ``load_tile`` and ``store_tile`` of ``regs`` and run them on all threads against
    the ISA reference: every thread loads its own elements, and every element's cell is stored
    exactly once (by the copy in the warp whose replicated warp bits are 0)."""
    shape = tmem_access_plan(tl, regs, nw, lane_offset=lane_offset).shape
    rng = np.random.default_rng(11)
    lanes, cols = 128, tl.in_size("col")
    image = rng.integers(0, 2**32, size=(lanes, cols), dtype=np.int64)
    n_regs = regs.in_size("reg")
    tids = np.arange(32 * nw)
    cells = tuple(c.reshape(32 * nw, n_regs) for c in _cells(tl, regs, nw, lane_offset))  # [tid, reg]

    # ---- load: registers of every thread
    cg = _codegen(nw)
    ref = bw.TmemRef(const(0, "i32"), t, t.shape[-1], 0)
    tile = bw.load_tile(cg, ref, regs, elem, None, chunks, lane_offset=lane_offset)
    assert tile.layout == regs, f"{shape}: load_tile converted instead of loading with {shape}"
    ev = SimtIR(_body(cg), tids, isa_access, tmem=image)
    got = np.stack([ev.gather(tile.regs[r].ref, 32 * nw) for r in range(n_regs)], axis=1).astype(np.int64)
    bad = first_mismatch(got & ((1 << elem.bits) - 1), _elements(tl, elem, image, cells))
    assert bad is None, _wlr(shape, bad)

    if chunks:
        return  # metadata chunks are only loaded
    # ---- store: element (thread, reg) gets a value made of its own coordinates
    cg = _codegen(nw)
    fb = cg.fb
    vals = []
    ity = f"i{elem.bits}"
    for r in range(n_regs):
        v = fb.binop("add", fb.binop("mul", cg.tid, const(n_regs, "i32")), const(r, "i32"))
        if elem.bits < 32:
            v = fb.cast("trunc", fb.binop("and", v, const((1 << elem.bits) - 1, "i32")), ity)
        if elem.is_float:
            v = fb.cast("bitcast", v, {32: "float", 16: "half"}[elem.bits])
        vals.append(v)
    bw.store_tile(cg, bw.TmemRef(const(0, "i32"), t, t.shape[-1], 0), DTile(regs, vals, elem), None,
                  lane_offset=lane_offset)
    writes: list = []
    SimtIR(_body(cg), tids, isa_access, writes=writes)
    w_lane, w_col, w_val = (np.concatenate([wr[k] for wr in writes]).astype(np.int64) for k in (1, 2, 3))
    written, count = np.unique(np.stack([w_lane, w_col], axis=1), axis=0, return_counts=True)
    expected = np.unique(np.stack([cells[0].ravel(), cells[1].ravel()], axis=1), axis=0)
    assert np.array_equal(written, expected), f"{shape}: the stores do not cover the region exactly"
    assert (count == 1).all(), f"{shape}: a TMEM cell has several writers"
    stored = np.zeros((int(written[:, 0].max()) + 1, int(written[:, 1].max()) + 1), dtype=np.int64)
    stored[w_lane, w_col] = w_val
    # warps that differ only in replicated warp bits (a zero warp basis) hold the same elements;
    # the copy of the warp with those bits 0 is the one written
    replicated = sum(1 << b for b in range(regs.in_bits("warp")) if not any(regs.basis("warp", b).values()))
    writer = 32 * ((tids // 32) & ~replicated) + tids % 32
    expect = (writer[:, None] * n_regs + np.arange(n_regs)) & ((1 << elem.bits) - 1)
    bad = first_mismatch(_elements(tl, elem, stored, cells), expect)
    assert bad is None, _wlr(shape, bad)


@pytest.mark.parametrize("t, elem, chunks, shape, nw", list(_cases()))
def test_emitted_loads_and_stores_follow_the_isa(t, elem, chunks, shape, nw):
    tl, regs = _ref_layouts(t, chunks, shape, nw)
    if regs is None or tmem_access_plan(tl, regs, nw).ok is False:
        pytest.skip(f"{shape} cannot access this region with {nw} warps")
    check_emitted(t, tl, regs, elem, chunks, nw)


@pytest.mark.parametrize("shape", ("16x64b", "16x128b", "16x256b", "16x32bx2"))
@pytest.mark.parametrize("nw", [4, 8])
def test_emitted_accesses_with_a_lane_offset_follow_the_isa(monkeypatch, shape, nw):
    """The M = 64 half-datapath accumulator at "lane alignment 16" (PTX ISA "Data Path Layout
    Organization", layout F 16 lanes higher): rows in lanes 16..31 of each quarter. Warp 0's
    base is lane 16, not 0, so the per-bit warp images alone would address warp 0 at lane 0 and
    warp 3 at lane 128 (outside TMEM)."""
    half = tmem_accumulator(64, 32)
    monkeypatch.setattr(bw, "tmem_view_layout", lambda t: half)  # the region's image in TMEM
    regs = tmem_register_layout(half, shape, nw, unpack=True)
    assert tmem_access_plan(half, regs, nw, lane_offset=16).warp_bases[0] == (16, 0)
    check_emitted(T.TmemType(T.f32, (128, 32), "acc", 0), half, regs, T.f32, False, nw, lane_offset=16)


def test_emitted_accesses_with_overlapping_warp_images(monkeypatch):
    """A register layout whose warp images share an address bit (warp bit 0: lane +32 and column
    +4; warp bit 2: column +4) is a valid plan: the images combine by XOR (warp 5 at lanes
    32..63, column 0), which a sum of per-bit images gets wrong (column 8, outside the region)."""
    from sparsile.frontend.layout.layouts import LinearLayout

    t = T.TmemType(T.f32, (128, 8), "acc", 0)
    tl = tmem_view_layout(t)
    regs = tmem_register_layout(tl, "32x32b", 8, unpack=True)
    w = regs.in_names.index("warp")
    bases = list(regs.bases)
    assert bases[w] == ((32, 0), (64, 0), (0, 4))  # (row, column): TMEM lane, column of the view
    bases[w] = ((32, 4), (64, 0), (0, 4))
    regs = LinearLayout(regs.in_dims, regs.out_dims, tuple(bases))
    plan = tmem_access_plan(tl, regs, 8)
    assert plan.ok and plan.warp_bases[5] == (32, 0), plan.reason or plan.warp_bases
    check_emitted(t, tl, regs, T.f32, False, 8)


# ---------------------------------------------------------------------------------------------
# 4. the PTX: every shape assembles, no .pack/.unpack, the half-split immediate in columns
# ---------------------------------------------------------------------------------------------

def test_emitted_ptx_of_every_shape_assembles():
    from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
    from sparsile.backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx

    target = get_target("sm_100a")
    cg = _codegen(4)
    t = T.TmemType(T.f32, (128, 64), "acc", 0)
    tl = tmem_view_layout(t)
    for shape in SHAPES:
        regs = tmem_register_layout(tl, shape, 4, unpack=True)
        ref = bw.TmemRef(const(0, "i32"), t, 64, 0)
        tile = bw.load_tile(cg, ref, regs, T.f32, None)
        bw.store_tile(cg, ref, tile, None)
    cg.fb.terminate("ret void")
    cg.mod.functions.append(cg.fb.render())
    cg.mod.attributes["0"] = 'nounwind "nvvm.reqntid"="128"'
    ptx = llvm_ir_to_ptx(cg.mod.render(), target)
    found = sorted(set(re.findall(r"tcgen05\.(?:ld|st)\.sync\.aligned\.[\w:.]+", ptx)))
    assert found == sorted(f"tcgen05.{op}.sync.aligned.{s}.x{n}.b32" for op in ("ld", "st")
                           for s, n in (("32x32b", 32), ("16x64b", 32), ("16x128b", 16), ("16x256b", 8),
                                        ("16x32bx2", 32)))
    assert "pack::16b" not in ptx
    # 16x32bx2.x32 over 64 columns: threads 16-31 read 32 columns further (the immediate, in columns)
    assert re.search(r"tcgen05\.ld\.sync\.aligned\.16x32bx2\.x32\.b32 \{[^}]*\}, \[%r\d+\], 32;", ptx)
    assert re.search(r"tcgen05\.st\.sync\.aligned\.16x32bx2\.x32\.b32 \[%r\d+\], 32, \{", ptx)
    if ptxas_available():
        assemble_with_ptxas(ptx, target)


def test_plan_refuses_a_warp_outside_its_lane_quarter():
    """The access restriction as a legality diagnostic: a register layout that gives warp 1 the
    rows of lanes 0..31 has no plan (SP0404 names the rule), whatever the shape."""
    from sparsile.frontend.diagnostics import CompileError
    from sparsile.frontend.layout.layouts import LinearLayout

    acc = tmem_accumulator(128, 32)
    for shape in SHAPES:
        regs = tmem_register_layout(acc, shape)
        w = regs.in_names.index("warp")
        bases = list(regs.bases)
        bases[w] = tuple(reversed(bases[w]))  # warp bit 0 <-> warp bit 1: warp 1 -> lanes 64..95
        swapped = LinearLayout(regs.in_dims, regs.out_dims, tuple(bases))
        plan = tmem_access_plan(acc, swapped)
        assert not plan.ok and "32*(w%4)" in plan.reason, shape
        with pytest.raises(CompileError) as info:
            plan.require()
        assert info.value.codes == ["SP0404"]
