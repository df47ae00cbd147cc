"""sparse_matmul(..., target=<Blackwell>) (stdlib/kernels/gemm_sm100.py): the persistent kernel by
default and the one-tile-per-program kernel with persistent=False, in the interpreter against
float64 references (random, ragged, K padded, C columns padded for TMA); the grid (min(#tiles,
#SMs), 148 without a device, num_sms=); metadata in any tagged format (re-encoded to "tcgen05"
once) or raw "tcgen05" words; argument errors with their codes; the plan compiled for every
Blackwell target; GPU runs (marked gpu, never run: no Blackwell GPU was available)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.stdlib import sparsity as S
from sparsile.stdlib.kernels import (
    CompressedWeight,
    SparseMatmul,
    plan_sparse_matmul,
    prune_and_compress,
    sparse_linear,
    sparse_matmul,
)
from sparsile.stdlib.kernels.gemm import plan_target
from sparsile.stdlib.kernels.gemm_sm100 import DEFAULT_SM_COUNT, KERNELS_SM100, SparseMatmulSm100, tcgen05_metadata
from sparsile.stdlib.sparsity import SparsityError

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "s8": np.int8,
        "tf32": np.float32}
OUT = {"f16": np.float16, "bf16": np.float16, "e4m3": np.float16, "s8": np.int32, "tf32": np.float16}


def problem(dtype: str, m: int, n: int, k: int, seed: int, fmt: str = "sm90"):
    rng = np.random.default_rng(seed)
    if dtype == "s8":
        w = rng.integers(-60, 60, (m, k)).astype(np.int8)
        b = rng.integers(-60, 60, (n, k)).astype(np.int8)
    else:
        w = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32).astype(HOST[dtype])
    return prune_and_compress(w, dtype, fmt=fmt), b


def assert_close(c: np.ndarray, weight: CompressedWeight, b: np.ndarray, dtype: str) -> None:
    """s8 exactly; otherwise f32 accumulation (K·2^-23·Σ|ab|), tf32 inputs (2^-9·Σ|ab|), one
    rounding to f16 (2^-11 relative plus the subnormal spacing)."""
    a64, b64 = weight.dense().astype(np.float64), b.astype(np.float64)
    ref, absprod = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T
    assert c.dtype == OUT[dtype] and c.shape == ref.shape
    c64 = c.astype(np.float64)
    if dtype == "s8":
        np.testing.assert_array_equal(c64, ref)
        return
    assert not np.isnan(c64).any(), "unwritten outputs"
    acc = max(b.shape[1], 1) * 2.0 ** -23 * absprod + (2.0 ** -9 * absprod if dtype == "tf32" else 0)
    bound = acc + 2.0 ** -11 * (np.abs(ref) + acc) + 2.0 ** -24
    err = np.abs(c64 - ref)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


# ------------------------------------------------------------------------------------------------
# numerics in the interpreter


@pytest.mark.parametrize("dtype,m,n,k", [
    ("f16", 300, 301, 200),   # 3 x 3 tiles on 2 programs; N = 301: C columns padded to 304 for TMA
    ("bf16", 260, 130, 100),  # K = 100: values and b padded to 112
    ("tf32", 140, 200, 150),  # 1:2, K padded to 152, 3 K steps of 64
    ("e4m3", 300, 200, 100),  # 8-bit: K padded to 128
    ("s8", 270, 390, 256),    # exact int32 accumulation, 3 x 3 tiles of BN = 192; int32 C padded to 392
])
@pytest.mark.parametrize("persistent", [True, False])
def test_interpreter_matches_float64_reference(dtype, m, n, k, persistent):
    weight, b = problem(dtype, m, n, k, seed=m + n + k)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a", persistent=persistent,
                      num_sms=2)
    assert_close(c, weight, b, dtype)


def test_metadata_formats_give_the_same_result():
    """A "sm90" buffer is re-encoded (once, cached), a "tcgen05" one used as is; raw tcgen05 words
    work as the 4-D array and as its (-1, 4) view, uint32 or int32."""
    weight, b = problem("f16", 200, 100, 256, seed=3)
    tc = tcgen05_metadata(weight.meta)
    assert tc.fmt == "tcgen05" and tcgen05_metadata(weight.meta) is tc
    run = lambda meta: sparse_matmul(weight.values, meta, b, interpret=True, target="sm_100a", num_sms=3)  # noqa: E731
    want = run(weight.meta)
    words = np.asarray(tc.data)
    for meta in (tc, words, words.reshape(-1, 4), words.view(np.int32), S.encode_metadata(
            S.decode_metadata(weight.meta), "logical", "f16", k=256)):
        np.testing.assert_array_equal(run(meta), want)


def test_out_is_written_and_returned():
    weight, b = problem("f16", 140, 50, 128, seed=4)  # N = 50: the kernel writes a padded C, copied to out
    out = np.full((140, 50), np.nan, np.float16)
    c = sparse_matmul(weight.values, weight.meta, b, out=out, interpret=True, target="sm_110a")
    assert c is out and not np.isnan(out).any()
    np.testing.assert_array_equal(out, sparse_matmul(weight.values, weight.meta, b, interpret=True,
                                                     target="sm_110a", persistent=False))


def test_empty_k():
    c = sparse_matmul(np.zeros((5, 0), np.float16), S.encode_metadata(np.zeros((5, 0, 2), np.uint8), "tcgen05", "f16"),
                      np.zeros((4, 0), np.float16), interpret=True, target="sm_100a")
    np.testing.assert_array_equal(c, np.zeros((5, 4), np.float16))


# ------------------------------------------------------------------------------------------------
# the plan: kernel, grid, padding


def test_the_grid_is_min_of_tiles_and_sms():
    weight, b = problem("f16", 1000, 1000, 64, seed=5)  # 8 x 8 = 64 tiles of 128 x 128
    plan = lambda **kw: plan_sparse_matmul(weight.values, weight.meta, b, target="sm_100a", **kw)  # noqa: E731
    p = plan(interpret=True)
    assert isinstance(p, SparseMatmulSm100) and p.num_tiles == 64 and p.num_sms == DEFAULT_SM_COUNT == 148
    assert p.grid == (64,)
    assert plan(num_sms=20).grid == (20,) and plan(num_sms=200).grid == (64,)
    assert plan(persistent=False, num_sms=20).grid == (64,)
    assert plan(num_sms=20).kernel.name == plan(persistent=False).kernel.name == "sparse_gemm_f16"
    assert plan(num_sms=20).kernel is not plan(persistent=False).kernel
    e8, b8 = problem("e4m3", 1000, 1000, 64, seed=5)
    p8 = plan_sparse_matmul(e8.values, e8.meta, b8, target="sm_100a", num_sms=148)
    assert p8.bn == 192 and p8.grid == (8 * 6,)  # persistent BN 192 (2 x 192 + 16 TMEM columns)
    assert plan_sparse_matmul(e8.values, e8.meta, b8, target="sm_100a", persistent=False).bn == 256


def test_padding_of_k_and_c():
    weight, b = problem("bf16", 70, 37, 100, seed=6)
    p = plan_sparse_matmul(weight.values, weight.meta, b, target="sm_100a", interpret=True)
    assert p.values.shape == (70, 56) and p.b.shape == (37, 112) and p.k_launch == 112
    assert p.meta.shape == (128, 4) and p.meta.dtype == np.uint32  # one atom: K 128 x M 128
    assert p.out.shape == (70, 40) and p.result().shape == (70, 37)  # 16-byte rows of f16 C


def test_k_never_runs_past_the_metadata_atoms():
    """Values one column wider than K = 128 (allowed: K/2 rounds up) pad to K = 144, but the
    metadata has one atom (K = 128): the launch K stays 128, and the extra column (garbage here)
    is never read."""
    weight, b = problem("f16", 128, 64, 128, seed=12)
    wider = np.concatenate([weight.values, np.full((128, 1), 7.0, np.float16)], axis=1)
    p = plan_sparse_matmul(wider, weight.meta, b, target="sm_100a", interpret=True)
    assert p.values.shape == (128, 72) and p.k_launch == 128
    np.testing.assert_array_equal(sparse_matmul(wider, weight.meta, b, interpret=True, target="sm_100a"),
                                  sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a"))


def test_default_target_without_a_device_is_hopper():
    weight, b = problem("f16", 40, 24, 64, seed=7)
    assert isinstance(plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm"), SparseMatmul)


@pytest.mark.parametrize("target,dtype,persistent", [
    *((t, d, True) for t in ("sm_100a", "sm_103a", "sm_110a") for d in ("f16", "tf32", "s8")),
    ("sm_100a", "bf16", False), ("sm_103a", "e4m3", False),  # the one-tile kernel (all: test_blackwell_kernels)
])
def test_the_plan_compiles_for_every_blackwell_target(target, dtype, persistent):
    weight, b = problem(dtype, 300, 260, 256, seed=8)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, target=target, persistent=persistent)
    if dtype == "s8" and target == "sm_103a":
        with pytest.raises(CompileError) as info:
            plan.compile()
        assert info.value.diagnostics[0].code == "SP0602"
        return
    ck = plan.compile()
    assert f".target {target}" in ck.ptx and "tcgen05.mma.sp" in ck.ptx
    assert ("%nctaid.x" in ck.ptx) == persistent


# ------------------------------------------------------------------------------------------------
# argument checking


def _code(fn) -> str:
    with pytest.raises(SparsityError) as e:
        fn()
    return e.value.code


def test_argument_errors_have_codes():
    weight, b = problem("f16", 200, 24, 256, seed=9)
    v, meta = weight.values, weight.meta
    run = lambda *a, **kw: sparse_matmul(*a, interpret=True, target="sm_100a", **kw)  # noqa: E731
    assert _code(lambda: run(v, meta, b[:, :128])) == "SP0815"                          # K mismatch
    assert _code(lambda: run(v[0], meta, b)) == "SP0804"                                 # 1-D values
    assert _code(lambda: run(v, meta, b, dtype="e5m2")) == "SP0804"                     # no kernel
    assert _code(lambda: run(v, meta, b, out=np.empty((200, 24), np.float32))) == "SP0804"
    assert _code(lambda: run(v, meta, b, num_sms=0)) == "SP0804"
    assert _code(lambda: sparse_matmul(v, meta, b, interpret=True, target="sm_80")) == "SP0804"
    words = np.asarray(tcgen05_metadata(meta).data)
    assert _code(lambda: run(v, words[:1], b)) == "SP0805"                              # one atom of two
    assert _code(lambda: run(v, np.asarray(meta), b)) == "SP0805"                       # raw sm90 words
    assert _code(lambda: run(v, words.astype(np.float32), b)) == "SP0806"
    bad = words.copy()
    bad[1, 0, 5, 2] &= ~np.uint32(0xF)  # nibble 0x0: an index used twice
    assert _code(lambda: run(v, bad, b)) == "SP0807"


@pytest.mark.parametrize(("name", "help_start"), [
    ("hopper", "did you mean `sm_90a`? (Hopper: H100, H200, GH200) "),
    ("B200", "did you mean `sm_100a`? (Blackwell: "),
    ("sm_100b", "did you mean `sm_100a`? "),
    ("SM_91A", "did you mean `sm_90a`? "),
    ("sm_80", "use sm_90a"),  # a real target without a sparse GEMM kernel: nothing to suggest
    ("A100", "use sm_90a"),  # sm_80 (by spelling alone it came close to sm_100a)
])
@pytest.mark.parametrize("entry", ["sparse_matmul", "sparse_linear"])
def test_a_gpu_name_for_target_suggests_a_target_with_a_kernel(entry, name, help_start):
    """sparse_matmul / sparse_linear(target="hopper") is SP0804 whose help names the target to write,
    as SP0601 of ``get_target`` does (for a GPU name it only listed the targets)."""
    weight, b = problem("f16", 128, 16, 128, seed=11)
    fn = sparse_matmul if entry == "sparse_matmul" else sparse_linear
    with pytest.raises(SparsityError) as e:
        fn(weight.values, weight.meta, b, interpret=True, target=name)
    assert (e.value.code, e.value.message) == ("SP0804", f"there is no sparse GEMM kernel for target {name!r}")
    assert e.value.help.startswith(help_start)
    assert e.value.help.count("did you mean") == (0 if name in ("sm_80", "A100") else 1)
    assert e.value.help.endswith("use sm_90a (Hopper) or one of sm_100a, sm_103a, sm_110a (Blackwell)")


@pytest.mark.parametrize("entry", ["sparse_matmul", "sparse_linear"])
def test_a_target_is_taken_in_every_spelling_get_target_takes(entry):
    """target="SM_90A" was SP0804 "no sparse GEMM kernel for target 'SM_90A'" whose help said `did
    you mean `sm_90a`?`, though get_target (SP0601) and warm_up take it: each spelling of a target
    with a kernel plans that target, the product equals the canonical name's and the reference."""
    weight, b = problem("f16", 128, 16, 128, seed=12)
    fn = sparse_matmul if entry == "sparse_matmul" else sparse_linear
    args = (weight.values, weight.meta, b)
    want = np.asarray(fn(*args, interpret=True, target="sm_90a"))
    assert np.isfinite(want).all() and np.abs(want).max() > 0
    for spelling in ("SM_90A", "sm90a", "90a", " Sm-90a "):
        got = fn(*args, interpret=True, target=spelling)
        assert np.array_equal(np.asarray(got), want), spelling
    assert plan_target("SM_100A", True) == "sm_100a" and plan_target("sm_110A", True) == "sm_110a"


