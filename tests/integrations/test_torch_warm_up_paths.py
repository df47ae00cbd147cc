"""``warm_up`` against more of the eager call's paths than test_torch_warm_up.py's (faked the same
way): e4m3 layers past the record's quantizer (T > 64: ``quantize_per_token``'s prepared quantizer,
then a record of the fp8 x and its scales), 16-bit layers of a prefill, x in float16 or float32
(cast to the weight's type), an activation and a bias, widths the kernels pad."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.driver import compiler  # noqa: E402
from sparsile.driver.compiler import cache_key  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import first_call as wu  # noqa: E402
from sparsile.tests.integrations import test_torch_warm_up as faked  # noqa: E402

fresh_cache = faked.fresh_cache  # (the fixtures of test_torch_warm_up.py: the same faked first call)
faked_first_call = faked.faked_first_call


def _eager_call(layer, tokens: int, x_dtype: torch.dtype, pdl: bool = False) -> None:
    """What ``SparseLinear._forward_eager`` builds for a CUDA x of ``tokens`` rows in ``x_dtype``
    (``pdl``: as its RecordCache asks with SPARSILE_PDL=1 on a Hopper GPU), planned as on the GPU."""
    with faked.as_on_the_gpu():
        _eager_record(layer, tokens, x_dtype, pdl)


def _eager_record(layer, tokens: int, x_dtype: torch.dtype, pdl: bool) -> None:
    w = layer._bound()
    out_dtype = layer.out_dtype or x_dtype
    x = torch.zeros((tokens, layer.in_features), dtype=x_dtype)
    xq = torch.zeros((tokens, layer.in_features), dtype=torch.float8_e4m3fn)
    sx = torch.ones((tokens,), dtype=torch.float32)
    if w.scale_w is not None:
        if tokens <= kernels.RECORD_QUANTIZE_MAX_T:
            record = kernels.LaunchRecord(x, w, None, out_dtype, quantize=True, pdl=pdl)
            if record.prepared is None:  # a padded plan: the call quantizes x through quantize_per_token
                kernels.kernel_api().prepare_quantize(x, xq, sx)
            return
        kernels.kernel_api().prepare_quantize(x, xq, sx)  # quantize_per_token's prepared launch
        kernels.LaunchRecord(xq, w, sx, out_dtype, pdl=pdl)
        return
    kernels.LaunchRecord(x.to(w.values.dtype), w, None, out_dtype, pdl=pdl)


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


@pytest.fixture
def compiled_keys(faked_first_call, monkeypatch) -> list[str]:
    """The faked first call of test_torch_warm_up.py, with compile_cached recording the cache key
    of each specialization it is asked for (for sm_90a) instead of compiling it."""
    keys: list[str] = []

    def record(kernel, bindings, key, target, options):
        keys.append(cache_key(kernel, bindings, key, target, options))

    monkeypatch.setattr(compiler, "compile_cached", record)
    return keys


def _warm_up_keys(layer, tokens: int, x_dtype: torch.dtype) -> set[str]:
    """The cache keys of the specializations warm_up compiles for ``layer`` at ``tokens`` (sm_90a)."""
    from sparsile.target.targets import get_target

    return {cache_key(spec.kernel, spec.bindings, spec.key, get_target("sm_90a"), spec.options)
            for _, spec in wu.distinct_specializations(wu.first_call_launches(layer, tokens, x_dtype))}


# (out, in): split-K decode (4096 x 4096, 1024 x 4096), a padded x (1024 x 1000; e4m3: 96 x 64), small
REPRESENTATIVE_SHAPES = [(4096, 4096), (1024, 4096), (1024, 1000), (96, 64), (256, 128)]


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_warm_up_compiles_what_the_first_calls_compile_and_nothing_else(compiled_keys, monkeypatch, dtype,
                                                                       pdl) -> None:
    """The two sets are equal, specialization by specialization (cache keys), for layers of the
    shapes of REPRESENTATIVE_SHAPES at T = 1, 4, 16, 64 and 100. warm_up planned the one-launch eager
    variants (split-K reduced in the kernel, the e4m3 decode kernel that quantizes x) where the
    record makes none (a plan that pads x: its launches are not prepared), and it left out the
    quantizer without TRIGGER that such a record's calls run with SPARSILE_PDL=1."""
    if pdl:
        monkeypatch.setattr(wu, "pdl_wanted", lambda device: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    torch.manual_seed(0)
    for out_features, in_features in REPRESENTATIVE_SHAPES:
        layer = spt.SparseLinear(in_features, out_features, bias=True, dtype=dtype)
        for tokens in (1, 4, 16, 64, 100):
            compiled_keys.clear()
            _eager_call(layer, tokens, torch.bfloat16, pdl)
            assert compiled_keys, (out_features, in_features, tokens)
            assert set(compiled_keys) == _warm_up_keys(layer, tokens, torch.bfloat16), \
                (out_features, in_features, tokens)
