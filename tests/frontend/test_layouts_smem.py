"""Shared-memory derivations: matrix-descriptor fields and vectorized stores with bank conflicts."""

from __future__ import annotations

import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.layout.library import (
    blocked,
    smem_core_matrices,
    smem_from_strides,
    smem_tile,
    tmem_accumulator,
    wgmma_accumulator,
)
from sparsile.frontend.layout.smem import (
    smem_descriptor_fields,
    smem_wavefronts,
    storable_layout,
    storable_register_layout,
    store_plan,
)
from sparsile.frontend.layout.tmem_access import tmem_register_layout

# ---------------------------------------------------------------------------------------------
# shared-memory descriptors (docs/hardware.md §1.5, §4.2, §9; PTX canonical-layout examples)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("swizzle, sbo", [("128B", 1024), ("64B", 512), ("32B", 256)])
def test_k_major_swizzled_tiles(swizzle, sbo):
    span_elems = int(swizzle[:-1]) // 2
    fields = smem_descriptor_fields(smem_tile(128, span_elems, 16, swizzle), 16, "K").require()
    assert (fields.swizzle, fields.lbo, fields.lbo_field, fields.sbo) == (swizzle, None, 1, sbo)
    assert fields.mn_extent == 128 and fields.k_extent == span_elems
    assert fields.base_alignment == 8 * int(swizzle[:-1])
    assert fields.swizzle_code_sm100 == {"128B": 2, "64B": 4, "32B": 6}[swizzle]
    assert fields.swizzle_code_sm90 == {"128B": 1, "64B": 2, "32B": 3}[swizzle]
    # a K extent of two swizzle rows: the second panel is a start-address advance
    wide = smem_descriptor_fields(smem_tile(128, 2 * span_elems, 16, swizzle), 16, "K").require()
    assert wide.k_offsets == ((span_elems, 128 * int(swizzle[:-1])),)


def test_k_major_core_matrices_both_arrangements():
    h200 = smem_descriptor_fields(smem_core_matrices(64, 32, 16), 16, "K").require()
    assert (h200.swizzle, h200.lbo, h200.sbo) == ("none", 128, 4 * 128)  # SBO = bytes per 8-row group
    cutlass = smem_descriptor_fields(smem_core_matrices(128, 32, 16, k_groups_adjacent=False), 16, "K").require()
    assert (cutlass.lbo, cutlass.sbo) == (2048, 128)  # docs/hardware.md §9: LBO = (rows/8)*128 B


def test_mn_major_examples():
    # docs/hardware.md §9: f16 MN-major, no swizzle, 128x64 tile: LBO = 128 B, SBO = 1024 B
    f = smem_descriptor_fields(smem_core_matrices(128, 64, 16, k_major=False), 16, "MN").require()
    assert (f.swizzle, f.lbo, f.sbo, f.mn_extent, f.k_extent) == ("none", 128, 1024, 128, 64)
    # PTX §9.7.15.5.1.2.1.3 examples (bf16): exact layouts in elements
    ex = {
        "none": ([("n", [(8, 1), (2, 64)]), ("k", [(8, 8), (2, 128)])], 256, 128),
        "32B": ([("n", [(8, 1), (2, 8), (2, 128)]), ("k", [(8, 16), (2, 256)])], 256, 512),
        "64B": ([("n", [(8, 1), (4, 8), (2, 256)]), ("k", [(8, 32), (2, 512)])], 512, 1024),
    }
    for swizzle, (modes, lbo, sbo) in ex.items():
        f = smem_descriptor_fields(smem_from_strides(modes, 16, swizzle), 16, "MN").require()
        assert (f.swizzle, f.lbo, f.sbo) == (swizzle, lbo, sbo), swizzle
    # K-major, no swizzle, tf32: ((8,2),(4,4)):((4,32),(1,64)) -> LBO 256 B, SBO 128 B
    tf32 = smem_from_strides([("m", [(8, 4), (2, 32)]), ("k", [(4, 1), (4, 64)])], 32, "none")
    f = smem_descriptor_fields(tf32, 32, "K").require()
    assert (f.lbo, f.sbo, f.lbo_field, f.sbo_field) == (256, 128, 16, 8)


