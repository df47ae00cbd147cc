"""torch.func.vmap of the trainable layer's op ``sparsile::sparse_linear_train`` and of a SemiSparseLinear
(integrations/torch/vmap_rules.py), and the op's own formula under torch.func (training._TrainFormula),
on the CPU through the interpreter.

A batch of x alone is more tokens: one kernel call for the whole batch (before: torch's batching
fallback, one call per member with its performance warning), and under ``grad(vmap(f))`` or a
``backward()`` through ``vmap(layer)`` the weight's gradient of that one call, bit for bit the flat
batch's (before: one bf16 rounding per member, summed: 0.047 off at 3 members). A batched weight (an
ensemble through ``functional_call``) runs one call per member. Outputs and gradients are compared with
float64 of the masked dense computation and with single-sample calls."""

from __future__ import annotations

import copy
import warnings

import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

N, K = 32, 64


def _layer(seed: int = 1) -> spt.SemiSparseLinear:
    return spt.SemiSparseLinear.from_dense(linear(N, K, torch.float32, seed=seed), "bf16")


def _rand(*shape: int, seed: int) -> torch.Tensor:
    """Random, never zero: |t| in [0.25, 1.25), either sign."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=gen) + 0.25) * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)


@pytest.fixture
def calls(monkeypatch):
    """The token counts of the train op's kernel calls (training._run_kernel), call by call."""
    from sparsile.integrations.torch import training

    seen: list[int] = []
    real = training._run_kernel

    def counted(x, *args, **kwargs):
        seen.append(int(x.shape[0]))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(training, "_run_kernel", counted)
    return seen


def _quiet(f, *args):
    """f(*args) with every warning an error (torch's batching fallback warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return f(*args)


def _check_y(y: torch.Tensor, layer: spt.SemiSparseLinear, x: torch.Tensor) -> None:
    """y = x @ (W·M)ᵀ + b in float64 (bf16 inputs), y float32."""
    xk, w = bf16(x).reshape(-1, K), masked_weight(layer)
    within(y.detach().reshape(-1, N), xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, K,
           torch.float32)


def _check_grads(dx: torch.Tensor, dw: torch.Tensor, db: torch.Tensor, layer: spt.SemiSparseLinear,
                 x: torch.Tensor, g: torch.Tensor) -> None:
    """The gradients of sum(layer(x) * g) against float64: dx = g @ (W·M), dW = (gᵀ @ x)·M, db = Σ g."""
    mask = layer.mask.double()
    wm, gk, xk = masked_weight(layer), bf16(g).reshape(-1, N), bf16(x).reshape(-1, K)
    within(dx.reshape(-1, K), gk @ wm, gk.abs() @ wm.abs(), N, torch.bfloat16)
    within(dw, (gk.T @ xk) * mask, gk.abs().T @ xk.abs(), xk.shape[0], torch.bfloat16)
    within(db, g.double().reshape(-1, N).sum(0), g.double().abs().reshape(-1, N).sum(0), xk.shape[0], torch.float32)


def _op_args(layer: spt.SemiSparseLinear) -> tuple[torch.Tensor, ...]:
    return (layer.weight, layer.mask, layer.values, layer.meta, layer.values_t, layer.meta_t, layer.bias)


@pytest.mark.parametrize("in_dims", [0, 1])
def test_a_batch_of_x_is_one_call_of_the_op(in_dims, calls):
    layer, x = _layer(), _rand(3, 4, K, seed=2).to(torch.bfloat16)
    op = torch.ops.sparsile.sparse_linear_train

    def f(t):
        return op(t, *_op_args(layer), out_dtype=torch.float32)

    y = _quiet(torch.func.vmap(f, in_dims=in_dims), x)
    assert calls == [12]  # (3 members x 4 tokens: one call)
    members = x.movedim(in_dims, 0)
    assert torch.equal(y, torch.stack([f(m) for m in members]))
    _check_y(y, layer, members)


def test_the_op_s_batched_weights_run_per_member(calls):
    """A batched bias, or stacked weights with their compressions: one call per member, each the
    member's own; x batched too, or not (in_dims None)."""
    layers = [_layer(seed) for seed in (3, 4, 5)]
    op = torch.ops.sparsile.sparse_linear_train
    stacked = [torch.stack(ts) for ts in zip(*(_op_args(layer) for layer in layers), strict=True)]
    x = _rand(3, 2, K, seed=6).to(torch.bfloat16)
    for x_dim in (0, None):
        calls.clear()
        y = _quiet(torch.func.vmap(lambda t, *w: op(t, *w, out_dtype=torch.float32), in_dims=(x_dim, *[0] * 7)),
                   x if x_dim == 0 else x[0], *stacked)
        assert calls == [2, 2, 2]
        for i, layer in enumerate(layers):
            _check_y(y[i], layer, x[i] if x_dim == 0 else x[0])
    calls.clear()
    base = layers[0]
    biases = _rand(3, N, seed=7)
    y = _quiet(torch.func.vmap(lambda t, b: op(t, *_op_args(base)[:-1], b, out_dtype=torch.float32)), x, biases)
    assert calls == [2, 2, 2]
    for i in range(3):
        assert torch.equal(y[i], op(x[i], *_op_args(base)[:-1], biases[i], out_dtype=torch.float32))
    with pytest.raises(IntegrationError) as info:  # a member x that is not (T, K): the op's own diagnostic
        torch.func.vmap(lambda t: op(t, *_op_args(base)))(x[:, None])
    assert (info.value.code, info.value.message) == (
        "SP0901", "sparsile.sparse_linear_train: x must be (T, 64) torch.bfloat16, got torch.bfloat16 (1, 2, 64)")


