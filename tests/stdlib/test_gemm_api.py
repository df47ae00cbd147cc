"""sparsile.stdlib.kernels: sparse_matmul / prune_and_compress in the interpreter against float64
references (random, ragged, K padded), argument checking (each a SparsityError with its code),
the launch plan (kernel, BN, grid, padding) compiled for sm_90a, and GPU runs (marked gpu)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsile.frontend.diagnostics import LaunchError
from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import (
    KERNELS,
    CompressedWeight,
    plan_sparse_matmul,
    prune_and_compress,
    sparse_linear,
    sparse_matmul,
)
from sparsile.stdlib.sparsity import SparsityError

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "s8": np.int8,
        "tf32": np.float32}
OUT = {"f16": np.float16, "bf16": np.float16, "e4m3": np.float16, "s8": np.int32, "tf32": np.float32}


def problem(dtype: str, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "s8":
        w = rng.integers(-60, 60, (m, k)).astype(np.int8)
        b = rng.integers(-60, 60, (n, k)).astype(np.int8)
    else:
        w = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32).astype(HOST[dtype])
    return prune_and_compress(w, dtype), b


def reference(weight: CompressedWeight, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 C and sum |a||b| (the scale of accumulation errors) from the dense pruned operands."""
    a64, b64 = weight.dense().astype(np.float64), b.astype(np.float64)
    return a64 @ b64.T, np.abs(a64) @ np.abs(b64).T


def assert_close(c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, k: int, dtype: str) -> None:
    """Within output rounding plus accumulation error. s8 is exact (int32 accumulation). Otherwise:
    f32 accumulation (at most K·2^-23·Σ|ab| for any summation order); Hopper's ~14-bit e4m3
    accumulator ((K/64 + 1)·2^-13·Σ|ab|, DeepSeek-V3 report §3.3.2); tf32 inputs keep 10 mantissa
    bits, truncated or rounded (2^-9·Σ|ab|); then one rounding to the output type (half an ulp:
    2^-11 relative for f16, 2^-24 for f32, plus the f16 subnormal spacing)."""
    assert c.dtype == OUT[dtype]
    c64 = c.astype(np.float64)
    assert not np.isnan(c64).any(), "unwritten outputs"
    if dtype == "s8":
        np.testing.assert_array_equal(c64, ref)
        return
    acc = max(k, 1) * 2.0 ** -23 * absprod
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * absprod
    if dtype == "tf32":
        acc = acc + 2.0 ** -9 * absprod
    out_ulp = 2.0 ** -24 if dtype == "tf32" else 2.0 ** -11
    bound = acc + out_ulp * (np.abs(ref) + acc) + 2.0 ** -24
    err = np.abs(c64 - ref)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


# ------------------------------------------------------------------------------------------------
# numerics in the interpreter


@pytest.mark.parametrize("dtype,m,n,k", [
    ("f16", 200, 130, 192),   # ragged M and N, two M tiles
    ("f16", 33, 17, 36),      # K = 36: values and b padded to 48
    ("bf16", 70, 40, 100),
    ("e4m3", 64, 20, 100),    # 8-bit: K padded to 128
    ("s8", 40, 24, 64),       # exact int32 accumulation
    ("tf32", 40, 24, 50),     # 1:2 sparsity, K padded to 56
])
def test_interpreter_matches_float64_reference(dtype, m, n, k):
    weight, b = problem(dtype, m, n, k, seed=m + n + k)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    assert c.shape == (m, n)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["f16", "bf16", "e4m3"]), st.integers(1, 150), st.integers(1, 300), st.integers(1, 140),
       st.integers(0, 2**32 - 1))
def test_any_shape_matches_reference(dtype, m, n, k, seed):
    weight, b = problem(dtype, m, n, k, seed)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.parametrize("dtype,m,n,k,split", [("f16", 130, 40, 512, 3), ("s8", 64, 32, 512, 2),
                                               ("tf32", 40, 24, 200, 2), ("bf16", 70, 20, 192, 4)])
