"""The decode kernel that quantizes 16-bit x itself (``sparse_decode_e4m3_qx``,
``sparse_decode_reduce_e4m3_qx``): e4m3 weights with f16 / bf16 x and no scale_x, one launch.

In the interpreter its y equals, bit for bit, the two-launch path's (``quantize_per_token_e4m3``,
then the decode kernel on that e4m3 x with its scale_x, on the same configuration): x_q and the
scales come from the same f32 arithmetic, and the partial sums are scaled where the two-launch
path scales them. Both are checked against float64 from the quantized operands, with poisoned
outputs. Also: the plan (launches, the shared-memory rule, rebind), its errors, sm_90a compilation
(a single launch, ptxas without spills), and a GPU comparison of the two paths (marked gpu)."""

from __future__ import annotations

import re
import types

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.kernels import KERNELS, prune_and_compress
from sparsile.stdlib.kernels.decode import (
    QX_SCRATCH,
    SMEM_PER_CTA,
    SparseDecodePlan,
    choose_decode_config,
    plan_sparse_decode,
    resident_x_config,
)
from sparsile.stdlib.kernels.linear import plan_sparse_linear, quantize_per_token_e4m3, sparse_linear
from sparsile.stdlib.sparsity.errors import SparsityError

from .test_decode_api import ptxas_report
from .test_linear_api import NP_OUT, _code_message, assert_linear_close, cuda_copy

