"""The sm_100a encodings checked against the PTX ISA itself, not against docs/hardware.md.

Every expected bit position below was transcribed by hand from the PTX ISA (section "Tensorcore
5th Generation Family Instructions"): the tables "Instruction descriptor format for .kind::tf32,
.kind::f16, .kind::f8f6f4 and .kind::i8", "... for .kind::mxf8f6f4", "... for .kind::mxf4 and
.kind::mxf4nvf4" (subsection "Instruction descriptor") and "Shared memory descriptor layout"
(subsection "Shared memory descriptor"). The reference encoders here are written from those
tables alone and compared with ``target/idesc.py`` / ``target/smem_desc.py`` over many descriptors.

The TMEM metadata placement is compared with the metadata atoms of CUTLASS's Blackwell sparse
GEMM configuration (``Sm1xxGemmSparseConfig``: a 2 KB atom of 128 rows, its (row, K) -> bit
strides per operand class), an implementation independent of this project's formatter, and the
K-step metadata addressing with the ISA subsection "Sparsity selector" (8-bit kinds: selector 0,
all columns selected) and JAX Mosaic GPU's 16-bit rule (column pair + alternating selector).
"""

from __future__ import annotations

import itertools

import pytest

from sparsile.backend.lower.blackwell_mma import mma_plan
from sparsile.frontend.ir import types as T
from sparsile.stdlib.sparsity import operand_type, word_position
from sparsile.target import descriptors as D
from sparsile.target.descriptors import InstrDesc, SmemDesc

# --------------------------------------------------------------------------------------------
# Instruction descriptor, plain kinds: (low bit, width) of each field, from the ISA table.
# --------------------------------------------------------------------------------------------

ISA_PLAIN = {"selector": (0, 2), "sparse": (2, 1), "saturate": (3, 1), "dtype": (4, 2), "atype": (7, 3),
             "btype": (10, 3), "neg_a": (13, 1), "neg_b": (14, 1), "trans_a": (15, 1), "trans_b": (16, 1),
             "n": (17, 6), "m": (24, 5), "max_shift": (30, 2)}
ISA_PLAIN_RESERVED = (1 << 6) | (1 << 23) | (1 << 29)
ISA_D_CODE = {"f16": 0, "f32": 1, "s32": 2}
ISA_AB_CODE = {"f16": {"f16": 0, "bf16": 1}, "tf32": {"tf32": 2},
               "f8f6f4": {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5}, "i8": {"u8": 0, "s8": 1}}
ISA_SHIFT_CODE = {0: 0, 8: 1, 16: 2, 32: 3}

# Block-scaled kinds. mxf4 / mxf4nvf4: btype is 2 bits (10-11) and bit 12 is reserved; the
# 3-bit field below is fine because the only code (E2M1 = 1) leaves bit 12 clear.
ISA_BLOCK = {"sparse": (2, 1), "b_sf_id": (4, 2), "atype": (7, 3), "btype": (10, 3), "neg_a": (13, 1),
             "neg_b": (14, 1), "trans_a": (15, 1), "trans_b": (16, 1), "n": (17, 6), "scale_type": (23, 1),
             "m": (27, 2), "a_sf_id": (29, 2), "k96": (31, 1)}
ISA_BLOCK_RESERVED = {"mxf8f6f4": 0b11 | (1 << 3) | (1 << 6) | (0b111 << 24) | (1 << 31),
                      "mxf4": 0b11 | (1 << 3) | (1 << 6) | (1 << 12) | (0b111 << 24),
                      "mxf4nvf4": 0b11 | (1 << 3) | (1 << 6) | (1 << 12) | (0b111 << 24)}
ISA_BLOCK_AB_CODE = {"mxf8f6f4": ISA_AB_CODE["f8f6f4"], "mxf4": {"e2m1": 1}, "mxf4nvf4": {"e2m1": 1}}
ISA_SCALE_CODE = {"ue4m3": 0, "ue8m0": 1}


def _put(fields: dict[str, tuple[int, int]], values: dict[str, int]) -> int:
    word = 0
    for name, value in values.items():
        lo, width = fields[name]
        assert 0 <= value < (1 << width), (name, value)
        word |= value << lo
    return word


