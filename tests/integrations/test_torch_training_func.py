"""torch.func's reverse-mode transforms (grad, vjp, jacrev, vmap of grad) through a trainable
SemiSparseLinear, on the CPU through the interpreter (docs/training.md, "Transforms and tracers").

Before, they stopped at SP0916: the op's autograd formula, registered by
``torch.library.register_autograd``, is an ``autograd.Function`` without ``setup_context``, which
torch.func refuses. Each gradient is compared with ``backward()``'s bits (the same formula and
kernels) and with float64 of the masked dense computation: dx = dy @ (W·M), dW = (dyᵀ @ x)·M
(unmasked with ``mask_grad=False``), db = Σ dy."""

from __future__ import annotations

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

N, K = 32, 64


def _layer(seed: int = 1, mask_grad: bool = True) -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(N, K, torch.float32, seed=seed), "bf16", mask_grad=mask_grad)


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _params(layer: spt.SemiSparseLinear, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {name: p.detach() * scale for name, p in layer.named_parameters()}


def _call(layer: spt.SemiSparseLinear):
    def call(p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, p, (v,))
    return call


def _eager_grads(layer: spt.SemiSparseLinear, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """dx, d weight, d bias of sum(layer(x) * g) by backward()."""
    layer.zero_grad()
    xr = x.clone().requires_grad_(True)
    (layer(xr) * g).sum().backward()
    return {"x": xr.grad, "weight": layer.weight.grad.clone(), "bias": layer.bias.grad.clone()}


def _check_grads(grads: dict[str, torch.Tensor], weight: torch.Tensor, layer: spt.SemiSparseLinear,
                 x: torch.Tensor, g: torch.Tensor) -> None:
    """Against float64 of the masked dense computation with master weight ``weight``."""
    mask = layer.mask.double()
    wm, gk, xk = bf16(weight) * mask, bf16(g), bf16(x)
    within(grads["x"], gk @ wm, gk.abs() @ wm.abs(), N, torch.bfloat16)
    dw = gk.T @ xk
    if layer.mask_grad:
        dw = dw * mask
    within(grads["weight"], dw, gk.abs().T @ xk.abs(), x.shape[0], torch.bfloat16)
    within(grads["bias"], g.double().sum(0), g.double().abs().sum(0), x.shape[0], torch.float32)


@pytest.mark.parametrize("mask_grad", [True, False])
def test_grad_and_vjp_are_backward_s_bits_and_the_masked_dense_gradient(mask_grad):
    layer, x, g = _layer(mask_grad=mask_grad), _rand(5, K, seed=2), _rand(5, N, seed=3)
    eager = _eager_grads(layer, x, g)
    _check_grads(eager, layer.weight.detach(), layer, x, g)
    params = _params(layer)
    dx = torch.func.grad(lambda v: (layer(v) * g).sum())(x)
    dp = torch.func.grad(lambda p: (_call(layer)(p, x) * g).sum())(params)
    dp2, dx2 = torch.func.grad(lambda p, v: (_call(layer)(p, v) * g).sum(), argnums=(0, 1))(params, x)
    y, vjp = torch.func.vjp(_call(layer), params, x)
    dp3, dx3 = vjp(g)
    for got in ({"x": dx, **dp}, {"x": dx2, **dp2}, {"x": dx3, **dp3}):
        for name in ("x", "weight", "bias"):
            assert torch.equal(got[name], eager[name]), name
    assert torch.equal(y, layer(x))


def test_jacrev_of_x_weight_and_bias():
    """The Jacobians: dy[t, n] / dx[t', k] = δ(t, t') (W·M)[n, k], dy[t, n] / dW[n', k] =
    δ(n, n') x[t, k] M[n, k], dy[t, n] / db[n'] = δ(n, n'); one product each, exact in bf16."""
    layer, x = _layer(), _rand(2, K, seed=4)
    eye_t, eye_n = torch.eye(2, dtype=torch.float64), torch.eye(N, dtype=torch.float64)
    wm, xk, mask = masked_weight(layer), bf16(x), layer.mask.double()
    jx = torch.func.jacrev(layer)(x)
    assert torch.equal(jx.double(), torch.einsum("ts,nk->tnsk", eye_t, wm))
    jp = torch.func.jacrev(lambda p: _call(layer)(p, x))(_params(layer))
    assert torch.equal(jp["weight"].double(), torch.einsum("nm,tk,mk->tnmk", eye_n, xk, mask))
    assert torch.equal(jp["bias"].double(), eye_n.expand(2, N, N))
    # each row is the backward() of its one-hot dy, bit for bit
    for t, n in ((0, 3), (1, 17)):
        g = torch.zeros(2, N)
        g[t, n] = 1.0
        eager = _eager_grads(layer, x, g)
        assert torch.equal(jx[t, n], eager["x"]) and torch.equal(jp["weight"][t, n], eager["weight"])


def test_per_sample_gradients_by_vmap_of_grad():
    layer, x, g = _layer(), _rand(3, K, seed=5), _rand(3, N, seed=6)
    params = _params(layer)

    def loss(p: dict[str, torch.Tensor], v: torch.Tensor, gv: torch.Tensor) -> torch.Tensor:
        return (_call(layer)(p, v[None]) * gv).sum()

    per = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)), in_dims=(None, 0, 0))(params, x, g)
    for i in range(3):
        one = _eager_grads(layer, x[i:i + 1], g[i:i + 1])
        got = {"x": per[1][i:i + 1], "weight": per[0]["weight"][i], "bias": per[0]["bias"][i]}
        _check_grads(got, layer.weight.detach(), layer, x[i:i + 1], g[i:i + 1])
        assert torch.equal(got["x"], one["x"]) and torch.equal(got["bias"], one["bias"])


