"""A transformers Conv1D swapped with ``trainable=True`` (a SemiSparseLinear of weight W.T, (out, in)) and
dense state dicts: a Conv1D's own ``weight`` is stored (in, out), so for a square projection (GPT-2's
attention c_proj) it has the layer's shape and ``load_state_dict(strict=False)`` copied it in unseen,
transposed (the layer then computed x @ prune(W).T: other numbers). The layer's own state dict still
loads; a dense weight without the layer's mask is refused, the layer left as it was."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
spt = pytest.importorskip("sparsile.torch")



def conv1d_model(seed: int = 0) -> torch.nn.Sequential:
    """One square Conv1D (64 -> 64) in bf16 with random weights and bias."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(transformers.pytorch_utils.Conv1D(64, 64)).to(torch.bfloat16)
    torch.nn.init.normal_(model[0].weight)
    torch.nn.init.normal_(model[0].bias)
    return model


def against_float64(layer, x: torch.Tensor) -> float:
    """The relative error of ``layer(x)`` against x @ (weight * mask).T + bias in float64."""
    exact = x.double() @ (layer.weight.double() * layer.mask).T + layer.bias.double()
    with torch.no_grad():
        got = layer(x).double()
    assert exact.abs().max() > 0.1
    return ((got - exact).norm() / exact.norm()).item()


def test_a_conv1d_state_dict_is_not_loaded_transposed():
    dense = conv1d_model()
    model = copy.deepcopy(dense)
    assert spt.sparsify_(model, interpret=True, min_features=16, trainable=True).swapped == ["0"]
    layer = model[0]
    weight, mask = layer.weight.detach().clone(), layer.mask.clone()
    assert torch.equal(weight * mask, (dense[0].weight.T * mask).to(weight.dtype))
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(dense.state_dict(), strict=False)
    assert str(info.value) == (
        "Error(s) in loading state_dict for Sequential:\n\terror[SP0916]: 0.weight of shape (64, 64) comes without "
        "0.mask: this SemiSparseLinear was made from a transformers Conv1D, which stores its weight (in, out) = "
        "(64, 64), while the layer's master weight is its transpose W.T (out, in) = (64, 64); a transformers "
        "Conv1D's weight would be loaded transposed\n = help: load the layer's own state dict (weight (out, in) with "
        "its mask), or transpose the transformers Conv1D's weight (state_dict['0.weight'] = weight.T) and pass the "
        "layer's mask with it (state_dict['0.mask'] = layer.mask)")
    assert torch.equal(layer.weight, weight) and torch.equal(layer.mask, mask)  # (nothing copied)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert against_float64(layer, x) < 1e-2


def test_a_conv1d_layer_loads_its_own_state_dict_and_a_transposed_weight_with_its_mask():
    model = conv1d_model()
    spt.sparsify_(model, interpret=True, min_features=16, trainable=True)
    other = conv1d_model(seed=4)
    spt.sparsify_(other, interpret=True, min_features=16, trainable=True)
    model.load_state_dict(other.state_dict())  # (the layer's own keys: weight (out, in) with its mask)
    assert torch.equal(model[0].weight, other[0].weight) and torch.equal(model[0].mask, other[0].mask)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    assert against_float64(model[0], x) < 1e-2
    dense = conv1d_model(seed=5)  # a Conv1D's weight, transposed by hand, with the layer's mask: loaded
    state = {"0.weight": dense[0].weight.T.contiguous(), "0.bias": dense[0].bias, "0.mask": model[0].mask}
    model.load_state_dict(state, strict=False)
    assert torch.equal(model[0].weight, dense[0].weight.T)
    assert against_float64(model[0], x) < 1e-2
