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
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()
