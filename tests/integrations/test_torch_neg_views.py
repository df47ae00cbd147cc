"""torch tensors with the negative bit set (``torch._neg_view(x)``, ``z.conj().imag``) given to
sparsile.torch's eager paths: they compute on the negated values (a copy with the negation applied),
as torch's own ops do; a kernel launch reads memory by address, which holds the values before the
negation (kernel[grid] and prepared launches refuse such a view, SP0751). The launch record's and
the layer's fast path: test_torch_last_call.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import quantize  # noqa: E402
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)


def test_the_quantizer_reads_a_neg_view_with_its_negation(monkeypatch):
    """quantize_per_token hands the kernel API (on CUDA: its prepared launch, which refuses a neg
    view with SP0751) a copy with the negation applied."""
    seen = []
    real = kernels.kernel_api()

    class Api:
        def quantize(self, x, interpret=False):
            seen.append(x)
            return real.quantize(x, interpret=interpret)

    monkeypatch.setattr(kernels, "kernel_api", lambda: Api())
    base = torch.randn(3, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    xq, scale = quantize.quantize_per_token(torch._neg_view(base))
    assert not seen[0].is_neg() and torch.equal(seen[0], -base)
    want_q, want_scale = quantize.quantize_per_token(-base)
    assert torch.equal(scale, want_scale) and torch.equal(xq.float(), want_q.float())


def test_the_op_computes_with_a_neg_view_weight_as_it_shows_after_writes_too():
    """torch.ops.sparsile.sparse_linear given neg views of the weight's tensors (values, meta, bias)
    computes with the values they show (in the interpreter, against float64), also after an in-place
    write of their memory (the op keeps one resolved copy per memory, integrations/torch/neg_weights.py,
    brought up to such a write), and drops that copy with the memory."""
    import gc

    import sparsile.torch as spt
    from sparsile.integrations.torch import neg_weights
    from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=4), dtype="bf16")
    memory = {name: getattr(layer, name).detach().neg() for name in ("values", "meta", "bias")}
    shown = {name: torch._neg_view(t) for name, t in memory.items()}
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    before = len(neg_weights._RESOLVED)
    check_against_float64(layer, x, torch.ops.sparsile.sparse_linear(x, shown["values"], shown["meta"], shown["bias"]))
    assert len(neg_weights._RESOLVED) == before + 3
    with torch.no_grad():
        memory["values"].mul_(-2.0)  # shows -2 values
        layer.values.mul_(-2.0)
        memory["bias"].add_(1.0)  # shows bias - 1
        layer.bias.sub_(1.0)
    check_against_float64(layer, x, torch.ops.sparsile.sparse_linear(x, shown["values"], shown["meta"], shown["bias"]))
    assert len(neg_weights._RESOLVED) == before + 3
    del memory, shown
    gc.collect()
    assert len(neg_weights._RESOLVED) == before


def _neg_weight_layer():
    import sparsile.torch as spt
    from sparsile.tests.integrations.torch_helpers import linear

    layer = spt.SparseLinear.from_dense(linear(32, 64, seed=4), dtype="bf16")
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    return layer, x


def test_a_neg_view_weight_first_seen_in_inference_mode_serves_later_calls_outside_it():
    """The op's first call on a neg-view weight inside torch.inference_mode made the kept copy an
    inference tensor: after a write of that memory, the next call outside inference mode refreshed
    the copy in place, which torch refuses ("Inplace update to inference tensor outside InferenceMode"),
    and x's gradient through such a weight failed the same way. The copy is a normal tensor now."""
    from sparsile.integrations.torch import neg_weights
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer, x = _neg_weight_layer()
    memory = layer.values.detach().neg()
    with torch.inference_mode():
        check_against_float64(layer, x, torch.ops.sparsile.sparse_linear(x, torch._neg_view(memory), layer.meta,
                                                                          layer.bias))
    assert not any(e.copy.is_inference() for e in neg_weights._RESOLVED.values())
    with torch.no_grad():
        memory.mul_(-2.0)
        layer.values.mul_(-2.0)
    check_against_float64(layer, x, torch.ops.sparsile.sparse_linear(x, torch._neg_view(memory), layer.meta,
                                                                      layer.bias))
    with torch.inference_mode():  # written again, refreshed inside inference mode: still a normal tensor
        memory.mul_(0.5)
        layer.values.mul_(0.5)
        check_against_float64(layer, x, torch.ops.sparsile.sparse_linear(x, torch._neg_view(memory), layer.meta,
                                                                          layer.bias))
    xr = x.clone().requires_grad_(True)
    torch.ops.sparsile.sparse_linear(xr, torch._neg_view(memory), layer.meta, layer.bias).float().sum().backward()
    want = layer.to_dense().double().sum(0)  # d(sum y)/dx = column sums of W
    assert torch.allclose(xr.grad.double(), want.expand(3, -1).to(torch.bfloat16).double(), rtol=2 ** -7, atol=0)


