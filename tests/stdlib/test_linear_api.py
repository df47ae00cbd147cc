"""sparsile.stdlib.kernels.linear: sparse_linear's fused epilogue (transposed store, output type,
bias, activation, fp8 scales; split-K, CTA pairs) in the interpreter against float64 references
with poisoned outputs, the plan (launches, rebind), quantize_per_token_e4m3, argument errors with
their codes, sm_90a compilation, and GPU runs (marked gpu).

These tests are about the tiled kernels, so SPARSILE_DECODE_KERNEL=0 keeps them planned for
T <= 64 too (where the decode kernel is the default: test_decode_api.py)."""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from sparsile.stdlib.kernels import prune_and_compress
from sparsile.stdlib.kernels.linear import (
    plan_sparse_linear,
    quantize_per_token_e4m3,
    reference_linear,
    sparse_linear,
)
from sparsile.stdlib.sparsity import SparsityError


@pytest.fixture(autouse=True)
def _tiled_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSILE_DECODE_KERNEL", "0")

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}
NP_OUT = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}
SMALLEST = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134, "float32": 2.0 ** -150}  # half the subnormal step


def problem(dtype: str, n_out: int, t: int, k: int, seed: int):
    """A pruned weight (values, meta) and activations x (T, K) of ``dtype``, y of order 1 (e4m3: x
    uses the range of e4m3, and the scales of `vectors` bring y back)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, k)).astype(np.float32) * np.float32(2 / np.sqrt(k))
    x = rng.standard_normal((t, k)).astype(np.float32)
    if dtype == "e4m3":
        w = w * 64  # the e4m3 weight uses its range; its scale_w brings it back
        x = (x / np.abs(x).max(1, keepdims=True) * 448).astype(HOST[dtype])
    else:
        x = x.astype(HOST[dtype])
    return prune_and_compress(w, dtype), x


def vectors(kind: str | None, size: int, rng: np.random.Generator, unit: float = 1 / 64) -> Any:
    """None, one value ("tensor") or ``size`` f32 values ("channel", "token"), around ``unit``."""
    if kind is None:
        return None
    if kind == "tensor":
        return float(rng.uniform(0.5, 2.0)) * unit
    return (rng.uniform(0.25, 2.0, size) * unit).astype(np.float32)


def epilogue_case(dtype: str, n_out: int, t: int, out_dtype: str | None, bias: str | None, act: str | None,
                  sw: str | None, sx: str | None) -> tuple[str, dict[str, Any]]:
    """(y's dtype name, the epilogue keyword arguments) of a parametrized case: bias None, "f32" or
    "out" (y's type); scales None, "tensor", "channel" / "token"."""
    rng = np.random.default_rng(t)
    want = out_dtype or ("bfloat16" if dtype == "e4m3" else np.dtype(HOST[dtype]).name)
    b = None if bias is None else rng.standard_normal(n_out).astype(np.float32 if bias == "f32" else NP_OUT[want])
    return want, dict(bias=b, activation=act, scale_w=vectors(sw, n_out, rng), scale_x=vectors(sx, t, rng, 3 / 448))


def assert_linear_close(y, weight, x, k, dtype, out_dtype, **epi) -> None:
    """y within the bound of f32 accumulation (Hopper's ~14-bit accumulator for e4m3: (K/64 + 1)·
    2^-13·Σ|wx|, test_gemm_api.assert_close), scaled by the scales, the few f32 epilogue roundings
    (2^-20 relative, activation included), times the activation's Lipschitz constant (1.13 for
    gelu_tanh and silu), plus half an ulp of the output type."""
    linear_check(weight, x, k, dtype, out_dtype, **epi)(y)


def linear_check(weight, x, k, dtype, out_dtype, **epi):
    """:func:`assert_linear_close` for one (weight, x, epilogue) with its float64 reference and bound
    computed once: a function of y (for tests that check many outputs of one input)."""
    dense = weight.dense().astype(np.float64)
    ref = reference_linear(dense, x, **epi)
    scale = np.abs(reference_linear(np.abs(dense), np.abs(x.astype(np.float64)),
                                    scale_x=epi.get("scale_x"), scale_w=epi.get("scale_w")))
    acc = max(k, 1) * 2.0 ** -23 * scale
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * scale
    pre = reference_linear(dense, x, scale_x=epi.get("scale_x"), scale_w=epi.get("scale_w"), bias=epi.get("bias"))
    err = 1.13 * (acc + 2.0 ** -20 * (np.abs(pre) + 1.0))
    bound = err + HALF_ULP[out_dtype] * (np.abs(ref) + err) + SMALLEST[out_dtype]

    def check(y) -> None:
        assert str(y.dtype) == out_dtype
        y64 = np.asarray(y).astype(np.float64)
        assert not np.isnan(y64).any(), "unwritten outputs"
        diff = np.abs(y64 - ref)
        assert (diff <= bound).all(), f"max error {diff.max()} (bound there {bound.flat[diff.argmax()]})"

    return check


# ------------------------------------------------------------------------------------------------
# numerics in the interpreter


CASES = [
    # dtype, N_out, T, K, out_dtype, bias, activation, scale_w, scale_x, split_k
    ("f16", 130, 17, 96, None, "f32", "relu", None, None, 1),
    ("f16", 96, 1, 64, "float32", None, "silu", None, None, 2),
    ("f16", 100, 30, 80, "bfloat16", "out", None, "tensor", "token", 1),
    ("bf16", 200, 40, 192, "float32", "out", "gelu_tanh", None, None, 1),
    ("bf16", 150, 9, 100, "float16", "f32", None, None, None, 3),      # K padded to 112
    ("e4m3", 130, 23, 128, None, "f32", "silu", "channel", "token", 1),
    ("e4m3", 96, 5, 192, "float32", None, "gelu_tanh", "tensor", "tensor", 2),
    ("e4m3", 200, 33, 160, "float16", "out", "relu", "channel", "tensor", 2),
]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", CASES)
def test_epilogue_matches_float64_reference(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              split_k=split, **epi)
    assert plan.split_k == split and len(plan.launches()) == (2 if split > 1 else 1)
    y = sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True, split_k=split,
                      **epi)
    assert y is out and y.shape == (t, n_out)
    assert_linear_close(y, weight, x, k, dtype, want, **epi)


@pytest.mark.parametrize("act,split", [("relu", 1), ("silu", 2), ("gelu_tanh", 1), ("gelu_tanh", 2)])
def test_activation_of_exact_sums(act, split):
    """Operands whose products and sums are exact in f32 (multiples of 1/32, |y| < 2^19): the only
    errors left are the epilogue's f32 roundings (2^-20 relative) and the f32 store, so a slightly
    wrong activation (gelu with erf instead of tanh: 1e-3 apart) fails."""
    rng = np.random.default_rng(13)
    w = (rng.integers(-4, 5, (120, 64)) / 4).astype(np.float32)
    x = (rng.integers(-4, 5, (11, 64)) / 8).astype(np.float16)
    weight = prune_and_compress(w, "f16")
    bias = (rng.integers(-8, 9, 120) / 8).astype(np.float32)
    scale_w = rng.uniform(0.5, 1.5, 120).astype(np.float32) / 4
    out = np.full((11, 120), np.nan, np.float32)
    y = sparse_linear(weight.values, weight.meta, x, bias=bias, activation=act, scale_w=scale_w, out=out,
                      out_dtype="float32", split_k=split, interpret=True)
    pre = reference_linear(weight.dense(), x, bias=bias, scale_w=scale_w)
    assert np.abs(pre).max() < 8 and (np.abs(pre) > 0.1).mean() > 0.5  # the activation's curved part
    ref = reference_linear(weight.dense(), x, bias=bias, activation=act, scale_w=scale_w)
    bound = 1.13 * 2.0 ** -20 * (np.abs(pre) + 1.0) + 2.0 ** -24 * np.abs(ref)
    assert (np.abs(y - ref) <= bound).all(), np.abs(y - ref).max()


def test_pair_kernel_epilogue():
    """A large output (>= 4 tiles per SM with num_sms=2) runs sparse_linear_<t>_pair, persistent."""
    weight, x = problem("bf16", 1000, 20, 64, seed=3)
    bias = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    plan = plan_sparse_linear(weight.values, weight.meta, x, bias=bias, activation="silu", interpret=True, num_sms=2)
    assert plan.pair and plan.kernel.name == "sparse_linear_bf16_pair" and "SPLIT_K" not in plan.constexprs()
    y = plan.run()
    assert_linear_close(y, weight, x, 64, "bf16", "bfloat16", bias=bias, activation="silu")


def test_torch_cpu_tensors_and_strided_x():
    torch = pytest.importorskip("torch")
    weight, x = problem("bf16", 96, 12, 64, seed=4)
    xt = torch.from_numpy(np.ascontiguousarray(x.T).view(np.int16)).view(torch.bfloat16).T  # strided (12, 64)
    assert not xt.is_contiguous()
    scale_x = torch.rand(12, 1) + 0.5
    y = sparse_linear(weight.values, weight.meta, xt, scale_x=scale_x, interpret=True)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == (12, 96)
    y = y.float().numpy().astype(ml_dtypes.bfloat16)
    assert_linear_close(y, weight, x, 64, "bf16", "bfloat16", scale_x=scale_x.numpy())


def test_a_numpy_out_that_is_the_memory_of_a_torch_cpu_x_gets_the_layer_of_x_as_passed():
    """x a torch CPU tensor over the numpy array passed as out (T = N_out = K, two tiles of tokens):
    the interpreter reads x's memory in place, so y must not be stored there while x is read."""
    torch = pytest.importorskip("torch")
    weight, x0 = problem("f16", 256, 256, 256, seed=13)
    x = x0.copy()
    assert sparse_linear(weight.values, weight.meta, torch.from_numpy(x), out=x, interpret=True, split_k=1) is x
    assert_linear_close(x, weight, x0, 256, "f16", "float16")


def test_rebind_reuses_the_plan_for_new_activations():
    weight, x = problem("e4m3", 130, 7, 128, seed=5)
    _, x2 = problem("e4m3", 130, 7, 128, seed=6)
    sw = np.random.default_rng(5).uniform(0.5, 1, 130).astype(np.float32) / 64
    sx, sx2 = np.full(7, 1 / 448, np.float32), np.linspace(0.001, 0.004, 7).astype(np.float32)
    plan = plan_sparse_linear(weight.values, weight.meta, x, scale_w=sw, scale_x=sx, interpret=True, split_k=2)
    out = np.full((7, 130), np.nan, ml_dtypes.bfloat16)
    again = plan.rebind(x2, out, scale_x=sx2)
    assert again.meta is plan.meta and again.workspace is plan.workspace and again.out is out
    assert again.run() is out
    assert_linear_close(out, weight, x2, 128, "e4m3", "bfloat16", scale_w=sw, scale_x=sx2)
    y = plan.rebind(x).run()
    assert_linear_close(y, weight, x, 128, "e4m3", "bfloat16", scale_w=sw, scale_x=sx)


def test_launches_list_kernels_grids_arguments():
    weight, x = problem("f16", 130, 20, 512, seed=7)
    bias = np.ones(130, np.float16)
    plan = plan_sparse_linear(weight.values, weight.meta, x, bias=bias, activation="relu", interpret=True,
                              split_k=4)
    (main, mgrid, margs, mcx), (red, rgrid, rargs, rcx) = plan.launches()
    # split-K on the _mt kernel too (gemm.META_TMA_SPLIT_K; lde = 16 words, a multiple of 4)
    assert main.name == "sparse_linear_f16_mt" and mgrid == (2, 4) and mcx == {"BN": 32, "SPLIT_K": 4}
    assert margs[3] is plan.workspace and plan.workspace.shape == (4, 20, 130) and margs[7:] == (130, 20, 512, 16, 130)
    assert red.name == "splitk_reduce_linear" and rgrid == (-(-130 * 20 // 1024),)
    assert rargs[:3] == (plan.workspace, plan.out, plan.bias) and rargs[5:] == (130, 20, 130)
    assert rcx == {"SPLIT_K": 4, "BIAS": 1, "ACT": "relu", "SCALE_W": 0, "SCALE_X": 0, "BLOCK": 1024}


@pytest.mark.parametrize("act", [None, "relu", "silu", "gelu_tanh"])
def test_activations_keep_the_widest_token_tile(act):
    """The activation does not narrow the token tile (it did while silu's reciprocal spilled)."""
    weight, x = problem("bf16", 64, 300, 64, seed=14)
    assert plan_sparse_linear(weight.values, weight.meta, x, activation=act, interpret=True).bn == 256


@pytest.mark.parametrize("act,sx,bias,spill_limit", [
    ("silu", None, False, 0), ("gelu_tanh", None, False, 0), ("silu", "tensor", False, 0),
    (None, "token", False, 16), ("silu", "token", False, 16), (None, "token", True, 16), ("silu", "token", True, 16),
])
def test_epilogues_assemble_without_spilling_the_accumulator_at_bn_256(act, sx, bias, spill_limit):
    """A 128 x 256 accumulator (128 f32 registers per thread under the 9-warp CTA's 168) with silu,
    gelu_tanh, and e4m3 scales per output channel and per tensor or per token. sigmoid's reciprocal
    is rcp.approx, not the IEEE rcp.rn whose slow-path subroutine call made ptxas spill 1.2-2.5 KB
    per thread. The 64 per-token scales a thread multiplies in are loaded where each is used
    (backend/lower/deferred.py), not all next to the accumulator: 350-710 bytes of spills before,
    at most 16 now; with a bias too, since linear_epilogue computes every address before the first
    load (232 bytes when the bias address came between the scales and the bias)."""
    dtype = "bf16" if sx is None else "e4m3"
    weight, x = problem(dtype, 256, 300, 64, seed=15)
    rng = np.random.default_rng(15)
    kw = {} if sx is None else dict(scale_w=vectors("channel", 256, rng), scale_x=vectors(sx, 300, rng, 3 / 448))
    if bias:
        kw["bias"] = rng.standard_normal(256).astype(np.float32)
    plan = plan_sparse_linear(weight.values, weight.meta, x, activation=act, interpret=True, **kw)
    assert plan.bn == 256 and plan.split_k == 1
    (compiled,) = plan.compile("sm_90a")
    assert ("rcp.approx.ftz.f32" in compiled.ptx) == (act is not None) and "rcp.rn" not in compiled.ptx
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", compiled.info_log)
    assert spills is not None, compiled.info_log
    assert max(int(spills[1]), int(spills[2])) <= spill_limit, compiled.info_log


def test_empty_k_gives_the_epilogue_of_zero():
    values = np.zeros((20, 0), np.float16)
    from sparsile.stdlib.sparsity import encode_metadata

    meta = encode_metadata(np.zeros((20, 0, 2), np.uint8), "sm90", "f16", k=0)
    bias = np.linspace(-1, 1, 20).astype(np.float32)
    y = sparse_linear(values, meta, np.zeros((3, 0), np.float16), bias=bias, activation="relu", interpret=True)
    np.testing.assert_array_equal(y, np.tile(np.maximum(bias, 0).astype(np.float16), (3, 1)))


# ------------------------------------------------------------------------------------------------
# quantize_per_token_e4m3


@pytest.mark.parametrize("k", [300, 4096, 16400])  # one pass (masked, exact), two passes of 4096 (masked)
def test_quantize_per_token_e4m3_matches_numpy(k: int):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((5, k)) * rng.uniform(0.01, 100, (5, 1))).astype(np.float32)
    x[2, k - 7] = 1000.0  # the row's maximum in the last, partial step
    x[3] = 0
    xq, scale = quantize_per_token_e4m3(x, interpret=True)
    want = np.maximum(np.abs(x).max(1).astype(np.float32) / np.float32(448), np.float32(1 / (448 * 512)))
    np.testing.assert_array_equal(scale, want)
    q = np.clip(x * (np.float32(1) / want)[:, None], -448, 448).astype(ml_dtypes.float8_e4m3fn)  # x * (1 / S)
    assert xq.dtype == ml_dtypes.float8_e4m3fn and np.array_equal(xq.view(np.uint8), q.view(np.uint8))
    assert np.abs(xq.astype(np.float32)).max(1)[[0, 1, 2, 4]].tolist() == [448.0] * 4


def test_quantize_per_token_torch_bf16():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    xq, scale = quantize_per_token_e4m3(x, interpret=True)
    assert xq.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (4,)
    assert torch.allclose(scale, x.float().abs().amax(1) / 448)


# ------------------------------------------------------------------------------------------------
# argument errors


def _code_message(call) -> tuple[str, str]:
    with pytest.raises(SparsityError) as info:
        call()
    return info.value.code, info.value.message


def test_argument_errors_have_codes():
    weight, x = problem("f16", 32, 4, 64, seed=9)
    w8, _ = problem("e4m3", 32, 4, 64, seed=9)
    v, m = weight.values, weight.meta

    def run(**kw):
        return lambda: plan_sparse_linear(v, m, x, interpret=True, **kw)

    assert _code_message(run(activation="gelu")) == ("SP0850", "unknown activation 'gelu'")
    assert _code_message(run(out_dtype="int8")) == ("SP0850", "sparse_linear has no int8 output")
    assert _code_message(run(bias=np.ones(31, np.float32))) == ("SP0851", "bias must have shape (32,), got shape (31,)")
    assert _code_message(run(bias=1.0)) == ("SP0851", "bias must have shape (32,), got a number")
    assert _code_message(run(scale_w="2")) == ("SP0851", "scale_w must be a number or of shape (32,), got a str")
    assert _code_message(run(scale_x=np.ones((4, 2), np.float32))) == (
        "SP0851", "scale_x must be a number or of shape (4,), got shape (4, 2)")
    assert _code_message(run(scale_w=np.ones(32, np.int32))) == ("SP0851", "scale_w must be floating point, got int32")
    assert _code_message(lambda: plan_sparse_linear(w8.values, w8.meta, x, interpret=True)) == (
        "SP0852", "e4m3 weights need e4m3 activations, got x of float16")
    plan = plan_sparse_linear(v, m, x, interpret=True)
    assert _code_message(lambda: plan.rebind(x[:3])) == (
        "SP0853", "the plan is for x of shape (4, 64) float16, got (3, 64) float16")
    assert _code_message(lambda: plan.rebind(x.astype(np.float32))) == (
        "SP0853", "the plan is for x of shape (4, 64) float16, got (4, 64) float32")
    assert _code_message(run(out=np.zeros((32, 4), np.float16)))[0] == "SP0804"  # out is (T, N_out)
    assert _code_message(lambda: plan_sparse_linear(v, m, x[None], interpret=True)) == (
        "SP0804", "x must be a 2-D (T, K) array, got shape (1, 4, 64)")
    assert _code_message(lambda: plan_sparse_linear(v, m, x, out_dtype=object, interpret=True))[0] == "SP0850"


@pytest.mark.parametrize("activation", [["silu"], {"swiglu": 1}, {"geglu"}])
def test_an_unhashable_activation_is_sp0850(activation):
    """The activation is looked up among the gated ones (a dict): a list, dict or set is SP0850 like
    any other unknown activation, in every entry point that takes one, not a TypeError."""
    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.linear_args import TILED_ACTIVATIONS, activation_name

    weight, x = problem("bf16", 64, 3, 128, seed=9)
    for call in (lambda: plan_sparse_linear(weight.values, weight.meta, x, activation=activation, interpret=True),
                 lambda: plan_sparse_decode(weight.values, weight.meta, x, activation=activation, interpret=True),
                 lambda: sparse_linear(weight.values, weight.meta, x, activation=activation, kernel="gemm",
                                       interpret=True),
                 lambda: reference_linear(weight.dense(), x, activation=activation),
                 lambda: activation_name(activation, TILED_ACTIVATIONS)):
        assert _code_message(call) == ("SP0850", f"unknown activation {activation!r}")


def test_no_tokens_or_no_features_launch_nothing():
    weight, x = problem("f16", 48, 3, 64, seed=15)
    plan = plan_sparse_linear(weight.values, weight.meta, x[:0], interpret=True)
    assert plan.launches() == [] and plan.run().shape == (0, 48)


# ------------------------------------------------------------------------------------------------
# compilation for sm_90a (no GPU needed)


@pytest.mark.parametrize("dtype,kw", [
    ("f16", dict(activation="relu", bias="f32")),
    ("bf16", dict(activation="gelu_tanh", bias="out", split_k=2)),
    ("e4m3", dict(activation="silu", scale_w="channel", scale_x="token", bias="f32")),
    ("e4m3", dict(scale_w="tensor", scale_x="tensor", num_sms=2, n_out=1024)),  # the pair kernel
])
def test_compiles_for_sm90a(dtype, kw):
    n_out = kw.pop("n_out", 256)
    weight, x = problem(dtype, n_out, 64, 256, seed=10)
    rng = np.random.default_rng(10)
    out = "bfloat16" if dtype == "e4m3" else np.dtype(HOST[dtype]).name
    if "bias" in kw:
        kw["bias"] = rng.standard_normal(n_out).astype(np.float32 if kw["bias"] == "f32" else NP_OUT[out])
    kw["scale_w"] = vectors(kw.get("scale_w"), n_out, rng)
    kw["scale_x"] = vectors(kw.get("scale_x"), 64, rng, 3 / 448)
    plan = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, **kw)
    compiled = plan.compile("sm_90a")
    assert len(compiled) == len(plan.launches())
    assert compiled[0].cubin[:4] == b"\x7fELF" and "mma_async.sp" in compiled[0].ptx
    assert bool(plan.pair) == ("num_sms" in kw) and compiled[0].name == plan.kernel.name


@pytest.mark.parametrize("k,one_pass,warps", [(4096, 1, 4), (8192, 1, 8), (14336, 1, 16), (28672, 0, 4)])
def test_quantizer_reads_and_writes_16_bytes_per_access(k: int, one_pass: int, warps: int):
    """Rows of 16-aligned bf16 are read with 16-byte loads and written with 16-byte stores, in the
    two-pass loops too (axis analysis of a loop that yields nothing: its induction variable keeps the
    divisibility of its bounds), with no spills; one cross-warp reduction per row."""
    from sparsile.stdlib.kernels.quantize_e4m3 import quantize_module, quantize_options

    x = np.zeros((16, k), ml_dtypes.bfloat16)
    xq, scale = np.zeros((16, k), ml_dtypes.float8_e4m3fn), np.zeros(16, np.float32)
    options = quantize_options(k)
    assert (options["ONE_PASS"], options["num_warps"]) == (one_pass, warps)
    compiled = quantize_module().quantize_e4m3_per_token[(16,)].compile_for("sm_90a", x, xq, scale, k, k, k,
                                                                           **options)
    ptx = compiled.ptx
    per_thread = options["BLOCK"] // (32 * warps)  # elements per step
    assert ptx.count("ld.global.v4.b32") == per_thread // 8 * (1 if one_pass else 2)
    assert ptx.count("st.global.v4.b32") == per_thread // 16
    assert "ld.global.b16" not in ptx and "st.global.b8" not in ptx
    assert ptx.count("bar.sync") == 2 and "0 bytes spill stores" in compiled.info_log


def test_quantize_kernel_compiles_for_sm90a():
    from sparsile.stdlib.kernels.linear import quantize_module

    x = np.zeros((4, 300), ml_dtypes.bfloat16)
    xq, scale = np.zeros((4, 300), ml_dtypes.float8_e4m3fn), np.zeros(4, np.float32)
    compiled = quantize_module().quantize_e4m3_per_token[(4,)].compile_for("sm_90a", x, xq, scale, 300, 300, 300,
                                                                          BLOCK=512)
    assert compiled.cubin[:4] == b"\x7fELF" and "cvt.rn.satfinite.e4m3x2.f32" in compiled.ptx
    assert "griddepcontrol" not in compiled.ptx
    trigger = quantize_module().quantize_e4m3_per_token[(4,)].compile_for("sm_90a", x, xq, scale, 300, 300, 300,
                                                                         BLOCK=512, TRIGGER=1)
    assert trigger.ptx.count("griddepcontrol.launch_dependents;") == 1


def test_quantizer_that_triggers_pdl_gives_the_same_bits():
    """TRIGGER=1 (the torch record's quantizer before a PDL GEMM) changes scheduling, not results."""
    from sparsile.stdlib.kernels.linear import quantize_module

    kernel = quantize_module().quantize_e4m3_per_token
    x = np.random.default_rng(4).standard_normal((3, 300)).astype(ml_dtypes.bfloat16)
    outs = []
    for extra in ({}, {"TRIGGER": 1}):
        xq, scale = np.zeros((3, 300), ml_dtypes.float8_e4m3fn), np.full(3, np.nan, np.float32)
        kernel.interpret[(3,)](x, xq, scale, 300, 300, 300, BLOCK=512, **extra)
        outs.append((xq.view(np.uint8).copy(), scale))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert not np.isnan(outs[1][1]).any()


# ------------------------------------------------------------------------------------------------
# on the GPU


GPU_CASES = [
    # dtype, N_out, T, K, out_dtype, bias, activation, scale_w, scale_x, split_k
    ("bf16", 4096, 1, 4096, None, "out", None, None, None, None),
    ("bf16", 4096, 16, 4096, None, "f32", "silu", None, None, None),
    ("bf16", 14336, 300, 4096, "float32", None, "gelu_tanh", None, None, 1),
    ("f16", 6144, 16, 4096, None, "out", "relu", None, None, 4),
    ("f16", 4096, 1024, 4096, "bfloat16", "f32", None, "tensor", "token", None),
    ("e4m3", 4096, 1, 4096, None, "f32", None, "channel", "token", None),
    ("e4m3", 28672, 64, 8192, "float16", None, "silu", "tensor", "tensor", None),
    ("e4m3", 4096, 4096, 14336, "float32", "f32", "gelu_tanh", "channel", "token", None),  # the pair kernel
]


def cuda_copy(a: Any) -> Any:
    """A host array (ml_dtypes included) as a CUDA tensor of the same element type; None and
    Python floats as they are."""
    import torch

    if a is None or isinstance(a, float):
        return a
    bits = torch.from_numpy(np.ascontiguousarray(a).view(f"u{a.itemsize}" if a.itemsize > 1 else "u1"))
    return bits.cuda().view(getattr(torch, a.dtype.name))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", GPU_CASES)
def test_gpu_epilogue_torch_in_place(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    torch = pytest.importorskip("torch")
    weight, x = problem(dtype, n_out, t, k, seed=11)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    cuda = cuda_copy
    tx = cuda(x)
    values = cuda(np.asarray(weight.values))
    out = torch.full((t, n_out), float("nan"), device="cuda", dtype=getattr(torch, want))
    y = sparse_linear(values, weight.meta, tx, out=out, out_dtype=out_dtype, split_k=split,
                      **{key: cuda(v) if key != "activation" else v for key, v in epi.items()})
    assert y is out
    torch.cuda.synchronize()
    host = y.float().cpu().numpy().astype(NP_OUT[want]) if want != "float32" else y.cpu().numpy()
    assert_linear_close(host, weight, x, k, dtype, want, **epi)


@pytest.mark.gpu
def test_gpu_quantize_then_e4m3_linear():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(12)
    w = torch.randn(4096, 4096, generator=g) * 64
    x = torch.randn(16, 4096, generator=g).to(torch.bfloat16).cuda()
    values, meta = prune_and_compress(w.cuda(), "e4m3")
    xq, sx = quantize_per_token_e4m3(x)
    assert xq.is_cuda and torch.allclose(sx, x.float().abs().amax(1) / 448)
    y = sparse_linear(values, meta, xq, scale_x=sx, scale_w=1 / 64)
    assert y.dtype == torch.bfloat16 and y.shape == (16, 4096)
    from sparsile.stdlib.kernels import CompressedWeight

    dense = CompressedWeight(values, meta).dense().astype(np.float64) / 64
    ref = x.double().cpu().numpy() @ dense.T
    rel = np.abs(y.double().cpu().numpy() - ref).max() / np.abs(ref).max()
    assert rel < 0.05  # e4m3 activations: 3 mantissa bits (2^-4 relative per element, averaged over K)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 4])
def test_gpu_rebind_on_a_side_stream(split):
    """A plan made once, rebound to new x / out / scale_x and run on another torch stream."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(16)
    w = torch.randn(4096, 4096, generator=g) / 64
    values, meta = prune_and_compress(w.cuda(), "bf16")
    xs = [torch.randn(16, 4096, generator=g).to(torch.bfloat16).cuda() for _ in range(3)]
    bias = torch.randn(4096, generator=g).cuda()
    plan = plan_sparse_linear(values, meta, xs[0], bias=bias, activation="silu", split_k=split)
    from sparsile.stdlib.kernels import CompressedWeight

    side = torch.cuda.Stream()
    for x in xs:
        out = torch.full((16, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
        again = plan.rebind(x, out)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            assert again.run(stream=side) is out
        side.synchronize()
        host = out.float().cpu().numpy().astype(ml_dtypes.bfloat16)
        assert_linear_close(host, CompressedWeight(values, meta), x.float().cpu().numpy().astype(ml_dtypes.bfloat16),
                            4096, "bf16", "bfloat16", bias=bias.cpu().numpy(), activation="silu")


# ------------------------------------------------------------------------------------------------
# the shipped tuned table (stdlib/kernels/tuned/<gpu>.json) chooses the tiled kernel's launch


@pytest.mark.parametrize("split", [1, 2])
def test_a_tuned_tables_choice_plans_and_computes(monkeypatch: pytest.MonkeyPatch, split: int) -> None:
    """The table's BN, split-K, STAGES and GROUP_M replace the planned heuristics (here forced in the
    interpreter, where no table is read), reach the kernel as constexprs, and y stays right."""
    from sparsile.stdlib.kernels import linear
    from sparsile.stdlib.kernels.gemm_config import GemmConfig

    asked: list[tuple] = []

    def table(operand, m, t, k, interpret, ordinal=None):
        asked.append((operand, m, t, k, ordinal))
        return GemmConfig(32, 3, split, False, 8)

    monkeypatch.setattr(linear, "tuned_config", table)
    weight, x = problem("bf16", 150, 40, 192, seed=4)
    want, epi = epilogue_case("bf16", 150, 40, None, "f32", "relu", None, None)
    plan = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, **epi)
    assert asked == [("bf16", 150, 40, 192, None)]  # a numpy x: the current device
    assert (plan.bn, plan.split_k, plan.stages, plan.group_m, plan.pair) == (32, split, 3, 8, 0)
    main = plan.launches()[0]
    assert {k: main[3][k] for k in ("BN", "STAGES", "GROUP_M")} == {"BN": 32, "STAGES": 3, "GROUP_M": 8}
    assert main[1] == (-(-150 // 128) * -(-40 // 32), split)
    plan.out[...] = np.nan
    assert_linear_close(plan.run(), weight, x, 192, "bf16", want, **epi)


def test_the_tuned_table_is_not_asked_when_the_call_fixes_the_split_or_the_sms(monkeypatch) -> None:
    from sparsile.stdlib.kernels import linear

    monkeypatch.setattr(linear, "tuned_config", lambda *a: pytest.fail("the table was asked"))
    weight, x = problem("f16", 130, 20, 64, seed=2)
    assert plan_sparse_linear(weight.values, weight.meta, x, interpret=True, split_k=2).split_k == 2
    assert plan_sparse_linear(weight.values, weight.meta, x, interpret=True, num_sms=4).stages is None


def test_a_tuned_pair_choice_compiles_the_pair_kernel_for_sm90a(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparsile.stdlib.kernels import linear
    from sparsile.stdlib.kernels.gemm_config import GemmConfig

    monkeypatch.setattr(linear, "tuned_config", lambda *a: GemmConfig(64, 5, 1, True, 8))
    weight, x = problem("bf16", 512, 64, 256, seed=6)
    plan = plan_sparse_linear(weight.values, weight.meta, x, interpret=True)
    assert plan.pair == min(2 * 2 * 1, 132) and plan.kernel.name == "sparse_linear_bf16_pair_mt"
    (compiled,) = plan.compile("sm_90a")
    assert "mma_async.sp" in compiled.ptx and "multicast::cluster" in compiled.ptx


def test_the_tables_lookup_and_its_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer's own entries (linear-<dtype>) of the table of the current GPU (none on a machine
    without one), the entry with the smallest N at least T if it is below 2T (else the heuristics),
    the largest beyond them; SPARSILE_TUNED_TABLE=0 turns the tables off."""
    from sparsile.stdlib.kernels import linear, tuning
    from sparsile.stdlib.kernels.gemm_config import GemmConfig

    index = {("linear-bf16", 6144, 4096): [(256, GemmConfig(128)), (1024, GemmConfig(256, 5))],
             ("bf16", 4096, 4096): [(256, GemmConfig(64))]}  # sparse_matmul's entries: not the layer's
    monkeypatch.setattr(tuning, "_shipped_index", lambda *gpu: index)
    assert linear.tuned_config("bf16", 6144, 200, 4096, False) == GemmConfig(128)
    assert linear.tuned_config("bf16", 6144, 100, 4096, False) is None  # the 256 entry is not nearby
    assert linear.tuned_config("bf16", 6144, 129, 4096, False) == GemmConfig(128)
    assert linear.tuned_config("bf16", 6144, 512, 4096, False) is None  # 1024 is not below 2 x 512
    assert linear.tuned_config("bf16", 6144, 600, 4096, False) == GemmConfig(256, 5)
    assert linear.tuned_config("bf16", 6144, 9000, 4096, False) == GemmConfig(256, 5)
    assert linear.tuned_config("f16", 6144, 200, 4096, False) is None
    assert linear.tuned_config("bf16", 4096, 200, 4096, False) is None
    assert linear.tuned_config("bf16", 6144, 200, 4096, True) is None  # the interpreter keeps the heuristics
    monkeypatch.setenv(tuning.TUNED_TABLE_ENV, "0")
    assert linear.tuned_config("bf16", 6144, 200, 4096, False) is None


STAGED_CASES = [*(c for c in CASES if c[-1] == 1), ("bf16", 1000, 20, 64, None, "f32", "silu", None, None, 1)]


@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split", STAGED_CASES)
def test_the_staged_epilogue_matches_float64_reference(monkeypatch, dtype, n_out, t, k, out_dtype, bias, act, sw, sx,
                                                       split):
    """SPARSILE_LINEAR_STAGE_Y=1: y^T staged in shared memory and stored in rows of features (the
    STAGE_Y constexpr) gives the same results, in the interpreter, for every output type (a float32 y
    with BN = 256 does not fit next to the ring and keeps the direct store); the pair kernel too."""
    monkeypatch.setenv("SPARSILE_LINEAR_STAGE_Y", "1")
    weight, x = problem(dtype, n_out, t, k, seed=n_out + t + k)
    want, epi = epilogue_case(dtype, n_out, t, out_dtype, bias, act, sw, sx)
    out = np.full((t, n_out), np.nan, NP_OUT[want])
    plan = plan_sparse_linear(weight.values, weight.meta, x, out=out, out_dtype=out_dtype, interpret=True,
                              **epi, **({"num_sms": 2} if n_out == 1000 else {}))
    staged = plan.constexprs().get("STAGE_Y")
    meta_ring = 4 * 128 * 16 if plan.kernel.name.endswith("_mt") else 0  # metadata boxes by TMA
    assert (staged is not None) == (plan.bn * 128 * np.dtype(NP_OUT[want]).itemsize + 4 * (128 * 32 + plan.bn * 64) * 2
                                    + meta_ring + 1024 <= 232448)
    assert plan.run() is out
    assert_linear_close(out, weight, x, k, dtype, want, **epi)
    assert bool(plan.pair) == (n_out == 1000)


def test_the_staged_epilogue_compiles_to_16_byte_stores(monkeypatch):
    """The staged sparse_linear kernel for sm_90a: y leaves in 16-byte global stores (none of 2
    bytes) and comes back from shared memory in 16-byte loads; the buffer fits the CTA."""
    monkeypatch.setenv("SPARSILE_LINEAR_STAGE_Y", "1")
    weight, x = problem("bf16", 256, 300, 96, seed=9)  # K = 96: 3 metadata words a row, no TMA (_mt) kernel,
    plan = plan_sparse_linear(weight.values, weight.meta, x, interpret=True, target="sm_90a")  # so y fits at BN 256
    assert plan.constexprs()["STAGE_Y"] is not None and plan.bn == 256 and not plan.kernel.name.endswith("_mt")
    (compiled,) = plan.compile("sm_90a")
    assert "st.global.b16" not in compiled.ptx and compiled.ptx.count("st.global.v4.b32") == 16
    assert compiled.ptx.count("ld.shared.v4.b32") == 16 and compiled.smem_bytes <= 232448


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,n_out,t,k,out_dtype,bias,act,sw,sx,split",
                         [*GPU_CASES, ("bf16", 4096, 1000, 256, None, "f32", None, None, None, 1),
                          ("e4m3", 4200, 300, 256, None, None, None, "channel", "token", 1)])
