"""A SparseLinear whose meta, bias or scale_w is on another device than its values (put into
``layer._buffers`` by hand, given other memory through ``.data``, or loaded in part with
``load_state_dict(assign=True)``) is SP0901 when the layer binds its tensors, naming the tensor and
both devices (it was SP0804 "cannot read bias ... on the host" on the CPU, and unknown on a GPU). The
tensor put back on the values' device, the layer computes again. On the CPU: the meta device serves
as "another device"."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _x(k: int = 32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(5, k, generator=gen).to(torch.bfloat16)


def _error(fn, *args) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args)
    return info.value


def _help(name: str) -> str:
    return (f"move the module (.to(device)) or assign {name} on the values' device: "
            f"layer.{name} = {name}.to(layer.values.device)")


def _elsewhere(t: torch.Tensor, device: str = "meta") -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device=device)


def _poisoned(layer, x):
    """layer(x) written into a NaN-filled output (the check reads every element)."""
    y = torch.full((x.shape[0], layer.out_features), float("nan"), dtype=x.dtype)
    y.copy_(layer(x))
    return y


@pytest.mark.parametrize("dtype,name", [("bf16", "meta"), ("bf16", "bias"), ("e4m3", "scale_w"),
                                        ("e4m3", "bias")])
@pytest.mark.parametrize("called", [False, True])
def test_a_buffer_on_another_device_is_sp0901(dtype, name, called):
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=3), dtype)
    x = _x()
    if called:  # bound before: the replaced buffer is found by the next call's identity check
        layer(x)
    kept = layer._buffers[name]
    layer._buffers[name] = _elsewhere(kept)
    for _ in range(2):  # (not bound: the next call is refused again)
        err = _error(layer, x)
        assert (err.code, err.message) == ("SP0901", f"{name} is on meta but the layer's values are on cpu")
        assert err.help == _help(name)
    layer._buffers[name] = kept
    check_against_float64(layer, x, _poisoned(layer, x))


def test_a_meta_layer_with_a_host_bias_is_sp0901():
    """The other way round: a layer moved to the meta device given a CPU bias (meta x: y's shape)."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=1)).to("meta")
    x = _x().to("meta")
    assert layer(x).shape == (5, 16)
    layer._buffers["bias"] = torch.ones(16)
    err = _error(layer, x)
    assert (err.code, err.message) == ("SP0901", "bias is on cpu but the layer's values are on meta")
    assert err.help == _help("bias")


def test_a_partial_assign_load_is_sp0901():
    """``load_state_dict(assign=True, strict=False)`` of a state dict with only the bias, on another
    device: the layer holds a bias there and its values here."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=2))
    x = _x()
    layer(x)
    layer.load_state_dict({"bias": torch.ones(16, device="meta")}, strict=False, assign=True)
    assert layer.bias.device.type == "meta"
    err = _error(layer, x)
    assert (err.code, err.message) == ("SP0901", "bias is on meta but the layer's values are on cpu")


def test_a_fused_member_given_a_bias_elsewhere_is_sp0901():
    """A fused group's member whose bias is replaced runs unfused (the group released), and binds its
    own tensors: SP0901 there, not a fused run with the old bias."""
    model = torch.nn.Module()
    model.attn = torch.nn.Module()
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        setattr(model.attn, name, spt.SparseLinear.from_dense(linear(16, 32, seed=10 + i)))
    report = spt.fuse_projections_(model)
    assert report.fused, str(report)
    x = _x()
    model.attn.q_proj(x)
    member = model.attn.k_proj
    kept = member._buffers["bias"]
    member._buffers["bias"] = _elsewhere(kept)
    err = _error(member, x)
    assert (err.code, err.message) == ("SP0901", "bias is on meta but the layer's values are on cpu")
    member._buffers["bias"] = kept.clone()
    check_against_float64(member, x, _poisoned(member, x))


@pytest.mark.parametrize("name", ["bias", "weight", "mask", "meta", "values_t", "meta_t"])
def test_a_trainable_layer_s_tensor_on_another_device_is_sp0901(name):
    """SemiSparseLinear takes its tensors into the op on every call (no binding): one on another
    device than its values is SP0901 there (a meta bias or compression computed NaNs without a word;
    a meta weight or mask raised torch's errors from inside the refresh)."""
    layer = spt.SemiSparseLinear.from_dense(linear(16, 32, dtype=torch.float32, seed=4), "bf16")
    x = _x()
    y0 = layer(x).detach()
    where = layer._parameters if name in layer._parameters else layer._buffers
    kept = where[name]
    moved = _elsewhere(kept)
    where[name] = torch.nn.Parameter(moved, requires_grad=kept.requires_grad) if name in layer._parameters else moved
    err = _error(layer, x)
    assert (err.code, err.message) == ("SP0901", f"{name} is on meta but the layer's values are on cpu")
    assert err.help == _help(name)
    where[name] = kept
    y = torch.full_like(y0, float("nan"))
    y.copy_(layer(x).detach())
    assert torch.equal(y, y0)
