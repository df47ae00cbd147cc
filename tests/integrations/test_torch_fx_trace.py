"""``torch.fx.symbolic_trace`` of a model with sparse layers (torchvision's feature extraction, FX
graph-mode passes): a SparseLinear is no ``torch.nn`` leaf, so the tracer runs its forward on an
``fx.Proxy``, which has no shape, dtype or ``requires_grad`` to read. The forward records the custom
ops on it (the layer's tensors as ``get_attr`` nodes); before, the proxy met the layer's input check:
SP0901, "SparseLinear takes a torch.Tensor, got Proxy"."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _poisoned(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """module(x) with torch.empty poisoned with NaN first (an output left unwritten would show)."""
    torch.empty(4096).fill_(float("nan"))
    return module(x)


@pytest.mark.parametrize(("weight", "activation", "out_dtype", "static"), [
    ("bf16", None, None, False), ("f16", "silu", torch.float32, False), ("e4m3", "relu", None, False),
    ("e4m3", None, torch.float32, True)])
def test_symbolic_trace_records_the_ops_and_runs_as_the_eager_model(weight, activation, out_dtype, static):
    dense = linear(48, 64, dtype=torch.float16 if weight == "f16" else torch.bfloat16, seed=1)
    layer = spt.SparseLinear.from_dense(dense, weight, activation=activation, out_dtype=out_dtype)
    if static:
        layer.input_scale = torch.tensor([0.05])  # (x beyond 448 * 0.05 saturates)
    model = torch.nn.Sequential(linear(64, 64, seed=2).float(), torch.nn.ReLU(), layer)
    graph = torch.fx.symbolic_trace(model)
    targets = {str(node.target) for node in graph.graph.nodes if node.op == "call_function"}
    assert targets & {"sparsile.sparse_linear.default", "sparsile.sparse_linear_e4m3.default"}
    gen = torch.Generator().manual_seed(3)
    for shape in [(3, 64), (2, 5, 64), (64,)]:
        x = torch.randn(shape, generator=gen)
        y = _poisoned(graph, x)
        assert torch.equal(y, model(x))
        h = model[1](model[0](x)).detach()
        if static:
            _check_static(layer, h, y.detach())
        else:
            check_against_float64(layer, h, y.detach(), out_dtype or torch.float32)


def _check_static(layer, x: torch.Tensor, y: torch.Tensor) -> None:
    """y against float64 for an e4m3 layer of static input scale s: x / s saturated to ±448 and rounded to
    e4m3, times s, then the float64 product with the layer's weight, plus bias (within float32 accumulation)."""
    s = layer.input_scale.double()
    xq = (x.double() / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s
    w = layer.to_dense().double()
    ref = (xq.reshape(-1, layer.in_features) @ w.T + layer.bias.double()).reshape(y.shape)
    bound = 2.0 ** -12 * (xq.reshape(-1, layer.in_features).abs() @ w.abs().T).reshape(y.shape) + 1e-6
    assert ((y.double() - ref).abs() <= bound).all()


def test_a_traced_graph_gives_x_the_eager_gradient():
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=4), "bf16", activation="gelu_tanh")
    graph = torch.fx.symbolic_trace(torch.nn.Sequential(layer))
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    want = x.clone().requires_grad_()
    layer(want).sum().backward()
    got = x.clone().requires_grad_()
    graph(got).sum().backward()
    assert torch.equal(got.grad, want.grad)


def test_a_fused_group_traces_member_by_member():
    """fuse_projections_ groups (eager one launch per group, traced=True one op per group in a torch.compile
    trace): symbolically traced, each member records its own op."""

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (linear(64, 64, seed=s) for s in (6, 7, 8))

        def forward(self, x):
            return self.q_proj(x) * self.k_proj(x) + self.v_proj(x)

    model = torch.nn.Sequential(Attention())
    spt.sparsify_(model, interpret=True, min_features=0, fuse=True, traced=True)
    graph = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    assert torch.equal(_poisoned(graph, x), model(x))


