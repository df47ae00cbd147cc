"""A PDL launch record's wait for the writes to its weight (``LaunchRecord.weight_written``,
integrations/torch/stream_waits.py): one stream synchronize per stream its kernels launch on (torch's
current stream and each stream the record launched on), in thread-local capture mode, never a
device-wide ``torch.cuda.synchronize`` (which invalidates another thread's CUDA graph capture); a
stream capturing now (or that the driver says nothing about) skipped, nothing while the calling
thread's own stream captures, nothing for a record without PDL. With the stand-ins of record_fakes.py
(the fake streams are small ints, never given to the driver). On the GPU, another thread's
``torch.cuda.graph`` capture during such a wait: tests/gpu/test_pdl_weight_write_gpu.py."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import record_cache, stream_waits  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import _weight, frees_wait_for_a_capture_on  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)


@pytest.fixture
def waits(fake, monkeypatch) -> SimpleNamespace:
    """PDL wanted on this (CPU) device, a plan reading the weight in place (a write needs no new
    record) and no split-K workspace (a record serves every stream); torch's current stream faked
    (``current``, None: off CUDA); each stream synchronize logged with whether it ran in thread-local
    capture mode, each capture question logged; a device synchronize fails the test."""
    log = SimpleNamespace(syncs=[], asked=[], thread_local=False, current=None, capturing=fake.capturing_streams)

    @contextmanager
    def thread_local():
        log.thread_local = True
        try:
            yield
        finally:
            log.thread_local = False

    def device_synchronize(device=None):
        raise AssertionError(f"torch.cuda.synchronize({device!r}): a device-wide synchronize")

    def capturing(stream):
        log.asked.append(stream)
        return log.capturing.get(stream, False)

    fake.reads_weight = True
    monkeypatch.setattr(record_cache, "pdl_wanted", lambda device: True)
    monkeypatch.setattr(torch.cuda, "synchronize", device_synchronize)
    monkeypatch.setattr(stream_waits, "thread_local_capture_mode", thread_local)
    monkeypatch.setattr(stream_waits, "_SYNCHRONIZE", lambda stream, ordinal: log.syncs.append(
        (stream, ordinal, log.thread_local)))
    monkeypatch.setattr(stream_waits, "_CAPTURING", capturing)
    monkeypatch.setattr(kernels, "_current_stream", lambda device: log.current)
    return log


def _on_streams(cache: RecordCache, w, *streams: int):
    """Calls of ``cache`` through ``w`` on each of ``streams`` (one record, built at the first)."""
    x = torch.randn(4, 32)
    for stream in streams:
        cache.run((4,), x, w, None, torch.float32, stream=stream)
    (record,) = cache.records.values()
    return record, x


def test_a_weight_write_syncs_the_current_stream_and_the_records_streams_not_the_device(waits):
    cache, w = RecordCache(pdl=True), _weight()
    waits.current = 11
    record, x = _on_streams(cache, w, 11)
    assert record.pdl and waits.syncs == [(11, 0, True)]  # built: the writes queued so far waited for
    _on_streams(cache, w, 12, 11, 12)
    # no write: no wait but at the first launch on 12, which the build's wait did not name (a write queued there)
    assert record.streams == {11, 12} and waits.syncs == [(11, 0, True), (12, 0, True)]
    _on_streams(cache, w, 11, 12)
    assert len(waits.syncs) == 2
    waits.syncs.clear()
    waits.asked.clear()
    w.values.add_(1.0)  # an in-place write, queued on torch's current stream
    waits.current = 13
    cache.run((4,), x, w, None, torch.float32, stream=13)
    # the current stream (the write's and this call's) and each stream the record launched on, once each,
    # in thread-local capture mode
    assert waits.syncs == [(11, 0, True), (12, 0, True), (13, 0, True)]
    assert waits.asked == [11, 12, 13]
    waits.syncs.clear()
    cache.run((4,), x, w, None, torch.float32, stream=13)
    assert waits.syncs == []


def test_a_stream_capturing_now_is_skipped_and_one_the_driver_says_nothing_about(waits):
    cache, w = RecordCache(pdl=True), _weight()
    _, x = _on_streams(cache, w, 11, 12, 14)
    waits.syncs.clear()
    waits.asked.clear()
    waits.capturing.update({12: True, 14: None})  # another thread captures on 12; 14: no answer
    w.values.mul_(2.0)
    waits.current = 13
    cache.run((4,), x, w, None, torch.float32, stream=13)
    assert waits.syncs == [(11, 0, True), (13, 0, True)]
    assert waits.asked == [11, 12, 13, 14]


def test_the_legacy_default_stream_is_synchronized_without_being_asked(waits):
    """Handle 0 (torch's default stream) and CU_STREAM_LEGACY (1) are one stream, which cannot
    capture: synchronized once, never asked (asking it during a blocking stream's capture is an
    implicit synchronization); None (off CUDA) and repeats are dropped."""
    assert stream_waits.wait_for_streams([5, None, 1, 0, 5, 3], 2) == [0, 3, 5]
    assert waits.syncs == [(0, 2, True), (3, 2, True), (5, 2, True)]
    assert waits.asked == [3, 5]
    assert stream_waits.wait_for_streams([None], 0) == [] and len(waits.syncs) == 3


def test_the_device_of_the_weight_is_the_one_synchronized_on(waits, monkeypatch):
    cache, w = RecordCache(pdl=True), _weight()
    record, _ = _on_streams(cache, w, 11)
    waits.syncs.clear()
    seen = []
    monkeypatch.setattr(kernels, "_current_stream", lambda device: seen.append(device) or 30)
    monkeypatch.setattr(record, "weight", SimpleNamespace(values=SimpleNamespace(device=torch.device("cuda", 3))))
    record.weight_written(record.versions)
    assert waits.syncs == [(11, 3, True), (30, 3, True)] and seen == [torch.device("cuda", 3)]


def test_nothing_is_waited_for_by_a_record_without_pdl(waits, monkeypatch):
    for cache in (RecordCache(), RecordCache(pdl=True)):  # a cache without PDL; PDL not wanted on the device
        if cache.pdl:
            monkeypatch.setattr(record_cache, "pdl_wanted", lambda device: False)
        waits.current = 11
        w = _weight()
        record, x = _on_streams(cache, w, 11, 12)
        w.values.add_(1.0)
        cache.run((4,), x, w, None, torch.float32, stream=11)
        assert cache.sync(w.values) == 0
        record.weight_written(record.versions)
        assert not record.pdl and waits.syncs == [] and waits.asked == []


def test_nothing_is_waited_for_while_the_calling_threads_stream_captures(waits, monkeypatch):
    """Inside the thread's own capture a synchronize is refused and invalidates it: no stream is
    synchronized, none asked (the write captured runs at the graph's replay)."""
    cache, w = RecordCache(pdl=True), _weight()
    record, _ = _on_streams(cache, w, 11, 12)
    waits.syncs.clear()
    waits.asked.clear()
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    waits.current = 11
    record.weight_written(record.versions)
    assert waits.syncs == [] and waits.asked == []
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    record.weight_written(record.versions)
    assert waits.syncs == [(11, 0, True), (12, 0, True)]


def test_sync_waits_on_the_writing_stream_and_every_stream_the_record_launched_on(waits):
    """RecordCache.sync (load_state_dict, SemiSparseLinear.refresh): the write was queued on torch's
    current stream, and the record may launch next on any stream it launched on."""
    cache, w = RecordCache(pdl=True), _weight()
    record, x = _on_streams(cache, w, 11, 12)
    waits.syncs.clear()
    w.values.copy_(torch.randn(8, 16))
    waits.current = 21
    assert cache.sync(w.values) == 0
    assert waits.syncs == [(11, 0, True), (12, 0, True), (21, 0, True)]
    assert record.versions == tuple(t._version for t in record.tracked)
    waits.syncs.clear()
    cache.run((4,), x, w, None, torch.float32, stream=21)  # the write was waited for already
    assert waits.syncs == []


def test_a_stream_synchronize_is_the_driver_s_with_the_device_current(monkeypatch):
    """The real synchronize: cuStreamSynchronize of the handle under torch's device guard of the
    weight's device (the legacy stream is that context's); a failure is SP0715 naming the call."""
    from cuda.bindings import driver

    from sparsile.backend.runtime.devices import CudaError

    log, results = [], [driver.CUresult.CUDA_SUCCESS, driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED]

    @contextmanager
    def device(ordinal):
        log.append(("enter", ordinal))
        try:
            yield
        finally:
            log.append(("leave", ordinal))

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(driver, "cuStreamSynchronize", lambda stream: log.append(("sync", int(stream)))
                        or (results.pop(0),))
    stream_waits._cuda_stream_synchronize(0x77, 2)
    assert log == [("enter", 2), ("sync", 0x77), ("leave", 2)]
    with pytest.raises(CudaError) as exc:
        stream_waits._cuda_stream_synchronize(0, 1)
    assert exc.value.code == "SP0715" and "cuStreamSynchronize failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" \
        in str(exc.value)
    assert log[3:] == [("enter", 1), ("sync", 0), ("leave", 1)]


def test_the_per_thread_default_stream_is_waited_for_as_the_legacy_stream_on_any_thread(waits):
    """CU_STREAM_PER_THREAD (2) names the *calling* thread's per-thread stream: a record that launched
    on it in thread A, waited for from thread B, must not have 2 asked or synchronized there (B's own
    stream, not A's). Every per-thread stream is a blocking stream, which the legacy stream waits for:
    the legacy stream is synchronized for it, never asked (noted_streams.py)."""
    assert stream_waits.wait_for_streams([2, 5, 1], 3) == [0, 5]
    assert waits.syncs == [(0, 3, True), (5, 3, True)] and waits.asked == [5]
    waits.syncs.clear()
    waits.asked.clear()
    cache, w = RecordCache(pdl=True), _weight()
    x = torch.randn(4, 32)
    waits.current = 2
    thread_a = threading.Thread(target=cache.run, args=((4,), x, w, None, torch.float32), kwargs={"stream": 2})
    thread_a.start()
    thread_a.join()
    (record,) = cache.records.values()
    assert record.streams == {2} and waits.syncs == [(0, 0, True)]
    waits.syncs.clear()
    w.values.add_(1.0)
    waits.current = 11
    cache.run((4,), x, w, None, torch.float32, stream=11)  # thread B (this one), another stream
    assert waits.syncs == [(0, 0, True), (11, 0, True)] and 2 not in waits.asked


def _foreign_stream_log(waits, fake, monkeypatch) -> list[int]:
    """Make stream 40 one somebody else owns (an ExternalStream of a cuda-python stream); the handles
    named to the (fake) driver after ``destroyed`` held them are logged in the list returned."""
    fake.foreign_streams.add(40)
    named_dead: list[int] = []
    waits.destroyed = set()
    sync, capturing = stream_waits._SYNCHRONIZE, stream_waits._CAPTURING

    def checked(call):
        def named(stream, *args):
            if stream in waits.destroyed:
                named_dead.append(stream)
            return call(stream, *args)
        return named

    monkeypatch.setattr(stream_waits, "_SYNCHRONIZE", checked(sync))
    monkeypatch.setattr(stream_waits, "_CAPTURING", checked(capturing))
    return named_dead


def test_a_stream_somebody_else_owns_is_never_named_after_its_owner_may_have_destroyed_it(waits, fake, monkeypatch):
    """A PDL record launched on a foreign stream (40) while it was current; the owner destroys it and
    the weight is written: the wait of the next call (on 11) names 11 only, and the record forgets 40
    (asking or synchronizing a destroyed handle is undefined behaviour: a crash, or another stream
    created since under that handle). Before, the wait asked cuStreamIsCapturing(40) and synchronized
    it. A stream created later under handle 40 and made current is waited for at the record's first
    launch there (a write queued on it before)."""
    named_dead = _foreign_stream_log(waits, fake, monkeypatch)
    cache, w = RecordCache(pdl=True), _weight()
    waits.current = 11
    record, x = _on_streams(cache, w, 11)
    waits.current = 40
    cache.run((4,), x, w, None, torch.float32, stream=40)
    assert record.streams == {11, 40} and waits.syncs == [(11, 0, True), (40, 0, True)]  # 40 current: alive
    waits.syncs.clear()
    waits.destroyed.add(40)  # its owner destroys it
    w.values.add_(1.0)
    waits.current = 11
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert waits.syncs == [(11, 0, True)] and record.streams == {11}
    w.values.add_(1.0)
    assert cache.sync(w.values) == 0 and waits.syncs == [(11, 0, True)] * 2
    assert named_dead == []
    waits.destroyed.clear()  # a new stream under handle 40, a write queued on it, then a call there
    waits.syncs.clear()
    waits.current = 40
    cache.run((4,), x, w, None, torch.float32, stream=40)
    assert waits.syncs == [(40, 0, True)] and record.streams == {11, 40}
    cache.run((4,), x, w, None, torch.float32, stream=40)
    assert waits.syncs == [(40, 0, True)]


def test_a_layer_s_last_call_on_a_forgotten_stream_takes_the_full_path(waits, fake, monkeypatch):
    """RecordCache.sync (load_state_dict) with another stream current forgets the foreign stream of
    the cache's last call (40): that last call ends (``cache.last`` None), so a layer's fast path on
    40 (LastCall, which skips the record's first-launch wait) does not launch there unwaited-for."""
    named_dead = _foreign_stream_log(waits, fake, monkeypatch)
    cache, w = RecordCache(pdl=True), _weight()
    waits.current = 40
    record, _ = _on_streams(cache, w, 40)
    assert cache.last == (record, 40)
    waits.destroyed.add(40)
    w.values.add_(1.0)
    waits.current = 11
    waits.syncs.clear()
    assert cache.sync(w.values) == 0
    assert waits.syncs == [(11, 0, True)] and cache.last is None and named_dead == []


def test_a_forgotten_foreign_stream_is_still_asked_before_the_record_s_buffers_are_freed(waits, fake, monkeypatch):
    """A PDL record launched on a foreign stream (40), whose buffers are marked used there (``record_stream``):
    a weight write's wait on another stream forgets 40 (never synchronized from a note), but torch's free of
    those buffers still records an event on 40 (cudaMallocAsync: event on 40, the allocation stream waits for
    it, then ``cudaFreeAsync``). Where another thread captures on 40 then, that event joins the allocation
    stream into the capture and the free becomes a node of its graph: graph_life.frees_captured must still
    ask 40 (the owner keeps it alive while the record lives, as torch's free needs). Before, forgetting 40 took
    it out of the only set frees_captured asks, and the record was let go of into that capture."""
    fake.foreign_streams.add(40)
    cache, w = RecordCache(pdl=True), _weight()
    waits.current = 11
    record, x = _on_streams(cache, w, 11)
    waits.current = 40
    cache.run((4,), x, w, None, torch.float32, stream=40)
    w.values.add_(1.0)
    waits.current = 11
    cache.run((4,), x, w, None, torch.float32, stream=11)
    assert 40 not in record.streams  # forgotten: never named by a later wait
    assert frees_wait_for_a_capture_on(record, 40, monkeypatch)  # thread B captures on 40
