"""The launch record and the weight it reads (integrations/torch/_kernels.py): programmatic
dependent launch (planned with pdl where asked and wanted, the weight's writes waited for), in-place
weight writes (version counters; records reading copies refreshed in place, or replaced where they
cannot be, captured ones retired; ``sync`` before any call), and the
streams a record serves (record_stream), with the stand-ins of record_fakes.py. The same on the
H200: tests/gpu/test_torch_native_gpu.py."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.errors import IntegrationError  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import record_cache  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import (  # noqa: E402
    _weight,
    copy_of_values,
    counting_plans,
    frees_wait_for_a_capture_on,
)
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)


def _pdl_wanted_and_logged(fake, monkeypatch) -> tuple[list[bool], list]:
    """PDL wanted on this (CPU) device; the pdl argument of each plan the records ask for, and each
    stream synchronization (stream_waits.py, faked by record_fakes.fake), in the two lists returned;
    a device synchronization fails the test."""
    asked, synced = [], fake.stream_syncs
    plan = kernels.kernel_api().plan_sparse_linear

    def plan_with_pdl(*args, pdl=False, **kwargs):
        asked.append(pdl)
        return plan(*args, **kwargs)

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=plan_with_pdl))
    monkeypatch.setattr(record_cache, "pdl_wanted", lambda device: True)
    monkeypatch.setattr(torch.cuda, "synchronize", _no_device_synchronize)
    return asked, synced


def _no_device_synchronize(device=None) -> None:
    raise AssertionError(f"torch.cuda.synchronize({device!r}): a device-wide synchronize")


def test_a_pdl_record_plans_with_pdl_and_waits_for_weight_writes(fake, monkeypatch):
    """RecordCache(pdl=True) on a device that has it: the plans (the eager one-launch variant too)
    are asked for pdl; the weight's queued writes are waited for once when the record is built and
    again after an in-place write (its version counter), not on other calls."""
    asked, synced = _pdl_wanted_and_logged(fake, monkeypatch)
    fake.decode = True
    fake.n_launches = 2
    fake.reads_weight = True  # the plan reads the weight in place: a write needs no new record
    cache, w = RecordCache(pdl=True), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert asked == [True, True] and len(synced) == 1  # the plan and its one-launch variant; one wait
    assert not next(iter(cache.records.values())).copies_weight
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(synced) == 1
    w.values.add_(1.0)  # an in-place write to the weight
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(synced) == 2
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(synced) == 2
    monkeypatch.setattr(record_cache, "pdl_wanted", lambda device: False)
    RecordCache(pdl=True).run((4,), x, _weight(), None, torch.float32, stream=11)
    RecordCache().run((5,), torch.randn(5, 32), _weight(), None, torch.float32, stream=11)
    assert asked[2:] == [False] * (len(asked) - 2) and len(synced) == 2


def test_pdl_switch_is_documented():
    from pathlib import Path

    text = (Path(kernels.__file__).resolve().parents[2] / "docs" / "torch.md").read_text()
    assert kernels.PDL_ENV in text
    assert kernels.pdl_wanted(torch.device("cpu")) is False


def test_a_pdl_record_of_inference_tensors_launches_without_pdl(fake, monkeypatch):
    """A weight made under torch.inference_mode() keeps no version counter (reading ``_version``
    raises there): an in-place write to it cannot be seen, so its records launch without PDL (and
    a call inside inference_mode does not fail on the version check)."""
    asked, synced = _pdl_wanted_and_logged(fake, monkeypatch)
    with torch.inference_mode():
        w = _weight()
        x = torch.randn(4, 32)
        cache = RecordCache(pdl=True)
        cache.run((4,), x, w, None, torch.float32, stream=11)
        cache.run((4,), x, w, None, torch.float32, stream=11)
        (record,) = cache.records.values()
        assert record.pdl is False and asked == [False] and synced == []
    normal = _weight()  # the same cache, a weight that tracks its writes: PDL
    cache.run((5,), torch.randn(5, 32), normal, None, torch.float32, stream=11)
    assert asked == [False, True] and len(synced) == 1


def test_a_record_reading_copies_of_the_weight_refreshes_them_after_a_write(fake, monkeypatch):
    """A plan that pads or re-encodes the weight reads copies made when the record was built: after
    an in-place write of values or meta the next call plans again from the weight as it is now and
    copies the new plan's operands into the record's copies (same addresses: a CUDA graph that
    captured the record replays the new weight). In a capture nothing can be refreshed: SP0920
    (the graph would replay the old copies), the write stays unnoted and the first call after the
    capture refreshes. Records reading the weight
    in place are kept as they are, unplanned."""
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    w.values.copy_(torch.randn(8, 16))
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    copy = copy_of_values(record)
    address = copy.data_ptr()
    assert record.copies_weight and record.versions == (1, 0) and len(planned) == 1
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(planned) == 1  # unchanged weight: nothing planned
    w.values.add_(1.0)
    assert not torch.equal(copy, w.values)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [record] and len(planned) == 2 and record.versions == (2, 0)
    assert torch.equal(copy, w.values) and copy.data_ptr() == address and cache.retired == {}
    record.captured = True
    w.values.mul_(3.0)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)  # in a capture: SP0920, nothing refreshed
    with pytest.raises(IntegrationError) as info:
        cache.run((4,), x, w, None, torch.float32, stream=11)
    assert info.value.code == "SP0920" and info.value.message.startswith(
        "sparsile.torch: a CUDA graph captures a sparse linear call (8 output features, 4 tokens) whose weight "
        "was written in place since its last call outside a capture")
    assert "layer.check_metadata()" in info.value.help
    assert record.versions == (2, 0) and len(planned) == 2 and not torch.equal(copy, w.values)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # the write before the capture: refreshed now
    assert list(cache.records.values()) == [record] and record.versions == (3, 0) and len(planned) == 3
    assert torch.equal(copy, w.values) and cache.retired == {}
    fake.reads_weight = True  # a plan reading the weight in place: a write keeps the record, unplanned
    cache2, w2 = RecordCache(), _weight()
    cache2.run((4,), x, w2, None, torch.float32, stream=11)
    (kept,) = cache2.records.values()
    w2.values.add_(1.0)
    cache2.run((4,), x, w2, None, torch.float32, stream=11)
    assert next(iter(cache2.records.values())) is kept and kept.versions == (1, 0) and len(planned) == 4


def test_a_record_whose_plan_lists_no_operands_is_replaced_after_a_write(fake, monkeypatch):
    """Where the copies cannot be refreshed (a plan without ``weight_operands``) the record is
    replaced by one planned from the weight as it is now; a replaced record a CUDA graph captured
    is kept (retired) while its weight lives."""
    fake.lists_operands = False
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (first,) = cache.records.values()
    w.values.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (second,) = cache.records.values()
    assert second is not first and len(planned) == 2 and torch.equal(planned[-1], w.values)
    assert cache.retired == {}  # never captured: dropped
    second.captured = True
    w.meta.add_(1)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (third,) = cache.records.values()
    assert third is not second and list(cache.retired.values()) == [second] and third.versions == (1, 1)


def test_retired_records_go_with_their_weight(fake):
    """A captured record replaced after a weight write is kept only while its weight lives: once the
    caller's values tensor is collected its retired records are dropped too (they hold the weight's
    memory and the copies), not only at the next replacement."""
    fake.lists_operands = False  # copies that cannot be refreshed: replaced
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (first,) = cache.records.values()
    first.captured = True
    w.values.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.retired.values()) == [first] and next(iter(cache.records.values())) is not first
    gone = weakref.ref(first)
    del first, w
    gc.collect()
    assert cache.retired == {} and len(cache) == 0 and gone() is None


def test_a_write_to_a_bias_the_plan_converted_refreshes_the_copy(fake):
    """The bias (and scale_w) are watched as values and metadata are: a plan that reads a converted
    copy of the bias has it refreshed after an in-place write of it; one reading it in place only
    notes the write. A bias made under inference_mode keeps no version counter: it is not watched."""
    fake.reads_weight = True
    cache, w = RecordCache(), _weight(torch.zeros(8))
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (kept,) = cache.records.values()
    assert not kept.copies_weight and kept.versions == (0, 0, 0)
    w.bias.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert next(iter(cache.records.values())) is kept and kept.versions == (0, 0, 1)
    fake.copies_bias = True
    cache, w = RecordCache(), _weight(torch.zeros(8))
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (first,) = cache.records.values()
    (operands,) = first.operands
    bias_copy = operands[2]
    assert first.copies_weight and bias_copy.dtype == torch.float64 and torch.equal(bias_copy, w.bias.double())
    w.bias.add_(1.5)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [first] and first.versions == (0, 0, 1)
    assert torch.equal(bias_copy, w.bias.double()) and bias_copy.data_ptr() == operands[2].data_ptr()
    with torch.inference_mode():
        bias = torch.zeros(8)
    cache, w = RecordCache(), _weight(bias)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (unwatched,) = cache.records.values()
    assert unwatched.versions == (0, 0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert next(iter(cache.records.values())) is unwatched


@pytest.mark.parametrize("opt", ["sgd", "adamw", "adagrad"])
def test_a_fused_optimizer_step_of_a_converted_bias_refreshes_the_copy(fake, opt):
    """torch's fused optimizers (``fused=True``, transformers' default ``adamw_torch_fused``) write the
    parameters in one kernel without bumping their version counters: a record reading a converted
    copy of a bias made a parameter (a float64 or bf16 bias, which the plan converts to float32) kept
    the copy from before the step, and the next call (the last call's path too: it compares the same
    counters) computed with the old bias, without a word. Global step hooks bump the counter of a
    stepped parameter whose memory a live record reads through a copy, where the step did not: the
    next call refreshes the copy in place. A parameter read in place, or one the step skipped (no
    gradient), keeps its counter."""
    make = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW, "adagrad": torch.optim.Adagrad}[opt]
    fake.reads_weight = True
    fake.copies_bias = True
    bias, skipped = torch.nn.Parameter(torch.rand(8)), torch.nn.Parameter(torch.rand(8))
    cache, w = RecordCache(), _weight(bias)
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    (operands,) = record.operands
    copy = operands[2]
    assert record.copies_weight and torch.equal(copy, bias.detach().double())
    fake.copies_bias = False  # (another bias read in place)
    in_place = torch.nn.Parameter(torch.rand(8))
    other, w_other = RecordCache(), _weight(in_place)
    other.run((4,), x, w_other, None, torch.float32, stream=11)
    assert not next(iter(other.records.values())).copies_weight
    fake.copies_bias = True  # (the first record's plan, planned again by its refresh)
    optimizer = make([bias, skipped, in_place], lr=0.5, fused=True)
    for _ in range(2):
        bias.grad, in_place.grad = torch.rand(8) + 0.5, torch.rand(8) + 0.5
        before, versions = bias.detach().clone(), (bias._version, skipped._version, in_place._version)
        optimizer.step()
        assert not torch.equal(bias.detach(), before)  # (the step wrote it)
        assert (bias._version > versions[0], skipped._version, in_place._version) == (True, *versions[1:])
        cache.run((4,), x, w, None, torch.float32, stream=11)
        assert list(cache.records.values()) == [record] and record.versions[2] == bias._version
        assert torch.equal(copy, bias.detach().double()) and copy.data_ptr() == operands[2].data_ptr()


def test_sync_refreshes_captured_copies_before_any_call(fake):
    """``RecordCache.sync`` (load_state_dict, SemiSparseLinear.refresh) refreshes the copies of every
    record of the weight's memory (retired ones, records of a view's base) at once, so that a graph
    replay right after the write reads the new weight; records of another weight are untouched; a
    captured record whose copies cannot be refreshed is counted; nothing is done in a capture."""
    cache, w = RecordCache(), _weight()
    other = _weight()
    x = torch.randn(4, 32)
    cache.run((4, "w"), x, w, None, torch.float32, stream=11)  # (keys name the weight's memory)
    cache.run((4, "other"), x, other, None, torch.float32, stream=11)
    mine, theirs = cache.records.values()
    mine.captured = True
    cache.clear()  # retired (captured); the other weight's record is dropped
    assert list(cache.retired.values()) == [mine]
    w.values.copy_(torch.randn(8, 16))
    other.values.add_(2.0)
    assert cache.sync(w.values[2:4]) == 0  # a view of the weight's memory (a fused group's member)
    assert torch.equal(copy_of_values(mine), w.values) and mine.versions == (1, 0)
    assert not torch.equal(copy_of_values(theirs), other.values)
    fake.lists_operands = False
    cache2, w2 = RecordCache(), _weight()
    cache2.run((4,), x, w2, None, torch.float32, stream=11)
    cache2.run((5,), torch.randn(5, 32), w2, None, torch.float32, stream=11)
    captured, free = cache2.records.values()
    captured.captured = True
    w2.values.add_(1.0)
    assert cache2.sync(w2.values) == 1 and captured.versions == (0, 0) and free.versions == (0, 0)


def test_load_state_dict_syncs_the_records_of_the_layer_and_the_op(monkeypatch):
    """SparseLinear._invalidate (load_state_dict, check_metadata, buffer writes) syncs the records
    of its weight in its own cache and in the custom op's before emptying its cache."""
    import sparsile.torch as spt
    from sparsile.integrations.torch import ops

    synced = []
    monkeypatch.setattr(RecordCache, "sync", lambda self, values: synced.append((self, values)) or 0)
    layer = spt.SparseLinear.from_dense(torch.nn.Linear(64, 16), dtype="bf16")
    other = spt.SparseLinear.from_dense(torch.nn.Linear(64, 16), dtype="bf16")
    synced.clear()
    layer.load_state_dict(other.state_dict())
    caches = [cache for cache, values in synced if values is layer.values]
    assert layer.__dict__["_records"] in caches and ops.RECORDS in caches


