"""sparsile.torch under dynamic shapes, as a server traces it (the token count T changes every call):
torch.compile with ``dynamic=True``, ``mark_dynamic`` and ``mark_unbacked`` (one graph for every T,
no graph break, every output against float64), torch.export with a ``Dim`` for the tokens run at
several T, e4m3 layers, a fused gated MLP (``traced=True``) across the 64-token fallback, and x's
gradient with a dynamic T. On the CPU the op runs in the interpreter: small layers."""

from __future__ import annotations

import io

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _layer(dtype=None, activation="relu"):
    return spt.SparseLinear.from_dense(linear(64, 128, seed=1), dtype, activation=activation)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


class _Graphs:
    """A torch.compile backend that counts the graphs it is handed (after ``inner``: "eager" or AOTAutograd)."""

    def __init__(self, aot: bool = True):
        self.graphs = []
        self.aot = aot

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        if self.aot:
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend("aot_eager")(gm, example_inputs)
        return gm.forward

    def sparse_ops(self, i: int = -1) -> list[str]:
        return [str(n.target).removesuffix(".default") for n in self.graphs[i].graph.nodes
                if "sparsile" in str(n.target)]


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_dynamic_true_one_graph_for_every_t(dtype):
    """dynamic=True: T = 2..40 share one graph; T = 1 and T = 0 get one each (torch's
    0/1 specialization), nothing more; each output within the float64 bound."""
    layer = _layer(dtype)
    backend = _Graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend, dynamic=True)
    for i, t in enumerate([2, 3, 17, 40, 5]):
        x = _x(t, 128, seed=i)
        check_against_float64(layer, x, compiled(x))
    assert len(backend.graphs) == 1
    want = ["sparsile.quantize_per_token_e4m3"] if dtype else []
    assert backend.sparse_ops() == [*want, "sparsile.sparse_linear"]
    for t in (1, 0):
        x = _x(t, 128)
        check_against_float64(layer, x, compiled(x))
    assert len(backend.graphs) == 3


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_mark_dynamic_on_two_leading_dims(dtype):
    """x (B, S, K) with both B and S marked dynamic: one graph for every (B, S) of at least 2 each."""
    layer = _layer(dtype, activation="gelu_tanh")
    backend = _Graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for i, (b, s) in enumerate([(2, 3), (3, 7), (5, 2), (2, 9)]):
        x = _x(b, s, 128, seed=i)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
        check_against_float64(layer, x, compiled(x))
    assert len(backend.graphs) == 1


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_mark_unbacked_t_traces_and_runs_at_every_t(dtype):
    """An unbacked T (``mark_unbacked``: no 0/1 specialization, one graph for T = 0, 1, 2, ...). The
    e4m3 layer's trace failed: the fake op's check of scale_x (``numel() in (1, T)``) asked
    ``u0 == 1`` of the unbacked T, torch's "Could not guard on data-dependent expression"."""
    layer = _layer(dtype)
    backend = _Graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for i, shape in enumerate([(3, 128), (1, 128), (0, 128), (9, 128)]):
        x = _x(*shape, seed=i)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        check_against_float64(layer, x, compiled(x))
    assert len(backend.graphs) == 1


def test_mark_unbacked_on_two_leading_dims_e4m3():
    layer = _layer("e4m3")
    backend = _Graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    for i, shape in enumerate([(2, 3, 128), (1, 1, 128), (4, 5, 128)]):
        x = _x(*shape, seed=i)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        torch._dynamo.decorators.mark_unbacked(x, 1)
        check_against_float64(layer, x, compiled(x))
    assert len(backend.graphs) == 1


