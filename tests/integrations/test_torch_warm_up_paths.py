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
from sparsile.integrations.torch import ops, quantize, record_cache  # noqa: E402
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
    ``glu_in_kernel``, else its twin's pre-activations; and down_proj (the group's fused layer, whose
    calls the gated forward replaces, is not listed)."""
    from sparsile.integrations.torch.glu import GatedLinear
    from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP

    block = torch.nn.Module()
    block.mlp = LlamaLikeMLP(hidden=256, f=128)
    spt.sparsify_(block, dtype=dtype, interpret=True, min_features=16)
    spt.fuse_projections_(block, glu=True)
    layers = wu.warmed_layers(block)
    assert sum(isinstance(layer, GatedLinear) for layer in layers) == 1 and len(layers) == 2
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
    torch.manual_seed(0)
    for out_features, in_features in REPRESENTATIVE_SHAPES:
        layer = spt.SparseLinear(in_features, out_features, bias=True, dtype=dtype)
        for tokens in (1, 4, 16, 64, 100):
            compiled_keys.clear()
            _eager_call(layer, tokens, torch.bfloat16, pdl)
            assert compiled_keys, (out_features, in_features, tokens)
            assert set(compiled_keys) == _warm_up_keys(layer, tokens, torch.bfloat16), \
                (out_features, in_features, tokens)


@pytest.fixture
def ops_as_on_the_gpu(monkeypatch) -> None:
    """The custom ops' CPU branches taken for their CUDA ones: ``sparse_linear`` runs its launch
    record (``ops.run_record``, in a fresh ``ops.RECORDS``) instead of the interpreter,
    ``quantize_per_token_e4m3`` its prepared quantizer (``quantize.prepared_quantizer``); a record
    is built, planned as on the GPU (under :func:`_traced_call`), and never launched (its call
    returns an empty y)."""
    monkeypatch.setattr(ops, "RECORDS", record_cache.RecordCache(ops.OP_RECORDS_PER_WEIGHT, pdl=ops.RECORDS.pdl))
    monkeypatch.setattr(ops, "run_interpreted",
                        lambda x2, w, scale_x, out: ops.run_record(x2, w, scale_x, out, stream=0))

    def quantizer(x2):
        xq = torch.empty(x2.shape, dtype=torch.float8_e4m3fn)
        scale = torch.empty(x2.shape[:1], dtype=torch.float32)
        quantize.prepared_quantizer(x2, xq, scale)
        return xq, scale

    monkeypatch.setattr(ops, "quantize_per_token", quantizer)
    monkeypatch.setattr(quantize, "_QUANTIZERS", type(quantize._QUANTIZERS)())  # (emptied by _traced_call)
    monkeypatch.setattr(kernels.LaunchRecord, "__call__",
                        lambda self, x, scale_x, stream, in_capture=None:
                        torch.empty(self.shape, dtype=self.out_dtype))


@pytest.fixture
def traced_first_call(compiled_keys, ops_as_on_the_gpu) -> list[str]:
    """``compiled_keys`` of traced calls (:func:`ops_as_on_the_gpu`)."""
    return compiled_keys


def _traced_call(layer, tokens: int, x_dtype: torch.dtype) -> None:
    """What a call of ``layer`` traced by torch.compile builds on a CUDA x of ``tokens`` rows in
    ``x_dtype`` (under the fixture above): the layer's custom ops (``_forward_op``, what its traced
    forward calls), planned as on the GPU."""
    x = torch.zeros((tokens, layer.in_features), dtype=x_dtype)
    quantize._QUANTIZERS.clear()  # (a quantizer prepared for an earlier layer of the same K: not compiled again)
    with faked.as_on_the_gpu():
        y = layer._forward_op(x)
    assert y.shape == (tokens, layer.out_features)


def _traced_warm_up_keys(layer, tokens: int, x_dtype: torch.dtype) -> set[str]:
    """The cache keys of what warm_up compiles for the traced calls of ``layer`` at ``tokens``."""
    from sparsile.target.targets import get_target

    launches = wu.first_call_launches(layer, tokens, x_dtype, traced=True)
    return {cache_key(spec.kernel, spec.bindings, spec.key, get_target("sm_90a"), spec.options)
            for _, spec in wu.distinct_specializations(launches)}


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_warm_up_compiles_what_the_first_traced_calls_compile_and_nothing_else(traced_first_call, monkeypatch,
                                                                              dtype, pdl) -> None:
    """The traced calls' records (the custom op's, in ``ops.RECORDS``: no PDL, an e4m3 x quantized
    by ``quantize_per_token`` then a record of the fp8 x and its scales) against
    ``first_call_launches(..., traced=True)``, cache key by cache key, at the shapes and T of the
    eager test above. (Listed as the eager calls' records, a traced e4m3 call of few tokens through a
    split-K decode plan needs the in-kernel-reduced decode kernel of the fp8 x, which those lack.)"""
    if pdl:  # SPARSILE_PDL=1 on a Hopper GPU: the eager records plan with PDL; the op's records do not
        monkeypatch.setattr(wu, "pdl_wanted", lambda device: True)
        monkeypatch.setattr(record_cache, "pdl_wanted", lambda device: True)
    torch.manual_seed(0)
    for out_features, in_features in REPRESENTATIVE_SHAPES:
        layer = spt.SparseLinear(in_features, out_features, bias=True, dtype=dtype)
        for tokens in (1, 4, 16, 64, 100):
            traced_first_call.clear()
            _traced_call(layer, tokens, torch.bfloat16)
            assert traced_first_call, (out_features, in_features, tokens)
            assert set(traced_first_call) == _traced_warm_up_keys(layer, tokens, torch.bfloat16), \
                (out_features, in_features, tokens)


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_a_traced_gated_layer(traced_first_call, dtype) -> None:
    """The op with a gated activation: in the kernel where ``glu_in_kernel``, else the
    pre-activations of the same weight (activation None) gated by torch."""
    from sparsile.integrations.torch.glu import GatedLinear

    torch.manual_seed(0)
    layer = GatedLinear.over(spt.SparseLinear(256, 512, bias=True, dtype=dtype), "swiglu")
    for tokens in (1, 16, 100):
        traced_first_call.clear()
        _traced_call(layer, tokens, torch.bfloat16)
        assert traced_first_call and set(traced_first_call) == _traced_warm_up_keys(layer, tokens, torch.bfloat16)


@pytest.mark.parametrize("calls, compiles", [("both", []), ("eager", ["sparse_decode_reduce_e4m3"])])
def test_a_traced_call_after_warm_up_compiles_nothing(fresh_cache, faked_first_call, ops_as_on_the_gpu, calls,
                                                      compiles) -> None:
    """warm_up's default (calls="both") compiles what a traced e4m3 decode call of a split-K weight
    needs; the eager calls' list alone (calls="eager", warm_up's only list before) lacks its decode
    kernel of the fp8 x with the partial sums added in the kernel, compiled then by the first call."""
    layer = spt.SparseLinear(4096, 1024, bias=False, dtype="e4m3")
    report = wu.warm_up(layer, tokens=(1,), jobs=1, calls=calls)
    assert report.compiled == len(faked_first_call) > 0 and report.layers == 1
    faked_first_call.clear()
    _traced_call(layer, 1, torch.bfloat16)
    assert faked_first_call == compiles


def test_traced_calls_run_the_members_of_a_group_not_fused_in_traces() -> None:
    """``fuse_projections_`` without ``traced=True``: a trace runs each member's op (the eager calls
    the fused layer's record); with it, the fused layer's, and a fused MLP's gated layer."""
    from sparsile.integrations.torch.glu import GatedLinear
    from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP

    for traced in (False, True):
        block = torch.nn.Module()
        block.q_proj, block.k_proj, block.v_proj = (spt.SparseLinear(256, 128, bias=False) for _ in range(3))
        block.mlp = LlamaLikeMLP(hidden=256, f=128)
        spt.sparsify_(block.mlp, interpret=True, min_features=16)
        members = [block.q_proj, block.k_proj, block.v_proj]
        spt.fuse_projections_(block, glu=True, traced=traced)
        eager = wu.warmed_layers(block)
        assert not any(m in eager for m in members) and sum(isinstance(m, GatedLinear) for m in eager) == 1
        assert len(eager) == 3  # q, k and v's fused layer, the gated layer, down_proj
        layers = wu.warmed_layers(block, traced=True)
        mlp = block.mlp
        if traced:
            assert not any(m in layers for m in members)
            assert [m for m in layers if isinstance(m, GatedLinear)] == [mlp.forward.__self__.linear]
            assert mlp.gate_proj not in layers and mlp.down_proj in layers and len(layers) == 3
        else:
            assert all(m in layers for m in members) and len(layers) == 6  # q, k, v, gate, up, down
            assert not any(isinstance(m, GatedLinear) for m in layers)


