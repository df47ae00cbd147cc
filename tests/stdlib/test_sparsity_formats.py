"""Metadata formats: hand-worked words, a cell-by-cell encoder written from the formulas of
docs/hardware.md §1.4/§3/§4.2, placements, shapes, and round trips for every format and dtype."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import (
    FORMATS,
    MetadataBuffer,
    SparsityError,
    compress,
    decode_metadata,
    decompress,
    encode_metadata,
    hardware_placement,
    metadata_shape,
    operand_type,
    pad_sizes,
    prune,
    thread_placement,
)

PAD = 0x44444444
ALL_DTYPES = ["f16", "bf16", "tf32", "e4m3", "e5m2", "s8", "u8", "e2m1"]


def idx(pairs: list[tuple[int, int]]) -> list[list[int]]:
    return [list(p) for p in pairs]


# ---------------------------------------------------------------- hand-worked examples

def test_half_word_example_0xE94C():
    # docs/hardware.md §3: 0xE94C = chunk0 (0,3), chunk1 (0,1), chunk2 (1,2), chunk3 (2,3)
    indices = np.zeros((1, 4, 2), np.uint8)
    indices[0] = idx([(0, 3), (0, 1), (1, 2), (2, 3)])
    words = encode_metadata(indices, "sm90", "f16", k=16).data
    assert int(words[0, 0]) & 0xFFFF == 0xE94C
    assert decode_metadata(MetadataBuffer(words, "sm90", "f16", 1, 16)).tolist() == indices.tolist()


def _f16_example() -> np.ndarray:
    indices = np.zeros((16, 8, 2), np.uint8)
    indices[:, :] = (0, 1)
    indices[0] = idx([(0, 3), (0, 1), (1, 2), (2, 3), (0, 2), (1, 3), (0, 1), (0, 1)])
    indices[8, 4] = (2, 3)
    indices[8, 5] = (1, 2)
    return indices


def test_sm90_f16_by_hand():
    words = encode_metadata(_f16_example(), "sm90", "f16").data
    assert words.shape == (16, 1) and words.dtype == np.uint32
    # word [L=0]: row 0 K 0..15 in bits 15:0 (0xE94C), row 8 K 0..15 in bits 31:16 (all 0x4)
    assert int(words[0, 0]) == 0x4444E94C
    # word [L=8] (h=1): row 0 chunks 4..7 = (8,D,4,4) -> 0x44D8; row 8 chunks 4..7 = (E,9,4,4) -> 0x449E
    assert int(words[8, 0]) == 0x449E44D8
    others = [int(w) for i, w in enumerate(words[:, 0]) if i not in (0, 8)]
    assert others == [PAD] * 14


def test_tcgen05_f16_by_hand():
    data = encode_metadata(_f16_example(), "tcgen05", "f16").data
    assert data.shape == (1, 1, 128, 4)  # K=32 -> one atom of K=128, M=16 -> one 128-lane tile
    expected = np.full((1, 1, 128, 4), PAD, np.uint32)
    expected[0, 0, 0, 0] = 0x4444E94C
    expected[0, 0, 8, 0] = 0x449E44D8
    assert np.array_equal(data, expected)


def test_sm90_and_tcgen05_8bit_by_hand():
    indices = np.zeros((16, 16, 2), np.uint8)
    indices[:, :] = (0, 1)
    indices[3] = idx([(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (0, 1), (0, 1),
                      (2, 3), (1, 3), (1, 2), (0, 3), (0, 2), (0, 1), (0, 1), (0, 1)])
    sm90 = encode_metadata(indices, "sm90", "e4m3").data
    assert sm90.shape == (16, 2)
    assert int(sm90[3, 0]) == 0x44ED9C84  # chunks 0..7 = 4,8,C,9,D,E,4,4 at bits 4i
    assert int(sm90[3, 1]) == 0x4448C9DE  # chunks 8..15 = E,D,9,C,8,4,4,4
    assert int(sm90[2, 0]) == PAD
    tc = encode_metadata(indices, "tcgen05", "s8").data
    assert tc.shape == (1, 1, 128, 4)
    assert tc[0, 0, 3].tolist() == [0x44ED9C84, 0x4448C9DE, PAD, PAD]


def test_sm90_and_tcgen05_tf32_by_hand():
    indices = np.zeros((16, 8, 1), np.uint8)
    indices[9, :, 0] = [1, 0, 0, 1, 1, 1, 0, 0]  # nibbles E,4,4,E,E,E,4,4
    sm90 = encode_metadata(indices, "sm90", "tf32").data
    assert sm90.shape == (16, 1)
    # row 9 = row 1 + 8: lane L = 16*0 + 8h + 1, high half-word
    assert int(sm90[1, 0]) == 0xE44E4444
    assert int(sm90[9, 0]) == 0x44EE4444
    tc = encode_metadata(indices, "tcgen05", "tf32").data
    assert tc.shape == (1, 1, 128, 4)  # tf32 atom covers K = 64
    assert int(tc[0, 0, 1, 0]) == 0xE44E4444 and int(tc[0, 0, 9, 0]) == 0x44EE4444


def test_tcgen05_e2m1_by_hand():
    indices = np.zeros((1, 16, 2), np.uint8)
    indices[0, :] = (0, 1)
    indices[0, 1] = (2, 3)
    indices[0, 2] = (0, 3)
    tc = encode_metadata(indices, "tcgen05", "e2m1").data
    assert tc.shape == (1, 1, 128, 4)  # K=128 padded to one atom of K=256
    assert tc[0, 0, 0].tolist() == [0x44444CE4, PAD, PAD, PAD]


def test_atoms_are_m_first_then_k():
    # M=256, K=256 for f16: 2 M tiles x 2 K atoms; atom (ka, ma) = data[ka, ma]
    rng = np.random.default_rng(0)
    first = rng.integers(0, 3, (256, 64))
    second = first + 1 + rng.integers(0, 3 - first)
    indices = np.stack([first, second], -1).astype(np.uint8)
    data = encode_metadata(indices, "tcgen05", "f16").data
    sm90 = encode_metadata(indices, "sm90", "f16").data  # (256, 8): 8 instructions of K=32
    assert data.shape == (2, 2, 128, 4)
    for ka in range(2):
        for ma in range(2):
            assert np.array_equal(data[ka, ma], sm90[128 * ma:128 * ma + 128, 4 * ka:4 * ka + 4])
    flat = data.reshape(-1)
    assert int(flat[128 * 4]) == int(sm90[128, 0])  # the second 2 KB atom is M tile 1, K atom 0


# ---------------------------------------------------------------- formula-driven reference

def reference_words(nibbles: np.ndarray, fmt: str, dtype: str, m: int, k: int) -> np.ndarray:
    """Cell by cell, straight from docs/hardware.md: sm90 word index and bit per (row, chunk),
    then the tcgen05 atoms by explicit loops."""
    group = {"tf32": 2, "e2m1": 8}.get(dtype, 4)
    instr_k = {"tf32": 16, "e4m3": 64, "e5m2": 64, "s8": 64, "u8": 64, "e2m1": 128}.get(dtype, 32)
    atom_k = {"tf32": 64, "e2m1": 256}.get(dtype, 128)
    interleaved = dtype in ("f16", "bf16", "tf32")
    rows = -(-m // (16 if fmt == "sm90" else 128)) * (16 if fmt == "sm90" else 128)
    kp = -(-k // (instr_k if fmt == "sm90" else atom_k)) * (instr_k if fmt == "sm90" else atom_k)
    words = [[PAD] * (kp // group // 8) for _ in range(rows)]
    for r in range(nibbles.shape[0]):
        for c in range(nibbles.shape[1]):
            if interleaved:
                kb, h, j = c // 8, (c // 4) % 2, c % 4
                lane = 16 * (r // 16) + 8 * h + r % 8
                bit = 16 * ((r // 8) % 2) + 4 * j
            else:
                lane, kb, bit = r, c // 8, 4 * (c % 8)
            words[lane][kb] = (words[lane][kb] & ~(0xF << bit)) | (int(nibbles[r, c]) << bit)
    if fmt == "sm90":
        return np.array(words, dtype=np.uint32)
    atoms = np.zeros((kp // atom_k, rows // 128, 128, 4), np.uint32)
    for ka in range(atoms.shape[0]):
        for ma in range(atoms.shape[1]):
            for lane in range(128):
                for col in range(4):
                    atoms[ka, ma, lane, col] = words[128 * ma + lane][4 * ka + col]
    return atoms


def random_indices(rng: np.random.Generator, dtype: str, m: int, chunks: int) -> np.ndarray:
    if dtype == "tf32":
        return rng.integers(0, 2, (m, chunks, 1)).astype(np.uint8)
    first = rng.integers(0, 3, (m, chunks))
    second = first + 1 + rng.integers(0, 3 - first)
    return np.stack([first, second], -1).astype(np.uint8)


def to_nibbles(indices: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "tf32":
        return np.where(indices[..., 0] == 0, 0x4, 0xE)
    return indices[..., 0] | (indices[..., 1] << 2)


@pytest.mark.parametrize("dtype", ["f16", "tf32", "e4m3", "e2m1"])
@pytest.mark.parametrize("m, k", [(1, 8), (17, 72), (130, 300), (40, 520)])
def test_vectorized_encoders_match_formula_reference(dtype, m, k):
    rng = np.random.default_rng(m * 1000 + k)
    group = operand_type(dtype).group
    indices = random_indices(rng, dtype, m, -(-k // group))
    nibbles = to_nibbles(indices, dtype)
    for fmt in ("sm90", "tcgen05"):
        if fmt == "sm90" and dtype == "e2m1":
            continue
        got = encode_metadata(indices, fmt, dtype, k=k).data
        assert np.array_equal(got, reference_words(nibbles, fmt, dtype, m, k)), fmt


@pytest.mark.parametrize("dtype", ["bf16", "tf32", "u8", "e2m1"])
def test_placement_agrees_with_encoder(dtype):
    m, k = 20, 2 * operand_type(dtype).atom_k
    op = operand_type(dtype)
    rng = np.random.default_rng(4)
    indices = random_indices(rng, dtype, m, k // op.group)
    nibbles = to_nibbles(indices, dtype)
    for fmt in ("sm90", "tcgen05"):
        if fmt == "sm90" and dtype == "e2m1":
            continue
        data = encode_metadata(indices, fmt, dtype).data
        words = data if fmt == "sm90" else data.transpose(1, 2, 0, 3).reshape(-1, data.shape[0] * 4)
        cells = hardware_placement(fmt, dtype, m, k)
        assert len(cells) == m * (k // op.group)
        for (y, x), (row, chunk) in cells.items():
            assert (int(words[y, x // 8]) >> (4 * (x % 8))) & 0xF == nibbles[row, chunk]


def test_thread_placement_by_hand():
    # f16, spsel 0: thread 4g+t of warp w holds row 16w+g (+8) for half h = t
    cells = thread_placement("f16", 64, 64)
    assert cells[(0, 0)] == (0, 0) and cells[(0, 4)] == (8, 0)
    assert cells[(1, 0)] == (0, 4)           # lane 1 = h 1: K 16..31
    assert cells[(32 + 4 * 3 + 1, 8 + 5)] == (16 + 3 + 8, 8 + 4 + 1)  # warp 1, g 3, t 1, k-step 1
    assert (2, 0) not in cells                # lanes 2, 3 are the other pair
    assert thread_placement("f16", 16, 32, spsel=1)[(2, 0)] == (0, 0)
    # 8-bit: thread (g, t) of warp w: row 16w+g+8(t%2), word 2·kstep + t//2
    cells8 = thread_placement("s8", 16, 128)
    assert cells8[(4 * 2 + 3, 8 + 1)] == (2 + 8, 8 * 3 + 1)  # g 2, t 3, k-step 1 -> word 3
    with pytest.raises(SparsityError):
        thread_placement("e2m1", 16, 128)


# ---------------------------------------------------------------- shapes and padding

@pytest.mark.parametrize("fmt, dtype, m, k, padded, shape", [
    ("sm90", "f16", 100, 100, (112, 128), (112, 4)),
    ("sm90", "tf32", 16, 20, (16, 32), (16, 2)),
    ("sm90", "e4m3", 1, 64, (16, 64), (16, 2)),
    ("tcgen05", "f16", 129, 129, (256, 256), (2, 2, 128, 4)),
    ("tcgen05", "tf32", 128, 65, (128, 128), (2, 1, 128, 4)),
    ("tcgen05", "s8", 128, 128, (128, 128), (1, 1, 128, 4)),
    ("tcgen05", "e2m1", 64, 300, (128, 512), (2, 1, 128, 4)),
    ("logical", "f16", 3, 10, (3, 12), (3, 3, 2)),
    ("logical", "tf32", 3, 5, (3, 6), (3, 3, 1)),
    ("logical", "e2m1", 2, 9, (2, 16), (2, 2, 2)),
])
def test_shapes_and_padding(fmt, dtype, m, k, padded, shape):
    assert pad_sizes(fmt, dtype, m, k) == padded
    assert metadata_shape(fmt, dtype, m, k) == shape
    rng = np.random.default_rng(1)
    buffer = encode_metadata(random_indices(rng, dtype, m, -(-k // operand_type(dtype).group)), fmt, dtype, k=k)
    assert buffer.shape == shape and buffer.padded == padded


def test_tcgen05_atom_is_2kb():
    assert metadata_shape("tcgen05", "f16", 128, 128) == (1, 1, 128, 4)
    assert np.zeros(metadata_shape("tcgen05", "f16", 128, 128), np.uint32).nbytes == 2048


def test_e2m1_has_no_sm90_format():
    with pytest.raises(SparsityError) as info:
        encode_metadata(np.tile(np.array([0, 1], np.uint8), (1, 1, 1)), "sm90", "e2m1")
    assert info.value.code == "SP0811" and "tcgen05" in info.value.help


def test_unknown_format_and_dtype():
    with pytest.raises(SparsityError) as info:
        metadata_shape("sm100", "f16", 1, 1)
    assert info.value.code == "SP0802"
    with pytest.raises(SparsityError) as info:
        encode_metadata(np.zeros((1, 1, 2), np.uint8), "sm90", "fp16")
    assert info.value.code == "SP0801"


@pytest.mark.parametrize("bad, fragment, code", [
    (np.array([[[1, 1]]], np.uint8), "name one position twice", "SP0807"),
    (np.array([[[2, 1]]], np.uint8), "decreasing pair", "SP0808"),
    (np.array([[[0, 4]]], np.uint8), "out of range", "SP0813"),
    (np.zeros((1, 1, 1), np.uint8), "shape", "SP0805"),
])
def test_encode_rejects_bad_indices(bad, fragment, code):
    """The codes validate_metadata gives the same indices (tests/stdlib/test_sparsity_index_rules.py)."""
    with pytest.raises(SparsityError, match=fragment) as info:
        encode_metadata(bad, "tcgen05", "f16")
    assert info.value.code == code


def test_encode_k_must_match_indices():
    """SP0805, as validate_metadata says for the same indices and k (tests/stdlib/test_sparsity_index_k.py)."""
    with pytest.raises(SparsityError) as info:
        encode_metadata(np.tile(np.array([0, 1], np.uint8), (1, 2, 1)), "sm90", "f16", k=3)
    assert (info.value.code, info.value.message) == (
        "SP0805", "logical indices for a 1x3 f16 operand must have shape (1, 1, 2), found (1, 2, 2)")


def test_metadata_buffer_array_protocol():
    buffer = encode_metadata(np.tile(np.array([0, 1], np.uint8), (2, 2, 1)), "sm90", "f16")
    assert np.asarray(buffer) is buffer.data
    assert np.asarray(buffer, dtype=np.int64).dtype == np.int64
    assert "sm90" in repr(buffer) and buffer.nbytes == buffer.data.nbytes


# ---------------------------------------------------------------- round trips (hypothesis)

def random_matrix(rng: np.random.Generator, dtype: str, m: int, k: int) -> np.ndarray:
    values = rng.standard_normal((m, k)) * (20 if dtype in ("s8", "u8") else 2)
    values[rng.random((m, k)) < 0.25] = 0.0
    values[rng.random((m, k)) < 0.05] = -0.0
    if dtype == "u8":
        values = np.abs(values)
    host = operand_type(dtype).host_dtype
    return values.astype(host) if host.kind != "V" else values.astype(np.float32).astype(host)


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(ALL_DTYPES), m=st.integers(1, 40), k=st.integers(1, 300),
       seed=st.integers(0, 2**32 - 1))
def test_round_trip_every_format(dtype, m, k, seed):
    rng = np.random.default_rng(seed)
    dense = random_matrix(rng, dtype, m, k)
    pruned = prune(dense, dtype)
    values, indices = compress(pruned, dtype)
    for fmt in FORMATS:
        if fmt == "sm90" and dtype == "e2m1":
            continue
        meta = encode_metadata(indices, fmt, dtype, k=k)
        assert np.array_equal(decode_metadata(meta), indices)
        back = decompress(values, meta)
        assert back.shape == (m, k) and back.dtype == pruned.dtype
        assert np.array_equal(back.astype(np.float64), pruned.astype(np.float64))
        raw = decompress(values, meta.data, fmt, dtype, m=m, k=k)
        assert np.array_equal(raw.astype(np.float64), pruned.astype(np.float64))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_is_bit_exact_for_kept_values(dtype):
    rng = np.random.default_rng(11)
    pruned = prune(random_matrix(rng, dtype, 33, 256), dtype)
    values, indices = compress(pruned, dtype)
    back = decompress(values, encode_metadata(indices, "tcgen05", dtype))
    storage = operand_type(dtype).storage_dtype
    # bits agree except where a dropped element was -0 (decompression writes +0 there)
    differs = back.view(storage) != pruned.view(storage)
    assert (pruned.astype(np.float64)[differs] == 0).all()


def test_bf16_and_f16_share_layouts():
    rng = np.random.default_rng(8)
    indices = random_indices(rng, "f16", 24, 40)
    for fmt in ("sm90", "tcgen05"):
        assert np.array_equal(encode_metadata(indices, fmt, "f16").data, encode_metadata(indices, fmt, "bf16").data)
        assert np.array_equal(encode_metadata(indices, fmt, "e4m3").data, encode_metadata(indices, fmt, "u8").data)


def test_bfloat16_values_keep_their_type():
    w = np.array([[0, 1.5, 0, -2]], dtype=ml_dtypes.bfloat16)
    values, indices = compress(w)
    assert decompress(values, encode_metadata(indices, "sm90", "bf16")).dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize(("m", "k", "message"), [
    (-1, 32, "m must be a non-negative integer, got -1"),
    (16, -4, "k must be a non-negative integer, got -4"),
    ("a", 32, "m must be a non-negative integer, got 'a'"),
    (None, 32, "m must be a non-negative integer, got None"),
    (16.5, 32, "m must be a non-negative integer, got 16.5"),
])
def test_sizes_must_be_non_negative_integers(m: object, k: object, message: str) -> None:
    # these used to give ValueError/TypeError from int(), or a shape for a negative size
    calls = [lambda: metadata_shape("sm90", "f16", m, k), lambda: pad_sizes("tcgen05", "f16", m, k),
             lambda: hardware_placement("sm90", "f16", m, k), lambda: thread_placement("f16", m, k),
             lambda: decode_metadata(np.zeros((16, 1), np.uint32), "sm90", "f16", m=m, k=k)]
    for call in calls[:4] if m is None else calls:  # no m for raw metadata is SP0812
        with pytest.raises(SparsityError) as info:
            call()
        assert (info.value.code, info.value.message) == ("SP0804", message)


def test_encode_metadata_k_must_be_an_integer() -> None:
    _, indices = compress(prune(np.random.default_rng(2).standard_normal((16, 32)), "f16"), "f16")
    with pytest.raises(SparsityError) as info:
        encode_metadata(indices, "sm90", "f16", k=31.5)
    assert (info.value.code, info.value.message) == ("SP0804", "k must be a non-negative integer, got 31.5")


def test_a_placement_map_too_large_to_build_is_refused() -> None:
    # enumerating 2**80 cells used to run until killed
    from sparsile.stdlib.sparsity.placement import MAX_CELLS

    for call in (lambda: hardware_placement("sm90", "f16", 1 << 40, 1 << 40),
                 lambda: thread_placement("f16", 1 << 40, 1 << 40)):
        with pytest.raises(SparsityError) as info:
            call()
        assert info.value.code == "SP0804"
        big = 1 << 40
        assert info.value.message == (f"a placement map of an ({big}, {big}) operand has {big * (big // 4)} "
                                      f"cells; the limit is {MAX_CELLS}")
    assert len(hardware_placement("logical", "f16", 1024, 16384)) == MAX_CELLS  # 4096 chunks of 4