def test_metadata_for_another_operand_width_is_refused():
    weight, b = problem("f16", 128, 16, 128, seed=10)
    meta8 = S.encode_metadata(S.decode_metadata(weight.meta), "tcgen05", "e4m3")
    assert _code(lambda: sparse_matmul(weight.values, meta8, b, dtype="f16", interpret=True,
                                       target="sm_100a")) == "SP0809"


def test_every_operand_type_has_a_kernel():
    assert set(KERNELS_SM100) == {"f16", "bf16", "tf32", "e4m3", "s8"}


# ------------------------------------------------------------------------------------------------
# On a Blackwell GPU (never run: no such GPU was available)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3", "tf32", "s8"])
@pytest.mark.parametrize("persistent", [True, False])
def test_sparse_matmul_on_blackwell(dtype, persistent):
    from sparsile.stdlib.kernels.gemm_sm100 import device_target

    target = device_target()
    if target is None:
        pytest.skip("needs a Blackwell GPU (sm_100 / sm_103 / sm_110)")
    if dtype == "s8" and target == "sm_103a":
        pytest.skip("kind::i8 does not exist on sm_103")
    weight, b = problem(dtype, 1000, 700, 1000, seed=11)
    c = sparse_matmul(weight.values, weight.meta, b, persistent=persistent)  # the device's target by default
    assert_close(c, weight, b, dtype)


@pytest.mark.parametrize("split_k", [0, 65, 2.0, "2", True])
def test_a_bad_split_k_is_refused_on_blackwell_too(split_k):
    """The Blackwell kernels do not split K, but a split_k that no kernel takes was silently ignored."""
    weight, b = problem("f16", 32, 24, 64, seed=9)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a", split_k=split_k)
    assert (info.value.code, info.value.message) == (
        "SP0804", f"split_k must be an integer from 1 to 64, got {split_k!r}")
