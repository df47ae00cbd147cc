"""``sparse_matmul(values, meta, b)`` and ``sparse_linear(values, meta, x)`` with their arguments in
another order (a new user's mistake: both take the weight first) are refused naming the order.
Before, the metadata passed as b was "values cover K = 64 ... but b has K = 2" (SP0815), x passed as
values "no Hopper sparse GEMM kernel for tf32 operands", and the metadata passed as values "cannot
tell the operand type of values of bf16". Plans in the interpreter only: nothing is launched."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import prune_and_compress, sparse_linear, sparse_matmul
from sparsile.stdlib.sparsity import SparsityError

WEIGHT = prune_and_compress(np.random.default_rng(0).standard_normal((128, 64)), "bf16")
X = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
V, M = WEIGHT.values, WEIGHT.meta


@pytest.mark.parametrize("call", [sparse_matmul, sparse_linear])
@pytest.mark.parametrize(("args", "message"), [
    ((M, V, X), "values is a MetadataBuffer (the weight's metadata)"),
    ((V, X, M), "{b} is a MetadataBuffer (the weight's metadata)"),
    ((X, V, M), "{b} is a MetadataBuffer (the weight's metadata)"),
    ((X, M, V), "{b} has the shape of the compressed values this metadata is for, (128, 32), and values (8, 64): "
                "values and {b} are swapped"),
    ((V, X, X), "meta holds float32 numbers: the metadata is a MetadataBuffer or its integer words"),
    ((V, V, X), "meta holds bfloat16 numbers: the metadata is a MetadataBuffer or its integer words"),
    ((V, M.data.astype(np.float32), X), "meta holds float32 numbers: the metadata is a MetadataBuffer or its "
                                        "integer words"),
])
def test_arguments_in_another_order_are_refused_naming_the_order(call, args, message) -> None:
    b = "b" if call is sparse_matmul else "x"
    with pytest.raises(SparsityError) as info:
        call(*args, interpret=True)
    code = "SP0806" if message.startswith("meta holds") else "SP0804"  # (SP0806: the metadata's element type)
    assert (info.value.code, info.value.message) == (code, f"{call.__name__}: {message.format(b=b)}")
    assert info.value.help == f"pass {call.__name__}(weight.values, weight.meta, {b}): prune_and_compress's " \
                              "values and meta, then the activations"


@pytest.mark.parametrize("call", [sparse_matmul, sparse_linear])
def test_the_right_order_still_runs(call) -> None:
    y = call(V, M, X, interpret=True)
    ref = WEIGHT.dense().astype(np.float64) @ X.astype(V.dtype).astype(np.float64).T
    got = np.asarray(y, np.float64) if call is sparse_matmul else np.asarray(y, np.float64).T
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max() + 1e-2
    words = call(V, M.data, X, interpret=True)  # raw integer words are metadata too
    assert np.array_equal(np.asarray(words), np.asarray(y))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3", "s8", "tf32"])
@pytest.mark.parametrize("k", [30, 64, 100])
def test_swapped_values_and_b_are_told_apart_for_every_operand_type_and_k(dtype, k) -> None:
    rng = np.random.default_rng(k)
    w = rng.standard_normal((96, k)) * 4
    weight = prune_and_compress(w.astype(np.int8) if dtype == "s8" else w.astype(np.float32), dtype)
    x = np.ones((8, k), np.int8 if dtype == "s8" else np.float32)
    with pytest.raises(SparsityError, match="values and b are swapped"):
        sparse_matmul(x, weight.meta, weight.values, interpret=True)
    y = sparse_matmul(weight.values, weight.meta, x, interpret=True)  # the right order is not refused
    assert y.shape == (96, 8)


@pytest.mark.parametrize("call", [sparse_matmul, sparse_linear])
def test_a_k_that_does_not_match_the_weight_names_the_activations_argument(call) -> None:
    """sparse_linear's activations are ``x``: its SP0815 said "b has K" (sparse_matmul's name)."""
    b = "b" if call is sparse_matmul else "x"
    with pytest.raises(SparsityError) as info:
        call(V, M, X[:, :32], interpret=True)
    assert info.value.code == "SP0815"
    assert info.value.message == f"values cover K = 64 (shape (128, 32)) but {b} has K = 32 (shape (8, 32))"
    assert info.value.help.startswith(f"{b} is stored ")
