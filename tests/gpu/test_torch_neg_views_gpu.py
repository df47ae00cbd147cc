"""CUDA tensors with torch's negative bit (``torch._neg_view(x)``: the memory holds the values before
the negation) on the GPU paths that take torch tensors: SparseLinear's eager call (after a plain call
of the same shape filed its fast path), sparse_matmul (after a plain call filed its call-cache entry),
and kernel[grid], which refuses one (SP0751). Each neg-view result equals the result of the same call
on a plain tensor holding the negated values, bit for bit; outputs poisoned first."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.integrations.torch_helpers import linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("tokens", [1, 16, 100])
def test_the_layer_computes_on_a_neg_views_negated_values(dtype, tokens):
    layer = spt.SparseLinear.from_dense(linear(256, 512, bias=True, seed=3, device="cuda"), dtype)
    x = torch.randn(tokens, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(tokens))
    x = x.to(torch.bfloat16)
    plain = layer(x).clone()
    assert torch.equal(layer(x), plain)  # the second call of the shape: its fast path
    negated = layer(torch._neg_view(x))
    want = layer(x.neg())
    assert not torch.equal(negated, plain)
    assert torch.equal(negated, want)
    assert torch.equal(layer(x), plain)  # and the plain call after it


def test_sparse_matmul_computes_on_a_neg_views_negated_values():
    from sparsile.stdlib.kernels import sparse_matmul
    from sparsile.tests.stdlib.test_gemm_api import problem

    weight, b = problem("f16", 256, 64, 128, 5)
    values = torch.from_numpy(np.ascontiguousarray(weight.values)).cuda()
    meta = torch.from_numpy(np.array(weight.meta.data).view(np.int32)).cuda()
    bt = torch.from_numpy(b).cuda()
    plain = sparse_matmul(values, meta, bt, dtype="f16").clone()
    assert torch.equal(sparse_matmul(values, meta, bt, dtype="f16"), plain)  # replayed from the call cache
    got = sparse_matmul(values, meta, torch._neg_view(bt), dtype="f16")
    want = sparse_matmul(values, meta, bt.neg(), dtype="f16")
    assert torch.equal(got, want) and not torch.equal(got, plain)
    out = torch._neg_view(torch.full_like(plain, float("nan")))
    sparse_matmul(values, meta, bt, dtype="f16", out=out)
    assert torch.equal(out, plain)  # an out that is a neg view shows C


def test_kernel_grid_refuses_a_cuda_neg_view():
    import sparsile as sp
    from sparsile.frontend.diagnostics import LaunchError

    @sp.jit
    def add(X: sp.ptr[sp.f32], Y: sp.ptr[sp.f32], O: sp.ptr[sp.f32], n: sp.i32):
        offs = sp.program_id(0) * 128 + sp.arange(0, 128)
        m = offs < n
        sp.store(O + offs, sp.load(X + offs, mask=m) + sp.load(Y + offs, mask=m), mask=m)

    x, y = torch.randn(200, device="cuda"), torch.randn(200, device="cuda")
    o = torch.full_like(x, float("nan"))
    add[(2,)](x, y, o, 200)
    assert torch.equal(o, x + y)
    with pytest.raises(LaunchError) as e:
        add[(2,)](torch._neg_view(x), y, o, 200)
    assert e.value.code == "SP0751"