def _gated_mlp(dtype: str, traced: bool = False) -> torch.nn.Module:
    """A block whose Llama-style MLP runs fused with its gated activation (``fuse_projections_(glu=True)``);
    its down_proj stays dense (a sparse one's kernels, the specializations of the shapes' of the
    fused layer, would hide those the list holds for the fused layer)."""
    from sparsile.tests.integrations.test_torch_glu import LlamaLikeMLP

    torch.manual_seed(0)
    block = torch.nn.Module()
    block.mlp = LlamaLikeMLP(hidden=256, f=128)
    spt.sparsify_(block, lambda module, name: not name.endswith("down_proj"), dtype=dtype, interpret=True,
                  min_features=16)
    assert not isinstance(block.mlp.down_proj, spt.SparseLinear)
    spt.fuse_projections_(block, glu=True, traced=traced)
    return block


def _gated_mlp_eager_call(mlp, tokens: int, pdl: bool) -> None:
    """What the first eager call of a fused gated MLP builds (``GatedForward.forward``): the gated
    layer's record where ``glu_in_kernel``, else its twin's (the pre-activations)."""
    gated = mlp.forward.__self__.linear
    if not kernels.glu_in_kernel(tokens, torch.device("cpu")):
        gated = gated.__dict__["_pre"]
    _eager_call(gated, tokens, torch.bfloat16, pdl)


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_warm_up_of_a_fused_gated_mlp_compiles_what_its_first_calls_compile_and_nothing_else(
        compiled_keys, monkeypatch, dtype, pdl) -> None:
    """The eager test above for a fused gated MLP, warm_up's list from :func:`wu.warmed_layers`: it
    held the group's plain fused layer and the gated layer's twin too, whose pre-activation kernels
    no call of 1 to 64 tokens runs (the gated layer applies the activation in the kernel there)."""
    if pdl:
        monkeypatch.setattr(wu, "pdl_wanted", lambda device: True)
    block = _gated_mlp(dtype)
    layers = wu.warmed_layers(block)
    for tokens in (1, 4, 16, 64, 100):
        compiled_keys.clear()
        _gated_mlp_eager_call(block.mlp, tokens, pdl)
        warmed = set().union(*(_warm_up_keys(layer, tokens, torch.bfloat16) for layer in layers))
        assert compiled_keys and set(compiled_keys) == warmed, tokens


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_warm_up_of_a_traced_fused_gated_mlp_compiles_what_its_first_calls_compile(traced_first_call, dtype,
                                                                                   traced) -> None:
    """The traced calls of a fused gated MLP: the gated layer's op where the group fuses in traces
    (``traced=True``; the list held the group's fused layer too, which no trace runs), else each
    member's op."""
    block = _gated_mlp(dtype, traced)
    mlp = block.mlp
    calls = (mlp.forward.__self__.linear,) if traced else (mlp.gate_proj, mlp.up_proj)
    layers = wu.warmed_layers(block, traced=True)
    for tokens in (1, 16, 100):
        traced_first_call.clear()
        for layer in calls:
            _traced_call(layer, tokens, torch.bfloat16)
        warmed = set().union(*(_traced_warm_up_keys(layer, tokens, torch.bfloat16) for layer in layers))
        assert traced_first_call and set(traced_first_call) == warmed, tokens