def test_split_k_matches_float64_reference(dtype, m, n, k, split):
    """Shares of K in an f32 (s8: int32, exact) workspace, added by splitk_reduce; the last share of
    bf16's 3 steps over 4 shares is empty."""
    weight, b = problem(dtype, m, n, k, seed=m * n + k)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=split)
    assert plan.grid[1] == split and plan.workspace.shape == (split, m, n)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=split)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.parametrize("dtype,m,n,k", [("f16", 1000, 90, 192), ("e4m3", 1040, 70, 256)])
def test_pair_kernel_for_large_c_matches_float64_reference(dtype, m, n, k):
    """With few SMs even a small C has PAIR_MIN_TILES_PER_SM tiles per SM: the CTA-pair kernel
    (B multicast) runs, persistent on two CTAs, through sparse_matmul."""
    weight, b = problem(dtype, m, n, k, seed=m + k)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, num_sms=2)
    assert plan.pair_ctas == 2 and plan.grid == (2, 1) and plan.kernel.name.removesuffix("_mt").endswith("_pair")
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, num_sms=2)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.parametrize("m,n,k,dtype,sms,persistent,split,pair", [
    (8192, 8192, 8192, "f16", 132, True, 1, 132),    # 2048 tiles: pairs on every SM
    (8192, 8192, 8192, "f16", 133, True, 1, 132),    # an even grid
    (8192, 8192, 8192, "f16", 132, False, 1, 0),     # persistent=False: one CTA per tile
    (8192, 8192, 8192, "s8", 132, True, 1, 0),       # no pair kernel for s8
    (4096, 4096, 4096, "f16", 132, True, 1, 0),      # 512 tiles: fewer than 4 per SM
    (1000, 600, 768, "f16", 2, True, 3, 0),          # split-K
    (600, 256, 512, "bf16", 2, True, 1, 0),          # 5 tiles: fewer than 4 x 2 SMs
])
def test_pair_kernel_choice(m, n, k, dtype, sms, persistent, split, pair):
    from sparsile.stdlib.kernels.gemm import pair_ctas
    from sparsile.stdlib.kernels.gemm_choice import KERNELS as CHOICES

    choice = CHOICES[dtype]
    assert pair_ctas(m, n, choice.block_n(n), choice, split, persistent, sms) == pair


@pytest.mark.parametrize("m,n,k,dtype,sms,split", [
    (4096, 128, 14336, "f16", 132, 4),    # 32 tiles: 132 // 32 = 4 shares of 56 steps
    (1000, 600, 768, "f16", 132, 3),      # 24 tiles, 12 K steps: at least 4 steps per share
    (8192, 8192, 8192, "f16", 132, 1),    # 2048 tiles
    (28672, 16, 8192, "f16", 132, 1),     # 224 tiles
    (128, 16, 65536, "e4m3", 132, 8),     # 1 tile: at most 8 shares
    (256, 256, 256, "f16", 132, 1),       # 4 K steps: no share would have 4
])
def test_choose_split_k(m, n, k, dtype, sms, split):
    from sparsile.stdlib.kernels.gemm import choose_split_k

    choice = KERNELS[dtype]
    assert choose_split_k(m, n, k, choice.block_n(n), choice, sms) == split


def test_split_k_must_be_a_small_positive_integer():
    weight, b = problem("f16", 32, 16, 64, seed=1)
    for bad in (0, 65, 2.5):
        with pytest.raises(SparsityError, match="split_k must be an integer from 1 to 64"):
            plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=bad)


def test_float32_inputs_are_cast_to_the_operand_type():
    weight, b = problem("f16", 64, 48, 64, seed=1)
    c32 = sparse_matmul(weight.values.astype(np.float32), weight.meta, b.astype(np.float32), interpret=True)
    c16 = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    np.testing.assert_array_equal(c32, c16)  # the metadata's tag (f16) picks the kernel; inputs are cast


