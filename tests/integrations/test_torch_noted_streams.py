"""Which stream handles sparsile.torch may name after the call that noted them
(integrations/torch/noted_streams.py): the per-thread default stream (2) stands for a different stream
on each thread, so it is never noted as a capture stream and the marks of a record's buffers used on it
go to the legacy stream; a stream somebody else owns (an ExternalStream) is not lasting. The waits of PDL
records over these rules: test_torch_pdl_stream_waits.py. On the GPU: tests/gpu/test_torch_noted_streams_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.backend.runtime import capture_mode  # noqa: E402
from sparsile.integrations.torch import graph_pools, noted_streams  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)


def test_neither_legacy_handle_nor_the_per_thread_one_is_noted_as_a_capture_stream(monkeypatch):
    """captures_under_way asks every noted stream on whatever thread calls it: handle 2 there would be
    that thread's per-thread stream, and CU_STREAM_LEGACY (1) the legacy stream, whose question during
    a blocking stream's capture is an implicit synchronization. Before, both were noted (only 0 was not)."""
    noted: dict[int, int] = {}
    asked: list[int] = []
    monkeypatch.setattr(capture_mode, "_capture_streams", noted)
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: asked.append(stream) or False)
    for stream in (0, 1, 2, 0x5A0):
        capture_mode.note_capture_stream(stream, 1)
    assert noted == {0x5A0: 1}
    assert not capture_mode.captures_under_way() and asked == [0x5A0]


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it is a CUDA tensor and logs the streams it is marked used on."""

    marks: ClassVar[list] = []

    @property
    def is_cuda(self) -> bool:
        return True

    def record_stream(self, stream) -> None:
        _CudaLike.marks.append(stream)


def test_buffers_used_on_the_per_thread_stream_are_marked_used_on_the_legacy_stream(monkeypatch):
    """torch's allocator records its free event on the stream a buffer is marked used on, on the thread
    that frees it: ExternalStream(2) would be the freeing thread's per-thread stream. The legacy stream
    waits for every per-thread one: the mark goes there, as for 0 and 1; another handle is marked as it
    is. Before, 1 and 2 were marked as ExternalStream(1), ExternalStream(2)."""
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device: ("default", device))
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda stream, device: ("external", stream, device))
    _CudaLike.marks = []
    t = torch.randn(3).as_subclass(_CudaLike)
    for stream in (0, 1, 2, 0x5A0):
        graph_pools.used_on([t, None], stream)
    device = t.device
    assert _CudaLike.marks == [("default", device)] * 3 + [("external", 0x5A0, device)]


def test_lasting_streams_are_the_default_ones_and_those_torch_created(monkeypatch):
    """The legacy handles, the per-thread one and None (off CUDA) are lasting without a question; any
    other handle only where it is torch's current stream and torch created it (an odd stream id)."""
    current = SimpleNamespace(cuda_stream=0x5A0, stream_id=0x5A0)  # an external stream: its id is its handle
    asked = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda ordinal: asked.append(ordinal) or current)
    assert all(noted_streams.lasting(s, 3) for s in (None, 0, 1, 2)) and asked == []
    assert not noted_streams.lasting(0x5A0, 3) and asked == [3]
    current.stream_id = 0x13  # torch's pool stream of that handle
    assert noted_streams.lasting(0x5A0, 3)
    assert not noted_streams.lasting(0x6B0, 3)  # not the current stream: not known to be torch's
    monkeypatch.setattr(torch.cuda, "current_stream", lambda ordinal: 1 / 0)  # no CUDA
    assert not noted_streams.lasting(0x5A0, 0)
    assert [noted_streams.waited_as(s) for s in (0, 1, 2, 0x5A0)] == [0, 0, 0, 0x5A0]


class _StreamIds:
    """The fake driver's stream ids (``noted_streams._STREAM_ID``): each handle's current stream has an id,
    unique for the life of the test; :meth:`recreate` destroys a handle's stream and creates another under the
    same handle (a new id), as the driver may hand out a destroyed stream's handle again. Logs each handle asked."""

    def __init__(self):
        self.ids: dict[int, int] = {}
        self.asked: list[int] = []
        self.next = 1000

    def recreate(self, stream: int) -> None:
        self.next += 1
        self.ids[stream] = self.next

    def __call__(self, stream: int) -> int | None:
        self.asked.append(stream)
        if stream not in self.ids:
            self.recreate(stream)
        return self.ids[stream]


