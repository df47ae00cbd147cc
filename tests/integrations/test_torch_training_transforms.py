"""A SemiSparseLinear called outside plain eager autograd (CPU, interpreter): an x that is a tensor
subclass (a trained soft prompt, an ``nn.Parameter``), ``torch.vmap``, a ``TorchDispatchMode`` that
does not trace (FlopCounterMode) and forward-mode AD (torch.func's grad transforms:
test_torch_training_func.py).

Each is compared to float64 of the masked weight, or refused (SP0916): before, the forward's
re-compression safety net was skipped in the first three (the layer computed with the compressions
of its weight from before an optimizer step, 140 % off), forward mode gave no tangent or a zero one,
and a weight or mask swapped in under vmap (``functional_call``) was ignored for the layer's own."""

from __future__ import annotations

import copy

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _layer(seed: int = 1) -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(32, 64, torch.float32, seed=seed), "bf16")


def _x(seed: int = 2, shape: tuple[int, ...] = (4, 64)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check(y: torch.Tensor, layer: spt.SemiSparseLinear, x: torch.Tensor) -> None:
    """y = x @ (W·M)ᵀ + b of the layer's current master weight, in float64 (bf16 inputs)."""
    xk, w = bf16(x).reshape(-1, 64), masked_weight(layer)
    within(y.detach().reshape(-1, 32), xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 64,
           y.dtype)


def _raises(message: str, fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    assert info.value.code == "SP0916" and message in info.value.message, (info.value.code, info.value.message)
    return info.value


def test_a_parameter_x_is_computed_with_the_stepped_weight():
    """A soft prompt (an nn.Parameter fed to the layer) trained with the layer, no SparseTrainer: the
    forward must re-compress the weight each step stepped (its type is not torch.Tensor, which
    the forward took for a tracer: it kept the first compressions all along)."""
    layer = _layer()
    prompt = torch.nn.Parameter(_x())
    optimizer = torch.optim.SGD([*layer.parameters(), prompt], lr=0.2)
    for _ in range(3):
        optimizer.zero_grad()
        y = layer(prompt)
        _check(y, layer, prompt)
        (y ** 2).mean().backward()
        optimizer.step()
    _check(layer(prompt), layer, prompt)


def test_vmap_and_a_flop_counter_see_a_weight_written_in_place():
    from torch.utils.flop_counter import FlopCounterMode

    layer, x = _layer(), _x(shape=(2, 2, 64))
    with torch.no_grad():
        layer.weight.mul_(-1.5)
    _check(torch.vmap(layer)(x), layer, x)
    with torch.no_grad():
        layer.weight.mul_(-0.5)
    with FlopCounterMode(display=False):
        y = layer(x)
    _check(y, layer, x)


def test_forward_mode_ad_is_sp0916_not_a_dropped_tangent():
    """Before: a dual x of torch.autograd.forward_ad gave y without a tangent (frozen weight) or torch's
    NotImplementedError, torch.func.jvp a zero tangent."""
    import torch.autograd.forward_ad as fwad

    layer, x, t = _layer(), _x(), _x(3)
    for frozen in (True, False):
        layer.weight.requires_grad_(not frozen)
        with fwad.dual_level():
            err = _raises("a trainable sparse layer has no forward-mode derivative", layer, fwad.make_dual(x, t))
    assert "torch.func.jvp" in err.message and "reverse mode" in err.help
    with fwad.dual_level():  # a dual weight
        plain = copy.deepcopy(layer)
        weight = fwad.make_dual(plain.weight.detach(), torch.ones_like(plain.weight))
        _raises("forward-mode derivative", torch.func.functional_call, plain, {"weight": weight}, (x,))
    _raises("forward-mode derivative", torch.func.jvp, layer, (x,), (t,))
    _raises("forward-mode derivative", torch.func.jacfwd(layer), x[:1])
    with fwad.dual_level():  # forward mode on, nothing dual in this call: it runs
        _check(layer(x), layer, x)


def test_vmap_over_weights_without_their_compressions_is_sp0916():
    """An ensemble through torch.func.functional_call: with only the parameters stacked, each member's
    weight was ignored and every member computed with the base layer's compressions (140 % off);
    with the buffers stacked too (each member's own compressions), it is each member's output."""
    layers = [_layer(seed) for seed in (1, 2, 3)]
    x = _x()
    base = copy.deepcopy(layers[0])
    params, buffers = torch.func.stack_module_state(layers)

    def call(p, b, v):
        return torch.func.functional_call(base, (p, b), (v,))

    ys = torch.vmap(call, in_dims=(0, 0, None))(params, buffers, x)
    for y, layer in zip(ys, layers, strict=True):
        _check(y, layer, x)
    err = _raises("its weight is batched by torch.vmap, but its compressions are not",
                  torch.vmap(lambda p, v: torch.func.functional_call(base, p, (v,)), in_dims=(0, None)), params, x)
    assert "stack_module_state" in err.help
    masks = {"mask": buffers["mask"]}
    _raises("its mask is batched by torch.vmap", torch.vmap(
        lambda b, v: torch.func.functional_call(base, b, (v,)), in_dims=(0, None)), masks, x)


@pytest.mark.parametrize("fused", [False, True])
def test_a_state_dict_after_a_step_holds_the_stepped_weight_s_compressions(fused):
    """A step without a SparseTrainer leaves the compressions stale until the next eager call; a
    state dict taken then (a checkpoint after optimizer.step()) held the compressions of the weight
    from before the step next to the stepped master weight: an inference SparseLinear loaded from its
    values and meta computed with the old weight."""
    layer, x = _layer(), _x()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.05, fused=fused)
    (layer(x) ** 2).mean().backward()
    optimizer.step()
    state = layer.state_dict()
    frozen = spt.SparseLinear(64, 32, dtype="bf16")
    frozen.load_state_dict({k: state[k] for k in ("values", "meta", "bias")})
    with torch.no_grad():
        _check(frozen(x), layer, x)
    fresh = copy.deepcopy(layer)
    fresh.refresh()
    for name in ("values", "meta", "values_t", "meta_t"):
        assert torch.equal(state[name].view(torch.int16) if name.startswith("values") else state[name],
                           getattr(fresh, name).view(torch.int16) if name.startswith("values")
                           else getattr(fresh, name)), name
