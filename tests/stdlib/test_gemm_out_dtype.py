"""sparse_matmul(out_dtype=): bfloat16 / float32 C for floating-point operands (issue 12: float16
C of bf16 operands overflows to inf beyond ±65504).

Interpreter runs against float64 references with |C| ~ 1e5 (poisoned outputs), the launch plan
(the ``_splitk`` kernel, its workspace, no CTA pair), and the diagnostics of bad out_dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.kernels import KERNELS, plan_sparse_matmul, prune_and_compress, sparse_matmul
from sparsile.stdlib.kernels.gemm_choice import checked_out_dtype
from sparsile.stdlib.sparsity import SparsityError

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn, "tf32": np.float32}
C_TYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float16": np.float16}
HALF_ULP = {"bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float16": 2.0 ** -11}


def large_problem(dtype: str, m: int, n: int, k: int, seed: int):
    """Weights and b scaled so that most of C lies beyond float16's 65504 (|C| ~ 1e5 and more)."""
    rng = np.random.default_rng(seed)
    scale = 60.0 if dtype == "e4m3" else 300.0  # e4m3 stops at 448: no weight saturates
    w = (rng.standard_normal((m, k)) * scale).astype(np.float32)
    b = (rng.standard_normal((n, k)) * scale).astype(np.float32).astype(HOST[dtype])
    return prune_and_compress(w, dtype), b


def check(c: np.ndarray, weight, b: np.ndarray, out_dtype: str, dtype: str) -> None:
    a64, b64 = weight.dense().astype(np.float64), b.astype(np.float64)
    ref, absprod = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T
    assert c.dtype == C_TYPES[out_dtype]
    c64 = c.astype(np.float64)
    assert np.isfinite(c64).all(), "unwritten (NaN) or overflowed (inf) outputs"
    k = b.shape[1]
    acc = k * 2.0 ** -23 * absprod  # f32 accumulation, any order
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * absprod  # Hopper's e4m3 accumulator
    if dtype == "tf32":
        acc = acc + 2.0 ** -9 * absprod
    bound = acc + HALF_ULP[out_dtype] * (np.abs(ref) + acc)
    err = np.abs(c64 - ref)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("dtype,out_dtype,split,k", [
    ("bf16", "bfloat16", 1, 100),
    ("bf16", "float32", 1, 100),     # the _splitk kernel stores f32 straight into C
    ("bf16", "bfloat16", 2, 200),    # split K: the reduce converts to bf16
    ("f16", "float32", 2, 200),
    ("e4m3", "bfloat16", 1, 512),    # smaller weights, longer sums
    ("tf32", "bfloat16", 1, 100),
])
def test_large_values_survive_in_bf16_and_f32(dtype, out_dtype, split, k):
    m, n = 70, 24
    weight, b = large_problem(dtype, m, n, k, seed=split)
    poisoned = np.full((m, n), np.nan, dtype=C_TYPES[out_dtype])
    c = sparse_matmul(weight.values, weight.meta, b, out=poisoned, out_dtype=out_dtype, interpret=True, split_k=split)
    assert c is poisoned
    check(c, weight, b, out_dtype, dtype)
    assert np.abs(c.astype(np.float64)).max() > 1e5  # the range float16 cannot hold


def test_float16_default_still_overflows():
    """The default stays float16 (backward compatible): the same problem gives inf there."""
    weight, b = large_problem("bf16", 70, 24, 100, seed=1)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    assert c.dtype == np.float16 and np.isinf(c).any()
    explicit = sparse_matmul(weight.values, weight.meta, b, interpret=True, out_dtype="float16")
    np.testing.assert_array_equal(c, explicit)


def test_new_output_array_is_of_out_dtype():
    weight, b = large_problem("bf16", 40, 16, 64, seed=3)
    c = sparse_matmul(weight.values, weight.meta, b, out_dtype="bf16", interpret=True)
    check(c, weight, b, "bfloat16", "bf16")


def test_plan_uses_the_splitk_kernel_and_no_pair():
    weight, b = large_problem("bf16", 40, 16, 64, seed=4)
    f32 = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm", out_dtype="float32",
                             num_sms=2)
    assert f32.kernel.name == "sparse_gemm_bf16_splitk" and f32.workspace is None and f32.pair_ctas == 0
    assert f32._constexprs() == {"BN": 16, "SPLIT_K": 1} and f32.arguments()[3] is f32.out
    bf = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm", out_dtype="bfloat16")
    assert bf.workspace.shape == (1, 40, 16) and bf.workspace.dtype == np.float32
    default = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    assert default.kernel.name == "sparse_gemm_bf16" and default.workspace is None and not default.partials