def test_a_record_marks_its_buffers_used_on_each_new_stream(fake, monkeypatch):
    """A record without a workspace serves calls on any stream: the first call on a stream other
    than the one it was built on marks what its launches keep (padded copies) as used there, once,
    so that dropping the record cannot free them under that stream's queued kernels."""
    marked = []
    monkeypatch.setattr(kernels, "used_on", lambda tensors, stream: marked.append((list(tensors), stream)))
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert marked == []  # its own stream: the allocator knows it
    cache.run((4,), x, w, None, torch.float32, stream=12)
    cache.run((4,), x, w, None, torch.float32, stream=12)
    (record,) = cache.records.values()
    assert [stream for _, stream in marked] == [12] and record.streams == {11, 12}
    (copy,) = marked[0][0]  # the plan's copy of the weight (x and y are per call, the weight the layer's)
    assert torch.equal(copy, w.values) and copy.data_ptr() != w.values.data_ptr()


def test_clearing_a_cache_keeps_the_records_a_graph_captured(fake):
    """load_state_dict copies into the layer's buffers in place and clears its records: a CUDA graph
    captured before still replays the captured records' launches, so their workspace and copies
    must stay allocated (retired) while the weight lives; uncaptured records are freed."""
    cache, w = RecordCache(), _weight()
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=11)
    cache.run((5,), torch.randn(5, 32), w, None, torch.float32, stream=11)
    captured, free = cache.records.values()
    captured.captured = True
    gone = weakref.ref(free)
    del free
    cache.clear()
    gc.collect()
    assert len(cache) == 0 and list(cache.retired.values()) == [captured] and gone() is None
    del w  # the weight's last reference: its retired records go with it
    gc.collect()
    assert cache.retired == {}


