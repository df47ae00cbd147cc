"""The dense operand of sparse_matmul (b) and sparse_linear (x, the decode kernel's too): a bool
array is refused, not cast to 0 and 1. ``np.matmul`` of bools is a logical product (a bool
result) and ``torch.mm`` refuses bools, so a numeric product of a mask was a silent surprise.
Complex operands are refused on every route (torch and cupy arrays too, whose cast to the operand
type dropped the imaginary parts); object and string arrays are not numbers (SP0804 as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparsile.frontend.spans import UNKNOWN_SPAN
from sparsile.stdlib.kernels import sparse_matmul
from sparsile.stdlib.kernels.compress_weight import CompressedWeight, prune_and_compress
from sparsile.stdlib.kernels.decode import plan_sparse_decode
from sparsile.stdlib.kernels.linear import sparse_linear
from sparsile.stdlib.sparsity import SparsityError


def _weight(seed: int) -> CompressedWeight:
    rng = np.random.default_rng(seed)
    return prune_and_compress(rng.uniform(0.5, 2.0, (64, 64)) * rng.choice([-1, 1], (64, 64)), "f16")


CALLS: dict[str, Callable[[CompressedWeight, Any], Any]] = {
    "sparse_matmul": lambda w, b: sparse_matmul(w.values, w.meta, b, interpret=True),
    "sparse_matmul gemm": lambda w, b: sparse_matmul(w.values, w.meta, b, interpret=True, kernel="gemm"),
    "sparse_matmul decode": lambda w, b: sparse_matmul(w.values, w.meta, b, interpret=True, kernel="decode"),
    "sparse_linear": lambda w, x: sparse_linear(w.values, w.meta, x, interpret=True),
    "sparse_linear gemm": lambda w, x: sparse_linear(w.values, w.meta, x, interpret=True, kernel="gemm"),
    "plan_sparse_decode": lambda w, x: plan_sparse_decode(w.values, w.meta, x, interpret=True),
}
NAME = {"sparse_matmul": "b", "sparse_linear": "x", "plan_sparse_decode": "x"}


def _refusal(call: str, x: Any) -> SparsityError:
    with pytest.raises(SparsityError) as info:
        CALLS[call](_weight(3), x)
    assert info.value.span == UNKNOWN_SPAN
    return info.value


def _bool_message(what: str) -> tuple[str, str, str]:
    return ("SP0804",
            f"{what} is a bool array: the sparse GEMM multiplies numbers, and its bools would be cast to 0 and 1 "
            "(numpy's matmul of bools is a logical product, torch.mm refuses bools)",
            f"cast it to the operand type first: {what}.astype(values.dtype) (torch: {what}.to(values.dtype))")


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_bool_dense_operand_is_refused(call: str) -> None:
    what = NAME[call.split()[0]]
    x = np.random.default_rng(5).random((16, 64)) < 0.5
    err = _refusal(call, x)
    assert (err.code, err.message, err.help) == _bool_message(what)
    if what == "b":  # (sparse_matmul takes a nested list too: one of bools is refused the same way)
        err = _refusal(call, x.tolist())
        assert (err.code, err.message, err.help) == _bool_message(what)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_complex_dense_operand_is_refused(call: str) -> None:
    what = NAME[call.split()[0]]
    x = np.random.default_rng(6).standard_normal((16, 64)).astype(np.complex64)
    err = _refusal(call, x)
    assert (err.code, err.message, err.help) == (
        "SP0804", f"{what} has element type complex64: the sparse GEMM multiplies real numbers (the imaginary "
        "parts would be dropped)", f"pass {what}.real, or the real and imaginary parts in two calls")


@pytest.mark.parametrize("dtype", [object, str])
def test_object_and_string_operands_are_not_numbers(dtype: type) -> None:
    x = np.random.default_rng(7).standard_normal((16, 64)).astype(dtype)
    err = _refusal("sparse_matmul", x)
    assert (err.code, err.message) == ("SP0804", f"b has element type {x.dtype}, which is not numeric")


def test_torch_cpu_bool_and_complex_operands_are_refused() -> None:
    torch = pytest.importorskip("torch")
    w = _weight(4)
    b = torch.rand(16, 64) < 0.5
    with pytest.raises(SparsityError) as info:
        sparse_matmul(torch.from_numpy(w.values), w.meta, b, interpret=True)
    assert (info.value.code, info.value.message, info.value.help) == _bool_message("b")
    x = torch.randn(16, 64, dtype=torch.complex64)
    with pytest.raises(SparsityError) as info:
        sparse_linear(torch.from_numpy(w.values), w.meta, x, interpret=True)
    assert (info.value.code, info.value.message) == (
        "SP0804", "x has element type complex64: the sparse GEMM multiplies real numbers (the imaginary parts "
        "would be dropped)")


def test_complex_values_with_a_dtype_are_refused() -> None:
    w = _weight(8)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(w.values.astype(np.complex64), w.meta, np.ones((16, 64), np.float16), dtype="f16",
                      interpret=True)
    assert (info.value.code, info.value.message) == (
        "SP0804", "values has element type complex64: the sparse GEMM multiplies real numbers (the imaginary "
        "parts would be dropped)")


def test_numeric_operands_still_run() -> None:
    """The check refuses only bools and complex numbers: float32 and int32 b give the float64
    product of their values cast to f16 (every value here is exact in f16)."""
    w = _weight(9)
    rng = np.random.default_rng(10)
    dense = w.dense().astype(np.float64)
    for b in (rng.integers(-8, 9, (16, 64)).astype(np.int32), rng.integers(-8, 9, (16, 64)).astype(np.float32) / 4):
        c = sparse_matmul(w.values, w.meta, b, interpret=True)
        ref = dense @ b.astype(np.float16).astype(np.float64).T
        np.testing.assert_allclose(c.astype(np.float64), ref, rtol=2e-3, atol=2e-3 * np.abs(dense).sum(1).max())


def test_a_blackwell_plan_refuses_them_too() -> None:
    w = _weight(11)
    x = np.random.default_rng(12).random((16, 64)) < 0.5
    with pytest.raises(SparsityError) as info:
        sparse_matmul(w.values, w.meta, x, interpret=True, target="sm_100a")
    assert (info.value.code, info.value.message, info.value.help) == _bool_message("b")


@pytest.mark.parametrize("dtype_name", ["bool", "complex64"])
def test_the_torch_op_refuses_bool_and_complex_x_on_the_cpu(dtype_name: str) -> None:
    """torch.ops.sparsile.sparse_linear (CPU path: the interpreter) takes x of a floating type only
    (SP0901, as before this file: a guard that it stays so)."""
    torch = pytest.importorskip("torch")
    import sparsile.torch  # noqa: F401  (registers the op)
    from sparsile.integrations.errors import IntegrationError

    w = _weight(13)
    values = torch.from_numpy(np.ascontiguousarray(w.values))
    meta = torch.from_numpy(w.meta.data.view(np.int32).copy())
    x = (torch.rand(4, 64) < 0.5) if dtype_name == "bool" else torch.randn(4, 64, dtype=torch.complex64)
    with pytest.raises(IntegrationError) as info:
        torch.ops.sparsile.sparse_linear(x, values, meta)
    assert info.value.code == "SP0901"
    assert info.value.message == (f"sparsile.sparse_linear: x has dtype torch.{dtype_name} but the weight is "
                                  "torch.float16: x is bfloat16, float16 or float32, cast to the weight's type inside")
