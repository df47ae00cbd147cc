"""A graph ``torch.fx.symbolic_trace`` made of a model with a ``SparseLinear`` keeps the layer itself
(a ``get_attr`` node of the layer, its tensors read from it when the graph runs), so what a module
does to its tensors reaches the layer's own rules: ``graph.to(torch.float16)`` / ``.half()`` /
``.float()`` leave the compressed values in their type, as ``model.to(...)`` does, and the graph
takes the model's ``state_dict``.

History: the layer's tensors were ``get_attr`` nodes of the tensors themselves, which the
GraphModule copied into a plain ``torch.nn.Module`` under the layer's path: ``graph.half()`` converted
the bf16 values (and the float32 bias) to float16, and the graph computed with them, silently other
numbers than ``model.half()`` (about 2^-8 of the outputs off); ``graph.float()`` made them float32 and
an e4m3 layer's float16 or float32, SP0906 at the next call ("values must be a 2-D bfloat16, ...").
Loading the model's ``state_dict`` into the graph worked before too (a regression test here: the graph
holding the layer keeps the model's keys)."""

from __future__ import annotations

import copy

import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")


def _model(weight: str, seed: int) -> torch.nn.Module:
    layer = spt.SparseLinear.from_dense(linear(48, 64, seed=seed), weight, activation="silu")
    return torch.nn.Sequential(torch.nn.Sequential(layer))


@pytest.mark.parametrize("weight", ["bf16", "f16", "e4m3"])
@pytest.mark.parametrize("convert", ["half", "float", "bfloat16", "to_f16", "to_f32"])
def test_a_converted_traced_graph_computes_as_the_converted_model(weight, convert):
    model = _model(weight, seed=1)
    graph = torch.fx.symbolic_trace(model)
    how = {"half": lambda m: m.half(), "float": lambda m: m.float(), "bfloat16": lambda m: m.bfloat16(),
           "to_f16": lambda m: m.to(torch.float16), "to_f32": lambda m: m.to(torch.float32)}[convert]
    model, graph = how(model), how(graph)
    assert {k: v.dtype for k, v in graph.state_dict().items()} == {k: v.dtype for k, v in model.state_dict().items()}
    dtype = {"half": torch.float16, "to_f16": torch.float16, "bfloat16": torch.bfloat16}.get(convert, torch.float32)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    torch.empty(4096).fill_(float("nan"))
    got = graph(x)
    assert torch.equal(got, model(x))


@pytest.mark.parametrize("weight", ["bf16", "e4m3"])
def test_a_traced_graph_loads_the_models_state_dict(weight):
    model, other = _model(weight, seed=3), _model(weight, seed=4)
    graph = torch.fx.symbolic_trace(model)
    assert list(graph.state_dict()) == list(model.state_dict())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    assert not torch.equal(graph(x), other(x))
    graph.load_state_dict(copy.deepcopy(other.state_dict()))  # (into the model's layer: the graph holds it)
    assert torch.equal(graph(x), other(x))
