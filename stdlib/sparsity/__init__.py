"""Structured-sparsity toolkit: prune, compress, encode/decode/validate metadata, reference matmul.

Pure numpy (plus ml_dtypes for bf16/fp8/fp4 host arrays), independent of the compiler. The formats
are documented, with pictures and worked examples, in docs/sparse-metadata.md::

    w = prune_2_4(dense)                          # magnitude pruning, ties to the lower index
    values, indices = compress(w)                 # (M, K/2), (M, K/4, 2) uint8
    meta = encode_metadata(indices, "tcgen05", "f16")   # tagged MetadataBuffer
    validate_metadata(meta, "tcgen05", "f16", m, k)     # what a launcher does
    dense_again = decompress(values, meta)
    ref = sparse_matmul_reference(values, meta, b)      # float64
    mask = transposable_mask_2_4(w)                     # 2:4 along rows and columns

The GPU versions (bit-identical) are in ``sparsile.stdlib.kernels.sparsity_gpu``.
"""

from .buffer import MetadataBuffer
from .compress import OverflowWarning, SaturationWarning, cast_to_operand, compress, index_shape
from .dtypes import OPERAND_TYPES, PATTERN_1_2, PATTERN_2_4, PATTERN_4_8_PAIRS, OperandType, Pattern, operand_type
from .errors import ALL_CODES, SparsityError
from .formats import decode_metadata, decompress, encode_metadata, metadata_shape, pad_sizes
from .fp4 import pack_e2m1, unpack_e2m1
from .hostarray import as_host_array
from .layouts import FORMATS, word_position
from .placement import hardware_placement, thread_placement
from .prune import (
    prune,
    prune_1_2,
    prune_2_4,
    prune_4_8_pairs,
    prune_mask,
    prune_mask_1_2,
    prune_mask_2_4,
    prune_mask_4_8_pairs,
)
from .reference import sparse_matmul_reference
from .transposable import kept_magnitude, prune_transposable_2_4, transposable_mask_2_4
from .validate import validate_metadata

__all__ = [
    "ALL_CODES",
    "FORMATS",
    "OPERAND_TYPES",
    "PATTERN_1_2",
    "PATTERN_2_4",
    "PATTERN_4_8_PAIRS",
    "MetadataBuffer",
    "OperandType",
    "OverflowWarning",
    "Pattern",
    "SaturationWarning",
    "SparsityError",
    "as_host_array",
    "cast_to_operand",
    "compress",
    "decode_metadata",
    "decompress",
    "encode_metadata",
    "hardware_placement",
    "index_shape",
    "kept_magnitude",
    "metadata_shape",
    "operand_type",
    "pack_e2m1",
    "pad_sizes",
    "prune",
    "prune_1_2",
    "prune_2_4",
    "prune_4_8_pairs",
    "prune_mask",
    "prune_mask_1_2",
    "prune_mask_2_4",
    "prune_mask_4_8_pairs",
    "prune_transposable_2_4",
    "sparse_matmul_reference",
    "thread_placement",
    "transposable_mask_2_4",
    "unpack_e2m1",
    "validate_metadata",
    "word_position",
]
