"""Sparse training on the GPU (docs/training.md): SemiSparseLinear's forward and gradients against
float64 at realistic sizes, the compressions (compress_gpu) and the re-pruned masks
(prune_transposable_gpu) against the host toolkit, torch.compile with Inductor, 200 training steps
against dense training with the same fixed mask, and 2:4 activation sparsity against float64."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sparsile.stdlib.sparsity import as_host_array, prune_mask_2_4, transposable_mask_2_4
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import DenseMasked, Mlp, bf16, masked_weight, train_pair, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


@pytest.fixture(autouse=True)
def _strict_dense_gemms():
    """Full f32 reductions in cuBLAS's bf16 / f16 GEMMs (the dense dW and the references), so that the
    float64 bounds of an f32 accumulation hold; restored afterwards."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


def _layer(n: int, k: int, param_dtype=torch.float32, dtype="bf16", seed=0, **kwargs):
    return spt.SemiSparseLinear.from_dense(linear(n, k, param_dtype, seed=seed, device="cuda"), dtype, **kwargs)


@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), [(torch.bfloat16, torch.float32, "bf16"),
                                                                (torch.bfloat16, torch.bfloat16, "bf16"),
                                                                (torch.float32, torch.float32, "bf16"),
                                                                (torch.float16, torch.float32, "f16")])
@pytest.mark.parametrize("tokens", [1, 300, 2048])
def test_forward_and_gradients_against_float64(x_dtype, param_dtype, dtype, tokens):
    n, k = 1024, 2048
    layer = _layer(n, k, param_dtype, dtype, seed=tokens)
    compute = layer.values.dtype
    x = torch.randn(tokens, k, device="cuda").to(x_dtype).requires_grad_()
    y = layer(x)
    g = torch.randn_like(y)
    y.backward(g)
    xk, gk, w = x.detach().to(compute).double(), g.to(compute).double(), masked_weight(layer)
    within(y, xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, k, x_dtype)
    within(x.grad, gk @ w, gk.abs() @ w.abs(), n, compute)
    within(layer.weight.grad, (gk.T @ xk) * layer.mask, gk.abs().T @ xk.abs(), tokens, compute)
    assert (layer.weight.grad[~layer.mask] == 0).all()
    within(layer.bias.grad, g.double().sum(0), g.double().abs().sum(0), tokens, param_dtype)


def test_gpu_compressions_are_bit_identical_to_the_host_toolkit():
    layer = _layer(4096, 1024, seed=1)
    host = copy.deepcopy(layer).cpu()
    host.refresh()  # the host toolkit (compress + encode_metadata)
    for name in ("values", "meta", "values_t", "meta_t"):
        a, b = getattr(layer, name).cpu(), getattr(host, name)
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b), name


def test_gpu_reprune_matches_the_host_mask():
    layer = _layer(2048, 2048, seed=2, mask_grad=False)
    with torch.no_grad():  # f16-representable magnitudes: every block sum is exact, so no near ties
        layer.weight.copy_(torch.randn(2048, 2048, device="cuda").half().float())
    changed = layer.reprune()
    expected = transposable_mask_2_4(as_host_array(layer.weight.detach().cpu(), "w"))
    assert np.array_equal(layer.mask.cpu().numpy(), expected)
    assert changed > 0.2
    x = torch.randn(64, 2048, device="cuda").to(torch.bfloat16)
    w, xk = masked_weight(layer), x.double()
    within(layer(x), xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 2048, torch.bfloat16)


def test_trainer_reprunes_on_the_gpu():
    layer = _layer(512, 512, seed=3, mask_grad=False)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    trainer = spt.SparseTrainer(layer, optimizer, reprune_every=5)
    x = torch.randn(256, 512, device="cuda")
    for _ in range(10):
        optimizer.zero_grad()
        layer(x).float().square().mean().backward()
        optimizer.step()
    assert trainer.steps == 10 and len(trainer.changed) == 2
    expected = transposable_mask_2_4(as_host_array(layer.weight.detach().cpu(), "w"))
    agree = (layer.mask.cpu().numpy() == expected).mean()
    assert agree > 0.999  # float32 block sums: near ties may go the other way (docs/sparse-metadata.md §12)


def test_torch_compile_inductor_forward_and_backward():
    layer = _layer(1024, 1024, seed=4)
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(512, 1024, device="cuda").to(torch.bfloat16).requires_grad_()
    y = compiled(x)
    y.float().sum().backward()
    got = y.detach(), x.grad.clone(), layer.weight.grad.clone()
    x.grad = layer.weight.grad = layer.bias.grad = None
    y_eager = layer(x)
    y_eager.float().sum().backward()
    assert torch.equal(got[0], y_eager.detach())
    assert torch.equal(got[1], x.grad)
    torch.testing.assert_close(got[2], layer.weight.grad, rtol=2 ** -7, atol=1e-3)


