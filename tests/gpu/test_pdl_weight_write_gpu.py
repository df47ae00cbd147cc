"""A PDL layer's wait for an in-place weight write while another thread captures a CUDA graph (GPU,
sm_90+; not run on the CPU machine that wrote it). CPU side: tests/integrations/test_torch_pdl_stream_waits.py.

Thread B holds a global-mode ``torch.cuda.graph`` capture open on torch.cuda.graph's capture stream
while thread A writes a ``SPARSILE_PDL=1`` layer's weight in place on a side stream and calls the
layer there: the record waits for the write with a synchronize of each stream it launches on
(integrations/torch/stream_waits.py), not of the device, so B's capture stays valid and replays
right, and A's output is the new weight's. Before, ``torch.cuda.synchronize`` there invalidated B's
capture (backend/runtime/capture_mode.py). Variants: the layer's first call on torch's default
stream (the legacy stream is synchronized during B's capture too), on the side stream, and after a
capture of the layer on the capture stream B captures on (a record launched there: skipped, since
synchronizing a capturing stream would invalidate the capture)."""

from __future__ import annotations

import threading

import pytest

from sparsile.backend.runtime.capture_mode import thread_local_capture_mode
from sparsile.tests.gpu.held_capture import WAIT, hold_capture_open, side_stream
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear, warm_up_on_a_side_stream

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
stream_waits = pytest.importorskip("sparsile.integrations.torch.stream_waits")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _records(layer) -> list:
    cache = layer.__dict__["_records"]
    return [*cache.records.values(), *cache.retired.values()]


@pytest.mark.parametrize("first", ["default", "side", "captured"])
def test_a_pdl_weight_write_during_another_threads_capture_leaves_it_valid(first, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    monkeypatch.setenv("SPARSILE_PDL", "1")
    layer = spt.SparseLinear.from_dense(linear(1024, 2048, seed=53, device="cuda"), "bf16")
    gen = torch.Generator("cuda").manual_seed(53)
    x = torch.randn(4, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    side = side_stream()
    capture_stream = torch.cuda.graph.default_capture_stream.cuda_stream
    if first != "side":
        layer(x)  # torch's default stream (handle 0) first
        torch.cuda.synchronize()
    with torch.cuda.stream(side):  # (a record with a split-K workspace is per stream: none built in the capture)
        layer(x)
    side.synchronize()
    if first == "captured":  # a record launched on the capture stream B captures on below
        warm_up_on_a_side_stream(lambda: layer(x))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(x)
        graph.replay()
        assert any(capture_stream in r.streams for r in _records(layer))
    torch.cuda.synchronize()
    assert _records(layer) and all(r.pdl for r in _records(layer))

    synced, device_syncs, main = [], [], threading.get_ident()
    real_sync, real_device_sync = stream_waits._SYNCHRONIZE, torch.cuda.synchronize
    monkeypatch.setattr(stream_waits, "_SYNCHRONIZE", lambda stream, ordinal: synced.append(stream)
                        or real_sync(stream, ordinal))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: (
        device_syncs.append(device) if threading.get_ident() == main else None) or real_device_sync(device))

    xa = torch.randn(64, 128, device="cuda", generator=gen)
    torch.tanh(xa) * 3 + xa
    with torch.cuda.stream(side):
        # torch's caching allocator must serve this thread's allocations in the capture window from its cache:
        # a cudaMalloc there (global mode, another thread capturing) would fail and invalidate B's capture,
        # whatever sparsile does, and B's torch.cuda.graph empties the cache first. The live keeper holds a
        # 2 MiB segment of the side stream's small pool through that, with room for y and the poison (8 KiB each)
        keeper = torch.empty(1, device="cuda")
    real_device_sync()
    began, done, result = threading.Event(), threading.Event(), {}
    capturer = threading.Thread(target=hold_capture_open, args=(xa, began, done, result))
    capturer.start()
    try:
        assert began.wait(WAIT) and "error" not in result, result.get("error")
        assert result["stream"] == capture_stream
        with torch.cuda.stream(side):
            poison = torch.full((4, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
            del poison  # (its block is y's: a y the kernel does not fully write keeps NaNs)
            values = layer.values
            values.view(torch.int16).bitwise_xor_(-32768)  # every value's sign flipped: the kernel right before
            y = layer(x)
        with thread_local_capture_mode():  # (in global mode a stream synchronize during B's capture is refused)
            side.synchronize()
    finally:
        done.set()
        capturer.join(WAIT)
    assert "error" not in result, f"the capture failed: {result.get('error')!r}"
    torch.testing.assert_close(result["ya"].double(), torch.tanh(xa.double()) * 3 + xa.double(), rtol=1e-6, atol=1e-6)
    assert device_syncs == []  # no device-wide synchronize on this thread
    # the record A called waited on each stream it launches on, the capturing one excepted, which was
    # asked about and skipped (a captured record of the weight, synced by A's call: "captured")
    record, _ = layer.__dict__["_records"].last
    assert side.cuda_stream in synced and capture_stream not in synced
    assert set(record.streams) - {capture_stream} <= set(synced)
    assert record.versions == tuple(t._version for t in record.tracked)
    check_against_float64(layer, x, y)  # the new weight's result
    del keeper
