"""The CTA-pair decode kernel (``sparse_decode_pair_<t>``, PAIR of sparse_decode_sm90.spk; plan_sparse_decode's
``pair=True``): two CTAs of a cluster (2, 1, 1) stream adjacent weight slabs and share each x box by
TMA multicast. In the interpreter against float64 with poisoned outputs (f16, bf16, e4m3 with scales;
odd slab counts, whose last CTA streams a slab wholly beyond N_out; token tiles 16, 32, 64; split-K
with the reduce launch; tiled; feature-major; PDL), bit for bit the plain kernel's result; the padding
of the words that the extra slab needs; the plan's rejections; sm_90a compilation (cluster PTX,
nvJitLink and ptxas without spills); and a GPU run (marked gpu)."""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np
import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.stdlib.kernels.decode import (
    EMPTY_META_WORD,
    padded_to,
    plan_sparse_decode,
    slab_words,
    tile_for_decode,
)

from .test_decode_api import GPU_CASES, check_gpu_decode, ptxas_report
from .test_linear_api import NP_OUT, _code_message, assert_linear_close, epilogue_case, problem

# dtype, N_out, T, K, bm, split_k, stages, tiled, feature_major, pdl; (the epilogue: bias f32, relu, and for
# e4m3 per-channel and per-token scales). Rings of 2 or 3 stages over 4-8 K steps, so that each stage
# is refilled only after both CTAs' consumers released it (the `empty` barriers of both).
CASES = [
    ("f16", 2 * 64 + 40, 16, 1024, 64, 1, 2, False, False, False),    # 3 slabs of 64: CTA 3 beyond N_out
    ("bf16", 3 * 64 + 40, 9, 512, 64, 1, 3, False, False, False),     # 4 slabs (even), T = 9: rank 1 has 1 token
    ("bf16", 4 * 128 + 40, 33, 1024, 128, 2, 2, False, False, False),  # 5 slabs, split-K 2 (reduce launch), BN 64
    ("e4m3", 300, 20, 1024, 128, 1, 2, False, False, False),          # 3 slabs, BN 32, scales
    ("bf16", 2 * 64 + 40, 64, 512, 64, 1, 2, True, False, False),     # tiled, 3 slabs: the copy padded to 4
    ("e4m3", 300, 64, 2048, 128, 2, 3, True, True, False),            # tiled, split-K, feature-major, 3 slabs
    ("f16", 300, 40, 1024, 128, 2, 2, False, True, False),            # feature-major split-K partial sums
    ("bf16", 300, 16, 256, 128, 1, 4, False, False, True),            # PDL: 2 steps, all requested before the wait
    ("f16", 300, 16, 768, 128, 1, 2, False, False, True),             # PDL: 6 steps on 2 stages
]