def test_raw_metadata_words_uint32_and_int32():
    weight, b = problem("bf16", 48, 40, 64, seed=2)
    words = np.asarray(weight.meta)
    c_tagged = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    c_u32 = sparse_matmul(weight.values, words, b, interpret=True)
    c_i32 = sparse_matmul(weight.values, words.view(np.int32), b, interpret=True)
    np.testing.assert_array_equal(c_u32, c_tagged)
    np.testing.assert_array_equal(c_i32, c_tagged)


def test_values_padded_by_the_caller_need_b_padded_alike():
    """Values compressed from a weight zero-padded to the TMA granularity (as the sweep does) have
    the padded K: b padded the same way is accepted, the unpadded b is refused (its K differs from
    the metadata's, the same shape as a b that silently drops weight columns: issue 15)."""
    rng = np.random.default_rng(3)
    w = S.prune_2_4(rng.standard_normal((40, 36)).astype(np.float32)).astype(np.float16)
    wp = np.zeros((40, 48), np.float16)
    wp[:, :36] = w
    values, idx = S.compress(wp, "f16")
    meta = S.encode_metadata(idx, "sm90", "f16")
    b = rng.standard_normal((20, 36)).astype(np.float16)
    bp = np.zeros((20, 48), np.float16)
    bp[:, :36] = b
    c = sparse_matmul(values, meta, bp, interpret=True)
    ref = w.astype(np.float64) @ b.astype(np.float64).T
    assert np.abs(c - ref).max() <= 2.0 ** -10 * np.abs(ref).max() + 1e-2
    for m in (meta, meta.data):
        with pytest.raises(SparsityError) as info:
            plan_sparse_matmul(values, m, b, interpret=True)
        assert info.value.code == "SP0815"


def test_out_is_written_and_returned():
    weight, b = problem("f16", 40, 30, 64, seed=4)
    out = np.full((40, 30), np.nan, np.float16)
    c = sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True)
    assert c is out
    np.testing.assert_array_equal(out, sparse_matmul(weight.values, weight.meta, b, interpret=True))
    strided = np.full((40, 60), np.nan, np.float16)[:, ::2]  # not contiguous: filled by a copy
    assert sparse_matmul(weight.values, weight.meta, b, out=strided, interpret=True) is strided
    np.testing.assert_array_equal(strided, out)


@pytest.mark.parametrize("what", ["b", "values"])
def test_out_that_shares_memory_with_an_operand_gets_the_product_of_the_operands_as_passed(what):
    """The interpreter runs on numpy arrays in place: out=b (M = N = K) or out=values (N = K/2), with
    two N or M tiles and no split-K workspace, had later tiles read the C that earlier ones stored
    over the operand."""
    m, n, k = (256, 256, 256) if what == "b" else (128, 320, 640)
    weight, b0 = problem("f16", m, n, k, seed=11)
    ref, absprod = reference(weight, b0)
    values, b = np.array(weight.values), b0.copy()
    out = b if what == "b" else values
    assert sparse_matmul(values, weight.meta, b, out=out, interpret=True, split_k=1) is out
    assert_close(out, ref, absprod, k, "f16")


def test_a_numpy_out_that_is_the_memory_of_a_torch_cpu_b_gets_the_product_of_b_as_passed():
    """b a torch CPU tensor over the numpy array passed as out (M = N = K): the interpreter reads
    b's memory in place, so C must not be stored there while b is read."""
    torch = pytest.importorskip("torch")
    weight, b0 = problem("f16", 256, 256, 256, seed=12)
    ref, absprod = reference(weight, b0)
    b = b0.copy()
    assert sparse_matmul(weight.values, weight.meta, torch.from_numpy(b), out=b, interpret=True, split_k=1) is b
    assert_close(b, ref, absprod, 256, "f16")


