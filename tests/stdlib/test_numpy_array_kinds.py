"""Unusual numpy arrays handed to the sparsity toolkit and to ``sparse_matmul``: byte-swapped
dtypes, subclasses (``np.matrix``, masked arrays). Random non-zero operands, poisoned outputs,
float64 references.

* Byte-swapped metadata words (``dtype('>u4')``, ``'>i4'``), raw or in a ``MetadataBuffer``, were
  read as raw little-endian bits: ``validate_metadata`` passed them, while ``decode_metadata`` and
  ``decompress`` returned other indices and another matrix, silently. They are now converted to the
  machine's byte order (:func:`~sparsile.stdlib.sparsity.hostarray.plain_array`), as are byte-swapped
  values (``decompress`` refused ``'>f2'`` values of an f16 operand as "not float16").
* A masked array with masked elements was read as if unmasked (the values under the mask pruned,
  compressed and multiplied): SP0804 now; one without masked elements is its data.
* The block-scale toolkit (``quantize_mx``, ...) read masked arrays through ``np.asarray``: refused too.
* The GPU toolkit (``compress_gpu``, ...) took numpy inputs as given: byte-swapped ones refused
  where the host toolkit converts them, masked ones read as if unmasked.
* Integer pruning took |x| in int64: |int64 min| and uint64 values from 2**63 up wrapped negative,
  so the largest magnitudes of a group were dropped.
* A byte-swapped numpy bias of ``sparse_linear`` with a torch CUDA x reached the device as other
  numbers (``copy_like`` copied its bits).
* ``sparse_linear``'s y took bfloat16 for a byte-swapped float16 (or float32) x, not x's type.
* An ``np.matrix`` out of ``sparse_matmul(..., interpret=True)`` failed inside the interpreter
  (an internal compiler error); a byte-swapped numpy out (``'>f2'``) was refused as not float16.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import prune_and_compress, sparse_linear, sparse_matmul
from sparsile.stdlib.sparsity import (
    MetadataBuffer,
    SparsityError,
    compress,
    decode_metadata,
    decompress,
    encode_metadata,
    prune_2_4,
    prune_mask_2_4,
    prune_mask_4_8_pairs,
    validate_metadata,
)

M, K = 64, 96


def pruned(seed: int, dtype=np.float16) -> np.ndarray:
    """A random 2:4-pruned (M, K) matrix without zeros among its kept elements."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, (M, K)) * rng.choice([-1.0, 1.0], (M, K))
    return prune_2_4(w.astype(dtype))


@pytest.mark.parametrize("fmt", ["sm90", "tcgen05"])
@pytest.mark.parametrize("swapped", [">u4", ">i4"])
def test_byte_swapped_metadata_words_decode_to_the_same_matrix(fmt: str, swapped: str) -> None:
    w = pruned(1)
    values, indices = compress(w)
    words = np.asarray(encode_metadata(indices, fmt, "f16"))
    other = words.astype(swapped)  # the same numbers, the other byte order
    assert not np.array_equal(other.view(np.uint32), words)  # (read as raw bits they are other words)
    raw = dict(fmt=fmt, dtype="f16", m=M, k=K)
    assert np.array_equal(decompress(values, other, **raw), w)
    assert np.array_equal(decode_metadata(other, **raw), indices)
    validate_metadata(other, **raw)
    buffer = MetadataBuffer(other, fmt, "f16", M, K)
    assert buffer.data.dtype == np.uint32 if swapped == ">u4" else buffer.data.dtype.isnative
    assert np.array_equal(decompress(values, buffer), w)
    assert np.array_equal(decode_metadata(buffer), indices)


def test_byte_swapped_values_decompress_and_compress_as_their_numbers() -> None:
    w = pruned(2)
    values, indices = compress(w)
    meta = encode_metadata(indices, "sm90", "f16")
    assert np.array_equal(decompress(values.astype(">f2"), meta), w)
    values2, indices2 = compress(w.astype(">f2"))  # (the operand type told from a byte-swapped float16)
    assert values2.dtype == np.float16 and np.array_equal(values2, values) and np.array_equal(indices2, indices)


def test_masked_arrays_with_masked_elements_are_refused() -> None:
    w = pruned(3).astype(np.float32)
    mask = np.zeros(w.shape, bool)
    mask[3, 5] = mask[7, 1] = True
    masked = np.ma.array(w, mask=mask)
    with pytest.raises(SparsityError) as info:
        prune_and_compress(masked, "f16")
    assert info.value.code == "SP0804"
    assert "weight is a masked array with 2 masked elements" in str(info.value)
    assert "weight.filled(value)" in info.value.help
    with pytest.raises(SparsityError) as info:
        compress(masked, "f16")
    assert info.value.code == "SP0804" and "w is a masked array with 2 masked elements" in str(info.value)
    unmasked = np.ma.array(w, mask=np.zeros(w.shape, bool))  # no element masked: its data
    got, want = compress(unmasked, "f16"), compress(w, "f16")
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def matmul_case(seed: int, n: int):
    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((M, K)), "f16")
    x = rng.standard_normal((n, K)).astype(np.float16)
    exact = weight.dense().astype(np.float64) @ x.astype(np.float64).T
    scale = np.abs(weight.dense().astype(np.float64)) @ np.abs(x.astype(np.float64)).T
    return weight, x, (exact, scale)


