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
