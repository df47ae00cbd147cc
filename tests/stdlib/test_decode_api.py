"""sparsile.stdlib.kernels.decode: the decode kernel of sparse_linear (T <= 64) in the
interpreter against float64 references with poisoned outputs (f16, bf16, e4m3 with scales; ragged
N_out and K; bias, activations, split-K), its selection (the default for T <= 64 unless
kernel="gemm" or SPARSILE_DECODE_KERNEL=0), the plan (launches, rebind, configuration), argument errors with their
codes, sm_90a compilation (PTX facts, ptxas without spills) and a GPU run (marked gpu)."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

import numpy as np
import pytest

from sparsile.stdlib.kernels import KERNELS
from sparsile.stdlib.kernels.decode import (
    DECODE_BM,
    EMPTY_META_WORD,
    SMEM_PER_CTA,
    SMEM_PER_SM,
    SparseDecodePlan,
    choose_decode_config,
    plan_sparse_decode,
    register_cap,
    tile_for_decode,
)
from sparsile.stdlib.kernels.linear import plan_sparse_linear, sparse_linear
from sparsile.stdlib.kernels.linear_plan import SparseLinearPlan
from sparsile.stdlib.kernels.linear_sm100 import SparseLinearPlanSm100
from sparsile.stdlib.sparsity import SparsityError

from .test_linear_api import (
    NP_OUT,
    _code_message,
    assert_linear_close,
    cuda_copy,
    epilogue_case,
    linear_check,
    problem,
)

# dtype, N_out, T, K, out_dtype, bias, activation, scale_w, scale_x, split_k (None: the plan's)
CASES = [
    ("f16", 200, 1, 384, None, None, None, None, None, None),
    ("f16", 130, 3, 520, None, "f32", "relu", None, None, 3),
    ("bf16", 96, 16, 256, None, "out", "silu", None, None, 1),
    ("bf16", 200, 33, 392, "float32", None, "gelu_tanh", None, None, 3),
    ("f16", 64, 64, 256, "float32", "f32", "gelu_tanh", None, None, 1),
    ("bf16", 300, 64, 1000, None, None, None, None, None, None),
    ("f16", 136, 16, 300, "bfloat16", "out", "relu", "channel", "token", 2),
    ("e4m3", 200, 16, 600, None, "f32", "gelu_tanh", "channel", "token", 2),
    ("e4m3", 96, 3, 256, "float16", None, None, "tensor", "tensor", 1),
    ("e4m3", 130, 64, 520, None, "out", "relu", "channel", "token", 1),
    ("e4m3", 70, 1, 264, "float32", "f32", "silu", "tensor", "token", None),
]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", CASES)
def test_decode_matches_float64_reference(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, kernel="decode", **epi)
    assert isinstance(plan, SparseDecodePlan)
    if split is not None:
        assert plan.config.split_k == split
    assert len(plan.launches()) == (2 if plan.config.split_k > 1 else 1)
    assert plan.meta.shape[0] % DECODE_BM == 0 and plan.k_padded % plan.config.bk == 0
    y = sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True, split_k=split,
                      kernel="decode", **epi)
    assert y is out and y.shape == (t, n_out)
    assert_linear_close(y, weight, x, k, dtype, want, **epi)


REDUCE_CASES = [CASES[1], CASES[3], CASES[6], CASES[7]]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", REDUCE_CASES)
def test_split_k_reduced_in_the_kernel(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    """reduce="kernel": one launch; the last CTA of each tile adds the partial sums and applies the
    epilogue, and leaves its arrival counter at zero, so a second run (a replayed graph) is right too."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k + 2)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, reduce="kernel", **epi)
    (main,) = plan.launches()
    assert main[0].name == f"sparse_decode_reduce_{dtype}" and main[1] == (-(-n_out // DECODE_BM), split)
    assert plan.counters.shape == (-(-n_out // DECODE_BM),) and not plan.counters.any()
    plan.workspace[...] = np.nan  # every share is written before it is read
    plan.run()
    assert_linear_close(out, weight, x, k, dtype, want, **epi)
    assert not plan.counters.any()
    first = out.copy()
    out[...] = np.nan
    plan.run()
    np.testing.assert_array_equal(out, first)
    # the shares are added in the same order as splitk_reduce_linear adds them: bit for bit
    out[...] = np.nan
    plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True, split_k=split,
                       reduce="launch", **epi).run()
    np.testing.assert_array_equal(out, first)


def test_reduce_mode_is_checked_and_read_from_the_environment(monkeypatch):
    weight, x = problem("f16", 130, 3, 520, seed=5)

    def launches(**kw):
        return len(plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=2, **kw).launches())

    monkeypatch.delenv("SPARSILE_DECODE_REDUCE", raising=False)
    assert (launches(), launches(reduce="kernel")) == (2, 1)
    assert len(plan_sparse_linear(weight.values, weight.meta, x, interpret=True, split_k=2, kernel="decode",
                                  reduce="kernel").launches()) == 1
    monkeypatch.setenv("SPARSILE_DECODE_REDUCE", "kernel")
    assert (launches(), launches(reduce="launch")) == (1, 2)
    assert plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=1).counters is None
    for plan in (plan_sparse_decode, functools.partial(plan_sparse_linear, kernel="gemm")):
        assert _code_message(lambda: plan(weight.values, weight.meta, x, interpret=True, split_k=2,  # noqa: B023
                                          reduce="atomic")) == (
            "SP0860", "reduce of the decode kernel must be 'launch' or 'kernel', got 'atomic'")
    # checked without split-K too (plan_sparse_decode read it only for split-K plans: silently ignored)
    assert _code_message(lambda: plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=1,
                                                    reduce="atomic")) == (
        "SP0860", "reduce of the decode kernel must be 'launch' or 'kernel', got 'atomic'")


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_reduce_in_kernel_compiles_for_sm90a(dtype):
    weight, x = problem(dtype, 256, 16, 512, seed=3)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=4, reduce="kernel",
                              bias=np.ones(256, np.float32), activation="silu")
    (ck,) = plan.compile("sm_90a")
    atoms = [ln.split("atom.")[1].split()[0] for ln in ck.ptx.splitlines() if "atom." in ln]
    assert sorted(atoms) == ["acq_rel.gpu.global.add.s32", "acq_rel.gpu.global.exch.b32"]
    assert ck.ptx.count("fence.acq_rel.gpu;") == 2