def assert_product(c, ref) -> None:
    exact, scale = ref
    c64 = np.asarray(c).astype(np.float64)
    assert not np.isnan(c64).any(), "unwritten outputs"
    err = np.abs(c64 - exact)
    assert (err <= 2.0 ** -10 * (np.abs(exact) + scale) + 2.0 ** -20).all(), f"max error {err.max()}"


@pytest.mark.parametrize("n", [8, 80])  # the decode kernel (N <= 64) and the tiled GEMM
def test_sparse_matmul_byte_swapped_operands_and_out(n: int) -> None:
    weight, x, ref = matmul_case(4, n)
    words = np.asarray(weight.meta).astype(">u4")
    out = np.full((M, n), np.nan, ">f2")
    got = sparse_matmul(weight.values.astype(">f2"), words, x.astype(">f4"), out=out, interpret=True)
    assert got is out
    assert_product(out, ref)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("n", [8, 80])
def test_sparse_matmul_into_a_matrix_out(n: int) -> None:
    weight, x, ref = matmul_case(5, n)
    out = np.asmatrix(np.full((M, n), np.nan, np.float16))
    got = sparse_matmul(weight.values, weight.meta, np.asmatrix(x), out=out, interpret=True)
    assert got is out
    assert_product(out, ref)


def test_sparse_matmul_refuses_masked_operands_and_out() -> None:
    weight, x, ref = matmul_case(6, 8)
    mask = np.zeros(x.shape, bool)
    mask[0, 0] = True
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, np.ma.array(x, mask=mask), interpret=True)
    assert info.value.code == "SP0804" and "b is a masked array with 1 masked elements" in str(info.value)
    out_mask = np.zeros((M, 8), bool)
    out_mask[2, 3] = True
    out = np.ma.array(np.full((M, 8), np.nan, np.float16), mask=out_mask)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, x, out=out, interpret=True)
    assert info.value.code == "SP0804"
    assert "out is a masked array with 1 masked elements: C would be written under the mask" in str(info.value)
    assert np.isnan(out.data.astype(np.float64)).all()  # (refused before anything ran)
    plain_out = np.ma.array(np.full((M, 8), np.nan, np.float16), mask=np.zeros((M, 8), bool))
    sparse_matmul(weight.values, weight.meta, x, out=plain_out, interpret=True)
    assert_product(plain_out.data, ref)


@pytest.mark.parametrize("t", [4, 80])  # the decode kernel (T <= 64) and the tiled one
@pytest.mark.parametrize("swapped", [">f2", ">f4"])
def test_sparse_linear_y_takes_a_byte_swapped_x_type(t: int, swapped: str) -> None:
    """y's default type is x's: a byte-swapped float16 x gave a bfloat16 y (its dtype's string,
    ``'>f2'``, was not among the names looked up)."""
    rng = np.random.default_rng(7)
    weight = prune_and_compress(rng.standard_normal((M, K)), "f16")
    x = rng.standard_normal((t, K)).astype(swapped)
    bias = rng.standard_normal(M).astype(">f4")
    y = sparse_linear(weight.values, weight.meta, x, bias=bias, interpret=True)
    assert y.dtype == np.dtype(swapped).newbyteorder("=")
    dense, x64 = weight.dense().astype(np.float64), x.astype(np.float16).astype(np.float64)
    exact = x64 @ dense.T + bias.astype(np.float64)
    scale = np.abs(x64) @ np.abs(dense).T + np.abs(bias.astype(np.float64))
    err = np.abs(y.astype(np.float64) - exact)
    assert (err <= 2.0 ** -10 * scale + 2.0 ** -20).all(), f"max error {err.max()}"


def test_block_scale_toolkit_refuses_masked_elements() -> None:
    """quantize_mx read a masked array through np.asarray, which drops the mask: the block scale of
    a block came from a masked (e.g. garbage) element."""
    from sparsile.stdlib import blockscale

    rng = np.random.default_rng(8)
    x = rng.uniform(-2, 2, (4, 64))
    mask = np.zeros(x.shape, bool)
    mask[1, 10] = True
    with pytest.raises(blockscale.BlockScaleError) as info:
        blockscale.quantize_mx(np.ma.array(x, mask=mask))
    assert info.value.code == blockscale.SP_BLOCK_SCALE_INPUT
    assert "x is a masked array with 1 masked elements" in str(info.value)
    values, scales = blockscale.quantize_mx(np.ma.array(x, mask=np.zeros(x.shape, bool)))
    want_values, want_scales = blockscale.quantize_mx(x)
    assert np.array_equal(scales, want_scales) and np.array_equal(values, want_values)


