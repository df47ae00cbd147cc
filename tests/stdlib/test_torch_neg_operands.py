"""sparse_matmul / sparse_linear with torch tensors whose negative bit is set (``torch._neg_view(b)``,
``z.conj().imag``): the kernels read operands by address, and such a view's memory holds the values
before the negation. Planning reads a copy with the negation applied (as torch's ops compute on what
the view shows), an out that is a neg view receives C through a copy (torch's ``copy_`` writes
through the negation), and the call cache keys no neg view (its key would be the base tensor's, whose
replay reads the memory in place). CUDA tensors are stood in for by CPU ones
(``host_tensors_as_device``: planning only, nothing launched)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparsile.stdlib.kernels import arrays, call_cache, plan_sparse_matmul  # noqa: E402
from sparsile.stdlib.kernels.arrays import host_tensors_as_device  # noqa: E402
from sparsile.tests.stdlib.test_gemm_api import problem  # noqa: E402


def _operands(m: int = 128, n: int = 80, k: int = 64):
    weight, b = problem("f16", m, n, k, 3)
    values = torch.from_numpy(np.ascontiguousarray(weight.values))
    words = torch.from_numpy(np.array(weight.meta.data).view(np.int32))  # (a writable copy of the words)
    return values, words, torch.from_numpy(b)


def test_planning_reads_a_neg_view_with_its_negation():
    values, words, b = _operands()
    with host_tensors_as_device():
        plan = plan_sparse_matmul(torch._neg_view(values.neg()), torch._neg_view(words.neg()), torch._neg_view(b),
                                  target="sm_90a")
    assert not plan.values.is_neg() and torch.equal(plan.values, values)
    assert torch.equal(plan.meta.view(torch.int32), words)  # (torch refused to view the neg view as uint32)
    assert not plan.b.is_neg() and torch.equal(plan.b, -b)


def test_an_out_that_is_a_neg_view_is_written_through_a_copy():
    values, words, b = _operands()
    base = torch.full((128, 80), 7.0, dtype=torch.float16)
    out = torch._neg_view(base)
    with host_tensors_as_device():
        plan = plan_sparse_matmul(values, words, b, out=out, target="sm_90a")
        plain = plan_sparse_matmul(values, words, b, out=base, target="sm_90a")
    assert plan.out is not out and not plan.out.is_neg()
    assert plain.out is base  # (a plain out is written in place)
    c = torch.randn(128, 80).half()
    with host_tensors_as_device():
        assert arrays.deliver_result(c, out, b) is out
    assert torch.equal(out, c) and torch.equal(base, -c)


def test_a_neg_view_has_no_call_cache_key(monkeypatch):
    monkeypatch.setattr(call_cache, "array_kind", lambda x: "torch")  # as a CUDA tensor would be
    values, words, b = _operands()
    assert call_cache.call_key(values, words, b, None, False, ()) is not None
    for i in range(4):
        args = [values, words, b, torch.empty(128, 80, dtype=torch.float16)]
        args[i] = torch._neg_view(args[i])
        assert call_cache.call_key(*args, False, ()) is None, i