def test_a_record_without_prepared_launches_marks_its_plans_buffers(fake, monkeypatch):
    """Without prepared launches (the plan rebound per call) what the record keeps is read from the
    plan's launch arguments: its padded copy of the weight is marked used on a new stream; the
    first call's x and y and the layer's weight are not the record's (nothing kept of them)."""
    marked = []
    monkeypatch.setattr(kernels, "used_on", lambda tensors, stream: marked.append((list(tensors), stream)))
    plan_of = kernels.kernel_api().plan_sparse_linear

    class Unprepared:  # the stand-in plan, its launchers without ``prepare``
        def __init__(self, plan):
            self.plan = plan

        def launches(self):
            return [({g: object()}, g, a, c) for _, g, a, c in self.plan.launches()]  # kernel[grid]: no prepare

        def run(self, stream=None):
            pass

        def rebind(self, x, y, scale_x=None):
            return self

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=lambda *a, **k: Unprepared(plan_of(*a, **k))))
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    assert record.prepared is None
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=12)
    assert [stream for _, stream in marked] == [12]
    (copy,) = marked[0][0]
    assert torch.equal(copy, w.values) and copy.data_ptr() != w.values.data_ptr()
    assert not any(t.data_ptr() == x.data_ptr() for t in record.kept)


def test_a_retired_record_is_revived_instead_of_joined_by_a_new_one(fake):
    """clear() (load_state_dict) retires a captured record; the next call of the same key and
    weight takes it back (no new record): one reading the weight in place as it is, one reading
    copies of a weight written since with its copies refreshed."""
    fake.reads_weight = True
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    record.captured = True
    cache.clear()
    assert list(cache.retired.values()) == [record]
    w.values.add_(1.0)  # load_state_dict writes the buffers in place
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [record] and cache.retired == {}
    assert record.versions == tuple(t._version for t in record.tracked)
    fake.reads_weight = False  # a record reading copies
    cache2, w2 = RecordCache(), _weight()
    cache2.run((4,), x, w2, None, torch.float32, stream=11)
    (copying,) = cache2.records.values()
    copying.captured = True
    cache2.clear()
    w2.values.add_(1.0)
    cache2.run((4,), x, w2, None, torch.float32, stream=11)
    assert list(cache2.records.values()) == [copying] and cache2.retired == {}
    assert torch.equal(copy_of_values(copying), w2.values)


