"""``torch.nn.utils.parametrize.register_parametrization`` on the tensors of a sparse layer it cannot take
(SP0925, integrations/torch/parametrize_guard.py), refused before torch changes the layer:

* ``values``: torch stopped at ``KeyError: "attribute 'values' already exists"`` (``ModuleDict.values``)
  after deleting the buffer and swapping the layer's class: the layer's next call a ``KeyError`` from
  inside sparsile;
* a ``SemiSparseLinear``'s ``values_t``, ``meta`` (and ``meta_t``): registered, then every re-compression
  wrote into a copy, and x's gradient after an optimizer step (``values_t``), or the outputs after a
  re-prune (``meta``), came from the compressions from before, without a word."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
parametrize = torch.nn.utils.parametrize

_FROZEN_HELP = (
    "the compressed values are a frozen weight: to transform them once, write them in place (with torch.no_grad(): "
    "layer.values.copy_(P(layer.values))); to parametrize the weight, train a SemiSparseLinear "
    "(SparseLinear.from_dense(linear, trainable=True)) and parametrize its master weight: "
    "register_parametrization(layer, 'weight', P)")
_TRAINED_HELP = ("parametrize the master weight instead: register_parametrization(layer, 'weight', P); values, meta, "
                 "values_t and meta_t are compressed from weight * mask at each refresh")
_VALUES_WHY = (
    "torch keeps parametrizations in a ModuleDict, whose method ModuleDict.values takes the name (torch would stop "
    "at \"attribute 'values' already exists\" after deleting the buffer, leaving the layer without its weight)")


class Doubled(torch.nn.Module):
    """2 * t, with a right_inverse (t / 2), which torch applies to the tensor in place before registering."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t * 2

    def right_inverse(self, t: torch.Tensor) -> torch.Tensor:
        return t / 2


class Same(torch.nn.Module):
    """t itself (a copy), without a right_inverse."""

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()


def _refused(layer: torch.nn.Module, name: str, p: torch.nn.Module) -> IntegrationError:
    with pytest.raises(IntegrationError) as caught:
        parametrize.register_parametrization(layer, name, p)
    return caught.value


@pytest.mark.parametrize("p", [Doubled(), Same()], ids=["right_inverse", "plain"])
def test_a_sparse_layers_values_are_refused_and_the_layer_left_as_it_was(p):
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=1), "bf16")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    before, values = layer(x), layer.values.clone()
    error = _refused(layer, "values", p)
    assert error.code == "SP0925" and error.help == _FROZEN_HELP
    assert error.message == f"torch.nn.utils.parametrize cannot take the SparseLinear's values: {_VALUES_WHY}"
    assert type(layer) is spt.SparseLinear and not parametrize.is_parametrized(layer)
    assert list(layer._buffers) == ["values", "meta", "bias", "scale_w", "input_scale"]
    assert torch.equal(layer.values, values) and torch.equal(layer(x), before)
    assert not hasattr(layer, "parametrizations")


def test_a_parametrized_bias_and_meta_of_a_sparse_layer_are_still_taken():
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=3), "bf16")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    before = layer(x)
    parametrize.register_parametrization(layer, "bias", Same())
    parametrize.register_parametrization(layer, "meta", Same())
    assert set(layer.parametrizations) == {"bias", "meta"} and torch.equal(layer(x), before)
    error = _refused(layer, "values", Same())  # (torch's ModuleDict exists already: the other path)
    assert error.code == "SP0925" and torch.equal(layer(x), before)
    parametrize.remove_parametrizations(layer, "bias")
    parametrize.remove_parametrizations(layer, "meta")
    assert type(layer) is spt.SparseLinear and not hasattr(layer, "parametrizations")
    assert torch.equal(layer(x), before)


@pytest.mark.parametrize("name", ["values", "meta", "values_t", "meta_t"])
def test_a_trainable_layers_compressions_are_refused(name):
    layer = spt.SemiSparseLinear.from_dense(linear(48, 64, torch.float32, seed=5), "bf16")
    error = _refused(layer, name, Same())
    assert error.code == "SP0925" and error.help == _TRAINED_HELP
    why = _VALUES_WHY if name == "values" else (
        "it is a compression of the master weight, written in place by each re-compression (after an optimizer step "
        "or a re-prune): a parametrized one is a copy on each access, so the layer would compute with the "
        "compression from before")
    assert error.message == f"torch.nn.utils.parametrize cannot take the SemiSparseLinear's {name}: {why}"
    assert type(layer) is spt.SemiSparseLinear and not parametrize.is_parametrized(layer)


def test_a_trainable_layer_with_a_parametrized_weight_refuses_values_t_and_trains_right():
    """The weight parametrized first (torch's ModuleDict exists, the layer's class is torch's subclass):
    values_t is still refused, and after an optimizer step y and x's gradient follow the stepped weight."""
    layer = spt.SemiSparseLinear.from_dense(linear(48, 64, torch.float32, seed=6), "bf16")
    parametrize.register_parametrization(layer, "weight", Same())
    error = _refused(layer, "values_t", Same())
    assert error.code == "SP0925" and error.message.startswith(
        "torch.nn.utils.parametrize cannot take the SemiSparseLinear's values_t: ")
    assert set(layer.parametrizations) == {"weight"}
    gen = torch.Generator().manual_seed(7)
    optimizer = torch.optim.SGD(layer.parameters(), lr=1.0)
    layer(torch.randn(4, 64, generator=gen)).square().sum().backward()
    optimizer.step()
    x = torch.randn(4, 64, generator=gen).requires_grad_()
    y = layer(x)
    y.backward(torch.ones_like(y))
    xk, w = bf16(x), masked_weight(layer)
    within(y, xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 64, torch.float32)
    ones = torch.ones(4, 48, dtype=torch.float64)
    within(x.grad, ones @ w, ones @ w.abs(), 48, torch.bfloat16)


def test_a_parametrized_bias_still_compiles_with_fullgraph():
    """Dynamo traces the parametrized bias's reads through the layer's ``parametrizations`` property: the
    property looks at no frames there (``sys._getframe`` is a function dynamo skips: a graph break, which
    stopped fullgraph=True at "Attempted to call function marked as skipped")."""
    torch._dynamo.reset()
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=11), "bf16")
    parametrize.register_parametrization(layer, "bias", Doubled())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(12)).to(torch.bfloat16)
    y = torch.compile(layer, backend="eager", fullgraph=True)(x)
    assert torch.equal(y, layer(x))