def test_empty_problems():
    weight, b = problem("f16", 5, 4, 8, seed=5)
    assert sparse_matmul(weight.values, weight.meta, b[:0], interpret=True).shape == (5, 0)
    empty_k = sparse_matmul(np.zeros((5, 0), np.float16), np.zeros((16, 0), np.uint32), np.zeros((4, 0), np.float16),
                            interpret=True)
    np.testing.assert_array_equal(empty_k, np.zeros((5, 4), np.float16))


# ------------------------------------------------------------------------------------------------
# prune_and_compress


@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3", "s8", "tf32"])
def test_prune_and_compress_gives_the_toolkit_result(dtype):
    rng = np.random.default_rng(6)
    w = rng.standard_normal((24, 40)).astype(np.float32) * (30 if dtype == "s8" else 1)
    values, meta = prune_and_compress(w, dtype)
    pruned = S.prune(w, dtype).astype(HOST[dtype])  # pruned in float32, then cast (issue 15)
    assert meta.fmt == "sm90" and meta.dtype == dtype and (meta.m, meta.k) == (24, 40)
    np.testing.assert_array_equal(CompressedWeight(values, meta).dense().astype(np.float64),
                                  pruned.astype(np.float64))
    kept = 1 if dtype == "tf32" else 2
    group = 2 if dtype == "tf32" else 4
    assert (np.count_nonzero(pruned.reshape(24, -1, group), axis=-1) <= kept).all()


def test_prune_and_compress_rejects_non_matrices():
    with pytest.raises(SparsityError) as e:
        prune_and_compress(np.ones(8, np.float32), "f16")
    assert e.value.code == "SP0804"


# ------------------------------------------------------------------------------------------------
# argument checking


def _codes(fn) -> str:
    with pytest.raises(SparsityError) as e:
        fn()
    return e.value.code


def test_argument_errors_have_codes():
    weight, b = problem("f16", 40, 24, 64, seed=7)
    v, meta = weight.values, weight.meta
    assert _codes(lambda: sparse_matmul(v, meta, b[:, :32], interpret=True)) == "SP0815"   # K mismatch
    assert _codes(lambda: sparse_matmul(v, meta, b.T, interpret=True)) == "SP0815"         # b not N x K
    assert _codes(lambda: sparse_matmul(v[0], meta, b, interpret=True)) == "SP0804"        # 1-D values
    assert _codes(lambda: sparse_matmul(v, meta, b, dtype="e5m2", interpret=True)) == "SP0804"  # no kernel
    assert _codes(lambda: sparse_matmul(v, meta, b, dtype="f64", interpret=True)) == "SP0801"   # unknown type
    assert _codes(lambda: sparse_matmul(v, meta, b, out=np.empty((40, 24), np.float32),
                                        interpret=True)) == "SP0804"                       # out dtype
    assert _codes(lambda: sparse_matmul(v, meta, b, out=np.empty((24, 40), np.float16),
                                        interpret=True)) == "SP0804"                       # out shape
    words = np.asarray(meta)
    assert _codes(lambda: sparse_matmul(v, words[:16], b, interpret=True)) == "SP0805"     # too few rows
    assert _codes(lambda: sparse_matmul(v, words.astype(np.float32), b, interpret=True)) == "SP0806"
    bad = words.copy()
    bad[3, 1] &= ~np.uint32(0xF)  # nibble 0x0: an index used twice
    assert _codes(lambda: sparse_matmul(v, bad, b, interpret=True)) == "SP0807"