def test_copies_planned_under_inference_mode_are_refreshed_outside_it(fake):
    """A record built under torch.inference_mode() (generation) around a weight made outside it
    watches the weight's writes, but its padded copies are inference tensors, which torch refuses
    to write in place outside inference mode: a write of the weight and a call (or a sync:
    load_state_dict) outside inference mode still refresh them (before, both raised)."""
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    with torch.inference_mode():
        cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    copy = copy_of_values(record)
    assert copy.is_inference() and record.tracked is not None
    w.values.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [record] and torch.equal(copy, w.values)
    record.captured = True
    w.values.mul_(2.0)
    assert cache.sync(w.values) == 0 and torch.equal(copy, w.values) and record.versions == (2, 0)


def _a_record_on_stream_11(monkeypatch):
    """A record built on stream 11, torch's current stream being ``current[0]`` (11 until changed)."""
    current = [11]
    monkeypatch.setattr(kernels, "_current_stream", lambda device: current[0])
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    return current, cache, w, x, record


def test_a_refresh_on_another_stream_marks_the_copies_used_there(fake, monkeypatch):
    """refresh_copies writes the record's copies on torch's current stream, which need not be one
    the record ran on (load_state_dict on the default stream after a warm-up and capture on side
    streams): the copies are marked used there (record_stream), so that a record dropped right
    after cannot hand their memory out again before that copy ran. Not on a stream it ran on."""
    marked = []
    monkeypatch.setattr(kernels, "used_on", lambda tensors, stream: marked.append((list(tensors), stream)))
    current, cache, w, x, record = _a_record_on_stream_11(monkeypatch)
    w.values.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert marked == []  # refreshed on the stream the record was built on
    current[0] = 0
    w.values.add_(1.0)
    assert cache.sync(w.values) == 0 and torch.equal(copy_of_values(record), w.values)
    ((tensors, stream),) = marked
    assert stream == 0 and len(tensors) == 1 and tensors[0] is copy_of_values(record)


