"""Register layout conversions (frontend/layout/conversion.py): registers, shuffles or shared memory.

Every plan is checked by simulating it: each destination element must read the source element
that holds the same logical position.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.layout.conversion import conversion_plan
from sparsile.frontend.layout.layouts import LinearLayout
from sparsile.frontend.layout.library import (
    blocked,
    mma_sp_fragment,
    wgmma_accumulator,
)

# ---------------------------------------------------------------------------------------------
# conversions
# ---------------------------------------------------------------------------------------------

def merged(layout):
    return layout.merge_ins(["reg", "sub"], "reg") if "sub" in layout.in_names else layout


def apply_any(layout, **point):
    return layout.apply(**{k: v for k, v in point.items() if k in layout.in_names})


def check_conversion(src, dst, plan):
    s, d = merged(src), merged(dst)
    warps = d.in_size("warp")
    if plan.kind == "shared_memory":
        smem_inv = plan.smem.smem_layout.invert()
        memory = {}
        for group in plan.smem.store.register_groups:
            for lane, w in itertools.product(range(32), range(warps)):
                offsets = [smem_inv.apply(**apply_any(s, reg=r, lane=lane, warp=w))["offset"] for r in group]
                assert offsets == list(range(offsets[0], offsets[0] + len(group)))  # a real vector
                for r, off in zip(group, offsets):
                    memory[off] = apply_any(s, reg=r, lane=lane, warp=w)
        for group in plan.smem.load.register_groups:
            for lane, w in itertools.product(range(32), range(warps)):
                offsets = [smem_inv.apply(**apply_any(d, reg=r, lane=lane, warp=w))["offset"] for r in group]
                assert offsets == list(range(offsets[0], offsets[0] + len(group)))
                for r, off in zip(group, offsets):
                    assert memory[off] == apply_any(d, reg=r, lane=lane, warp=w)
        return
    for r, lane, w in itertools.product(range(d.in_size("reg")), range(32), range(warps)):
        want = apply_any(d, reg=r, lane=lane, warp=w)
        if plan.kind == "registers":
            got = apply_any(s, reg=plan.register_map[r].eval(lane=lane, warp=w), lane=lane, warp=w)
        elif plan.kind == "shuffle":
            kept = [rnd for rnd in plan.rounds if rnd.dst_reg == r
                    and (rnd.accept is None or rnd.accept.eval(lane=lane, warp=w) == rnd.accept_value)]
            assert len(kept) == 1
            rnd = kept[0]
            sl = rnd.src_lane.eval(lane=lane, warp=w)
            if rnd.local:
                assert sl == lane
            got = apply_any(s, reg=rnd.src_reg.eval(lane=sl, warp=w), lane=sl, warp=w)
        else:
            assert plan.kind == "noop"
            got = apply_any(s, reg=r, lane=lane, warp=w)
        assert got == want


@st.composite
def register_layout_pairs(draw):
    """Two random bijective register layouts of one (m, n) tensor: (reg, lane, warp) bits permuted
    and mixed; dst is either independent, a register shuffle of src, or a lane shuffle of src."""
    rbits, wbits = draw(st.integers(0, 3)), draw(st.integers(0, 2))
    n = rbits + 5 + wbits
    mbits = draw(st.integers(0, n))

    def random_layout():
        cols = [1 << p for p in draw(st.permutations(range(n)))]
        for _ in range(draw(st.integers(0, n))):
            i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
            if i != j:
                cols[i] ^= cols[j]
        return cols

    src = random_layout()
    kind = draw(st.sampled_from(["independent", "registers", "lanes"]))
    if kind == "independent":
        dst = random_layout()
    else:
        lo, hi = (0, rbits) if kind == "registers" else (rbits, rbits + 5)
        part = src[lo:hi]
        perm = draw(st.permutations(range(len(part))))
        dst = src[:lo] + [part[p] for p in perm] + src[hi:]
    in_dims = (("reg", 1 << rbits), ("lane", 32), ("warp", 1 << wbits))
    out_dims = (("m", 1 << mbits), ("n", 1 << (n - mbits)))
    return (LinearLayout._from_columns(in_dims, out_dims, src), LinearLayout._from_columns(in_dims, out_dims, dst),
            kind)


@settings(max_examples=40, deadline=None)
@given(register_layout_pairs(), st.sampled_from([16, 32]))
def test_conversion_plans_are_correct_by_simulation(pair, elem_bits):
    src, dst, kind = pair
    plan = conversion_plan(src, dst, elem_bits=elem_bits)
    assert plan.ok
    check_conversion(src, dst, plan)
    if plan.kind != "noop":
        costs = [c for _, c, _ in plan.considered if c is not None]
        assert plan.cost == min(costs)
        # every strategy that applies is correct, not only the cheapest
        for strategy in ("registers", "shuffle", "shared_memory"):
            forced = conversion_plan(src, dst, elem_bits=elem_bits, allow=[strategy])
            if kind == "registers" or (kind == "lanes" and strategy != "registers"):
                assert forced.ok, strategy
            if forced.ok:
                assert forced.kind == strategy
                check_conversion(src, dst, forced)


def test_conversion_examples():
    nm = ("m", "n")
    row = blocked((64, 64), (1, 8), (8, 4), (4, 1), (1, 0), nm)
    col = blocked((64, 64), (8, 1), (4, 8), (4, 1), (0, 1), nm)
    acc = wgmma_accumulator(64)
    assert conversion_plan(row, row).kind == "noop"
    for s, d in ((row, col), (acc, row), (row, acc)):
        plan = conversion_plan(s, d)
        assert plan.kind == "shared_memory"
        check_conversion(s, d, plan)
    # within a warp: transpose an 8x8 tile across lanes -> shuffles
    a = LinearLayout.from_bases({"reg": [(0, 1), (0, 2)], "lane": [(0, 4), (1, 0), (2, 0), (4, 0), (8, 0)]},
                                [("m", 16), ("n", 8)])
    b = LinearLayout.from_bases({"reg": [(1, 0), (2, 0)], "lane": [(4, 0), (8, 0), (0, 1), (0, 2), (0, 4)]},
                                [("m", 16), ("n", 8)])
    plan = conversion_plan(a, b, allow=["shuffle"])
    # each sender owes 4 receivers different registers: 4 predicated rounds per destination register
    assert plan.kind == "shuffle" and len(plan.rounds) == 16
    assert all(rnd.accept is not None for rnd in plan.rounds)
    check_conversion(a, b, plan)
    assert conversion_plan(a, b, allow=["registers"]).kind == "none"
    # one element per thread, lanes permuted: a single shuffle beats shared memory
    x = LinearLayout.from_bases({"lane": [(0, 1), (0, 2), (0, 4), (1, 0), (2, 0)]}, [("m", 4), ("n", 8)])
    y = LinearLayout.from_bases({"lane": [(1, 0), (2, 0), (0, 1), (0, 2), (0, 4)]}, [("m", 4), ("n", 8)])
    plan = conversion_plan(x, y)
    assert plan.kind == "shuffle" and len(plan.rounds) == 1 and plan.rounds[0].accept is None
    check_conversion(x, y, plan)
    bad = conversion_plan(a, wgmma_accumulator(8))
    assert bad.kind == "none" and not bad.ok
    with pytest.raises(CompileError) as info:
        bad.require()
    assert info.value.codes == ["SP0409"]


def test_metadata_conversion_from_tmem_load_layout_to_mma_fragment():
    # per-warp: the mma.sp metadata fragment vs. a 32x32b-style row-per-lane layout of the same 16x8 chunks
    frag = mma_sp_fragment("meta")
    rows = LinearLayout.from_bases({"reg": [], "sub": [(0, 1), (0, 2), (0, 4)],
                                    "lane": [(1, 0), (2, 0), (4, 0), (8, 0), (0, 0)]}, [("m", 16), ("chunk", 8)])
    plan = conversion_plan(rows, frag, elem_bits=4)
    assert plan.ok
    check_conversion(rows, frag, plan)
