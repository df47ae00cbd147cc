"""sparse_matmul_reference applies sparse_matmul's operand rules (stdlib/kernels/arrays.py
``check_real_operand``): a bool ``b`` was multiplied as 0 and 1 by the reference where
``sparse_matmul`` refuses it (SP0804), and complex values were SP0814 ("values have element type
complex64, but f16 operands are float16") where ``sparse_matmul`` says SP0804 in
``complex_refusal``'s words. Both are SP0804 in the same words now, for numpy and torch operands."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sparsile.stdlib.kernels.arrays import check_real_operand
from sparsile.stdlib.sparsity import SparsityError, compress, encode_metadata, prune, sparse_matmul_reference

BOOL_MESSAGE = ("b is a bool array: the sparse GEMM multiplies numbers, and its bools would be cast to 0 and 1 "
                "(numpy's matmul of bools is a logical product, torch.mm refuses bools)")
BOOL_HELP = "cast it to the operand type first: b.astype(values.dtype) (torch: b.to(values.dtype))"


def _operands() -> tuple[np.ndarray, Any, np.ndarray]:
    rng = np.random.default_rng(11)
    a = prune(rng.standard_normal((16, 32)).astype(np.float16), "f16")
    values, indices = compress(a)
    return values, encode_metadata(indices, "sm90", "f16"), rng.standard_normal((32, 3))


def _refusal(call: Any) -> SparsityError:
    with pytest.raises(SparsityError) as info:
        call()
    return info.value


def _same_words(got: SparsityError, x: Any, what: str) -> None:
    """``got`` is what sparse_matmul's operand check says of ``x``."""
    want = _refusal(lambda: check_real_operand(x, what))
    assert (got.code, got.message, got.help) == (want.code, want.message, want.help)


@pytest.mark.parametrize("kind", ["numpy", "list", "torch"])
def test_a_bool_b_is_sp0804_as_in_sparse_matmul(kind: str) -> None:
    values, meta, b = _operands()
    mask = b > 0
    if kind == "torch":
        torch = pytest.importorskip("torch")
        mask = torch.from_numpy(mask)
    elif kind == "list":
        mask = mask.tolist()
    got = _refusal(lambda: sparse_matmul_reference(values, meta, mask))
    assert (got.code, got.message, got.help) == ("SP0804", BOOL_MESSAGE, BOOL_HELP)
    _same_words(got, np.asarray(b > 0), "b")


def test_bool_values_are_sp0804_as_in_sparse_matmul() -> None:
    values, meta, b = _operands()
    flags = values != 0
    got = _refusal(lambda: sparse_matmul_reference(flags, meta, b))
    assert got.code == "SP0804" and got.message.startswith("values is a bool array")
    _same_words(got, flags, "values")


@pytest.mark.parametrize("what", ["values", "b"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_complex_operands_are_sp0804_as_in_sparse_matmul(what: str, kind: str) -> None:
    values, meta, b = _operands()
    operands = {"values": values.astype(np.complex64) * (1 + 1j), "b": b.astype(np.complex128) * (1 - 2j)}
    x = operands[what]
    if kind == "torch":
        torch = pytest.importorskip("torch")
        x = torch.from_numpy(x)
    args = {"values": values, "b": b, what: x}
    got = _refusal(lambda: sparse_matmul_reference(args["values"], meta, args["b"]))
    name = "complex64" if what == "values" else "complex128"
    assert (got.code, got.message) == ("SP0804", f"{what} has element type {name}: the sparse GEMM multiplies real "
                                       "numbers (the imaginary parts would be dropped)")
    _same_words(got, x, what)


def test_real_operands_still_multiply() -> None:
    values, meta, b = _operands()
    from sparsile.stdlib.sparsity import decompress

    got = sparse_matmul_reference(values, meta, b)
    np.testing.assert_allclose(got, decompress(values, meta).astype(np.float64) @ b, rtol=1e-12)
