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


# ------------------------------------------------------------------------------------------------
# the epilogue's vectors and the GPU sparsity toolkit: the plan made as for CUDA tensors, its
# launches run in the interpreter reading each argument as the GPU does (tests/support/gpu_reads.py:
# a neg view's memory, without the negation), against float64 with a poisoned out


def _linear_case(seed: int = 5, n_out: int = 130, t: int = 3, k: int = 96):
    from sparsile.tests.stdlib.test_linear_api import problem as linear_problem

    weight, x = linear_problem("f16", n_out, t, k, seed)
    rng = np.random.default_rng(seed)
    epi = {"bias": torch.from_numpy(rng.standard_normal(n_out).astype(np.float32)),
           "scale_w": torch.from_numpy(rng.uniform(0.5, 2.0, n_out).astype(np.float32)),
           "scale_x": torch.from_numpy(rng.uniform(0.5, 2.0, t).astype(np.float32))}
    values = torch.from_numpy(np.ascontiguousarray(weight.values))
    words = torch.from_numpy(np.array(weight.meta.data).view(np.int32))
    return weight, values, words, torch.from_numpy(x), epi


def _check_linear(y, weight, x, epi) -> None:
    from sparsile.tests.stdlib.test_linear_api import assert_linear_close

    host = {name: v.numpy() for name, v in epi.items()}
    assert_linear_close(y.numpy(), weight, x.numpy(), x.shape[1], "f16", "float16", **host)


@pytest.mark.parametrize("kernel", ["decode", "gemm"])
@pytest.mark.parametrize("which", ["bias", "scale_w", "scale_x"])
def test_bias_and_scales_that_are_neg_views_are_read_with_their_negation(kernel, which):
    """plan_sparse_linear / plan_sparse_decode with a bias or scale that is a neg view: the launches
    read a copy with the negation applied (they read the view's memory, the values before it: the
    bias's sign flipped, y negated by a scale)."""
    from sparsile.stdlib.kernels import plan_sparse_linear
    from sparsile.tests.support.gpu_reads import run_launches

    weight, values, words, x, epi = _linear_case()
    shown = dict(epi, **{which: torch._neg_view(epi[which].neg())})  # (shows epi[which])
    out = torch.full((3, 130), float("nan"), dtype=torch.float16)
    with host_tensors_as_device():
        plan = plan_sparse_linear(values, words, x, out=out, kernel=kernel, target="sm_90a", **shown)
    assert plan.out is out
    run_launches(plan.launches())
    _check_linear(out, weight, x, epi)


def test_a_rebind_to_a_neg_view_scale_x_reads_it_with_its_negation():
    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.tests.support.gpu_reads import run_launches

    weight, values, words, x, epi = _linear_case(seed=6)
    with host_tensors_as_device():
        plan = plan_sparse_decode(values, words, x, **epi)
        out = torch.full((3, 130), float("nan"), dtype=torch.float16)
        again = plan.rebind(x, out, scale_x=torch._neg_view(epi["scale_x"].neg()))
    run_launches(again.launches())
    _check_linear(out, weight, x, epi)


@pytest.fixture
def gpu_toolkit(monkeypatch):
    """The GPU sparsity toolkit on CPU tensors taken for CUDA ones, its launches run in the
    interpreter reading arguments as the GPU does."""
    from sparsile.stdlib.kernels import sparsity_gpu
    from sparsile.tests.support.gpu_reads import GpuReadsModule

    monkeypatch.setattr(sparsity_gpu, "_require_gpu", lambda interpret: None)
    kernels, transposable = sparsity_gpu.kernel_module(), sparsity_gpu.transposable_module()
    monkeypatch.setattr(sparsity_gpu, "kernel_module", lambda: GpuReadsModule(kernels))
    monkeypatch.setattr(sparsity_gpu, "transposable_module", lambda: GpuReadsModule(transposable))
    with host_tensors_as_device():
        yield sparsity_gpu


def test_the_gpu_sparsity_toolkit_reads_a_neg_view_with_its_negation(gpu_toolkit):
    """compress_gpu, prune_gpu, prune_transposable_gpu and decompress_gpu (values and a raw word
    array) on a neg view give what they give on the values it shows (before: torch refused to
    view the neg view as unsigned integers, a RuntimeError from inside)."""
    from sparsile.stdlib import sparsity

    w = torch.from_numpy(np.random.default_rng(7).standard_normal((64, 96)).astype(np.float16))
    shown = torch._neg_view(w.neg())
    values, meta = gpu_toolkit.compress_gpu(shown)
    want_values, indices = sparsity.compress(w.numpy(), "f16", prune=True)
    assert torch.equal(values, torch.from_numpy(want_values))
    assert np.array_equal(meta.to_host().data, sparsity.encode_metadata(indices, "sm90", "f16", k=96).data)
    assert torch.equal(gpu_toolkit.prune_gpu(shown), torch.from_numpy(sparsity.prune(w.numpy(), "f16")))
    assert torch.equal(gpu_toolkit.prune_transposable_gpu(shown),
                       torch.from_numpy(sparsity.prune_transposable_2_4(w.numpy())))
    dense = gpu_toolkit.decompress_gpu(torch._neg_view(values.neg()), meta)
    assert torch.equal(dense, torch.from_numpy(sparsity.prune(w.numpy(), "f16")))
    words = meta.data.view(torch.int32)
    raw = gpu_toolkit.decompress_gpu(values, torch._neg_view(words.neg()), "sm90", "f16", m=64, k=96)
    assert torch.equal(raw, dense)