def test_a_stream_a_refresh_marked_is_asked_before_the_record_is_freed(fake, monkeypatch):
    """A refresh of the copies on a stream the record never ran on (21) marks them used there: torch's free
    of them (cudaMallocAsync) records an event on 21, which joins their allocation stream into a capture under
    way on 21, putting the free into that capture's graph. So graph_life.frees_captured asks 21 too. Before,
    it asked only the streams the record launched on, and a record let go of during a capture on 21 (another
    thread's, on a stream no sparsile call noted) was freed into it."""
    current, cache, w, _x, record = _a_record_on_stream_11(monkeypatch)
    current[0] = 21
    w.values.add_(1.0)
    assert cache.sync(w.values) == 0 and torch.equal(copy_of_values(record), w.values)
    assert record.streams == {11}
    assert frees_wait_for_a_capture_on(record, 21, monkeypatch)  # another thread captures on 21


def test_load_state_dict_refreshes_only_the_records_it_keeps(fake, monkeypatch):
    """SparseLinear._invalidate empties the layer's cache (its uncaptured records are dropped, and
    rebuilt from the loaded weight when called) and then syncs what stays: the records a graph
    captured (retired), whose copies are refreshed in place. Before, every record of the layer was
    planned again and its copies written, then dropped (a plan and a weight copy per record
    wasted on each load_state_dict)."""
    import sparsile.torch as spt

    planned = counting_plans(monkeypatch)
    layer = spt.SparseLinear.from_dense(torch.nn.Linear(64, 16), dtype="bf16")
    other = spt.SparseLinear.from_dense(torch.nn.Linear(64, 16), dtype="bf16")
    cache = layer.__dict__["_records"]
    for tokens in (4, 5, 6):
        cache.run((tokens,), torch.randn(tokens, 64), layer._bound(), None, torch.float32, stream=11)
    captured, *_ = cache.records.values()
    captured.captured = True
    assert len(planned) == 3
    layer.load_state_dict(other.state_dict())
    assert len(planned) == 4 and list(cache.retired.values()) == [captured] and len(cache) == 0
    assert torch.equal(copy_of_values(captured), layer.values) and torch.equal(layer.values, other.values)


def test_the_eager_one_launch_variant_has_its_copies_refreshed_too(fake):
    """A decode record with split-K launches eager calls through its one-launch variant, a second
    plan with its own copies of the weight: a write refreshes both (the eager calls read one, a
    captured graph the other)."""
    fake.decode, fake.n_launches = True, 2
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    assert record.eager is not None and len(record.operands) == 2
    copies = [operands[0] for operands in record.operands]
    assert copies[0].data_ptr() != copies[1].data_ptr()
    w.values.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [record] and all(torch.equal(c, w.values) for c in copies)


def test_a_members_load_state_dict_syncs_its_fused_groups_records(fake):
    """A fused group (fuse_projections_) runs its members through the fused layer's records, whose
    weight the members' buffers view: loading a member's state refreshes the copies of a captured
    record of the fused layer at once (the group's cache is synced with the member's rows)."""
    import sparsile.torch as spt

    def block(seed):
        torch.manual_seed(seed)
        parent = torch.nn.Module()
        parent.q_proj = spt.SparseLinear.from_dense(torch.nn.Linear(64, 16), dtype="bf16")
        parent.k_proj = spt.SparseLinear.from_dense(torch.nn.Linear(64, 32), dtype="bf16")
        return parent

    fused_block, other = block(1), block(2)
    assert spt.fuse_projections_(fused_block, [("q_proj", "k_proj")]).fused == ["q_proj+k_proj"]
    fused = fused_block.q_proj.__dict__["_fused"][0].fused
    fused.__dict__["_records"].run((4,), torch.randn(4, 64), fused._bound(), None, torch.float32, stream=11)
    (record,) = fused.__dict__["_records"].records.values()
    record.captured = True
    fused_block.k_proj.load_state_dict(other.k_proj.state_dict())
    assert torch.equal(fused.values[16:], other.k_proj.values)
    assert torch.equal(copy_of_values(record), fused.values) and record.versions == _versions_now(record)