@pytest.fixture
def stream_ids(fake, monkeypatch) -> _StreamIds:
    """Stream 40 somebody else owns (an ExternalStream of a cuda-python or CuPy stream), every other fake
    stream torch's; a plan of two launches (split-K: a workspace, so a record per stream); the fake stream ids."""
    ids = _StreamIds()
    monkeypatch.setattr(noted_streams, "_STREAM_ID", ids)
    fake.foreign_streams.add(40)
    fake.n_launches = 2
    return ids


def _scratch_records(cache) -> list:
    return [r for r in cache.records.values() if r.owns_workspace]


def test_a_stream_created_under_a_destroyed_foreign_stream_s_handle_gets_a_record_of_its_own(stream_ids, fake):
    """A record with scratch (a split-K workspace) serves one stream: eager calls there run in order. A foreign
    stream (40) is destroyed by its owner, possibly with work using the workspace still queued, and the driver
    gives its handle to a new stream: the new stream's calls must not share that workspace (two streams, no order
    between them: a race, wrong numbers). The driver's stream id tells them apart: the new stream gets a record of
    its own, as a new handle would. Before, the handle alone found the old stream's record."""
    from sparsile.integrations.torch.record_cache import RecordCache
    from sparsile.tests.integrations.record_fakes import copy_of_values

    cache, w = RecordCache(), _weight_of_fakes()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    (old,) = _scratch_records(cache)
    stream_ids.recreate(40)  # the owner destroys stream 40; a new stream gets handle 40
    y = cache.run((4,), x, w, None, torch.float32, stream=40)
    new = [r for r in _scratch_records(cache) if r is not old]
    assert len(new) == 1 and cache.last == (new[0], 40)
    assert copy_of_values(new[0]).data_ptr() != copy_of_values(old).data_ptr()  # (its own buffers)
    *_, params = fake.launches[-1]  # (the new record's launch: x and y of this call)
    assert params[:2] == [x.data_ptr().to_bytes(8, "little"), y.data_ptr().to_bytes(8, "little")]
    cache.run((4,), x, w, None, torch.float32, stream=40)  # the new stream's record serves it from now on
    assert cache.last == (new[0], 40) and len(_scratch_records(cache)) == 2


def test_a_torch_stream_s_calls_never_ask_the_driver_for_a_stream_id(stream_ids, fake):
    """Only a stream somebody else owns can be destroyed and its handle reused: a stream torch created (or the
    default streams) is never asked about (no driver call added to its calls), a foreign one once per call."""
    from sparsile.integrations.torch.record_cache import RecordCache

    cache, w = RecordCache(), _weight_of_fakes()
    x = torch.randn(4, 32)
    for stream in (11, 0, 2, 11):
        cache.run((4,), x, w, None, torch.float32, stream=stream)
    assert stream_ids.asked == []
    cache.run((4,), x, w, None, torch.float32, stream=40)
    asked = len(stream_ids.asked)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    assert len(stream_ids.asked) == asked + 1 and set(stream_ids.asked) == {40}


def test_a_layer_s_last_call_on_a_reused_foreign_handle_takes_the_full_path(stream_ids, fake):
    """A layer's fast path (LastCall) launches its last record on the same handle without a cache lookup: on a
    new stream under a destroyed foreign stream's handle it launches nothing and returns None, and the full
    path plans the new stream a record of its own. Before, the fast path launched the old stream's record."""
    from sparsile.integrations.torch.last_call import LastCall
    from sparsile.integrations.torch.record_cache import RecordCache

    cache, w = RecordCache(), _weight_of_fakes()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    last = LastCall.of(cache, x, lambda: 40, (4,))
    assert last is not None and last(x) is not None
    stream_ids.recreate(40)
    launched = len(fake.launches)
    assert last(x) is None and len(fake.launches) == launched
    cache.run((4,), x, w, None, torch.float32, stream=40)
    again = LastCall.of(cache, x, lambda: 40, (4,))
    assert again is not None and again.record is not last.record and again(x) is not None