TILED_CASES = [CASES[1], CASES[3], CASES[6], CASES[7], CASES[10]]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", TILED_CASES)
def test_tiled_layout_matches_float64_reference(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    """tiled=True: the weight copied so that each TMA box is contiguous; the same results."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k + 1)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, tiled=True, **epi)
    steps = plan.k_padded // plan.config.bk
    assert plan.constexprs()["TILED"] == 1
    assert plan.values.shape == (-(-n_out // DECODE_BM) * steps * DECODE_BM, plan.config.bk // 2)
    assert plan.meta.shape == (plan.values.shape[0], plan.config.bk // 32)
    assert plan.run() is out
    assert_linear_close(out, weight, x, k, dtype, want, **epi)



# (the CASES index, the plan's layout and reduction): ragged N_out (200, 130, 70 are no multiple of 64)
BM64_CASES = [(0, False, "launch"), (1, False, "launch"), (1, True, "kernel"), (3, False, "kernel"),
              (7, True, "launch"), (8, False, "launch"), (10, True, "launch")]


@pytest.mark.parametrize("case,tiled,reduce", BM64_CASES)
def test_64_row_slabs_match_float64_reference(case, tiled, reduce):
    """bm=64: one consumer warpgroup per CTA (5 warps) and twice the CTAs; every layout and
    reduction, against float64 from a poisoned output, and a second run (re-zeroed counters)."""
    dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split = CASES[case]
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k + 7)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, tiled=tiled, reduce=reduce, bm=64, **epi)
    assert plan.config.bm == 64 and plan.config.source == "explicit"
    main = plan.launches()[0]
    assert main[1] == (-(-n_out // 64), plan.config.split_k)
    assert main[3]["BM"] == 64 and main[3]["num_warps"] == 5
    assert plan.meta.shape[0] % 64 == 0
    if plan.counters is not None:
        assert plan.counters.shape == (-(-n_out // 64),)
    for _ in range(2):
        out[...] = np.nan
        assert plan.run() is out
        assert_linear_close(out, weight, x, k, dtype, want, **epi)


def test_a_weight_has_one_padded_copy_for_both_slabs():
    """Untiled plans of one weight with 128- and 64-row slabs pad it alike (whole 128-row slabs), to
    the same bytes: sparsile.torch refreshes a record's weight copies (untiled) from a plan of one
    token, whose table entry may name the other slab (found in review: 1088 rows padded to 1152 or
    to 1088). (A tiled copy's arrangement depends on the slab: tile_for_decode.)"""
    weight, x = problem("bf16", 1088, 1, 512, seed=9)
    plans = [plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=bm, split_k=2,
                                reduce="kernel") for bm in (128, 64)]
    assert [p.meta.shape for p in plans] == [(1152, 16)] * 2
    np.testing.assert_array_equal(plans[0].meta, plans[1].meta)
    np.testing.assert_array_equal(plans[0].values, plans[1].values)
    assert [p.counters.shape for p in plans] == [(9,), (17,)]  # one per CTA row tile
    out = plans[1].out
    out[...] = np.nan
    assert_linear_close(plans[1].run(), weight, x, 512, "bf16", "bfloat16")


def test_64_row_slabs_are_checked_and_compile_for_sm90a(tmp_path):
    weight, x = problem("bf16", 256, 1, 512, seed=4)
    for bad in (32, 96, "64", True):
        assert _code_message(functools.partial(plan_sparse_decode, weight.values, weight.meta, x, interpret=True,
                                               bm=bad)) == (
            "SP0860", f"bm of the decode kernel must be one of 128, 64, 256, got {bad!r}")
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=64, split_k=1)
    (ck,) = plan.compile("sm_90a")
    assert ck.num_warps == 5
    assert len(re.findall(r"wgmma\.mma_async\.sp", ck.ptx)) == 4  # BK/32 of m64n8k32 per step, one warpgroup
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report

