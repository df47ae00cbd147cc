"""A frozen sparse layer's weight written in place between the forward and the backward
(integrations/torch/autograd.py): the eager layer's backward refuses it with torch's own error, as
``nn.Linear``'s and the custom op's do (before, x's gradient was computed with the new weight,
without a word). A write before the forward, or after the backward, is an ordinary update."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

MODIFIED = "modified by an inplace operation"


def _write(layer, what: str) -> None:
    """An in-place write to ``layer.<what>`` that keeps the weight a valid 2:4 weight."""
    t = getattr(layer, what)
    with torch.no_grad():
        if what == "meta":
            t.copy_(t.flip(0))  # (valid words of other rows)
        elif t.dtype == torch.float8_e4m3fn:
            t.copy_((t.float() * 0.5).to(t.dtype))
        else:
            t.mul_(2)


@pytest.mark.parametrize(("weight", "activation", "what"), [
    ("bf16", None, "values"), ("bf16", "silu", "values"), ("bf16", None, "meta"),
    ("e4m3", None, "scale_w"), ("e4m3", "relu", "values")])
def test_a_weight_written_between_forward_and_backward_is_refused(weight, activation, what):
    """nn.Linear's backward raises torch's RuntimeError when its weight was written in place after the
    forward (its version counter); so does the layer's, rather than give x the new weight's gradient."""
    dense = linear(48, 64, seed=1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).requires_grad_()
    y = dense(x)
    with torch.no_grad():
        dense.weight.mul_(2)
    with pytest.raises(RuntimeError, match=MODIFIED):  # (torch's convention)
        y.sum().backward()
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=1), weight, activation=activation)
    x.grad = None
    y = layer(x)
    _write(layer, what)
    with pytest.raises(RuntimeError, match=MODIFIED) as caught:
        y.sum().backward()
    assert f"SparseLinear's {what}" in str(caught.value) and x.grad is None
    y = layer(x)  # the next call computes with the weight as it is now: its gradient is that weight's
    y.sum().backward()
    want = layer.to_dense().double().sum(0) if activation is None else None
    if want is not None:
        got = x.grad.double()
        assert torch.allclose(got, want.expand_as(got), rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())


def test_a_fused_member_s_weight_written_between_forward_and_backward_is_refused():
    """A member of a fuse_projections_ group runs the group's fused layer, whose weight the member's
    tensors are views of: a write to a member after the forward is refused by the fused layer's backward."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (linear(64, 64, seed=s) for s in (3, 4, 5))

        def forward(self, x):
            return self.q_proj(x) + self.k_proj(x) + self.v_proj(x)

    model = torch.nn.Sequential(Attention())
    report = spt.sparsify_(model, interpret=True, min_features=0, fuse=True)
    assert report.fusion is not None and len(report.swapped) == 3
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).requires_grad_()
    y = model(x)
    _write(model[0].k_proj, "values")
    with pytest.raises(RuntimeError, match=MODIFIED) as caught:
        y.sum().backward()
    # (the members' values are views of the fused layer's: one version counter, the group named)
    assert ("the values of the SparseLinear that fuse_projections_ made of 0.q_proj, 0.k_proj, 0.v_proj (their "
            "values are views of it, so a write to any of them counts) [torch.bfloat16 [192, 32]]") in str(caught.value)


def test_a_sibling_s_refusal_names_the_group_whose_members_share_the_version_counter():
    """Members of a released group (they run unfused, their buffers still views of the fused copy) share one
    version counter: a write to q_proj moves k_proj's, and k_proj's backward refuses it. The message said
    "the SparseLinear's values", the sibling's alone; it names the member and the siblings that may
    have been written (which one was cannot be told from the counter)."""
    from sparsile.integrations.torch.projection_group import fused_group_of

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (linear(64, 64, seed=s) for s in (7, 8, 9))

    model = torch.nn.Sequential(Attention())
    spt.sparsify_(model, interpret=True, min_features=0, fuse=True)
    attention = model[0]
    fused_group_of(attention.k_proj).release()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16).requires_grad_()
    y = attention.k_proj(x)
    _write(attention.q_proj, "values")
    with pytest.raises(RuntimeError, match=MODIFIED) as caught:
        y.sum().backward()
    assert ("the 0.k_proj's values, a view of the weight fuse_projections_ fused of 0.q_proj, 0.k_proj, 0.v_proj, "
            "which share one version counter (written in place there or in a sibling's: 0.q_proj, 0.v_proj) "
            "[torch.bfloat16 [64, 32]] is at version 1; expected version 0") in str(caught.value)


