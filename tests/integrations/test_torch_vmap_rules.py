"""torch.func.vmap of the custom ops (integrations/torch/vmap_rules.py): a batch of x is more tokens,
one call, equal to the members' calls one by one and to float64; a batched weight runs per member;
no batching-fallback warning (torch's, per call)."""

from __future__ import annotations

import warnings

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _x(*shape: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=gen) + 0.25).mul(torch.randint(0, 2, shape, generator=gen) * 2 - 1).to(
        torch.bfloat16)  # never zero


@pytest.fixture
def launches(monkeypatch):
    """The list of the token counts the op's CPU kernel ran with (ops.run_interpreted), call by call."""
    from sparsile.integrations.torch import ops

    seen: list[int] = []
    real = ops.run_interpreted

    def counted(x2, *args, **kwargs):
        seen.append(x2.shape[0])
        return real(x2, *args, **kwargs)

    monkeypatch.setattr(ops, "run_interpreted", counted)
    return seen


def _vmapped(f, *args, **kwargs):
    """torch.func.vmap(f, **kwargs)(*args) with every warning an error (torch's batching fallback warns,
    once per process)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return torch.func.vmap(f, **kwargs)(*args)


@pytest.mark.parametrize("in_dims", [0, 1, -2])
def test_a_batch_of_x_is_one_call(in_dims, launches):
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=1), "bf16", activation="silu")
    op = torch.ops.sparsile.sparse_linear
    x = _x(3, 4, 32, seed=2)

    def f(t):
        return op(t, layer.values, layer.meta, layer.bias, activation="silu")

    y = _vmapped(f, x, in_dims=in_dims)
    assert launches == [12]  # (3 x 4 tokens: one call, not one per member)
    members = x.movedim(in_dims, 0)
    assert torch.equal(y, torch.stack([f(m) for m in members]))
    for m, ym in zip(members, y):
        check_against_float64(layer, m, ym)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_e4m3_quantizer_and_scales(per_tensor, launches):
    """The quantizer's rule (per token: every member's token) and scale_x batched per token, or one
    per-tensor scale per member (expanded to its tokens)."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=3), "e4m3")
    op = torch.ops.sparsile.sparse_linear
    x = _x(3, 5, 32, seed=4)
    member_scales = torch.rand(3) + 0.5

    def f(t, s):
        q, sx = torch.ops.sparsile.quantize_per_token_e4m3(t)
        return op(q, layer.values, layer.meta, layer.bias, s if per_tensor else sx, layer.scale_w,
                  out_dtype=torch.bfloat16)

    y = _vmapped(f, x, member_scales)
    assert launches == [15]
    assert torch.equal(y, torch.stack([f(x[i], member_scales[i]) for i in range(3)]))
    q, sx = _vmapped(torch.ops.sparsile.quantize_per_token_e4m3, x, in_dims=1)
    ref_q, ref_sx = torch.ops.sparsile.quantize_per_token_e4m3(x.movedim(1, 0).contiguous())
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(sx, ref_sx)


def test_a_batched_bias_runs_per_member(launches):
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=5), "bf16")
    op = torch.ops.sparsile.sparse_linear
    x = _x(3, 2, 32, seed=6)
    biases = torch.randn(3, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    y = _vmapped(lambda t, b: op(t, layer.values, layer.meta, b), x, biases)
    assert launches == [2, 2, 2]
    assert torch.equal(y, torch.stack([op(x[i], layer.values, layer.meta, biases[i]) for i in range(3)]))


def test_per_sample_gradients_through_a_layer_without_the_fallback(launches):
    """vmap(grad) through the layer (autograd.TransformedLayerWithInputGrad vmaps the op): no warning,
    each member's gradient that of its own call."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=8), "bf16", activation="relu")
    x = _x(3, 2, 32, seed=9)
    g = torch.randn(3, 2, 16, generator=torch.Generator().manual_seed(10))

    def loss(t, w):
        return layer(t).float().mul(w).sum()

    per_sample = _vmapped(torch.func.grad(loss), x, g)
    assert launches == [6, 6]  # the forward, the backward's pre-activations: each for every member at once
    for i in range(3):
        assert torch.equal(per_sample[i], torch.func.grad(loss)(x[i], g[i]))


@pytest.mark.parametrize("batched_bias", [False, True])
def test_the_e4m3_op_s_batch_of_x_is_one_call(batched_bias, launches):
    """sparse_linear_e4m3 (the quantizer and sparse_linear on a 16-bit x): a batch of x is more tokens,
    one call, bit for bit the members' calls (the quantizer is per token); a batched bias runs per
    member. Before, torch's batching fallback ran it per member with its performance warning."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=11), "e4m3", activation="relu")
    op = torch.ops.sparsile.sparse_linear_e4m3
    x = _x(3, 5, 32, seed=12)
    biases = torch.randn(3, 16, generator=torch.Generator().manual_seed(13)) if batched_bias else None

    def f(t, b=layer.bias):
        return op(t, layer.values, layer.meta, b, layer.scale_w, activation="relu")

    y = _vmapped(f, x, biases) if batched_bias else _vmapped(f, x)
    assert launches == ([5, 5, 5] if batched_bias else [15])
    assert torch.equal(y, torch.stack([f(x[i], *([biases[i]] if batched_bias else [])) for i in range(3)]))


@pytest.mark.parametrize("e4m3", [False, True])
def test_per_sample_gradients_through_the_op_called_directly(e4m3, launches):
    """vmap(grad) of the op called directly (its Autograd kernel, autograd.OpWithInputGrad, under the
    grad transform; the vmap rule below it): no warning, one call for every member (the forward,
    the backward's pre-activations), each member's gradient that of its own call."""
    layer = spt.SparseLinear.from_dense(linear(16, 32, seed=14), "e4m3" if e4m3 else "bf16", activation="silu")
    x = _x(3, 2, 32, seed=15)
    g = torch.randn(3, 2, 16, generator=torch.Generator().manual_seed(16))

    def loss(t, w):
        if e4m3:
            y = torch.ops.sparsile.sparse_linear_e4m3(t, layer.values, layer.meta, layer.bias, layer.scale_w,
                                                      activation="silu")
        else:
            y = torch.ops.sparsile.sparse_linear(t, layer.values, layer.meta, layer.bias, activation="silu")
        return y.float().mul(w).sum()

    per_sample = _vmapped(torch.func.grad(loss), x, g)
    assert launches == [6, 6]
    for i in range(3):
        assert torch.equal(per_sample[i], torch.func.grad(loss)(x[i], g[i]))
