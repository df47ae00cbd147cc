"""A :class:`~.linear.SparseLinear` split over its output features (its rows): the check that a
shard holds whole blocks of the sm90 metadata words (SP0939).

The sm90 metadata words of a weight are stored for its rows padded to a multiple of 16
(``metadata_shape("sm90", ...)``: (ceil16(N_out), ...)), and for f16 and bf16 the two 8-row halves
of each 16-row block share one word; for e4m3 each row has its own words, but the padding rows
still sit after the last row. So ``values``, ``meta``, ``bias`` and ``scale_w`` sharded over the
devices at a multiple of 16 rows give each device the words of its own rows, and a split inside a
block (24 rows over 2 devices: 12 values rows and 16 metadata rows a device) gives a device the
words of other rows, in shapes a weight of 12 rows has too: wrong numbers, no error. A layer
records the weight's full row count (``out_features``, a static field that jax keeps when it
rebuilds the layer inside ``shard_map`` or ``pmap`` from the shards of its leaves), so a layer whose
values hold fewer rows than that is a shard, and its row count must be whole blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stdlib.sparsity.dtypes import operand_type
from ...stdlib.sparsity.formats import metadata_shape
from .errors import SP_JAX_ROW_SHARD, JaxCallError


def block_rows(op: str) -> int:
    """The rows of one block of sm90 metadata words for operand type ``op`` ("f16", "bf16",
    "e4m3"): the rows a one-row weight's words are padded to (16 for every sm90 type)."""
    return int(metadata_shape("sm90", operand_type(op), 1, operand_type(op).instr_k)[0])


def rows_of(values: Any) -> int | None:
    """The weight's row count from ``values`` (N_out, K/2), or from a stack of them (members,
    N_out, K/2): the second-last axis; None for anything without such a shape (a number, None,
    the ``in_axes`` of a ``jax.vmap`` given as a layer, a symbolic shape)."""
    shape = getattr(values, "shape", None)
    if shape is None or len(shape) < 2 or not isinstance(shape[-2], (int, np.integer)):
        return None  # (a symbolic row count of jax.export: the call's SP0932 words it)
    return int(shape[-2])


def check_row_shard(values: Any, out_features: int | None, op: str | None) -> None:
    """SP0939 where ``values`` (2-D) hold other than ``out_features`` rows and those rows are no
    shard of whole metadata blocks: more rows than ``out_features``, or a count that is no
    multiple of :func:`block_rows`. Nothing where ``out_features`` is None, the rows are all of
    them, or ``values`` are not a 2-D array of a linear kernel's type (``op`` None: the call's
    own checks word those)."""
    if out_features is None or op is None or np.ndim(values) != 2:
        return
    rows = int(np.shape(values)[0])
    if rows == out_features:
        return
    if rows > out_features:
        raise JaxCallError(SP_JAX_ROW_SHARD, f"the layer's values hold {rows} rows, more than its out_features = "
                           f"{out_features}",
                           help="out_features is the weight's row count (from_dense records it): make the layer "
                                "with out_features=None to take the values' rows")
    block = block_rows(op)
    if rows % block:
        raise JaxCallError(SP_JAX_ROW_SHARD, f"the layer's values hold {rows} of its out_features = {out_features} "
                           f"rows (a shard of its output features), which is not a multiple of {block}: the sm90 "
                           f"metadata words are stored in blocks of {block} rows, so a shard that splits a block "
                           f"reads the words of other rows",
                           help=f"split values, meta, bias and scale_w at a multiple of {block} rows a device, or "
                                f"compress each device's rows on their own (SparseLinear.from_dense of its slice "
                                f"of the dense weight) and stack those")