def _versions_now(record) -> tuple[int, ...]:
    return tuple(t._version for t in record.tracked)


@pytest.mark.parametrize("tokens,kernel", [(4, None), (64, None), (65, "gemm"), (100, "gemm")])
def test_a_refresh_plans_one_token_of_the_same_kernel(fake, monkeypatch, tokens, kernel):
    """refresh_copies plans the weight again on one token (x and y of one row, not the call's
    T x K and T x N): the weight's operands depend on the kernel and dtype only
    (tests/stdlib/test_decode_api.py). Above the decode kernel's 64 tokens it asks for the tiled
    kernel (kernel="gemm"), which one token would not get otherwise; a per-token scale_x becomes one
    value."""
    asked = []
    plan = kernels.kernel_api().plan_sparse_linear

    def logging(values, meta, x, **kwargs):
        asked.append((tuple(x.shape), kwargs.get("kernel"), None if kwargs.get("scale_x") is None
                      else tuple(kwargs["scale_x"].shape)))
        return plan(values, meta, x, **kwargs)

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=logging))
    cache, w = RecordCache(), _weight()
    x, scale_x = torch.randn(tokens, 32), torch.rand(tokens)
    cache.run((tokens,), x, w, scale_x, torch.float32, stream=11)
    w.values.add_(1.0)
    cache.run((tokens,), x, w, scale_x, torch.float32, stream=11)
    (record,) = cache.records.values()
    assert asked == [((tokens, 32), None, (tokens,)), ((1, 32), kernel, (1,))]
    assert torch.equal(copy_of_values(record), w.values)


def test_a_record_planned_in_a_capture_fills_its_copies_before_an_eager_call(fake, monkeypatch):
    """Planned inside a CUDA-graph capture, a record's copies of the weight are made by captured
    kernels, which run only at the graph's first replay: the first call outside the capture fills
    them first (a refresh: the bytes the replay writes), once. A record reading the weight in place
    needs nothing; one whose plan lists no operands is replaced."""
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    w.values.copy_(torch.randn(8, 16))
    x = torch.randn(4, 32)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # planned (and captured) in the capture
    (record,) = cache.records.values()
    assert record.unfilled and record.captured and len(planned) == 1
    copy_of_values(record).fill_(float("nan"))  # what an unreplayed capture leaves there
    cache.run((4,), x, w, None, torch.float32, stream=11)  # still capturing: nothing done
    assert record.unfilled and len(planned) == 1
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert list(cache.records.values()) == [record] and not record.unfilled and len(planned) == 2
    assert torch.equal(copy_of_values(record), w.values)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(planned) == 2  # once
    outside = RecordCache()
    outside.run((4,), x, w, None, torch.float32, stream=11)
    assert not next(iter(outside.records.values())).unfilled  # planned outside a capture: filled
    fake.reads_weight = True
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    in_place = RecordCache()
    in_place.run((4,), x, w, None, torch.float32, stream=11)
    assert not next(iter(in_place.records.values())).unfilled
    fake.reads_weight = False
    counting = RecordCache()  # arrival counters (an in-kernel reduction) to zero: a new record
    fake_api = kernels.kernel_api
    plan_of = fake_api().plan_sparse_linear

    def with_counters(*args, **kwargs):
        plan = plan_of(*args, **kwargs)
        plan.counters = torch.zeros(2, dtype=torch.int32)
        return plan

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=with_counters))
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    counting.run((4,), x, w, None, torch.float32, stream=11)
    (zeroed_in_capture,) = counting.records.values()
    assert zeroed_in_capture.has_counters and zeroed_in_capture.unfilled
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    counting.run((4,), x, w, None, torch.float32, stream=11)
    assert next(iter(counting.records.values())) is not zeroed_in_capture
    assert list(counting.retired.values()) == [zeroed_in_capture]
    monkeypatch.setattr(kernels, "kernel_api", fake_api)
    fake.lists_operands = False
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache2 = RecordCache()
    cache2.run((4,), x, w, None, torch.float32, stream=11)
    (unlisted,) = cache2.records.values()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache2.run((4,), x, w, None, torch.float32, stream=11)
    (fresh,) = cache2.records.values()
    assert fresh is not unlisted and not fresh.unfilled and list(cache2.retired.values()) == [unlisted]


