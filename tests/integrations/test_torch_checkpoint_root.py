"""``save_sparse24_checkpoint`` of a model that is itself a SparseLinear (the root module): its
tensors are named as compressed-tensors names a root module's (``weight.compressed``, ``.bitmask``,
``.shape``, and ``bias``, ``weight_scale``, ``input_scale`` without a prefix), as the layer's own
``state_dict()`` names them. Before, the writer named them ``.bias``, ``.weight_scale`` and
``.input_scale`` (an empty layer name and a dot): keys no reader maps to the layer, so that
compressed-tensors decompressed the weight without its bias or its fp8 scale.

Read back as an outside reader would (the HF ``safetensors`` package, not this package's reader)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
safe_open = pytest.importorskip("safetensors").safe_open


def _written(layer, path) -> dict[str, Any]:
    with warnings.catch_warnings():  # (16 x 32 fits vLLM; the warnings are not this test's subject)
        warnings.simplefilter("ignore")
        spt.save_sparse24_checkpoint(layer, path)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_root_layer_s_bias_is_named_bias(tmp_path, dtype):
    dense = linear(16, 32, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16, seed=3)
    layer = spt.SparseLinear.from_dense(dense, dtype)
    tensors = _written(layer, tmp_path)
    assert sorted(tensors) == ["bias", "weight.bitmask", "weight.compressed", "weight.shape"]
    assert torch.equal(tensors["bias"], layer.bias)  # (the layer's float32 bias, bit for bit)
    # the weight, decompressed as compressed-tensors does (row-major scatter into the little-endian bitmask)
    mask = np.unpackbits(tensors["weight.bitmask"].numpy(), axis=1, bitorder="little")[:, :32].astype(bool)
    weight = np.zeros((16, 32), np.float32)
    weight[mask] = tensors["weight.compressed"].float().numpy().reshape(-1)
    np.testing.assert_array_equal(weight, layer.to_dense().numpy())


def test_a_root_fp8_layer_s_scales_are_named_as_its_state_dict_names_them(tmp_path):
    layer = spt.SparseLinear.from_dense(linear(16, 32, dtype=torch.bfloat16, seed=4), "e4m3")
    layer.input_scale = torch.tensor([0.0625])  # (a static per-tensor input scale, as a W8A8 static checkpoint's)
    tensors = _written(layer, tmp_path)
    assert sorted(tensors) == ["bias", "input_scale", "weight.bitmask", "weight.compressed", "weight.shape",
                               "weight_scale"]
    assert {"bias", "input_scale"} <= set(layer.state_dict())  # (the same names as the layer's own)
    assert torch.equal(tensors["weight_scale"].reshape(-1), layer.scale_w)
    assert torch.equal(tensors["input_scale"], layer.input_scale)
    assert torch.equal(tensors["bias"], layer.bias)