@pytest.mark.parametrize(("x", "message"), [
    (torch.ones(2, 64, dtype=torch.int64),
     "x has dtype torch.int64; SparseLinear takes bfloat16, float16 or float32 x"),
    (torch.ones(2, 63), "x has shape (2, 63); this layer takes (..., 64)")])
def test_the_traced_graph_checks_x_as_the_eager_layer(x, message):
    from sparsile.integrations.errors import IntegrationError

    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=10), "bf16")
    graph = torch.fx.symbolic_trace(torch.nn.Sequential(layer))
    for run in (layer, graph):
        with pytest.raises(IntegrationError) as caught:
            run(x)
        assert caught.value.code == "SP0901" and caught.value.message == message


def _trainable_model() -> torch.nn.Module:
    """relu(dense(x)) into a SemiSparseLinear (float32 master weight, bf16 compute)."""
    layer = spt.SparseLinear.from_dense(linear(48, 64, torch.float32, seed=11), "bf16", trainable=True)
    return torch.nn.Sequential(linear(64, 64, torch.float32, seed=12), torch.nn.ReLU(), layer)


def _check_trainable(layer, h: torch.Tensor, y: torch.Tensor) -> None:
    """y against float64: h rounded to bf16 times the masked weight as the kernel sees it, plus bias."""
    from sparsile.tests.integrations.training_helpers import bf16, masked_weight, within

    hk, w = bf16(h).reshape(-1, 64), masked_weight(layer)
    within(y.reshape(-1, 48), hk @ w.T + layer.bias.detach().double(), hk.abs() @ w.abs().T, 64, y.dtype)


def test_a_trainable_layer_traces_as_a_leaf_with_the_eager_outputs_and_gradients():
    """SemiSparseLinear under symbolic_trace: one call_module node (the eager layer when the graph runs).
    Before: SP0901, "SemiSparseLinear takes a torch.Tensor, got Proxy"."""
    model = _trainable_model()
    graph = torch.fx.symbolic_trace(model)
    calls = [node.target for node in graph.graph.nodes if node.op == "call_module"]
    assert calls == ["0", "1", "2"] and graph.get_submodule("2") is model[2]
    gen = torch.Generator().manual_seed(13)
    for shape in [(3, 64), (2, 5, 64), (64,)]:
        x = torch.randn(shape, generator=gen)
        got, want = x.clone().requires_grad_(), x.clone().requires_grad_()
        y = _poisoned(graph, got)
        grads = []
        for run, inp in ((graph, got), (model, want)):
            model.zero_grad()
            out = y if run is graph else run(inp)
            out.backward(torch.ones_like(out))
            grads.append([inp.grad, *(p.grad.clone() for p in model.parameters())])
        assert torch.equal(y, model(x))
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
        _check_trainable(model[2], model[1](model[0](x)).detach(), y.detach())


def test_a_traced_trainable_layer_computes_with_the_weight_an_optimizer_step_left():
    """The graph runs the eager layer, which compresses a master weight stepped since its last call
    (a fused optimizer bumps no version counter: the step hooks mark it stale); a graph of the op on
    get_attr nodes would have computed with the compressions from before the step."""
    model = _trainable_model()
    graph = torch.fx.symbolic_trace(model)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(14))
    before = graph(x).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, fused=True)
    graph(x).square().sum().backward()
    optimizer.step()
    y = _poisoned(graph, x).detach()
    assert not torch.equal(y, before)
    _check_trainable(model[2], model[1](model[0](x)).detach(), y)


def test_a_trainable_layer_traced_as_the_root_is_refused():
    from sparsile.integrations.errors import IntegrationError

    layer = spt.SemiSparseLinear.from_dense(linear(48, 64, seed=15), "bf16")
    with pytest.raises(IntegrationError) as caught:
        torch.fx.symbolic_trace(layer)
    assert caught.value.code == "SP0916" and caught.value.message == (
        "torch.fx.symbolic_trace cannot record this SemiSparseLinear: it is recorded as a call of the module (a "
        "call_module node, which runs the eager layer), and it is not a submodule of the module traced (it is the "
        "root, or outside it)")
    assert caught.value.help.startswith("trace a module that holds it: torch.fx.symbolic_trace(torch.nn.Sequential(")