def test_a_write_to_a_tensor_read_in_place_neither_refreshes_nor_stops_a_capture(fake, monkeypatch):
    """The copies a record reads are each made from one tensor of the weight (padded values, tiled
    or re-encoded metadata, a converted bias): a write to a tensor every plan of the record reads in
    place (here the bias, next to padded values) leaves them correct. It is only noted: no plan, no
    copy, and inside a capture no SP0920 (before, a bias-only write stopped the capture of a padded
    layer: a bias-tuning step, a steering vector added to the bias). A write to the values after it
    still stops a capture."""
    planned = counting_plans(monkeypatch)
    fake.reads_weight = fake.pads_values = True  # the stand-in plan: values copied ("padded"), meta and bias read
    cache, w = RecordCache(), _weight(torch.zeros(8))
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    (record,) = cache.records.values()
    assert record.copies_weight and record.copied == (True, False, False)
    w.bias.add_(1.0)
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert len(planned) == 1 and record.versions == (0, 0, 1)  # noted, not refreshed
    w.bias.add_(1.0)
    record.captured = True
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # no SP0920: the copies are the values'
    assert len(planned) == 1 and record.versions == (0, 0, 2) and list(cache.records.values()) == [record]
    w.values.add_(1.0)
    with pytest.raises(IntegrationError) as info:
        cache.run((4,), x, w, None, torch.float32, stream=11)
    assert info.value.code == "SP0920" and record.versions == (0, 0, 2)


def _per_stream(fake) -> None:
    """The stand-in plan of two launches (a split-K workspace): its records are per stream."""
    fake.n_launches = 2


def test_an_eager_call_brings_the_captured_records_of_other_streams_up_to_a_write(fake, monkeypatch):
    """torch's pattern: warm up on a side stream, capture on the graph's own stream. A per-stream
    record (split-K workspace) of the capture stream is not the warm-up's record: the warm-up call
    after an in-place write refreshes the weight's captured records of other streams (and token
    counts) too, so the capture after it neither stops with SP0920 nor replays old copies, and a
    replay of the earlier graph reads the new weight."""
    _per_stream(fake)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # the warm-up, on the side stream
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)  # the capture, on the graph's stream
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # (fills the record planned in the capture)
    warm, graphs = cache.records.values()
    assert warm.key == (4, 11) and graphs.key == (4, 12, ("capture", 1)) and graphs.captured and not graphs.unfilled
    w.values.copy_(torch.randn(8, 16))
    cache.run((4,), x, w, None, torch.float32, stream=11)  # the warm-up before the next capture
    assert torch.equal(copy_of_values(warm), w.values) and torch.equal(copy_of_values(graphs), w.values)
    assert graphs.versions == warm.versions == (1, 0)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)  # the same capture again: no SP0920
    assert list(cache.records.values()) == [warm, graphs]
    fake.capture_id = 2  # the next capture: a record of its own (its scratch), planned from the weight as it is
    cache.run((4,), x, w, None, torch.float32, stream=12)
    assert list(cache.records.values())[:2] == [warm, graphs] and len(cache.records) == 3
    assert cache.records[(4, 12, ("capture", 2))].versions == (1, 0)


def test_an_eager_call_fills_every_record_planned_in_a_capture(fake, monkeypatch):
    """A record planned inside a capture (a per-stream record of the capture stream) is filled at
    the cache's next call outside a capture even where that call uses another record (a warm-up on a
    side stream), so that a second capture reusing it reads filled copies, not what only the first
    graph's replay writes; one with arrival counters to zero is replaced (retired for its graph) and
    not revived after the cache is cleared."""
    _per_stream(fake)
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    w.values.copy_(torch.randn(8, 16))
    x = torch.randn(4, 32)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)  # captured first, no warm-up
    (graphs,) = cache.records.values()
    assert graphs.unfilled and list(cache.unfilled.values()) == [graphs]
    copy_of_values(graphs).fill_(float("nan"))  # what an unreplayed capture leaves there
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache.run((4,), x, w, None, torch.float32, stream=11)  # a call of another record
    assert not graphs.unfilled and cache.unfilled == {} and torch.equal(copy_of_values(graphs), w.values)
    assert len(planned) == 3  # the capture's plan, its fill, the side stream's record
    plan_of = kernels.kernel_api().plan_sparse_linear

    def with_counters(*args, **kwargs):
        plan = plan_of(*args, **kwargs)
        plan.counters = torch.zeros(2, dtype=torch.int32)
        return plan

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=with_counters))
    counting, w2 = RecordCache(), _weight()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    counting.run((4,), x, w2, None, torch.float32, stream=12)
    (zeroed,) = counting.records.values()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    counting.run((4,), x, w2, None, torch.float32, stream=11)
    assert zeroed.unfilled and list(counting.retired.values()) == [zeroed] and counting.unfilled == {}
    assert [r.key for r in counting.records.values()] == [(4, 11)]
    counting.clear()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    counting.run((4,), x, w2, None, torch.float32, stream=12)  # a new capture: a new record, not the retired one
    assert zeroed not in counting.records.values() and len(counting.records) == 1


