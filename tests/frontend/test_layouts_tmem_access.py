"""TMEM access plans (frontend/layout/tmem_access.py): tcgen05.ld/st atoms, instructions and unpacking.

TMEM plans are checked by simulating the instructions with the per-thread mapping of
docs/hardware.md §2 (re-implemented here) on a TMEM image filled from the §1.4 formulas.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.layout.conversion import conversion_plan
from sparsile.frontend.layout.layouts import LayoutError, LinearLayout
from sparsile.frontend.layout.library import (
    blocked,
    tmem_accumulator,
    tmem_sparse_metadata,
    wgmma_accumulator,
    wgmma_sparse_metadata,
)
from sparsile.frontend.layout.tmem_access import tmem_access_plan, tmem_register_layout

# ---------------------------------------------------------------------------------------------
# independent references
# ---------------------------------------------------------------------------------------------


def atom_word(shape, t, slot, half_split=None):
    """(lane, column) of register ``slot`` of thread ``t`` relative to the instruction address
    (docs/hardware.md §2)."""
    if shape == "32x32b":
        return t, slot
    if shape == "16x64b":
        return t // 4 + 8 * (t % 2), (t // 2) % 2 + 2 * slot
    if shape == "16x128b":
        return t // 4 + 8 * (slot % 2), t % 4 + 4 * (slot // 2)
    if shape == "16x256b":
        return t // 4 + 8 * ((slot // 2) % 2), 2 * (t % 4) + slot % 2 + 8 * (slot // 4)
    if shape == "16x32bx2":
        return t % 16, slot + (half_split if t >= 16 else 0)
    raise AssertionError(shape)


def metadata_cell(cls, m, chunk):
    """(lane, column, nibble) of metadata chunk (m, chunk) in TMEM, docs/hardware.md §1.4."""
    if cls in ("16bit", "tf32"):
        col, h, j = chunk // 8, (chunk % 8) // 4, chunk % 4
        return 16 * (m // 16) + 8 * h + m % 8, col, 4 * ((m // 8) % 2) + j
    return m, chunk // 8, chunk % 8


def simulate_load(plan, tmem, reg_layout, num_warps=4):
    """Registers of every thread after the plan's tcgen05.ld instructions + unpacking:
    {(warp, lane, reg, sub): value}."""
    out = {}
    n_sub = reg_layout.in_size("sub")
    for w in range(num_warps):
        lane_base, col_base = plan.warp_bases[w]
        for t in range(32):
            words = []
            for ins in plan.instructions:
                row = []
                for slot in range(plan.regs_per_instruction):
                    lane, col = atom_word(plan.shape, t, slot, plan.half_split)
                    row.append(int(tmem[lane_base + ins.lane_offset + lane, col_base + ins.col_offset + col]))
                words.append(row)
            for r, subs in enumerate(plan.sources):
                for s, src in enumerate(subs[:n_sub]):
                    word = words[src.instruction][src.slot]
                    out[(w, t, r, s)] = (word >> src.bit_offset) & ((1 << src.bits) - 1)
    return out


# ---------------------------------------------------------------------------------------------
# acceptance: sparse metadata TMEM -> registers (the load JAX refuses, seed 000)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, cls, g", [("f16", "16bit", 4), ("tf32", "tf32", 2), ("e4m3", "8bit", 4),
                                           ("e2m1", "4bit", 8)])
@pytest.mark.parametrize("unpack", [False, True])
def test_metadata_load_from_tmem_finds_an_atom_and_unpacks(dtype, cls, g, unpack):
    k = 4 * 8 * g  # one 2 KB tcgen05.cp atom: 4 columns
    tmem_layout = tmem_sparse_metadata(128, k, dtype)
    regs = tmem_register_layout(tmem_layout, "32x32b", unpack=unpack)
    plan = tmem_access_plan(tmem_layout, regs).require()
    assert plan.ptx == "tcgen05.ld.sync.aligned.32x32b.x4.b32"
    assert len(plan.instructions) == 1 and plan.unpacks
    assert [b[0] for b in plan.warp_bases] == [0, 32, 64, 96]
    # the register layout, element by element, against §2 (32x32b: lane t, register j = column j)
    # and the §1.4 placement
    for w, t in itertools.product(range(4), range(32)):
        for j, s in itertools.product(range(4), range(8)):
            point = {"warp": w, "lane": t}
            point.update({"reg": 8 * j + s} if unpack else {"reg": j, "sub": s})
            got = regs.apply(**point)
            assert metadata_cell(cls, got["m"], got["chunk"]) == (32 * w + t, j, s)
    # end to end: a TMEM image written from random nibbles, loaded and unpacked by the plan
    rng = np.random.default_rng(7)
    nibbles = rng.integers(0, 16, size=(128, k // g))
    tmem = np.zeros((128, 4), dtype=np.uint64)
    for m, c in itertools.product(range(128), range(k // g)):
        lane, col, nib = metadata_cell(cls, m, c)
        tmem[lane, col] |= int(nibbles[m, c]) << (4 * nib)
    loaded = simulate_load(plan, tmem, regs)
    for (w, t, r, s), value in loaded.items():
        point = {"warp": w, "lane": t, "reg": r}
        if not unpack:
            point["sub"] = s
        where = regs.apply(**point)
        assert value == nibbles[where["m"], where["chunk"]]


def test_metadata_cross_checks_the_sparsity_toolkit_tcgen05_and_sm90_formats():
    sp = pytest.importorskip("sparsile.stdlib.sparsity")
    rng = np.random.default_rng(3)

    def nibble(idx_row):
        if len(idx_row) == 1:                      # tf32: 1:2 as a 2:4 chunk of halves
            return 0x4 if idx_row[0] == 0 else 0xE
        return int(idx_row[0]) | int(idx_row[1]) << 2

    for dtype, g in (("f16", 4), ("tf32", 2), ("e4m3", 4), ("e2m1", 8)):
        m, k = 128, 32 * 8 * g // 4 * 2  # two 2 KB atoms along K
        dense = rng.standard_normal((m, k)).astype(np.float32)
        _, indices = sp.compress(sp.prune(dense, dtype), dtype)
        image = sp.encode_metadata(indices, "tcgen05", dtype).data
        layout = tmem_sparse_metadata(m, k, dtype)
        for lane, col, sub in itertools.product(range(128), range(layout.in_size("col")), range(8)):
            where = layout.apply(lane=lane, col=col, sub=sub)
            word = int(image[col // 4, 0, lane, col % 4])
            assert (word >> (4 * sub)) & 0xF == nibble(indices[where["m"], where["chunk"]])
        if dtype == "e2m1":
            continue
        # sm90: what each wgmma thread loads (brief_sparsity: row L = 16w + 8(t%2) + g, column kb for
        # 16-bit/tf32; row 16w + g + 8(t%2), word t//2 for 8-bit) against the wgmma register layout
        words = sp.encode_metadata(indices[:64], "sm90", dtype).data
        regs = wgmma_sparse_metadata(dtype, 0)
        for w, lane, sub in itertools.product(range(4), range(32), range(8)):
            gg, t = lane // 4, lane % 4
            if dtype == "e4m3":
                word = int(words[16 * w + gg + 8 * (t % 2), t // 2])
            elif t // 2 == 0:
                word = int(words[16 * w + 8 * (t % 2) + gg, 0])
            else:
                continue  # the unselected pair's register is ignored by the hardware
            where = regs.apply(sub=sub, lane=lane, warp=w)
            assert (word >> (4 * sub)) & 0xF == nibble(indices[where["m"], where["chunk"]])


# ---------------------------------------------------------------------------------------------
# TMEM accumulators: every shape, simulated
# ---------------------------------------------------------------------------------------------

ACCUMULATORS = [
    ("D m128", tmem_accumulator(128, 64), ["32x32b", "16x64b", "16x128b", "16x256b", "16x32bx2"]),
    ("F m64", tmem_accumulator(64, 32), ["16x64b", "16x128b", "16x256b", "16x32bx2"]),
    ("packed", tmem_accumulator(128, 32, packing=2), ["32x32b", "16x256b"]),
]


@pytest.mark.parametrize("name, tmem_layout, shapes", ACCUMULATORS, ids=[a[0] for a in ACCUMULATORS])
def test_accumulator_plans_simulate_correctly(name, tmem_layout, shapes):
    lanes, cols = tmem_layout.in_size("lane"), tmem_layout.in_size("col")
    rng = np.random.default_rng(1)
    tmem = rng.integers(0, 2**32, size=(lanes, cols), dtype=np.uint64)
    for shape in shapes:
        regs = tmem_register_layout(tmem_layout, shape)
        plan = tmem_access_plan(tmem_layout, regs)
        assert plan.ok, (shape, plan.reason)
        assert plan.shape == shape and plan.regs_per_instruction <= 32
        loaded = simulate_load(plan, tmem, regs)
        inv = tmem_layout.invert()
        sub_bits = 32 // tmem_layout.in_size("sub")
        for (w, t, r, s), value in loaded.items():
            point = {"warp": w, "lane": t, "reg": r}
            if "sub" in regs.in_names:
                point["sub"] = s
            where = inv.apply(**regs.apply(**point))
            cell = int(tmem[where["lane"], where["col"]])
            assert value == (cell >> (sub_bits * where.get("sub", 0))) & ((1 << sub_bits) - 1)


def test_m64_accumulator_read_with_16x256b_is_the_wgmma_fragment():
    regs = tmem_register_layout(tmem_accumulator(64, 64), "16x256b")
    assert regs == wgmma_accumulator(64)


def test_lane_offset_and_register_cap():
    layout = tmem_accumulator(64, 32)
    plan = tmem_access_plan(layout, tmem_register_layout(layout, "16x256b"), lane_offset=16)
    assert [b[0] for b in plan.warp_bases] == [16, 48, 80, 112]
    big = tmem_accumulator(128, 256)
    plan = tmem_access_plan(big, tmem_register_layout(big, "32x32b"), max_regs_per_instruction=32)
    assert plan.num == 32 and len(plan.instructions) == 8
    plan16 = tmem_access_plan(big, tmem_register_layout(big, "32x32b"), max_regs_per_instruction=16)
    assert plan16.num == 16 and len(plan16.instructions) == 16


def test_eight_warps_split_columns():
    layout = tmem_accumulator(128, 64)
    regs = tmem_register_layout(layout, "32x32b", num_warps=8)
    plan = tmem_access_plan(layout, regs, num_warps=8).require()
    assert [b for b in plan.warp_bases] == [(0, 0), (32, 0), (64, 0), (96, 0), (0, 32), (32, 32), (64, 32), (96, 32)]


def test_no_atom_for_the_wgmma_metadata_layout_gives_a_reason():
    tmem_layout = tmem_sparse_metadata(128, 64, "f16")
    # a thread mapping no tcgen05 shape produces: lane bit 0 walks the chunk dim
    wrong = LinearLayout.from_bases(
        {"reg": [(0, 8)], "sub": [(0, 1), (0, 2), (8, 0)],
         "lane": [(0, 4), (1, 0), (2, 0), (4, 0), (16, 0)], "warp": [(32, 0), (64, 0)]},
        [("m", 128), ("chunk", 16)])
    plan = tmem_access_plan(tmem_layout, wrong)
    assert not plan.ok and "no tcgen05.ld/st shape" in plan.reason
    with pytest.raises(CompileError) as info:
        plan.require()
    assert info.value.codes == ["SP0404"]
    # and the conversion the help line suggests exists
    natural = tmem_register_layout(tmem_layout, "32x32b")
    assert conversion_plan(natural, wrong).ok


def test_warp_quarter_rule_is_enforced():
    layout = tmem_accumulator(128, 16)
    regs = tmem_register_layout(layout, "32x32b")
    swapped = LinearLayout(regs.in_dims, regs.out_dims,
                           (*regs.bases[:-1], (regs.bases[-1][1], regs.bases[-1][0])))
    plan = tmem_access_plan(layout, swapped)
    assert not plan.ok and "32*(w%4)" in plan.reason
    # a TMEM layout over lanes 0..31 only: warps 1..3 cannot reach it, whatever the columns
    lanes32 = LinearLayout.from_bases({"lane": [1, 2, 4, 8, 16], "col": [32, 64]}, [("x", 128)])
    by_warp = LinearLayout.from_bases({"reg": [], "lane": [1, 2, 4, 8, 16], "warp": [32, 64]}, [("x", 128)])
    assert not tmem_access_plan(lanes32, by_warp).ok
    one_warp = LinearLayout.from_bases({"reg": [32, 64], "lane": [1, 2, 4, 8, 16], "warp": []}, [("x", 128)])
    assert tmem_access_plan(lanes32, one_warp, num_warps=1).ptx == "tcgen05.ld.sync.aligned.32x32b.x4.b32"
    with pytest.raises(LayoutError):
        tmem_register_layout(lanes32, "32x32b", num_warps=4)


def test_plan_rejects_mismatched_tensors_and_unusable_shapes():
    a = tmem_accumulator(128, 32)
    plan = tmem_access_plan(a, wgmma_accumulator(32))
    assert not plan.ok and "different tensors" in plan.reason
    with pytest.raises(LayoutError):
        tmem_register_layout(tmem_accumulator(64, 32), "32x32b")  # would read unused lanes
    plan = tmem_access_plan(a, tmem_register_layout(a, "32x32b"), num_warps=8)
    assert not plan.ok


def test_8bit_metadata_loads_straight_into_a_row_per_thread_blocked_layout():
    # 8-bit metadata: lane = m, so a blocked layout with one row per thread and 8 chunks per
    # 32-bit word is one 32x32b load plus nibble extraction; the 16-bit image interleaves rows
    # m and m+8 in one word, so the same register layout needs a conversion first.
    regs = blocked((128, 32), (1, 8), (32, 1), (4, 1), (1, 0), ("m", "chunk"))
    plan = tmem_access_plan(tmem_sparse_metadata(128, 128, "e4m3"), regs).require()
    assert plan.ptx == "tcgen05.ld.sync.aligned.32x32b.x4.b32"
    for r, (src,) in enumerate(plan.sources):
        chunk = regs.apply(reg=r)["chunk"]
        assert (src.slot, src.bit_offset, src.bits) == (chunk // 8, 4 * (chunk % 8), 4)
    assert tmem_access_plan(tmem_sparse_metadata(128, 128, "e4m3"), regs, direction="store").ptx.startswith(
        "tcgen05.st.sync.aligned.32x32b.x4")
    refused = tmem_access_plan(tmem_sparse_metadata(128, 128, "f16"), regs)
    assert not refused.ok and "share one 32-bit TMEM word" in refused.reason
    assert "conversion_plan" in refused.help
