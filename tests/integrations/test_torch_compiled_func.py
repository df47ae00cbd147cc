"""torch.compile of torch.func's gradients in x (``grad``, ``vmap(grad)``: per-sample gradients) through the
sparse layers, fullgraph, against float64 of the dense computation and the eager transforms' bits (CPU,
interpreter).

Before: through a trainable ``SemiSparseLinear`` dynamo stopped at the layer's transform checks
(``is_functorch_wrapped_tensor``, a graph break: with fullgraph dynamo's error, without it an
AssertionError in the backward), and with an AOT backend the x-gradient of a layer whose weight requires
grad stopped at SP0916 at compile time: AOTAutograd traces the gradient's own backward (in the weight)
ahead, the second derivative the layer refuses. A frozen e4m3 ``SparseLinear`` quantized x apart under the
compiled transform, and x's gradient was SP0922 (fp8)."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

N, K, T = 32, 64, 5


def _reset() -> None:
    """``torch._dynamo.reset()`` (again where torch's raised "dictionary changed size during iteration")."""
    try:
        torch._dynamo.reset()
    except RuntimeError:
        torch._dynamo.reset()


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _layer(kind: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The layer and the float64 weight x's gradient multiplies by (masked; e4m3: times scale_w)."""
    if kind == "semi":
        layer = spt.SemiSparseLinear.from_dense(linear(N, K, torch.float32, seed=1), "bf16")
        return layer, bf16(layer.weight) * layer.mask.double()
    layer = spt.SparseLinear.from_dense(linear(N, K, torch.float32, seed=1), kind)
    return layer, layer.to_dense().double()


def _transform(layer: torch.nn.Module, how: str, g: torch.Tensor):
    if how == "grad":
        return torch.func.grad(lambda v: (layer(v).float() * g).sum())
    per_sample = torch.func.grad(lambda v, gg: (layer(v[None]).float() * gg).sum())
    return lambda v: torch.func.vmap(per_sample)(v, g)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("how", ["grad", "vmap_grad"])
@pytest.mark.parametrize("kind", ["semi", "bf16", "e4m3"])
def test_compiled_x_gradients_are_the_dense_ones(kind, how, backend):
    layer, w = _layer(kind)
    x, g = _rand(T, K, seed=2).to(torch.bfloat16), _rand(T, N, seed=3)
    fn = _transform(layer, how, g)
    want = fn(x)
    _reset()
    got = torch.compile(fn, backend=backend, fullgraph=True)(x)
    gk = bf16(g)  # (y is bf16: its gradient is g rounded)
    within(got, gk @ w, gk.abs() @ w.abs(), N, torch.bfloat16)
    assert torch.equal(got, want)
    if kind == "semi":
        assert layer.weight.requires_grad  # (the case AOTAutograd differentiated again)


def test_a_compiled_gradient_differentiated_again_refuses_when_it_runs():
    """The refusal of the second derivative is in the compiled backward graph: the compile succeeds, the
    gradient is the eager one, and only a backward through it raises SP0916, as eagerly."""
    layer, _ = _layer("semi")
    x, g = _rand(T, K, seed=4).to(torch.bfloat16), _rand(T, N, seed=5)
    fn = _transform(layer, "grad", g)
    _reset()
    dx = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
    for got in (dx, fn(x)):
        with pytest.raises(IntegrationError) as info:
            got.float().sum().backward()
        assert info.value.code == "SP0916"
        assert info.value.message.startswith("a trainable sparse layer has no second derivative through x's gradient")
    assert layer.weight.grad is None


def test_the_refusal_op_raises_its_diagnostic():
    with pytest.raises(IntegrationError) as info:
        torch.ops.sparsile.refused_gradient(torch.ones(2), "SP0916", "no second derivative", "freeze the weight")
    assert (info.value.code, info.value.message, info.value.help) == ("SP0916", "no second derivative",
                                                                      "freeze the weight")
    like = torch.ones(3, 2)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.sparsile.refused_gradient(mode.from_tensor(like), "SP0916", "m", "")
    assert fake.shape == like.shape and fake.dtype == like.dtype


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_compiled_ensemble_without_its_compressions_is_refused(fullgraph):
    """vmap over stacked weights whose compressions are not stacked: SP0916, compiled too. dynamo cannot trace the
    layer's check of the transforms' wrappers (it is skipped there): the op's vmap rule refuses it instead (else
    every member computed with the base layer's compressions, without a word). With the buffers stacked as well,
    each member's output, the eager bits."""
    import copy

    layers = [_layer("semi")[0] for _ in range(3)]
    for i, layer in enumerate(layers[1:], start=1):
        with torch.no_grad():
            layer.weight.mul_(1 + i)
        spt.recompress_(layer)
    base = copy.deepcopy(layers[0])
    params, buffers = torch.func.stack_module_state(layers)
    x = _rand(4, K, seed=6).to(torch.bfloat16)
    weights_only = torch.vmap(lambda p, v: torch.func.functional_call(base, p, (v,)), in_dims=(0, None))
    _reset()
    with pytest.raises(Exception) as info:
        torch.compile(weights_only, backend="eager", fullgraph=fullgraph)(params, x)
    assert "error[SP0916]: a SemiSparseLinear cannot compute this call: its weight is batched by torch.vmap, " \
           "but its compressions are not" in str(info.value)
    whole = torch.vmap(lambda p, b, v: torch.func.functional_call(base, (p, b), (v,)), in_dims=(0, 0, None))
    _reset()
    got = torch.compile(whole, backend="eager", fullgraph=fullgraph)(params, buffers, x)
    for y, layer in zip(got, layers, strict=True):
        assert torch.equal(y, layer(x))
