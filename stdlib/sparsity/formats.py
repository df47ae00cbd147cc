"""Encoding logical indices into the hardware metadata formats, decoding them back, and
decompressing (values, metadata) to a dense matrix.

The layouts themselves are described (with their docs/hardware.md sources) in :mod:`.layouts`
and, with pictures and worked examples, in docs/sparse-metadata.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .buffer import MetadataBuffer, adopt_words
from .compress import checked_indices, decompress_nibbles, nibbles_to_indices, pack_checked_indices
from .dtypes import OperandType, operand_type
from .hostarray import as_host_array, checked_size
from .indexrules import require_index_shape
from .layouts import check_format, check_supported, nibbles_from_words, words_from_packed
from .layouts import metadata_shape as _metadata_shape
from .layouts import pad_sizes as _pad_sizes
from .validate import checked_metadata


def pad_sizes(fmt: str, dtype: str | OperandType, m: int, k: int) -> tuple[int, int]:
    """(Mp, Kp): the operand sizes format ``fmt`` pads an (m, k) ``dtype`` operand to.

    logical: K up to the chunk size; sm90: M up to 16 and K up to the instruction K (32, 16, 64
    for 16-bit, tf32, 8-bit); tcgen05: M up to 128 and K up to the atom K (128, 64, 128, 256).
    """
    return _pad_sizes(check_format(fmt), operand_type(dtype), checked_size(m, "m"), checked_size(k, "k"))


def metadata_shape(fmt: str, dtype: str | OperandType, m: int, k: int) -> tuple[int, ...]:
    """Shape of the ``fmt`` metadata array of an (m, k) ``dtype`` operand:
    logical (m, ceil(k/G), S); sm90 (Mp, Kp/(8G)); tcgen05 (Kp/atomK, Mp/128, 128, 4)."""
    return _metadata_shape(check_format(fmt), operand_type(dtype), checked_size(m, "m"), checked_size(k, "k"))


def encode_metadata(indices: Any, fmt: str, dtype: str | OperandType, *, k: int | None = None) -> MetadataBuffer:
    """Lay out logical ``indices`` (M, K/G, S) in format ``fmt`` for operand type ``dtype``.

    ``k`` is the logical (unpadded) K, recorded in the buffer so that decompression returns exactly
    (M, k); it defaults to (K/G)·G. Bad indices raise what validate_metadata raises for them
    (:mod:`.indexrules`: SP0805 shape, a ``k`` the K/G groups do not hold included, SP0806 element
    type, SP0813 out of range, SP0807 an equal pair, SP0808 a decreasing pair); e2m1 with "sm90"
    raises SP0811.
    """
    fmt = check_format(fmt)
    op = operand_type(dtype)
    check_supported(fmt, op)
    raw = as_host_array(indices, "indices")
    require_index_shape(raw, op)  # (rank and slots, before the sizes are read from it; validate's order)
    m, chunks = raw.shape[0], raw.shape[1]
    k = chunks * op.group if k is None else checked_size(k, "k")
    require_index_shape(raw, op, m, k)  # a k the groups do not hold: SP0805, as validate_metadata says
    array = checked_indices(raw, op)
    if fmt == "logical":  # (the checked indices may be the caller's array, or a view of it: the constructor copies)
        return MetadataBuffer(array, fmt, op.name, m, k)
    return adopt_words(words_from_packed(pack_checked_indices(array, op), fmt, op, k), fmt, op.name, m, k)


def _nibble_grid(data: np.ndarray, fmt: str, op: OperandType, m: int, k: int) -> np.ndarray:
    """The (m, ceil(k/G)) nibbles of checked metadata words (:func:`checked_metadata`), padding cut off."""
    chunks = -(-k // op.group)
    if fmt == "logical":
        if op.width_class == "tf32":
            return (np.uint8(4) + np.uint8(10) * data[:, :, 0]).astype(np.uint8)
        return data[:, :, 0] | (data[:, :, 1] << np.uint8(2))
    return nibbles_from_words(data, fmt, op)[:m, :chunks]


def decode_metadata(meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None, *,
                    m: int | None = None, k: int | None = None, allow_unordered: bool = False) -> np.ndarray:
    """Logical indices (m, ceil(k/G), S) uint8 of a metadata buffer, after
    :func:`validate_metadata` (same arguments); padding is dropped."""
    checked = checked_metadata(meta, fmt, dtype, m, k, allow_unordered=allow_unordered)  # (no buffer: no copy)
    if checked[1] == "logical":
        return checked[0].copy()
    return nibbles_to_indices(_nibble_grid(*checked), checked[2])


def decompress(values: Any, meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None, *,
               m: int | None = None, k: int | None = None, allow_unordered: bool = False) -> np.ndarray:
    """The dense (m, k) operand, in its host dtype, from ``values`` and metadata in any format.

    ``meta`` is a :class:`MetadataBuffer` or a raw array with ``fmt`` and ``dtype``; for a raw
    array m defaults to ``values.shape[0]`` and k to ``2 * values.shape[1]``.
    """
    if not isinstance(meta, MetadataBuffer):
        shape = getattr(as_host_array(values, "values"), "shape", ())
        if len(shape) == 2:
            m = shape[0] if m is None else m
            k = 2 * shape[1] if k is None else k
    checked = checked_metadata(meta, fmt, dtype, m, k, allow_unordered=allow_unordered)  # (no buffer: no copy)
    dense = decompress_nibbles(values, _nibble_grid(*checked), checked[2])
    return dense[:, :checked[4]]
