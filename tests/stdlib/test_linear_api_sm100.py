"""sparse_linear on the persistent Blackwell kernel (target sm_100a): the fused epilogue in the
interpreter against float64 with poisoned outputs (fewer programs than tiles), the plan, and
compilation for sm_100a. No Blackwell GPU ran this (docs/blackwell.md)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels.linear import plan_sparse_linear, sparse_linear
from sparsile.stdlib.kernels.linear_sm100 import SparseLinearPlanSm100
from sparsile.stdlib.sparsity import SparsityError

from .test_linear_api import NP_OUT, assert_linear_close, epilogue_case, problem, vectors

CASES = [
    # dtype, N_out, T, K, out_dtype, bias, activation, scale_w, scale_x, num_sms
    ("f16", 200, 37, 128, None, "f32", "gelu_tanh", None, "token", 2),   # 2 programs, 4 tiles
    ("bf16", 130, 1, 256, "float32", "out", "silu", "tensor", None, 148),
    ("e4m3", 150, 20, 256, None, "f32", "relu", "channel", "token", 1),  # one program for both tiles
]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,sms", CASES)
def test_epilogue_matches_float64_reference(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, sms):
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              target="sm_100a", num_sms=sms, **epi)
    assert isinstance(plan, SparseLinearPlanSm100) and plan.grid == (min(sms, -(-n_out // 128) * -(-t // plan.bn)),)
    assert plan.kernel.name == f"sparse_linear_{dtype}" and len(plan.launches()) == 1
    y = sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True, target="sm_100a",
                      num_sms=sms, **epi)
    assert y is out
    assert_linear_close(y, weight, x, k, dtype, want, **epi)


def test_rebind_on_blackwell():
    weight, x = problem("bf16", 96, 9, 128, seed=1)
    _, x2 = problem("bf16", 96, 9, 128, seed=2)
    plan = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, target="sm_100a")
    again = plan.rebind(x2)
    assert isinstance(again, SparseLinearPlanSm100) and again.meta is plan.meta
    assert_linear_close(again.run(), weight, x2, 128, "bf16", "bfloat16")


@pytest.mark.parametrize("split_k", [0, 65, 2.0, "2", True])
def test_a_bad_split_k_is_refused_on_blackwell_too(split_k):
    """The Blackwell kernel does not split K, but a split_k that no kernel takes was silently ignored."""
    weight, x = problem("f16", 32, 80, 64, seed=4)
    with pytest.raises(SparsityError) as info:
        sparse_linear(weight.values, weight.meta, x, interpret=True, target="sm_100a", split_k=split_k)
    assert (info.value.code, info.value.message) == (
        "SP0804", f"split_k must be an integer from 1 to 64, got {split_k!r}")


def test_blackwell_has_no_s8_or_tf32_linear():
    _, x = problem("f16", 32, 4, 64, seed=3)
    from sparsile.stdlib.kernels import prune_and_compress

    w8 = prune_and_compress(np.ones((32, 64), np.float32), "s8")
    with pytest.raises(SparsityError) as info:
        plan_sparse_linear(w8.values, w8.meta, x, interpret=True, target="sm_100a")
    assert (info.value.code, info.value.message) == (
        "SP0804", "there is no Blackwell sparse GEMM kernel for s8 operands")


@pytest.mark.parametrize("dtype,act", [("bf16", "gelu_tanh"), ("e4m3", "silu")])
def test_compiles_for_sm100a(dtype, act):
    weight, x = problem(dtype, 512, 256, 256, seed=4)
    rng = np.random.default_rng(4)
    plan = plan_sparse_linear(weight.values, weight.meta, x, bias=rng.standard_normal(512).astype(np.float32),
                              activation=act, scale_w=vectors("channel", 512, rng),
                              scale_x=vectors("token", 256, rng), interpret=True, target="sm_100a")
    (compiled,) = plan.compile()
    assert compiled.target == "sm_100a"
    assert compiled.cubin[:4] == b"\x7fELF" and "tcgen05.mma.sp.cta_group::1.kind::" in compiled.ptx
    assert "0 bytes spill stores" in compiled.info_log


@pytest.mark.parametrize("dtype,n_out,t,k", [("bf16", 256, 5, 256), ("bf16", 256, 3, 128), ("e4m3", 256, 4, 128),
                                             ("f16", 200, 7, 520)])
def test_raw_sm90_words_are_re_encoded_for_blackwell(dtype, n_out, t, k):
    """``meta_format="sm90"`` (what sparsile.torch's launch records pass: a layer keeps raw "sm90"
    words): on sm_100a the words are validated and re-encoded as "tcgen05" words, at any K (read as
    raw "tcgen05" words they were refused with SP0805 where the shapes differ, and taken unchecked
    where they coincide, K = 128 with M a multiple of 128), matching float64. Without the option a
    raw array is still read as "tcgen05" words."""
    weight, x = problem(dtype, n_out, t, k, seed=k + t)
    assert weight.meta.fmt == "sm90"
    words = np.asarray(weight.meta.data).copy()  # raw, untagged
    epi = {"scale_w": 1 / 64, "scale_x": 1 / 64} if dtype == "e4m3" else {}
    want = {"e4m3": "bfloat16", "bf16": "bfloat16", "f16": "float16"}[dtype]
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_linear(weight.values, words, x, out=out, interpret=True, target="sm_100a",
                              meta_format="sm90", **epi)
    assert isinstance(plan, SparseLinearPlanSm100)
    assert_linear_close(plan.run(), weight, x, k, dtype, want, **epi)
    if k != 128:
        with pytest.raises(SparsityError) as info:
            plan_sparse_linear(weight.values, words, x, interpret=True, target="sm_100a", **epi)
        assert info.value.code == "SP0805"
    with pytest.raises(SparsityError) as info:
        plan_sparse_linear(weight.values, words, x, interpret=True, target="sm_100a", meta_format="tcgen5", **epi)
    assert "meta_format must be None or 'sm90'" in info.value.message