@pytest.mark.parametrize("dtype,n_out,t,k,split,reduce,tiled,fm", [
    ("bf16", 300, 64, 512, 2, "launch", False, False),   # ragged: the second slab's last 212 rows past M
    ("f16", 256, 33, 640, 1, None, True, False),         # one slab, tiled, ragged K (5 steps)
    ("e4m3", 520, 40, 768, 3, "kernel", False, True),    # three slabs, in-kernel reduction, feature-major
    ("bf16", 128, 64, 256, 2, "kernel", False, False),   # fewer rows than one slab
])
def test_256_row_slabs_match_float64_reference(dtype, n_out, t, k, split, reduce, tiled, fm):
    """bm=256: four consumer warpgroups (17 warps); the words padded to whole 256-row slabs with the
    code of two zero values, so that no metadata box reads past them; output poisoned."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t)
    want, epi = epilogue_case(dtype, n_out, t, "float32", "f32", "relu", "channel", "token")
    shape = (n_out, t) if fm else (t, n_out)
    out = np.full(shape, np.nan, np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=256, split_k=split, reduce=reduce,
                              tiled=tiled, feature_major=fm, out=out, out_dtype="float32", **epi)
    assert plan.config.bm == 256 and plan.config.num_warps == 17 and plan.grid == (-(-n_out // 256), split)
    rows = -(-n_out // 256) * 256
    if not tiled:
        assert plan.meta.shape[0] == rows
        assert (np.asarray(plan.meta)[plan.base.meta.shape[0]:] == EMPTY_META_WORD).all()  # beyond the given words
    assert plan.run() is out
    assert_linear_close(out.T if fm else out, weight, x, k, dtype, want, **epi)


def test_256_row_slabs_compile_for_sm90a_without_spills(tmp_path):
    weight, x = problem("bf16", 512, 64, 2048, seed=5)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=256, split_k=2)
    assert plan.config.stages * (plan.config.stage_bytes(2) + 16) <= SMEM_PER_CTA
    # one CTA per SM whatever the ring (17 warps' registers): a persistent grid of 256-row slabs counts so
    small = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=256, split_k=1, stages=2,
                               persistent=True, num_sms=1)
    assert small.config.ctas_per_sm == 1 and small.grid == (1, 1)
    ck = plan.compile("sm_90a")[0]
    assert ck.num_warps == 17
    # BK/32 = 4 sparse MMAs of m64n64k32 per step in each of the four consumer warpgroups' code
    assert len(re.findall(r"wgmma\.mma_async\.sp\.sync\.aligned\.m64n64k32", ck.ptx)) == 4
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report


def test_register_cap_fits_the_warps_of_one_sub_partition():
    """16 K registers per sub-partition, ceil(warps / 4) warps on one, allocated 8 per thread."""
    assert [register_cap(w) for w in (1, 4, 5, 9, 13, 17)] == [255, 255, 255, 168, 128, 96]


@pytest.mark.parametrize("dtype,split,reduce,persistent", [
    ("bf16", 1, None, False), ("f16", 2, "kernel", False), ("e4m3", 2, "kernel", False), ("bf16", 1, None, True),
])
def test_256_row_slab_kernels_launch_with_17_warps(dtype, split, reduce, persistent):
    """Every 256-row kernel is compiled for at most 96 registers per thread, so that its 17 warps
    (5 on one sub-partition) fit: the in-kernel reduction took 112 under the kernels' own cap, and
    its launch failed on the H200 with SP0711 (at most 512 threads per block)."""
    weight, x = problem(dtype, 512, 64, 2048, seed=6)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=256, split_k=split, reduce=reduce,
                              persistent=persistent)
    assert plan.constexprs()["maxnreg"] == 96
    ck = plan.compile("sm_90a")[0]
    used = re.search(r"Used (\d+) registers", ck.info_log)
    assert used is not None and int(used[1]) <= 96, ck.info_log
    assert "maxnreg" not in plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=128).constexprs()


@pytest.mark.parametrize("dtype,n_out,t,k,bm,sms,tiled,fm", [
    ("bf16", 1000, 5, 512, 128, 3, False, False),   # 8 slabs on 6 CTAs (2 per SM): two CTAs stream two
    ("e4m3", 700, 33, 768, 64, 4, True, False),     # 11 slabs of 64 rows on 8 CTAs, tiled
    ("f16", 520, 64, 384, 256, 1, False, True),     # 3 slabs of 256 rows on one CTA, feature-major
    ("bf16", 130, 16, 1000, 128, 8, False, False),  # fewer slabs than CTA slots: one slab per CTA
])
def test_persistent_kernel_matches_float64_reference(dtype, n_out, t, k, bm, sms, tiled, fm):
    """persistent=True: min(slabs, CTA slots) CTAs, each streaming slabs p, p + grid, ... through one
    ring (the ring's phases continue across slabs); epilogue per slab; output poisoned."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + k)
    want, epi = epilogue_case(dtype, n_out, t, "float32", "f32", "silu", "channel", "token")
    out = np.full((n_out, t) if fm else (t, n_out), np.nan, np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=bm, split_k=1, persistent=True,
                              num_sms=sms, tiled=tiled, feature_major=fm, out=out, out_dtype="float32", **epi)
    slabs = -(-n_out // bm)
    assert plan.config.persist == min(slabs, plan.config.ctas_per_sm * sms) and plan.grid == (plan.config.persist, 1)
    assert plan.constexprs()["PERSIST"] == 1 and len(plan.launches()) == 1
    assert plan.run() is out
    assert_linear_close(out.T if fm else out, weight, x, k, dtype, want, **epi)


def test_persistent_kernel_is_checked_and_compiles_without_spills(tmp_path):
    weight, x = problem("bf16", 2048, 64, 2048, seed=6)
    for kwargs, words in [({"split_k": 2}, "split_k=2"), ({"split_k": 1, "pdl": True}, "pdl=True")]:
        code, message = _code_message(functools.partial(plan_sparse_decode, weight.values, weight.meta, x,
                                                        interpret=True, persistent=True, **kwargs))
        assert code == "SP0860" and "the persistent decode kernel takes no split-K" in message and words in message
    w8, x16 = problem("e4m3", 256, 4, 512, seed=6)
    code, message = _code_message(functools.partial(plan_sparse_decode, w8.values, w8.meta, x16.astype(np.float16),
                                                    interpret=True, persistent=True, split_k=1))
    assert code == "SP0860" and "16-bit x for e4m3 weights" in message
    plan = plan_sparse_decode(weight.values, weight.meta, x, persistent=True, split_k=1, num_sms=4)
    assert plan.grid == (plan.config.persist, 1) and plan.config.persist < 16
    (ck,) = plan.compile("sm_90a")
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report


def test_tile_for_decode_puts_each_box_in_consecutive_rows():
    x = np.arange(256 * 48, dtype=np.uint32).reshape(256, 48)
    tiled = tile_for_decode(x, 128, 16)
    assert tiled.shape == (6 * 128, 16) and tiled.flags.c_contiguous
    for i in range(2):
        for k in range(3):
            np.testing.assert_array_equal(tiled[(i * 3 + k) * 128:(i * 3 + k + 1) * 128],
                                          x[i * 128:(i + 1) * 128, k * 16:(k + 1) * 16])
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(x.view(np.int32)).view(torch.uint32)
    assert np.array_equal(tile_for_decode(xt, 128, 16).view(torch.int32).numpy().view(np.uint32), tiled)


def test_decode_is_the_default_for_few_tokens(monkeypatch):
    """The decode kernel is the default for T <= 64 only; SPARSILE_DECODE_KERNEL=0 and
    kernel="gemm" keep the tiled kernels."""
    weight, x = problem("f16", 64, 8, 128, seed=1)
    _, x65 = problem("f16", 64, 65, 128, seed=1)
    v, m = weight.values, weight.meta
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
    assert isinstance(plan_sparse_linear(v, m, x, interpret=True), SparseLinearPlan)
    monkeypatch.delenv("SPARSILE_DECODE_KERNEL", raising=False)
    assert isinstance(plan_sparse_linear(v, m, x, interpret=True), SparseDecodePlan)
    assert isinstance(plan_sparse_linear(v, m, x65, interpret=True), SparseLinearPlan)
    assert isinstance(plan_sparse_linear(v, m, x, interpret=True, kernel="gemm"), SparseLinearPlan)
    assert isinstance(plan_sparse_linear(v, m, x65, interpret=True, kernel="decode"), SparseLinearPlan)
    y = sparse_linear(v, m, x, interpret=True)  # through the environment
    assert_linear_close(y, weight, x, 128, "f16", "float16")


def test_launches_and_rebind():
    weight, x = problem("bf16", 130, 20, 512, seed=7)
    _, x2 = problem("bf16", 130, 20, 512, seed=8)
    bias = np.linspace(-1, 1, 130).astype(np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, bias=bias, activation="relu", interpret=True,
                              split_k=2)
    (main, mgrid, margs, mcx), (red, rgrid, rargs, rcx) = plan.launches()
    assert rgrid == (-(-130 * 20 // 1024),)
    assert main.name == "sparse_decode_bf16" and mgrid == (2, 2)
    assert mcx == {"BN": 32, "BK": 128, "STAGES": plan.config.stages, "SPLIT_K": 2}
    assert margs[3] is plan.workspace and plan.workspace.shape == (2, 20, 130) and margs[7:] == (130, 20, 512, 130)
    assert plan.meta.shape == (256, 16) and plan.meta.dtype == np.uint32
    assert int(plan.meta[255, 15]) == 0x44444444  # padded rows: two zero values per chunk
    assert red.name == "splitk_reduce_linear" and rargs[:3] == (plan.workspace, plan.out, plan.base.bias)
    assert rcx == {"SPLIT_K": 2, "BIAS": 1, "ACT": "relu", "SCALE_W": 0, "SCALE_X": 0, "BLOCK": 1024}
    out = np.full((20, 130), np.nan, NP_OUT["bfloat16"])
    again = plan.rebind(x2, out)
    assert again.meta is plan.meta and again.workspace is plan.workspace and again.run() is out
    assert_linear_close(out, weight, x2, 512, "bf16", "bfloat16", bias=bias, activation="relu")
    y = plan.rebind(x).run()
    assert_linear_close(y, weight, x, 512, "bf16", "bfloat16", bias=bias, activation="relu")
    with pytest.raises(SparsityError) as info:
        plan.rebind(x[:3])
    assert info.value.code == "SP0853"


@pytest.mark.parametrize("m,k,t,split,bn", [(4096, 4096, 16, 4, 16), (14336, 4096, 1, 1, 8),
                                            (28672, 4096, 64, 1, 64), (4096, 14336, 64, 4, 64),
                                            (8192, 28672, 32, 2, 32), (1024, 4096, 1, 16, 8),
                                            (1024, 256, 4, 1, 8)])
def test_configuration_puts_about_one_cta_per_sm(m, k, t, split, bn):
    """Two CTAs per SM where four steps fit in half the shared memory, else one with a deeper ring
    (64-token tiles); the split gives about one CTA per SM (at most one per SM, at least two K steps
    per share, at most 16 shares)."""
    cfg = choose_decode_config(m, t, k, KERNELS["bf16"], 132)
    assert (cfg.split_k, cfg.bn, cfg.ctas_per_sm) == (split, bn, 1 if bn == 64 else 2)
    assert cfg.stages >= (6 if bn == 64 else 4)
    assert cfg.ctas_per_sm * (cfg.stages * cfg.stage_bytes(2) + 2048) <= SMEM_PER_SM
    assert cfg.split_k == 1 or -(-m // DECODE_BM) * cfg.split_k <= 132


def test_empty_k_keeps_the_shipped_plan():
    from sparsile.stdlib.sparsity import encode_metadata

    meta = encode_metadata(np.zeros((20, 0, 2), np.uint8), "sm90", "f16", k=0)
    bias = np.linspace(-1, 1, 20).astype(np.float32)
    y = sparse_linear(np.zeros((20, 0), np.float16), meta, np.zeros((3, 0), np.float16), bias=bias,
                      activation="relu", interpret=True, kernel="decode")
    np.testing.assert_array_equal(y, np.tile(np.maximum(bias, 0).astype(np.float16), (3, 1)))


@pytest.mark.parametrize("m,k", [(20, 0), (0, 64)], ids=["k0", "m0"])
@pytest.mark.parametrize("kw,code,message", [
    ({"split_k": 0}, "SP0804", "split_k of the decode kernel must be an integer from 1 to 16, got 0"),
    ({"split_k": True}, "SP0804", "split_k of the decode kernel must be an integer from 1 to 16, got True"),
    ({"split_k": 2.0}, "SP0804", "split_k of the decode kernel must be an integer from 1 to 16, got 2.0"),
    ({"bm": 7}, "SP0860", "bm of the decode kernel must be one of 128, 64, 256, got 7"),
    ({"stages": 1}, "SP0804", "stages of the decode kernel must be an integer from 2 to 8 whose ring fits in 227 KB "
                              "of shared memory, got 1"),
], ids=["split0", "split-bool", "split-float", "bm", "stages"])
def test_an_empty_problem_checks_the_decode_arguments(m, k, kw, code, message):
    """An empty problem (K = 0 or no rows) returned the shipped plan before the decode kernel's own
    arguments were checked: ``sparse_linear(..., split_k=0)`` with T <= 64 computed the bias (and
    tests/stdlib/test_linear_properties' illegal-argument property found it: no diagnostic),
    where the same call with K > 0, or sparse_matmul's, is SP0804."""
    from sparsile.stdlib.sparsity import encode_metadata

    meta = encode_metadata(np.zeros((m, k // 4, 2), np.uint8), "sm90", "f16", k=k)
    values, x = np.zeros((m, k // 2), np.float16), np.ones((3, k), np.float16)
    assert _code_message(lambda: plan_sparse_decode(values, meta, x, interpret=True, **kw)) == (code, message)
    if "split_k" in kw:
        assert _code_message(lambda: sparse_linear(values, meta, x, interpret=True, **kw)) == (code, message)


def test_argument_errors_have_codes():
    weight, x = problem("f16", 32, 4, 64, seed=9)
    _, x65 = problem("f16", 32, 65, 64, seed=9)
    v, m = weight.values, weight.meta
    assert _code_message(lambda: plan_sparse_linear(v, m, x, interpret=True, kernel="fast")) == (
        "SP0860", "unknown sparse_linear kernel 'fast'")
    assert _code_message(lambda: plan_sparse_decode(v, m, x65, interpret=True)) == (
        "SP0860", "the decode kernel takes at most 64 tokens, got 65")
    assert _code_message(lambda: plan_sparse_decode(v, m, x, interpret=True, split_k=17)) == (
        "SP0804", "split_k of the decode kernel must be an integer from 1 to 16, got 17")
    big = "stages of the decode kernel must be an integer from 2 to 8 whose ring fits in 227 KB of shared memory, got"
    assert _code_message(lambda: plan_sparse_decode(v, m, x, interpret=True, stages=1)) == ("SP0804", f"{big} 1")
    assert _code_message(lambda: plan_sparse_decode(v, m, x65[:64], interpret=True, stages=8)) == ("SP0804", f"{big} 8")
    plan = plan_sparse_decode(v, m, x65[:64], interpret=True, stages=6)  # 6 x 34.8 KB: one CTA per SM
    assert (plan.config.stages, plan.config.ctas_per_sm) == (6, 1) and plan.constexprs()["STAGES"] == 6
    assert _code_message(lambda: plan_sparse_decode(v, m, x, interpret=True, activation="gelu")) == (
        "SP0850", "unknown activation 'gelu'")


def ptxas_report(ptx: str, tmp_path) -> str:
    """ptxas -v's report (stderr) of assembling ``ptx`` for sm_90a, which must succeed; the test is
    skipped where ptxas is not installed."""
    if shutil.which("ptxas") is None:
        pytest.skip("ptxas is not installed")
    path = tmp_path / "decode.ptx"
    path.write_text(ptx)
    proc = subprocess.run(["ptxas", "-arch=sm_90a", "-v", str(path), "-o", str(tmp_path / "decode.cubin")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("dtype,t,split,act,tiled", [("f16", 1, 1, None, False), ("bf16", 64, 1, "gelu_tanh", False),
                                                     ("e4m3", 16, 4, None, False), ("bf16", 16, 1, "silu", True)])
def test_compiles_for_sm90a(dtype, t, split, act, tiled, tmp_path):
    """One wgmma.sp group per K step (BK/32 instructions), four TMA copies per step (values, metadata,
    two 128-byte panels of x for 16-bit types), metadata read from shared memory (128-bit loads for
    16-bit types), no global loads in the loop; ptxas: no spills, under maxnreg."""
    weight, x = problem(dtype, 256, t, 512, seed=11)
    epi = {"scale_x": np.ones(t, np.float32), "scale_w": 0.5} if dtype == "e4m3" else {}
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=split, activation=act,
                              tiled=tiled, reduce="launch", **epi)  # reduce="kernel": its own test above
    ck = plan.compile("sm_90a")[0]
    ptx = ck.ptx
    assert len(re.findall(r"wgmma\.mma_async\.sp", ptx)) == 4
    assert len(re.findall(r"cp\.async\.bulk\.tensor", ptx)) == 4
    if dtype != "e4m3":
        assert "ld.shared.v4.b32" in ptx
    cfg = plan.config
    assert ck.smem_bytes == cfg.stages * (cfg.stage_bytes(KERNELS[dtype].elem_bytes) + 16)  # + two mbarriers
    report = ptxas_report(ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report
    regs = int(re.search(r"Used (\d+) registers", report).group(1))
    assert regs <= 112  # maxnreg: two 9-warp CTAs per SM


GPU_CASES = [  # Llama-3 8B / 70B layer shapes and ragged ones, every T of the decode range
    ("bf16", 4096, 1, 4096, None, None, None, None, None, None),
    ("bf16", 6144, 16, 4096, None, "f32", "silu", None, None, None),
    ("f16", 4096, 64, 14336, "float32", "out", "gelu_tanh", None, None, None),
    ("f16", 28672, 33, 4096, None, None, "relu", None, None, None),
    ("bf16", 1000, 3, 1000, None, "f32", None, None, None, 4),
    ("e4m3", 8192, 16, 8192, None, "f32", None, "channel", "token", None),
    ("e4m3", 130, 64, 520, "float16", None, "silu", "tensor", "tensor", 2),
]


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["launch", "kernel"])
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", GPU_CASES)
def test_gpu_decode_torch_in_place(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled, reduce):
    check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled=tiled, reduce=reduce)


@pytest.mark.gpu
@pytest.mark.parametrize("tiled,reduce,pdl", [(False, "launch", False), (True, "kernel", True)])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", GPU_CASES)
def test_gpu_decode_64_row_slabs(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled, reduce, pdl):
    """bm=64 (one consumer warpgroup, 5 warps per CTA) on the GPU, both layouts and reductions, PDL."""
    plan = check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled=tiled, reduce=reduce,
                            bm=64, pdl=pdl)
    assert plan.config.bm == 64


@pytest.mark.gpu
@pytest.mark.parametrize("tiled,reduce", [(False, "launch"), (True, "kernel")])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", [c for c in GPU_CASES if c[2] >= 32])
def test_gpu_decode_256_row_slabs(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled, reduce):
    """bm=256 (four consumer warpgroups, 17 warps per CTA) on the GPU, both layouts and reductions."""
    plan = check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split or 2, tiled=tiled,
                            reduce=reduce, bm=256)
    assert plan.config.bm == 256


@pytest.mark.gpu
@pytest.mark.parametrize("bm,tiled", [(128, False), (64, True)])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", [c for c in GPU_CASES if c[-1] is None])
def test_gpu_decode_persistent(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, bm, tiled):
    """The persistent kernel on the GPU (on 8 SMs' worth of CTAs, so that every CTA streams several
    slabs), both layouts."""
    plan = check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, 1, tiled=tiled, bm=bm,
                            persistent=True, num_sms=8)
    assert plan.config.persist > 0


def check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, **options):
    """The decode plan of this case (``options`` of plan_sparse_decode) run three times on torch CUDA
    tensors, each from a poisoned output, against float64; its plan."""
    torch = pytest.importorskip("torch")
    weight, x = problem(dtype, n_out, t, k, seed=12)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    cuda = cuda_copy
    values = cuda(np.asarray(weight.values))
    out = torch.full((t, n_out), float("nan"), device="cuda", dtype=getattr(torch, want))
    plan = plan_sparse_decode(values, weight.meta, cuda(x), out=out, out_dtype=out_dtype, split_k=split, **options,
                              **{key: cuda(v) if key != "activation" else v for key, v in epi.items()})
    assert isinstance(plan, SparseDecodePlan)
    for _ in range(3):  # in-kernel reduction: the arrival counters must be back at zero after each run
        out.fill_(float("nan"))
        assert plan.run() is out
        torch.cuda.synchronize()
        host = out.float().cpu().numpy().astype(NP_OUT[want]) if want != "float32" else out.cpu().numpy()
        assert_linear_close(host, weight, x, k, dtype, want, **epi)
    if plan.counters is not None:
        assert not plan.counters.any()
    return plan


# dtype, N_out, T, K, scale_w, scale_x, split_k, reduce: K of 2 steps (fewer than the stages: the PDL
# prologue requests them all before the wait), split-K through both reductions, e4m3 with scales
PDL_CASES = [
    ("bf16", 200, 3, 256, None, None, 1, None),
    ("f16", 130, 3, 520, None, None, 3, "launch"),
    ("e4m3", 200, 16, 600, "channel", "token", 2, "kernel"),
    ("bf16", 300, 64, 1000, None, None, 1, None),
]


@pytest.mark.parametrize("dtype,n_out,t,k,sw,sx,split,reduce", PDL_CASES)
def test_pdl_plan_matches_float64_reference(dtype, n_out, t, k, sw, sx, split, reduce):
    """pdl=True: every launch carries the PDL constexpr and the pdl launch option, and the result
    is the float64 reference's and the same bit for bit as without PDL."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + k + 5)
    want, epi = epilogue_case(dtype, n_out, t, None, "f32", "relu", sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, interpret=True, split_k=split, reduce=reduce,
                              pdl=True, **epi)
    launches = plan.launches()
    assert len(launches) == (2 if reduce == "launch" else 1)
    assert all(cx["PDL"] == 1 and cx["pdl"] is True for _, _, _, cx in launches)
    if plan.workspace is not None:
        plan.workspace[...] = np.nan
    plan.run()
    assert_linear_close(out, weight, x, k, dtype, want, **epi)
    plain = np.full_like(out, np.nan)
    plan_sparse_decode(weight.values, weight.meta, x, out=plain, interpret=True, split_k=split, reduce=reduce,
                       **epi).run()
    np.testing.assert_array_equal(out, plain)
    assert plan.rebind(x, plain).pdl  # a rebound plan keeps it


def test_pdl_is_checked():
    weight, x = problem("bf16", 64, 1, 256, seed=1)
    assert _code_message(lambda: plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pdl=1)) == (
        "SP0860", "pdl of the decode kernel must be True or False, got 1")
    assert not plan_sparse_decode(weight.values, weight.meta, x, interpret=True).pdl


@pytest.mark.parametrize("dtype,split,reduce", [("bf16", 1, None), ("e4m3", 4, "launch"), ("f16", 2, "kernel")])
def test_pdl_compiles_for_sm90a(dtype, split, reduce, tmp_path):
    """The decode kernel with PDL: one launch_dependents, a wait in the producer (after the first
    ring's weight boxes, before x's) and in the consumers; the split-K reduction waits first;
    ptxas: no spills, under maxnreg."""
    weight, x = problem(dtype, 256, 16, 512, seed=13)
    epi = {"scale_x": np.ones(16, np.float32), "scale_w": 0.5} if dtype == "e4m3" else {}
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=split, reduce=reduce, pdl=True,
                              **epi)
    compiled = plan.compile("sm_90a")
    ptx = compiled[0].ptx
    assert ptx.count("griddepcontrol.launch_dependents;") == 1
    assert ptx.count("griddepcontrol.wait;") >= 2  # the producer's and the consumers' (LLVM may duplicate a block)
    if reduce == "launch":
        assert compiled[1].ptx.count("griddepcontrol.wait;") == 1
    report = ptxas_report(ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report
    assert int(re.search(r"Used (\d+) registers", report).group(1)) <= 112


@pytest.mark.gpu
@pytest.mark.parametrize("split,reduce", [(1, None), (3, "launch"), (2, "kernel")])
def test_gpu_pdl_reads_what_the_previous_kernel_wrote(split, reduce):
    """Each call follows a torch kernel that writes its x: with PDL the decode kernel starts early
    and streams its weight, but must read x (and write y) only after that kernel. 40 calls back to
    back on one stream, eagerly and replayed from a CUDA graph, each against float64."""
    torch = pytest.importorskip("torch")
    n_out, t, k = 4096, 16, 4096
    weight, x = problem("bf16", n_out, t, k, seed=21)
    want, epi = epilogue_case("bf16", n_out, t, None, "f32", "silu", None, None)
    xs = [problem("bf16", 8, t, k, seed=100 + i)[1] for i in range(4)]
    x_dev = cuda_copy(x)
    out = torch.full((t, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan = plan_sparse_decode(cuda_copy(np.asarray(weight.values)), weight.meta, x_dev, out=out, split_k=split,
                              reduce=reduce, pdl=True, **{key: cuda_copy(v) if key != "activation" else v
                                                          for key, v in epi.items()})
    sources = [cuda_copy(xi) for xi in xs]
    checks = [linear_check(weight, xi, k, "bf16", want, **epi) for xi in xs]  # float64 references, once per x
    outs = [torch.empty_like(out) for _ in range(40)]
    for i, o in enumerate(outs):  # eager: the copy kernel writes x, the PDL launch reads it
        x_dev.copy_(sources[i % 4])
        plan.rebind(x_dev, o).run()
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        checks[i % 4](o.float().cpu().numpy().astype(NP_OUT[want]))
    graph = torch.cuda.CUDAGraph()
    replayed = [torch.empty_like(out) for _ in range(8)]
    runs = [plan.rebind(x_dev, o) for o in replayed]
    with torch.cuda.graph(graph):
        for i, run in enumerate(runs):
            x_dev.copy_(sources[i % 4])
            run.run()
    for _ in range(3):
        for o in replayed:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, o in enumerate(replayed):
            checks[i % 4](o.float().cpu().numpy().astype(NP_OUT[want]))


@pytest.mark.parametrize("dtype,act", [("bf16", None), ("f16", "gelu_tanh"), ("e4m3", "silu")])
def test_weight_operands_do_not_depend_on_the_token_count(dtype, act):
    """``weight_operands`` (what sparsile.torch's launch records refresh after a weight write, planning
    one token: integrations/torch/_kernels.py) are the same arrays for any T of one kernel: the decode
    kernel's at T = 1, 16 and 64 (and its tiled layout at T = 1, 8 and 16, where the heuristic's row
    slab is one: sparsile.torch never tiles), the tiled kernel's (kernel="gemm") at T = 1,
    64, 65 and 100 (where the tuned tile narrows with an activation), the Blackwell kernel's at T = 1,
    64, 65 and 100 from raw "sm90" words (``meta_format="sm90"``, as the records pass them: re-encoded).
    Padded shape (200 x 520), a float64 bias (converted), e4m3 with per-channel weight scales."""
    weight, x = problem(dtype, 200, 100, 520, seed=7)
    rng = np.random.default_rng(8)
    extra = {"bias": rng.standard_normal(200), "activation": act}
    if dtype == "e4m3":
        extra |= {"scale_w": rng.uniform(0.5, 2.0, 200).astype(np.float32), "scale_x": 0.5}
    words = np.asarray(weight.meta.data).copy()  # raw, untagged: what a torch layer keeps

    def operands(plan, t, **kw):
        made = plan(weight.values, kw.pop("meta", weight.meta), x[:t], interpret=True, **extra, **kw)
        return type(made), made.weight_operands

    decode = functools.partial(plan_sparse_decode, tiled=True)
    for kind, plan, tokens, kw in (
            (SparseDecodePlan, plan_sparse_linear, (1, 16, 64), {}),
            (SparseDecodePlan, decode, (1, 8, 16), {}),  # (a tiled copy follows the row slab: 128 beyond T = 16)
            (SparseLinearPlan, plan_sparse_linear, (1, 64, 65, 100), {"kernel": "gemm"}),
            (SparseLinearPlanSm100, plan_sparse_linear, (1, 64, 65, 100),
             {"target": "sm_100a", "meta": words, "meta_format": "sm90", "kernel": "gemm"})):
        (first_kind, first), *rest = [operands(plan, t, **kw) for t in tokens]
        assert first_kind is kind
        assert first[0].shape != weight.values.shape  # padded copies (what a refresh writes)
        for other_kind, other in rest:
            assert other_kind is kind
            for a, b in zip(first, other, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.shape == b.shape and a.dtype == b.dtype
                    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("tokens", [4, 100])
def test_meta_format_is_checked_and_ignored_on_sm90a(tokens):
    """``meta_format`` is checked whichever kernel is planned (it was not where T <= 64 planned the
    decode kernel); "sm90" changes nothing on sm_90a, where raw words are "sm90" words anyway."""
    weight, x = problem("bf16", 96, tokens, 128, seed=5)
    words = np.asarray(weight.meta.data).copy()
    with pytest.raises(SparsityError) as info:
        plan_sparse_linear(weight.values, words, x, interpret=True, meta_format="tcgen05")
    assert "meta_format must be None or 'sm90'" in info.value.message
    plain = plan_sparse_linear(weight.values, words, x, interpret=True)
    tagged = plan_sparse_linear(weight.values, words, x, interpret=True, meta_format="sm90")
    assert type(plain) is type(tagged) and (type(plain) is SparseDecodePlan) == (tokens <= 64)
    for a, b in zip(plain.weight_operands, tagged.weight_operands, strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_persistent_without_split_k_takes_no_split():
    """persistent=True alone on a weight of few slabs (where the heuristic splits K): split 1, not
    SP0860 for a split the caller did not ask for."""
    weight, x = problem("bf16", 512, 4, 2048, seed=8)
    assert plan_sparse_decode(weight.values, weight.meta, x, interpret=True, num_sms=132, bm=128).config.split_k > 1
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, num_sms=132, persistent=True)
    assert plan.config.split_k == 1 and plan.grid == (plan.config.persist, 1)
    plan.out[...] = np.nan
    assert_linear_close(plan.run(), weight, x, 2048, "bf16", "bfloat16")
    code, message = _code_message(functools.partial(plan_sparse_decode, weight.values, weight.meta, x,
                                                    interpret=True, persistent="no"))
    assert code == "SP0860" and "persistent of the decode kernel" in message


def test_split_workspace_beyond_32_bit_offsets_is_refused():
    """The decode kernel stores its split-K partial sums (split x M x T) at i32 offsets, which wrap
    beyond 2^31 elements: refused when planned (2^21 + 128 weight rows, 64 tokens, 16 shares)."""
    m = 2 ** 21 + 128
    values, words = np.ones((m, 16), np.float16), np.full((m, 1), 0x44444444, np.uint32)
    x = np.ones((64, 32), np.float16)
    with pytest.raises(SparsityError, match=rf"split-K workspace of shape \(16, {m}, 64\)") as e:
        plan_sparse_decode(values, words, x, split_k=16, interpret=True)
    assert e.value.code == "SP0804" and "at most 15" in e.value.help