@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_without_an_activation_x_and_the_bias_are_not_kept_for_the_backward(weight):
    """dx = dy @ W (times scale_w) and d bias = Σ dy need neither x's nor the bias's values: as for
    nn.Linear with a frozen weight, x and the bias may be written in place after the call, and x is not
    kept alive until the backward (before, both were saved: torch's "modified by an inplace operation"
    where nn.Linear computes the gradient, and every layer's input held until the backward)."""
    import weakref

    gen = torch.Generator().manual_seed(7)
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=8), weight)
    layer.bias = torch.nn.Parameter(layer.bias.detach().clone())
    twin = torch.nn.Linear(64, 48).double().requires_grad_(False)
    with torch.no_grad():
        twin.weight.copy_(layer.to_dense())
    a = torch.randn(3, 64, generator=gen).to(torch.bfloat16).requires_grad_()
    g = torch.randn(3, 48, generator=gen).to(torch.bfloat16)
    for model in (twin, layer):  # (the same for nn.Linear: the reference of the behaviour)
        a.grad = None
        h = a * 2 if model is layer else (a * 2).double()
        y = model(h)
        kept = weakref.ref(h)
        h.add_(1)  # x written in place after the call
        with torch.no_grad():
            model.bias.add_(1)  # and the bias
        del h
        assert kept() is None  # x not held for the backward
        y.backward(g.to(y.dtype))
        want = 2 * g.double() @ layer.to_dense().double()
        assert torch.allclose(a.grad.double(), want, rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())
    assert torch.equal(layer.bias.grad, g.float().sum(0))


def test_with_an_activation_x_written_after_the_call_is_refused():
    """With a fused activation the backward computes the pre-activations again from x: x written in
    place after the call is torch's RuntimeError (never the gradient at the new x)."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=8), "bf16", activation="silu")
    a = torch.randn(3, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).requires_grad_()
    h = a * 2
    y = layer(h)
    h.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()


def _op_call(layer, h, bias, static=None):
    """The custom op of ``layer``'s weight on h: sparse_linear (bf16), sparse_linear_e4m3 (e4m3; ``static``:
    a static per-tensor scale_x)."""
    if layer.weight_dtype == "e4m3":
        return torch.ops.sparsile.sparse_linear_e4m3(h, layer.values, layer.meta, bias, layer.scale_w, static,
                                                     activation=layer.activation)
    return torch.ops.sparsile.sparse_linear(h, layer.values, layer.meta, bias, activation=layer.activation)


@pytest.mark.parametrize(("weight", "static"), [("bf16", False), ("e4m3", False), ("e4m3", True)])
def test_the_op_without_an_activation_keeps_neither_x_nor_the_bias(weight, static):
    """As the layer (above): the op called directly saves only x's and the bias's shapes and dtypes
    without an activation (and not a static scale_x, which dx does not depend on either); x and the bias
    written in place after the call are no error, x is not held until the backward (before, both were
    saved: torch's "modified by an inplace operation", and x kept alive)."""
    import weakref

    gen = torch.Generator().manual_seed(17)
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=18), weight)
    bias = layer.bias.detach().clone().requires_grad_()
    scale = torch.full((1,), 0.05) if static else None
    a = torch.randn(3, 64, generator=gen).to(torch.bfloat16).requires_grad_()
    g = torch.randn(3, 48, generator=gen).to(torch.bfloat16)
    h = a * 2
    y = _op_call(layer, h, bias, scale)
    kept = weakref.ref(h)
    h.add_(1)
    with torch.no_grad():
        bias.add_(1)
        if scale is not None:
            scale.mul_(2)
    del h
    assert kept() is None
    y.backward(g)
    want = 2 * g.double() @ layer.to_dense().double()
    assert a.grad.dtype == torch.bfloat16
    assert torch.allclose(a.grad.double(), want, rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())
    assert torch.equal(bias.grad, g.float().sum(0))


@pytest.mark.parametrize(("weight", "what"), [("bf16", "values"), ("bf16", "meta"), ("e4m3", "values"),
                                              ("e4m3", "scale_w")])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_the_op_s_weight_written_between_forward_and_backward_is_refused(weight, what, activation):
    """The weight's tensors stay saved by the op (x not): a write between its forward and its backward is
    torch's RuntimeError, with an activation or without."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=19), weight, activation=activation)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(20)).to(torch.bfloat16).requires_grad_()
    y = _op_call(layer, x, layer.bias)
    _write(layer, what)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()
    assert x.grad is None


@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_the_op_with_an_activation_refuses_x_written_after_the_call(weight):
    """With an activation the op's backward computes the pre-activations again from x: x written in place
    after the call stays torch's RuntimeError."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=21), weight, activation="silu")
    a = torch.randn(3, 64, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16).requires_grad_()
    h = a * 2
    y = _op_call(layer, h, layer.bias)
    h.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()
