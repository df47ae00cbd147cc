"""A SparseLinear whose bias, metadata or scale_w sits on another device than its values (put in
without ``setattr`` or ``.to()``): SP0901 with the same message and help whether the call is eager,
traced (make_fx, torch.export, torch.compile) or under torch.func (vmap, grad). Before, every traced
path reached the op's own check first and reported SP0906 ("x is on cpu but bias is on meta"), where
the eager call reports SP0901 (layer_args.check_devices). The meta device stands for a second one."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _make_fx(layer, x):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(layer)(x)


def _compile(layer, x):
    torch._dynamo.reset()
    return torch.compile(layer, backend="eager")(x)


CALLS = {
    "eager": lambda layer, x: layer(x),
    "make_fx": _make_fx,
    "export": lambda layer, x: torch.export.export(layer, (x,)),
    "compile": _compile,
    "vmap": lambda layer, x: torch.func.vmap(layer)(x[None]),
    "grad": lambda layer, x: torch.func.grad(lambda t: layer(t).float().sum())(x),
}


@pytest.mark.parametrize("how", list(CALLS))
@pytest.mark.parametrize(("dtype", "name"), [("bf16", "bias"), ("bf16", "meta"), ("e4m3", "scale_w"),
                                             ("e4m3", "bias")])
def test_a_buffer_on_another_device_is_sp0901_eager_and_traced(dtype, name, how):
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=1), dtype)
    layer._buffers[name] = getattr(layer, name).to("meta")
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    with pytest.raises(IntegrationError) as info:
        CALLS[how](layer, x)
    assert (info.value.code, info.value.message) == ("SP0901", f"{name} is on meta but the layer's values are on cpu")
    assert info.value.help == (f"move the module (.to(device)) or assign {name} on the values' device: "
                               f"layer.{name} = {name}.to(layer.values.device)")


@pytest.mark.parametrize("how", ["make_fx", "export", "vmap"])
def test_a_static_scale_on_another_device_is_sp0901_traced(how):
    """The static input_scale's device check of the eager call (SparseLinear._wrong_scale_device), traced."""
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=3), "e4m3")
    layer.input_scale = torch.tensor([0.05])
    layer._buffers["input_scale"] = torch.tensor([0.05], device="meta")
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for call in (CALLS["eager"], CALLS[how]):
        with pytest.raises(IntegrationError) as info:
            call(layer, x)
        assert (info.value.code, info.value.message) == ("SP0901", "input_scale is on meta but the layer's weight "
                                                                   "is on cpu")


def test_the_layer_put_back_on_one_device_computes_traced():
    """The check refuses only the mismatch: the buffer moved back, make_fx's graph computes the eager y."""
    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=5), "bf16")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    bias = layer.bias
    layer._buffers["bias"] = bias.to("meta")
    with pytest.raises(IntegrationError):
        _make_fx(layer, x)
    layer._buffers["bias"] = bias
    assert torch.equal(_make_fx(layer, x)(x), layer(x))