def test_descriptor_failures_have_reasons():
    plain = smem_tile(128, 32, 16, "none")  # row-major, 64-byte rows: not core matrices
    f = smem_descriptor_fields(plain, 16, "K")
    assert not f.ok and "16 bytes apart" in f.reason
    with pytest.raises(CompileError) as info:
        f.require()
    assert info.value.codes == ["SP0406"]
    narrow = smem_descriptor_fields(smem_tile(128, 32, 16, "128B"), 16, "K")
    assert not narrow.ok  # 64-byte rows under a 128-byte swizzle
    assert not smem_descriptor_fields(blocked((8, 8), (1, 1), (4, 8), (1, 1), (1, 0)), 16).ok


# ---------------------------------------------------------------------------------------------
# stores to shared memory (seed 002) and bank conflicts
# ---------------------------------------------------------------------------------------------

def test_smem_wavefronts_hand_examples():
    assert smem_wavefronts([4 * i for i in range(32)], 4) == 1
    assert smem_wavefronts([128 * i for i in range(32)], 4) == 32
    assert smem_wavefronts([0] * 32, 4) == 1                      # broadcast
    assert smem_wavefronts([16 * i for i in range(32)], 16) == 4   # 4 phases of 8 lanes
    assert smem_wavefronts([128 * i for i in range(32)], 16) == 32
    assert smem_wavefronts([2 * i for i in range(32)], 2) == 1


def test_seed_002_tcgen05_accumulator_stores_to_swizzled_smem():
    acc = tmem_register_layout(tmem_accumulator(128, 64), "32x32b")  # one row per thread
    swizzled = store_plan(acc, smem_tile(128, 64, 16, "128B", dims=("m", "n")), 16).require()
    assert swizzled.vector_bits == 128 and swizzled.wavefronts == swizzled.ideal_wavefronts
    plain = store_plan(acc, smem_tile(128, 64, 16, "none", dims=("m", "n")), 16).require()
    assert plain.conflict_factor == 8.0
    best = storable_layout(acc, smem_tile(128, 64, 16, "128B", dims=("m", "n")), 16)
    assert best.ok and best.method == "st.shared" and best.conflict_factor == 1.0


def test_wgmma_accumulator_uses_stmatrix():
    acc = wgmma_accumulator(64)
    plan = storable_layout(acc, smem_tile(64, 64, 16, "128B", dims=("m", "n")), 16)
    assert plan.method == "stmatrix" and plan.matrices_per_instruction == 4
    assert plan.wavefronts == plan.ideal_wavefronts
    for group in plan.register_groups:
        assert len(group) == 8
    trans = store_plan(acc, smem_tile(64, 64, 16, "128B", dims=("n", "m")).transpose_outs(["m", "n"]), 16,
                       method="stmatrix.trans")
    assert trans.ok and trans.transpose
    wide = store_plan(acc, smem_tile(64, 64, 16, "128B", dims=("m", "n")), 16, width_bits=128)
    assert not wide.ok and "consecutive elements" in wide.reason
    assert not store_plan(acc, smem_tile(64, 64, 32, "128B", dims=("m", "n")), 32, method="stmatrix").ok


def test_replicated_values_store_from_one_replica():
    bcast = blocked((16, 16), (1, 1), (1, 32), (4, 1), (1, 0), ("m", "n"))  # lanes 16..31 and warps repeat
    plan = store_plan(bcast, smem_tile(16, 16, 32, "none", dims=("m", "n")), 32).require()
    assert ("lane", 4) in plan.predicate


def test_storable_register_layout_round_trip():
    smem = smem_tile(64, 64, 16, "128B")
    regs = storable_register_layout(smem, 16)
    plan = store_plan(regs, smem, 16, width_bits=128).require()
    assert plan.wavefronts == plan.ideal_wavefronts
    assert storable_layout(wgmma_accumulator(8), smem, 16).ok is False
