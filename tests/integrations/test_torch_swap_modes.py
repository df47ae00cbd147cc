"""The train / eval mode of the modules sparsify_ and load_sparse24_checkpoint swap in: that of the
module each replaces (integrations/torch/atomic.py, ``swap_modules``). A new module is in training
mode, so a model put in eval mode (as transformers' ``from_pretrained`` returns it) had sparse layers
in training mode after the swap: ``model.training`` False, its layers' True."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(linear(64, 64, seed=1), torch.nn.ReLU(), linear(32, 64, seed=2))


def _modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: module.training for name, module in model.named_modules()}


@pytest.mark.parametrize("trainable", [False, True])
def test_sparsify_keeps_each_module_s_mode(trainable):
    model = _model().eval()
    model[2].train()  # (one layer in the other mode: each keeps its own)
    before = _modes(model)
    report = spt.sparsify_(model, interpret=True, min_features=0, trainable=trainable)
    assert report.swapped == ["0", "2"]
    assert _modes(model) == before == {"": False, "0": False, "1": False, "2": True}


def test_a_loaded_checkpoint_s_layers_keep_the_model_s_mode(tmp_path):
    source = _model()
    spt.sparsify_(source, interpret=True, min_features=0)
    spt.save_sparse24_checkpoint(source, tmp_path)
    model = _model().eval()
    report = spt.load_sparse24_checkpoint(model, tmp_path)
    assert report.sparse == ["0", "2"] and isinstance(model[0], spt.SparseLinear)
    assert not any(_modes(model).values())