@pytest.mark.parametrize("dtype,n_out,t,k,bm,split,stages,tiled,fm,pdl", CASES)
def test_pair_matches_float64_reference(dtype, n_out, t, k, bm, split, stages, tiled, fm, pdl):
    """pair=True: the pair kernel on an even grid; the result against float64 from a poisoned output
    (and workspace), and the same bits as the plain kernel's (each slab's sums in the same order)."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k)
    sw, sx = ("channel", "token") if dtype == "e4m3" else (None, None)
    want, epi = epilogue_case(dtype, n_out, t, None, "f32", "relu", sw, sx)
    shape = (n_out, t) if fm else (t, n_out)
    out = np.full(shape, np.nan, NP_OUT[want])
    options = dict(interpret=True, bm=bm, split_k=split, stages=stages, tiled=tiled, feature_major=fm, pdl=pdl,
                   **epi)
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, pair=True, **options)
    slabs = -(-n_out // bm)
    assert plan.config.pair and plan.grid == (slabs + slabs % 2, split) and "pair=True" in repr(plan.config)
    launches = plan.launches()
    assert launches[0][0].name == f"sparse_decode_pair_{dtype}" and len(launches) == (2 if split > 1 else 1)
    steps = plan.k_padded // plan.config.bk
    rows = -(-n_out // (2 * bm)) * 2 * bm  # the words (and a tiled copy) cover whole pairs of slabs
    if tiled:
        assert plan.values.shape[0] == plan.meta.shape[0] == plan.grid[0] * steps * bm
    else:
        assert plan.meta.shape[0] == max(rows, -(-n_out // 128) * 128)
        assert (np.asarray(plan.meta)[plan.base.meta.shape[0]:] == EMPTY_META_WORD).all()  # beyond the given words
    if plan.workspace is not None:
        plan.workspace[...] = np.nan
    assert plan.run() is out
    assert_linear_close(out.T if fm else out, weight, x, k, dtype, want, **epi)
    plain = np.full_like(out, np.nan)
    single = plan_sparse_decode(weight.values, weight.meta, x, out=plain, **options)
    assert not single.config.pair and single.launches()[0][0].name == f"sparse_decode_{dtype}"
    single.run()
    np.testing.assert_array_equal(out, plain)


@pytest.mark.parametrize("tiled", [False, True])
def test_the_extra_slab_reads_zeros_beyond_its_operands(tiled):
    """With an odd slab count the last CTA's boxes lie beyond the weight: untiled, its values box
    wholly past N_out; tiled, were the copy not padded to whole pairs of slabs, every box past the
    tiled tensor (row (slab * steps + k) * BM of a tensor of 3 * steps * BM rows). TMA reads them as
    zeros and counts the whole box on the barrier (docs/hardware.md 5.2: a count short of it would
    leave the ring waiting, which the interpreter reports as a deadlock), and the CTA stores
    nothing: the same bits whether or not the words and the tiled copy cover the extra slab. The
    plan pads them anyway, as for 256-row slabs, so that no metadata box reads the zero fill, the
    undefined code 0x0 (docs/sparse-metadata.md)."""
    dtype, n_out, t, k, bm = "bf16", 300, 32, 512, 128
    weight, x = problem(dtype, n_out, t, k, seed=17)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=bm, split_k=1, stages=2,
                              pair=True, tiled=tiled)
    steps = plan.k_padded // plan.config.bk
    assert plan.grid == (4, 1) and plan.meta.shape[0] == (4 * steps * bm if tiled else 4 * bm)
    assert (np.asarray(plan.meta)[-bm:] == EMPTY_META_WORD).all()  # the extra slab's words (the last 128 rows)
    plan.out[...] = np.nan
    padded = plan.run().copy()
    assert_linear_close(padded, weight, x, k, dtype, "bfloat16")
    words = slab_words(plan.base.meta, n_out, bm, plan.k_padded // 32)  # whole slabs, not pairs: 384 rows
    assert words.shape[0] == 3 * bm
    if tiled:
        values = tile_for_decode(padded_to(plan.base.values, 3 * bm, plan.k_padded // 2), bm, plan.config.bk // 2)
        short = dataclasses.replace(plan, values=values, meta=tile_for_decode(words, bm, plan.config.bk // 32))
        assert short.values.shape[0] == short.meta.shape[0] == 3 * steps * bm  # CTA 3's first row
    else:
        short = dataclasses.replace(plan, meta=words)
        assert short.values.shape[0] == n_out < 3 * bm  # CTA 3's first row
    short.out[...] = np.nan
    np.testing.assert_array_equal(short.run(), padded)


def test_pair_is_off_unless_asked_for():
    """No plan takes the pair kernel by itself (the heuristic's choice is unchanged)."""
    weight, x = problem("bf16", 300, 64, 512, seed=2)
    for kw in ({}, {"split_k": 2}, {"bm": 64}):
        plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, **kw)
        assert not plan.config.pair and "pair" not in plan.kernel.name
    assert plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pair=False).config.pair is False


def test_pair_rejections_are_diagnosed():
    """What the pair kernel cannot take is SP0860 from the plan, naming each conflict."""
    weight, x = problem("bf16", 300, 16, 512, seed=4)
    head = ("the CTA-pair decode kernel (pair=True) takes a token tile of at least 16, no x it quantizes itself, "
            "no persistent kernel and no split-K reduced in the kernel, got ")
    plan = functools.partial(plan_sparse_decode, interpret=True, pair=True)
    assert _code_message(lambda: plan(weight.values, weight.meta, x[:8])) == ("SP0860", head + "a token tile of 8 "
                                                                                             "(8 tokens)")
    assert _code_message(lambda: plan(weight.values, weight.meta, x, split_k=2, reduce="kernel")) == (
        "SP0860", head + "split-K reduced in the kernel (reduce='kernel')")
    assert _code_message(lambda: plan(weight.values, weight.meta, x, split_k=1, persistent=True)) == (
        "SP0860", head + "persistent=True")
    assert _code_message(lambda: plan(weight.values, weight.meta, x[:3], split_k=1, persistent=True)) == (
        "SP0860", head + "a token tile of 8 (3 tokens), persistent=True")
    w8, x8 = problem("e4m3", 256, 16, 512, seed=4)
    assert _code_message(lambda: plan(w8.values, w8.meta, x8.astype(np.float16), scale_w=1 / 64)) == (
        "SP0860", head + "16-bit x for e4m3 weights (quantized in the kernel)")
    assert _code_message(lambda: plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pair=1)) == (
        "SP0860", "pair of the decode kernel must be True, False or None, got 1")
    # split-K reduced in the kernel is only a conflict where there is a split
    assert plan(weight.values, weight.meta, x, split_k=1, reduce="kernel").config.pair