def test_a_second_capture_before_any_eager_call_plans_its_own_record(fake, monkeypatch):
    """Two captures with no call outside a capture between them: the first plans a record whose
    copies only its graph's replay fills; the second (another capture id) must not read them, since
    its graph may be replayed first, so it plans its own record and the first is retired for the
    first graph. Calls within one capture share their record; the eager call after fills the new
    record only (the retired one belongs to its graph, whose replay fills it)."""
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    w.values.copy_(torch.randn(8, 16))
    x = torch.randn(4, 32)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)
    (first,) = cache.records.values()
    cache.run((4,), x, w, None, torch.float32, stream=12)  # the same capture: the same record
    assert list(cache.records.values()) == [first] and first.capture == 1 and len(planned) == 1
    fake.capture_id = 2
    cache.run((4,), x, w, None, torch.float32, stream=12)
    (second,) = cache.records.values()
    assert second is not first and second.unfilled and second.capture == 2 and len(planned) == 2
    assert list(cache.retired.values()) == [first] and list(cache.unfilled.values()) == [second]
    copy_of_values(second).fill_(float("nan"))  # what an unreplayed capture leaves there
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    cache.run((4,), x, w, None, torch.float32, stream=12)
    assert list(cache.records.values()) == [second] and not second.unfilled
    assert torch.equal(copy_of_values(second), w.values) and first.unfilled  # (first: its graph fills it)


def test_a_write_between_two_captures_gives_the_second_its_own_record_not_sp0920(fake, monkeypatch):
    """A weight written in place after a capture that planned a record, before another capture with
    no eager call between: the second capture plans its own record from the weight as it is (the
    first capture's record, which its graph fills, is retired), rather than stopping with SP0920."""
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)
    (first,) = cache.records.values()
    w.values.copy_(torch.randn(8, 16))
    fake.capture_id = 2
    cache.run((4,), x, w, None, torch.float32, stream=12)  # no SP0920
    (second,) = cache.records.values()
    assert second is not first and len(planned) == 2 and list(cache.retired.values()) == [first]
    assert second.versions == tuple(t._version for t in second.tracked)


def test_an_unknown_capture_id_is_never_taken_for_the_same_capture(fake, monkeypatch):
    """Where the capture id cannot be read (None), a record planned in a capture is not reused by a
    later capture call: each plans its own (the safe side: an extra plan, never unfilled copies)."""
    planned = counting_plans(monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    fake.capture_id = None
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=12)
    (first,) = cache.records.values()
    cache.run((4,), x, w, None, torch.float32, stream=12)
    assert first.capture is None and next(iter(cache.records.values())) is not first and len(planned) == 2


def test_the_legacy_default_stream_is_never_asked_for_a_capture_id(monkeypatch):
    """capture_id(0) answers None without calling the driver: during a capture, a query on the legacy
    stream is an implicit synchronization that invalidates the capture."""
    asked = []
    monkeypatch.setattr(kernels, "_CAPTURE_ID", lambda stream: asked.append(stream) or 7)
    assert kernels.capture_id(0) is None and kernels.capture_id(None) is None and asked == []
    assert kernels.capture_id(12) == 7 and asked == [12]


def test_a_call_of_a_record_reading_in_place_refreshes_a_captured_one_reading_copies(fake):
    """Records of one weight may differ in what they copy (the decode kernel and the tiled one pad
    differently): a call of a record that reads the written tensor in place still refreshes the
    weight's captured records that read a copy of it."""
    cache, w = RecordCache(), _weight()
    cache.run((5,), torch.randn(5, 32), w, None, torch.float32, stream=11)
    (copying,) = cache.records.values()
    copying.captured = True
    fake.reads_weight = True
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=11)
    in_place = next(r for r in cache.records.values() if r is not copying)
    assert copying.copies_weight and not in_place.copies_weight
    w.values.add_(1.0)
    cache.run((4,), torch.randn(4, 32), w, None, torch.float32, stream=11)
    assert torch.equal(copy_of_values(copying), w.values) and copying.versions == in_place.versions == (1, 0)


def test_the_driver_is_asked_for_a_capture_id_only_while_torch_captures(monkeypatch):
    """_cuda_capture_id asks cuStreamGetCaptureInfo only while torch says its current stream
    captures, as graph_life's query of the capture's graph does: a test that fakes a capture
    (``_IS_CAPTURING``) with a fake stream handle and no stand-in for the capture id would hand that
    handle to the real driver, which crashes the process on a GPU machine."""
    from cuda.bindings import driver

    def refused(*args):
        raise AssertionError("the driver was asked")

    monkeypatch.setattr(driver, "cuStreamGetCaptureInfo", refused)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert kernels.capture_id(7) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(AssertionError, match="the driver was asked"):
        kernels.capture_id(7)
