"""Config groups that target a class of the producer's model (``FalconLinear``, transformers' ``Conv1D``):
compressed-tensors matches a class target against the classes of the model's module, so a layer that
``sparsify_`` (or the loader) put in place of such a module is matched by that module's classes
(``source_classes``). Before, a sparsified Falcon's layers were matched as nn.Linear (a weight-only fp8
group targeting ``FalconLinear`` missed them: loaded as e4m3 layers quantizing x per token, where the
dense model loads W_q * s_w in bf16), and a sparsified GPT-2's as ``Linear``, which names no Conv1D in
the dense model compressed-tensors reads; a dense Conv1D was not checked against vLLM's matching at all,
nor put in an fp8 checkpoint's ignore list (vLLM builds GPT-2's projections as linear classes that
``Linear`` matches)."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
falcon = pytest.importorskip("transformers.models.falcon.modeling_falcon")
pytorch_utils = pytest.importorskip("transformers.pytorch_utils")

from sparsile.integrations.torch.checkpoint import module_classes  # noqa: E402

FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
DYNAMIC = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
# (the Conv1D saves warn so: their own test is in test_torch_conv1d_checkpoint.py)
pytestmark = pytest.mark.filterwarnings("ignore::sparsile.integrations.vllm_shapes.VLLMLayoutWarning")
SPARSE = {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["proj"], "ignore": []}


class _Model(torch.nn.Module):
    """One projection ``proj`` (32 -> 16) of class ``cls``, random weights and bias, bf16."""

    def __init__(self, cls, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.proj = cls(32, 16) if cls is not pytorch_utils.Conv1D else cls(16, 32)  # (Conv1D(out, in))
        with torch.no_grad():
            self.proj.weight.copy_(torch.randn(self.proj.weight.shape, generator=gen))
            self.proj.bias.copy_(torch.randn(16, generator=gen))
        self.to(torch.bfloat16)

    def forward(self, x):
        return self.proj(x)


def _sparsified(cls, **kwargs) -> _Model:
    model = _Model(cls)
    assert spt.sparsify_(model, interpret=True, min_features=16, **kwargs).swapped == ["proj"]
    return model


def _load(model, path, **kwargs) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = spt.load_sparse24_checkpoint(model, path, **kwargs)
    return report, [str(w.message) for w in seen if issubclass(w.category, spt.VLLMMatchWarning)]


def test_sparse_layers_keep_the_classes_of_the_module_they_replace():
    assert module_classes(_Model(falcon.FalconLinear).proj) == ("FalconLinear", "Linear", "Module")
    assert module_classes(_sparsified(falcon.FalconLinear).proj) == ("FalconLinear", "Linear", "Module")
    assert module_classes(_sparsified(falcon.FalconLinear, trainable=True).proj) == \
        ("FalconLinear", "Linear", "Module")
    assert module_classes(_sparsified(falcon.FalconLinear, trainable=True).proj.to_sparse_linear()) == \
        ("FalconLinear", "Linear", "Module")
    assert module_classes(_sparsified(pytorch_utils.Conv1D).proj) == ("Conv1D", "Module")
    assert module_classes(_sparsified(torch.nn.Linear).proj) == ("Linear", "Module")


def _weight_only_falcon(path) -> np.ndarray:
    """A W8A16 checkpoint whose one group targets ``FalconLinear``; W_q * s_w in float64."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 32)) * 100
    rows, cols = np.indices(w.shape)
    w[(cols - rows) % 4 >= 2] = 0  # (row r keeps inputs r, r + 1 of each group: 2 of 4 down each column too)
    wq = w.astype(ml_dtypes.float8_e4m3fn)
    scale = np.linspace(0.5, 2, 16).astype(ml_dtypes.bfloat16).reshape(-1, 1)
    st.save_file({**compressed_tensors_layer(wq), "proj.weight_scale": scale,
                  "proj.bias": np.linspace(-1, 1, 16).astype(ml_dtypes.bfloat16)}, path / "model.safetensors")
    group = {"targets": ["FalconLinear"], "weights": FP8_WEIGHTS, "format": "float-quantized"}
    (path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": [], "config_groups": {"group_0": group}, "sparsity_config": SPARSE}}))
    return wq.astype(np.float64) * scale.astype(np.float64)


@pytest.mark.parametrize("trainable", [False, True])
def test_a_group_targeting_falconlinear_applies_to_a_sparsified_falcon(tmp_path, trainable):
    w = _weight_only_falcon(tmp_path)
    _, dense_told = _load(_Model(falcon.FalconLinear), tmp_path, **({"trainable": True} if trainable else {}))
    model = _sparsified(falcon.FalconLinear, trainable=trainable)
    _, told = _load(model, tmp_path)
    layer = model.proj
    assert type(layer) is (spt.SemiSparseLinear if trainable else spt.SparseLinear)
    assert layer.weight_dtype == "bf16" and getattr(layer, "scale_w", None) is None  # (W_q * s_w: weights only)
    assert layer.source_classes == ("FalconLinear", "Linear", "Module")
    assert np.array_equal(layer.to_dense().double().numpy(), w.astype(ml_dtypes.bfloat16).astype(np.float64))
    assert told == dense_told and len(told) == 1  # (vLLM: "falconlinear" is no part of its class names)


def test_an_fp8_falcon_is_written_with_targets_both_readers_match(tmp_path):
    model = _sparsified(falcon.FalconLinear, dtype="e4m3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spt.save_sparse24_checkpoint(model, tmp_path)
    fresh = _Model(falcon.FalconLinear, seed=1)
    _, told = _load(fresh, tmp_path)
    assert told == []
    assert fresh.proj.weight_dtype == "e4m3" and torch.equal(fresh.proj.to_dense(), model.proj.to_dense())
    assert torch.equal(fresh.proj.scale_w, model.proj.scale_w)


def test_a_linear_target_is_told_for_gpt2s_conv1d_dense_or_sparsified(tmp_path):
    """A 16-bit GPT-2-style checkpoint whose config has an fp8 group targeting ``Linear``: compressed-tensors
    matches no Conv1D with it (not quantized), vLLM's linear class does (fp8): one warning, for a dense
    and for a sparsified model alike."""
    spt.save_sparse24_checkpoint(_sparsified(pytorch_utils.Conv1D), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["config_groups"] = {"group_0": {
        "targets": ["Linear"], "weights": FP8_WEIGHTS, "input_activations": DYNAMIC, "format": "float-quantized"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, dense_told = _load(_Model(pytorch_utils.Conv1D, seed=1), tmp_path)
    model = _sparsified(pytorch_utils.Conv1D)
    _, told = _load(model, tmp_path)
    assert told == dense_told and len(told) == 1
    assert ("proj: compressed-tensors reads 2:4 sparse, not quantized; vLLM reads 2:4 sparse, weights float8 per "
            "channel, inputs float8 per token dynamic") in told[0]
    assert model.proj.source_classes == ("Conv1D", "Module")


class _Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = _Model(torch.nn.Linear).proj
        self.conv = _Model(pytorch_utils.Conv1D).proj


def test_an_fp8_checkpoint_ignores_a_dense_conv1d(tmp_path):
    """vLLM builds a Conv1D as a linear class, which the written group's target ``Linear`` would quantize."""
    model = _Mixed()
    assert spt.sparsify_(model, lambda m, n: n == "proj", dtype="e4m3", interpret=True,
                         min_features=16).swapped == ["proj"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spt.save_sparse24_checkpoint(model, tmp_path)
    quant = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert quant["config_groups"]["group_0"]["targets"] == ["Linear"] and quant["ignore"] == ["conv"]