def test_values_of_another_narrow_type_than_the_buffers_tag_are_refused():
    """f16 values with a bf16-tagged MetadataBuffer would run as bf16 (bits lost, silently): SP0804
    naming both types; dtype= says which to run; float32 values take the tag's type."""
    weight, b = problem("bf16", 40, 24, 64, seed=8)
    f16_values = np.asarray(weight.values).astype(np.float32).astype(np.float16)
    with pytest.raises(SparsityError) as e:
        sparse_matmul(f16_values, weight.meta, b.astype(np.float16), interpret=True)
    assert str(e.value).split("\n")[0] == ("error[SP0804]: the values are f16 but the MetadataBuffer was encoded "
                                            "for bf16 operands")
    c = sparse_matmul(f16_values, weight.meta, b.astype(np.float16), interpret=True, dtype="f16")
    ref, absprod = reference(weight, b.astype(np.float16))  # (bf16 values are exact in f16 at this scale)
    assert_close(c, ref, absprod, 64, "f16")
    c32 = sparse_matmul(np.asarray(weight.values).astype(np.float32), weight.meta, b, interpret=True)
    ref, absprod = reference(weight, b)
    assert_close(c32, ref, absprod, 64, "bf16")


@pytest.mark.parametrize("int_type", ["int16", "uint16", "int32", "int64"])
def test_integer_values_for_a_floating_point_kernel_are_refused(int_type: str):
    """The int16 bits of f16 values (``values.view(np.int16)``) were cast by number: y of inf and
    garbage, no error. Compressed values of an integer type are refused for a floating-point kernel
    (SP0804, naming the view), with or without dtype=, in sparse_matmul and sparse_linear (int8
    values are the s8 kernel's: refused by the buffer's tag, as before)."""
    from sparsile.stdlib.kernels import sparse_linear

    weight, b = problem("f16", 40, 24, 64, seed=8)
    ints = np.asarray(weight.values).view(np.int16).astype(int_type)
    for call in (lambda: sparse_matmul(ints, weight.meta, b, interpret=True),
                 lambda: sparse_matmul(ints, weight.meta, b, interpret=True, dtype="f16"),
                 lambda: sparse_linear(ints, weight.meta, b, interpret=True)):
        with pytest.raises(SparsityError) as e:
            call()
        head, help_line = str(e.value).split("\n")[:2]
        assert head == f"error[SP0804]: the compressed values are integers ({int_type}) for f16 operands"
        assert "values.view(...)" in help_line
    c = sparse_matmul(ints.astype(np.int16).view(np.float16), weight.meta, b, interpret=True)  # the view
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, 64, "f16")


@pytest.mark.parametrize("dtype", ["f16", "s8"])
def test_bool_values_are_refused_for_every_kernel(dtype: str):
    """Bool values (a keep mask passed for the compressed values, say) were cast to the operand type,
    0 and 1, and the product ran, while integer values are refused: a compressed weight never holds
    bools (docs: values are f16, bf16, e4m3, s8 or f32 numbers). SP0804 naming bool, with or
    without dtype=, in sparse_matmul and sparse_linear; for s8 too, whose integers are its numbers."""
    from sparsile.stdlib.kernels import sparse_linear

    weight, b = problem(dtype, 40, 24, 64, seed=8)
    flags = np.asarray(weight.values) != 0
    calls = [lambda: sparse_matmul(flags, weight.meta, b, interpret=True),
             lambda: sparse_matmul(flags, weight.meta, b, interpret=True, dtype=dtype)]
    if dtype == "f16":
        calls.append(lambda: sparse_linear(flags, weight.meta, b, interpret=True))
    for call in calls:
        with pytest.raises(SparsityError) as e:
            call()
        head, help_line = str(e.value).split("\n")[:2]
        assert head == f"error[SP0804]: the compressed values are bools for {dtype} operands"
        assert help_line == (f" = help: pass the values as {dtype} numbers (prune_and_compress's values); a bool "
                             "array is a keep mask: apply it to the dense weight (np.where(mask, w, 0)), then "
                             "compress that")


def test_bool_torch_values_are_refused():
    torch = pytest.importorskip("torch")
    weight, b = problem("f16", 40, 24, 64, seed=8)
    flags = torch.from_numpy(np.asarray(weight.values) != 0)
    with pytest.raises(SparsityError) as e:
        sparse_matmul(flags, weight.meta, torch.from_numpy(b), interpret=True)
    assert (e.value.code, e.value.message) == ("SP0804", "the compressed values are bools for f16 operands")