def test_a_neg_view_of_a_tensor_whose_storage_was_swapped_is_not_served_a_stale_copy():
    """The kept copy was keyed on the view's address, shape, strides and dtype and checked against
    the owning tensor and its version counter; ``owner.data = t`` swaps the storage without a version
    bump, so a new storage at the old address (the caching allocator hands a freed block out again;
    here the same numpy buffer under a new storage) gave the old values. The copy is kept only while
    the storage it was made from is the view's."""
    import numpy as np

    from sparsile.integrations.torch import neg_weights
    from sparsile.tests.integrations.torch_helpers import check_against_float64

    layer, x = _neg_weight_layer()
    buffer = np.ascontiguousarray(-layer.bias.detach().numpy())
    owner = torch.from_numpy(buffer)
    shown = torch.ops.sparsile.sparse_linear
    check_against_float64(layer, x, shown(x, layer.values, layer.meta, torch._neg_view(owner)))
    owner.data = torch.zeros_like(owner)  # the first storage dies; the buffer lives on
    buffer *= -3.0  # written as a new tensor allocated there would be (its own version counter)
    owner.data = torch.from_numpy(buffer)  # a new storage at the old address, owner's counter unchanged
    with torch.no_grad():
        layer.bias.mul_(-3.0)
    check_against_float64(layer, x, shown(x, layer.values, layer.meta, torch._neg_view(owner)))
    assert torch.equal(neg_weights.resolved_weight(torch._neg_view(owner)), -owner)


def test_copies_of_swapped_out_storages_are_dropped():
    """A tensor living on while its storage is swapped (``owner.data = new`` each step) left one kept
    copy per old storage until the tensor died: a weight-sized leak per swap. A miss drops the copies
    whose storage is gone."""
    from sparsile.integrations.torch import neg_weights

    owner = torch.randn(16, 8)
    before = len(neg_weights._RESOLVED)
    keep = []
    for step in range(4):
        keep.append(torch.randn(3))  # (shifts the allocator: each new storage at another address)
        owner.data = torch.randn(16, 8, generator=torch.Generator().manual_seed(step))
        assert torch.equal(neg_weights.resolved_weight(torch._neg_view(owner)), -owner)
    assert len(neg_weights._RESOLVED) == before + 1


def test_a_trace_of_the_op_on_a_neg_view_weight_reads_its_input():
    """make_fx traces with real tensors under a dispatch mode: a copy kept from an earlier call (or
    trace) was handed to the op as a tensor from nowhere, which the trace baked in as a constant, so
    the traced graph computed with that weight whatever weight it was given. Under a dispatch mode
    the view is resolved per call, as torch's Negative fallback does, and the trace reads its input."""
    from torch.fx.experimental.proxy_tensor import make_fx

    layer, x = _neg_weight_layer()

    def call(x, values, meta, bias):
        return torch.ops.sparsile.sparse_linear(x, values, meta, bias)

    memory = layer.values.detach().neg()
    call(x, torch._neg_view(memory), layer.meta, layer.bias)  # eager: a copy kept
    for _ in range(2):
        traced = make_fx(call)(x, torch._neg_view(memory), layer.meta, layer.bias)
        assert not [n for n in traced.graph.nodes if n.op == "get_attr"]
        other = torch.randn(memory.shape, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
        got = traced(x, torch._neg_view(other), layer.meta, layer.bias)
        assert torch.equal(got, call(x, -other, layer.meta, layer.bias))


def test_no_copy_is_kept_or_refreshed_while_a_cuda_graph_is_captured(monkeypatch):
    """Inside a capture a copy made (or refreshed in place) is a captured kernel, run at the
    graph's replay: a copy kept from there would be unfilled (or behind the write) for eager calls
    before the first replay. A capture uses a kept copy that is up to date, else resolves per call."""
    from sparsile.integrations.torch import neg_weights

    monkeypatch.setattr(neg_weights, "capturing", lambda: True)
    memory = torch.randn(16, 8)
    before = dict(neg_weights._RESOLVED)
    got = neg_weights.resolved_weight(torch._neg_view(memory))
    assert torch.equal(got, -memory) and neg_weights._RESOLVED == before
    monkeypatch.setattr(neg_weights, "capturing", lambda: False)
    kept = neg_weights.resolved_weight(torch._neg_view(memory))
    monkeypatch.setattr(neg_weights, "capturing", lambda: True)
    assert neg_weights.resolved_weight(torch._neg_view(memory)) is kept  # up to date: used
    memory.add_(1.0)
    got = neg_weights.resolved_weight(torch._neg_view(memory))
    assert got is not kept and torch.equal(got, -memory) and not torch.equal(kept, -memory)  # kept not touched
    monkeypatch.setattr(neg_weights, "capturing", lambda: False)
    assert neg_weights.resolved_weight(torch._neg_view(memory)) is kept and torch.equal(kept, -memory)
