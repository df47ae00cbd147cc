"""The kernels that ship with sparsile, and Python functions that launch them.

``*.spk`` files here are kernel modules (``sparsile.load(path)``); :mod:`.gemm` wraps the Hopper
2:4 sparse GEMM of ``sparse_gemm_sm90.spk``::

    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    values, meta = prune_and_compress(weight, "f16")     # weight: (M, K) torch / numpy / cupy
    y = sparse_matmul(values, meta, x)                     # x: (N, K); y = W_pruned @ x.T, (M, N) f16
    y = sparse_matmul(values, meta, x, interpret=True)     # the same kernel in the CPU interpreter
"""

from .gemm import (
    KERNEL_FILE,
    KERNELS,
    CompressedWeight,
    KernelChoice,
    SparseMatmul,
    kernel_module,
    plan_sparse_matmul,
    prune_and_compress,
    sparse_matmul,
)

__all__ = [
    "KERNELS",
    "KERNEL_FILE",
    "CompressedWeight",
    "KernelChoice",
    "SparseMatmul",
    "kernel_module",
    "plan_sparse_matmul",
    "prune_and_compress",
    "sparse_matmul",
]