X16 = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def qx_problem(xdt: str, n_out: int, t: int, k: int, seed: int):
    """An e4m3 weight (values, meta) and 16-bit x (T, K) without zeros: rows of magnitudes from
    1e-2 to 10, the first row's amax large (3e4) and, with T > 1, the last row tiny (1e-6: its scale
    is the floor 1 / (448 * 512))."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, k)).astype(np.float32) * np.float32(128 / np.sqrt(k))
    x = rng.standard_normal((t, k)) * rng.uniform(0.01, 10, (t, 1))
    x = np.where(np.abs(x) < 1e-3, 1e-3, x)
    x[0, k // 3] = 3e4  # (with an f16 y, a case takes scale_w: y stays finite)
    if t > 1:
        x[-1] = np.sign(x[-1]) * rng.uniform(0.5, 1.0, k) * 1e-6
    return prune_and_compress(w, "e4m3"), x.astype(X16[xdt])


def epilogue(n_out: int, want: str, bias: str | None, act: str | None, sw: str | None, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {"activation": act}
    if bias is not None:
        out["bias"] = rng.standard_normal(n_out).astype(np.float32 if bias == "f32" else NP_OUT[want])
    if sw == "channel":
        out["scale_w"] = (rng.uniform(0.25, 2.0, n_out) / 64).astype(np.float32)
    elif sw == "tensor":
        out["scale_w"] = 1 / 64
    return out


def two_launch(weight, x, plan: SparseDecodePlan, **kw):
    """y of quantize_per_token_e4m3 then the decode kernel on its e4m3 x, on ``plan``'s
    configuration (split, stages, row slab, reduction), into a poisoned output; (y, x_q, scale_x)."""
    xq, sx = quantize_per_token_e4m3(x, interpret=True)
    c = plan.config
    out = np.full(plan.out.shape, np.nan, plan.out.dtype)
    kw["out_dtype"] = plan.base.out_dtype  # (an e4m3 x alone would give bfloat16 y)
    ref = plan_sparse_decode(weight.values, weight.meta, xq, scale_x=sx, out=out, interpret=True, split_k=c.split_k,
                             stages=c.stages, bm=c.bm, reduce="kernel" if plan.reduces_in_kernel else "launch", **kw)
    assert not ref.quantizes_x and (ref.config.split_k, ref.config.bm) == (c.split_k, c.bm)
    ref.run()
    return out, xq, sx


# xdt, N_out, T, K, out_dtype, bias, activation, scale_w, split_k, reduce, bm, tiled, pdl
# (K ragged: 600, 2100, 1500, 520, 1000, 264; phase 2 in chunks of 4, 2 and 1 steps with a
# remainder, and in halves / quarters of the tokens at BN = 64 and 32)
CASES = [
    ("bf16", 200, 1, 2100, None, None, None, None, 1, None, 128, False, False),
    ("f16", 130, 3, 1500, "float32", "f32", "relu", "channel", 2, "launch", 128, False, False),
    ("bf16", 130, 3, 600, None, "out", "silu", "tensor", None, None, None, False, False),
    ("bf16", 200, 16, 2100, "bfloat16", "f32", "gelu_tanh", "channel", 3, "kernel", 128, False, False),
    ("f16", 96, 16, 1000, None, None, "silu", "channel", 2, "launch", 64, True, True),
    ("bf16", 130, 64, 520, None, "f32", "relu", "channel", 1, None, 128, False, False),
    ("f16", 70, 64, 1000, "bfloat16", "out", None, "channel", 2, "kernel", 64, False, False),
    ("bf16", 136, 33, 1500, "float32", None, "gelu_tanh", "tensor", 3, "launch", 64, False, False),
    ("f16", 70, 1, 264, None, "f32", None, "channel", None, None, None, True, True),
    ("bf16", 130, 4, 1100, None, None, "relu", "channel", 4, "kernel", 128, False, False),  # shares 2, 2, 1, 0
    # from the review of the one-launch kernel: more token counts (2, 8, 9, 17), splits beyond the
    # K steps (shares 1, 1, 1, 1 and 2, 1, 0 reduced by a second launch), K of one step and below
    ("bf16", 70, 2, 600, None, None, None, "channel", 1, None, 64, False, False),
    ("f16", 130, 8, 264, None, "f32", "relu", "channel", 2, "launch", 128, False, False),
    ("bf16", 70, 9, 1000, None, None, None, "tensor", 4, "launch", 64, False, False),
    ("bf16", 70, 17, 520, "float32", None, None, "channel", 3, "launch", 64, False, False),
    ("f16", 130, 64, 1100, None, "f32", "silu", "channel", 2, "kernel", 64, True, False),
    ("bf16", 200, 33, 2100, None, None, None, "channel", 5, "launch", 128, True, True),
    ("bf16", 64, 1, 256, None, None, None, None, 1, None, 64, False, False),
    ("bf16", 64, 5, 255, None, None, None, "channel", 1, None, 64, False, False),
]


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # silu of the large row's y in float64
@pytest.mark.parametrize("xdt,n_out,t,k,out_dtype,bias,act,sw,split,reduce,bm,tiled,pdl", CASES)
def test_one_launch_equals_two_launches(xdt, n_out, t, k, out_dtype, bias, act, sw, split, reduce, bm, tiled, pdl):
    """y is the two-launch path's bit for bit, and both are within the e4m3 bound of float64
    computed from the quantized operands; a second run (re-zeroed counters, rewritten scales) too."""
    weight, x = qx_problem(xdt, n_out, t, k, seed=n_out + t + k)
    want = out_dtype or np.dtype(X16[xdt]).name  # a 16-bit x gives y of its type by default
    epi = epilogue(n_out, want, bias, act, sw, seed=t)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, reduce=reduce, bm=bm, tiled=tiled, pdl=pdl, **epi)
    steps = -(-k // 256)
    assert plan.quantizes_x and plan.config.xsteps == -(-steps // plan.config.split_k)
    assert plan.constexprs()["XROWS"] == 1 << (t - 1).bit_length()  # T = 1, 3, 4: fewer rows than BN = 8
    split_launch = plan.config.split_k > 1 and not plan.reduces_in_kernel
    assert len(plan.launches()) == (2 if split_launch else 1)
    assert (plan.x_scales is not None) == split_launch
    if plan.workspace is not None:
        plan.workspace[...] = np.nan  # every share is written before it is read
    if split_launch:
        plan.x_scales[...] = np.nan  # written by the kernel
    want_y, xq, sx = two_launch(weight, x, plan, out_dtype=out_dtype, tiled=tiled, pdl=pdl, **epi)
    for _ in range(2):
        out[...] = np.nan
        assert plan.run() is out
        np.testing.assert_array_equal(out.view(np.uint8), want_y.view(np.uint8))
    if split_launch:
        np.testing.assert_array_equal(plan.x_scales, sx)
    assert_linear_close(out, weight, xq, k, "e4m3", want, scale_x=sx, **epi)
    assert_linear_close(want_y, weight, xq, k, "e4m3", want, scale_x=sx, **epi)
    assert np.abs(xq.astype(np.float32)).max(1)[0] == 448  # the large row uses the whole e4m3 range
    if t > 1:
        assert sx[-1] == np.float32(1 / (448 * 512))  # the tiny row takes the floor


@pytest.mark.parametrize("xdt", ["bf16", "f16"])
def test_sparse_linear_plans_one_launch_by_default(monkeypatch, xdt):
    """sparse_linear / plan_sparse_linear with e4m3 weights and 16-bit x and no scale_x: the decode
    kernel that quantizes x (the default for T <= 64) in one launch, no longer SP0852; torch CPU
    tensors too; with SPARSILE_DECODE_KERNEL=0 or kernel="gemm" the tiled kernels still refuse it."""
    monkeypatch.delenv("SPARSILE_DECODE_KERNEL", raising=False)
    weight, x = qx_problem(xdt, 130, 5, 520, seed=3)
    plan = plan_sparse_linear(weight.values, weight.meta, x, scale_w=1 / 64, interpret=True)
    assert isinstance(plan, SparseDecodePlan) and plan.quantizes_x
    ((kernel, grid, args, cx),) = plan.launches()
    assert kernel.name == "sparse_decode_e4m3_qx" and grid == (-(-130 // plan.config.bm), plan.config.split_k)
    assert args[2] is plan.x and plan.x.dtype == X16[xdt] and plan.x.shape == (5, 520)  # x as passed: no copy
    assert args[7:] == (130, 5, 768, 520, 520, 130) and args[6] == 0  # M, N, K, KX, ldx, ldy; no SX
    assert cx["XSTEPS"] == 3 and cx["XROWS"] == 8 and "SCALE_X" not in cx and cx["SCALE_W"] == 1
    want, _, _ = two_launch(weight, x, plan, scale_w=1 / 64)
    y = sparse_linear(weight.values, weight.meta, x, scale_w=1 / 64, interpret=True)
    assert y.dtype == X16[xdt]
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(x.view(np.int16)).view(getattr(torch, np.dtype(X16[xdt]).name))
    yt = sparse_linear(weight.values, weight.meta, xt, scale_w=1 / 64, interpret=True)
    assert isinstance(yt, torch.Tensor) and yt.dtype == xt.dtype
    np.testing.assert_array_equal(yt.view(torch.int16).numpy(), want.view(np.int16))
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
    message = f"e4m3 weights need e4m3 activations, got x of {np.dtype(X16[xdt]).name}"
    assert _code_message(lambda: plan_sparse_linear(weight.values, weight.meta, x, interpret=True)) == (
        "SP0852", message)
    monkeypatch.delenv("SPARSILE_DECODE_KERNEL")
    assert _code_message(lambda: plan_sparse_linear(weight.values, weight.meta, x, kernel="gemm",
                                                    interpret=True)) == ("SP0852", message)


def test_a_16_bit_x_with_scale_x_is_an_error():
    """scale_x is the scale of e4m3 x: with a 16-bit x it is SP0852 on every path, planned or
    rebound. Where the decode kernel quantizes x itself the help says to pass x alone; where no
    kernel does (kernel="gemm", T > 64, Blackwell) it says to quantize first, and following it works;
    an f32 x keeps the old message."""
    weight, x = qx_problem("bf16", 64, 4, 256, seed=5)
    message = ("SP0852", "scale_x is the scale of e4m3 activations: e4m3 weights with x of bfloat16 take none")
    for plan in (plan_sparse_linear, plan_sparse_decode):
        for kw in ({}, {"kernel": "decode"}):
            if plan is plan_sparse_decode and kw:
                continue
            assert _code_message(lambda: plan(weight.values, weight.meta, x, scale_x=np.ones(4, np.float32),  # noqa: B023
                                              interpret=True, **kw)) == message  # noqa: B023
    tiled = ("SP0852", "e4m3 weights need e4m3 activations, got x of bfloat16 with a scale_x")
    _, x_t = qx_problem("bf16", 64, 100, 256, seed=5)  # T > 64: the tiled kernels
    for xx, kw in ((x, {"kernel": "gemm"}), (x_t, {}), (x, {"target": "sm_100a"})):
        with pytest.raises(SparsityError) as err:
            plan_sparse_linear(weight.values, weight.meta, xx, scale_x=np.ones(xx.shape[0], np.float32),
                               interpret=True, **kw)
        assert (err.value.code, err.value.message) == tiled and "quantize_per_token_e4m3(x)" in err.value.help
        with pytest.raises(SparsityError) as again:  # x alone is refused there too, with the same fix
            plan_sparse_linear(weight.values, weight.meta, xx, interpret=True, **kw)
        assert again.value.code == "SP0852" and "quantize_per_token_e4m3(x)" in again.value.help
    planned = plan_sparse_decode(weight.values, weight.meta, x, interpret=True)
    assert _code_message(lambda: planned.rebind(x, scale_x=0.5)) == message
    assert _code_message(lambda: plan_sparse_linear(weight.values, weight.meta, x.astype(np.float32),
                                                    interpret=True)) == (
        "SP0852", "e4m3 weights need e4m3 activations, got x of float32")


def test_rebind_takes_a_new_x_as_passed():
    weight, x = qx_problem("bf16", 200, 16, 1000, seed=6)
    _, x2 = qx_problem("bf16", 200, 16, 1000, seed=7)
    for reduce in ("launch", "kernel"):
        plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=2, reduce=reduce,
                                  activation="relu", scale_w=1 / 64)
        out = np.full((16, 200), np.nan, ml_dtypes.bfloat16)
        again = plan.rebind(x2, out)
        assert again.x is not plan.x and again.meta is plan.meta and again.workspace is plan.workspace
        assert again.x_scales is plan.x_scales and again.counters is plan.counters and again.quantizes_x
        assert again.run() is out
        want, _, _ = two_launch(weight, x2, again, activation="relu", scale_w=1 / 64)
        np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
        assert _code_message(lambda: plan.rebind(x2[:3])) == (  # noqa: B023
            "SP0853", "the plan is for x of shape (16, 1000) bfloat16, got (3, 1000) bfloat16")


def test_the_resident_x_rule_keeps_the_config_or_splits():
    """The H200 table's e4m3 choices (as the plan takes them) with x resident: kept where they fit,
    a ring of at least QX_MIN_STAGES = 4 stages where that fits, fewer stages, or the smallest split
    that fits; a caller's split and stages are kept (SP0852 where they do not fit); every result
    within a CTA's 227 KB."""

    def fitted(m, k, t, table_split, table_stages, bm, **asked):
        cfg = choose_decode_config(m, t, k, KERNELS["e4m3"], 132, table_split, table_stages, bm)
        base = types.SimpleNamespace(k_padded=k, k=k, t=t, choice=KERNELS["e4m3"], x_dtype="bfloat16")
        got = resident_x_config(base, cfg, asked.get("split_k"), asked.get("stages"))
        assert got.smem_bytes(1) <= SMEM_PER_CTA and got.xsteps == -(-(k // 256) // got.split_k)
        ring = got.stages * (got.bm * 128 + got.bm * 32 + 16)  # values, metadata words, barriers
        assert got.smem_bytes(1) == ring + got.xsteps * got.bn * 256 + QX_SCRATCH
        return got.split_k, got.stages, got.xsteps

    assert fitted(4096, 4096, 16, 1, 6, 64) == (1, 6, 16)        # 8B qkv / o: the entry as it is
    assert fitted(4096, 14336, 16, 4, 3, 64) == (4, 4, 14)       # 8B down: its split, 4 stages
    assert fitted(4096, 14336, 16, 4, 3, 64, stages=3) == (4, 3, 14)  # (the caller's 3 kept)
    assert fitted(28672, 4096, 1, 1, 2, 128) == (1, 4, 16)       # 8B gate_up: 2 stages deepened to 4
    assert fitted(10240, 8192, 16, 1, 5, 128) == (1, 4, 32)      # 70B qkv: one stage fewer
    assert fitted(8192, 28672, 1, 1, 6, 64) == (2, 6, 56)        # 70B down: a split
    assert fitted(8192, 28672, 16, 1, 6, 64) == (3, 6, 38)
    assert fitted(28672, 4096, 64, 1, 3, 128) == (2, 4, 8)
    assert fitted(28672, 4096, 64, 2, 2, 128, split_k=2) == (2, 4, 8)  # a split of the caller's: the ring deepened
    assert fitted(10240, 8192, 16, 1, 5, 128, stages=5) == (2, 5, 16)  # the caller's stages kept
    cfg = choose_decode_config(8192, 16, 28672, KERNELS["e4m3"], 132, 1, 6, 64)
    base = types.SimpleNamespace(k_padded=28672, k=28672, t=16, choice=KERNELS["e4m3"], x_dtype="bfloat16")
    code, message = _code_message(lambda: resident_x_config(base, cfg, 1, None))
    assert code == "SP0852" and message.endswith("16 tokens of K = 28672 do not (bm=64, split_k=1)")


def test_x_that_does_not_fit_is_sp0852():
    """T = 64 of K = 46080 (180 steps of 16 KB of x) fits at no split: quantize x first."""
    weight, x = qx_problem("f16", 64, 64, 46080, seed=8)
    code, message = _code_message(lambda: plan_sparse_linear(weight.values, weight.meta, x, interpret=True))
    assert code == "SP0852" and "share of x fits in shared memory next to the weight ring" in message
    assert message.endswith("64 tokens of K = 46080 do not (bm=128)")


# (reduce="kernel" at T = 64 spills under the 112-register cap, 684 bytes with this epilogue, as the
# e4m3 kernel on a quantized x does, 800: docs/hopper.md)
@pytest.mark.parametrize("t,split,reduce,bm,pdl", [(1, 1, None, 128, False), (16, 1, None, 64, True),
                                                   (64, 1, None, 128, False), (32, 4, "kernel", 128, False),
                                                   (4, 4, "launch", 64, False)])
def test_compiles_for_sm90a_as_one_launch(t, split, reduce, bm, pdl, tmp_path):
    """For sm_90a: one launch without a split-K reduction; two TMA copies per step (values and
    metadata, no x), the proxy fence before the MMAs, 16-byte loads of x; its shared memory within
    the plan's budget; ptxas: no spills, under the 112-register cap. PDL: only the consumers wait."""
    weight, x = qx_problem("bf16", 256, t, 1024, seed=9)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, split_k=split, reduce=reduce, bm=bm,
                              pdl=pdl, bias=np.ones(256, np.float32), activation="silu",
                              scale_w=np.full(256, 1 / 64, np.float32))
    compiled = plan.compile("sm_90a")
    assert len(compiled) == len(plan.launches()) == (2 if reduce == "launch" else 1)
    ck = compiled[0]
    assert ck.name == ("sparse_decode_reduce_e4m3_qx" if reduce == "kernel" else "sparse_decode_e4m3_qx")
    ptx = ck.ptx
    assert len(re.findall(r"wgmma\.mma_async\.sp\.sync\.aligned\.m64n\d+k64\.f32\.e4m3\.e4m3", ptx)) == 4
    assert len(re.findall(r"cp\.async\.bulk\.tensor", ptx)) == 2
    assert ptx.count("fence.proxy.async.shared::cta;") == 1 and "ld.global.v4.b32" in ptx
    assert ptx.count("griddepcontrol.wait;") == (1 if pdl else 0)
    cfg = plan.config
    assert cfg.smem_bytes(1) - QX_SCRATCH < ck.smem_bytes <= cfg.smem_bytes(1)
    report = ptxas_report(ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report
    assert int(re.search(r"Used (\d+) registers", report).group(1)) <= 112


# the Llama-3 8B weights (N_out x K): qkv, o, gate/up, down
GPU_SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", [None, "kernel"])
@pytest.mark.parametrize("t", [1, 4, 16])
@pytest.mark.parametrize("n_out,k", GPU_SHAPES)
def test_gpu_one_launch_matches_two_launches(n_out, k, t, reduce):
    """On the GPU, torch bf16 x: the one-launch plan (the shipped table's configuration, fitted to
    the resident x) against quantize_per_token_e4m3 + the decode kernel on that e4m3 x with its
    scale_x on the same configuration: the same bits, and both within the e4m3 bound of float64;
    three runs from a poisoned output."""
    _gpu_one_launch_matches_two_launches(n_out, k, t, reduce)


@pytest.mark.gpu
@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("t", [8, 33, 64])
@pytest.mark.parametrize("n_out,k", [(4096, 4096), (1000, 2112)])
def test_gpu_one_launch_at_more_tokens(n_out, k, t, bm):
    """As above at T = 8, 33 and 64 with both slab heights: the resident x's row slices of 16 and
    32 tokens at offsets 16 and 32 (the swizzled stores that T <= 16 never makes), a ragged M and K."""
    _gpu_one_launch_matches_two_launches(n_out, k, t, None, bm=bm)


def _gpu_one_launch_matches_two_launches(n_out: int, k: int, t: int, reduce: str | None, **plan_kw) -> None:
    torch = pytest.importorskip("torch")
    weight, x = qx_problem("bf16", n_out, t, k, seed=n_out + t)
    want, epi = "bfloat16", epilogue(n_out, "bfloat16", "f32", "silu", "channel", seed=t)
    dev = {key: cuda_copy(v) if key != "activation" else v for key, v in epi.items()}
    values, xd = cuda_copy(np.asarray(weight.values)), cuda_copy(x)
    out = torch.full((t, n_out), float("nan"), device="cuda", dtype=torch.bfloat16)
    if plan_kw:  # a slab height of the caller's: the decode kernel's own planner
        plan = plan_sparse_decode(values, weight.meta, xd, out=out, reduce=reduce, **plan_kw, **dev)
    else:
        plan = plan_sparse_linear(values, weight.meta, xd, out=out, reduce=reduce, **dev)
    assert isinstance(plan, SparseDecodePlan) and plan.quantizes_x
    assert len(plan.launches()) == (2 if plan.config.split_k > 1 and reduce is None else 1)
    xq, sx = quantize_per_token_e4m3(xd)
    c = plan.config
    ref_out = torch.full_like(out, float("nan"))
    ref = plan_sparse_decode(values, weight.meta, xq, scale_x=sx, out=ref_out, split_k=c.split_k, stages=c.stages,
                             bm=c.bm, reduce=reduce, **dev)
    ref.run()
    torch.cuda.synchronize()
    host_xq = xq.view(torch.uint8).cpu().numpy().view(ml_dtypes.float8_e4m3fn)
    for _ in range(3):
        out.fill_(float("nan"))
        plan.run()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), ref_out.view(torch.int16))
    y = out.float().cpu().numpy().astype(ml_dtypes.bfloat16)
    assert_linear_close(y, weight, host_xq, k, "e4m3", want, scale_x=sx.cpu().numpy(), **epi)


def test_256_row_slabs_that_quantize_x_plan_one_cta_per_sm():
    """17 warps of up to 96 registers: two 256-row CTAs never share an SM, whatever ring and resident
    x fit in half its shared memory (the rule choose_decode_config applies, here for the kernel that
    quantizes x, whose resident_x_config sizes the occupancy again)."""
    weight, x = qx_problem("bf16", 512, 4, 512, seed=3)
    plan = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=256, stages=2)
    assert plan.quantizes_x and plan.config.bm == 256 and plan.config.ctas_per_sm == 1
    small = plan_sparse_decode(weight.values, weight.meta, x, interpret=True, bm=128, stages=2)
    assert small.config.ctas_per_sm == 2  # the same ring and x of 128-row slabs fit twice
