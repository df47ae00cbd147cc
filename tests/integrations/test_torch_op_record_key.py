"""The launch-record key of ``torch.ops.sparsile.sparse_linear`` on CUDA (integrations/torch/ops.py
``record_key``) and the scale_x the op hands to a record: a record's plan is specialized on the
scale modes and x's (T, K), and its prepared (or native) launch takes only x, y and scale_x's
address per call, so two calls that differ in any of them must not share a record. Shown on the
CPU with the stand-in plan and fake driver of test_torch_native.py; the numbers on the H200:
tests/gpu/test_torch_linear_gpu.py ``test_op_per_tensor_then_per_token_scale``. And the owner of
a record (the RecordCache drops it when the ``values`` tensor object the op was given is
collected): the layer's own buffer in the forward and the backward, eager and through AOTAutograd,
not an alias made per call (which would rebuild the record on every call, inside a CUDA graph
capture too)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import ops  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import copy_of_values, counting_plans  # noqa: E402
from sparsile.tests.integrations.test_torch_native import fake as fake  # noqa: E402 (a fixture)

N, K, T = 16, 64, 4
E4M3 = torch.float8_e4m3fn


def _weight() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    values = torch.zeros(N, K // 2, dtype=E4M3)
    meta = torch.zeros(ops._sm90_meta_shape("e4m3", N, K), dtype=torch.int32)
    return values, meta, torch.ones(N)


def _key(x: torch.Tensor, scale_x: torch.Tensor | None, scale_w: torch.Tensor, values, meta) -> tuple:
    return ops.record_key(x, values, meta, None, scale_x, scale_w, torch.bfloat16, None)


def test_the_key_tells_apart_what_a_record_is_specialized_on() -> None:
    values, meta, scale_w = _weight()
    x = torch.zeros(T, K, dtype=E4M3)
    base = _key(x, torch.ones(T), scale_w, values, meta)
    assert _key(torch.ones(T, K, dtype=E4M3), torch.full((T,), 2.0), scale_w, values, meta) == base  # per call
    assert _key(x, torch.ones(1), scale_w, values, meta) != base  # per-tensor vs per-token scale_x
    assert _key(x, torch.ones(T, dtype=torch.bfloat16), scale_w, values, meta) != base  # converted by the plan
    assert _key(x, torch.ones(T), scale_w[:1], values, meta) != base  # per-tensor scale_w at the same address
    assert _key(torch.zeros(T, K - 2, dtype=E4M3), torch.ones(T), scale_w, values, meta) != base  # another K


def test_the_key_tells_apart_weight_tensors_of_another_dtype_or_strides_at_one_address() -> None:
    """The caching allocator hands freed memory out again: a bias of another dtype, or a view of
    the same memory with other strides, can stand at the address an earlier record was planned for."""
    values, meta, scale_w = _weight()
    x, sx = torch.zeros(T, K, dtype=E4M3), torch.ones(T)
    memory = torch.zeros(N, dtype=torch.float32)

    def key(bias: torch.Tensor | None, vals: torch.Tensor = values) -> tuple:
        return ops.record_key(x, vals, meta, bias, sx, scale_w, torch.bfloat16, None)

    assert key(memory) == key(memory.view(torch.float32))
    assert key(memory.view(torch.int32)) != key(memory)  # one address, another dtype
    assert key(memory.view(torch.bfloat16)[:N]) != key(memory)
    square = torch.zeros(K // 2, K // 2, dtype=E4M3)
    assert key(None, square) != key(None, square.t())  # one address and shape, other strides


def test_per_tensor_then_per_token_scale_get_their_own_records(fake) -> None:
    """Through the record cache as the op uses it: the record built for a per-tensor scale_x is
    not replayed with a per-token one (it planned a kernel that reads scale_x[0] for every token)."""
    values, meta, scale_w = _weight()
    w = kernels.Weight(values, meta, None, scale_w, None)
    cache, x = RecordCache(), torch.zeros(T, K, dtype=E4M3)
    one, per_token = torch.ones(1), torch.ones(T)
    cache.run(_key(x, one, scale_w, values, meta), x, w, one, torch.bfloat16, stream=7)
    cache.run(_key(x, per_token, scale_w, values, meta), x, w, per_token, torch.bfloat16, stream=7)
    assert [e[0] for e in fake.log].count("record") == 2 and len(cache) == 2
    assert [launch[5][2] for launch in fake.launches] == [one.data_ptr().to_bytes(8, "little"),
                                                          per_token.data_ptr().to_bytes(8, "little")]


@pytest.mark.parametrize("scale_x", [torch.tensor(0.5), torch.full((T, 2), 0.5)[:, 0]], ids=["0-d", "strided"])
def test_scale_x_reaches_the_record_1d_and_contiguous(scale_x: torch.Tensor, monkeypatch) -> None:
    """A 0-d scale (quantize_per_token_e4m3 of a 1-D x returns one) would reach a prepared launch
    prepared for the plan's 1-D scale (a rank error), and a strided per-token column the kernel that
    reads scale_x[t] at unit stride: the op passes every scale 1-D and contiguous."""
    values, meta, scale_w = _weight()
    got: list[torch.Tensor] = []
    monkeypatch.setattr(ops, "run_interpreted", lambda x2, w, sx, out: (got.append(sx), torch.zeros(x2.shape[0], N))[1])
    x = torch.zeros(K, dtype=E4M3) if scale_x.dim() == 0 else torch.zeros(T, K, dtype=E4M3)
    ops.sparse_linear(x, values, meta, None, scale_x, scale_w, out_dtype=torch.bfloat16)
    (sx,) = got
    assert sx.dim() == 1 and sx.is_contiguous() and torch.equal(sx, scale_x.reshape(-1))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "aot_eager"])
def test_the_ops_get_the_layer_s_own_weight_tensors(compiled: bool, monkeypatch) -> None:
    from sparsile import torch as spt
    from sparsile.integrations.torch import training
    from sparsile.tests.integrations.torch_helpers import linear

    layer = spt.SemiSparseLinear.from_dense(linear(32, 32, torch.float32, seed=3), "bf16")
    seen: list[tuple[str, torch.Tensor]] = []
    for module, where in ((training, "forward"), (ops, "backward")):
        run = module.run_interpreted
        monkeypatch.setattr(module, "run_interpreted",
                            lambda x2, w, sx, out, run=run, where=where: (seen.append((where, w.values)),
                                                                          run(x2, w, sx, out))[1])
    model = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
    x = torch.randn(4, 32, requires_grad=True)
    for _ in range(2):
        model(x).sum().backward()
    assert [where for where, _ in seen] == ["forward", "backward"] * 2
    assert all(v is (layer.values if where == "forward" else layer.values_t) for where, v in seen)


def _bf16_weight() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    values = torch.randn(N, K // 2, generator=gen).to(torch.bfloat16)
    meta = torch.zeros(ops._sm90_meta_shape("bf16", N, K), dtype=torch.int32)
    return values, meta, torch.randn(N, generator=gen)


def test_a_neg_view_weight_given_to_the_op_keeps_its_launch_record(fake, monkeypatch) -> None:
    """torch's dispatcher hands an op's kernel a neg-view argument (``torch._neg_view(t)``) as a new
    resolved copy each call (its Negative fallback), so the op's record, keyed on the weight's
    memory and owned by the values tensor it was given, was planned again on every call. The op
    resolves a weight's neg view once per memory (integrations/torch/neg_weights.py), refreshing that copy in place
    after an in-place write of the memory: one record, brought up to the write as for any weight;
    a fresh view of the same memory each call (``z.conj().imag`` style) shares it."""
    planned = counting_plans(monkeypatch)
    cache = RecordCache()
    monkeypatch.setattr(ops, "RECORDS", cache)
    monkeypatch.setattr(ops, "run_interpreted", lambda x2, w, sx, out: ops.run_record(x2, w, sx, out, stream=11))
    values, meta, bias = _bf16_weight()
    x = torch.randn(T, K).to(torch.bfloat16)
    shown_values, shown_bias = torch._neg_view(values), torch._neg_view(bias)
    for _ in range(3):
        torch.ops.sparsile.sparse_linear(x, shown_values, meta, shown_bias)
    assert len(planned) == 1 and len(cache) == 1
    (record,) = cache.records.values()
    assert torch.equal(planned[0], -values) and torch.equal(record.weight.bias, -bias)
    values.add_(1.0)  # a write of the memory the views show: the record's copies follow it
    torch.ops.sparsile.sparse_linear(x, torch._neg_view(values), meta, torch._neg_view(bias))
    assert list(cache.records.values()) == [record] and len(planned) == 2
    assert torch.equal(copy_of_values(record), -values) and torch.equal(record.weight.values, -values)


