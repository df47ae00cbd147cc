"""The column split of the sm_90a sparse GEMM's consumer warpgroups (``WG_N`` of
sparse_gemm_sm90.spk; ``SPARSILE_WG_N=1``, stdlib/kernels/gemm.py): where the plans pass it, results
against float64 in the interpreter (ragged shapes, poisoned outputs, the sparse_linear epilogues),
and the PTX (two m64 x BN/2 MMAs per K step, no spills without an epilogue)."""

from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.kernels import gemm as G
from sparsile.stdlib.kernels import plan_sparse_matmul, prune_and_compress
from sparsile.stdlib.kernels.linear import plan_sparse_linear, reference_linear
from sparsile.tests.stdlib.test_gemm_api import assert_close, problem, reference


@pytest.mark.parametrize("dtype,m,n,k", [("f16", 200, 130, 192), ("bf16", 130, 300, 100), ("e4m3", 70, 90, 256)])
def test_sparse_matmul_with_the_column_split_matches_float64(dtype, m, n, k):
    """Ragged M, N and K; 1-2 M tiles and 1-2 N tiles, so each warpgroup's half is partly or wholly
    outside N in some tiles; C poisoned first."""
    weight, b = problem(dtype, m, n, k, seed=m + n + k + 1)
    plan = dataclasses.replace(plan_sparse_matmul(weight.values, weight.meta, b, interpret=True), wg_n=1)
    assert plan._constexprs()["WG_N"] == 1 and plan.bn >= 64
    plan.out[...] = np.nan
    c = plan.run(interpret=True)
    ref, absprod = reference(weight, b)
    assert_close(c, ref, absprod, k, dtype)


@pytest.mark.parametrize("dtype,epilogue", [("bf16", "bias+silu"), ("e4m3", "scales+bias"), ("f16", "gelu_tanh")])
def test_sparse_linear_with_the_column_split_matches_float64(dtype, epilogue):
    rng = np.random.default_rng(7)
    m, t, k = 200, 150, 256
    w = rng.standard_normal((m, k)).astype(np.float32) * (32 if dtype == "e4m3" else 1 / 8)
    x = rng.standard_normal((t, k)).astype(np.float32)
    kw: dict = {}
    if dtype == "e4m3":
        x = (x / np.abs(x).max(1, keepdims=True) * 448).astype(ml_dtypes.float8_e4m3fn)
        kw = dict(scale_w=rng.uniform(0.5, 2, m).astype(np.float32) / 32,
                  scale_x=rng.uniform(0.5, 2, t).astype(np.float32) / 448, out_dtype="bfloat16")
    else:
        x = x.astype(ml_dtypes.bfloat16 if dtype == "bf16" else np.float16)
        kw = {"activation": "silu" if epilogue == "bias+silu" else "gelu_tanh"}
    if "bias" in epilogue:
        kw["bias"] = rng.standard_normal(m).astype(np.float32)
    weight = prune_and_compress(w, dtype)
    plan = dataclasses.replace(plan_sparse_linear(weight.values, weight.meta, x, interpret=True, **kw), wg_n=1)
    assert plan.constexprs()["WG_N"] == 1 and plan.split_k == 1 and not plan.pair
    plan.out[...] = np.nan
    y = np.asarray(plan.run(), dtype=np.float64)
    ref = reference_linear(weight.dense().astype(np.float64), np.asarray(x, dtype=np.float64),
                           **{key: v for key, v in kw.items() if key != "out_dtype"})
    assert not np.isnan(y).any(), "unwritten outputs"
    scale = np.abs(ref).max()
    np.testing.assert_allclose(y, ref, rtol=0, atol=scale * (2 ** -7 if dtype != "f16" else 2 ** -9))


@pytest.mark.parametrize("dtype,mma", [("bf16", "m64n128k32"), ("e4m3", "m64n128k64")])
def test_the_ptx_has_half_width_mmas_and_no_spills(dtype, mma):
    weight, b = problem(dtype, 256, 1024, 256, seed=3)
    plan = dataclasses.replace(plan_sparse_matmul(weight.values, weight.meta, b, interpret=True), wg_n=1)
    compiled = plan.compile("sm_90a")
    assert set(re.findall(r"wgmma\.mma_async\.sp\.sync\.aligned\.(m\d+n\d+k\d+)", compiled.ptx)) == {mma}
    assert "0 bytes spill stores, 0 bytes spill loads" in compiled.info_log, compiled.info_log


def test_where_the_split_applies(monkeypatch):
    assert G.wg_n_constexprs("bf16", 256, True, 1) == {"WG_N": 1}
    assert G.wg_n_constexprs("bf16", 256, True) == {}  # not asked for
    assert G.wg_n_constexprs("bf16", 32, True, 1) == {}  # halves narrower than 32 tokens
    assert G.wg_n_constexprs("bf16", 256, False, 1) == {}  # CTA pairs, ping-pong
    assert G.wg_n_constexprs("s8", 256, True, 1) == {} and G.wg_n_constexprs("tf32", 128, True, 1) == {}
    monkeypatch.setenv(G.WG_N_ENV, "1")
    assert G.wg_n_constexprs("e4m3", 128, True) == {"WG_N": 1}
    weight, b = problem("f16", 130, 40, 512, seed=1)
    split = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, split_k=3)
    assert "WG_N" not in split._constexprs()  # split-K partials: the _splitk kernel has no column split
    weight, b = problem("f16", 1000, 90, 192, seed=2)
    pair = plan_sparse_matmul(weight.values, weight.meta, b, interpret=True, num_sms=2)
    assert pair.pair_ctas and "WG_N" not in pair._constexprs()
