"""sparse_matmul at N <= 64 on sm_90a: the decode kernel (sparse_decode_sm90.spk) storing C feature-major
(FM=1), against float64 with poisoned outputs, in the interpreter and on the GPU; the routing rule and
its options; the feature-major store of every reduction (in the kernel's epilogue, in the kernel's
last CTA, in splitk_reduce_linear with an epilogue); FM compiled for sm_90a."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import plan_sparse_matmul, sparse_matmul
from sparsile.stdlib.kernels.decode import SparseDecodePlan, plan_sparse_decode
from sparsile.stdlib.kernels.gemm import SparseMatmul
from sparsile.stdlib.sparsity import SparsityError

from .test_gemm_api import assert_close, problem, reference
from .test_linear_api import assert_linear_close, cuda_copy, epilogue_case
from .test_linear_api import problem as linear_problem

# dtype, M, N, K, split_k: ragged M (not whole 128-row slabs), ragged K (padded to the 128 / 256-element
# step), N of one token to the most the decode kernel takes, split-K with an empty last share
CASES = [
    ("f16", 200, 17, 192, None),
    ("bf16", 130, 40, 512, 3),
    ("e4m3", 64, 20, 300, None),
    ("bf16", 70, 1, 100, 2),
    ("f16", 300, 64, 1000, 4),
    ("e4m3", 256, 9, 1024, 3),
]


@pytest.mark.parametrize("dtype,m,n,k,split", CASES)
def test_decode_route_matches_float64_reference(dtype, m, n, k, split):
    weight, b = problem(dtype, m, n, k, seed=m + n + k)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=split)
    assert isinstance(plan, SparseDecodePlan) and plan.feature_major
    assert plan.kernel.name == f"sparse_decode_{dtype}" and plan.constexprs()["FM"] == 1
    if split:
        assert plan.config.split_k == split and plan.workspace.shape == (split, m, n)
        reduce_kernel, _, reduce_args, reduce_cx = plan.launches()[1]
        assert reduce_kernel.name == "splitk_reduce_linear" and reduce_cx["FM"] == 1 and reduce_args[-1] == n
    out = np.full((m, n), np.nan, np.float16)  # poisoned: every element must be written
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=split, out=out)
    assert c is out and c.shape == (m, n)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_decode_route_stores_other_output_types(out_dtype):
    weight, b = problem("bf16", 150, 24, 384, seed=3)
    c = sparse_matmul(weight.values, weight.meta, b, interpret=True, out_dtype=out_dtype, split_k=2)
    assert str(c.dtype) == out_dtype and c.shape == (150, 24)
    ref, absprod = reference(weight, b)
    err = np.abs(c.astype(np.float64) - ref)
    ulp = {"bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}[out_dtype]
    assert (err <= 384 * 2.0 ** -23 * absprod * (1 + ulp) + ulp * np.abs(ref) + 2.0 ** -120).all()


def test_decode_route_agrees_with_the_tiled_kernel():
    """C of 128 x 32: the two kernels agree to the f16 rounding of C, which a store with rows and
    columns swapped would not."""
    weight, b = problem("f16", 128, 32, 128, seed=11)
    decode = sparse_matmul(weight.values, weight.meta, b, interpret=True)
    tiled = sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    ref, absprod = reference(weight, b)
    assert_close(tiled, ref, absprod, 128, "f16")
    np.testing.assert_allclose(decode.astype(np.float64), tiled.astype(np.float64), rtol=2.0 ** -10, atol=2.0 ** -14)


def test_routing_rule(monkeypatch):
    weight, b = problem("bf16", 130, 64, 256, seed=5)
    v, meta = weight.values, weight.meta
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True), SparseDecodePlan)
    # N = 65: beyond the decode kernel's 64 tokens
    wide = np.concatenate([b, b[:1]])
    assert isinstance(plan_sparse_matmul(v, meta, wide, interpret=True), SparseMatmul)
    # the tiled kernels on request, by argument or environment, and for a split only they take
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True, kernel="gemm"), SparseMatmul)
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True, split_k=20), SparseMatmul)
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True, schedule="pingpong"), SparseMatmul)
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True, kernel="decode", split_k=16), SparseDecodePlan)
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
    assert isinstance(plan_sparse_matmul(v, meta, b, interpret=True), SparseMatmul)
    monkeypatch.delenv("SPARSILE_DECODE_KERNEL")
    # s8 and tf32 have no decode kernel
    w8, b8 = problem("s8", 64, 16, 64, seed=6)
    assert isinstance(plan_sparse_matmul(w8.values, w8.meta, b8, interpret=True), SparseMatmul)


def test_decode_route_errors_have_codes():
    weight, b = problem("f16", 64, 16, 128, seed=7)
    v, meta = weight.values, weight.meta
    for target in ("sm_90a", "sm_100a"):
        with pytest.raises(SparsityError) as info:
            plan_sparse_matmul(v, meta, b, interpret=True, target=target, kernel="fast")
        assert info.value.code == "SP0860" and "unknown sparse_matmul kernel 'fast'" in info.value.message
    with pytest.raises(SparsityError) as info:  # kernel="decode" with a split the decode kernel does not take
        plan_sparse_matmul(v, meta, b, interpret=True, kernel="decode", split_k=20)
    assert "split_k of the decode kernel must be an integer from 1 to 16, got 20" in info.value.message
    with pytest.raises(SparsityError) as info:  # the matmul's own checks come first: C's shape and type
        sparse_matmul(v, meta, b, interpret=True, out=np.zeros((16, 64), np.float16))
    assert info.value.code == "SP0804" and "out must be a (64, 16) float16 array" in info.value.message


@pytest.mark.parametrize("split,reduce", [(1, None), (3, "launch"), (3, "kernel")])
def test_feature_major_epilogue_of_every_reduction(split, reduce):
    """The layer's epilogue (bias per feature, scales per feature and per token, an activation) on a
    feature-major output: each reduction must index features by row and tokens by column."""
    weight, x = linear_problem("e4m3", 200, 12, 640, seed=2)
    want, epi = epilogue_case("e4m3", 200, 12, "float32", "f32", "silu", "channel", "token")
    out = np.full((200, 12), np.nan, np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=split, reduce=reduce,
                              feature_major=True, out=out, out_dtype="float32", **epi)
    assert plan.reduces_in_kernel == (reduce == "kernel")
    assert plan.run() is out
    assert_linear_close(out.T, weight, x, 640, "e4m3", want, **epi)


@pytest.mark.parametrize("dtype,split,reduce", [("bf16", 1, None), ("e4m3", 3, "launch"), ("f16", 2, "kernel")])
def test_feature_major_compiles_for_sm90a(dtype, split, reduce):
    """FM=1 compiles for sm_90a (the launches of a split included) and its stores are those of a
    row-major C: the unsplit store's 16-bit elements at (feature * N + token)."""
    weight, b = problem(dtype, 256, 16, 1024, seed=1)
    plan = plan_sparse_decode(weight.values, weight.meta, b, split_k=split, reduce=reduce, feature_major=True,
                              out_dtype="float16")
    compiled = plan.compile("sm_90a")
    assert len(compiled) == (2 if reduce == "launch" else 1)
    for ck in compiled:
        assert ck.cubin[:4] == b"\x7fELF"
    assert "wgmma.mma_async.sp" in compiled[0].ptx