def test_bad_arguments_are_refused_before_any_work():
    # strings used to escape as ValueError from astype, num_sms="a" as TypeError, and a read-only
    # out failed inside the interpreter's store as an internal compiler error
    weight, b = problem("f16", 40, 24, 64, seed=7)
    v, meta = weight.values, weight.meta
    cases = [
        (lambda: plan_sparse_matmul(v, meta, np.full(b.shape, "a"), interpret=True),
         "b has element type <U1, which is not numeric"),
        (lambda: plan_sparse_matmul(np.full(v.shape, "a"), meta, b, dtype="f16", interpret=True),
         "values has element type <U1, which is not numeric"),
        (lambda: plan_sparse_matmul(v, meta, b, num_sms="a", interpret=True),
         "num_sms must be a positive integer, got 'a'"),
        (lambda: plan_sparse_matmul(v, meta, b, num_sms=0, interpret=True),
         "num_sms must be a positive integer, got 0"),
        (lambda: plan_sparse_matmul(v, meta, b, num_sms=2.5, target="sm_100a", interpret=True),
         "num_sms must be a positive integer, got 2.5"),
        (lambda: plan_sparse_matmul(v, meta, b, split_k=True, interpret=True),
         "split_k must be an integer from 1 to 64"),
        # a truthy string turned the option on
        (lambda: plan_sparse_matmul(v, meta, b, persistent="no", interpret=True),
         "persistent must be True or False, got 'no'"),
        (lambda: sparse_matmul(v, meta, b, interpret="no"), "interpret must be True or False, got 'no'"),
        (lambda: sparse_linear(v, meta, b, interpret=1), "interpret must be True or False, got 1"),
    ]
    out = np.zeros((40, 24), np.float16)
    out.setflags(write=False)
    for target in ("sm_90a", "sm_100a"):
        cases.append((lambda t=target: sparse_matmul(v, meta, b, out=out, target=t, interpret=True),
                      "out is a read-only array"))
    # a writable view whose rows share memory: numpy's copy into it kept the last row for every row
    shared_rows = np.lib.stride_tricks.as_strided(np.zeros(24, np.float16), (40, 24), (0, 2))
    cases.append((lambda: sparse_matmul(v, meta, b, out=shared_rows, interpret=True),
                  "out has a zero stride (strides (0, 2)): its rows or columns share memory"))
    for call, message in cases:
        with pytest.raises(SparsityError) as info:
            call()
        assert info.value.code == "SP0804"
        assert info.value.message.startswith(message)
    assert plan_sparse_matmul(v, meta, b, num_sms=np.int64(8), interpret=True).base.m == 40  # the decode kernel
    assert plan_sparse_matmul(v, meta, b, num_sms=np.int64(8), interpret=True, kernel="gemm").m == 40


def test_metadata_for_another_operand_width_is_refused():
    weight, b = problem("f16", 32, 16, 64, seed=8)
    idx = S.decode_metadata(weight.meta)
    meta8 = S.encode_metadata(idx, "sm90", "e4m3")  # 8-bit layout of the same indices
    assert _codes(lambda: sparse_matmul(weight.values, meta8, b, dtype="f16", interpret=True)) == "SP0809"
    tcgen = S.encode_metadata(idx, "tcgen05", "f16")
    assert _codes(lambda: sparse_matmul(weight.values, tcgen, b, interpret=True)) == "SP0810"


def test_metadata_of_another_matrix_size_is_refused():
    weight, b = problem("f16", 32, 16, 64, seed=9)
    other, _ = problem("f16", 32, 16, 128, seed=9)
    assert _codes(lambda: sparse_matmul(weight.values, other.meta, b, interpret=True)) == "SP0812"
    tall, _ = problem("f16", 64, 16, 64, seed=9)
    assert _codes(lambda: sparse_matmul(weight.values, tall.meta, b, interpret=True)) == "SP0812"


