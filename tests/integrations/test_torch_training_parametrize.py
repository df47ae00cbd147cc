"""SemiSparseLinear with ``torch.nn.utils.parametrize`` on its master weight or mask (CPU, kernels in
sparsile's interpreter): a parametrized tensor is computed again on each access, a new tensor at
version 0 that the caching allocator may place at the address of the one before, so the forward's
freshness key (versions and addresses) matched and the layer kept the compressions of an older
weight or mask, a silent wrong result. Here the address reuse is forced: the parametrizations write
their value into one fixed tensor through ``.data`` (no version bump) and return a new view of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
parametrize = torch.nn.utils.parametrize


class InOneTensor(torch.nn.Module):
    """A parametrization whose value, ``value(original)``, is written into one fixed tensor through
    ``.data`` and returned as a new view of it: every access a new tensor object at version 0 at the
    same address, with new contents."""

    def __init__(self, like: torch.Tensor, value: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.out = torch.empty_like(like)
        self.value = value

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        self.out.data.copy_(self.value(original.detach()))
        return self.out.view(self.out.shape)


def _layer() -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=21), "bf16")


def _check(layer: spt.SemiSparseLinear, x: torch.Tensor) -> None:
    """The layer's output against float64 of x @ (weight * mask)ᵀ + bias, as they read now."""
    xk, w = bf16(x), masked_weight(layer)
    within(layer(x), xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 32, torch.float32)


def _counting_refreshes(layer: spt.SemiSparseLinear) -> list[int]:
    calls: list[int] = []
    refresh = layer.refresh

    def counted(**kwargs):
        calls.append(1)
        return refresh(**kwargs)

    layer.refresh = counted
    return calls


def test_a_parametrized_weight_is_compressed_again_on_each_call():
    layer = _layer()
    scale = [1.0]
    parametrize.register_parametrization(layer, "weight", InOneTensor(layer.weight, lambda w: w * scale[0]))
    a, b = layer.weight, layer.weight
    assert a is not b and a.data_ptr() == b.data_ptr() and a._version == b._version == 0  # (the premise)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(22))
    for s in (1.0, -2.0, 0.5):
        scale[0] = s
        _check(layer, x)


def test_under_parametrize_cached_one_compression_per_block():
    layer = _layer()
    scale = [1.0]
    parametrize.register_parametrization(layer, "weight", InOneTensor(layer.weight, lambda w: w * scale[0]))
    calls = _counting_refreshes(layer)
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(23))
    for block, s in enumerate((-3.0, 2.0)):
        scale[0] = s
        with parametrize.cached():
            for _ in range(3):
                _check(layer, x)
        assert len(calls) == block + 1


def test_a_parametrized_mask_is_compressed_and_checked_again_on_each_call():
    layer = _layer()
    gen = torch.Generator().manual_seed(24)
    masks = [layer.mask.clone(), spt.transposable_mask(torch.randn(32, 32, generator=gen))]
    assert not torch.equal(*masks)
    which = [0]
    parametrize.register_parametrization(layer, "mask", InOneTensor(layer.mask, lambda m: masks[which[0]]))
    x = torch.randn(3, 32, generator=gen)
    for i in (0, 1, 0):
        which[0] = i
        _check(layer, x)
    masks.append(torch.ones(32, 32, dtype=torch.bool))  # keeps 4 of 4: checked before it is compressed
    which[0] = 2
    with pytest.raises(IntegrationError) as err:
        layer(x)
    assert err.value.code == "SP0918"


def _parametrized_mask_layer() -> spt.SemiSparseLinear:
    """A layer whose mask is parametrized (identity of the buffer): the mask read is computed anew on
    each access, so nothing written into it reaches the original."""
    layer = _layer()
    parametrize.register_parametrization(layer, "mask", InOneTensor(layer.mask, lambda m: m))
    return layer


@pytest.mark.parametrize("how", ["layer", "model", "trainer"])
def test_a_reprune_of_a_parametrized_mask_is_refused(how):
    """A re-prune wrote the new mask into a computed tensor thrown away after: the layer kept its old
    mask, without a word. It is refused (SP0917) before any layer is re-pruned."""
    first, layer = _layer(), _parametrized_mask_layer()
    gen = torch.Generator().manual_seed(25)
    with torch.no_grad():  # weights whose transposable mask differs from the current ones
        for m in (first, layer):
            m.weight.copy_(torch.randn(32, 32, generator=gen))
    before = [first.mask.clone(), layer.parametrizations.mask.original.clone()]
    model = torch.nn.Sequential(first, layer)
    with pytest.raises(IntegrationError) as err:
        if how == "layer":
            layer.reprune()
        elif how == "model":
            spt.reprune_(model)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            trainer = spt.SparseTrainer(model, opt, reprune_every=1)
            model(torch.randn(2, 32, generator=gen)).sum().backward()
            opt.step()
            trainer.remove()
    assert err.value.code == "SP0917"
    assert "parametriz" in str(err.value) and "original" in str(err.value)
    assert torch.equal(first.mask, before[0])  # (the layer before it not re-pruned)
    assert torch.equal(layer.parametrizations.mask.original, before[1])


def test_a_parametrized_weight_still_reprunes():
    """Only the mask is written by a re-prune: a parametrized weight is read, its value now."""
    layer = _layer()
    gen = torch.Generator().manual_seed(26)
    new = torch.randn(32, 32, generator=gen)
    parametrize.register_parametrization(layer, "weight", InOneTensor(layer.weight, lambda w: new))
    assert layer.reprune() > 0
    assert torch.equal(layer.mask, spt.transposable_mask(new))
    _check(layer, torch.randn(3, 32, generator=gen))
