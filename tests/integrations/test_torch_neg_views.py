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
