"""Scratch memory of the launch records per stream and per CUDA-graph capture
(integrations/torch/capture_keys.py, record_cache.py): a record that owns memory its launches write
besides y (an e4m3 record's quantized copy of x and its per-token scales, a split-K workspace) is
shared by no two streams and no two captures, and a capture never reuses the eager record's. The
capture is faked (``_kernels._IS_CAPTURING``, the fake fixture's capture id); the same on the GPU,
replayed concurrently on two streams: tests/gpu/test_torch_graph_scratch_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import capture_keys  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import _Plan, _Prepared, _weight  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)


class _WorkspacePlan(_Plan):
    """The stand-in plan with a split-K workspace its launches write (a fixed argument of each)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.workspace = torch.zeros(2, 8)
        self.args += (self.workspace,)
        self.names += ("workspace",)


def _api(fake, monkeypatch, workspace: bool = False) -> None:
    """The fake fixture's kernel API with the quantizers (their outputs fixed: the record's own) and,
    with ``workspace``, plans of two launches sharing a split-K workspace."""
    base = kernels.kernel_api()

    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, **kwargs):
        if not workspace:
            return base.plan_sparse_linear(values, meta, x, out=out, scale_x=scale_x, **kwargs)
        return _WorkspacePlan(fake.log, x, out, scale_x, 2, (values.clone(),))

    def prepare(x, xq, scale, per_call, **kwargs):
        return _Prepared(fake.log, per_call, {"x": x, "xq": xq, "scale": scale})

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=plan_sparse_linear, prepare_quantize=prepare, prepare_quantize_static=prepare))


def _capture(fake, monkeypatch, capture: int | None) -> None:
    """From now on a capture of id ``capture`` is under way (None: none)."""
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: capture is not None)
    fake.capture_id = capture


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


@pytest.mark.parametrize("static", [False, True])
def test_each_capture_quantizes_into_scratch_of_its_own(fake, monkeypatch, static):
    """Two CUDA graphs captured on one stream (warmed up there first, as torch recommends) bake the
    addresses of the quantized copy of x (and its per-token scales) that their record's quantizer
    writes and GEMM reads: replayed at once on two streams, on the same record they raced on that
    copy (a silent wrong result). Each capture plans its own record (one per capture, however often
    it calls); the eager record keeps its own buffers and serves the eager calls after."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    scale = torch.tensor([0.5]) if static else None
    key = (4, "quantize-static", 0) if static else (4, "quantize")
    x = torch.randn(4, 32)

    def call():
        return cache.run(key, x, w, None, torch.float32, stream=7, quantize=True, static=scale)

    _capture(fake, monkeypatch, None)
    call()  # the warm-up, on the stream the graphs are captured on
    eager = cache.records[(*key, 7)]
    _capture(fake, monkeypatch, 31)
    call()
    call()  # the same capture again: its record
    _capture(fake, monkeypatch, 32)
    call()
    _capture(fake, monkeypatch, None)
    call()
    assert cache.records[(*key, 7)] is eager and cache.last[0] is eager and not eager.captured
    first, second = cache.records[(*key, 7, ("capture", 31))], cache.records[(*key, 7, ("capture", 32))]
    assert first.captured and second.captured and len(cache.records) == 3
    assert len({_ptr(r.xq) for r in (eager, first, second)}) == 3
    if static:  # the layer's scale, read by all (never written)
        assert all(r.sx is r.static and _ptr(r.sx) == _ptr(scale) for r in (eager, first, second))
    else:
        assert len({_ptr(r.sx) for r in (eager, first, second)}) == 3


def test_each_capture_has_a_split_k_workspace_of_its_own(fake, monkeypatch):
    """The same for a 16-bit record's split-K workspace (two launches: partial sums, then the
    reduction), which a graph also writes on each replay."""
    _api(fake, monkeypatch, workspace=True)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    _capture(fake, monkeypatch, 8)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    _capture(fake, monkeypatch, 9)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    records = [cache.records[k] for k in ((4, 5), (4, 5, ("capture", 8)), (4, 5, ("capture", 9)))]
    workspaces = [[t for t in r.kept if t.shape == (2, 8)] for r in records]
    assert all(len(ws) == 1 for ws in workspaces) and len({_ptr(ws[0]) for ws in workspaces}) == 3
    assert [r.captured for r in records] == [False, True, True]


def test_eager_calls_on_two_streams_have_scratch_of_their_own(fake, monkeypatch):
    """Eager calls on two streams may run at once: the record of each stream quantizes into its own copy."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    for stream in (3, 4, 3):
        cache.run((4, "quantize"), x, w, None, torch.float32, stream=stream, quantize=True)
    a, b = cache.records[(4, "quantize", 3)], cache.records[(4, "quantize", 4)]
    assert len(cache.records) == 2 and _ptr(a.xq) != _ptr(b.xq) and _ptr(a.sx) != _ptr(b.sx)


