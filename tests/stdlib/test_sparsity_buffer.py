"""MetadataBuffer: immutable, ``data`` included (launchers validate it and copy it to the device once)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import sparse_matmul
from sparsile.stdlib.sparsity import MetadataBuffer, compress, decode_metadata, encode_metadata, validate_metadata


def _weight(m: int = 16, k: int = 64, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float16)


def test_encoded_words_cannot_be_edited_in_place() -> None:
    _, indices = compress(_weight(), "f16", prune=True)
    meta = encode_metadata(indices, "sm90", "f16", k=64)
    before = meta.data.copy()
    with pytest.raises(ValueError, match="read-only"):
        meta.data[0, 0] = 0xFFFFFFFF
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(meta)[...] = 0
    assert np.array_equal(meta.data, before)
    validate_metadata(meta, "sm90", "f16", m=16)


def test_a_hand_built_buffer_freezes_a_view_not_the_callers_array() -> None:
    _, indices = compress(_weight(), "f16", prune=True)
    mine = encode_metadata(indices, "sm90", "f16", k=64).data.copy()
    meta = MetadataBuffer(mine, "sm90", "f16", 16, 64)
    assert mine.flags.writeable and not meta.data.flags.writeable
    assert np.shares_memory(mine, meta.data)  # no copy of the words
    copy = np.asarray(meta, copy=True)
    copy[...] = 0  # a copy is the caller's to edit
    assert np.array_equal(meta.data, mine)


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
