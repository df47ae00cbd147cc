"""INFLIGHT = 1 of the decode kernel (sparse_decode_sm90.spk, ``plan_sparse_decode(inflight=True)``):
one sparse MMA group kept in flight across K steps, each stage released one step late, two
metadata register sets (SP0370).

In the interpreter, y (and the split-K partial sums) equal the default kernel's bit for bit, and both
are within the float64 bound of test_linear_api, with poisoned outputs: f16, bf16, e4m3 and the
kernels that quantize x, on CTA shares of 0, 1, 2, 3 and 5 K steps (split-K shares of 2, 2, 1, 0
among them), both split-K reductions, 64-, 128- and 256-row slabs, rings of 2 stages, and the
persistent kernel (ring steps numbered across slabs). A stage never released, or a wrong phase,
shows as the interpreter's deadlock, a wrong stage or x step as a wrong result; the interpreter
runs MMAs synchronously, so a stage released before the MMA reading it retired shows only on the
GPU (``test_gpu_inflight_equals_the_default``, marked gpu), and it runs no legality pass, so SP0370
is checked where the kernels are compiled for sm_90a: the PTX keeps one group in flight
(``wgmma.wait_group 1``), writes no in-flight metadata register, and ptxas fits the kernel's
register cap without spills."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparsile.backend.toolchain.ptx_inflight import metadata_hazards
from sparsile.stdlib.kernels.decode import plan_sparse_decode
from sparsile.stdlib.kernels.linear import quantize_per_token_e4m3

from .test_decode_api import GPU_CASES, check_gpu_decode, ptxas_report
from .test_decode_qx import X16, qx_problem
from .test_decode_qx import epilogue as qx_epilogue
from .test_linear_api import NP_OUT, _code_message, assert_linear_close, epilogue_case, problem

BK = {"f16": 128, "bf16": 128, "e4m3": 256}


def shares(k: int, bk: int, split: int) -> list[int]:
    """The K steps of each CTA along K (``k_share`` of sparse_decode_sm90.spk)."""
    steps = -(-k // bk)
    per = -(-steps // split)
    return [max(min(steps - s * per, per), 0) for s in range(split)]


def run_both(make):
    """The plan ``make(inflight)`` run with INFLIGHT 0 and 1, outputs (and workspaces) poisoned
    first; y and the split-K partial sums must be the same bits. Returns the INFLIGHT plan and its y."""
    got = []
    for inflight in (False, True):
        plan = make(inflight)
        assert plan.config.inflight == int(inflight)
        assert plan.constexprs().get("INFLIGHT") == (1 if inflight else None)
        plan.out[...] = np.nan
        if plan.workspace is not None:
            plan.workspace[...] = np.nan  # every share is written before it is read
        y = np.array(plan.run(), copy=True)
        work = None if plan.workspace is None else np.array(plan.workspace, copy=True)
        got.append((plan, y, work))
    (_, y0, w0), (plan, y1, w1) = got
    np.testing.assert_array_equal(y1.view(np.uint8), y0.view(np.uint8))
    if w0 is not None:
        assert not np.isnan(w1).any()
        np.testing.assert_array_equal(w1.view(np.uint8), w0.view(np.uint8))
    return plan, y1


# dtype, N_out, T, K, split_k, reduce, stages, bm, feature_major, the K steps of each CTA along K
CASES = [
    ("f16", 130, 3, 128, 1, None, 2, 128, False, [1]),
    ("bf16", 96, 16, 256, 1, None, 2, 64, False, [2]),
    ("e4m3", 130, 17, 600, 1, None, 3, 128, False, [3]),  # K ragged
    ("bf16", 200, 33, 640, 1, None, 2, 256, False, [5]),
    ("f16", 70, 64, 600, 1, None, 4, 128, True, [5]),
    ("bf16", 130, 4, 640, 4, "launch", 2, 128, False, [2, 2, 1, 0]),
    ("f16", 130, 16, 640, 4, "kernel", 3, 128, False, [2, 2, 1, 0]),
    ("e4m3", 200, 16, 1280, 2, "kernel", 2, 64, False, [3, 2]),
    ("e4m3", 70, 8, 768, 3, "launch", 2, 128, True, [1, 1, 1]),
    ("bf16", 130, 64, 1280, 2, "launch", 3, 128, False, [5, 5]),
]


@pytest.mark.parametrize("dtype,n_out,t,k,split,reduce,stages,bm,fm,steps", CASES)
def test_inflight_equals_the_default_bit_for_bit(dtype, n_out, t, k, split, reduce, stages, bm, fm, steps):
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k)
    want, epi = epilogue_case(dtype, n_out, t, "float32" if fm else None, "f32", "silu", "channel", "token")

    def make(inflight):
        out = np.full((n_out, t) if fm else (t, n_out), np.nan, NP_OUT[want])
        return plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype="float32" if fm else None,
                                  interpret=True, split_k=split, reduce=reduce, stages=stages, bm=bm,
                                  feature_major=fm, inflight=inflight, **epi)

    plan, y = run_both(make)
    assert (plan.config.split_k, plan.config.stages, plan.config.bm) == (split, stages, bm)
    assert plan.reduces_in_kernel == (reduce == "kernel")
    assert shares(plan.k_padded, BK[dtype], split) == steps
    assert_linear_close(y.T if fm else y, weight, x, k, dtype, want, **epi)


@pytest.mark.parametrize("dtype,n_out,t,k,bm,sms,stages", [
    ("bf16", 1000, 5, 384, 128, 3, 2),   # 8 slabs on 6 CTAs, 3 steps each on a ring of 2
    ("e4m3", 700, 33, 256, 64, 4, 3),    # 11 slabs on 8 CTAs, 1 step each
    ("f16", 520, 16, 640, 128, 2, 3),    # 5 slabs on 4 CTAs, 5 steps each
])
def test_inflight_persistent_kernel_equals_the_default(dtype, n_out, t, k, bm, sms, stages):
    """Ring steps j * num_k + k across a CTA's slabs: each slab's steps keep one group in flight and
    wait for every group before the slab's epilogue, so an odd count per slab moves the phases of
    the next slab's stages."""
    weight, x = problem(dtype, n_out, t, k, seed=n_out + k)
    want, epi = epilogue_case(dtype, n_out, t, "float32", "f32", "relu", "channel", "token")

    def make(inflight):
        out = np.full((t, n_out), np.nan, np.float32)
        return plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype="float32", interpret=True,
                                  bm=bm, split_k=1, stages=stages, persistent=True, num_sms=sms, inflight=inflight,
                                  **epi)

    plan, y = run_both(make)
    assert plan.config.persist and plan.constexprs()["PERSIST"] == 1 and plan.config.stages == stages
    assert -(-n_out // bm) > plan.config.persist  # some CTA streams two slabs
    assert_linear_close(y, weight, x, k, dtype, want, **epi)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu of the large row's y in float64
@pytest.mark.parametrize("xdt,n_out,t,k,split,reduce,stages,bm", [
    ("bf16", 130, 16, 1280, 1, None, 2, 128),     # 5 resident steps
    ("f16", 70, 4, 640, 3, "kernel", 4, 64),      # shares 1, 1, 1 (sparse_decode_reduce_e4m3_qx)
    ("bf16", 130, 33, 1100, 4, "launch", 2, 128),  # shares 2, 2, 1, 0, the scales to the second launch
])
def test_inflight_quantizing_kernels_equal_the_default(xdt, n_out, t, k, split, reduce, stages, bm):
    """RESIDENT x (sparse_decode_e4m3_qx, sparse_decode_reduce_e4m3_qx): x's buffer is indexed by the
    step, not the stage; both K steps of a pair read their own."""
    weight, x = qx_problem(xdt, n_out, t, k, seed=n_out + t + k)
    want = np.dtype(X16[xdt]).name
    epi = qx_epilogue(n_out, want, "f32", "silu", "channel", seed=t)

    def make(inflight):
        out = np.full((t, n_out), np.nan, NP_OUT[want])
        plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, interpret=True, split_k=split,
                                  reduce=reduce, stages=stages, bm=bm, inflight=inflight, **epi)
        if plan.x_scales is not None:
            plan.x_scales[...] = np.nan  # written by the kernel
        return plan

    plan, y = run_both(make)
    assert plan.quantizes_x and plan.config.split_k == split and plan.kernel.name.endswith("_qx")
    xq, sx = quantize_per_token_e4m3(x, interpret=True)
    assert_linear_close(y, weight, xq, k, "e4m3", want, scale_x=sx, **epi)