def test_the_kernel_checks_what_the_plan_checks():
    """The kernel's static asserts, for a launch that bypasses the plan's checks."""
    weight, x = problem("bf16", 256, 16, 512, seed=5)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pair=True, split_k=1)
    narrow = dataclasses.replace(plan, config=dataclasses.replace(plan.config, bn=8))
    with pytest.raises(CompileError, match=r"PAIR needs BN >= 16: each CTA loads BN/2 token rows of x"):
        narrow.compile("sm_90a")
    main = plan.launches()[0]
    with pytest.raises(CompileError, match=r"PAIR takes no in-kernel split-K reduction \(REDUCE\), no persistent "
                                           r"grid \(PERSIST\)"):
        main[0][main[1]].compile_for("sm_90a", *main[2], **{**main[3], "PERSIST": 1})


@pytest.mark.parametrize("dtype", ["f16", "bf16", "e4m3"])
def test_pair_kernels_compile_for_sm90a_without_spills(dtype, tmp_path):
    """BN = 64 (the largest token tile) with bias, gelu_tanh and split-K partial sums: a cluster of
    (2, 1, 1); x's two 128-byte panels multicast, the weight's boxes not; each consumer warpgroup's
    release a remote arrival; two cluster barriers; nvJitLink and ptxas: no spills, under maxnreg."""
    weight, x = problem(dtype, 300, 64, 512, seed=11)
    epi = {"scale_x": np.ones(64, np.float32), "scale_w": 0.5} if dtype == "e4m3" else {}
    for split in (1, 2):
        plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pair=True, split_k=split,
                                  activation="gelu_tanh" if split == 1 else None,
                                  bias=np.ones(300, np.float32) if split == 1 else None, **epi)
        ck = plan.compile("sm_90a")[0]
        ptx = ck.ptx
        assert ck.cluster == (2, 1, 1) and ".reqnctapercluster 2, 1, 1" in ptx
        copies = re.findall(r"cp\.async\.bulk\.tensor\S*", ptx)
        assert len(copies) == 4 and sum("multicast::cluster" in c for c in copies) == 2
        assert len(re.findall(r"mbarrier\.arrive\S*\.shared::cluster", ptx)) >= 1
        assert ptx.count("barrier.cluster.arrive") == 2 and ptx.count("barrier.cluster.wait") == 2
        # BK/32 sparse MMAs of m64n64k32 per step (e4m3: BK/64 of m64n64k64)
        assert len(re.findall(r"wgmma\.mma_async\.sp\.sync\.aligned\.m64n64k(?:32|64)", ptx)) == 4
        assert "0 bytes spill stores, 0 bytes spill loads" in ck.info_log, ck.info_log
        used = re.search(r"Used (\d+) registers", ck.info_log)
        assert used is not None and int(used[1]) <= 112
        report = ptxas_report(ptx, tmp_path)
        assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report
    # PDL: the prologue's x boxes (requested after the wait) are the CTA's multicast half too
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, pair=True, split_k=1, pdl=True, **epi)
    copies = re.findall(r"cp\.async\.bulk\.tensor\S*", plan.compile("sm_90a")[0].ptx)
    assert len(copies) == 8 and sum("multicast::cluster" in c for c in copies) == 4


# dtype, N_out, T, K, out_dtype, bias, act, sw, sx, split (test_decode_api.GPU_CASES' of more than 8
# tokens, and weights of an odd slab count)
GPU_PAIR_CASES = [c for c in GPU_CASES if c[2] > 8] + [
    ("bf16", 4 * 128 + 40, 33, 4096, None, "f32", "silu", None, None, 2),  # 5 slabs: CTA 5 beyond N_out
    ("e4m3", 2 * 128 + 40, 16, 2048, None, "f32", None, "channel", "token", 1),  # 3 slabs
]


@pytest.mark.gpu
@pytest.mark.parametrize("tiled,pdl", [(False, False), (True, True)])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", GPU_PAIR_CASES)
def test_gpu_decode_pair(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled, pdl):
    """The CTA-pair kernel on the GPU (both layouts, PDL), three runs from poisoned outputs against
    float64: x shared by multicast, and on odd slab counts a last CTA whose boxes lie beyond N_out."""
    plan = check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, tiled=tiled, pdl=pdl,
                            reduce="launch", pair=True)
    assert plan.config.pair and plan.grid[0] % 2 == 0
