"""Named layouts checked against the formulas of docs/hardware.md / the PTX ISA on every index.

The expected values are written here from the documents, independently of the constructors.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.frontend.layout.layouts import UNUSED_DIM, LayoutError
from sparsile.frontend.layout.library import (
    blocked,
    mma_sp_fragment,
    operand_class,
    smem_core_matrices,
    smem_from_strides,
    smem_tile,
    swizzle_address,
    tcgen05_atom,
    tmem_accumulator,
    tmem_sparse_metadata,
    wgmma_accumulator,
    wgmma_sparse_metadata,
)


def points(layout):
    for values in itertools.product(*[range(s) for _, s in layout.in_dims]):
        yield dict(zip(layout.in_names, values))


def table_dicts(layout):
    """(point, image) for every input point, via the vectorized table."""
    table = layout.table()
    for point in points(layout):
        idx = tuple(point[n] for n in layout.in_names)
        yield point, dict(zip(layout.out_names, (int(v) for v in table[idx])))


# --------------------------------------------------------------------------------------------
# blocked
# --------------------------------------------------------------------------------------------

def blocked_reference(shape, spt, tpw, wpc, order, reg, lane, warp):
    """Triton's blocked semantics by mixed-radix arithmetic: per-thread block digits in `order`,
    then lanes, warps; repeats of the CTA tile in further registers; coordinates wrap modulo the
    (padded) shape (broadcast)."""
    rank = len(shape)
    padded = [1 << (s - 1).bit_length() for s in shape]
    tile = [spt[d] * tpw[d] * wpc[d] for d in range(rank)]
    reps = [max(1, padded[d] // tile[d]) for d in range(rank)]
    coords = [0] * rank
    r = reg
    per = {}
    for d in order:
        per[d] = r % spt[d]
        r //= spt[d]
    rep = {}
    for d in order:
        rep[d] = r % reps[d]
        r //= reps[d]
    ln, wp = lane, warp
    for d in order:
        lane_d = ln % tpw[d]
        ln //= tpw[d]
        warp_d = wp % wpc[d]
        wp //= wpc[d]
        coords[d] = per[d] + spt[d] * (lane_d + tpw[d] * (warp_d + wpc[d] * rep[d]))
    return [coords[d] % padded[d] for d in range(rank)]


@st.composite
def blocked_configs(draw):
    rank = draw(st.integers(1, 3))
    pow2 = st.sampled_from([1, 2, 4, 8])
    spt = [draw(pow2) for _ in range(rank)]
    # threads per warp: split 32 = 2^5 over the dims
    bits = [0] * rank
    for _ in range(5):
        bits[draw(st.integers(0, rank - 1))] += 1
    tpw = [1 << b for b in bits]
    wbits = [0] * rank
    for _ in range(draw(st.integers(0, 3))):
        wbits[draw(st.integers(0, rank - 1))] += 1
    wpc = [1 << b for b in wbits]
    limit = {1: 200, 2: 40, 3: 12}[rank]
    shape = [draw(st.integers(1, limit)) for _ in range(rank)]
    order = draw(st.permutations(range(rank)))
    return shape, spt, tpw, wpc, list(order)


@settings(max_examples=40, deadline=None)
@given(blocked_configs())
def test_blocked_matches_brute_force_reference(config):
    shape, spt, tpw, wpc, order = config
    layout = blocked(shape, spt, tpw, wpc, order)
    names = [f"dim{i}" for i in range(len(shape))]
    assert layout.in_size("lane") == 32 and layout.in_size("warp") == int(np.prod(wpc))
    # every input point at once: the reference's arithmetic is elementwise on index arrays
    table = layout.table()
    point = dict(zip(layout.in_names, np.meshgrid(*[np.arange(s) for _, s in layout.in_dims], indexing="ij")))
    want = blocked_reference(shape, spt, tpw, wpc, order, point["reg"], point["lane"], point["warp"])
    for n, w in zip(names, want):
        assert np.array_equal(table[..., layout.out_names.index(n)], w), n


def test_blocked_broadcast_and_repeat_examples():
    # 16 columns but a warp covers 32: lanes 16..31 replicate lanes 0..15
    small = blocked([16], [1], [32], [1], [0])
    assert small.zero_bases()["lane"] == (4,)
    assert small.apply(lane=17) == small.apply(lane=1)
    # 128 columns, tile of 64: one more register bit repeats the tile
    big = blocked([128], [2], [32], [1], [0])
    assert big.in_size("reg") == 4 and big.apply(reg=2) == {"dim0": 64}


def test_blocked_rejects_bad_configurations():
    with pytest.raises(LayoutError, match="32"):
        blocked([64], [1], [16], [1], [0])
    with pytest.raises(LayoutError, match="power of two"):
        blocked([64], [3], [32], [1], [0])
    with pytest.raises(LayoutError, match="permutation"):
        blocked([8, 8], [1, 1], [4, 8], [1, 1], [0, 0])


# --------------------------------------------------------------------------------------------
# TMEM accumulators (PTX data-path layouts A-F)
# --------------------------------------------------------------------------------------------

def test_tmem_accumulator_m128_cta1_is_lane_row_column_n():  # Layout D
    layout = tmem_accumulator(128, 64)
    assert layout.is_bijective()
    for point, image in table_dicts(layout):
        assert image == {"m": point["lane"], "n": point["col"]}


def test_tmem_accumulator_m256_cta2_per_cta_rows():  # Layout A
    layout = tmem_accumulator(256, 32, cta_group=2)
    for point, image in table_dicts(layout):
        assert image == {"m": 128 * point["cta"] + point["lane"], "n": point["col"]}


def test_tmem_accumulator_m64_half_datapath():  # Layout F
    layout = tmem_accumulator(64, 16)
    assert layout.is_bijective()
    for point, image in table_dicts(layout):
        lane = point["lane"]
        if lane % 32 >= 16:
            assert image[UNUSED_DIM] == 1
            continue
        assert image == {"m": 16 * (lane // 32) + lane % 16, "n": point["col"], UNUSED_DIM: 0}


def test_tmem_accumulator_m128_cta2_dense_folds_column_halves():  # Layout B
    n = 64
    layout = tmem_accumulator(128, n, cta_group=2)
    for point, image in table_dicts(layout):
        lane, col = point["lane"], point["col"]
        assert image == {"m": 64 * point["cta"] + lane % 64, "n": col + (n // 2) * (lane // 64)}


def test_tmem_accumulator_m128_cta2_sparse_is_half_datapath():  # Layout C
    layout = tmem_accumulator(128, 16, cta_group=2, sparse=True)
    for point, image in table_dicts(layout):
        lane = point["lane"]
        if lane % 32 < 16:
            assert image["m"] == 64 * point["cta"] + 16 * (lane // 32) + lane % 16
            assert image["n"] == point["col"]


def test_tmem_accumulator_packing_two_halves_per_cell():
    layout = tmem_accumulator(128, 32, packing=2)
    assert layout.in_size("col") == 16 and layout.in_size("sub") == 2
    for point, image in table_dicts(layout):
        assert image == {"m": point["lane"], "n": 2 * point["col"] + point["sub"]}


def test_tmem_accumulator_pads_n_and_rejects_unknown_m():
    assert tmem_accumulator(128, 192).out_size("n") == 256
    with pytest.raises(LayoutError, match="data-path"):
        tmem_accumulator(32, 64)
    with pytest.raises(LayoutError):
        tmem_accumulator(128, 64, packing=4)


# --------------------------------------------------------------------------------------------
# TMEM sparse metadata (docs/hardware.md §1.4)
# --------------------------------------------------------------------------------------------

def metadata_position(cls: str, m: int, k: int) -> tuple[int, int, int]:
    """(lane, column, bit) of the nibble describing logical element (m, k), from docs/hardware.md
    §1.4 written in K units."""
    if cls == "16bit":       # K=32 per instruction (one column), halves of 16, chunks of 4
        col, h, j = k // 32, (k % 32) // 16, (k % 16) // 4
        return 16 * (m // 16) + 8 * h + m % 8, col, 16 * ((m // 8) % 2) + 4 * j
    if cls == "tf32":        # K=16 per instruction, halves of 8, chunks of 2
        col, h, j = k // 16, (k % 16) // 8, (k % 8) // 2
        return 16 * (m // 16) + 8 * h + m % 8, col, 16 * ((m // 8) % 2) + 4 * j
    if cls == "8bit":        # lane = m, 1 bit per logical element: bit = k along the row
        return m, k // 32, (k % 32) // 4 * 4
    # 4-bit: half a bit per element, one nibble per 8-element chunk
    return m, (k // 2) // 32, ((k // 2) % 32) // 4 * 4


@pytest.mark.parametrize("dtype, cls, g", [("f16", "16bit", 4), ("bf16", "16bit", 4), ("tf32", "tf32", 2),
                                           ("e4m3", "8bit", 4), ("s8", "8bit", 4), ("e2m1", "4bit", 8)])
def test_tmem_sparse_metadata_matches_hardware_facts(dtype, cls, g):
    k = 8 * g * 4  # four columns
    layout = tmem_sparse_metadata(128, k, dtype)
    assert operand_class(dtype) == cls
    assert layout.is_bijective() and layout.in_size("col") == 4 and layout.in_size("sub") == 8
    inv = layout.invert()
    seen = set()
    for m in range(128):
        for chunk in range(k // g):
            where = inv.apply(m=m, chunk=chunk)
            lane, col, bit = metadata_position(cls, m, chunk * g)
            assert (where["lane"], where["col"], 4 * where["sub"]) == (lane, col, bit)
            # every element of the chunk maps to the same nibble
            assert metadata_position(cls, m, chunk * g + g - 1) == (lane, col, bit)
            seen.add((lane, col, bit))
    assert len(seen) == 128 * 4 * 8


def test_tmem_sparse_metadata_16bit_cell_holds_rows_r_and_r_plus_8():
    layout = tmem_sparse_metadata(128, 32, "f16")
    low = [layout.apply(lane=3, col=0, sub=s) for s in range(4)]
    high = [layout.apply(lane=3, col=0, sub=s) for s in range(4, 8)]
    assert all(x["m"] == 3 for x in low) and all(x["m"] == 11 for x in high)
    assert [x["chunk"] for x in low] == [0, 1, 2, 3] == [x["chunk"] for x in high]
    assert layout.apply(lane=11, col=0, sub=0) == {"m": 3, "chunk": 4}  # K bit in the lane


def test_tmem_sparse_metadata_m256_and_m64():
    layout = tmem_sparse_metadata(256, 64, "f16", cta_group=2)
    assert layout.apply(lane=5, cta=1) == {"m": 133, "chunk": 0}
    with pytest.raises(LayoutError) as info:
        tmem_sparse_metadata(64, 64, "f16")
    assert info.value.code == "SP0408" and "262" in info.value.help


# --------------------------------------------------------------------------------------------
# tcgen05.ld/st atoms (docs/hardware.md §2)
# --------------------------------------------------------------------------------------------

def atom_reference(shape, num, t, r, half_split=None):
    """(lane, column) of register r of thread t, from docs/hardware.md §2."""
    if shape == "32x32b":
        return t, r
    if shape == "16x64b":
        return t // 4 + 8 * (t % 2), (t // 2) % 2 + 2 * r
    if shape == "16x128b":
        return t // 4 + 8 * (r % 2), t % 4 + 4 * (r // 2)
    if shape == "16x256b":
        return t // 4 + 8 * ((r // 2) % 2), 2 * (t % 4) + r % 2 + 8 * (r // 4)
    if shape == "16x32bx2":
        return t % 16, r + (half_split if t >= 16 else 0)
    raise AssertionError(shape)


@pytest.mark.parametrize("shape, regs_per_num", [("32x32b", 1), ("16x64b", 1), ("16x128b", 2),
                                                 ("16x256b", 4), ("16x32bx2", 1)])
@pytest.mark.parametrize("num", [1, 4])
def test_tcgen05_atoms_match_per_thread_mapping(shape, regs_per_num, num):
    split = 8 if shape == "16x32bx2" else None
    layout = tcgen05_atom(shape, num, num_warps=4, half_split=split)
    assert layout.in_size("reg") == regs_per_num * num
    for point, image in table_dicts(layout):
        lane, col = atom_reference(shape, num, point["lane"], point["reg"], split)
        assert image == {"lane": 32 * point["warp"] + lane, "col": col}


def test_tcgen05_atom_validation():
    with pytest.raises(LayoutError):
        tcgen05_atom("16x256b", 64)  # ptxas rejects 16x256b.x64
    with pytest.raises(LayoutError):
        tcgen05_atom("16x32bx2", 4, half_split=2)
    with pytest.raises(LayoutError):
        tcgen05_atom("8x8b")
    eight = tcgen05_atom("32x32b", 2, num_warps=8)
    assert eight.apply(warp=5, lane=3) == eight.apply(warp=1, lane=3)  # warpgroups repeat lanes


# --------------------------------------------------------------------------------------------
# wgmma / mma.sp fragments (docs/hardware.md §4.2, §4.4)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [8, 64, 256])
def test_wgmma_accumulator_fragment(n):
    layout = wgmma_accumulator(n)
    assert layout.in_size("reg") == n // 2 and layout.is_bijective()
    for point, image in table_dicts(layout):
        w, lane, i = point["warp"], point["lane"], point["reg"]
        g, t = lane // 4, lane % 4
        assert image == {"m": 16 * w + g + 8 * ((i // 2) % 2), "n": 8 * (i // 4) + 2 * t + i % 2}


def test_wgmma_accumulator_packed_f16_and_two_warpgroups():
    packed = wgmma_accumulator(32, packed=True)
    flat = wgmma_accumulator(32)
    for point, image in table_dicts(packed):
        assert image == flat.apply(reg=2 * point["reg"] + point["sub"], lane=point["lane"], warp=point["warp"])
    two = wgmma_accumulator(16, warpgroups=2)
    assert two.out_size("m") == 128 and two.apply(warp=4) == {"m": 64, "n": 0}


@pytest.mark.parametrize("dtype", ["f16", "bf16", "tf32"])
@pytest.mark.parametrize("spsel", [0, 1])
def test_wgmma_sparse_metadata_16bit_and_tf32(dtype, spsel):
    layout = wgmma_sparse_metadata(dtype, spsel)
    for point, image in table_dicts(layout):
        w, lane, s = point["warp"], point["lane"], point["sub"]
        g, t = lane // 4, lane % 4
        want = {"m": 16 * w + g + 8 * (s // 4), "chunk": 4 * (t % 2) + s % 4}
        # the selected pair holds the metadata; the other pair's copy is ignored (replicated)
        assert image == want
        if t // 2 == spsel:
            other = layout.apply(reg=0, sub=s, lane=lane ^ 2, warp=w)
            assert other == want


def test_wgmma_sparse_metadata_alternating_selector_and_8bit():
    alt = wgmma_sparse_metadata("f16", "alternate")
    assert alt.out_size("chunk") == 16 and alt.is_bijective()
    for point, image in table_dicts(alt):
        t = point["lane"] % 4
        assert image["chunk"] // 8 == t // 2  # pair p carries instruction p (selector p)
    e8 = wgmma_sparse_metadata("e4m3")
    assert e8.is_bijective()
    for point, image in table_dicts(e8):
        w, lane, s = point["warp"], point["lane"], point["sub"]
        g, t = lane // 4, lane % 4
        assert image == {"m": 16 * w + g + 8 * (t % 2), "chunk": 8 * (t // 2) + s}
    with pytest.raises(LayoutError):
        wgmma_sparse_metadata("s8", 1)
    with pytest.raises(LayoutError):
        wgmma_sparse_metadata("e2m1")


def test_mma_sp_fragments():
    a = mma_sp_fragment("a")
    for point, image in table_dicts(a):
        g, t, i = point["lane"] // 4, point["lane"] % 4, point["reg"]
        assert image == {"m": g + 8 * ((i // 2) % 2), "k": 2 * t + i % 2 + 8 * (i // 4)}
    b = mma_sp_fragment("b")
    for point, image in table_dicts(b):
        g, t, i = point["lane"] // 4, point["lane"] % 4, point["reg"]
        assert image == {"k": 2 * t + (i & 1) + 8 * (i >> 1), "n": g}
    c = mma_sp_fragment("c")
    for point, image in table_dicts(c):
        g, t, i = point["lane"] // 4, point["lane"] % 4, point["reg"]
        assert image == {"m": g + 8 * (i // 2), "n": 2 * t + i % 2}
    meta = mma_sp_fragment("meta")
    for point, image in table_dicts(meta):
        g, t, s = point["lane"] // 4, point["lane"] % 4, point["sub"]
        assert image == {"m": g + 8 * (s // 4), "chunk": 4 * (t % 2) + s % 4}
    packed = mma_sp_fragment("a", packed=True)
    assert packed.apply(reg=1, sub=1, lane=5) == a.apply(reg=3, lane=5)
    with pytest.raises(LayoutError):
        mma_sp_fragment("x")


# --------------------------------------------------------------------------------------------
# Shared memory and swizzles (PTX §5.5.7 tables, docs/hardware.md §5.3)
# --------------------------------------------------------------------------------------------

#: PTX ISA §5.5.7: 16-byte chunk order of consecutive 128-byte lines, per swizzle mode
PTX_SWIZZLE_TABLES = {
    "32B": [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6]],
    "64B": [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6], [2, 3, 0, 1, 6, 7, 4, 5],
            [3, 2, 1, 0, 7, 6, 5, 4]],
    "128B": [[0, 1, 2, 3, 4, 5, 6, 7], [1, 0, 3, 2, 5, 4, 7, 6], [2, 3, 0, 1, 6, 7, 4, 5],
             [3, 2, 1, 0, 7, 6, 5, 4], [4, 5, 6, 7, 0, 1, 2, 3], [5, 4, 7, 6, 1, 0, 3, 2],
             [6, 7, 4, 5, 2, 3, 0, 1], [7, 6, 5, 4, 3, 2, 1, 0]],
}


@pytest.mark.parametrize("mode", ["32B", "64B", "128B"])
def test_swizzle_address_matches_ptx_tables(mode):
    table = PTX_SWIZZLE_TABLES[mode]
    for line in range(4 * len(table)):
        for position in range(8):
            chunk = table[line % len(table)][position]
            # the table lists which source chunk lands at each position; the swizzle is an involution
            assert swizzle_address(line * 128 + position * 16, mode) == line * 128 + chunk * 16
            assert swizzle_address(line * 128 + chunk * 16 + 5, mode) == line * 128 + position * 16 + 5


def test_smem_tile_128b_matches_the_h200_tma_observation():
    # docs/hardware.md §5.3: 64x64 f16 box, SWIZZLE_128B: chunk j of row r lands at chunk j ^ (r % 8)
    layout = smem_tile(64, 64, 16, "128B")
    inv = layout.invert()
    for r in range(64):
        for c in range(64):
            byte = inv.apply(m=r, k=c)["offset"] * 2
            assert byte == r * 128 + (((c * 2) // 16) ^ (r % 8)) * 16 + (c * 2) % 16


@pytest.mark.parametrize("mode, cols", [("32B", 32), ("64B", 32), ("64B", 64), ("128B", 128), ("none", 32)])
def test_smem_tile_rows_panels_and_swizzle(mode, cols):
    rows = 16
    layout = smem_tile(rows, cols, 16, mode)
    inv = layout.invert()
    span = {"32B": 32, "64B": 64, "128B": 128}.get(mode)
    for r in range(rows):
        for c in range(cols):
            cb = 2 * c
            if span is None:
                want = r * 2 * cols + cb
            else:
                pitch = min(span, 2 * cols)
                panel, within = divmod(cb, pitch)
                plain = panel * rows * pitch + r * pitch + within
                line, off = divmod(plain, 128)
                table = PTX_SWIZZLE_TABLES[mode]
                want = line * 128 + table[line % len(table)].index(off // 16) * 16 + off % 16
            assert inv.apply(m=r, k=c)["offset"] * 2 == want


def test_smem_core_matrices_both_arrangements():
    # K-major, K-adjacent core matrices (docs/hardware.md §4.2): LBO = 128 B
    kadj = smem_core_matrices(16, 32, 16).invert()
    for m in range(16):
        for k in range(32):
            want = (m // 8) * (128 * 4) + (k // 8) * 128 + (m % 8) * 16 + (k % 8) * 2
            assert kadj.apply(m=m, k=k)["offset"] * 2 == want
    # MN-adjacent (CUTLASS): core matrices M-first
    madj = smem_core_matrices(16, 32, 16, k_groups_adjacent=False).invert()
    for m in range(16):
        for k in range(32):
            want = (k // 8) * (128 * 2) + (m // 8) * 128 + (m % 8) * 16 + (k % 8) * 2
            assert madj.apply(m=m, k=k)["offset"] * 2 == want


def test_smem_from_strides_reproduces_ptx_examples():
    # PTX §9.7.16.3.3, MN-major 64B swizzle bf16: Swizzle<2,4,3> o ((8,4,2),(8,2)):((1,8,256),(32,512))
    layout = smem_from_strides([("n", [(8, 1), (4, 8), (2, 256)]), ("k", [(8, 32), (2, 512)])], 16, "64B")
    inv = layout.invert()
    for n in range(64):
        for k in range(16):
            plain = (n % 32) * 1 + (n // 32) * 256 + (k % 8) * 32 + (k // 8) * 512
            assert inv.apply(n=n, k=k)["offset"] * 2 == swizzle_address(plain * 2, "64B")
    with pytest.raises(LayoutError):
        smem_from_strides([("n", [(8, 3)])], 16)


def test_swizzle_names():
    from sparsile.frontend.layout.library import swizzle_name
    assert swizzle_name(None) == swizzle_name(0) == "none"
    assert swizzle_name(128) == "128B" and swizzle_name("64B") == "64B"
    with pytest.raises(LayoutError):
        swizzle_name(96)


@pytest.mark.parametrize("n", [63, 12, 4])
def test_a_wgmma_n_that_is_no_multiple_of_8_is_sp0401(n) -> None:
    # wgmma_accumulator(63) drew the layout of 64 (`sparsile layout "wgmma_accumulator(63)"`): no wgmma has N = 63
    with pytest.raises(LayoutError) as info:
        wgmma_accumulator(n)
    assert (info.value.code, info.value.message) == (
        "SP0401", f"wgmma accumulator: N must be a multiple of 8 (wgmma's m64nNk shapes), found {n}")


@pytest.mark.parametrize("n", [64.5, 64.0, "64", True])
def test_an_extent_must_be_an_integer(n) -> None:
    # wgmma_accumulator(64.5) used to build the layout of 64 (and "64" failed with a TypeError of `<`)
    with pytest.raises(LayoutError) as info:
        wgmma_accumulator(n)
    assert (info.value.code, info.value.message) == ("SP0401", f"an extent must be an integer, found {n!r}")
