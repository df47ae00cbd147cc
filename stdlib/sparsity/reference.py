"""A float64 reference for sparse matrix multiply: what a correct kernel must compute."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import OperandType
from .errors import SP_OPERAND_MISMATCH, SparsityError
from .formats import decompress
from .hostarray import as_host_array, require_numeric


def sparse_matmul_reference(values: Any, meta: Any, b: Any, fmt: str | None = None,
                            dtype: str | OperandType | None = None, *, m: int | None = None,
                            k: int | None = None) -> np.ndarray:
    """``A @ b`` in float64, with A (m, k) rebuilt from ``values`` and ``meta`` (any format).

    Every element is converted exactly to float64 (f16, bf16, fp8, e2m1 and int8 are exact in
    float64; tf32 operands are taken as the float32 values given, without rounding them to tf32).
    ``b`` must be (k, N); a 1-D ``b`` of length k gives a length-m vector.
    """
    dense = decompress(values, meta, fmt, dtype, m=m, k=k)
    rhs = as_host_array(b, "b")
    require_numeric(rhs, "b")
    if rhs.ndim not in (1, 2) or rhs.shape[0] != dense.shape[1]:
        raise SparsityError(SP_OPERAND_MISMATCH,
                            f"b must have {dense.shape[1]} rows (the K of the sparse operand), got shape {rhs.shape}",
                            help="pass B as a (K, N) matrix with the logical, unpadded K")
    return dense.astype(np.float64) @ rhs.astype(np.float64)