def isa_plain_word(d: InstrDesc) -> int:
    codes = ISA_AB_CODE[d.kind]
    return _put(ISA_PLAIN, dict(
        selector=d.selector, sparse=int(d.sparse), saturate=int(d.saturate), dtype=ISA_D_CODE[d.d_dtype],
        atype=codes[d.a_dtype], btype=codes[d.b_dtype], neg_a=int(d.negate_a), neg_b=int(d.negate_b),
        trans_a=int(d.a_major == "MN"), trans_b=int(d.b_major == "MN"), n=d.n >> 3, m=d.m >> 4,
        max_shift=ISA_SHIFT_CODE[d.max_shift]))


def isa_block_word(d: InstrDesc) -> int:
    codes = ISA_BLOCK_AB_CODE[d.kind]
    return _put(ISA_BLOCK, dict(
        sparse=int(d.sparse), b_sf_id=d.b_scale_id, atype=codes[d.a_dtype], btype=codes[d.b_dtype],
        neg_a=int(d.negate_a), neg_b=int(d.negate_b), trans_a=int(d.a_major == "MN"),
        trans_b=int(d.b_major == "MN"), n=d.n >> 3, scale_type=ISA_SCALE_CODE[d.scale_dtype or "ue8m0"],
        m=d.m >> 7, a_sf_id=d.a_scale_id, k96=int(d.k96)))


def _plain_descs():
    types = {"f16": [("f16", "f16", "f32"), ("f16", "f16", "f16"), ("bf16", "bf16", "f32")],
             "tf32": [("tf32", "tf32", "f32")],
             "f8f6f4": [("e4m3", "e4m3", "f32"), ("e5m2", "e4m3", "f16"), ("e2m3", "e3m2", "f32"),
                        ("e2m1", "e2m1", "f32")],
             "i8": [("s8", "s8", "s32"), ("u8", "s8", "s32")]}
    for kind, combos in types.items():
        for (a, b, acc), cg, sparse in itertools.product(combos, (1, 2), (False, True)):
            for m, n in itertools.product((64, 128, 256), (8, 16, 32, 48, 64, 128, 256)):
                sels = (0, 1) if sparse and kind in ("f16", "tf32") else (0,)
                for sel, bm in itertools.product(sels, ("K", "MN")):
                    extra = dict(saturate=True) if kind == "i8" else dict(negate_a=True, negate_b=True)
                    for more in ({}, extra):
                        d = InstrDesc(kind, a, b, acc, m, n, sparse=sparse, selector=sel, b_major=bm,
                                      cta_group=cg, **more)
                        if not D.idesc_problems(d):
                            yield d


PLAIN = list(_plain_descs())


def test_plain_descriptor_set_is_broad():
    assert len(PLAIN) > 500
    assert {d.kind for d in PLAIN} == {"f16", "tf32", "f8f6f4", "i8"}
    assert {d.m for d in PLAIN} == {64, 128, 256}


@pytest.mark.parametrize("d", PLAIN, ids=lambda d: f"{d.kind}-{d.a_dtype}-{d.m}x{d.n}-sp{int(d.sparse)}")
def test_plain_idesc_matches_isa_table(d):
    """PTX ISA "Instruction descriptor format for .kind::tf32, .kind::f16, .kind::f8f6f4 and
    .kind::i8": every field at its table position, reserved bits 6, 23, 29 clear."""
    word = D.encode_idesc(d)
    assert word == isa_plain_word(d), f"{word:#010x} != {isa_plain_word(d):#010x}"
    assert word & ISA_PLAIN_RESERVED == 0
    assert D.decode_idesc(word, d.kind, cta_group=d.cta_group) == d


def test_max_shift_codes_match_isa():
    """Same table, bits 30-31: no shift 0, 8 -> 1, 16 -> 2, 32 -> 3."""
    for shift, code in ISA_SHIFT_CODE.items():
        d = InstrDesc("f16", "f16", "f16", "f32", 128, 64, sparse=False, max_shift=shift)
        assert D.encode_idesc(d) >> 30 == code