def test_without_a_stream_id_a_foreign_handle_decides_as_before(stream_ids, fake, monkeypatch):
    """Where the driver gives no stream id (before CUDA 12) the handle alone decides, as before: one record."""
    from sparsile.integrations.torch.record_cache import RecordCache

    monkeypatch.setattr(noted_streams, "_STREAM_ID", lambda stream: None)
    cache, w = RecordCache(), _weight_of_fakes()
    x = torch.randn(4, 32)
    for _ in range(3):
        cache.run((4,), x, w, None, torch.float32, stream=40)
    assert len(_scratch_records(cache)) == 1


def _weight_of_fakes():
    from sparsile.tests.integrations.record_fakes import _weight

    return _weight()


def test_the_stream_id_is_the_driver_s_cu_stream_get_id_or_none(monkeypatch):
    """noted_streams._cuda_stream_id: cuStreamGetId of the handle; None where the driver answers an error or
    the binding raises (no driver library, a binding before CUDA 12)."""
    from cuda.bindings import driver

    answers = [(driver.CUresult.CUDA_SUCCESS, 77), (driver.CUresult.CUDA_ERROR_INVALID_HANDLE, 0)]
    asked = []

    def get_id(stream):
        asked.append(int(stream))
        if not answers:
            raise RuntimeError("no driver")
        return answers.pop(0)

    monkeypatch.setattr(driver, "cuStreamGetId", get_id)
    assert [noted_streams._cuda_stream_id(0x5A0) for _ in range(3)] == [77, None, None]
    assert asked == [0x5A0] * 3


def test_no_stream_id_is_asked_inside_a_capture(stream_ids, fake, monkeypatch):
    """A capture plans a record of its own per capture (its id, capture_keys.scratch_key): the stream id is
    not asked there (a capturing stream refuses cuStreamGetId)."""
    from sparsile.integrations.torch import _kernels as kernels
    from sparsile.integrations.torch.record_cache import RecordCache

    cache, w = RecordCache(), _weight_of_fakes()
    x = torch.randn(4, 32)
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: True)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    cache.run((4,), x, w, None, torch.float32, stream=40)
    assert stream_ids.asked == []


def test_the_foreign_handles_a_cache_keeps_are_bounded_by_its_live_records(stream_ids, fake):
    """A server that makes a stream per request (each somebody else's, each a new handle) calls one layer on
    thousands of streams: the cache keeps at most ``capacity`` records of the weight, and the handles it notes
    as foreign (``RecordCache.foreign``: where a record with scratch is kept under the stream's driver id too)
    are those of its live records, plus a bounded slack. Before, every handle ever seen stayed in the set. A
    handle forgotten and seen again is keyed by its driver id as before: a new stream under it gets its own
    record, the same stream finds its record."""
    from sparsile.integrations.torch.record_cache import RecordCache

    cache, w = RecordCache(capacity=4), _weight_of_fakes()
    x = torch.randn(4, 32)
    streams = range(1000, 1600)
    fake.foreign_streams.update(streams)
    for stream in streams:
        cache.run((4,), x, w, None, torch.float32, stream=stream)
    assert len(_scratch_records(cache)) == 4
    live = {r.key[-2] for r in _scratch_records(cache)}
    assert live <= cache.foreign and len(cache.foreign) <= 4 + 64
    cache.run((4,), x, w, None, torch.float32, stream=1000)  # forgotten long ago: keyed by its driver id again
    (again,) = [r for r in _scratch_records(cache) if r.key[-2] == 1000]
    assert again.key[-1] == ("stream", stream_ids.ids[1000]) and 1000 in cache.foreign
    cache.run((4,), x, w, None, torch.float32, stream=1000)
    assert cache.last == (again, 1000)  # the same stream: its record
    stream_ids.recreate(1000)
    cache.run((4,), x, w, None, torch.float32, stream=1000)
    assert cache.last[0] is not again  # a new stream under the handle: a record of its own
