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
