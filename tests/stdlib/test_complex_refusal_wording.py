"""A complex array is refused with one wording on every toolkit path: the one the sparse kernels'
dense operands get (arrays.check_real_operand, tests/stdlib/test_dense_operand_types.py), complex
values refused because the kernels multiply real numbers. The host toolkit (prune, compress, the
transposable mask, the reference matmul), the GPU toolkit run through the interpreter and
sparse_linear's bias called a complex array "not numeric" (hostarray.require_numeric), which it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from sparsile.frontend.spans import UNKNOWN_SPAN
from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import sparsity_gpu as G
from sparsile.stdlib.kernels.compress_weight import CompressedWeight, prune_and_compress
from sparsile.stdlib.kernels.linear import sparse_linear


def _weight() -> CompressedWeight:
    rng = np.random.default_rng(1)
    return prune_and_compress(rng.uniform(0.5, 2.0, (64, 64)) * rng.choice([-1, 1], (64, 64)), "f16")


def _bias_call(bias: np.ndarray) -> Any:
    w = _weight()
    x = np.random.default_rng(2).uniform(0.5, 2.0, (4, 64)).astype(np.float16)
    return sparse_linear(w.values, w.meta, x, bias=bias, interpret=True)


def _reference_call(b: np.ndarray) -> Any:
    w = _weight()
    return S.sparse_matmul_reference(w.values, w.meta, b)


CALLS: dict[str, tuple[str, tuple[int, ...], Callable[[np.ndarray], Any]]] = {
    "prune": ("w", (16, 32), lambda a: S.prune(a, "f16")),
    "prune_2_4": ("w", (16, 32), S.prune_2_4),
    "prune_mask_2_4": ("w", (16, 32), S.prune_mask_2_4),
    "transposable_mask_2_4": ("w", (16, 32), S.transposable_mask_2_4),
    "compress": ("w", (16, 32), lambda a: S.compress(a, "f16", prune=True)),
    "compress inferred": ("w", (16, 32), lambda a: S.compress(a, prune=True)),
    "prune_and_compress": ("w", (16, 32), lambda a: prune_and_compress(a, "f16")),
    "prune_gpu interpreted": ("w", (16, 32), lambda a: G.prune_gpu(a, "f16", interpret=True)),
    "compress_gpu interpreted": ("w", (16, 32), lambda a: G.compress_gpu(a, "f16", interpret=True)),
    "sparse_matmul_reference b": ("b", (64, 8), _reference_call),
    "sparse_linear bias": ("bias", (64,), _bias_call),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("complex_type", [np.complex64, np.complex128])
def test_a_complex_array_gets_the_kernels_wording(call: str, complex_type: type) -> None:
    what, shape, run = CALLS[call]
    rng = np.random.default_rng(3)
    real = rng.uniform(0.5, 2.0, shape)
    run(real.astype(np.float32))  # the real array passes
    array = (real + 1j * rng.uniform(0.5, 2.0, shape)).astype(complex_type)
    with pytest.raises(S.SparsityError) as info:
        run(array)
    err = info.value
    name = np.dtype(complex_type).name
    assert (err.code, err.message, err.help) == (
        "SP0804", f"{what} has element type {name}: the sparse GEMM multiplies real numbers (the imaginary "
        "parts would be dropped)", f"pass {what}.real, or the real and imaginary parts in two calls")
    assert err.span == UNKNOWN_SPAN


@pytest.mark.parametrize("call", ["prune", "compress", "sparse_matmul_reference b"])
def test_object_and_string_arrays_stay_not_numeric(call: str) -> None:
    what, shape, run = CALLS[call]
    for array in (np.full(shape, 1.5, dtype=object), np.full(shape, "1.5")):
        with pytest.raises(S.SparsityError) as info:
            run(array)
        assert (info.value.code, info.value.message) == (
            "SP0804", f"{what} has element type {array.dtype}, which is not numeric")


@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3", "s8", "tf32"])
def test_cast_to_operand_refuses_complex_values(dtype):
    """cast_to_operand (public: the host cast the toolkit and the tests use) of a complex array is SP0804 in
    complex_refusal's words; it cast silently (NumPy's ComplexWarning only), dropping the imaginary parts."""
    a = np.random.default_rng(3).uniform(0.5, 2.0, (4, 8)) * (1 + 1j)
    with pytest.raises(S.SparsityError) as info:
        S.cast_to_operand(a, S.operand_type(dtype), "w")
    assert info.value.code == "SP0804"
    assert info.value.message == ("w has element type complex128: the sparse GEMM multiplies real numbers (the "
                                  "imaginary parts would be dropped)")
    assert info.value.help == "pass w.real, or the real and imaginary parts in two calls"
