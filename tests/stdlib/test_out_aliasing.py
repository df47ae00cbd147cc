"""``out=`` of sparse_matmul and sparse_linear against the memory of their own inputs and of itself,
in the interpreter (which runs on numpy arrays and torch CPU tensors in place, as the GPU runs on
device memory): random non-zero operands, poisoned outputs, float64 references.

* An out that shares memory with an operand (b or x, values, the metadata words, bias and scales;
  the operand itself, a view over part of it, reversed) gets the product of the operands as
  passed: C goes to a new array, then into out.
* An out whose own elements share memory (a zero stride, rows of an ``as_strided`` view that
  overlap) is refused before anything runs (SP0804): copying C into it would keep one of the
  results written to each shared address. It used to be filled silently, and a zero-stride or
  read-only out that also overlapped an operand skipped those checks.
* ``plan.rebind(x, out)`` checks out against the scale_x the plan keeps (it checked only a new one)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import plan_sparse_linear, prune_and_compress, sparse_linear, sparse_matmul
from sparsile.stdlib.kernels.linear import reference_linear
from sparsile.stdlib.sparsity import SparsityError

torch = pytest.importorskip("torch")


def matmul_problem(m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), "f16")
    b = rng.standard_normal((n, k)).astype(np.float16)
    return weight, b


def product(weight, b) -> tuple[np.ndarray, np.ndarray]:
    """The float64 product of the pruned weight and b (N, K), and sum |a||b| (the error scale)."""
    a64, b64 = weight.dense().astype(np.float64), np.asarray(b).astype(np.float64)
    return a64 @ b64.T, np.abs(a64) @ np.abs(b64).T


def assert_product(c, ref: tuple[np.ndarray, np.ndarray]) -> None:
    """C within f32 accumulation and one float16 rounding of the float64 result (a wrong result is
    off by the size of the products, far beyond)."""
    exact, scale = ref
    c64 = np.asarray(c).astype(np.float64)
    assert not np.isnan(c64).any(), "unwritten outputs"
    err = np.abs(c64 - exact)
    bound = 2.0 ** -10 * (np.abs(exact) + scale) + 2.0 ** -20
    assert (err <= bound).all(), f"max error {err.max()}"


# ------------------------------------------------------------------------------------------------
# out that overlaps itself


def overlapping_rows(kind: str, m: int, n: int):
    """A writable (m, n) float16 view, poisoned, whose row i starts n / 2 elements after row i - 1."""
    if kind == "numpy":
        base = np.full(m * n, np.nan, np.float16)
        return base, np.lib.stride_tricks.as_strided(base, (m, n), (n, 2))
    base = torch.full((m * n,), float("nan"), dtype=torch.float16)
    return base, base.as_strided((m, n), (n // 2, 1))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sparse_matmul_refuses_an_out_whose_rows_overlap(kind: str) -> None:
    """C copied into such a view left each shared element with one row's result: C[1, 0] held
    C[0, n / 2], a silently wrong product (max error 37 here)."""
    weight, b = matmul_problem(64, 64, 64, seed=1)
    base, out = overlapping_rows(kind, 64, 64)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True)
    assert info.value.code == "SP0804"
    assert info.value.message == ("out's elements overlap in memory (shape (64, 64), byte strides (64, 2)): C "
                                  "has one result per element, and a copy into out would keep only one of those "
                                  "written to each shared address")
    assert info.value.help == "pass an array whose elements are distinct (a new array, or a slice of one)"
    assert np.isnan(np.asarray(base, np.float64)).all()  # nothing was written


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_sparse_linear_refuses_an_out_whose_rows_overlap(kind: str) -> None:
    rng = np.random.default_rng(2)
    weight = prune_and_compress(rng.standard_normal((64, 64)).astype(np.float32), "f16")
    x = rng.standard_normal((96, 64)).astype(np.float16)
    for kernel in ("gemm", "decode"):
        xs = x if kernel == "gemm" else x[:32]
        base, out = overlapping_rows(kind, len(xs), 64)
        with pytest.raises(SparsityError) as info:
            sparse_linear(weight.values, weight.meta, xs if kind == "numpy" else torch.from_numpy(xs), out=out,
                          interpret=True, kernel=kernel)
        assert info.value.code == "SP0804"
        assert info.value.message.startswith(f"out's elements overlap in memory (shape ({len(xs)}, 64)")
        assert np.isnan(np.asarray(base, np.float64)).all()


def test_an_out_of_interleaved_distinct_elements_is_written() -> None:
    """Strides that interleave without sharing an element (element strides (2, 3): offsets 2i + 3j
    are distinct for j in {0, 1}) are no overlap: the exact check lets them through."""
    weight, b = matmul_problem(40, 2, 64, seed=3)
    base = np.full(200, np.nan, np.float16)
    out = np.lib.stride_tricks.as_strided(base, (40, 2), (4, 6))
    assert sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True) is out
    assert_product(out, product(weight, b))


def test_self_overlap_check() -> None:
    from sparsile.frontend.interp.overlap import self_overlapping

    assert not self_overlapping((4, 6), (12, 2), 2)      # row-major
    assert not self_overlapping((4, 3), (12, -4), 2)     # a reversed, strided slice
    assert not self_overlapping((6, 4), (2, 12), 2)      # transposed
    assert not self_overlapping((40, 2), (4, 6), 2)      # interleaved, distinct (the exact check)
    assert not self_overlapping((1, 5), (0, 2), 2) and not self_overlapping((0, 5), (0, 0), 2)
    assert self_overlapping((4, 6), (0, 2), 2)           # a zero stride
    assert self_overlapping((4, 6), (6, 2), 2)           # rows overlapping by half
    assert self_overlapping((3, 2), (4, 3), 4)           # elements 3 bytes apart share bytes
    assert self_overlapping((3000, 3000), (2, 4), 2)     # too many to check exactly: taken as overlapping


# ------------------------------------------------------------------------------------------------
# an out that is also an operand's memory: still checked like any out


def test_a_zero_stride_out_over_b_is_refused_before_the_launch() -> None:
    """The check of a zero stride came after the one that sends an aliased out through a copy, so an
    out of b's memory with a zero row stride skipped it: C's rows all landed on b's first row."""
    weight, b = matmul_problem(64, 64, 64, seed=4)
    before = b.copy()
    out = np.lib.stride_tricks.as_strided(b, (64, 64), (0, 2))
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True)
    assert info.value.code == "SP0804"
    assert info.value.message.startswith("out has a zero stride (strides (0, 2)): its rows or columns share memory")
    np.testing.assert_array_equal(b, before)


