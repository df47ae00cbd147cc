"""The sparse-24-bitmask + fp8 conventions of compressed-tensors and vLLM that the checkpoint code got
wrong, each with a fixture laid out as their code writes it:

* the writer's fp8 config had no ``format``: compressed-tensors' ``QuantizationConfig`` then reads its
  default ``"fakequant"``, which names no compressor, so its ``ModelCompressor`` (which vLLM's 2:4
  scheme builds from the config) raised KeyError; it writes ``float-quantized`` for fp8 W8A8 and the
  status ``compressed``;
* ``input_activations`` without ``dynamic`` are static (``QuantizationArgs.dynamic`` defaults to
  false): the loader took them for dynamic and loaded a layer without its input_scale per token;
* a config group applies to a module as compressed-tensors' ``apply_quantization_config`` picks it:
  a target listed by several groups belongs to the last, names before ``re:`` patterns, each kind in
  string order, then class names of the module's MRO (``Module`` too); the loader took the first
  group of the highest rank and knew the class ``Linear`` only.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.integrations.sparse24 import scheme_group, static_input_group
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.tests.integrations.test_torch_checkpoint_static import check_static  # noqa: E402

FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
STATIC = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
DYNAMIC = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}


class _One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 16).to(torch.bfloat16)

    def forward(self, x):
        return self.proj(x)


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def _ct_checkpoint(tmp_path, groups: dict, *, input_scale: bool = True, ignore: list | None = None):
    """An fp8 layer ``proj`` 16 x 32 as compressed-tensors writes a bf16 model's: scales in the model's
    dtype (its initialize: ``scale_dtype = observed_dtype``), weight_scale (out, 1), input_scale (1,),
    config with format float-quantized and status compressed. Returns (W_q, s_w, bias, s_x) in float64."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((16, 32)) * 100
    w.reshape(16, 8, 4)[:, :, ::2] = 0
    wq = w.astype(ml_dtypes.float8_e4m3fn)
    s_w = np.linspace(0.5, 2, 16).astype(ml_dtypes.bfloat16)
    bias = np.linspace(-1, 1, 16).astype(ml_dtypes.bfloat16)
    s_x = np.array([0.02], ml_dtypes.bfloat16)
    tensors = {**compressed_tensors_layer(wq), "proj.bias": bias, "proj.weight_scale": s_w.reshape(-1, 1)}
    if input_scale:
        tensors["proj.input_scale"] = s_x
    st.save_file(tensors, tmp_path / "model.safetensors")
    quant = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
             "config_groups": groups, "ignore": ignore or [],
             "sparsity_config": {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"]}}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quant}))
    return (wq.astype(np.float64), s_w.astype(np.float64), bias.astype(np.float64),
            float(s_x.astype(np.float64)[0]))


def _group(targets: list, inputs: dict) -> dict:
    return {"targets": targets, "weights": FP8_WEIGHTS, "input_activations": inputs, "format": "float-quantized"}


def _x() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 32, generator=gen) * 3
    x[0, :2] = torch.tensor([25.0, -40.0])  # beyond 448 * s_x: saturated
    return x.to(torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# the writer's format


@pytest.mark.parametrize("static", [False, True])
def test_the_fp8_writer_declares_compressed_tensors_format_and_status(tmp_path, static):
    """Without ``format`` compressed-tensors reads its default "fakequant" (no compressor of that name:
    KeyError in ModelCompressor.from_compression_config, which vLLM's CompressedTensors24 calls), and
    vLLM before per-group formats dropped the input_activations of a config without one."""
    model = _One()
    spt.sparsify_(model, dtype="e4m3", interpret=True, min_features=16)
    if static:
        model.proj.input_scale = torch.tensor([0.03])
    spt.save_sparse24_checkpoint(model, tmp_path)
    quant = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert quant["format"] == "float-quantized" and quant["quantization_status"] == "compressed"
    (group,) = quant["config_groups"].values()
    assert group["format"] == "float-quantized"
    assert group["input_activations"]["dynamic"] is (not static)
    assert quant["sparsity_config"]["format"] == "sparse-24-bitmask"
    fresh = _One()
    assert spt.load_sparse24_checkpoint(fresh, tmp_path).unexpected == []
    x = _x()
    assert torch.equal(fresh.proj(x), model.proj(x))


def test_a_16_bit_checkpoint_declares_no_quantization(tmp_path):
    """A sparse-only checkpoint holds only quant_method and sparsity_config in its quantization_config
    (compressed-tensors then has no quantization config, and vLLM no config groups)."""
    model = _One()
    spt.sparsify_(model, interpret=True, min_features=16)
    spt.save_sparse24_checkpoint(model, tmp_path)
    quant = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert set(quant) == {"quant_method", "sparsity_config"}


# ------------------------------------------------------------------------------------------------
# dynamic's default


def test_input_activations_without_dynamic_are_static_and_need_an_input_scale(tmp_path):
    """compressed-tensors' QuantizationArgs.dynamic defaults to false: a tensor-strategy
    input_activations without ``dynamic`` is static. The loader read it as dynamic and loaded a layer
    without its input_scale quantizing x per token, unseen."""
    inputs = {k: v for k, v in STATIC.items() if k != "dynamic"}
    _ct_checkpoint(tmp_path, {"group_0": _group(["Linear"], inputs)}, input_scale=False)
    model = _One()
    err = _error(spt.load_sparse24_checkpoint, model, tmp_path)
    assert err.code == "SP0913"
    assert err.message == ("layer proj: config.json declares static input activations for it (config group "
                           "'group_0': input_activations without dynamic, which compressed-tensors takes as false), "
                           "but the checkpoint has no proj.input_scale; x would be quantized per token instead of "
                           "with the calibrated scale")
    assert err.help == ("write proj.input_scale (x's calibrated amax / 448, one float32), or declare dynamic: true "
                        "for proj's input_activations (per-token scales)")
    assert type(model.proj) is torch.nn.Linear


def test_a_checkpoint_as_compressed_tensors_writes_static_fp8_computes_as_vllm(tmp_path):
    """bf16 scales (compressed-tensors keeps them in the model's dtype; vLLM copies them into float32
    parameters), input_activations without ``dynamic``: y as vLLM's static per-tensor path, float64."""
    inputs = {k: v for k, v in STATIC.items() if k != "dynamic"}
    wq, s_w, bias, s_x = _ct_checkpoint(tmp_path, {"group_0": _group(["Linear"], inputs)})
    model = _One()
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    layer = model.proj
    assert layer.input_scale.dtype == torch.float32 and layer.input_scale.item() == s_x
    assert np.array_equal(layer.scale_w.double().numpy(), s_w)
    x = _x()
    y = layer(x)
    check_static(y, x, wq, s_w, bias, s_x)


# ------------------------------------------------------------------------------------------------
# which group applies to a layer


# (where vLLM's order of targets picks another group it warns: test_torch_checkpoint_matching.py's subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.parametrize(("groups", "want"), [
    # a target listed by two groups belongs to the last (apply_quantization_config's target_to_scheme)
    ({"group_0": _group(["proj"], DYNAMIC), "group_1": _group(["proj"], STATIC)}, "group_1"),
    ({"group_0": _group(["Linear"], DYNAMIC), "group_1": _group(["Linear"], STATIC)}, "group_1"),
    # re: patterns in the order of their strings ("re:.*proj" < "re:p"), not of the groups
    ({"group_0": _group(["re:p"], DYNAMIC), "group_1": _group(["re:.*proj"], STATIC)}, "group_1"),
    # a class of nn.Linear's MRO
    ({"group_0": _group(["Module"], STATIC)}, "group_0"),
    # a name before a pattern, a pattern before a class, whatever the groups' order
    ({"group_0": _group(["re:proj"], DYNAMIC), "group_1": _group(["proj"], STATIC)}, "group_1"),
    ({"group_0": _group(["Linear"], DYNAMIC), "group_1": _group(["re:pro"], STATIC)}, "group_1"),
])
def test_the_group_compressed_tensors_applies_declares_the_layer_static(tmp_path, groups, want):
    """The group that applies is static, another one that targets the layer dynamic: without an
    input_scale the layer is SP0913 naming that group (it was loaded per token, or refused naming the
    other group)."""
    _ct_checkpoint(tmp_path, groups, input_scale=False)
    assert static_input_group(json.loads((tmp_path / "config.json").read_text()), "proj") == (want, True)
    err = _error(spt.load_sparse24_checkpoint, _One(), tmp_path)
    assert err.code == "SP0913" and f"(config group {want!r}: input_activations dynamic false)" in err.message


