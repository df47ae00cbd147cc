"""The config.json ``save_sparse24_checkpoint`` writes holds one compression scheme, the one its
weights have, under ``quantization_config``: a stale scheme of the config it is given (a model built
from another checkpoint's config) is dropped wherever that config holds it. Before, only
quantization_config's was dropped: one at the top level (which readers take first) or under
``compression_config`` was written next to sparsile's own. Read back as an outside reader would:
the raw JSON."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

# another checkpoint's scheme: fp8 weights only (W8A16) for every Linear, and a kv-cache scheme
STALE = {"config_groups": {"group_0": {"targets": ["Linear"],
                                       "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
         "ignore": [], "format": "naive-quantized", "quantization_status": "compressed",
         "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
STALE_SPARSITY = {"format": "dense", "targets": ["other"]}


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = linear(32, 64, dtype=torch.bfloat16, seed=1)
        self.head = linear(16, 32, dtype=torch.bfloat16, seed=2)

    def forward(self, x):
        return self.head(torch.relu(self.proj(x)))


def _given(holder: str) -> dict[str, Any]:
    """A model's config with the stale scheme (and a stale sparsity_config) at ``holder``."""
    scheme = {**STALE, "sparsity_config": STALE_SPARSITY}
    if holder == "top":
        return {"model_type": "llama", "hidden_size": 32, **scheme}
    if holder == "compression_config":
        return {"model_type": "llama", "hidden_size": 32, "compression_config": {"quant_method": "compressed-tensors",
                                                                              **scheme}}
    inner = {"quant_method": "compressed-tensors", "quantization_config": scheme}
    return {"model_type": "llama", "hidden_size": 32, holder.split(".")[0]: inner}


def _paths(node: Any, keys: tuple[str, ...], at: str = "") -> list[str]:
    """The dotted paths of every ``keys`` entry in the JSON tree ``node``."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{at}.{key}" if at else key
            if key in keys:
                found.append(here)
            found += _paths(value, keys, here)
    return found


@pytest.mark.parametrize("holder", ["top", "compression_config", "compression_config.quantization_config",
                                    "quantization_config.quantization_config"])
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
def test_the_written_config_holds_only_the_scheme_of_its_weights(tmp_path, holder, dtype):
    model = _Net()
    spt.sparsify_(model, dtype=dtype, interpret=True, min_features=16)
    with warnings.catch_warnings():  # (vLLM's shape rules are not the subject)
        warnings.simplefilter("ignore", spt.VLLMShapeWarning)
        spt.save_sparse24_checkpoint(model, tmp_path, config=_given(holder))
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["model_type"], written["hidden_size"]) == ("llama", 32)  # (the model's own keys stay)
    schemes = ("config_groups", "sparsity_config", "kv_cache_scheme", "quantization_status", "compression_config")
    want = ["quantization_config.sparsity_config"]
    if dtype == "e4m3":
        want = ["quantization_config.config_groups", "quantization_config.quantization_status", *want]
    assert sorted(_paths(written, schemes)) == want
    quant = written["quantization_config"]
    assert quant["sparsity_config"]["format"] == "sparse-24-bitmask"
    assert sorted(quant["sparsity_config"]["targets"]) == ["head", "proj"]
    if dtype == "e4m3":
        (group,) = quant["config_groups"].values()
        assert group["input_activations"]["dynamic"] is True and quant["format"] == "float-quantized"
    else:
        assert set(quant) == {"quant_method", "sparsity_config"}
    # read back: the layers as written (the stale weight-only group read fp8 layers as W8A16, bf16 values)
    fresh = _Net()
    with warnings.catch_warnings():
        warnings.simplefilter("error", spt.VLLMMatchWarning)
        report = spt.load_sparse24_checkpoint(fresh, tmp_path)
    assert report.sparse == ["head", "proj"]
    for name in ("proj", "head"):
        assert getattr(fresh, name).weight_dtype == dtype
        assert torch.equal(getattr(fresh, name).to_dense(), getattr(model, name).to_dense())