def test_a_record_without_scratch_is_shared_by_captures(fake, monkeypatch):
    """A record whose launches write only y (one launch, no workspace) serves every stream and
    every capture: nothing of it is written by a replay, so no capture plans another."""
    cache, w = RecordCache(), _weight()
    fake.reads_weight = True  # (no copies of the weight to fill after a capture)
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    for capture in (8, 9):
        _capture(fake, monkeypatch, capture)
        cache.run((4,), x, w, None, torch.float32, stream=5)
    (record,) = cache.records.values()
    assert record.key == (4,) and record.captured


def test_a_capture_of_an_unknown_id_plans_a_record_per_call(fake, monkeypatch):
    """Where the capture's id cannot be read, no record of another capture, nor the eager one, is
    reused: each call plans its own."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    monkeypatch.setattr(kernels, "_CAPTURE_ID", lambda stream: None)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    assert len(cache.records) == 3 and len({_ptr(r.xq) for r in cache.records.values()}) == 3


@pytest.mark.parametrize("trees", [False, True])
def test_the_custom_op_under_cuda_graph_trees_reuses_its_warm_up_record(fake, monkeypatch, trees):
    """The custom op's records (``off_pool``): while torch.compile's CUDA graph trees record a
    graph the record of their warm-up on that stream is reused (a record planned in the capture
    would leave its scratch in their pool, which they refuse; their graphs share that pool and
    replay one at a time); a manual capture of the op plans its own, as a layer's does."""
    _api(fake, monkeypatch)
    monkeypatch.setattr(capture_keys, "trees_recording", lambda: trees)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, off_pool=True, quantize=True)
    (warm,) = cache.records.values()
    _capture(fake, monkeypatch, 40)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, off_pool=True, quantize=True)
    assert (list(cache.records.values()) == [warm]) == trees and warm.captured == trees
    assert ((4, "quantize", 7, ("capture", 40)) in cache.records) == (not trees)


def test_trees_recording_reads_the_stack_not_the_managers_state(monkeypatch):
    """trees_recording finds a frame of torch.compile's CUDA graph trees module on the stack (they
    capture inside CUDAGraphNode's constructor): not before torch.compile loaded them, not from a
    manual capture's stack. Their manager's in_recording is not asked: torch sets it only after the
    node's constructor (and so the capture) returned (the H100 failure: it read False in the capture)."""
    import sys

    monkeypatch.delitem(sys.modules, capture_keys.TREES, raising=False)
    assert not capture_keys.trees_recording()
    import torch._inductor.cudagraph_trees as trees

    assert not capture_keys.trees_recording()  # a manual capture's stack: no frame of theirs
    namespace = {"recording": capture_keys.trees_recording}
    exec(compile("def _record():\n    return recording()\n", trees.__file__, "exec"), namespace)
    assert namespace["_record"]()  # called from a frame of their module (as from CUDAGraphNode._record)
    # (torch's order, which made in_recording useless: the node, and its capture, before the state)
    import inspect

    source = inspect.getsource(trees.CUDAGraphTreeManager.record_function)
    assert source.index("CUDAGraphNode(") < source.index("self.path_state = ExecutionState.RECORDING")


def test_a_cleared_cache_keeps_each_capture_s_record_apart(fake, monkeypatch):
    """Records a capture planned stay with their graph when the cache is cleared (retired): an eager
    call afterwards revives the eager record of its stream, never a capture's."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    _capture(fake, monkeypatch, 50)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    captured = cache.records[(4, "quantize", 7, ("capture", 50))]
    _capture(fake, monkeypatch, None)
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    eager = cache.records[(4, "quantize", 7)]
    eager.captured = True  # (an eager record a graph captured before: retired, not dropped, by clear)
    cache.clear()
    assert set(map(id, cache.retired.values())) == {id(eager), id(captured)}
    cache.run((4, "quantize"), x, w, None, torch.float32, stream=7, quantize=True)
    assert list(cache.records.values()) == [eager] and list(cache.retired.values()) == [captured]


def test_a_capture_s_record_is_kept_past_the_cache_s_capacity(fake, monkeypatch):
    """A replayed graph writes the scratch of the record its capture planned: the cache keeps that
    record past its capacity and drops the oldest uncaptured ones instead."""
    fake.reads_weight, fake.n_launches = True, 2  # (a workspace: per stream; the weight read in place)
    cache, w = RecordCache(capacity=2), _weight()
    cache.run((1,), torch.randn(1, 32), w, None, torch.float32, stream=5)
    _capture(fake, monkeypatch, 8)
    cache.run((1,), torch.randn(1, 32), w, None, torch.float32, stream=5)
    _capture(fake, monkeypatch, None)
    for t in (2, 3, 4):
        cache.run((t,), torch.randn(t, 32), w, None, torch.float32, stream=5)
    assert list(cache.records) == [(1, 5, ("capture", 8)), (3, 5), (4, 5)]
    assert cache.records[(1, 5, ("capture", 8))].captured and not cache.retired