def test_without_gpu_a_launch_says_to_interpret():
    from sparsile.backend import runtime

    if runtime.has_gpu():
        pytest.skip("this machine has a GPU")
    weight, b = problem("f16", 32, 16, 64, seed=10)
    with pytest.raises(LaunchError) as e:
        sparse_matmul(weight.values, weight.meta, b)
    assert e.value.code == "SP0731" and "interpret=True" in str(e.value)


# ------------------------------------------------------------------------------------------------
# the launch plan


@pytest.mark.parametrize("dtype,n,bn", [("f16", 16, 16), ("f16", 17, 32), ("f16", 130, 256), ("f16", 5000, 256),
                                        ("e4m3", 1, 16), ("tf32", 130, 128), ("tf32", 100, 128), ("s8", 64, 64)])
def test_block_n_is_the_next_power_of_two_up_to_the_kernel_limit(dtype, n, bn):
    assert KERNELS[dtype].block_n(n) == bn


@pytest.mark.parametrize("dtype,k,k_padded", [("f16", 36, 48), ("f16", 64, 64), ("bf16", 100, 112),
                                              ("e4m3", 100, 128), ("s8", 32, 32), ("tf32", 50, 56)])
def test_plan_pads_k_to_16_byte_rows(dtype, k, k_padded):
    weight, b = problem(dtype, 130, 300, k, seed=11)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True)
    elem = np.dtype(HOST[dtype]).itemsize
    assert plan.k_padded == k_padded and (plan.k_padded // 2 * elem) % 16 == 0 and (plan.k_padded * elem) % 16 == 0
    assert plan.values.shape == (130, k_padded // 2) and plan.b.shape == (300, k_padded)
    assert not np.asarray(plan.b[:, k:]).astype(np.float64).any()  # zero padding
    assert plan.choice.kernel == f"sparse_gemm_{dtype}"
    assert plan.grid == (2 * -(-300 // plan.bn), 1)  # ceil(M/128) * ceil(N/BN) tiles; K too short to split
    assert plan.meta.dtype == np.uint32 and plan.meta.shape[0] == 144  # M rounded up to 16


@pytest.mark.parametrize("dtype", ["f16", "e4m3"])
def test_plan_compiles_for_sm90a(dtype):
    weight, b = problem(dtype, 130, 40, 100, seed=12)
    ck = plan_sparse_matmul(weight.values, weight.meta, b, kernel="gemm").compile("sm_90a")
    assert ck.cubin[:4] == b"\x7fELF"
    assert "mma_async.sp" in ck.ptx


# ------------------------------------------------------------------------------------------------
# on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("f16", 1000, 600, 768), ("bf16", 257, 130, 100), ("e4m3", 300, 200, 1000),
                                         ("s8", 256, 128, 256), ("tf32", 200, 130, 100)])
def test_gpu_numpy(dtype, m, n, k):
    weight, b = problem(dtype, m, n, k, seed=13)
    c = sparse_matmul(weight.values, weight.meta, b)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3"])
def test_gpu_torch_tensors_in_place(dtype):
    torch = pytest.importorskip("torch")
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[dtype]
    g = torch.Generator().manual_seed(14)
    w = torch.randn(500, 300, generator=g).cuda()
    x = torch.randn(70, 300, generator=g).cuda().to(tdt)
    values, meta = prune_and_compress(w, dtype)
    assert values.is_cuda and values.dtype == tdt
    y = sparse_matmul(values, meta, x)
    assert y.is_cuda and y.dtype == torch.float16 and y.shape == (500, 70)
    out = torch.full((500, 70), float("nan"), device="cuda", dtype=torch.float16)
    assert sparse_matmul(values, meta, x, out=out) is out
    dense = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64))
    ref = dense @ x.cpu().double().T
    tol = 2.0 ** -10 * ref.abs() + (0.05 if dtype == "e4m3" else 0.02)
    assert ((y.cpu().double() - ref).abs() <= tol).all()
    assert torch.equal(out, y)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [64, 512], ids=["decode", "tiled"])
