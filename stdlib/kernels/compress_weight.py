"""``prune_and_compress``: a dense weight magnitude-pruned to 2:4 (1:2 for tf32), compressed and its
metadata encoded, ready for :func:`~.gemm.sparse_matmul` and :func:`~.linear.sparse_linear`.

A CUDA torch tensor or cupy array already in the operand's element type is pruned on its GPU
(``compress_gpu`` of :mod:`.sparsity_gpu`); everything else on the host with the sparsity toolkit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..sparsity import MetadataBuffer, as_host_array, compress, encode_metadata
from ..sparsity.dtypes import OperandType, operand_type
from ..sparsity.formats import decompress
from ..sparsity.layouts import check_format
from .arrays import array_kind, as_u32_words, bad_input, copy_like
from .gemm_choice import operand_of, resolve_kernel_choice
from .gemm_operands import device_copies


class CompressedWeight(NamedTuple):
    """What :func:`prune_and_compress` returns: unpack it as ``values, meta = ...``."""

    values: Any
    meta: MetadataBuffer

    def dense(self) -> np.ndarray:
        """The pruned dense (M, K) weight on the host, rebuilt from values and metadata."""
        return decompress(as_host_array(self.values, "values"), self.meta)


def prunes_on_gpu(weight: Any, op: OperandType) -> bool:
    """Whether :func:`prune_and_compress` hands ``weight`` to the GPU toolkit: a CUDA torch tensor or
    a cupy array already in the operand's element type. ``compress_gpu`` is bit-identical to the
    host's ``compress(prune=True)`` for it; a weight of another type stays on the host path, which
    prunes in the weight's own precision before the cast (the GPU kernels cast first) and saturates
    e4m3 at ±448."""
    return array_kind(weight) in ("torch", "cupy") and operand_of(weight) == op.name and op.width_class != "4-bit"


def _compress_on_gpu(weight: Any, op: OperandType, fmt: str) -> CompressedWeight:
    """``compress_gpu`` of a device weight: values stay on its device; the metadata words come back
    to the host once (a tagged buffer, as the host path returns) and the device words are kept as
    the buffer's device copy, so :func:`~.gemm.sparse_matmul` does not upload them again."""
    from .sparsity_gpu import compress_gpu

    values, device_meta = compress_gpu(weight.detach() if hasattr(weight, "detach") else weight, op.name, fmt)
    meta = device_meta.to_host()
    if fmt == "sm90":
        device_copies.setdefault(meta, {})[str(getattr(values, "device", "cupy"))] = as_u32_words(device_meta.data)
    return CompressedWeight(values, meta)


def prune_and_compress(weight: Any, dtype: Any, fmt: str = "sm90") -> CompressedWeight:
    """Magnitude-prune ``weight`` (M, K) to the pattern of operand type ``dtype`` (2:4; 1:2 for tf32),
    cast, compress, and encode ``fmt`` metadata ("sm90"; "tcgen05" saves the one-time re-encoding
    for Blackwell): ``(values, meta)`` ready for :func:`~.gemm.sparse_matmul`. ``dtype`` is an
    operand name ("bf16", "f16", "e4m3", ...; "bfloat16", "float16", "float8_e4m3fn" too) or a torch
    or numpy dtype (torch.bfloat16), as SparseLinear and sparsify_ take it (SP0801 for another).

    ``values`` lives where ``weight`` does (a torch tensor on its device, a cupy array, else numpy);
    ``meta`` is a tagged host MetadataBuffer, validated and copied to the device once, on first use.
    A CUDA torch tensor or cupy array already in the operand's element type is pruned and compressed
    on its GPU (``compress_gpu`` of the GPU toolkit, bit-identical to the host toolkit; only the
    metadata words are copied back). Everything else is pruned on the host
    (``compress(weight, dtype, prune=True)`` of the toolkit), in the weight's own precision before
    the cast. e4m3 has no infinity: weights beyond ±448 are saturated to ±448 with a
    ``SaturationWarning`` (a plain cast would make them NaN).
    """
    choice = resolve_kernel_choice(weight, None, dtype, compressed=False)
    op = operand_type(choice.operand)
    if check_format(fmt) != "logical" and prunes_on_gpu(weight, op):
        if len(weight.shape) != 2:
            raise bad_input(f"weight must be a 2-D (M, K) matrix, got shape {tuple(weight.shape)}",
                            help="reshape to (out features, in features)")
        return _compress_on_gpu(weight, op, fmt)
    host = as_host_array(weight, "weight")
    if host.ndim != 2:
        raise bad_input(f"weight must be a 2-D (M, K) matrix, got shape {host.shape}",
                        help="reshape to (out features, in features)")
    values, indices = compress(host, choice.operand, prune=True)
    meta = encode_metadata(indices, fmt, choice.operand, k=int(host.shape[1]))
    if array_kind(weight) in ("torch", "torch-cpu", "cupy"):
        values = copy_like(values, weight)
    return CompressedWeight(values, meta)
