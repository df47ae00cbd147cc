"""validate_metadata: every class of bad metadata is caught, with its code and a help line."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.sparsity import (
    MetadataBuffer,
    SparsityError,
    decode_metadata,
    decompress,
    encode_metadata,
    validate_metadata,
)

PAD = 0x44444444


def indices_for(m: int, chunks: int) -> np.ndarray:
    rng = np.random.default_rng(m + chunks)
    first = rng.integers(0, 3, (m, chunks))
    second = first + 1 + rng.integers(0, 3 - first)
    return np.stack([first, second], -1).astype(np.uint8)


def raises(code: str, *args, **kwargs) -> SparsityError:
    with pytest.raises(SparsityError) as info:
        validate_metadata(*args, **kwargs)
    assert info.value.code == code, str(info.value)
    assert info.value.help, "every error carries a help line"
    assert "help:" in str(info.value)
    return info.value


def test_valid_buffers_pass_and_come_back_tagged():
    for fmt in ("sm90", "tcgen05", "logical"):
        buffer = encode_metadata(indices_for(20, 16), fmt, "f16")
        assert validate_metadata(buffer, fmt, "f16", 20, 64) is buffer
        again = validate_metadata(buffer.data, fmt, "f16", 20, 64)
        assert isinstance(again, MetadataBuffer) and again.fmt == fmt and again.m == 20


def test_same_width_class_is_accepted():
    buffer = encode_metadata(indices_for(16, 16), "tcgen05", "f16")
    validate_metadata(buffer, "tcgen05", "bf16")  # identical layout
    validate_metadata(encode_metadata(indices_for(16, 16), "sm90", "e4m3"), "sm90", "s8")


@pytest.mark.parametrize("fmt", ["sm90", "tcgen05"])
def test_undefined_nibbles(fmt):
    for nibble in (0x0, 0x5, 0xA, 0xF):
        buffer = encode_metadata(indices_for(16, 16), fmt, "f16")
        data = buffer.data.copy()
        flat = data.reshape(-1)
        flat[3] = (flat[3] & ~np.uint32(0xF0)) | np.uint32(nibble << 4)
        err = raises("SP0807", data, fmt, "f16", 16, 64)
        assert f"0x{nibble:X}" in err.message and "word [" in err.message


def test_undefined_nibble_location_is_logical_and_physical():
    data = encode_metadata(indices_for(16, 8), "sm90", "f16").data.copy()
    data[9, 0] = (data[9, 0] & ~np.uint32(0xF << 20)) | np.uint32(0x5 << 20)  # L=9: row 9, h=1, j=1
    err = raises("SP0807", data, "sm90", "f16", 16, 32)
    assert "row 9, group 5 (K 20..23), word [9, 0] bits 20..23" in err.message


def test_padding_is_checked():
    data = encode_metadata(indices_for(10, 8), "tcgen05", "f16").data.copy()
    data[0, 0, 127, 3] = 0  # lane 127, column 3: padding rows and padding chunks
    err = raises("SP0807", data, "tcgen05", "f16", 10, 32)
    assert "(padding)" in err.message


def test_unordered_pairs():
    data = encode_metadata(indices_for(16, 16), "sm90", "e4m3").data.copy()
    data[5, 1] = (data[5, 1] & ~np.uint32(0xF)) | np.uint32(0x6)  # (2,1)
    err = raises("SP0808", data, "sm90", "e4m3", 16, 64)
    assert "allow_unordered" in err.help
    validate_metadata(data, "sm90", "e4m3", 16, 64, allow_unordered=True)  # wgmma.sp accepts it
    assert decode_metadata(data, "sm90", "e4m3", m=16, k=64, allow_unordered=True)[5, 8].tolist() == [2, 1]


def test_tcgen05_unordered_only_0x6_is_defined():
    buffer = encode_metadata(indices_for(16, 32), "tcgen05", "u8")
    data = buffer.data.copy()
    data[0, 0, 0, 0] = (data[0, 0, 0, 0] & ~np.uint32(0xF)) | np.uint32(0x6)
    raises("SP0808", data, "tcgen05", "u8", 16, 128)
    validate_metadata(data, "tcgen05", "u8", 16, 128, allow_unordered=True)
    data[0, 0, 0, 0] = (data[0, 0, 0, 0] & ~np.uint32(0xF)) | np.uint32(0x7)  # (3,1): not listed for tcgen05
    raises("SP0807", data, "tcgen05", "u8", 16, 128, allow_unordered=True)


def test_decompress_honours_unordered_nibbles():
    values = np.array([[1.0, 2.0]], dtype=np.float16)
    data = np.full((16, 1), PAD, np.uint32)
    data[0, 0] = 0x44444446  # chunk 0: first stored element at position 2, second at position 1
    dense = decompress(values, data, "sm90", "f16", m=1, k=4, allow_unordered=True)
    assert dense.tolist() == [[0.0, 2.0, 1.0, 0.0]]


def test_tf32_nibbles():
    indices = np.zeros((16, 8, 1), np.uint8)
    data = encode_metadata(indices, "sm90", "tf32").data.copy()
    data[2, 0] = 0x44444445
    raises("SP0807", data, "sm90", "tf32", 16, 16)


def test_16bit_metadata_given_as_tf32_is_recognised():
    data = encode_metadata(indices_for(16, 4), "sm90", "f16", k=16).data  # shape (16, 1), like tf32 K=16
    err = raises("SP0809", data, "sm90", "tf32", 16, 16)
    assert "2:4" in err.message and "dtype='tf32'" in err.help


def test_tagged_buffer_for_another_width():
    buffer = encode_metadata(indices_for(128, 32), "tcgen05", "f16")
    # for K=128 a 16-bit and an 8-bit tcgen05 buffer have the same shape: only the tag tells
    assert buffer.shape == encode_metadata(indices_for(128, 32), "tcgen05", "e4m3").shape
    err = raises("SP0809", buffer, "tcgen05", "e4m3")
    assert "16-bit operands" in err.message and "8-bit kernel" in err.message
    assert "dtype='e4m3'" in err.help


def test_tagged_buffer_for_another_format_and_size():
    buffer = encode_metadata(indices_for(16, 8), "sm90", "f16")
    raises("SP0810", buffer, "tcgen05", "f16")
    err = raises("SP0812", buffer, "sm90", "f16", 16, 64)
    assert "k = 32" in err.message


def test_raw_shape_mismatch_names_the_matching_width():
    data = encode_metadata(indices_for(16, 32), "sm90", "f16").data  # (16, 4): K=128 at 16-bit
    err = raises("SP0805", data, "sm90", "tf32", 16, 128)  # tf32 wants (16, 8)
    assert "(16, 8)" in err.message and "(16, 4)" in err.message
    assert "16-bit (f16, bf16)" in err.message and "8-bit" in err.message


def test_raw_element_type_and_missing_sizes():
    data = encode_metadata(indices_for(16, 8), "sm90", "f16").data
    raises("SP0806", data.astype(np.float32), "sm90", "f16", 16, 32)
    raises("SP0806", data.astype(np.uint16), "sm90", "f16", 16, 32)
    validate_metadata(data.view(np.int32), "sm90", "f16", 16, 32)  # any 32-bit integer words
    raises("SP0812", data, "sm90", "f16")
    raises("SP0812", data)
    raises("SP0802", data, "ampere", "f16", 16, 32)


def test_e2m1_sm90_unsupported():
    raises("SP0811", np.zeros((16, 1), np.uint32), "sm90", "e2m1", 16, 128)


def test_logical_content_checks():
    good = indices_for(4, 3)
    validate_metadata(good, "logical", "f16")
    bad = good.copy()
    bad[1, 2] = (2, 2)
    raises("SP0807", bad, "logical", "f16")
    bad[1, 2] = (3, 1)
    raises("SP0808", bad, "logical", "f16")
    validate_metadata(bad, "logical", "f16", allow_unordered=True)
    bad[1, 2] = (0, 7)
    raises("SP0813", bad, "logical", "f16")
    raises("SP0813", np.full((2, 3, 1), 2, np.uint8), "logical", "tf32")
    raises("SP0806", good.astype(np.float32), "logical", "f16")
    raises("SP0805", good, "logical", "f16", 4, 40)


def test_a_hand_built_buffer_is_checked_like_a_raw_array():
    """MetadataBuffer is a public dataclass: one built with a list, None or a torch tensor as its
    words was an AttributeError inside the check (no .shape / a torch dtype has no .kind), and a
    string m gave "encoded for m = 64, but m = 64 is expected"."""
    from sparsile.stdlib.sparsity import MetadataBuffer, SparsityError, encode_metadata, validate_metadata

    good = encode_metadata(np.tile(np.array([0, 1], np.uint8), (16, 8, 1)), "sm90", "f16")
    cases = [
        (MetadataBuffer(good.data.tolist(), "sm90", "f16", 16, 32), "SP0806",
         "sm90 metadata must be uint32 words, found int64"),
        (MetadataBuffer(None, "sm90", "f16", 16, 32), "SP0804",
         "metadata is not a numeric array (element type object)"),
        (MetadataBuffer(good.data, "sm90", "f16", "16", 32), "SP0804",
         "MetadataBuffer.m must be a non-negative integer, got '16'"),
    ]
    for buffer, code, message in cases:
        with pytest.raises(SparsityError) as info:
            validate_metadata(buffer, "sm90", "f16", m=16)
        assert (info.value.code, info.value.message) == (code, message)
    torch = pytest.importorskip("torch")
    words = MetadataBuffer(torch.from_numpy(good.data.copy().view(np.int32)), "sm90", "f16", 16, 32)
    np.testing.assert_array_equal(validate_metadata(words, "sm90", "f16", m=16).data, good.data)
