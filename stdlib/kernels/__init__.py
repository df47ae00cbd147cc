"""The kernels that ship with sparsile, and Python functions that launch them.

``*.spk`` files here are kernel modules (``sparsile.load(path)``); :mod:`.gemm` wraps the Hopper
2:4 sparse GEMM of ``sparse_gemm_sm90.spk``::

    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    values, meta = prune_and_compress(weight, "f16")     # weight: (M, K) torch / numpy / cupy
    y = sparse_matmul(values, meta, x)                     # x: (N, K); y = W_pruned @ x.T, (M, N) f16
    y = sparse_matmul(values, meta, x, interpret=True)     # the same kernel in the CPU interpreter
    y = sparse_matmul(values, meta, x, target="sm_100a")   # Blackwell: the persistent tcgen05 kernel
    y = sparse_linear(values, meta, x, bias=b, activation="silu")  # torch's x @ W.T + b, (N, M), fused

:mod:`.linear` holds ``sparse_linear`` (the epilogue-fused kernels, a plan API for torch layers)
and ``quantize_per_token_e4m3``.

:mod:`.sparsity_gpu` runs the 2:4 sparsity toolkit (prune, compress + encode, decompress, validate)
on the GPU with the kernels of ``sparsity_24.spk``, bit-identical to the host toolkit.

:mod:`.gemm_sm100` holds the Blackwell path (``sparse_gemm_sm100_persistent.spk`` and, with
``persistent=False``, ``sparse_gemm_sm100.spk``).
"""

from .compress_weight import CompressedWeight, prune_and_compress
from .gemm import (
    KERNEL_FILE,
    SparseMatmul,
    kernel_module,
    plan_sparse_matmul,
    sparse_matmul,
)
from .gemm_choice import KERNELS, KernelChoice
from .gemm_sm100 import KERNELS_SM100, SparseMatmulSm100
from .linear import plan_sparse_linear, quantize_per_token_e4m3, sparse_linear
from .linear_plan import SparseLinearPlan

__all__ = [
    "KERNELS",
    "KERNELS_SM100",
    "KERNEL_FILE",
    "CompressedWeight",
    "KernelChoice",
    "SparseLinearPlan",
    "SparseMatmul",
    "SparseMatmulSm100",
    "kernel_module",
    "plan_sparse_linear",
    "plan_sparse_matmul",
    "prune_and_compress",
    "quantize_per_token_e4m3",
    "sparse_linear",
    "sparse_matmul",
]
