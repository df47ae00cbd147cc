"""MetadataBuffer: immutable, ``data`` included (launchers validate it and copy it to the device once)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import sparse_matmul
from sparsile.stdlib.sparsity import (
    MetadataBuffer,
    SparsityError,
    compress,
    decode_metadata,
    encode_metadata,
    validate_metadata,
)


def _weight(m: int = 16, k: int = 64, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float16)


@pytest.mark.parametrize("fmt", ["sm90", "tcgen05", "logical"])
def test_encoded_words_cannot_be_edited_in_place(fmt: str) -> None:
    _, indices = compress(_weight(128, 256), "f16", prune=True)
    meta = encode_metadata(indices, fmt, "f16", k=256)
    before = meta.data.copy()
    with pytest.raises(ValueError, match="read-only"):
        meta.data[0, 0] = 0xFFFFFFFF
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(meta)[...] = 0
    with pytest.raises(ValueError):
        meta.data.flags.writeable = True  # nor can the words be made writable again
    assert np.array_equal(meta.data, before)
    validate_metadata(meta, fmt, "f16", m=128)


def test_a_hand_built_buffer_owns_a_copy_of_the_callers_words() -> None:
    """MetadataBuffer(words, ...) copies ``words``: the caller's array stays writable and the caller's,
    and an edit of it after the buffer was built (and used) changes neither the buffer nor what a
    launch computes with it. It used to hold a read-only view of the caller's array: an edit after
    the first call reached the words while launchers kept their nibble check and device copy."""
    w = _weight()
    values, indices = compress(w, "f16", prune=True)
    mine = encode_metadata(indices, "sm90", "f16", k=64).data.copy()
    meta = MetadataBuffer(mine, "sm90", "f16", 16, 64)
    assert mine.flags.writeable and not meta.data.flags.writeable
    assert not np.shares_memory(mine, meta.data)
    with pytest.raises(ValueError):
        meta.data.flags.writeable = True  # the copy cannot be made writable again
    b = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float16)
    first = sparse_matmul(values, meta, b, interpret=True)
    words = meta.data.copy()
    swapped = (3 - indices[:, :, ::-1]).astype(np.uint8)  # other valid metadata: another result
    mine[...] = encode_metadata(swapped, "sm90", "f16", k=64).data
    assert not np.array_equal(mine, words)
    assert np.array_equal(meta.data, words)
    second = sparse_matmul(values, meta, b, interpret=True)
    assert np.array_equal(first, second)
    assert np.array_equal(decode_metadata(meta), indices)


def test_another_tag_of_a_buffers_words_shares_them() -> None:
    """A buffer built over words a buffer made (read-only, nobody can write them) shares them: no copy."""
    _, indices = compress(_weight(), "f16", prune=True)
    meta = encode_metadata(indices, "sm90", "f16", k=64)
    again = MetadataBuffer(meta.data, "sm90", "f16", 16, 64)
    assert again.data is meta.data
    assert MetadataBuffer(meta.data.view(), "sm90", "f16", 16, 64).data.base is not meta.data.base


def test_editing_a_copy_and_tagging_it_anew_is_what_the_next_call_uses() -> None:
    """The supported way to change metadata: a new buffer, validated and used from its first call."""
    w = _weight()
    values, indices = compress(w, "f16", prune=True)
    meta = encode_metadata(indices, "sm90", "f16", k=64)
    b = np.random.default_rng(4).standard_normal((8, 64)).astype(np.float16)
    first = sparse_matmul(values, meta, b, interpret=True)
    swapped = (3 - indices[:, :, ::-1]).astype(np.uint8)  # the kept values at mirrored positions
    swapped_meta = encode_metadata(swapped, "sm90", "f16", k=64)
    assert np.array_equal(decode_metadata(swapped_meta), swapped)
    second = sparse_matmul(values, swapped_meta, b, interpret=True)
    assert not np.allclose(first, second)


def test_a_torch_neg_view_is_read_with_its_negation() -> None:
    """torch's DLPack export of a neg view (``torch._neg_view(w)``, ``z.conj().imag``) is its memory,
    the values before the negation: host inputs of the toolkit (compress, metadata) read it resolved."""
    torch = pytest.importorskip("torch")
    from sparsile.stdlib.sparsity import as_host_array

    w = torch.from_numpy(_weight().astype(np.float32))
    np.testing.assert_array_equal(as_host_array(torch._neg_view(w)), -w.numpy())
    values, _ = compress(torch._neg_view(w.half()), "f16", prune=True)
    plain, _ = compress(-w.half().numpy(), "f16", prune=True)
    np.testing.assert_array_equal(np.asarray(values), np.asarray(plain))


def test_checking_raw_words_copies_none_of_them(monkeypatch) -> None:
    """A launch of raw words (sparse_matmul's every call with them, the interpreter's wgmma decompressing a
    tile's words) checks them without building a MetadataBuffer, whose constructor copies the words: a copy
    per call, and per interpreted MMA, that nobody kept."""
    from sparsile.stdlib.kernels import prune_and_compress
    from sparsile.stdlib.sparsity import buffer, decompress

    rng = np.random.default_rng(4)
    dense = rng.standard_normal((128, 64)).astype(np.float32)
    values, meta = prune_and_compress(dense, "f16")
    words = np.array(meta.data)  # raw words, the caller's
    b = rng.standard_normal((16, 64)).astype(np.float16)
    want = sparse_matmul(values, meta, b, interpret=True)
    made = []
    post_init = buffer.MetadataBuffer.__post_init__
    monkeypatch.setattr(buffer.MetadataBuffer, "__post_init__", lambda self: made.append(self) or post_init(self))
    got = sparse_matmul(values, words, b, interpret=True)
    assert np.array_equal(got, want)
    d = decompress(values, words, "sm90", "f16")
    assert np.array_equal(d, decompress(values, meta))
    assert np.array_equal(decode_metadata(words, "sm90", "f16", m=128, k=64), decode_metadata(meta))
    assert made == []
    bad = words.copy()
    bad[0, 0] = 0xFFFFFFFF
    with pytest.raises(SparsityError, match=r"SP0807.*undefined metadata nibble 0xF at row 0, group 0"):
        decompress(values, bad, "sm90", "f16")  # (still checked)