def _block_descs():
    for kind, cg, sparse, n in itertools.product(("mxf8f6f4", "mxf4", "mxf4nvf4"), (1, 2), (False, True),
                                                 (32, 64, 128, 256)):
        m = 128 * cg
        if kind == "mxf8f6f4":
            variants = [dict(a_dtype=a, b_dtype=b, scale_dtype="ue8m0", a_scale_id=i, b_scale_id=j, block_size=32)
                        for (a, b), i, j in itertools.product((("e4m3", "e4m3"), ("e5m2", "e2m1")), range(4), range(4))]
        else:
            blocks = ((32, "ue8m0"),) if kind == "mxf4" else ((32, "ue8m0"), (16, "ue8m0"), (16, "ue4m3"))
            variants = [dict(a_dtype="e2m1", b_dtype="e2m1", scale_dtype=s, a_scale_id=i, b_scale_id=j,
                             block_size=bs, k96=k96)
                        for (bs, s), i, j, k96 in itertools.product(blocks, (0, 2), (0, 2), (False, True))]
        for v in variants:
            for neg in (False, True):
                d = InstrDesc(kind, d_dtype="f32", m=m, n=n, sparse=sparse, cta_group=cg, negate_a=neg, **v)
                if not D.idesc_problems(d):
                    yield d


BLOCK = list(_block_descs())


def test_block_descriptor_set_is_broad():
    assert {d.kind for d in BLOCK} == {"mxf8f6f4", "mxf4", "mxf4nvf4"}
    assert any(d.k96 for d in BLOCK) and any(d.sparse for d in BLOCK)


@pytest.mark.parametrize("d", BLOCK, ids=lambda d: f"{d.kind}-{d.m}x{d.n}-sp{int(d.sparse)}")
def test_block_scaled_idesc_matches_isa_table(d):
    """PTX ISA "Instruction descriptor format for .kind::mxf8f6f4" and "... .kind::mxf4 and
    .kind::mxf4nvf4": M >> 7 at 27-28, scale type at 23, scale-factor ids at 4-5 (B) and 29-30
    (A); bits 0-1, 3, 6, 24-26 reserved (and 12 for the 4-bit kinds, 31 for mxf8f6f4)."""
    word = D.encode_idesc(d)
    assert word == isa_block_word(d), f"{word:#010x} != {isa_block_word(d):#010x}"
    assert word & ISA_BLOCK_RESERVED[d.kind] == 0


@pytest.mark.parametrize("kind, word", [("mxf8f6f4", 0x08900000), ("mxf4", 0x08900480), ("mxf4nvf4", 0x08900480)])
def test_block_scaled_decode_rejects_isa_reserved_bits(kind, word):
    """The block-scaled tables have no sparsity selector: bits 0-1 are "Reserved - Must be 0",
    and for .kind::mxf8f6f4 so is bit 31 (the K = 96 flag exists only for the 4-bit kinds). A
    word with one of them set must not decode as a valid descriptor."""
    D.decode_idesc(word, kind)  # the clean word decodes
    for bit in (0, 1) + ((31,) if kind == "mxf8f6f4" else ()):
        with pytest.raises(ValueError, match="reserved"):
            D.decode_idesc(word | (1 << bit), kind)


# --------------------------------------------------------------------------------------------
# Shared-memory descriptor: ISA table "Shared memory descriptor layout".
# --------------------------------------------------------------------------------------------

ISA_SWIZZLE = {"none": 0, "128B_base32B": 1, "128B": 2, "64B": 4, "32B": 6}


def isa_smem_word(d: SmemDesc) -> int:
    enc = lambda x: (x & 0x3FFFF) >> 4  # noqa: E731  the ISA's matrix-descriptor-encode
    return (enc(d.start_address) | enc(d.lbo) << 16 | enc(d.sbo) << 32 | 0b001 << 46 | d.base_offset << 49
            | d.lbo_mode << 52 | ISA_SWIZZLE[d.swizzle] << 61)


@pytest.mark.parametrize("swizzle", sorted(ISA_SWIZZLE))
def test_tcgen05_smem_descriptor_matches_isa_table(swizzle):
    """Bits 0-13 / 16-29 / 32-45 = (x & 0x3FFFF) >> 4 of address / LBO / SBO, 46-48 the constant
    0b001, 49-51 base offset, 52 LBO mode, 53-60 zero, 61-63 swizzle (0, 1, 2, 4, 6)."""
    for addr, lbo, sbo, base in itertools.product((0, 0x10, 0x400, 0x3FFF0), (0, 16, 128, 0x3FFF0),
                                                  (16, 1024, 0x3FFF0), (0, 3, 7)):
        d = SmemDesc(addr, lbo, sbo, swizzle, base)
        word = D.encode_tcgen05_smem_desc(d, major="MN")
        assert word == isa_smem_word(d)
        assert (word >> 46) & 0b111 == 0b001 and (word >> 53) & 0xFF == 0
        assert D.decode_tcgen05_smem_desc(word) == d


