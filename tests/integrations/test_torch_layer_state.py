"""What a layer reuses between calls (its last call, its launch records, a fused group) after its
state changes: a retired CUDA-graph record is revived only for the same weight and activation, a
fused member's activation / out_dtype ends the fusion, a layer pickled before the last call existed
still runs, and a call keeps only its own record as its last call (another thread's call through the
layer may run while its launch releases the GIL). CPU, with record_fakes' stand-ins; each test failed
before its fix (found in review, sixteenth session)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

import sparsile.integrations.torch as spt  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch.fuse import fuse_projections_  # noqa: E402
from sparsile.integrations.torch.last_call import LastCall  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)


def test_sanity_layer_level_fast_path(fake):
    layer = spt.SparseLinear(32, 8)
    cache = layer.__dict__["_records"]
    x = torch.randn(4, 32).bfloat16()
    cache.run((4, x.dtype, -1, x.dtype), x, layer._bound(), None, x.dtype, stream=5)
    layer.__dict__["_last"] = LastCall.of(cache, x, lambda: 5)
    n = len(fake.launches)
    y = layer(x)
    assert len(fake.launches) == n + 1 and y.shape == (4, 8)
    assert copy.deepcopy(layer).__dict__["_last"] is None  # deepcopy goes through __getstate__: fine
    layer.activation = "relu"
    assert layer.__dict__["_last"] is None


def _captured_then(fake, monkeypatch, change):
    """The layer's flow on CUDA: a warm-up call, a CUDA-graph capture of the same call (the record is
    marked captured), then ``change`` (which _invalidates: the captured record is retired), then an
    eager call: which record does the cache run?"""
    fake.reads_weight = True  # (a plan reading the weight in place: nothing left unfilled by the capture)
    layer = spt.SparseLinear(32, 8)
    cache = layer.__dict__["_records"]
    x = torch.randn(4, 32).bfloat16()
    key = (4, x.dtype, -1, x.dtype)  # what SparseLinear.forward builds
    cache.run(key, x, layer._bound(), None, x.dtype, stream=5)  # warm-up
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run(key, x, layer._bound(), None, x.dtype, stream=5)  # captured (record.captured = True)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    change(layer)
    cache.run(key, x, layer._bound(), None, x.dtype, stream=5)
    return layer, cache.last[0]


def test_a_captured_record_is_not_revived_after_the_activation_is_set(fake, monkeypatch):
    _, record = _captured_then(fake, monkeypatch, lambda m: setattr(m, "activation", "relu"))
    assert record.weight.activation == "relu"  # (was: the retired record, no activation, revived)


def test_a_captured_record_is_not_revived_after_the_bias_is_replaced(fake, monkeypatch):
    layer, record = _captured_then(fake, monkeypatch, lambda m: setattr(m, "bias", torch.ones(8)))
    assert record.weight.bias.data_ptr() == layer.bias.data_ptr()  # (was: the old bias's memory)


def _fused_parent(seed=0):
    g = torch.Generator().manual_seed(seed)
    parent = torch.nn.Module()
    for name in ("q_proj", "k_proj"):
        dense = torch.nn.Linear(32, 16)
        with torch.no_grad():
            dense.weight.copy_(torch.randn(16, 32, generator=g))
            dense.bias.copy_(torch.randn(16, generator=g))
        setattr(parent, name, spt.SparseLinear.from_dense(dense, "bf16"))
    return parent


@pytest.mark.parametrize(("attribute", "value"), [("activation", "relu"), ("out_dtype", torch.float32)])
def test_setting_a_fused_member_s_activation_or_out_dtype_takes_effect(attribute, value):
    parent = _fused_parent()
    assert fuse_projections_(parent, [("q_proj", "k_proj")]).fused
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(1)).bfloat16()
    parent.q_proj(x), parent.k_proj(x)
    setattr(parent.q_proj, attribute, value)
    y = parent.q_proj(x)
    if attribute == "activation":
        assert (y >= 0).all()  # (was: the fused layer, no activation, served it)
    else:
        assert y.dtype == torch.float32  # (was: bfloat16, the fused layer's out_dtype)


def test_a_layer_pickled_before_last_call_still_runs():
    layer = spt.SparseLinear(32, 8)
    state = layer.__getstate__()
    del state["_last"]  # what torch.save(model) wrote before this commit
    old = spt.SparseLinear.__new__(spt.SparseLinear)
    old.__setstate__(state)
    old(torch.randn(2, 32).bfloat16())  # (was: KeyError '_last' in forward)


def test_a_layer_pickled_before_its_cache_noted_foreign_streams_still_runs_on_one(fake):
    """torch.save(model) pickles each layer's (empty) record cache with the attributes it had then: one saved
    before the cache noted foreign streams (``foreign``, and the limit at which it forgets their handles)
    was loaded without them, and its first call on a stream somebody else owns raised AttributeError. An
    unpickled cache is a new one of its capacity and PDL choice."""
    import pickle

    fake.foreign_streams.add(40)
    fake.n_launches = 2  # (a split-K plan: a record with scratch, per stream)
    layer = spt.SparseLinear(32, 8)
    state = layer.__getstate__()
    cache = state["_records"]
    del cache.__dict__["foreign"], cache.__dict__["foreign_limit"]  # what torch.save wrote before them
    old = spt.SparseLinear.__new__(spt.SparseLinear)
    old.__setstate__(pickle.loads(pickle.dumps(state)))
    loaded = old.__dict__["_records"]
    assert loaded.pdl and loaded.capacity == cache.capacity
    x = torch.randn(4, 32).bfloat16()
    loaded.run((4, x.dtype, -1, x.dtype), x, old._bound(), None, x.dtype, stream=40)
    assert loaded.foreign == {40}


def test_remember_keeps_only_the_record_of_its_own_call(fake, monkeypatch):
    """Another thread's call through the layer between this call's records.run and its _remember
    (the native launch is a ctypes call: it releases the GIL) leaves ITS record as the cache's last;
    the layer must not keep it as the LastCall of this call's x."""
    from sparsile.integrations.torch.record_cache import RecordCache

    layer = spt.SparseLinear(32, 8)  # bf16 weight
    cache = layer.__dict__["_records"]
    monkeypatch.setattr(RecordCache, "stream_of", lambda self, device: (lambda: 5))
    xa, xb = torch.randn(4, 32).bfloat16(), torch.randn(4, 32).half()
    w = layer._bound()
    cache.run((4, torch.bfloat16, -1, torch.bfloat16), xa, w, None, torch.bfloat16, stream=5)  # thread A's call...
    cache.run((4, torch.bfloat16, -1, torch.float16), xb.bfloat16(), w, None, torch.float16, stream=5)  # ...B's
    layer._remember(cache, (4, torch.bfloat16, -1, torch.bfloat16), xa, xa)
    last = layer.__dict__["_last"]  # what layer(xa) launches next (on stream 5)
    assert last is None or last(xa).dtype == torch.bfloat16  # (was: float16, B's record)
