"""``warm_up`` against more of the eager call's paths than test_torch_warm_up.py's (faked the same
way): e4m3 layers past the record's quantizer (T > 64: ``quantize_per_token``'s prepared quantizer,
then a record of the fp8 x and its scales), 16-bit layers of a prefill, x in float16 or float32
(cast to the weight's type), an activation and a bias, widths the kernels pad."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import first_call as wu  # noqa: E402
from sparsile.tests.integrations import test_torch_warm_up as faked  # noqa: E402

fresh_cache = faked.fresh_cache  # (the fixtures of test_torch_warm_up.py: the same faked first call)
faked_first_call = faked.faked_first_call


def _eager_call(layer, tokens: int, x_dtype: torch.dtype) -> None:
    """What ``SparseLinear._forward_eager`` builds for a CUDA x of ``tokens`` rows in ``x_dtype``."""
    w = layer._bound()
    out_dtype = layer.out_dtype or x_dtype
    x = torch.zeros((tokens, layer.in_features), dtype=x_dtype)
    if w.scale_w is not None:
        if tokens <= kernels.RECORD_QUANTIZE_MAX_T:
            kernels.LaunchRecord(x, w, None, out_dtype, quantize=True)
            return
        xq = torch.zeros((tokens, layer.in_features), dtype=torch.float8_e4m3fn)
        sx = torch.ones((tokens,), dtype=torch.float32)
        kernels.kernel_api().prepare_quantize(x, xq, sx)  # quantize_per_token's prepared launch
        kernels.LaunchRecord(xq, w, sx, out_dtype)
        return
    kernels.LaunchRecord(x.to(w.values.dtype), w, None, out_dtype)


@pytest.mark.parametrize("dtype, tokens, x_dtype, shape, activation", [
    ("e4m3", 100, torch.bfloat16, (256, 128), None),
    ("e4m3", 512, torch.float16, (256, 128), "relu"),
    ("e4m3", 2, torch.float32, (256, 128), None),
    ("bf16", 512, torch.bfloat16, (256, 128), "silu"),
    ("bf16", 16, torch.float32, (256, 128), None),
    ("f16", 1, torch.bfloat16, (256, 128), None),
    ("bf16", 1, torch.bfloat16, (200, 72), None),
    ("e4m3", 16, torch.bfloat16, (200, 72), "gelu_tanh"),
])
def test_the_first_call_finds_what_warm_up_compiled(fresh_cache, faked_first_call, dtype, tokens, x_dtype,
                                                     shape, activation) -> None:
    layer = spt.SparseLinear(*shape, bias=True, dtype=dtype, activation=activation)
    report = wu.warm_up(layer, tokens=(tokens,), jobs=1, x_dtype=x_dtype)
    assert report.compiled == len(faked_first_call) > 0
    faked_first_call.clear()
    _eager_call(layer, tokens, x_dtype)
    assert faked_first_call == []


@pytest.mark.parametrize("dtype, tokens", [("bf16", 1), ("bf16", 100), ("e4m3", 4), ("e4m3", 100)])
def test_a_fused_gated_mlp(fresh_cache, faked_first_call, dtype, tokens) -> None:
    """The gated layer of ``fuse_projections_(glu=True)``: the activation in the kernel where
    ``glu_in_kernel``, else its twin's pre-activations; the group's fused layer; and down_proj."""
    from sparsile.integrations.torch.glu import GatedLinear
    from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP

    block = torch.nn.Module()
    block.mlp = LlamaLikeMLP(hidden=256, f=128)
    spt.sparsify_(block, dtype=dtype, interpret=True, min_features=16)
    spt.fuse_projections_(block, glu=True)
    layers = wu.warmed_layers(block)
    assert sum(isinstance(layer, GatedLinear) for layer in layers) == 1 and len(layers) == 4
    report = wu.warm_up(block, tokens=(tokens,), jobs=1)
    assert report.compiled == len(faked_first_call) > 0
    faked_first_call.clear()
    for layer in layers:
        if isinstance(layer, GatedLinear) and not kernels.glu_in_kernel(tokens, torch.device("cpu")):
            layer = layer.__dict__["_pre"]
        _eager_call(layer, tokens, torch.bfloat16)
    assert faked_first_call == []