def test_reduce_overhead_training_builds_its_launch_records_once(monkeypatch):
    """Training under torch.compile(mode="reduce-overhead"): the op's launch records (forward with
    values, backward with values_t) are built in the first steps and reused after, so no record is
    rebuilt inside a CUDA-graph capture and no step re-plans (the op sees the layer's own tensors,
    not per-call aliases)."""
    from sparsile.integrations.torch import _kernels

    built = [0]
    init = _kernels.LaunchRecord.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(_kernels.LaunchRecord, "__init__", counting)
    layer = spt.SemiSparseLinear.from_dense(linear(512, 512, torch.float32, device="cuda", seed=21), "bf16")
    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(16, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(22), requires_grad=True)
    counts = []
    for _ in range(6):
        # a training loop's own step: gradients set to None first (torch's CUDA graph trees refuse to
        # accumulate into a .grad that a previous replay's memory holds; nn.Linear fails the same way)
        layer.zero_grad(set_to_none=True)
        x.grad = None
        torch.compiler.cudagraph_mark_step_begin()
        compiled(x).sum().backward()
        torch.cuda.synchronize()
        counts.append(built[0])
    assert counts[0] > 0 and counts == [counts[0]] * 6, counts  # none built at the recording (step 2) or after


def test_200_steps_equal_dense_training_with_the_same_mask():
    torch.manual_seed(6)  # nn.Linear's own initialization (outputs of order 1)
    a, b = torch.nn.Linear(512, 1024).cuda(), torch.nn.Linear(1024, 256).cuda()
    sparse = Mlp(spt.SemiSparseLinear.from_dense(a, "bf16"), spt.SemiSparseLinear.from_dense(b, "bf16"))
    dense = Mlp(*(DenseMasked(m.weight.detach(), m.bias.detach(), m.mask) for m in (sparse.a, sparse.b)))
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(2048, 512, device="cuda", generator=gen)
    target = x @ (torch.randn(256, 512, device="cuda", generator=gen) / 16).T
    got, ref = (np.array(v) for v in train_pair(sparse, dense, x, target, steps=200, lr=0.3))
    assert np.allclose(got, ref, rtol=2e-2, atol=0), np.abs(got / ref - 1).max()
    assert got[-1] < 0.2 * got[0]


@pytest.mark.parametrize("tokens", [1, 333, 4096])
@pytest.mark.parametrize("bias", [True, False])
def test_activation_sparsity_against_float64(tokens, bias):
    n, k = 1024, 2048
    weight = torch.randn(n, k, device="cuda").to(torch.bfloat16).requires_grad_()
    b = (torch.rand(n, device="cuda") + 0.5).requires_grad_() if bias else None
    x = (torch.relu(torch.randn(tokens, k, device="cuda")) ** 2).to(torch.bfloat16).requires_grad_()
    y = spt.sparse24_activation_linear(x, weight, b)
    g = torch.randn_like(y)
    y.backward(g)
    mask = torch.from_numpy(prune_mask_2_4(as_host_array(x.detach().cpu(), "x"))).cuda()
    assert torch.equal(spt.sparse24_mask(x.detach()), mask)
    xs, w = x.detach().double() * mask, weight.detach().double()
    bd = b.detach().double() if bias else 0
    within(y, xs @ w.T + bd, xs.abs() @ w.abs().T + (bd.abs() if bias else 0), k, torch.bfloat16)
    gk = bf16(g)
    within(x.grad, (gk @ w) * mask, gk.abs() @ w.abs(), n, torch.bfloat16)
    within(weight.grad, gk.T @ xs, gk.abs().T @ xs.abs(), tokens, torch.bfloat16)


def test_refresh_reaches_a_captured_graph_on_padded_shapes():
    """200 x 520 (not multiples of the kernels' tiles): the forward's launch record reads padded
    copies of values. A CUDA graph captures the no-grad forward; after an update of the master
    weight, refresh() re-compresses in place and refreshes those copies (RecordCache.sync), so the
    replay computes with the new weight (the eleventh session's refresh warned instead: replays kept
    the old weight), equal to an eager call and to float64."""
    from sparsile.tests.integrations.torch_helpers import warm_up_on_a_side_stream

    layer = _layer(200, 520, seed=31)
    x = torch.randn(8, 520, device="cuda", generator=torch.Generator("cuda").manual_seed(32)).to(torch.bfloat16)
    with torch.no_grad():
        warm_up_on_a_side_stream(lambda: layer(x))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layer(x)
        graph.replay()
        torch.cuda.synchronize()
        before = static_y.clone()
        layer.weight.mul_(-1.5)
        layer.refresh()
        graph.replay()
        torch.cuda.synchronize()
        replayed = static_y.clone()
        eager = layer(x)
    torch.cuda.synchronize()
    assert not torch.equal(before, replayed)
    assert torch.equal(replayed, eager)
    xk, w = x.double(), masked_weight(layer)
    within(replayed, xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 520, torch.bfloat16)
