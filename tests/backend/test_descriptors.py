"""Tests for target/descriptors.py. Expected words are computed by hand from the bit tables of
docs/hardware.md §1.3, §1.5 and §4.3 (the arithmetic is in the comments)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import InternalError
from sparsile.target import descriptors as D
from sparsile.target.descriptors import InstrDesc, SmemDesc

# --------------------------------------------------------------------------------------------
# Instruction descriptor: worked and hand-computed examples
# --------------------------------------------------------------------------------------------

ENCODINGS = [
    # §1.3 worked examples (M=128, N=256, K-major, sparse, selector 0)
    (InstrDesc("f16", "f16", "f16", "f32", 128, 256), 0x08400014),
    (InstrDesc("f16", "bf16", "bf16", "f32", 128, 256), 0x08400494),
    (InstrDesc("f8f6f4", "e4m3", "e4m3", "f32", 128, 256), 0x08400014),
    (InstrDesc("i8", "s8", "s8", "s32", 128, 256), 0x084004A4),
    # ... plus the selector in bits 0-1
    (InstrDesc("f16", "f16", "f16", "f32", 128, 256, selector=1), 0x08400015),
    # tf32 N=64 sel 1: 1 | 4 | D f32 1<<4 | A 2<<7=0x100 | B 2<<10=0x800 | 8<<17=0x100000 | 8<<24
    (InstrDesc("tf32", "tf32", "tf32", "f32", 128, 64, selector=1), 0x08100915),
    # dense f16->f16 M=64 N=8, B MN-major: bit16 0x10000 | 1<<17 0x20000 | 4<<24 0x04000000
    (InstrDesc("f16", "f16", "f16", "f16", 64, 8, sparse=False, b_major="MN"), 0x04030000),
    # f8f6f4 e4m3 x e5m2 -> f16, cta_group 2, M=256 N=128: 4 | B 1<<10 | 16<<17 0x200000 | 16<<24
    (InstrDesc("f8f6f4", "e4m3", "e5m2", "f16", 256, 128, cta_group=2), 0x10200404),
    # dense i8 u8 x s8 saturate M=128 N=48: sat 8 | D s32 0x20 | B 0x400 | 6<<17 0xC0000 | 8<<24
    (InstrDesc("i8", "u8", "s8", "s32", 128, 48, sparse=False, saturate=True), 0x080C0428),
    # negate A: 4 | 0x10 | 1<<13 0x2000 | 16<<17 0x200000 | 8<<24
    (InstrDesc("f16", "f16", "f16", "f32", 128, 128, negate_a=True), 0x08202014),
    # max shift 32 (code 3 at bits 30-31), dense f16 -> f32 M=128 N=64
    (InstrDesc("f16", "f16", "f16", "f32", 128, 64, sparse=False, max_shift=32), 0xC8100010),
    # mxf8f6f4 block32, e4m3 x e2m1, sparse M=128 N=64, ue8m0, sfa id 1, sfb id 2:
    # sfa 1<<29 | M>>7=1 <<27 | ue8m0 1<<23 | 8<<17 | B e2m1 5<<10=0x1400 | sfb 2<<4 | sparse 4
    (InstrDesc("mxf8f6f4", "e4m3", "e2m1", "f32", 128, 64, scale_dtype="ue8m0", a_scale_id=1, b_scale_id=2),
     0x28901424),
    # mxf4nvf4 block16 ue4m3 dense cta_group 2 M=256 N=256: 2<<27 | 32<<17 | B 1<<10 | A 1<<7
    (InstrDesc("mxf4nvf4", "e2m1", "e2m1", "f32", 256, 256, sparse=False, cta_group=2, scale_dtype="ue4m3",
               block_size=16), 0x10400480),
    # mxf4 dense K=96 ue8m0 M=128 N=128: 1<<31 | 1<<27 | 1<<23 | 16<<17 | 0x400 | 0x80
    (InstrDesc("mxf4", "e2m1", "e2m1", "f32", 128, 128, sparse=False, scale_dtype="ue8m0", k96=True),
     0x88A00480),
]


@pytest.mark.parametrize(("desc", "word"), ENCODINGS)
def test_encode_known_words(desc, word):
    assert D.idesc_problems(desc) == []
    assert D.encode_idesc(desc) == word


@pytest.mark.parametrize(("desc", "word"), ENCODINGS)
def test_decode_known_words(desc, word):
    decoded = D.decode_idesc(word, desc.kind, cta_group=desc.cta_group, block_size=desc.block_size)
    assert decoded == desc


def test_describe():
    text = D.describe_idesc(0x08400015, "f16")
    assert text == "idesc 0x08400015 kind::f16 sparse sel=1 A=f16/K B=f16/K D=f32 M=128 N=256"
    assert "scale=ue8m0" in D.describe_idesc(0x28901424, "mxf8f6f4")
    assert "satfinite" in D.describe_idesc(0x080C0428, "i8")
    assert "A=-f16/K" in D.describe_idesc(0x08202014, "f16")
    assert "K=96" in D.describe_idesc(0x88A00480, "mxf4")


def test_decode_rejects_bad_words():
    with pytest.raises(ValueError, match="reserved"):
        D.decode_idesc(0x08400014 | (1 << 23), "f16")
    with pytest.raises(ValueError, match="A type"):
        D.decode_idesc(0x08400014 | (3 << 7), "f16")  # code 3 is not f16/bf16
    with pytest.raises(ValueError, match="D type"):
        D.decode_idesc(0x08400004 | (3 << 4), "f16")
    with pytest.raises(ValueError, match="kind"):
        D.decode_idesc(0, "f64")
    with pytest.raises(ValueError, match="32 bits"):
        D.decode_idesc(1 << 32, "f16")
    with pytest.raises(ValueError, match="reserved"):
        D.decode_idesc(0x10400480 | (1 << 12), "mxf4nvf4")


def test_encode_refuses_descriptors_with_problems():
    with pytest.raises(InternalError, match="SP0505"):
        D.encode_idesc(InstrDesc("f16", "f16", "f16", "f32", 128, 12))


def test_k_per_instruction():
    assert [D.tcgen05_k(k) for k in ("f16", "tf32", "f8f6f4", "i8", "mxf8f6f4", "mxf4", "mxf4nvf4")] == [
        32, 16, 64, 64, 64, 128, 128]
    assert D.tcgen05_k("f16", sparse=False) == 16


# --------------------------------------------------------------------------------------------
# Instruction descriptor: every problem class
# --------------------------------------------------------------------------------------------


def _codes(desc: InstrDesc) -> list[str]:
    return [p.code for p in D.idesc_problems(desc)]


def test_n_message_is_user_grade():
    (problem,) = D.idesc_problems(InstrDesc("f16", "f16", "f16", "f32", 128, 12))
    assert problem.code == "SP0505"
    assert problem.message == "N = 12 is not a multiple of 8 for kind::f16 with cta_group::1"
    assert problem.help == "use N in 8..256, step 8"
    assert problem.field == "n"


@pytest.mark.parametrize(("kind", "ab", "acc", "m", "cg", "good", "bad"), [
    ("f16", "f16", "f32", 128, 1, [8, 16, 136, 256], [0, 4, 12, 264, 512]),
    ("f16", "f16", "f32", 256, 2, [16, 48, 256], [8, 24, 40]),
    ("tf32", "tf32", "f32", 128, 1, [8, 248], [12, 260]),
    ("tf32", "tf32", "f32", 128, 2, [16, 32], [8, 24]),
    ("f8f6f4", "e4m3", "f32", 128, 1, [16, 32, 256], [8, 24, 40]),  # M=128 sparse: step 16
    ("f8f6f4", "e4m3", "f32", 256, 2, [32, 64, 256], [16, 48]),    # §9: sparse cta_group::2 needs N % 32
    ("i8", "s8", "s32", 128, 1, [8, 16, 32, 48, 64, 256], [24, 40, 56, 12]),
    ("i8", "s8", "s32", 256, 2, [32, 64, 96, 256], [16, 48]),
    ("mxf8f6f4", "e4m3", "f32", 128, 1, [8, 24, 256], [4, 12]),
    ("mxf4", "e2m1", "f32", 256, 2, [16, 240], [8, 24]),
])
def test_n_rules(kind, ab, acc, m, cg, good, bad):
    scale = "ue8m0" if kind.startswith("mx") else None
    for n in good:
        assert _codes(InstrDesc(kind, ab, ab, acc, m, n, cta_group=cg, scale_dtype=scale)) == [], n
    for n in bad:
        assert _codes(InstrDesc(kind, ab, ab, acc, m, n, cta_group=cg, scale_dtype=scale)) == ["SP0505"], n


def test_n_rules_dense_f8f6f4_depend_on_b_major():
    def codes(n, cg, b_major):
        m = 128 if cg == 1 else 256
        return _codes(InstrDesc("f8f6f4", "e4m3", "e4m3", "f32", m, n, sparse=False, cta_group=cg,
                                b_major=b_major))
    assert codes(24, 1, "K") == [] and codes(24, 1, "MN") == ["SP0505"]
    assert codes(48, 2, "K") == [] and codes(48, 2, "MN") == ["SP0505"]
    assert codes(64, 2, "MN") == []
    # sparse cta_group::1 with M=64 keeps step 8 (§1.2) but sparse M=64 is itself refused
    assert _codes(InstrDesc("f8f6f4", "e4m3", "e4m3", "f32", 64, 24)) == ["SP0512"]


def test_i8_n24_help_explains_why():
    (problem,) = D.idesc_problems(InstrDesc("i8", "s8", "s8", "s32", 128, 24))
    assert "not a supported N" in problem.message and "CUTLASS" in problem.help


@pytest.mark.parametrize(("kind", "ab", "acc", "cg", "good_m", "bad_m"), [
    ("f16", "f16", "f32", 1, [128], [32, 96, 256]),
    ("f16", "f16", "f32", 2, [128, 256], [64]),
    ("mxf8f6f4", "e4m3", "f32", 1, [128], [64, 256]),
    ("mxf4nvf4", "e2m1", "f32", 2, [256], [128]),
])
def test_m_rules(kind, ab, acc, cg, good_m, bad_m):
    extra = {"scale_dtype": "ue8m0", "block_size": 32} if kind.startswith("mx") else {}
    for m in good_m:
        assert _codes(InstrDesc(kind, ab, ab, acc, m, 64, cta_group=cg, **extra)) == [], m
    for m in bad_m:
        assert _codes(InstrDesc(kind, ab, ab, acc, m, 64, cta_group=cg, **extra)) == ["SP0504"], m


def test_sparse_m64_refused_dense_m64_fine():
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 64, 64)) == ["SP0512"]
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 64, 64, sparse=False)) == []


def test_unknown_names():
    assert _codes(InstrDesc("f64", "f16", "f16", "f32", 128, 64)) == ["SP0501"]
    assert _codes(InstrDesc("f16", "fp16", "f16", "f32", 128, 64)) == ["SP0501"]
    assert _codes(InstrDesc("f16", "f16", "f16", "f64", 128, 64)) == ["SP0501"]
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 128, 64, a_major="row")) == ["SP0501"]
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 128, 64, cta_group=4)) == ["SP0511"]


def test_operand_and_accumulator_types():
    assert _codes(InstrDesc("f16", "e4m3", "f16", "f32", 128, 64)) == ["SP0502"]
    assert _codes(InstrDesc("f16", "f16", "bf16", "f32", 128, 64)) == ["SP0502"]  # no mixing
    assert _codes(InstrDesc("tf32", "f16", "f16", "f32", 128, 64)) == ["SP0502", "SP0502"]  # A and B
    assert _codes(InstrDesc("f8f6f4", "e4m3", "e2m1", "f16", 128, 64)) == []     # mixing allowed
    assert _codes(InstrDesc("i8", "u8", "s8", "s32", 128, 64)) == []
    assert _codes(InstrDesc("f16", "bf16", "bf16", "f16", 128, 64)) == ["SP0503"]
    assert _codes(InstrDesc("tf32", "tf32", "tf32", "f16", 128, 64)) == ["SP0503"]
    assert _codes(InstrDesc("i8", "s8", "s8", "f32", 128, 64)) == ["SP0503"]
    assert _codes(InstrDesc("mxf8f6f4", "e4m3", "e4m3", "f16", 128, 64, scale_dtype="ue8m0")) == ["SP0503"]
    (problem,) = D.idesc_problems(InstrDesc("f16", "bf16", "bf16", "f16", 128, 64))
    assert problem.help == "use a f32 accumulator"


def test_mn_major_types():
    for dtype, kind, acc in (("e4m3", "f8f6f4", "f32"), ("s8", "i8", "s32"), ("tf32", "tf32", "f32")):
        assert _codes(InstrDesc(kind, dtype, dtype, acc, 128, 64, a_major="MN", b_major="MN")) == []
    for dtype in ("e2m3", "e3m2", "e2m1"):
        assert _codes(InstrDesc("f8f6f4", dtype, "e4m3", "f32", 128, 64, a_major="MN")) == ["SP0506"]
    assert _codes(InstrDesc("mxf4", "e2m1", "e2m1", "f32", 128, 64, b_major="MN",
                            scale_dtype="ue8m0")) == ["SP0506"]


def test_negate_saturate_max_shift():
    assert _codes(InstrDesc("i8", "s8", "s8", "s32", 128, 64, negate_b=True)) == ["SP0507"]
    assert _codes(InstrDesc("tf32", "tf32", "tf32", "f32", 128, 64, negate_b=True)) == []
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 128, 64, saturate=True)) == ["SP0509"]
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 128, 64, max_shift=4)) == ["SP0510"]
    assert _codes(InstrDesc("mxf8f6f4", "e4m3", "e4m3", "f32", 128, 64, scale_dtype="ue8m0",
                            max_shift=8)) == ["SP0510"]


@pytest.mark.parametrize(("kind", "ab", "acc", "sparse", "good", "bad"), [
    ("f16", "f16", "f32", True, [0, 1], [2, 3]),
    ("tf32", "tf32", "f32", True, [0, 1], [2, 3]),
    ("f8f6f4", "e4m3", "f32", True, [0], [1, 2]),
    ("i8", "s8", "s32", True, [0], [1]),
    ("mxf8f6f4", "e4m3", "f32", True, [0], [1]),
    ("f16", "f16", "f32", False, [0], [1]),
])
def test_selector(kind, ab, acc, sparse, good, bad):
    extra = {"scale_dtype": "ue8m0"} if kind.startswith("mx") else {}
    for sel in good:
        assert _codes(InstrDesc(kind, ab, ab, acc, 128, 64, sparse=sparse, selector=sel, **extra)) == []
    for sel in bad:
        desc = InstrDesc(kind, ab, ab, acc, 128, 64, sparse=sparse, selector=sel, **extra)
        assert _codes(desc) == ["SP0508"]


def test_block_scale_fields():
    def codes(kind, **kw):
        return _codes(InstrDesc(kind, "e2m1", "e2m1", "f32", 128, 64, **kw))
    assert codes("mxf4", scale_dtype="ue8m0") == []
    assert codes("mxf4", scale_dtype="ue4m3") == ["SP0513"]
    assert codes("mxf4", scale_dtype="ue8m0", block_size=16) == ["SP0513"]
    assert codes("mxf4nvf4", scale_dtype="ue8m0") == ["SP0513"]  # needs an explicit size
    assert codes("mxf4nvf4", scale_dtype="ue4m3", block_size=16) == []
    assert codes("mxf4nvf4", scale_dtype="ue4m3", block_size=32) == ["SP0513"]
    # scale ids: 2X -> 0 or 2, 4X -> 0, 1X -> 0..3
    assert codes("mxf4", scale_dtype="ue8m0", a_scale_id=2) == []
    assert codes("mxf4", scale_dtype="ue8m0", a_scale_id=1) == ["SP0513"]
    assert codes("mxf4nvf4", scale_dtype="ue4m3", block_size=16, b_scale_id=2) == ["SP0513"]
    mx8 = InstrDesc("mxf8f6f4", "e4m3", "e4m3", "f32", 128, 64, scale_dtype="ue8m0", a_scale_id=3)
    assert _codes(mx8) == []
    assert codes("mxf4", scale_dtype="ue8m0", k96=True) == ["SP0513"]  # sparse has no K=96
    assert _codes(InstrDesc("f16", "f16", "f16", "f32", 128, 64, scale_dtype="ue8m0")) == ["SP0513"]


# --------------------------------------------------------------------------------------------
# Instruction descriptor: round trips
# --------------------------------------------------------------------------------------------

_TYPES_BY_KIND = {  # written out here independently of the module's tables
    "f16": ["f16", "bf16"], "tf32": ["tf32"], "f8f6f4": ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"],
    "i8": ["s8", "u8"], "mxf8f6f4": ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"], "mxf4": ["e2m1"],
    "mxf4nvf4": ["e2m1"],
}


@st.composite
def instr_descs(draw):
    """Mostly-valid descriptors, drawn with the rules of §1.2/§1.3 written out by hand."""
    kind = draw(st.sampled_from(sorted(_TYPES_BY_KIND)))
    blocky = kind.startswith("mx")
    a = draw(st.sampled_from(_TYPES_BY_KIND[kind]))
    b = a if kind in ("f16", "tf32") else draw(st.sampled_from(_TYPES_BY_KIND[kind]))
    acc = {"f16": "f32" if a == "bf16" else draw(st.sampled_from(["f16", "f32"])), "i8": "s32",
           "f8f6f4": draw(st.sampled_from(["f16", "f32"]))}.get(kind, "f32")
    sparse = draw(st.booleans())
    cg = draw(st.sampled_from([1, 2]))
    if blocky:
        m = 128 * cg
    elif cg == 1:
        m = draw(st.sampled_from([128] if sparse else [64, 128]))
    else:
        m = draw(st.sampled_from([128, 256]))
    n = draw(st.sampled_from(range(32, 257, 32)))
    mn_ok = {"e4m3", "e5m2", "s8", "u8", "f16", "bf16", "tf32"}
    block = draw(st.sampled_from([16, 32])) if kind == "mxf4nvf4" else draw(st.sampled_from([None, 32]))
    ids = [0, 1, 2, 3] if kind == "mxf8f6f4" else ([0] if block == 16 else [0, 2])
    can_negate = kind not in ("i8", "mxf4", "mxf4nvf4")
    scales = ["ue8m0", "ue4m3"] if block == 16 else ["ue8m0"]
    return InstrDesc(
        kind, a, b, acc, m, n, sparse=sparse,
        selector=draw(st.sampled_from([0, 1])) if sparse and kind in ("f16", "tf32") else 0,
        a_major=draw(st.sampled_from(["K", "MN"])) if a in mn_ok and kind != "mxf4" else "K",
        b_major=draw(st.sampled_from(["K", "MN"])) if b in mn_ok else "K",
        negate_a=can_negate and draw(st.booleans()), negate_b=can_negate and draw(st.booleans()),
        saturate=draw(st.booleans()) if kind == "i8" else False,
        max_shift=0 if blocky else draw(st.sampled_from([0, 8, 16, 32])), cta_group=cg,
        scale_dtype=draw(st.sampled_from(scales)) if blocky else None,
        a_scale_id=draw(st.sampled_from(ids)) if blocky else 0,
        b_scale_id=draw(st.sampled_from(ids)) if blocky else 0,
        block_size=block if blocky else None,
        k96=(not sparse) and kind in ("mxf4", "mxf4nvf4") and draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(instr_descs())
def test_valid_descriptors_round_trip(desc):
    assume(D.idesc_problems(desc) == [])
    word = D.encode_idesc(desc)
    assert 0 <= word < 1 << 32
    assert D.decode_idesc(word, desc.kind, cta_group=desc.cta_group, block_size=desc.block_size) == desc


@settings(max_examples=300, deadline=None)
@given(sel=st.integers(0, 3), sparse=st.integers(0, 1), sat=st.integers(0, 1), dt=st.integers(0, 2),
       neg=st.integers(0, 3), majors=st.integers(0, 3), n8=st.integers(0, 63), m16=st.integers(0, 31),
       shift=st.integers(0, 3), a=st.sampled_from([0, 1, 3, 4, 5]), b=st.sampled_from([0, 1, 3, 4, 5]))
def test_raw_plain_words_round_trip(sel, sparse, sat, dt, neg, majors, n8, m16, shift, a, b):
    word = (sel | sparse << 2 | sat << 3 | dt << 4 | a << 7 | b << 10 | neg << 13 | majors << 15 | n8 << 17
            | m16 << 24 | shift << 30)
    assert D.pack_idesc(D.decode_idesc(word, "f8f6f4")) == word


@settings(max_examples=200, deadline=None)
@given(sparse=st.integers(0, 1), sfb=st.integers(0, 3), neg=st.integers(0, 3),
       majors=st.integers(0, 3), n8=st.integers(0, 63), scale=st.integers(0, 1), m128=st.integers(0, 3),
       sfa=st.integers(0, 3), k96=st.integers(0, 1))
def test_raw_block_scaled_words_round_trip(sparse, sfb, neg, majors, n8, scale, m128, sfa, k96):
    """Bits 0-1 are reserved in the block-scaled descriptor (PTX ISA "Instruction descriptor format
    for .kind::mxf4 and .kind::mxf4nvf4"): no selector is drawn here, and a word with one of them
    set is refused (tests/backend/test_tcgen05_isa_tables.py)."""
    word = (sparse << 2 | sfb << 4 | 1 << 7 | 1 << 10 | neg << 13 | majors << 15 | n8 << 17
            | scale << 23 | m128 << 27 | sfa << 29 | k96 << 31)
    assert D.pack_idesc(D.decode_idesc(word, "mxf4")) == word


# --------------------------------------------------------------------------------------------
# Shared-memory descriptors
# --------------------------------------------------------------------------------------------

SMEM_CASES = [
    # addr 0x400>>4=0x40 | LBO 16>>4=1 <<16 | SBO 1024>>4=64 <<32 | bit 46 | 128B code 2 <<61
    (SmemDesc(0x400, 16, 1024, "128B"), 0x4000404000010040, 0x4000004000010040),
    # no swizzle: 0x1230>>4=0x123 | 128>>4=8 <<16 | 256>>4=16 <<32 | bit 46
    (SmemDesc(0x1230, 128, 256), 0x0000401000080123, 0x0000001000080123),
    # 32B swizzle (tcgen05 6 <<61, wgmma 3 <<62), base offset 3 <<49: 0x80>>4=8 | 1<<16 | 16<<32
    (SmemDesc(0x80, 16, 256, "32B", base_offset=3), 0xC006401000010008, 0xC006001000010008),
    # 64B swizzle (tcgen05 4 <<61, wgmma 2 <<62): 0x200>>4=0x20 | 1<<16 | 512>>4=32 <<32
    (SmemDesc(0x200, 16, 512, "64B"), 0x8000402000010020, 0x8000002000010020),
]


@pytest.mark.parametrize(("desc", "tcgen05_word", "wgmma_word"), SMEM_CASES)
def test_smem_descriptors_known_words(desc, tcgen05_word, wgmma_word):
    assert D.encode_tcgen05_smem_desc(desc) == tcgen05_word
    assert D.encode_wgmma_desc(desc) == wgmma_word
    assert D.decode_tcgen05_smem_desc(tcgen05_word) == desc
    assert D.decode_wgmma_desc(wgmma_word) == desc


def test_smem_128b_base32b_swizzle():
    desc = SmemDesc(0, 16, 1024, "128B_base32B")
    assert D.encode_tcgen05_smem_desc(desc, major="MN") == (1 << 61) | (1 << 46) | (64 << 32) | (1 << 16)
    assert [p.code for p in D.tcgen05_smem_desc_problems(desc, major="K")] == ["SP0522"]
    assert [p.code for p in D.wgmma_desc_problems(desc)] == ["SP0522"]  # no such wgmma swizzle


def test_smem_problems():
    def codes(desc):
        return [p.code for p in D.tcgen05_smem_desc_problems(desc)]
    assert codes(SmemDesc(8, 16, 16)) == ["SP0520"]
    assert codes(SmemDesc(0, 24, 16)) == ["SP0520"]
    assert codes(SmemDesc(0, 16, -16)) == ["SP0520"]
    assert codes(SmemDesc(1 << 18, 16, 16)) == ["SP0521"]
    assert codes(SmemDesc(0, 16, 1 << 18)) == ["SP0521"]
    assert codes(SmemDesc(0, 16, 16, "16B")) == ["SP0522"]
    assert codes(SmemDesc(0, 16, 16, base_offset=8)) == ["SP0523"]
    assert codes(SmemDesc(0, 16, 16, lbo_mode=1)) == ["SP0523"]
    assert [p.code for p in D.wgmma_desc_problems(SmemDesc(0, 16, 16, lbo_mode=1))] == ["SP0523"]
    (problem,) = D.tcgen05_smem_desc_problems(SmemDesc(8, 16, 16))
    assert problem.message == "start address 8 is not 16-byte aligned" and problem.field == "start_address"
    with pytest.raises(InternalError, match="SP0520"):
        D.encode_tcgen05_smem_desc(SmemDesc(8, 16, 16))
    with pytest.raises(InternalError, match="SP0520"):
        D.encode_wgmma_desc(SmemDesc(8, 16, 16))


def test_smem_decode_rejects_bad_words():
    ok = 0x4000404000010040
    with pytest.raises(ValueError, match="version bit"):
        D.decode_tcgen05_smem_desc(ok & ~(1 << 46))
    for code in (3, 5, 7):
        with pytest.raises(ValueError, match="swizzle"):
            D.decode_tcgen05_smem_desc((ok & ~(7 << 61)) | (code << 61))
    with pytest.raises(ValueError, match="reserved"):
        D.decode_tcgen05_smem_desc(ok | (1 << 47))
    with pytest.raises(ValueError, match="reserved"):
        D.decode_wgmma_desc(1 << 46)  # wgmma has no version bit
    with pytest.raises(ValueError, match="64 bits"):
        D.decode_wgmma_desc(1 << 64)


def test_swizzle_base_offset():
    assert D.swizzle_base_offset(0x400, "128B") == 0
    assert D.swizzle_base_offset(0x480, "128B") == 1  # (0x480 >> 7) & 7
    assert D.swizzle_base_offset(0x380, "128B") == 7
    assert D.swizzle_base_offset(0x200, "64B") == 0
    assert D.swizzle_base_offset(0x280, "64B") == 5
    assert D.swizzle_base_offset(0x80, "none") == 0


_aligned = st.integers(0, (1 << 14) - 1).map(lambda v: v << 4)


@settings(max_examples=200, deadline=None)
@given(addr=_aligned, lbo=_aligned, sbo=_aligned, base=st.integers(0, 7),
       swz=st.sampled_from(["none", "128B", "64B", "32B"]))
def test_smem_round_trip_and_sm90_relation(addr, lbo, sbo, base, swz):
    desc = SmemDesc(addr, lbo, sbo, swz, base)
    t, w = D.encode_tcgen05_smem_desc(desc), D.encode_wgmma_desc(desc)
    assert D.decode_tcgen05_smem_desc(t) == desc
    assert D.decode_wgmma_desc(w) == desc
    # §1.5: the tcgen05 swizzle is the sm90 code shifted left by one; the rest differs by bit 46
    assert t >> 61 == (w >> 62) << 1
    assert (t & ((1 << 61) - 1)) == (w & ((1 << 62) - 1)) | (1 << 46)


# --------------------------------------------------------------------------------------------
# wgmma rules
# --------------------------------------------------------------------------------------------


def _wcodes(*args, **kw):
    return [p.code for p in D.wgmma_problems(*args, **kw)]


def test_wgmma_valid_forms():
    assert _wcodes("f16", "f16", "f32", 256, spsel=1, trans_a=True, trans_b=True) == []
    assert _wcodes("bf16", "bf16", "f32", 8) == []
    assert _wcodes("tf32", "tf32", "f32", 64, spsel=1) == []
    assert _wcodes("e4m3", "e5m2", "f16", 24) == []
    assert _wcodes("s8", "u8", "s32", 48) == []
    assert _wcodes("f16", "f16", "f16", 64, a_from_regs=True, trans_b=True) == []


def test_wgmma_types_and_accumulators():
    assert _wcodes("e2m1", "e2m1", "f32", 64) == ["SP0530", "SP0530"]  # A and B
    assert _wcodes("f16", "bf16", "f32", 64) == ["SP0530"]
    assert _wcodes("s8", "e4m3", "s32", 64) == ["SP0530"]
    assert _wcodes("bf16", "bf16", "f16", 64) == ["SP0531"]
    assert _wcodes("s8", "s8", "f32", 64) == ["SP0531"]
    assert _wcodes("tf32", "tf32", "f16", 64) == ["SP0531"]


def test_wgmma_n():
    for n in (8, 16, 24, 32, 48, 64, 80, 256):
        assert _wcodes("s8", "s8", "s32", n) == [], n
    for n in (40, 56, 72, 264):
        assert _wcodes("s8", "s8", "s32", n) == ["SP0532"], n
    assert _wcodes("f16", "f16", "f32", 40) == []
    (problem,) = D.wgmma_problems("f16", "f16", "f32", 12)
    assert problem.message == "N = 12 is not a multiple of 8 for wgmma"
    assert problem.help == "use N in 8..256, step 8"
    assert _wcodes("f16", "f16", "f32", 0) == ["SP0532"]


def test_wgmma_selector():
    assert _wcodes("f16", "f16", "f32", 64, spsel=2) == ["SP0533"]
    assert _wcodes("e4m3", "e4m3", "f32", 64, spsel=1) == ["SP0533"]
    assert _wcodes("s8", "s8", "s32", 64, spsel=1) == ["SP0533"]
    assert _wcodes("f16", "f16", "f32", 64, sparse=False, spsel=1) == ["SP0533"]


def test_wgmma_transposes():
    assert _wcodes("tf32", "tf32", "f32", 64, trans_b=True) == ["SP0534"]
    assert _wcodes("e4m3", "e4m3", "f32", 64, trans_a=True) == ["SP0534"]
    assert _wcodes("f16", "f16", "f32", 64, a_from_regs=True, trans_a=True) == ["SP0534"]


def test_wgmma_k():
    assert [D.wgmma_k(t) for t in ("f16", "bf16", "tf32", "e4m3", "s8")] == [32, 32, 16, 64, 64]
    assert D.wgmma_k("f16", sparse=False) == 16
