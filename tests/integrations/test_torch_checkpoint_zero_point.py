"""Asymmetric quantization next to a sparse 8-bit layer: compressed-tensors' ``symmetric: false``
stores ``<name>.weight_zero_point`` (or ``input_zero_point``) and means (q - zero_point) * scale.
The loader reported a zero point unexpected and, with ``strict=False``, dropped it: the layer
loaded q * scale, other numbers, without a word. A nonzero zero point, or a config group declaring
``symmetric: false`` for the layer, is now SP0913 under either ``strict``; an all-zero zero point
(compressed-tensors registers one for symmetric schemes too) loads."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer
from sparsile.tests.integrations.torch_helpers import check_against_float64

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

HELP = ("quantize the layer symmetrically (compressed-tensors' default, symmetric: true; no zero point or an all-zero "
        "one), or store its weights dequantized in bf16 / f16; strict=False does not skip it")


def _group(weights_symmetric: bool = True, inputs_symmetric: bool = True) -> dict:
    return {"config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": weights_symmetric,
                    "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": inputs_symmetric,
                              "dynamic": True}}}}


class _One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 16).to(torch.bfloat16)

    def forward(self, x):
        return self.proj(x)


def _write(path, extra: dict[str, np.ndarray], quant: dict, stored: str = "F8_E4M3") -> np.ndarray:
    """An fp8 sparse layer ``proj`` (random 2:4 weights, as F8_E4M3 or its int8 bits) with a
    per-channel weight_scale, the ``extra`` tensors and config group(s) ``quant``; returns the stored
    fp8 weight (out, in)."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((16, 32)) * 4 + 0.1
    w.reshape(16, 8, 4)[:, :, 1::2] = 0
    q = w.astype(ml_dtypes.float8_e4m3fn)
    layer = compressed_tensors_layer(q)
    if stored == "I8":
        layer["proj.compressed"] = layer["proj.compressed"].view(np.int8)
    tensors = {**layer, "proj.bias": rng.standard_normal(16).astype(np.float32),
               "proj.weight_scale": rng.uniform(0.01, 0.1, (16, 1)).astype(np.float32), **extra}
    st.save_file(tensors, path / "model.safetensors")
    config = {"quant_method": "compressed-tensors", "sparsity_config": {"format": "sparse-24-bitmask"}, **quant}
    (path / "config.json").write_text(json.dumps({"quantization_config": config}))
    return q


def _load(model, path, **kwargs):
    with warnings.catch_warnings():  # (vLLM's matching of these hand-written configs is not the subject)
        warnings.simplefilter("ignore", spt.VLLMMatchWarning)
        return spt.load_sparse24_checkpoint(model, path, **kwargs)


def _error(model, path, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        _load(model, path, **kwargs)
    return info.value


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("stored", ["F8_E4M3", "I8"])
@pytest.mark.parametrize("part", ["weight_zero_point", "input_zero_point"])
def test_a_nonzero_zero_point_is_refused(tmp_path, strict, stored, part):
    """compressed-tensors' zero point of an fp8 weight is F8_E4M3, (out, 1) per channel; one nonzero
    entry changes a row's weights. Before: SP0914 "unexpected" under strict, and under strict=False
    the layer loaded as if symmetric."""
    zero = np.zeros((16, 1), np.float32)
    zero[5, 0] = 1.5
    zero[9, 0] = -0.25
    _write(tmp_path, {f"proj.{part}": zero.astype(ml_dtypes.float8_e4m3fn)}, _group(), stored)
    model = _One()
    err = _error(model, tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0913", f"layer proj: proj.{part} holds 2 nonzero values: asymmetric quantization ((q - zero_point) * "
                  "scale), which the fp8 kernel does not compute (it would load q * scale)")
    assert err.help == HELP
    assert type(model.proj) is torch.nn.Linear  # (nothing changed)


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize(("weights", "inputs", "part", "what"), [
    (False, True, "weights", "weights"), (True, False, "input_activations", "input activations")])
def test_a_group_declaring_symmetric_false_is_refused(tmp_path, strict, weights, inputs, part, what):
    """``symmetric: false`` in the group compressed-tensors applies to the layer: refused even where
    the file holds no zero point (compressed-tensors skips writing some; vLLM refuses such an fp8
    scheme too)."""
    _write(tmp_path, {}, _group(weights, inputs))
    model = _One()
    err = _error(model, tmp_path, strict=strict)
    assert (err.code, err.message) == (
        "SP0913", f"layer proj: config.json declares asymmetric {what} for it (config group 'group_0': {part} "
                  "symmetric false, (q - zero_point) * scale), which the fp8 kernel does not compute (it quantizes "
                  "symmetrically: q * scale)")
    assert err.help == HELP
    assert type(model.proj) is torch.nn.Linear


def test_a_symmetric_false_group_of_another_layer_does_not_refuse(tmp_path):
    """Only the group that applies to the layer counts: an asymmetric group naming another module."""
    quant = _group()
    quant["config_groups"]["group_1"] = {"targets": ["other"], "weights": {"num_bits": 8, "type": "int",
                                                                           "symmetric": False}}
    _write(tmp_path, {}, quant)
    model = _One()
    report = _load(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])


@pytest.mark.parametrize("stored", ["F8_E4M3", "I8"])
def test_an_all_zero_zero_point_loads_under_strict(tmp_path, stored):
    """All-zero zero points are symmetric quantization: taken as the layer's (not unexpected, which
    strict refused), the layer's numbers W_q * s_w, checked against float64 on random x."""
    zeros = {"proj.weight_zero_point": np.zeros((16, 1), ml_dtypes.float8_e4m3fn),
             "proj.input_zero_point": np.zeros((1,), ml_dtypes.float8_e4m3fn)}
    q = _write(tmp_path, zeros, _group(), stored)
    model = _One()
    report = _load(model, tmp_path)
    assert (report.sparse, report.missing, report.unexpected) == (["proj"], [], [])
    layer = model.proj
    scale = st.load_file(tmp_path / "model.safetensors")["proj.weight_scale"].astype(np.float64)
    assert layer.weight_dtype == "e4m3"
    assert np.array_equal(layer.to_dense().double().numpy(),
                          (q.astype(np.float64) * scale).astype(np.float32).astype(np.float64))
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16)
    y = torch.full((5, 16), float("nan"), dtype=torch.bfloat16)
    y.copy_(layer(x))
    check_against_float64(layer, x, y)