def test_gpu_staged_epilogue_matches_float64(monkeypatch, dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split):
    """SPARSILE_LINEAR_STAGE_Y=1 on the GPU: y staged in shared memory and stored in 16-byte rows
    (where the plan stages it: not with split-K, not f32 y at BN = 256), against float64 with a
    poisoned output (ragged edges; large T on a BN = 256 tile; the pair kernel)."""
    monkeypatch.setenv("SPARSILE_LINEAR_STAGE_Y", "1")
    test_gpu_epilogue_torch_in_place(dtype, n_out, t, k, out_dtype, bias, act, sw, sx, split)


def test_numpy_integers_are_integers_for_split_k_and_num_sms():
    """split_k=np.int64(2) was refused as "split_k must be an integer from 1 to 64, got np.int64(2)"
    (and num_sms likewise by sparse_linear), on every kernel; they are taken as the ints they are."""
    from sparsile.stdlib.kernels.decode import plan_sparse_decode

    values, meta = prune_and_compress(np.random.default_rng(0).standard_normal((64, 64)), "f16")
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float16)
    for kernel in ("decode", "gemm"):
        plan = plan_sparse_linear(values, meta, x, interpret=True, kernel=kernel, split_k=np.int64(2),
                                  num_sms=np.int32(8))
        assert (plan.config.split_k if kernel == "decode" else plan.split_k) == 2
    decode = plan_sparse_decode(values, meta, x, interpret=True, split_k=np.int64(2), stages=np.int64(3))
    assert (decode.config.split_k, decode.config.stages) == (2, 3)
    expect = sparse_linear(values, meta, x, interpret=True, split_k=2)
    np.testing.assert_array_equal(sparse_linear(values, meta, x, interpret=True, split_k=np.int64(2)), expect)