def test_a_weight_passed_under_grad_is_the_one_computed_with():
    """functional_call under torch.func.grad wraps the weight passed in (a GradTrackingTensor), which
    the forward took for a tracer: it kept the compressions of the layer's own weight (58 off at a
    largest |y| of 37). A functional SGD loop, each step's y and gradients those of its weight."""
    layer, x, g = _layer(), _rand(4, K, seed=7), _rand(4, N, seed=8)
    own = layer.weight.detach().clone()
    params = _params(layer, -1.5)

    def loss(p: dict[str, torch.Tensor], v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = _call(layer)(p, v)
        return (y * g).sum(), y

    for _ in range(3):
        (dp, dx), y = torch.func.grad(loss, argnums=(0, 1), has_aux=True)(params, x)
        xk, wm = bf16(x), bf16(params["weight"]) * layer.mask
        within(y, xk @ wm.T + params["bias"].double(), xk.abs() @ wm.abs().T, K, torch.float32)
        _check_grads({"x": dx, **dp}, params["weight"], layer, x, g)
        params = {name: torch.add(p, dp[name], alpha=-0.1) for name, p in params.items()}
    assert torch.equal(layer.weight, own)
    with torch.no_grad():  # the layer's own weight again, compressed anew
        y = layer(x)
    xk, wm = bf16(x), masked_weight(layer)
    within(y, xk @ wm.T + layer.bias.double(), xk.abs() @ wm.abs().T, K, torch.float32)


def test_second_derivatives_through_x_s_gradient_in_the_weight_are_sp0916():
    """A jacrev (in the weight) of a grad (in x): dx is computed from the compressed Wᵀ, so its
    dependence on the master weight is missing; it gave a zero Hessian block. Refused, as
    backward(create_graph=True) refuses it; in x alone (the weight not tracked) it is exact: 0."""
    layer, x, g = _layer(), _rand(2, K, seed=9), _rand(2, N, seed=10)

    def dx_of(p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        return torch.func.grad(lambda vv: (_call(layer)(p, vv) * g).sum())(v)

    with pytest.raises(IntegrationError) as info:
        torch.func.jacrev(lambda p: dx_of(p, x).sum())(_params(layer))
    assert info.value.code == "SP0916"
    assert "no second derivative through x's gradient" in info.value.message
    assert "layer.to_dense()" in info.value.help
    with pytest.raises(IntegrationError) as info:  # grad of grad, both in the parameters and x at one level
        torch.func.grad(lambda p: torch.func.grad(lambda q, v: (_call(layer)(q, v) * g).sum(),
                                                  argnums=(0, 1))(p, x)[1].sum())(_params(layer))
    assert info.value.code == "SP0916" and "no second derivative" in info.value.message
    hxx = torch.func.jacrev(lambda v: dx_of(_params(layer), v))(x)
    assert hxx.shape == (2, K, 2, K) and not hxx.any()