@pytest.mark.parametrize("spelling,name", [
    ("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("f32", "float32"), (np.float32, "float32"),
    (np.dtype(np.float16), "float16"), (ml_dtypes.bfloat16, "bfloat16"), (None, "float16"),
])
def test_out_dtype_spellings(spelling, name):
    assert checked_out_dtype(spelling, KERNELS["bf16"]) == name


def test_torch_spellings():
    torch = pytest.importorskip("torch")
    assert checked_out_dtype(torch.bfloat16, KERNELS["f16"]) == "bfloat16"
    assert checked_out_dtype(torch.float32, KERNELS["e4m3"]) == "float32"


@pytest.mark.parametrize("dtype,bad,allowed", [
    ("bf16", "float64", "float16, bfloat16, float32"),
    ("bf16", "int32", "float16, bfloat16, float32"),
    ("s8", "float32", "int32"),
])
def test_unsupported_out_dtype_is_a_diagnostic(dtype, bad, allowed):
    with pytest.raises(SparsityError) as info:
        checked_out_dtype(bad, KERNELS[dtype])
    assert info.value.code == "SP0804"
    assert info.value.message == f"sparse_matmul has no {bad} output for {dtype} operands"
    assert f"out_dtype is one of {allowed} for {dtype} operands" in info.value.help


def test_unsupported_out_dtype_through_sparse_matmul():
    weight, b = large_problem("bf16", 16, 8, 32, seed=5)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, out_dtype="float64", interpret=True)
    assert info.value.code == "SP0804" and "no float64 output for bf16 operands" in info.value.message


def test_out_of_another_dtype_is_a_diagnostic():
    weight, b = large_problem("bf16", 16, 8, 32, seed=6)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, weight.meta, b, out=np.zeros((16, 8), np.float32), out_dtype="bfloat16",
                      interpret=True)
    assert info.value.code == "SP0804"
    assert info.value.message == "out must be a (16, 8) bfloat16 array, got (16, 8) float32"
    assert "out_dtype=bfloat16" in info.value.help


def test_blackwell_target_refuses_another_out_dtype():
    weight, b = large_problem("bf16", 16, 8, 32, seed=7)
    with pytest.raises(SparsityError) as info:
        plan_sparse_matmul(weight.values, weight.meta, b, out_dtype="bfloat16", interpret=True, target="sm_100a")
    assert info.value.code == "SP0804"
    assert info.value.message == "out_dtype=bfloat16 is not available on sm_100a: the Blackwell kernels store float16 C"


def test_splitk_kernel_with_one_share_compiles_for_sm90():
    weight, b = large_problem("bf16", 40, 16, 64, seed=8)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, out_dtype="float32")
    assert plan.compile("sm_90a") is not None


def test_benchmark_arguments():
    """benchmarks/bench_gemm_out_dtype.py (a GPU script): its shapes and token counts parse."""
    from sparsile.tests.support import load_script

    module = load_script("benchmarks/bench_gemm_out_dtype.py")
    args = module.parse_args(["--shapes", "14336x4096", "128X64", "--tokens", "1", "16"])
    assert args.shapes == [(14336, 4096), (128, 64)] and args.tokens == [1, 16] and args.iters == 50
    assert module.parse_args([]).shapes == module.SHAPES


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m,n,k,split", [(4096, 16, 4096, None), (512, 512, 1024, 1), (1024, 4096, 2048, None)])
def test_gpu_out_dtype_matches_float64(out_dtype, m, n, k, split):
    torch = pytest.importorskip("torch")
    weight, b = large_problem("bf16", m, n, k, seed=9)
    bt = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16).cuda()
    values = torch.from_numpy(np.asarray(weight.values).view(np.int16)).view(torch.bfloat16).cuda()
    out = torch.full((m, n), float("nan"), dtype=getattr(torch, out_dtype), device="cuda")
    c = sparse_matmul(values, weight.meta, bt, out=out, out_dtype=out_dtype, split_k=split)
    assert c is out
    host = c.float().cpu().numpy().astype(C_TYPES[out_dtype])
    check(host, weight, b, out_dtype, "bf16")
