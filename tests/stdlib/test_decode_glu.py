"""sparsile.stdlib.kernels.decode: the decode kernel's gated epilogue (activation "swiglu" or "geglu":
a weight of gate rows then up rows, y = silu(gate) * up or gelu_tanh(gate) * up) in the interpreter
against float64 references with poisoned outputs (f16, bf16, e4m3 with scales or x quantized by
the kernel; every reduction, slab size and the persistent kernel; a last slab of fewer features),
the errors with their codes, the plan's shared-memory budget, sm_90a compilation, and GPU runs
(marked gpu)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.kernels.decode import SMEM_PER_CTA, SMEM_PER_SM, SparseDecodePlan, plan_sparse_decode
from sparsile.stdlib.kernels.linear import (
    GATED_ACTIVATIONS,
    plan_sparse_linear,
    reference_activation,
    reference_linear,
    sparse_linear,
)

from .test_decode_api import ptxas_report
from .test_linear_api import HALF_ULP, NP_OUT, SMALLEST, _code_message, cuda_copy, epilogue_case, problem


def assert_glu_close(y, weight, x, k, dtype, out_dtype, activation="swiglu", **epi) -> None:
    """y = act(g) * u (silu for "swiglu", gelu_tanh for "geglu") within the bound that f32
    accumulation and the epilogue leave on g and u (the bound of test_linear_api.assert_linear_close
    before the activation, ``e``), carried through the product (|silu'| <= 1.10, |gelu_tanh'| <=
    1.13: 1.13 |u| e_g + |act(g)| e_u + e_g e_u), plus the f32 evaluation (2^-20 relative) and half
    an ulp of the output type. ``y`` also differs from the other gated activation's result (the
    epilogue applied the one asked for)."""
    assert str(y.dtype) == out_dtype
    y64 = np.asarray(y).astype(np.float64)
    assert not np.isnan(y64).any(), "unwritten outputs"
    dense = weight.dense().astype(np.float64)
    f = dense.shape[0] // 2
    scales = {"scale_x": epi.get("scale_x"), "scale_w": epi.get("scale_w")}
    pre = reference_linear(dense, x, bias=epi.get("bias"), **scales)
    scale = np.abs(reference_linear(np.abs(dense), np.abs(x.astype(np.float64)), **scales))
    acc = max(k, 1) * 2.0 ** -23 * scale
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * scale
    e = acc + 2.0 ** -20 * (np.abs(pre) + 1.0)
    g, u, eg, eu = pre[:, :f], pre[:, f:], e[:, :f], e[:, f:]
    gates = {name: reference_activation(g, gate) for name, gate in GATED_ACTIVATIONS.items()}
    ref = gates[activation] * u
    err = 1.13 * (np.abs(u) + eu) * eg + np.abs(gates[activation]) * eu + 2.0 ** -20 * (np.abs(ref) + 1.0)
    bound = err + HALF_ULP[out_dtype] * (np.abs(ref) + err) + SMALLEST[out_dtype]
    diff = np.abs(y64 - ref)
    assert (diff <= bound).all(), f"max error {diff.max()} (bound there {bound.flat[diff.argmax()]})"
    assert np.abs(ref).max() > 0.5  # a product of order 1, not a vanishing one
    other = next(name for name in GATED_ACTIVATIONS if name != activation)
    assert (np.abs(y64 - gates[other] * u) > bound).any(), f"y is {other}'s result"


# dtype, 2F (the weight's rows), T, K, out_dtype, bias, scale_w, scale_x, plan options
CASES = [
    ("bf16", 192, 5, 256, None, "f32", None, None, {}),
    ("f16", 160, 16, 384, "float32", "out", None, None, {"split_k": 2, "reduce": "launch"}),  # F = 80: a half slab
    ("bf16", 256, 33, 520, "float16", None, None, None, {"split_k": 3, "reduce": "kernel"}),
    ("f16", 96, 1, 256, None, "f32", "channel", "token", {"bm": 64}),
    ("bf16", 320, 64, 256, None, "out", None, None, {"bm": 64, "split_k": 2, "reduce": "kernel"}),
    ("bf16", 512, 8, 256, "float32", "f32", None, None, {"bm": 256, "split_k": 2, "reduce": "kernel"}),
    ("f16", 384, 3, 256, None, None, None, None, {"persistent": True, "num_sms": 1}),
    ("e4m3", 192, 16, 512, None, "f32", "channel", "token", {"split_k": 2, "reduce": "launch"}),
    ("e4m3", 160, 4, 512, "float16", "out", "tensor", "tensor", {"split_k": 2, "reduce": "kernel"}),
]


@pytest.mark.parametrize("activation", list(GATED_ACTIVATIONS))
@pytest.mark.parametrize("dtype,rows,t,k,out_dtype,bias,sw,sx,options", CASES)
def test_gated_matches_float64_reference(dtype, rows, t, k, out_dtype, bias, sw, sx, options, activation):
    weight, x = problem(dtype, rows, t, k, seed=rows + t + k)
    want, epi = epilogue_case(dtype, rows, t, out_dtype, bias, activation, sw, sx)
    out = np.full((t, rows // 2), np.nan, NP_OUT[want])
    plan = plan_sparse_decode(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              **options, **epi)
    assert plan.out is out and plan.ldy == rows // 2
    for option, value in options.items():
        if option in ("split_k", "bm"):
            assert getattr(plan.config, option) == value
    assert len(plan.launches()) == (2 if options.get("reduce") == "launch" else 1)
    # the exchange buffer is reserved where the decode kernel pairs the rows, not for partial sums
    assert plan.config.glu == (len(plan.launches()) == 1)
    for _ in range(2):  # twice: the in-kernel reduction leaves its counters at zero
        out[...] = np.nan
        y = plan.run()
        assert_glu_close(y, weight, x, k, dtype, want, **epi)


@pytest.mark.parametrize("activation", list(GATED_ACTIVATIONS))
def test_e4m3_weights_quantize_16_bit_x_in_the_kernel(activation):
    """e4m3 weights with bf16 x and no scale_x: the kernel quantizes x per token and applies those
    scales to both halves before pairing them."""
    weight, _ = problem("e4m3", 192, 6, 512, seed=5)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 512)).astype(np.float32).astype(NP_OUT["bfloat16"])
    scale_w = (rng.uniform(0.25, 2.0, 192) / 64).astype(np.float32)
    bias = rng.standard_normal(192).astype(np.float32)
    plan = plan_sparse_decode(weight.values, weight.meta, x, scale_w=scale_w, bias=bias, activation=activation,
                              interpret=True)
    assert plan.quantizes_x and plan.config.glu
    y = plan.run()
    # the kernel's own quantization of x: the reference multiplies the same e4m3 x and scales
    from sparsile.stdlib.kernels.linear import quantize_per_token_e4m3

    xq, sx = quantize_per_token_e4m3(x, interpret=True)
    assert_glu_close(y, weight, xq, 512, "e4m3", "bfloat16", activation, scale_w=scale_w, bias=bias, scale_x=sx)


@pytest.mark.parametrize("activation", list(GATED_ACTIVATIONS))
def test_gated_is_the_default_route_and_rebinds(activation):
    weight, x = problem("bf16", 128, 7, 256, seed=2)
    y = sparse_linear(weight.values, weight.meta, x, activation=activation, interpret=True)
    assert y.shape == (7, 64)
    assert_glu_close(y, weight, x, 256, "bf16", "bfloat16", activation)
    plan = plan_sparse_linear(weight.values, weight.meta, x, activation=activation, interpret=True)
    assert isinstance(plan, SparseDecodePlan) and plan.base.out_features == 64
    _, x2 = problem("bf16", 128, 7, 256, seed=3)
    y2 = plan.rebind(x2).run()
    assert y2.shape == (7, 64)
    assert_glu_close(y2, weight, x2, 256, "bf16", "bfloat16", activation)


def test_no_tokens_give_an_empty_output():
    weight, _ = problem("bf16", 128, 1, 256, seed=6)
    x = np.zeros((0, 256), NP_OUT["bfloat16"])
    y = sparse_linear(weight.values, weight.meta, x, activation="swiglu", interpret=True)
    assert y.shape == (0, 64) and str(y.dtype) == "bfloat16"


@pytest.mark.parametrize("activation", list(GATED_ACTIVATIONS))
def test_gated_errors_have_codes(monkeypatch, activation):
    weight, x = problem("bf16", 128, 4, 256, seed=4)
    v, m = weight.values, weight.meta
    code, message = _code_message(lambda: plan_sparse_linear(v, m, x, activation=activation, kernel="gemm",
                                                             interpret=True))
    assert code == "SP0860" and "decode kernel only" in message and "kernel='gemm'" in message
    assert f"activation {activation!r}" in message
    _, x65 = problem("bf16", 128, 65, 256, seed=4)
    code, message = _code_message(lambda: plan_sparse_linear(v, m, x65, activation=activation, interpret=True))
    assert code == "SP0860" and "not for 65 tokens" in message
    code, message = _code_message(lambda: plan_sparse_linear(v, m, x, activation=activation, target="sm_100a",
                                                             interpret=True))
    assert code == "SP0860" and "sm_100a" in message
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")
    code, _ = _code_message(lambda: plan_sparse_linear(v, m, x, activation=activation, interpret=True))
    assert code == "SP0860"
    monkeypatch.delenv("SPARSILE_DECODE_KERNEL")
    odd, xo = problem("bf16", 112, 4, 256, seed=4)  # halves of 56 rows: not whole 16-row metadata blocks
    code, message = _code_message(lambda: plan_sparse_linear(odd.values, odd.meta, xo, activation=activation,
                                                             interpret=True))
    assert code == "SP0850" and "multiple of 16" in message and "112 rows" in message
    assert f"activation {activation!r}" in message
    code, message = _code_message(lambda: plan_sparse_decode(v, m, x, activation=activation, tiled=True,
                                                             interpret=True))
    assert code == "SP0860" and "tiled" in message and repr(activation) in message
    # the tiled kernels' callers (sparsile.jax) refuse it by name, with the unfused computation as the fix
    from sparsile.stdlib.kernels.linear_args import TILED_ACTIVATIONS, activation_name
    from sparsile.stdlib.sparsity import SparsityError

    with pytest.raises(SparsityError) as info:
        activation_name(activation, TILED_ACTIVATIONS)
    assert info.value.code == "SP0850" and f"activation {activation!r}" in info.value.message
    assert f"{GATED_ACTIVATIONS[activation]}(y[:, :F]) * y[:, F:]" in info.value.help


@pytest.mark.parametrize("t,options,activation", [
    (16, {}, "swiglu"), (64, {}, "swiglu"), (1, {"bm": 64}, "swiglu"),
    (16, {"split_k": 2, "reduce": "kernel"}, "swiglu"), (16, {"persistent": True}, "swiglu"),
    (16, {}, "geglu"), (64, {"split_k": 2, "reduce": "kernel"}, "geglu"),
])
def test_gated_compiles_for_sm90a_within_its_shared_memory(t, options, activation, tmp_path):
    """The plan's budget holds the ring and the exchange buffer exactly; the kernel fits one CTA's
    limit, and two per SM where the plan counted on two. The epilogue exchanges through shared
    memory (st.shared / ld.shared) with two more barriers of the consumer partition than the plain
    kernel; each stage takes six TMA copies (two half boxes of values and of metadata, two panels
    of x); ptxas assembles it without spills under the plan's register cap."""
    rows, k = 2 * 14336, 4096
    values = np.zeros((rows, k // 2), NP_OUT["bfloat16"])
    meta = np.full((rows, k // 32), 0x44444444, np.uint32)
    x = np.ones((t, k), NP_OUT["bfloat16"])
    plan = plan_sparse_decode(values, meta, x, activation=activation, interpret=True, **options)
    cfg = plan.config
    ck = plan.compile("sm_90a")[0]
    # the plan's 128 bytes of alignment for the buffer, less the in-kernel reduction's 4-byte broadcast
    # of its arrival count (as without swiglu)
    assert ck.smem_bytes <= cfg.smem_bytes(2) <= ck.smem_bytes + 128 and cfg.smem_bytes(2) <= SMEM_PER_CTA
    if cfg.ctas_per_sm == 2:
        assert 2 * (ck.smem_bytes + 1024) <= SMEM_PER_SM
    assert re.search(r"st\.shared", ck.ptx) and re.search(r"ld\.shared", ck.ptx)
    plain = plan_sparse_decode(values, meta, x, interpret=True, **options).compile("sm_90a")[0]
    consumers = f"bar.sync 1, {cfg.bm * 2};"  # the consumer partition's named barrier (BM / 16 warps)
    assert ck.ptx.count(consumers) == plain.ptx.count(consumers) + 2
    copies = len(re.findall(r"cp\.async\.bulk\.tensor", ck.ptx))
    assert copies == len(re.findall(r"cp\.async\.bulk\.tensor", plain.ptx)) + 2
    report = ptxas_report(ck.ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report and "0 bytes stack frame" in report
    assert int(re.search(r"Used (\d+) registers", report).group(1)) <= cfg.maxnreg


@pytest.mark.parametrize("t,options,activation", [(8, {"bm": 256}, "swiglu"), (64, {}, "geglu"),
                                                  (16, {"split_k": 2, "reduce": "kernel"}, "swiglu")])
def test_gated_with_x_quantized_in_the_kernel_fits_its_plan(t, options, activation):
    """e4m3 weights, bf16 x quantized by the kernel: the plan's budget (ring, resident x, scales,
    exchange buffer and its alignment) covers the compiled kernel's shared memory."""
    rows, k = 2 * 14336, 4096
    values = np.zeros((rows, k // 2), np.uint8).view(ml_dtypes.float8_e4m3fn)
    meta = np.full((rows, k // 32), 0x44444444, np.uint32)
    x = np.ones((t, k), NP_OUT["bfloat16"])
    plan = plan_sparse_decode(values, meta, x, activation=activation, scale_w=np.ones(rows, np.float32),
                              interpret=True, **options)
    assert plan.quantizes_x
    ck = plan.compile("sm_90a")[0]
    assert ck.smem_bytes <= plan.config.smem_bytes(1) <= SMEM_PER_CTA


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rows,t,k,options,activation", [
    ("bf16", 2 * 14336, 1, 4096, {}, "swiglu"),
    ("bf16", 2 * 14336, 16, 4096, {}, "swiglu"),
    ("bf16", 2 * 14336, 64, 4096, {}, "swiglu"),
    ("f16", 2 * 1008, 5, 1024, {"split_k": 4, "reduce": "launch"}, "swiglu"),  # F = 1008: a last slab of 48
    ("bf16", 2 * 3584, 16, 8192, {"split_k": 4, "reduce": "kernel"}, "swiglu"),
    ("bf16", 2 * 4096, 16, 4096, {"bm": 64}, "swiglu"),
    ("bf16", 2 * 14336, 16, 4096, {"persistent": True}, "swiglu"),
    ("e4m3", 2 * 14336, 16, 4096, {}, "swiglu"),
    ("bf16", 2 * 16384, 16, 3072, {}, "geglu"),  # Gemma-7B's gate_up
    ("f16", 2 * 1008, 5, 1024, {"split_k": 4, "reduce": "launch"}, "geglu"),
    ("bf16", 2 * 3584, 16, 8192, {"split_k": 4, "reduce": "kernel"}, "geglu"),
    ("e4m3", 2 * 14336, 16, 4096, {}, "geglu"),
])
def test_gpu_gated_matches_float64_reference(dtype, rows, t, k, options, activation):
    """On torch CUDA tensors, three runs each from a poisoned output."""
    torch = pytest.importorskip("torch")
    weight, x = problem(dtype, rows, t, k, seed=rows + t)
    want, epi = epilogue_case(dtype, rows, t, None, "f32", activation, "channel" if dtype == "e4m3" else None,
                              "token" if dtype == "e4m3" else None)
    args = {name: cuda_copy(v) if isinstance(v, np.ndarray) else v for name, v in epi.items()}
    out = torch.empty((t, rows // 2), dtype=getattr(torch, want), device="cuda")
    plan = plan_sparse_decode(cuda_copy(np.asarray(weight.values)), weight.meta, cuda_copy(x), out=out, **options,
                              **args)
    for _ in range(3):
        out.fill_(float("nan"))
        plan.run()
        torch.cuda.synchronize()
        y = out.float().cpu().numpy().astype(NP_OUT[want])
        assert_glu_close(y, weight, x, k, dtype, want, **epi)