def test_a_read_only_out_over_b_is_refused_before_the_launch() -> None:
    """It was found only by numpy's assignment into it, after the kernel had run."""
    weight, b = matmul_problem(64, 64, 64, seed=5)
    out = b.view()
    out.setflags(write=False)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True)
    assert info.value.code == "SP0804"
    assert info.value.message == "out is a read-only array"


# ------------------------------------------------------------------------------------------------
# an out over an operand's memory gets the product of the operands as passed


def test_out_over_part_of_b_gets_the_product_of_b_as_passed() -> None:
    """out = b shifted by one row (M = N = K): the interpreter reads b in place, so C stored there
    while b is read would feed later tiles the results of earlier ones."""
    weight, b0 = matmul_problem(256, 256, 256, seed=6)
    ref = product(weight, b0)
    base = np.concatenate([b0, np.zeros((1, 256), np.float16)])
    out = base[1:]
    assert sparse_matmul(weight.values, weight.meta, base[:256], out=out, interpret=True, split_k=1) is out
    assert_product(out, ref)


def test_out_over_reversed_b_with_split_k() -> None:
    weight, b0 = matmul_problem(256, 256, 256, seed=7)
    ref = product(weight, b0)
    b = b0.copy()
    out = b[::-1]
    assert sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True, split_k=2, kernel="gemm") is out
    assert_product(out, ref)


def test_out_over_the_metadata_words() -> None:
    """Raw metadata words in a buffer that out also covers (the words are read per K step)."""
    weight, b = matmul_problem(128, 128, 256, seed=8)
    ref = product(weight, b)
    words = np.asarray(weight.meta.data)  # (128, 8) uint32: 4096 bytes
    buf = np.zeros(128 * 128, np.float16)
    buf.view(np.uint32)[:words.size] = words.reshape(-1)
    raw = buf.view(np.uint32)[:words.size].reshape(words.shape)
    out = buf.reshape(128, 128)
    assert sparse_matmul(weight.values, raw, b, out=out, interpret=True, kernel="gemm") is out
    assert_product(out, ref)


@pytest.mark.parametrize("kernel", ["gemm", "decode"])
def test_sparse_linear_out_over_x(kernel: str) -> None:
    rng = np.random.default_rng(9)
    weight = prune_and_compress(rng.standard_normal((256, 256)).astype(np.float32), "f16")
    x = rng.standard_normal((96 if kernel == "gemm" else 32, 256)).astype(np.float16)
    bias = rng.standard_normal(256).astype(np.float32)
    ref = reference_linear(weight.dense(), x, bias=bias)
    scale = np.abs(weight.dense().astype(np.float64)) @ np.abs(x.astype(np.float64)).T
    xx = x.copy()
    assert sparse_linear(weight.values, weight.meta, xx, bias=bias, out=xx, interpret=True, kernel=kernel) is xx
    assert_product(xx, (ref, scale.T + np.abs(bias)))


# ------------------------------------------------------------------------------------------------
# rebind


@pytest.mark.parametrize("kernel", ["gemm", "decode"])
def test_rebind_checks_out_against_the_scale_x_the_plan_keeps(kernel: str) -> None:
    """scale_x (T,) f32 is read in place; a rebind without a new scale_x keeps it, and an out over
    its memory was written in place: the second row-block of features read scales the first had
    overwritten (errors in the hundreds here)."""
    rng = np.random.default_rng(10)
    t = 96 if kernel == "gemm" else 32
    weight = prune_and_compress(rng.standard_normal((256, 64)).astype(np.float32), "f16")
    x, x2 = (rng.standard_normal((t, 64)).astype(np.float16) for _ in range(2))
    buf = np.full(t * 256, np.nan, np.float32)
    scale_x = buf[:t]
    scale_x[...] = rng.uniform(0.5, 1.5, t).astype(np.float32)
    sx = scale_x.copy()
    ref = reference_linear(weight.dense(), x2, scale_x=sx)
    plan = plan_sparse_linear(weight.values, weight.meta, x, scale_x=scale_x, out_dtype="float32", interpret=True,
                              kernel=kernel)
    out = buf.reshape(t, 256)
    rebound = plan.rebind(x2, out=out)
    scale = (np.abs(weight.dense().astype(np.float64)) @ np.abs(x2.astype(np.float64)).T).T * sx[:, None]
    assert_product(rebound.run(), (ref, scale))
    assert rebound.out is not out  # C went to a new array (sparse_linear would copy it into out)