def test_inflight_is_checked():
    weight, x = problem("bf16", 130, 4, 256, seed=1)
    code, message = _code_message(lambda: plan_sparse_decode(weight.values, weight.meta, x, interpret=True,
                                                             inflight=1))
    assert code == "SP0860" and message == "inflight of the decode kernel must be True, False or None, got 1"
    assert plan_sparse_decode(weight.values, weight.meta, x, interpret=True).config.inflight == 0  # off by default


@pytest.mark.parametrize("dtype,bm", [("bf16", 128), ("bf16", 256), ("e4m3", 128)])
def test_inflight_compiles_for_sm90a_without_spills(dtype, bm, tmp_path):
    """BN = 64: the PTX keeps one group in flight (three copies of a step's BK/32 sparse MMAs: the
    pair of the unrolled loop and the odd tail), no in-flight metadata register is written
    (SP0370's PTX check), ptxas fits the register cap (112; 96 for 256-row slabs) without spills."""
    weight, x = problem(dtype, 1024, 64, 2048, seed=7)
    epi = {"scale_x": np.ones(64, np.float32), "scale_w": 0.5} if dtype == "e4m3" else {}
    plan = plan_sparse_decode(weight.values, weight.meta, x, split_k=1, bm=bm, inflight=True, **epi)
    (ck,) = plan.compile("sm_90a")
    ptx = ck.ptx
    assert "wgmma.wait_group.sync.aligned 1;" in ptx and "wgmma.wait_group.sync.aligned 0;" in ptx
    assert len(re.findall(r"wgmma\.mma_async\.sp", ptx)) == 3 * 4
    assert metadata_hazards(ptx) == []
    report = ptxas_report(ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report
    regs = int(re.search(r"Used (\d+) registers", report).group(1))
    assert regs <= plan.config.maxnreg <= 112


@pytest.mark.parametrize("dtype,x16,kw", [
    ("f16", False, {"split_k": 2, "reduce": "kernel"}),        # sparse_decode_reduce_f16
    ("e4m3", False, {"split_k": 3, "reduce": "launch"}),       # split-K partial sums
    ("bf16", False, {"split_k": 1, "persistent": True, "num_sms": 4, "tiled": True}),
    ("bf16", False, {"split_k": 1, "pdl": True, "bm": 64}),
    ("e4m3", True, {"split_k": 1}),                            # sparse_decode_e4m3_qx
    ("e4m3", True, {"split_k": 2, "reduce": "kernel"}),        # sparse_decode_reduce_e4m3_qx
])
def test_every_decode_kernel_compiles_with_inflight(dtype, x16, kw, tmp_path):
    """The interpreter runs no legality pass, so SP0370 is checked here, where the kernel is compiled:
    every variant of the decode kernel keeps one group in flight and passes both checks (the IR's
    and the PTX's), and ptxas fits it without spills (T = 16)."""
    weight, x = problem(dtype, 1024, 16, 2048, seed=8)
    epi = {"scale_w": 0.5} if dtype == "e4m3" else {}
    if x16:
        x = x.astype(np.float32).astype(np.float16)
    elif dtype == "e4m3":
        epi["scale_x"] = np.ones(16, np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, inflight=True, **kw, **epi)
    assert plan.quantizes_x == x16
    ck = plan.compile("sm_90a")[0]
    assert ck.name == plan.kernel.name and "wgmma.wait_group.sync.aligned 1;" in ck.ptx
    assert metadata_hazards(ck.ptx) == []
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report
    assert int(re.search(r"Used (\d+) registers", report).group(1)) <= plan.config.maxnreg


@pytest.mark.gpu
@pytest.mark.parametrize("options", [{}, {"reduce": "kernel", "stages": 2}, {"persistent": True, "num_sms": 8},
                                     {"bm": 64, "tiled": True}, {"bm": 256}])
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", GPU_CASES)
def test_gpu_inflight_equals_the_default(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, options):
    """On the GPU, where the MMAs run asynchronously (a stage released before the MMA reading it
    retired would be overwritten under it): INFLIGHT = 1 within the float64 bound, three runs from a
    poisoned output, and the same bits as the default kernel on the same configuration."""
    torch = pytest.importorskip("torch")
    if options.get("persistent"):
        if split is not None:
            pytest.skip("the persistent kernel takes no split-K")
        split = 1
    plans = [check_gpu_decode(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split, inflight=inflight, **options)
             for inflight in (True, False)]
    assert [p.config.inflight for p in plans] == [1, 0]
    assert torch.equal(plans[0].out, plans[1].out)
