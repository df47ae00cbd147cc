"""The compressed-tensors sparse-24-bitmask layout (integrations/sparse24.py) against the sparsity
toolkit: the layout of a known weight, round trips through values + indices, all-zero groups,
groups with one nonzero, -0.0, and the SP0913 / SP0915 errors."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.integrations.sparse24 import bitmask_layout, dense_from_bitmask
from sparsile.stdlib.sparsity import compress, prune_2_4


def test_layout_of_a_known_row():
    w = np.array([[0, 3, 0, -1, 5, 0, 0, 2]], dtype=np.float16)
    values, indices = compress(w, "f16")
    compressed, bitmask, shape = bitmask_layout(values, indices, 8)
    assert compressed.tolist() == [[3, -1, 5, 2]]
    assert bitmask.tolist() == [[0b10011010]]  # bit j (little order) = column j kept: 1, 3, 4, 7
    assert shape.dtype == np.int64 and shape.tolist() == [1, 8]
    assert np.array_equal(dense_from_bitmask(compressed, bitmask, shape), w)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_round_trip_through_the_toolkit(dtype):
    rng = np.random.default_rng(1)
    w = prune_2_4(rng.standard_normal((24, 40))).astype(dtype)
    w[3] = 0                      # all-zero groups
    w[5, 8:12] = [0, 0, 1.5, 0]   # one nonzero in a group
    values, indices = compress(w, str(np.dtype(dtype)))
    compressed, bitmask, shape = bitmask_layout(values, indices, 40)
    assert compressed.shape == (24, 20) and bitmask.shape == (24, 5)
    assert (np.unpackbits(bitmask, axis=1, bitorder="little").reshape(24, 10, 4).sum(axis=2) == 2).all()
    dense = dense_from_bitmask(compressed, bitmask, shape)
    assert dense.dtype == np.dtype(dtype) and np.array_equal(dense.astype(np.float64), w.astype(np.float64))


def test_masks_with_fewer_bits_and_negative_zero():
    """A writer may keep fewer than two elements of a group, or keep -0.0: the values follow the mask."""
    mask = np.array([[1, 0, 0, 0, 1, 1, 0, 0]], dtype=bool)
    compressed = np.array([[-0.0, 2.0, -3.0]], dtype=np.float32)
    dense = dense_from_bitmask(compressed, np.packbits(mask, axis=1, bitorder="little"), np.array([1, 8]))
    assert dense.tolist() == [[0.0, 0, 0, 0, 2.0, -3.0, 0, 0]] and np.signbit(dense[0, 0])


@pytest.mark.parametrize(("rows", "cols"), [(0, 32), (0, 6), (3, 0)])
def test_an_empty_weight_decompresses_to_an_empty_array(rows, cols):
    """A .shape with 0 rows was a ValueError from numpy (reshape of 0 elements with a -1 axis)."""
    dense = dense_from_bitmask(np.zeros((rows, cols // 2), np.float16), np.zeros((rows, -(-cols // 8)), np.uint8),
                               np.array([rows, cols]))
    assert dense.shape == (rows, cols) and dense.dtype == np.float16


@pytest.mark.parametrize("layout", [(2,), (2, 1), (1, 2)])
def test_a_shape_of_two_sizes_in_any_of_the_written_layouts_is_read(layout):
    """compressed-tensors writes .shape as (2, 1) (``torch.tensor(shape).reshape(-1, 1)``); (2,) alone
    was read, and every checkpoint that library wrote was SP0913."""
    w = np.array([[0, 3, 0, -1, 5, 0, 0, 2], [1, 0, 0, 4, 0, 6, 7, 0]], dtype=np.float16)
    mask = w != 0
    bits = np.packbits(mask, axis=1, bitorder="little")
    dense = dense_from_bitmask(w[mask].reshape(2, 4), bits, np.array([2, 8], np.int64).reshape(layout))
    assert np.array_equal(dense, w)


def _error(fn, *args) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args)
    return info.value


def test_layer_errors_are_sp0913():
    ok_bits = np.packbits(np.array([[1, 1, 0, 0]], bool), axis=1, bitorder="little")
    three = np.packbits(np.array([[1, 1, 1, 0]], bool), axis=1, bitorder="little")
    cases = [
        ((np.ones((1, 2)), three, np.array([1, 4]), "L"),
         "layer L: the bitmask keeps 3 elements of row 0, group 0 (columns 0..3); 2:4 keeps at most 2"),
        ((np.ones((1, 3)), ok_bits, np.array([1, 4]), "L"), "layer L: the bitmask keeps 2 elements but compressed "
                                                           "holds 3"),
        ((np.ones((1, 2)), ok_bits, np.array([1, 4, 2]), "L"),
         "layer L: shape must hold two non-negative integers [out, in], got [1, 4, 2]"),
        ((np.ones((1, 2)), ok_bits.astype(np.int8), np.array([1, 4]), "L"),
         "layer L: bitmask must be uint8 of shape (1, 1), got int8 (1, 1)"),
        ((np.ones(2), ok_bits, np.array([1, 4]), "L"), "layer L: compressed must be 2-D with 1 rows, got shape (2,)"),
    ]
    for args, message in cases:
        err = _error(dense_from_bitmask, *args)
        assert (err.code, err.message) == ("SP0913", message)


def test_in_features_not_a_multiple_of_4_cannot_be_written():
    values, indices = compress(np.zeros((2, 6), np.float16), "f16")
    err = _error(bitmask_layout, values, indices, 6, "proj")
    assert (err.code, err.message) == (
        "SP0915", "layer proj: in_features = 6 is not a multiple of 4; sparse-24-bitmask stores whole groups of 4")


@pytest.mark.parametrize(("index", "message"), [
    ('{"weight_map": ["a"]}', "has no readable weight_map (not an object of tensor names to file names)"),
    ('{"weight_map": {"a": 3}}', "has no readable weight_map (not an object of tensor names to file names)"),
    ('{"weight_map": {"a": "gone.safetensors", "b": "lost.safetensors"}}',
     "names 'gone.safetensors', which is not a file of the folder (1 more such)"),
])
def test_a_bad_shard_index_is_sp0912(tmp_path, index, message):
    """An index whose weight_map is not names to file names, or names a shard the folder lacks, was
    an AttributeError, a TypeError or a FileNotFoundError from inside the reader."""
    from sparsile.integrations.sparse24 import INDEX, shards

    (tmp_path / INDEX).write_text(index)
    with pytest.raises(IntegrationError) as info:
        shards(tmp_path)
    assert (info.value.code, info.value.message) == ("SP0912", f"{tmp_path / INDEX} {message}")


def test_an_index_naming_a_file_outside_the_folder_is_sp0912(tmp_path):
    """A weight_map value like "../x.safetensors" or an absolute path was read from wherever it led."""
    from sparsile.integrations.sparse24 import INDEX, shards

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "elsewhere.safetensors").write_bytes(b"")
    (folder / "model.safetensors").write_bytes(b"")
    for name in ("../elsewhere.safetensors", str(tmp_path / "elsewhere.safetensors")):
        (folder / INDEX).write_text(json.dumps({"weight_map": {"a": "model.safetensors", "b": name}}))
        with pytest.raises(IntegrationError) as info:
            shards(folder)
        assert (info.value.code, info.value.message) == (
            "SP0912", f"{folder / INDEX} names {name!r}, which lies outside the checkpoint folder")
    (folder / INDEX).write_text(json.dumps({"weight_map": {"a": "model.safetensors", "b": "./model.safetensors"}}))
    assert shards(folder) == [folder / "model.safetensors"]  # one file under two spellings, read once
