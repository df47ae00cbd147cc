"""Sparse training on the CPU (kernels in sparsile's interpreter): SemiSparseLinear's forward and
gradients against float64, the compressions of W and Wᵀ, fixed masks across optimizer steps,
re-pruning, a short training run against dense training with the same mask, torch.compile, and the
SP0916-SP0918 diagnostics. Activation sparsity is in test_torch_activation.py."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.integrations.errors import IntegrationError
from sparsile.stdlib.sparsity import as_host_array, decompress, transposable_mask_2_4
from sparsile.tests.integrations.record_fakes import fake as fake  # (a fixture)
from sparsile.tests.integrations.torch_helpers import linear
from sparsile.tests.integrations.training_helpers import DenseMasked, Mlp, bf16, masked_weight, train_pair, within

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

@pytest.mark.parametrize(("x_dtype", "param_dtype", "bias"), [(torch.float32, torch.float32, True),
                                                               (torch.bfloat16, torch.bfloat16, True),
                                                               (torch.float32, torch.float32, False)])
def test_forward_and_gradients_against_float64(x_dtype, param_dtype, bias):
    layer = spt.SparseLinear.from_dense(linear(48, 64, param_dtype, bias=bias, seed=1), "bf16", trainable=True)
    assert isinstance(layer, spt.SemiSparseLinear) and layer.weight.dtype == param_dtype
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 64, generator=gen).to(x_dtype).requires_grad_()
    y = layer(x)
    g = torch.randn(y.shape, generator=gen).to(y.dtype)
    y.backward(g)
    xk, gk, w = bf16(x).reshape(6, 64), bf16(g).reshape(6, 48), masked_weight(layer)
    ref = xk @ w.T + (layer.bias.detach().double() if bias else 0)
    assert y.dtype == x_dtype
    within(y.reshape(6, 48), ref, xk.abs() @ w.abs().T, 64, x_dtype)
    within(x.grad.reshape(6, 64), gk @ w, gk.abs() @ w.abs(), 48, torch.bfloat16)  # dX in the compute dtype
    dw = (gk.T @ xk) * layer.mask
    within(layer.weight.grad, dw, (gk.abs().T @ xk.abs()), 6, torch.bfloat16)
    assert layer.weight.grad.dtype == param_dtype
    assert (layer.weight.grad[~layer.mask] == 0).all()  # dW is masked: pruned weights get no gradient
    if bias:
        within(layer.bias.grad, g.double().reshape(6, 48).sum(0), g.double().abs().reshape(6, 48).sum(0), 6,
               param_dtype)


def test_straight_through_gradient_is_not_masked():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=3), "bf16", mask_grad=False)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    layer(x).sum().backward()
    xk = bf16(x)
    dw = torch.ones(5, 32, dtype=torch.float64).T @ xk
    within(layer.weight.grad, dw, dw.abs(), 5, torch.bfloat16)
    assert (layer.weight.grad[~layer.mask] != 0).any()


def test_compressions_of_w_and_w_transposed_round_trip():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 48, torch.float32, seed=5), "bf16")
    mask = layer.mask.numpy()
    assert (mask.reshape(32, 12, 4).sum(-1) == 2).all() and (mask.T.reshape(48, 8, 4).sum(-1) == 2).all()
    assert np.array_equal(mask, transposable_mask_2_4(layer.weight.detach().numpy()))
    dense = layer.weight.detach().to(torch.bfloat16) * layer.mask
    words = layer.meta.numpy().view(np.uint32)
    words_t = layer.meta_t.numpy().view(np.uint32)
    w = decompress(as_host_array(layer.values), words, "sm90", "bf16", m=32, k=48)
    w_t = decompress(as_host_array(layer.values_t), words_t, "sm90", "bf16", m=48, k=32)
    assert np.array_equal(w.astype(np.float32), dense.float().numpy())
    assert np.array_equal(w_t.astype(np.float32), dense.float().numpy().T)
    before = {n: getattr(layer, n).clone() for n in ("values", "meta", "values_t", "meta_t")}
    pointers = {n: getattr(layer, n).data_ptr() for n in before}
    layer.refresh(interpret=True)  # compress_gpu's kernel in the interpreter: bit-identical to the host
    for name, old in before.items():
        now = getattr(layer, name)
        assert torch.equal(now.view(torch.int16) if now.dtype == torch.bfloat16 else now,
                           old.view(torch.int16) if old.dtype == torch.bfloat16 else old), name
        assert now.data_ptr() == pointers[name]  # rebuilt in place


def test_gpu_mask_kernel_in_the_interpreter_matches_the_host_even_with_zeros():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(6))
    w[torch.rand(16, 32, generator=torch.Generator().manual_seed(7)) < 0.6] = 0.0  # many zeros
    host = spt.transposable_mask(w)
    kernel = spt.transposable_mask(w, interpret=True)
    for mask in (host, kernel):
        assert (mask.reshape(16, 8, 4).sum(-1) == 2).all() and (mask.T.reshape(32, 4, 4).sum(-1) == 2).all()
    kept = (w.abs() * host).sum(), (w.abs() * kernel).sum()
    assert torch.equal(kept[0], kept[1])  # the same (best) kept magnitude; zeros may sit elsewhere
    dense = torch.randn(16, 32, generator=torch.Generator().manual_seed(8))
    assert torch.equal(spt.transposable_mask(dense), spt.transposable_mask(dense, interpret=True))


def _sgd_step(layer, x, optimizer) -> None:
    optimizer.zero_grad()
    (layer(x).float() ** 2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_mask_stays_fixed_and_compressions_follow_the_optimizer(opt):
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=9), "bf16")
    mask0, pruned0 = layer.mask.clone(), layer.weight.detach()[~layer.mask].clone()
    optimizer = (torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9) if opt == "sgd"
                 else torch.optim.AdamW(layer.parameters(), lr=0.01, weight_decay=0.0))
    trainer = spt.SparseTrainer(layer, optimizer)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10))
    for step in range(3):
        before = layer.weight.detach().clone()
        _sgd_step(layer, x, optimizer)
        assert trainer.steps == step + 1
        assert not torch.equal(layer.weight.detach(), before)
        assert torch.equal(layer.mask, mask0)
        assert torch.equal(layer.weight.detach()[~layer.mask], pruned0)  # masked gradients: untouched
        words = layer.meta.numpy().view(np.uint32)
        w = decompress(as_host_array(layer.values), words, "sm90", "bf16", m=32, k=32).astype(np.float32)
        assert np.array_equal(w, (layer.weight.detach().to(torch.bfloat16) * layer.mask).float().numpy())
    trainer.remove()
    _sgd_step(layer, x, optimizer)
    assert trainer.steps == 3


def test_forward_refreshes_a_stale_compression_by_itself():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=11), "bf16")
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # no trainer, no refresh(): the version counter tells
    w = masked_weight(layer)
    xk = bf16(x)
    within(layer(x), xk @ w.T + layer.bias.double(), xk.abs() @ w.abs().T, 32, torch.float32)


@pytest.mark.parametrize("how", ["alone", "trainer", "deepcopy"])
@pytest.mark.parametrize("opt", ["adamw", "sgd", "adagrad"])
def test_a_fused_optimizer_step_is_seen_without_a_version_bump(opt, how):
    """torch's fused optimizers (``fused=True``: HF Trainer's default ``adamw_torch_fused``) write the
    parameters without bumping their version counters, so the forward's safety net did not see the
    step: the next forward computed with the compressions of the weight before it (0.8 off here).
    With a SparseTrainer the step is compressed once (its hook), not again at the next call."""
    import copy

    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=11), "bf16")
    if how == "deepcopy":
        layer = copy.deepcopy(layer)
    make = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[opt]
    optimizer = make(layer.parameters(), lr=0.05, fused=True)
    trainer = spt.SparseTrainer(layer, optimizer) if how == "trainer" else None
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(12))
    xk = bf16(x)
    for _ in range(2):
        version = layer.weight._version
        before = layer.weight.detach().clone()
        _sgd_step(layer, x, optimizer)
        assert layer.weight._version == version and not torch.equal(layer.weight.detach(), before)  # (the premise)
        assert (layer.__dict__["_fresh"] is not None) == (trainer is not None)  # (the trainer's refresh stands)
        w = masked_weight(layer)
        within(layer(x), xk @ w.T + layer.bias.double(), xk.abs() @ w.abs().T, 32, torch.float32)
    if trainer is not None:
        trainer.remove()


def test_reprune_every_n_steps_recomputes_the_transposable_mask():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=13), "bf16", mask_grad=False)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)  # the steps change nothing; we move the weight
    trainer = spt.SparseTrainer(layer, optimizer, reprune_every=2)
    mask0 = layer.mask.clone()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        layer.weight.copy_(torch.randn(32, 32, generator=torch.Generator().manual_seed(15)))
    _sgd_step(layer, x, optimizer)
    assert torch.equal(layer.mask, mask0) and trainer.changed == []  # step 1: re-compressed only
    _sgd_step(layer, x, optimizer)
    expected = torch.from_numpy(transposable_mask_2_4(layer.weight.detach().numpy()))
    assert torch.equal(layer.mask, expected)
    assert trainer.changed == [pytest.approx((expected != mask0).float().mean().item())]
    assert trainer.changed[0] > 0.2
    w = masked_weight(layer)
    xk = bf16(x)
    within(layer(x), xk @ w.T + layer.bias.double(), xk.abs() @ w.abs().T, 32, torch.float32)
    assert spt.reprune_(layer) == 0.0 and spt.recompress_(torch.nn.Sequential(layer)) == 1


def test_training_losses_equal_dense_training_with_the_same_mask():
    gen = torch.Generator().manual_seed(16)
    sparse = Mlp(spt.SemiSparseLinear.from_dense(linear(32, 64, torch.float32, seed=17), "bf16"),
                 spt.SemiSparseLinear.from_dense(linear(16, 32, torch.float32, seed=18), "bf16"))
    dense = Mlp(*(DenseMasked(m.weight.detach(), m.bias.detach(), m.mask) for m in (sparse.a, sparse.b)))
    x = torch.randn(32, 64, generator=gen)
    target = x @ (torch.randn(16, 64, generator=gen) / 8).T
    got, ref = (np.array(v) for v in train_pair(sparse, dense, x, target, steps=12, lr=0.05))
    assert np.allclose(got, ref, rtol=1e-2, atol=0), np.stack([got, ref])  # measured: 0.4 %
    assert got[-1] < 0.5 * got[0]  # it learns
    assert torch.equal(sparse.a.mask, dense.a.mask)


def test_torch_compile_traces_forward_and_backward():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=19), "bf16")
    graphs = []

    def backend(gm, inputs):
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        graphs.append(gm)
        boxed = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
        return aot_autograd(fw_compiler=boxed, bw_compiler=boxed)(gm, inputs)

    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(20)).requires_grad_()
    y = compiled(x)
    y.sum().backward()
    grads = x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()
    x.grad = layer.weight.grad = layer.bias.grad = None
    y_eager = layer(x)
    y_eager.sum().backward()
    assert torch.equal(y, y_eager)
    for a, b in zip(grads, (x.grad, layer.weight.grad, layer.bias.grad), strict=True):
        assert torch.equal(a, b)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("sparse_linear_train" in t for t in targets)


def test_state_dict_round_trip_and_inference_conversion():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 48, torch.float32, seed=21), "bf16")
    other = spt.SemiSparseLinear(48, 32)
    other.load_state_dict(layer.state_dict())
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(22))
    assert torch.equal(other(x), layer(x))
    inference = layer.to_sparse_linear()
    assert isinstance(inference, spt.SparseLinear)
    assert torch.equal(inference.to_dense(), layer.to_dense().to(torch.bfloat16).float())
    layer.to(torch.float64)  # the master weight converts; the compressions keep the compute dtype
    assert layer.weight.dtype == torch.float64 and layer.values.dtype == torch.bfloat16
    assert layer.mask.dtype == torch.bool and layer.meta.dtype == torch.int32


@pytest.mark.parametrize(("name", "dtype"), [("values", torch.float32), ("values_t", torch.float32),
                                           ("values", torch.float16), ("values_t", torch.float64),
                                           ("meta", torch.int64), ("meta_t", torch.int64), ("mask", torch.uint8)])
def test_assigned_compressions_of_another_type_keep_the_layer_s_types(name, dtype):
    """``load_state_dict(assign=True)`` assigned the state dict's tensors as they were, where a copy
    casts them: float32 values (or values_t) left the bf16 compressions float32 (the refresh then
    raised ValueError from copy_all, the layer half loaded), f16 values made a bf16 layer compute in
    f16, int64 metadata was SP0806 at the next call, a uint8 mask SP0918 after it was assigned (the
    check before the load casts it to bool, as a copy does). The compressions and the mask take the
    layer's types, as SparseLinear's buffers do, so both loads give the same layer; the master weight
    and bias keep the state dict's (torch's assign; any float type, as ``.to(dtype)`` gives them)."""
    saved = spt.SemiSparseLinear.from_dense(linear(32, 48, torch.float32, seed=23), "bf16")
    state = {key: t.to(dtype) if key == name else t for key, t in saved.state_dict().items()}
    state["weight"], state["bias"] = state["weight"].double(), state["bias"].double()
    copied, assigned = spt.SemiSparseLinear(48, 32), spt.SemiSparseLinear(48, 32)
    copied.load_state_dict(state)
    assigned.load_state_dict(state, assign=True)
    for key in ("values", "meta", "values_t", "meta_t", "mask"):
        assert getattr(assigned, key).dtype == getattr(copied, key).dtype == getattr(saved, key).dtype
        assert torch.equal(getattr(assigned, key), getattr(saved, key))
    assert assigned.weight.dtype == assigned.bias.dtype == torch.float64 and copied.weight.dtype == torch.float32
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(24))
    ys = []
    for layer in (assigned, copied):
        xg = x.clone().requires_grad_()
        y = layer(xg)
        y.backward(torch.ones_like(y))
        xk, w = bf16(x), masked_weight(layer)
        within(y, xk @ w.T + layer.bias.double(), xk.abs() @ w.abs().T, 48, torch.float32)
        within(xg.grad, torch.ones(3, 32, dtype=torch.float64) @ w, torch.ones(3, 32, dtype=torch.float64) @ w.abs(),
               32, torch.bfloat16)
        ys.append((y.detach(), xg.grad))
    assert torch.equal(ys[0][1], ys[1][1])  # dX: the same compressed Wᵀ
    assert torch.equal(assigned.to_sparse_linear().to_dense(), copied.to_sparse_linear().to_dense())


def test_sparsify_trainable_swaps_semi_sparse_layers():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                                torch.nn.Linear(16, 24))
    report = spt.sparsify_(model, dtype="bf16", interpret=True, min_features=16, trainable=True)
    assert report.swapped == ["0", "2"]
    assert report.skipped == {"3": "out_features = 24 is not a multiple of 16 (bf16): the input gradient's kernel "
                                   "would copy and pad dY on every call"}
    assert all(isinstance(model[i], spt.SemiSparseLinear) for i in (0, 2))


# ------------------------------------------------------------------------------------------------
# diagnostics


def _raises(code: str, message: str, fn, *args, **kwargs) -> IntegrationError:
    with pytest.raises(IntegrationError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code and message in info.value.message, (info.value.code, info.value.message)
    return info.value


def test_sp0916_f16_training_of_weights_beyond_the_f16_range():
    """A trainable f16 layer of a bf16 / f32 linear with weights beyond ±65504: its compressions would
    hold inf (SparseLinear.from_dense refuses the same, SP0902); bf16 takes them."""
    dense = linear(32, 32, torch.bfloat16)
    with torch.no_grad():
        dense.weight[3, 5] = 1e5
        dense.weight[7, 1] = -7e4
    _raises("SP0916", "2 weights lie beyond ±65504, the largest finite float16: as f16 they would be inf",
            spt.SemiSparseLinear.from_dense, dense, "f16")
    layer = spt.SemiSparseLinear.from_dense(dense, "bf16")
    assert torch.isfinite(layer.values.float()).all()


def test_sp0916_layers_that_cannot_be_trained():
    dense = linear(32, 32, torch.bfloat16)
    _raises("SP0916", "sparse training computes in bf16 or f16, not e4m3",
            spt.SparseLinear.from_dense, dense, "e4m3", trainable=True)
    _raises("SP0916", "a trainable sparse layer fuses no activation or out_dtype",
            spt.SparseLinear.from_dense, dense, activation="relu", trainable=True)
    _raises("SP0916", "from_dense takes an nn.Linear, got ReLU", spt.SemiSparseLinear.from_dense, torch.nn.ReLU())
    _raises("SP0916", "a SemiSparseLinear needs positive in/out features, got 0 x 4", spt.SemiSparseLinear, 0, 4)
    _raises("SP0916", "the linear's weight is on the meta device (no values)", spt.SemiSparseLinear.from_dense,
            torch.nn.Linear(8, 8, device="meta"), "bf16")
    _raises("SP0903", "the linear's weight dtype torch.float32 has no 2:4 sparse linear kernel",
            spt.SemiSparseLinear.from_dense, linear(32, 32, torch.float32))


def test_sp0917_trainer_arguments():
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32), "bf16")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    _raises("SP0917", "the Sequential has no SemiSparseLinear layer", spt.SparseTrainer,
            torch.nn.Sequential(torch.nn.Linear(4, 4)), optimizer)
    _raises("SP0917", "reprune_every must be a positive integer or None, got 0", spt.SparseTrainer, layer,
            optimizer, reprune_every=0)
    _raises("SP0917", "expected a torch.optim.Optimizer, got list", spt.SparseTrainer, layer, [])
    _raises("SP0917", "expected an nn.Module, got str", spt.recompress_, "model")


def test_sp0918_a_loaded_mask_that_is_not_transposable():
    layer = spt.SemiSparseLinear.from_dense(linear(8, 8, torch.float32), "bf16")
    state = layer.state_dict()
    state["mask"] = state["mask"].clone()
    state["mask"][:, 0] = True  # column 0 keeps 8 of 8
    _raises("SP0918", "the mask keeps 3 elements of row", spt.SemiSparseLinear(8, 8).load_state_dict, state)
    state["mask"] = torch.zeros(8, 8, dtype=torch.bool)
    state["mask"][:, :2] = True  # every row keeps 2 of 4, but columns 0 and 1 keep all of theirs
    err = _raises("SP0918", "the mask keeps 4 elements of column 0, group 0 (0..3)",
                  spt.SemiSparseLinear(8, 8).load_state_dict, state)
    assert "at most 2 of every 4 along rows and columns" in err.message
    _raises("SP0918", "the mask must be a bool tensor of shape (8, 8), got torch.float32 (8, 8)",
            spt.training.check_mask, torch.zeros(8, 8), (8, 8))


def test_sp0901_bad_input():
    layer = spt.SemiSparseLinear.from_dense(linear(16, 32, torch.float32), "bf16")
    _raises("SP0901", "x has shape (2, 31); this layer takes (..., 32)", layer, torch.ones(2, 31))
    _raises("SP0901", "x has dtype torch.int64", layer, torch.ones(2, 32, dtype=torch.int64))


# ------------------------------------------------------------------------------------------------
# benchmarks/bench_training.py (its GPU run is the lead's): arguments, the no-GPU message, the table


def _bench_script():
    from sparsile.tests.support import load_script

    return load_script("benchmarks/bench_training.py", "bench_script_training")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed without a GPU")
def test_bench_training_without_gpu_says_why(capsys):
    bench = _bench_script()
    assert bench.main(["--tokens", "64"]) == 2
    assert "bench_training needs an NVIDIA GPU" in capsys.readouterr().err


def test_bench_training_arguments_and_table():
    bench = _bench_script()
    args = bench.parse_args([])
    assert (args.tokens, args.hidden, args.intermediate) == (8192, 4096, 14336)
    result = {"rows": {"dense fwd": 100.0, "2:4 fwd": 80.0, "dense fwd+bwd": 300.0, "2:4 fwd+bwd": 250.0,
                       "refresh": 20.0, "reprune": "RuntimeError: boom"}, "errors": {"y": 1e-3, "dx": 2e-3}}
    text = bench.table(result)
    assert "| 2:4 fwd | 80 | 1.25x |" in text and "| 2:4 fwd+bwd | 250 | 1.20x |" in text
    assert "| refresh | 20 | |" in text and "| reprune | RuntimeError: boom | |" in text
    assert "| dense fwd | 100 | |" in text and "dX 2.00e-03" in text


def test_opcheck_of_the_training_and_activation_ops():
    """torch.library.opcheck: schema, autograd registration, fake tensors and AOT dispatch of
    sparsile::sparse_linear_train and sparsile::sparse24_linear."""
    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32), "bf16")
    x = torch.randn(4, 32).to(torch.bfloat16).requires_grad_()
    args = (x, layer.weight, layer.mask, layer.values, layer.meta, layer.values_t, layer.meta_t, layer.bias)
    result = torch.library.opcheck(torch.ops.sparsile.sparse_linear_train.default, args, {"out_dtype": torch.float32})
    assert set(result.values()) == {"SUCCESS"}, result
    w = torch.randn(8, 32).to(torch.bfloat16).requires_grad_()
    b = torch.randn(8, requires_grad=True)
    result = torch.library.opcheck(torch.ops.sparsile.sparse24_linear.default, (x, w, b), {"out_dtype": torch.bfloat16})
    assert set(result.values()) == {"SUCCESS"}, result


def test_refresh_brings_captured_padded_copies_up_to_date(fake, monkeypatch):
    """refresh() writes the compressions in place and then syncs the launch records of both (the
    layer's and the custom op's): a record a CUDA graph captured, whose plan reads padded copies of
    the weight, has them refreshed at once (the graph replays the new weight), without a warning.
    Only a captured record whose copies cannot be refreshed gets one."""
    import warnings

    from sparsile.integrations.torch import _kernels, ops, training
    from sparsile.integrations.torch.record_cache import RecordCache

    layer = spt.SemiSparseLinear(40, 24)  # 40 and 24: not multiples of the kernels' tiles
    with torch.no_grad():
        layer.weight.copy_(torch.randn(24, 40))
    layer.reprune()  # a mask that keeps half the weight (a new layer's keeps nothing: refresh writes zeros)
    training_cache, op_cache = RecordCache(), RecordCache()
    monkeypatch.setattr(training, "_RECORDS", training_cache)
    monkeypatch.setattr(ops, "RECORDS", op_cache)
    x = torch.randn(4, 40)
    for cache, values, meta in ((training_cache, layer.values, layer.meta), (op_cache, layer.values_t, layer.meta_t)):
        cache.run((4,), x, _kernels.Weight(values, meta, None, None, None), None, torch.float32, stream=11)
    records = [*training_cache.records.values(), *op_cache.records.values()]
    for record in records:
        record.captured = True
    before = (layer.values.clone(), layer.values_t.clone())
    with torch.no_grad():
        layer.weight.copy_(torch.randn(24, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer.refresh()
    for record, values, old in zip(records, (layer.values, layer.values_t), before, strict=True):
        (operands,) = record.operands
        assert not torch.equal(values, old)  # the refresh wrote a new compression
        assert torch.equal(operands[0], values) and operands[0].data_ptr() != values.data_ptr()
    fake.lists_operands = False  # copies that cannot be refreshed
    cache = RecordCache()
    monkeypatch.setattr(training, "_RECORDS", cache)
    cache.run((4,), x, _kernels.Weight(layer.values, layer.meta, None, None, None), None, torch.float32, stream=11)
    next(iter(cache.records.values())).captured = True
    # that record, and the op's captured record of values_t (its new plan lists no operands either)
    with pytest.warns(UserWarning, match=r"SemiSparseLinear\(40, 24\)\.refresh: 2 launch record\(s\) captured"):
        layer.refresh()


def test_sp0918_a_mask_edited_by_hand_before_the_next_compression():
    """A mask edited in place or assigned is checked before it is compressed: a mask keeping more
    than 2 of 4 was compressed by pruning W's rows and Wᵀ's rows (W's columns) by magnitude, so the
    forward and dX silently used two different weights, neither weight * mask."""
    layer = spt.SemiSparseLinear.from_dense(linear(16, 32, torch.float32, seed=6), "bf16")
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(7))
    layer(x)
    good = layer.mask.clone()
    layer.mask.fill_(True)
    _raises("SP0918", "the mask keeps 4 elements of row 0, group 0 (0..3)", layer, x)
    _raises("SP0918", "the mask keeps 4 elements of row 0", layer.refresh)
    rows_only = torch.zeros(16, 32, dtype=torch.bool)
    rows_only[:, 0::4] = rows_only[:, 1::4] = True  # 2:4 along rows, 16 of 16 along columns 0 and 1
    layer.mask = rows_only
    _raises("SP0918", "the mask keeps 4 elements of column 0, group 0 (0..3)", layer, x)
    layer.mask = good.clone()
    xk, w = bf16(x), masked_weight(layer)
    within(layer(x), xk @ w.T + layer.bias.detach().double(), xk.abs() @ w.abs().T, 32, torch.float32)


def test_sp0916_a_second_derivative_through_the_input_gradient():
    """create_graph=True, then a backward through dX: dX comes from the compressed weight, so the
    graph lacked its dependence on the master weight (weight.grad silently missed that term); it is
    refused when the second backward reaches it. With the weight frozen, dX = dY @ (W·M) is linear
    in dY and the second derivative is exact (against float64)."""
    layer = spt.SemiSparseLinear.from_dense(linear(16, 32, torch.float32, seed=8), "bf16")
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(9), requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    _raises("SP0916", "a trainable sparse layer has no second derivative through x's gradient",
            gx.pow(2).sum().backward)
    layer(x).sum().backward()  # first derivatives are unaffected
    assert layer.weight.grad is not None and x.grad is not None
    layer.weight.requires_grad_(False)
    x.grad = None
    (gx,) = torch.autograd.grad(layer(x).pow(2).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    w = masked_weight(layer)
    xr = bf16(x).requires_grad_()
    (gr,) = torch.autograd.grad((xr @ w.T + layer.bias.detach().double()).pow(2).sum(), xr, create_graph=True)
    gr.pow(2).sum().backward()
    assert x.grad.shape == xr.grad.shape
    assert (x.grad.double() - xr.grad).abs().max() <= 0.05 * xr.grad.abs().max()  # bf16 GEMMs, four deep