def test_smem_swizzle_codes_3_5_7_are_invalid():
    base = isa_smem_word(SmemDesc(0x400, 16, 1024))
    for code in (3, 5, 7):
        with pytest.raises(ValueError):
            D.decode_tcgen05_smem_desc(base | code << 61)


def test_base_offset_formula_matches_isa():
    """Base offset 0 on the pattern's repeat boundary (1024 / 512 / 256 bytes), else
    ``(start >> 7) & 7``."""
    for swz, repeat in (("128B", 1024), ("64B", 512), ("32B", 256)):
        for addr in range(0, 4096, 128):
            want = 0 if addr % repeat == 0 else (addr >> 7) & 7
            assert D.swizzle_base_offset(addr, swz) == want


# --------------------------------------------------------------------------------------------
# TMEM metadata placement vs CUTLASS's Blackwell metadata atoms.
# --------------------------------------------------------------------------------------------

# (row shape, row stride), (k shape, k stride), bits per stride unit. Offsets are counted in
# units of one metadata element (CUTLASS's sparse metadata type), which stands for `unit_bits`
# bits; a 2 KB atom is 128 lanes x 128 bits, so lane = bit // 128 and the bit inside the lane
# is bit % 128 (column = that // 32).
CUTLASS_E_ATOMS = {
    "f16": (((8, 2, 8), (128, 16, 2048)), ((16, 2, 4), (1, 1024, 32)), 1),
    "tf32": (((8, 2, 8), (64, 8, 1024)), ((8, 2, 4), (1, 512, 16)), 2),
    "e4m3": (((128,), (128,)), ((128,), (1,)), 1),
    "s8": (((128,), (128,)), ((128,), (1,)), 1),
    "e2m1": (((128,), (256,)), ((256,), (1,)), 0.5),
}


def _coord_offset(index: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    out = 0
    for s, st in zip(shape, stride):
        index, i = divmod(index, s)
        out += i * st
    return out


@pytest.mark.parametrize("dtype", sorted(CUTLASS_E_ATOMS))
def test_tmem_metadata_placement_matches_cutlass_atoms(dtype):
    """Where the nibble of (row, chunk) sits in a 2 KB metadata atom (= the TMEM image copied by
    ``tcgen05.cp.128x128b``): lane, column and nibble slot from ``word_position("tcgen05")`` equal
    those of CUTLASS's (row, K) -> bit atom at the chunk's first element."""
    (rs, rst), (ks, kst), unit_bits = CUTLASS_E_ATOMS[dtype]
    op = operand_type(dtype)
    for row in range(128):
        for chunk in range(op.chunks_per_atom):
            bit = int((_coord_offset(row, rs, rst) + _coord_offset(chunk * op.group, ks, kst)) * unit_bits)
            assert bit % 4 == 0
            (katom, matom, lane, col), slot = word_position("tcgen05", op, row, chunk)
            assert (katom, matom) == (0, 0)
            assert (lane, col, slot) == (bit // 128, (bit % 128) // 32, (bit % 32) // 4), (row, chunk)


# --------------------------------------------------------------------------------------------
# Which metadata each K step reads.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("a, acc", [(T.f16, T.f32), (T.bf16, T.f32), (T.f32, T.f32), (T.e4m3, T.f32),
                                    (T.i8, T.i32)])
def test_k_step_reads_its_own_metadata_columns(a, acc):
    """A 16-bit / tf32 step reads one 32-bit column: the address names the even column of a
    pair and the selector (idesc bits 0-1) the column in it, so step ks reads column ks. An
    8-bit step reads two columns with selector 0 (ISA "Sparsity selector": must be 0 for
    .kind::i8 and .kind::f8f6f4, all columns selected), so step ks reads 2ks and 2ks + 1. The
    selector in the plan and the one encoded in the descriptor agree."""
    k = 512 if a.bits == 8 else 256
    plan = mma_plan(a, a, acc, 256, 256, k, True, 256, 16)
    cols = 2 if a.bits == 8 else 1
    for ins in plan:
        assert ins.idesc & 0b11 == ins.selector
        assert ins.idesc & 0b100  # the sparse flag
        assert ins.meta_col is not None and ins.meta_col % 2 == 0
        tile_base = ins.m_tile * 16
        assert ins.meta_col - tile_base + ins.selector == ins.k_step * cols
        if cols == 2:
            assert ins.selector == 0