def _static_eager_record(layer, tokens: int, x_dtype: torch.dtype, pdl: bool) -> None:
    """What ``SparseLinear._forward_eager`` builds for a CUDA x of a layer with a static input scale:
    up to RECORD_QUANTIZE_MAX_T tokens a record whose first launch is the static quantizer (the
    prepared one of ``quantize_with_scale`` where the plan pads x), beyond that ``quantize_with_scale``'s
    prepared quantizer, then a record of the fp8 x and the per-tensor scale."""
    w, s = layer._bound(), layer.input_scale
    out_dtype = layer.out_dtype or x_dtype
    x = torch.zeros((tokens, layer.in_features), dtype=x_dtype)
    xq = torch.zeros((tokens, layer.in_features), dtype=torch.float8_e4m3fn)
    with faked.as_on_the_gpu():
        if tokens <= kernels.RECORD_QUANTIZE_MAX_T:
            record = kernels.LaunchRecord(x, w, None, out_dtype, quantize=True, pdl=pdl, static=s)
            if record.prepared is None:
                kernels.kernel_api().prepare_quantize_static(x, xq, s, per_call=("X", "XQ", "S"))
            return
        kernels.kernel_api().prepare_quantize_static(x, xq, s, per_call=("X", "XQ", "S"))
        kernels.LaunchRecord(xq, w, s, out_dtype, pdl=pdl)


@pytest.mark.parametrize("pdl", [False, True])
def test_warm_up_compiles_a_static_input_scale_s_first_calls(compiled_keys, monkeypatch, pdl) -> None:
    """An e4m3 layer with a static input scale: its eager calls' static quantizer (TRIGGER under PDL
    where the record launches it) and the GEMM of a per-tensor scale, not the per-token quantizer and
    GEMM of a layer without one (warm_up listed those: the first calls compiled)."""
    if pdl:
        monkeypatch.setattr(wu, "pdl_wanted", lambda device: True)
    for out_features, in_features in REPRESENTATIVE_SHAPES:
        layer = spt.SparseLinear(in_features, out_features, bias=True, dtype="e4m3", input_scale=True)
        for tokens in (1, 4, 16, 64, 100):
            compiled_keys.clear()
            _static_eager_record(layer, tokens, torch.bfloat16, pdl)
            assert compiled_keys, (out_features, in_features, tokens)
            assert set(compiled_keys) == _warm_up_keys(layer, tokens, torch.bfloat16), \
                (out_features, in_features, tokens)
