"""Which config group, ignore entry and sparsity target applies to a layer of a foreign checkpoint (a
config.json sparsile's writer never makes): compressed-tensors' rules (what the producer meant), and a
``VLLMMatchWarning`` where vLLM's own rules (first target in the config's order, class names by
substring, q/k/v and gate/up fused, ``ignore`` by names and patterns only, sparsity ``ignore`` taken
off the targets by string) give a layer another meaning. docs/torch.md, "Which group applies"."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from sparsile.integrations import safetensors as st
from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.checkpoint_fixtures import compressed_tensors_layer

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

FP8_WEIGHTS = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
STATIC = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
DYNAMIC = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
SPARSE = {"format": "sparse-24-bitmask", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": []}


def _group(targets: list, inputs: dict) -> dict:
    return {"targets": targets, "weights": FP8_WEIGHTS, "input_activations": inputs, "format": "float-quantized"}


class MyLinear(torch.nn.Linear):
    """A linear of the producer's model class (transformers has such subclasses)."""


class _One(torch.nn.Module):
    def __init__(self, cls=torch.nn.Linear):
        super().__init__()
        self.proj = cls(32, 16).to(torch.bfloat16)

    def forward(self, x):
        return self.proj(x)


def _error(fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    return info.value


def _fp8_layer(name: str, rng: np.random.Generator, rows: int = 16, cols: int = 32, *,
               input_scale: bool = True) -> dict[str, np.ndarray]:
    """An fp8 layer as compressed-tensors writes a bf16 model's (scales in bf16)."""
    w = rng.standard_normal((rows, cols)) * 100
    w.reshape(rows, -1, 4)[:, :, ::2] = 0
    tensors = {**compressed_tensors_layer(w.astype(ml_dtypes.float8_e4m3fn), name),
               f"{name}.weight_scale": np.linspace(0.5, 2, rows).astype(ml_dtypes.bfloat16).reshape(-1, 1),
               f"{name}.bias": np.linspace(-1, 1, rows).astype(ml_dtypes.bfloat16)}
    if input_scale:
        tensors[f"{name}.input_scale"] = np.array([0.02], ml_dtypes.bfloat16)
    return tensors


def _write(path, tensors: dict, quant: dict) -> None:
    st.save_file(tensors, path / "model.safetensors")
    full = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": [], "sparsity_config": SPARSE, **quant}
    (path / "config.json").write_text(json.dumps({"quantization_config": full}))


# ------------------------------------------------------------------------------------------------
# compressed-tensors' meaning


def test_a_class_target_names_the_model_modules_own_class(tmp_path):
    """compressed-tensors matches a class target against the classes of the module (its MRO): a group
    targeting ``MyLinear`` (a subclass of nn.Linear in the producer's model) applies to the layer. It
    declares static inputs and the file has no input_scale: SP0913 naming the group (before: the
    loader knew nn.Linear's classes only, found no group and quantized x per token, unseen)."""
    _write(tmp_path, _fp8_layer("proj", np.random.default_rng(1), input_scale=False),
           {"config_groups": {"group_0": _group(["MyLinear"], STATIC)}})
    err = _error(spt.load_sparse24_checkpoint, _One(MyLinear), tmp_path)
    assert err.code == "SP0913"
    assert "layer proj: config.json declares static input activations" in err.message
    assert "(config group 'group_0': input_activations dynamic false)" in err.message
    assert "input_scale" in err.help


def test_an_ignored_class_of_the_model_module(tmp_path):
    """``ignore: ["MyLinear"]`` takes the layer out of the static group: it loads, per token."""
    _write(tmp_path, _fp8_layer("proj", np.random.default_rng(2), input_scale=False),
           {"config_groups": {"group_0": _group(["Linear"], STATIC)}, "ignore": ["MyLinear"]})
    model = _One(MyLinear)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (vLLM's verdict is another test's)
        assert spt.load_sparse24_checkpoint(model, tmp_path).sparse == ["proj"]
    assert model.proj.input_scale is None