@pytest.mark.parametrize("x", [[[1.0] * 64] * 4, None])
def test_x_that_is_not_an_array_is_named_as_such(x):
    """A list or None for x was reported as "x must be a 2-D (T, K) array, got shape ()"."""
    values, meta = prune_and_compress(np.ones((32, 64), np.float32), "f16")
    with pytest.raises(SparsityError) as info:
        sparse_linear(values, meta, x, interpret=True)
    assert (info.value.code, info.value.message) == (
        "SP0804", f"x must be an array (numpy, torch or cupy), got {type(x).__name__}")


def test_values_of_another_type_than_the_buffers_tag_say_what_sparse_linear_takes():
    """sparse_linear has no dtype=: f16 values with a bf16-tagged buffer are told to pass its raw
    words (alike for 16-bit types), which then run as f16; e4m3 values with a 16-bit tag are told
    only to match the types (their words differ)."""
    weight, x = problem("bf16", 32, 80, 64, seed=3)
    f16 = np.asarray(weight.values).astype(np.float32).astype(np.float16)
    with pytest.raises(SparsityError) as info:
        sparse_linear(f16, weight.meta, x.astype(np.float16), interpret=True)
    assert info.value.code == "SP0804" and "dtype=" not in info.value.help and "meta.data" in info.value.help
    y = sparse_linear(f16, weight.meta.data, x.astype(np.float16), interpret=True)
    assert_linear_close(y, weight, x.astype(np.float16), 64, "f16", "float16")
    w8, x8 = problem("e4m3", 32, 80, 64, seed=3)
    with pytest.raises(SparsityError) as info:
        sparse_linear(w8.values, weight.meta, x8, scale_x=np.float32(1), interpret=True)
    assert info.value.code == "SP0804" and "dtype=" not in info.value.help and "meta.data" not in info.value.help


def test_y_beyond_32_bit_offsets_is_refused():
    """The layer's kernels store y (and split-K partial sums) at i32 offsets, which wrap beyond 2^31
    elements: refused when planned, on Hopper and on Blackwell (whose epilogue stores y by pointer too)."""
    values, words = np.ones((65536, 16), np.float16), np.full((65536, 1), 0x44444444, np.uint32)
    x = np.ones((40000, 32), np.float16)
    for target in ("sm_90a", "sm_100a"):
        with pytest.raises(SparsityError, match=r"y of shape \(40000, 65536\) has 2621440000 elements") as e:
            plan_sparse_linear(values, words, x, interpret=True, target=target, meta_format="sm90")
        assert e.value.code == "SP0804" and "fewer tokens" in e.value.help
    values, words = np.ones((8192, 16), np.float16), np.full((8192, 1), 0x44444444, np.uint32)
    with pytest.raises(SparsityError, match=r"split-K workspace of shape \(64, 8192, 8192\)") as e:
        plan_sparse_linear(values, words, np.ones((8192, 32), np.float16), split_k=64, interpret=True)
    assert e.value.code == "SP0804" and "at most 32" in e.value.help
