"""``SparseLinear.__call__`` (integrations/torch/linear.py): a plain eager call runs the eager forward
without ``nn.Module.__call__``; every call that needs ``Module.__call__`` (hooks, a replaced or
overridden forward, keyword arguments, ``Module.compile``, tracers) still goes through it, and both
give the same y (CPU tensors: the kernel in the interpreter)."""

from __future__ import annotations

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
nn = torch.nn


@pytest.fixture
def layer():
    return spt.SparseLinear.from_dense(linear(24, 32, seed=7), "bf16")


@pytest.fixture
def x():
    return torch.randn(3, 32, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)


@pytest.fixture
def module_calls(monkeypatch):
    """How many calls went through ``nn.Module._call_impl``."""
    calls = []
    original = nn.Module._call_impl

    def counted(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "_call_impl", counted)
    return calls


def test_a_plain_eager_call_skips_module_call(layer, x, module_calls):
    y = layer(x)
    assert module_calls == []
    check_against_float64(layer, x, y)
    assert torch.equal(y, layer.forward(x))


def test_forward_hooks_and_pre_hooks_run(layer, x, module_calls):
    seen = []
    pre = layer.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    post = layer.register_forward_hook(lambda m, args, out: seen.append(out.shape) or out + 1)
    y = layer(x)
    assert module_calls == ["SparseLinear"] and seen == [(3, 24)]
    assert torch.equal(y, layer.forward(x * 2) + 1)
    pre.remove()
    post.remove()
    module_calls.clear()
    layer(x)
    assert module_calls == []  # hooks removed: the fast path again


@pytest.mark.parametrize("kind", ["forward", "forward_pre", "backward"])
def test_global_hooks_run(layer, x, module_calls, kind):
    seen = []
    register = {"forward": nn.modules.module.register_module_forward_hook,
                "forward_pre": nn.modules.module.register_module_forward_pre_hook,
                "backward": nn.modules.module.register_module_full_backward_hook}[kind]
    handle = register(lambda m, *a: seen.append(type(m).__name__))
    try:
        layer(x)
    finally:
        handle.remove()
    assert module_calls == ["SparseLinear"]
    assert seen == ([] if kind == "backward" else ["SparseLinear"])  # (no backward ran)


def test_a_replaced_forward_on_the_instance_is_called(layer, x):
    original = layer.forward
    layer.forward = lambda t: original(t) * 3  # as accelerate's hooks do
    assert torch.equal(layer(x), original(x) * 3)


def test_a_subclass_forward_is_called(x):
    class Scaled(spt.SparseLinear):
        def forward(self, t):
            return super().forward(t) * 2

    class Plain(spt.SparseLinear):
        pass

    dense = linear(24, 32, seed=7)
    scaled, plain = Scaled.from_dense(dense, "bf16"), Plain.from_dense(dense, "bf16")
    assert not Scaled._own_forward and Plain._own_forward
    assert torch.equal(scaled(x), plain(x) * 2)


def test_keyword_and_extra_arguments_take_module_call(layer, x, module_calls):
    assert torch.equal(layer(x=x), layer.forward(x)) and torch.equal(layer(input=x), layer(x))
    assert module_calls == ["SparseLinear", "SparseLinear"]
    with pytest.raises(TypeError):
        layer(x, x)  # forward takes one argument: Module.__call__ passes both on, as for nn.Linear
    with pytest.raises(TypeError):
        layer()


def test_module_compile_takes_its_compiled_call(layer, x, monkeypatch):
    called = []
    layer.__dict__["_compiled_call_impl"] = lambda *a, **k: called.append(a) or "compiled"
    assert layer(x) == "compiled" and len(called) == 1


def test_a_non_tensor_argument_gets_the_diagnostic(layer):
    from sparsile.integrations.errors import IntegrationError

    with pytest.raises(IntegrationError) as info:
        layer([[1.0] * 32])
    assert info.value.code == "SP0901"


def test_fx_tracing_reaches_module_call(layer):
    """FX patches ``nn.Module.__call__`` while it traces; a proxy argument takes it, so a tracer that
    keeps SparseLinear whole records one call_module node (as it would for nn.Linear)."""
    import torch.fx

    class KeepSparse(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return isinstance(m, spt.SparseLinear) or super().is_leaf_module(m, qualname)

    graph = KeepSparse().trace(nn.Sequential(layer))
    assert [n.op for n in graph.nodes] == ["placeholder", "call_module", "output"]