def test_tuning_keeps_the_tiled_kernel_at_small_n():
    """The GEMM tuner and its table time the tiled kernels, whatever N (plan_sparse_matmul kernel='gemm')."""
    from sparsile.stdlib.kernels.tuning import default_config

    weight, b = problem("bf16", 130, 16, 256, seed=8)
    plan = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, kernel="gemm")
    assert default_config(plan).bn == plan.bn


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("bf16", 6144, 1, 4096), ("f16", 4096, 16, 4096), ("bf16", 4096, 64, 14336),
                                         ("e4m3", 1000, 33, 1000), ("bf16", 28672, 64, 4096)])
def test_gpu_decode_route(dtype, m, n, k):
    """sparse_matmul on torch CUDA tensors at N <= 64: the decode kernel (its table's or heuristic's
    split), twice into a poisoned C, against float64."""
    torch = pytest.importorskip("torch")
    weight, b = problem(dtype, m, n, k, seed=m + n)
    values, bt = cuda_copy(np.asarray(weight.values)), cuda_copy(b)
    plan = plan_sparse_matmul(values, weight.meta, bt)
    assert isinstance(plan, SparseDecodePlan) and plan.feature_major
    out = torch.empty((m, n), device="cuda", dtype=torch.float16)
    ref, absprod = reference(weight, b)
    for _ in range(2):
        out.fill_(float("nan"))
        assert sparse_matmul(values, weight.meta, bt, out=out) is out
        torch.cuda.synchronize()
        assert_close(out.cpu().numpy(), ref, absprod, k, dtype)