def test_unbacked_scale_x_still_refused_when_known_wrong():
    """The traced check stays: a per-token scale_x of a known wrong length is SP0906 in the fake op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sparsile.integrations.errors import IntegrationError

    fp8 = _layer("e4m3")
    with FakeTensorMode(allow_non_fake_inputs=True):
        xq = torch.empty(4, 128, dtype=torch.float8_e4m3fn)
        with pytest.raises(IntegrationError, match="scale_x has 3 elements"):
            torch.ops.sparsile.sparse_linear(xq, fp8.values, fp8.meta, None, torch.empty(3), fp8.scale_w)


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_export_with_a_token_dim_runs_at_every_t(dtype):
    """torch.export with Dim("T"): one program for T = 0, 1, 2, ..., also saved and loaded (N-D: a Dim per
    leading dimension)."""
    from torch.export import Dim

    layer = _layer(dtype, activation="silu")
    model = torch.nn.Sequential(layer)  # (a SparseLinear as the root: see the xfail below)
    program = torch.export.export(model, (_x(4, 128),), dynamic_shapes={"input": {0: Dim("T")}})
    saved = io.BytesIO()
    torch.export.save(program, saved)
    saved.seek(0)
    run = torch.export.load(saved).module()  # (and through torch.export.save / load)
    for i, t in enumerate([0, 1, 2, 17, 40]):
        x = _x(t, 128, seed=i)
        check_against_float64(layer, x, run(x))
    program = torch.export.export(model, (_x(2, 3, 128),), dynamic_shapes={"input": {0: Dim("B"), 1: Dim("S")}})
    run = program.module()
    for i, shape in enumerate([(1, 1), (3, 5), (4, 0)]):
        x = _x(*shape, 128, seed=i)
        check_against_float64(layer, x, run(x))


@pytest.mark.xfail(raises=KeyError, strict=True, reason="torch: the exported root's buffer 'meta' collides with "
                   "GraphModule.meta when unlifted (a SparseLinear inside a model is fine)")
def test_export_of_a_bare_layer_unlifts():
    program = torch.export.export(_layer(), (_x(4, 128),))
    program.module()


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_fused_gated_mlp_one_graph_across_the_64_token_fallback(dtype):
    """fuse_projections_(traced=True, glu=True) under dynamic=True: one graph (the gated op and
    down_proj's) for T = 3, 70 (the real op's unfused fallback above 64 tokens), 40; the eager
    forward's numbers."""
    from sparsile.tests.integrations.test_torch_glu import HIDDEN, LlamaLikeMLP, act_module, sparse_block

    block = sparse_block(LlamaLikeMLP(act=act_module("swiglu")), dtype)
    spt.fuse_projections_(block, traced=True, glu=True)
    backend = _Graphs(aot=False)
    compiled = torch.compile(block.mlp, fullgraph=True, backend=backend, dynamic=True)
    with torch.no_grad():
        for i, t in enumerate([3, 70, 40]):
            x = _x(t, HIDDEN, seed=i)
            assert torch.equal(compiled(x), block.mlp(x))
    assert len(backend.graphs) == 1
    activations = [n.kwargs.get("activation") for n in backend.graphs[0].graph.nodes
                   if str(n.target).removesuffix(".default") == "sparsile.sparse_linear"]
    assert activations == ["swiglu", None]


@pytest.mark.parametrize("dtype", [None, "e4m3"])
def test_input_gradient_with_a_dynamic_t(dtype):
    """x.requires_grad under dynamic=True (AOTAutograd traces the backward with a symbolic T): the
    eager layer's y and x's gradient (e4m3: the straight-through one), one graph for every T >= 2
    of 2-D x and one for every (B, S) of 3-D x."""
    layer = _layer(dtype)
    backend = _Graphs()
    compiled = torch.compile(layer, fullgraph=True, backend=backend, dynamic=True)
    for i, shape in enumerate([(3, 128), (17, 128), (2, 5, 128), (4, 3, 128)]):
        x = _x(*shape, seed=i).requires_grad_()
        dy = _x(*shape[:-1], 64, seed=10 + i)
        y = compiled(x)
        y.backward(dy)
        x_eager = x.detach().clone().requires_grad_()
        y_eager = layer(x_eager)
        y_eager.backward(dy)
        assert torch.equal(y, y_eager)
        assert torch.equal(x.grad, x_eager.grad)
    assert len(backend.graphs) == 2


def test_inductor_dynamic_e4m3():
    layer = _layer("e4m3", activation="gelu_tanh")
    compiled = torch.compile(layer, fullgraph=True, backend="inductor", dynamic=True)
    for i, shape in enumerate([(3, 128), (2, 5, 128), (1, 128), (33, 128)]):
        x = _x(*shape, seed=i)
        check_against_float64(layer, x, compiled(x))
