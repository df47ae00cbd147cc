"""compress(): the CUTLASS rules for sparse chunks, errors naming the offending group, padding."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsile.stdlib.sparsity import SparsityError, compress, decompress, encode_metadata, prune, prune_2_4


def test_f16_chunk_rules_by_hand():
    w = np.array([[
        1, 2, 0, 0,     # two nonzeros (0,1)
        0, 0, 0, 0,     # all zero -> (0,1) with zero values, never 0x0
        0, 0, 0, 7,     # one nonzero at 3 -> (0,3), explicit zero first
        0, 5, 0, 0,     # one nonzero at 1 -> (1,3)
        0, 0, 3, 0,     # one nonzero at 2 -> (2,3)
        2, 0, 0, 0,     # one nonzero at 0 -> (0,3)
        0, 1, 0, 2,     # (1,3)
        -0.0, 0, 4, 0,  # negative zero is zero -> (2,3)
    ]], dtype=np.float16)
    values, indices = compress(w)
    assert indices.dtype == np.uint8 and indices.shape == (1, 8, 2)
    assert indices[0].tolist() == [[0, 1], [0, 1], [0, 3], [1, 3], [2, 3], [0, 3], [1, 3], [2, 3]]
    assert values.dtype == np.float16 and values.shape == (1, 16)
    assert values[0].tolist() == [1, 2, 0, 0, 0, 7, 5, 0, 3, 0, 2, 0, 1, 2, 4, 0]


def test_tf32_chunk_rules_by_hand():
    w = np.array([[0, 0, 0, 3, 3, 0, -0.0, 2, 1.5, -0.0]], dtype=np.float32)
    values, indices = compress(w, "tf32")
    assert indices.shape == (1, 5, 1)
    assert indices[0, :, 0].tolist() == [0, 1, 0, 1, 0]
    assert values[0].tolist() == [0, 3, 3, 2, 1.5]


def test_e2m1_pairs_by_hand():
    w = np.array([[0, 0, 1.5, -2, 0, 0, 0, 0,    # one nonzero pair at 1 -> (1,3)
                   0, 0, 0, 0, 0, 0, 0, 0,       # all zero -> (0,1)
                   0, 6, 0, 0, 0, 0, 0.5, 0]],   # pairs 0 and 3
                 dtype=ml_dtypes.float4_e2m1fn)
    values, indices = compress(w)
    assert indices[0].tolist() == [[1, 3], [0, 1], [0, 3]]
    assert values.astype(np.float32)[0].tolist() == [1.5, -2, 0, 0, 0, 0, 0, 0, 0, 6, 0.5, 0]


@pytest.mark.parametrize("dtype, host", [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2),
                                         ("s8", np.int8), ("u8", np.uint8)])
def test_8bit_by_hand(dtype, host):
    w = np.array([[0, 3, 0, 2, 0, 0, 0, 0, 4, 0, 0, 0]], dtype=host)
    values, indices = compress(w, dtype)
    assert indices[0].tolist() == [[1, 3], [0, 1], [0, 3]]
    assert values.dtype == np.dtype(host)
    assert values.astype(np.float32)[0].tolist() == [3, 2, 0, 0, 4, 0]


def test_negative_zero_e4m3_is_zero():
    w = np.array([[-0.0, -0.0, 1, -0.0]], dtype=ml_dtypes.float8_e4m3fn)
    _, indices = compress(w)
    assert indices[0].tolist() == [[2, 3]]


def test_not_sparse_names_first_row_and_group():
    w = np.zeros((3, 16), dtype=np.float16)
    w[2, 4:8] = [1, 2, 3, 0]     # row 2, group 1: three nonzeros
    w[1, 12:16] = [1, 1, 1, 1]   # row 1, group 3: four nonzeros (comes first)
    with pytest.raises(SparsityError) as info:
        compress(w)
    err = info.value
    assert err.code == "SP0803"
    assert "row 1, group 3" in err.message and "columns 12..15" in err.message
    assert "4 nonzero elements" in err.message and "1 more" in err.message
    assert "prune_2_4" in err.help and "prune=True" in err.help


def test_not_sparse_tf32_and_pairs():
    with pytest.raises(SparsityError, match=r"row 0, group 1 .* 2 nonzero elements, at most 1"):
        compress(np.array([[1, 0, 2, 3]], dtype=np.float32))
    w = np.zeros((1, 16), dtype=ml_dtypes.float4_e2m1fn)
    w[0, 8:14] = [1, 0, 0, 1, 1, 0]
    with pytest.raises(SparsityError, match=r"row 0, group 1 .* 3 nonzero pairs") as info:
        compress(w)
    assert "prune_4_8_pairs" in info.value.help


def test_a_float32_matrix_pruned_2_4_is_told_it_was_taken_as_tf32():
    # compress(prune_2_4(dense)) of a float32 dense (numpy's usual type) said only "not 1:2 sparse for tf32 ...
    # prune first with prune_1_2(w)", though the user pruned it 2:4 for a 16-bit operand
    w = prune_2_4(np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    with pytest.raises(SparsityError) as info:
        compress(w)
    assert info.value.code == "SP0803" and info.value.message.startswith("w is not 1:2 sparse for tf32: row 0, ")
    assert info.value.help == ("w is float32, which compress takes as a tf32 operand (1:2): pass dtype='f16' or "
                               "'bf16' for a 2:4 one; else prune first with prune_1_2(w), or call compress(w, "
                               "prune=True) to keep the largest magnitudes")
    with pytest.raises(SparsityError) as info:
        compress(w, "tf32")  # asked for tf32: the plain help
    assert info.value.help == "prune first with prune_1_2(w), or call compress(w, prune=True) to keep the largest " \
                              "magnitudes"
    values, _ = compress(w, "f16")
    assert values.dtype == np.float16 and values.shape == (8, 16)


HOSTS = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2, "s8": np.int8, "u8": np.uint8, "e2m1": ml_dtypes.float4_e2m1fn}


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(sorted(HOSTS)), rows=st.integers(1, 5), k=st.integers(1, 40),
       seed=st.integers(0, 2**32 - 1))
def test_fused_prune_equals_prune_then_compress(dtype, rows, k, seed):
    rng = np.random.default_rng(seed)
    values = rng.choice([0.0, -0.0, 1.0, -1.0, 2.0, 3.0, 0.5], size=(rows, k))  # many ties and zeros
    w = values.astype(np.float32).astype(HOSTS[dtype])
    fused_values, fused_indices = compress(w, dtype, prune=True)
    values2, indices2 = compress(prune(w, dtype), dtype)
    assert np.array_equal(fused_indices, indices2)
    storage = np.dtype(f"u{w.dtype.itemsize}")
    assert np.array_equal(fused_values.view(storage), values2.view(storage))


def test_k_is_padded_to_the_chunk_size():
    w = np.array([[1, 0, 0, 2, 3, 0]], dtype=np.float16)
    values, indices = compress(w)
    assert indices.shape == (1, 2, 2) and values.shape == (1, 4)
    assert indices[0].tolist() == [[0, 3], [0, 3]]
    meta = encode_metadata(indices, "logical", "f16", k=6)
    assert decompress(values, meta).tolist() == w.tolist()


def test_dtype_inference_and_cast():
    assert compress(np.zeros((1, 4), np.float16))[0].dtype == np.float16
    assert compress(np.zeros((1, 2), np.float32))[1].shape == (1, 1, 1)  # float32 -> tf32
    values, _ = compress(np.array([[0.0, 1.0, 0.0, 2.0]]), "bf16")
    assert values.dtype == ml_dtypes.bfloat16
    with pytest.raises(SparsityError) as info:
        compress(np.zeros((2, 4)))  # float64: which operand type?
    assert info.value.code == "SP0804" and "dtype=" in info.value.help


def test_rank_errors():
    with pytest.raises(SparsityError) as info:
        compress(np.zeros(8, np.float16))
    assert info.value.code == "SP0804"


def test_large_input_uses_blocks_consistently():
    rng = np.random.default_rng(2)
    w = prune_2_4(rng.standard_normal((257, 4100)).astype(np.float16))
    v1, i1 = compress(w, workers=1)
    v2, i2 = compress(w, workers=2)
    assert np.array_equal(v1.view(np.uint16), v2.view(np.uint16)) and np.array_equal(i1, i2)
    assert np.array_equal(decompress(v1, encode_metadata(i1, "logical", "f16", k=4100)), w)


@pytest.mark.parametrize("workers", ["2", 0, -1, 1.5, True])
def test_workers_must_be_a_positive_integer(workers):
    """A string failed deep in the block scheduler (TypeError); 0, -1 meant one thread without a word."""
    w = prune_2_4(np.random.default_rng(3).standard_normal((8, 16)).astype(np.float16))
    for call in (lambda: compress(w, "f16", workers=workers), lambda: compress(w, "f16", prune=True, workers=workers),
                 lambda: prune(w, "f16", workers=workers)):
        with pytest.raises(SparsityError) as info:
            call()
        assert info.value.code == "SP0804"
        assert f"workers must be a positive integer or None, got {workers!r}" in info.value.message
    assert np.array_equal(compress(w, workers=np.int64(2))[1], compress(w)[1])  # numpy integers are integers


def test_pack_e2m1_round_trip_and_nibble_order():
    from sparsile.stdlib.sparsity import pack_e2m1, unpack_e2m1

    values = np.array([[0.5, -6.0, 1.0, 0.0]], dtype=ml_dtypes.float4_e2m1fn)  # codes 1, 0xF, 2, 0
    packed = pack_e2m1(values)
    assert packed.dtype == np.uint8 and packed.tolist() == [[0xF1, 0x02]]
    assert unpack_e2m1(packed).astype(np.float32).tolist() == [[0.5, -6.0, 1.0, 0.0]]
    with pytest.raises(SparsityError):
        pack_e2m1(np.zeros((1, 3), ml_dtypes.float4_e2m1fn))
    with pytest.raises(SparsityError):
        pack_e2m1(np.zeros((1, 4), np.float16))


def test_index_shape_checks_its_sizes() -> None:
    from sparsile.stdlib.sparsity import index_shape

    assert index_shape("f16", 3, 10) == (3, 3, 2)
    with pytest.raises(SparsityError) as info:
        index_shape("f16", None, 10)
    assert (info.value.code, info.value.message) == ("SP0804", "rows must be a non-negative integer, got None")


@pytest.mark.parametrize("packed", ["ab", 5, [256], [-1], np.ones(2, np.float32)])
def test_unpack_e2m1_needs_bytes(packed: object) -> None:
    # strings, scalars and floats used to escape as ValueError / IndexError / a silent cast
    from sparsile.stdlib.sparsity import unpack_e2m1

    with pytest.raises(SparsityError) as info:
        unpack_e2m1(packed)
    assert info.value.code == "SP0804"
    assert info.value.message.startswith("unpack_e2m1 needs packed bytes (integers 0-255) with at least one axis")


def test_unpack_e2m1_takes_integer_bytes() -> None:
    from sparsile.stdlib.sparsity import unpack_e2m1

    assert unpack_e2m1([0x21, 0x43]).astype(np.float32).tolist() == [0.5, 1.0, 1.5, 2.0]