def test_gpu_toolkit_reads_numpy_inputs_as_the_host_toolkit_does() -> None:
    """The GPU toolkit (run here in the interpreter) took numpy inputs as they were: byte-swapped
    ones were refused ("cannot tell the sparse operand type of >f2", "uint32 words, found >u4")
    where the host toolkit converts them, and masked ones were read as if unmasked."""
    from sparsile.stdlib.kernels import sparsity_gpu

    rng = np.random.default_rng(9)
    w = (rng.uniform(0.5, 2.0, (32, 64)) * rng.choice([-1.0, 1.0], (32, 64))).astype(np.float16)
    values, indices = compress(w, prune=True)
    words = np.asarray(encode_metadata(indices, "sm90", "f16"))
    got = sparsity_gpu.compress_gpu(w.astype(">f2"), interpret=True)
    assert np.array_equal(np.asarray(got.values), values)
    dense = sparsity_gpu.decompress_gpu(values.astype(">f2"), words.astype(">u4"), "sm90", "f16", m=32, k=64,
                                        interpret=True)
    assert np.array_equal(np.asarray(dense), prune_2_4(w))
    mask = np.zeros(w.shape, bool)
    mask[0, 0] = True
    with pytest.raises(SparsityError) as info:
        sparsity_gpu.prune_gpu(np.ma.array(w, mask=mask), interpret=True)
    assert info.value.code == "SP0804" and "w is a masked array with 1 masked elements" in str(info.value)


def python_keep_mask(w: np.ndarray, group: int, keep: int, unit: int = 1) -> np.ndarray:
    """The pruning rule on Python integers: per group, the ``keep`` units of largest |a| (+ |b| of a
    pair), ties to the lower index."""
    out = np.zeros(w.shape, bool)
    for r in range(w.shape[0]):
        for g in range(0, w.shape[1], group):
            keys = [sum(abs(int(v)) for v in w[r, g + u:g + u + unit]) for u in range(0, group, unit)]
            kept = sorted(range(len(keys)), key=lambda i: (-keys[i], i))[:keep]
            for i in kept:
                out[r, g + i * unit:g + (i + 1) * unit] = True
    return out


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32])
def test_integer_pruning_orders_the_widest_magnitudes_exactly(dtype) -> None:
    """|x| of integers was taken in int64: |int64 min| and uint64 values from 2**63 up wrapped to
    negative numbers, and pruning dropped the largest magnitudes of a group, silently."""
    rng = np.random.default_rng(10)
    info = np.iinfo(dtype)
    extremes = np.array([info.min, info.max, info.min + 1, info.max - 1, info.max // 2 + 1], dtype=dtype)
    w = rng.integers(info.min, info.max, (16, 32), dtype=dtype, endpoint=True)
    w.flat[rng.choice(w.size, 160, replace=False)] = rng.choice(extremes, 160)  # (ties among them too)
    assert np.array_equal(prune_mask_2_4(w), python_keep_mask(w, 4, 2))
    assert np.array_equal(prune_2_4(w), np.where(python_keep_mask(w, 4, 2), w, 0))
    assert np.array_equal(prune_mask_4_8_pairs(w), python_keep_mask(w, 8, 2, unit=2))


def test_a_byte_swapped_bias_reaches_a_torch_launch_as_its_values() -> None:
    """sparse_linear's bias (and scales) of numpy with torch CUDA x are copied to x's device through
    an integer view of their bits (``copy_like``): a byte-swapped bias arrived as other numbers
    (0.5 as 8.8e-44), silently. Planned here as on a GPU (``host_tensors_as_device``)."""
    torch = pytest.importorskip("torch")
    from sparsile.stdlib.kernels.arrays import copy_like, host_tensors_as_device
    from sparsile.stdlib.kernels.linear_args import bias_or_scale

    rng = np.random.default_rng(12)
    bias = rng.uniform(-4, 4, 16).astype(np.float32)
    home = torch.zeros(2, 16)
    with host_tensors_as_device():
        got, mode = bias_or_scale(bias.astype(">f4"), "bias", 16, home, False, ("float32", "float16"))
    assert mode == 2 and isinstance(got, torch.Tensor)
    assert np.array_equal(got.numpy(), bias)
    half = bias.astype(np.float16)
    assert np.array_equal(copy_like(half.astype(">f2"), home).numpy(), half)  # (copy_like itself too)