def test_vmap_of_the_layer_is_one_call(calls):
    layer, x = _layer(), _rand(3, 2, 4, K, seed=8)
    y = _quiet(torch.func.vmap(layer), x)
    assert calls == [24] and y.shape == (3, 2, 4, N)
    _check_y(y, layer, x)
    assert torch.equal(y, layer(x))
    calls.clear()
    assert torch.equal(_quiet(torch.func.vmap(torch.func.vmap(layer)), x), y)  # (nested: each level folds)
    assert calls == [24]


def test_per_sample_gradients_are_the_single_sample_gradients(calls):
    """``vmap(grad(loss), in_dims=(None, 0, 0))``: the forward one call for every sample; each sample's
    gradients (x, weight, bias) bit for bit those of its own grad call, and float64's."""
    layer, x, g = _layer(), _rand(3, 4, K, seed=9), _rand(3, 4, N, seed=10)
    params = {name: p.detach() for name, p in layer.named_parameters()}

    def loss(p, v, gv):
        return (torch.func.functional_call(layer, p, (v,)) * gv).sum()

    dp, dx = _quiet(torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)), in_dims=(None, 0, 0)), params, x, g)
    assert calls == [12]
    for i in range(3):
        one_p, one_x = torch.func.grad(loss, argnums=(0, 1))(params, x[i], g[i])
        assert torch.equal(dx[i], one_x)
        assert torch.equal(dp["weight"][i], one_p["weight"]) and torch.equal(dp["bias"][i], one_p["bias"])
        _check_grads(dx[i], dp["weight"][i], dp["bias"][i], layer, x[i], g[i])