# (where vLLM's order of targets picks another group it warns: test_torch_checkpoint_matching.py's subject)
@pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_match.VLLMMatchWarning")
@pytest.mark.parametrize("groups", [
    {"group_0": _group(["proj"], STATIC), "group_1": _group(["proj"], DYNAMIC)},
    {"group_0": _group(["re:p"], STATIC), "group_1": _group(["re:.*proj"], DYNAMIC)},
    {"group_0": _group(["Linear"], STATIC), "group_1": _group(["re:proj"], DYNAMIC)},
])
def test_the_group_compressed_tensors_applies_declares_the_layer_dynamic(tmp_path, groups):
    """The reverse: the group that applies is dynamic, so a layer without input_scale loads, x
    quantized per token (it was refused, SP0913, naming the static group)."""
    _ct_checkpoint(tmp_path, groups, input_scale=False)
    model = _One()
    assert spt.load_sparse24_checkpoint(model, tmp_path).sparse == ["proj"]
    assert model.proj.weight_dtype == "e4m3" and model.proj.input_scale is None


@pytest.mark.parametrize("ignore", [["proj"], ["re:pr"], ["Linear"], ["Module"]])
def test_ignore_takes_names_patterns_and_classes(ignore):
    config = {"quantization_config": {"config_groups": {"group_0": _group(["Linear"], STATIC)}, "ignore": ignore}}
    assert scheme_group(config, "proj") is None
    assert scheme_group(config, "other") == (None if ignore[0] in ("Linear", "Module") else
                                             ("group_0", config["quantization_config"]["config_groups"]["group_0"]))


def test_patterns_match_at_the_start_only():
    """``re.match``: anchored at the start, not at the end (not fullmatch, not search)."""
    config = {"config_groups": {"group_0": _group(["re:layers\\.0"], STATIC)}}
    assert scheme_group(config, "layers.0.proj") is not None
    assert scheme_group(config, "model.layers.0.proj") is None