def test_gpu_out_that_is_b_gets_the_product_of_b_as_passed(size):
    """out=b (M = N = K, f16): the kernel would read b while writing C over it, so C goes through a
    new array and is copied into out; three calls, so the call cache keeps none of them."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(size)
    w = torch.randn(size, size, generator=g).cuda()
    x0 = torch.randn(size, size, generator=g).cuda().half()
    values, meta = prune_and_compress(w, "f16")
    ref = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64)) @ x0.cpu().double().T
    tol = 2.0 ** -10 * ref.abs() + 0.02
    b = x0.clone()
    plan = plan_sparse_matmul(values, meta, b, out=b)  # the kernel's C is another array
    assert plan.out.data_ptr() != b.data_ptr()
    for _ in range(3):
        b = x0.clone()
        assert sparse_matmul(values, meta, b, out=b) is b
        assert ((b.cpu().double() - ref).abs() <= tol).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,num_sms", [("f16", 1000, 600, 768, 2), ("bf16", 4096, 8192, 1024, None)])
def test_gpu_pair_kernel_through_sparse_matmul(dtype, m, n, k, num_sms):
    """Large C (>= 4 tiles per SM; num_sms=2 makes a small C large): sparse_matmul runs the CTA-pair
    kernel (B multicast), persistent."""
    weight, b = problem(dtype, m, n, k, seed=15)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, num_sms=num_sms)
    assert plan.pair_ctas > 0 and plan.kernel.name.removesuffix("_mt").endswith("_pair")
    c = sparse_matmul(weight.values, weight.meta, b, num_sms=num_sms)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


def test_e4m3_values_with_a_16_bit_tag_are_not_told_to_pass_dtype():
    """dtype='e4m3' would read 16-bit words as e4m3 ones (SP0809: the layouts differ): the help
    names only the buffer's type."""
    weight, _b = problem("f16", 40, 24, 64, seed=8)
    w8, b8 = problem("e4m3", 40, 24, 64, seed=8)
    with pytest.raises(SparsityError) as e:
        sparse_matmul(w8.values, weight.meta, b8, interpret=True)
    assert e.value.code == "SP0804" and "dtype=" not in e.value.help


def _constant_weight(m: int, k: int):
    """An (m, k) f16 weight of ones at indices (0, 1) of every chunk, as values and raw "sm90" words
    (0x44444444: cheap to make at any size, valid nibbles)."""
    return np.ones((m, k // 2), np.float16), np.full((m, k // 32), 0x44444444, np.uint32)


def test_c_beyond_32_bit_offsets_is_refused():
    """The sm_90a kernels store C (and split-K partial sums) at i32 offsets: beyond 2^31 elements they
    wrap (a fault or a wrong result on the GPU); the planner says so before anything is launched."""
    values, words = _constant_weight(65536, 32)
    with pytest.raises(SparsityError, match=r"C of shape \(65536, 40000\) has 2621440000 elements.*32-bit") as e:
        plan_sparse_matmul(values, words, np.ones((40000, 32), np.float16), interpret=True)
    assert e.value.code == "SP0804" and "blocks of b's rows" in e.value.help
    values, words = _constant_weight(8192, 32)
    b = np.ones((8192, 32), np.float16)
    with pytest.raises(SparsityError, match=r"split-K workspace of shape \(64, 8192, 8192\)") as e:
        plan_sparse_matmul(values, words, b, split_k=64, interpret=True)
    assert e.value.code == "SP0804" and "at most 32" in e.value.help
    assert plan_sparse_matmul(values, words, b, split_k=32, interpret=True).split_k == 32  # 2^31 elements: fits