def _flat_backward(layer: spt.SemiSparseLinear, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    layer.zero_grad()
    xr = x.clone().requires_grad_(True)
    (layer(xr) * g).sum().backward()
    return xr.grad, layer.weight.grad.clone(), layer.bias.grad.clone()


def test_grad_of_vmap_and_backward_through_vmap_are_the_flat_batch_s(calls):
    """The weight's gradient through a vmapped layer is that of one call over every token (the flat
    batch's bits, float64's within one rounding); before, TransformedTrainCall's generated vmap rule
    summed one bf16 gradient per member (0.047 off at 3 members)."""
    layer, x, g = _layer(), _rand(3, 4, K, seed=11), _rand(3, 4, N, seed=12)
    flat = _flat_backward(layer, x, g)
    _check_grads(*flat, layer, x, g)
    params = {name: p.detach() for name, p in layer.named_parameters()}

    def loss(p, v):
        return (torch.func.vmap(lambda t: torch.func.functional_call(layer, p, (t,)))(v) * g).sum()

    calls.clear()
    dp, dx = _quiet(torch.func.grad(loss, argnums=(0, 1)), params, x)
    assert calls == [12]
    for got, want in zip((dx, dp["weight"], dp["bias"]), flat, strict=True):
        assert torch.equal(got, want)
    layer.zero_grad()  # torch.autograd through torch.func.vmap(layer)
    xr = x.clone().requires_grad_(True)
    (torch.func.vmap(layer)(xr) * g).sum().backward()
    for got, want in zip((xr.grad, layer.weight.grad, layer.bias.grad), flat, strict=True):
        assert torch.equal(got, want)


def test_an_ensemble_s_outputs_and_gradients_are_each_member_s(calls):
    """Stacked parameters and buffers (torch.func.stack_module_state) through functional_call: one call
    per member, each member's y and gradients those of its own layer; x batched with them or shared."""
    layers = [_layer(seed) for seed in (13, 14, 15)]
    base = copy.deepcopy(layers[0])
    params, buffers = torch.func.stack_module_state(layers)
    x, g = _rand(3, 4, K, seed=16), _rand(3, 4, N, seed=17)

    def loss(p, b, v, gv):
        return (torch.func.functional_call(base, (p, b), (v,)) * gv).sum()

    for x_dim in (0, None):
        xs = x if x_dim == 0 else x[0]
        calls.clear()
        ys = _quiet(torch.func.vmap(lambda p, b, v: torch.func.functional_call(base, (p, b), (v,)),
                                    in_dims=(0, 0, x_dim)), params, buffers, xs)
        assert calls == [4, 4, 4]
        dp = _quiet(torch.func.vmap(torch.func.grad(loss), in_dims=(0, 0, x_dim, 0)), params, buffers, xs, g)
        for i, layer in enumerate(layers):
            xi = x[i] if x_dim == 0 else x[0]
            _check_y(ys[i], layer, xi)
            dxi, dwi, dbi = _flat_backward(layer, xi, g[i])
            assert torch.equal(dp["weight"][i], dwi) and torch.equal(dp["bias"][i], dbi)
            _check_grads(dxi, dp["weight"][i], dp["bias"][i], layer, xi, g[i])


def test_a_batch_of_no_members():
    """vmap over a batch of 0: y of shape (0, T, N) (the layer's reshape of x was ambiguous: torch's
    RuntimeError), the op's too."""
    layer = _layer()
    assert torch.func.vmap(layer)(torch.ones(0, 4, K)).shape == (0, 4, N)
    op = torch.ops.sparsile.sparse_linear_train
    y = torch.func.vmap(lambda t: op(t, *_op_args(layer)))(torch.ones(0, 4, K, dtype=torch.bfloat16))
    assert (y.shape, y.dtype) == ((0, 4, N), torch.bfloat16)


def test_the_op_called_directly_under_grad_and_per_sample_gradients():
    """The op's own autograd formula under torch.func (training._TrainFormula, its Autograd kernel):
    ``grad`` and ``vmap(grad)`` of ``sparse_linear_train`` called directly give backward()'s gradients
    (x, weight, bias). Before, its formula came from ``torch.library.register_autograd`` and torch.func
    refused it: torch's RuntimeError ("it must override the setup_context staticmethod")."""
    layer, x, g = _layer(), _rand(3, 4, K, seed=18).to(torch.bfloat16), _rand(3, 4, N, seed=19)
    op = torch.ops.sparsile.sparse_linear_train
    _, mask, values, meta, values_t, meta_t, _ = _op_args(layer)
    weight, bias = layer.weight.detach(), layer.bias.detach()

    def loss(v, w, b, gv):
        return (op(v, w, mask, values, meta, values_t, meta_t, b, out_dtype=torch.float32) * gv).sum()

    def autograd_grads(v, gv):  # torch.autograd's backward() of the same call
        leaves = [t.clone().requires_grad_(True) for t in (v, weight, bias)]
        return torch.autograd.grad(loss(*leaves, gv), leaves)

    flat = autograd_grads(x.reshape(12, K), g.reshape(12, N))
    dx, dw, db = torch.func.grad(loss, argnums=(0, 1, 2))(x.reshape(12, K), weight, bias, g.reshape(12, N))
    for got, want in zip((dx, dw, db), flat, strict=True):
        assert torch.equal(got, want)
    _check_grads(dx, dw, db, layer, x, g)
    dx, dw, db = _quiet(torch.func.vmap(torch.func.grad(loss, argnums=(0, 1, 2)), in_dims=(0, None, None, 0)),
                        x, weight, bias, g)
    for i in range(3):
        one = autograd_grads(x[i], g[i])
        for got, want in zip((dx[i], dw[i], db[i]), one, strict=True):
            assert torch.equal(got, want)
        _check_grads(dx[i], dw[i], db[i], layer, x[i], g[i])
    for mask_grad in (False, True):  # (given, or left at its default by the dispatcher: masked)
        kwargs = {"mask_grad": mask_grad} if not mask_grad else {}
        dw = torch.func.grad(lambda w, kw=kwargs: (op(x[0], w, mask, values, meta, values_t, meta_t, bias, **kw).float()
                                                   * g[0]).sum())(weight)
        gk, xk = bf16(g[0]), bf16(x[0])
        want = gk.T @ xk if not mask_grad else (gk.T @ xk) * mask
        within(dw, want, gk.abs().T @ xk.abs(), 4, torch.bfloat16)
        assert bool((dw[~mask] != 0).any()) == (not mask_grad)


def test_compiled_per_sample_gradients_of_the_parameters():
    """torch.compile of ``vmap(grad(loss))`` in the parameters: compiled, the layer called the op itself,
    whose formula torch.func refused (torch's error at compile time). Each sample's gradient is the
    eager one's bits. (In x, compiled: test_torch_compiled_func.py.)"""
    layer, x, g = _layer(), _rand(3, 4, K, seed=20), _rand(3, 4, N, seed=21)
    params = {name: p.detach() for name, p in layer.named_parameters()}

    def loss(p, v, gv):
        return (torch.func.functional_call(layer, p, (v,)) * gv).sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    torch._dynamo.reset()
    got = torch.compile(per_sample, backend="eager")(params, x, g)
    want = per_sample(params, x, g)
    for name in ("weight", "bias"):
        assert torch.equal(got[name], want[name]), name
    for i in range(3):
        one_p = torch.func.grad(loss)(params, x[i], g[i])
        one = _flat_backward(layer, x[i], g[i])
        assert torch.equal(got["weight"][i], one_p["weight"]) and torch.equal(got["weight"][i], one[1])
        _check_grads(one[0], got["weight"][i], got["bias"][i], layer, x[i], g[i])
