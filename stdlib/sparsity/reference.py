"""A float64 reference for sparse matrix multiply: what a correct kernel must compute."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import OperandType
from .errors import SP_OPERAND_MISMATCH, SparsityError
from .formats import decompress
from .hostarray import as_host_array, real_operand_refusal, require_numeric


def stored_positions(values: Any, meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None, *,
                     m: int | None = None, k: int | None = None) -> np.ndarray:
    """(m, k) bool: the positions of A that ``meta`` names, i.e. the elements the sparse MMA
    multiplies (the kept ones, and the explicit zeros of chunks with fewer nonzeros, docs/sparse-
    metadata.md §2). Arguments as for :func:`~.formats.decompress`."""
    host = as_host_array(values, "values")
    return np.asarray(decompress(np.ones(host.shape, host.dtype), meta, fmt, dtype, m=m, k=k)) != 0


def stored_product(a: np.ndarray, stored: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float64 over the positions ``stored`` names only: a (M, K) with zeros where not
    stored, stored (M, K) bool, b (K, N) or (K,). A sparse MMA never multiplies an element of b by a
    position of A its metadata does not name (the sparse tensor cores select b's elements by the
    metadata), so a NaN or inf of b there does not reach the result, as in a sparse product
    (scipy.sparse, cuSPARSELt); a dense ``a @ b`` would give NaN (0 * inf). With b finite the two
    are the same product."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    vector = b64.ndim == 1
    if vector:
        b64 = b64[:, None]
    special = ~np.isfinite(b64).all(axis=1)  # the rows of b (K positions) with a NaN or an inf
    if not special.any():
        out = a64 @ b64
    else:
        plain = ~special
        out = a64[:, plain] @ b64[plain]
        rows = np.nonzero(special)[0]
        with np.errstate(invalid="ignore", over="ignore"):
            terms = np.where(stored[:, rows, None], a64[:, rows, None] * b64[None, rows, :], 0.0)
            out = out + terms.sum(axis=1)
    return out[:, 0] if vector else out


def sparse_matmul_reference(values: Any, meta: Any, b: Any, fmt: str | None = None,
                            dtype: str | OperandType | None = None, *, m: int | None = None,
                            k: int | None = None) -> np.ndarray:
    """``A @ b`` in float64, with A (m, k) rebuilt from ``values`` and ``meta`` (any format).

    Every element is converted exactly to float64 (f16, bf16, fp8, e2m1 and int8 are exact in
    float64; tf32 operands are taken as the float32 values given, without rounding them to tf32).
    ``b`` must be (k, N); a 1-D ``b`` of length k gives a length-m vector. The sum runs over the
    positions the metadata names (:func:`stored_product`): a NaN or inf of b where A stores nothing
    does not reach the result, as on the sparse tensor cores. Bool and complex ``values`` or ``b``
    are SP0804 in ``sparse_matmul``'s words (:func:`~.hostarray.real_operand_refusal`): a bool b is
    not taken as 0 and 1, nor complex values as SP0814's "element type" mismatch.
    """
    _check_real(values, "values")
    _check_real(b, "b")
    dense = decompress(values, meta, fmt, dtype, m=m, k=k)
    rhs = as_host_array(b, "b")
    _check_real(rhs, "b")  # (a list of bools, now an array)
    require_numeric(rhs, "b")
    if rhs.ndim not in (1, 2) or rhs.shape[0] != dense.shape[1]:
        raise SparsityError(SP_OPERAND_MISMATCH,
                            f"b must have {dense.shape[1]} rows (the K of the sparse operand), got shape {rhs.shape}",
                            help="pass B as a (K, N) matrix with the logical, unpadded K")
    rhs64 = rhs.astype(np.float64)
    if np.isfinite(rhs64).all():
        return dense.astype(np.float64) @ rhs64
    return stored_product(dense, stored_positions(values, meta, fmt, dtype, m=m, k=k), rhs64)


def _check_real(x: Any, what: str) -> None:
    """SP0804 for an operand of bools or complex numbers (numpy, torch, cupy: by its ``dtype``)."""
    dtype = getattr(x, "dtype", None)
    refusal = None if dtype is None else real_operand_refusal(str(dtype), what)
    if refusal is not None:
        raise refusal
