"""The stream handles a PDL layer's records note, on the GPU (sm_90+; not run on the CPU machine that
wrote it). CPU side: tests/integrations/test_torch_noted_streams.py, test_torch_pdl_stream_waits.py.

* A synchronize of the legacy stream waits for another thread's per-thread stream (what the wait for
  handle 2 rests on).
* The per-thread default stream (``torch.cuda.ExternalStream(2)``) used by a call on another thread:
  the wait for a later weight write on this thread synchronizes the legacy stream for it, never
  handle 2 (this thread's own per-thread stream), and the result is the new weight's.
* A stream somebody else owns (a cuda-python stream wrapped in ``torch.cuda.ExternalStream``): after
  a weight write, a call on another stream never names its handle to the driver (its owner may have
  destroyed it); the record's next call there waits for it again. The stream is destroyed only after
  the layer's records are freed: torch's allocator names it when their buffers go (the contract of
  ``ExternalStream``; docs/torch.md, "Streams a launch record notes")."""

from __future__ import annotations

import gc
import threading

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")
stream_waits = pytest.importorskip("sparsile.integrations.torch.stream_waits")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _pdl_layer(monkeypatch, seed: int):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+")
    monkeypatch.setenv("SPARSILE_PDL", "1")
    layer = spt.SparseLinear.from_dense(linear(1024, 2048, seed=seed, device="cuda"), "bf16")
    gen = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(4, 2048, device="cuda", generator=gen).to(torch.bfloat16)
    return layer, x


def _named(monkeypatch) -> list[int]:
    """The handles the records' waits synchronize or ask about, in order (the real calls still run)."""
    named: list[int] = []
    sync, capturing = stream_waits._SYNCHRONIZE, stream_waits._CAPTURING
    monkeypatch.setattr(stream_waits, "_SYNCHRONIZE", lambda s, o: named.append(s) or sync(s, o))
    monkeypatch.setattr(stream_waits, "_CAPTURING", lambda s: named.append(s) or capturing(s))
    return named


def _flip(layer) -> None:
    """Flip every weight value's sign in place on torch's current stream, and bring the layer's records
    up to it now (``RecordCache.sync``, as load_state_dict does): each record's wait runs here, on
    this thread, whichever stream its calls ran on (a record with a split-K workspace is per stream)."""
    layer.values.view(torch.int16).bitwise_xor_(-32768)
    layer.__dict__["_records"].sync(layer.values)


def _call_on(layer, x, stream):
    """The layer's output for ``x`` on ``stream`` (poisoned first), with ``stream`` synchronized."""
    with torch.cuda.stream(stream):
        poison = torch.full((4, 1024), float("nan"), device="cuda", dtype=torch.bfloat16)
        del poison  # (its block is y's)
        y = layer(x)
    stream.synchronize()
    return y


def _records_on(layer, stream: int) -> list:
    cache = layer.__dict__["_records"]
    return [r for r in (*cache.records.values(), *cache.retired.values()) if stream in r.streams]


def test_the_legacy_stream_s_synchronize_waits_for_another_threads_per_thread_stream():
    """What the wait for handle 2 rests on (noted_streams.py): a per-thread default stream is a blocking
    stream, so a synchronize of the legacy stream on this thread waits for the work another thread
    queued on its own per-thread stream (here a ~0.5 s sleep kernel, then an event)."""
    out: dict = {}

    def queue() -> None:
        per_thread = torch.cuda.ExternalStream(2)
        with torch.cuda.stream(per_thread):
            torch.cuda._sleep(1_000_000_000)
            out["event"] = torch.cuda.Event()
            out["event"].record(per_thread)

    torch.cuda.synchronize()
    thread = threading.Thread(target=queue)
    thread.start()
    thread.join(60)
    assert not out["event"].query()  # still sleeping
    assert stream_waits.wait_for_streams([2], torch.cuda.current_device()) == [0]
    assert out["event"].query()
    torch.cuda.synchronize()


def test_a_call_on_another_threads_per_thread_stream_is_waited_for_as_the_legacy_stream(monkeypatch):
    layer, x = _pdl_layer(monkeypatch, 54)
    named = _named(monkeypatch)
    out: dict = {}

    def on_per_thread_stream():
        try:
            out["y"] = _call_on(layer, x, torch.cuda.ExternalStream(2))
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=on_per_thread_stream)
    thread.start()
    thread.join(60)
    assert "error" not in out, out.get("error")
    check_against_float64(layer, x, out["y"])
    assert _records_on(layer, 2) and all(r.pdl for r in _records_on(layer, 2)) and 2 not in named
    named.clear()
    _flip(layer)  # thread B (this one): the record of thread A's per-thread stream waits for the write
    assert 0 in named and 2 not in named  # the legacy stream stands for thread A's per-thread stream
    check_against_float64(layer, x, _call_on(layer, x, torch.cuda.Stream()))


def _on_a_foreign_stream(monkeypatch, layer, x, foreign: int) -> None:
    ext = torch.cuda.ExternalStream(foreign)
    check_against_float64(layer, x, _call_on(layer, x, ext))
    (record,) = _records_on(layer, foreign)
    assert record.pdl and foreign in record.foreign
    named = _named(monkeypatch)
    _flip(layer)  # torch's default stream current: the foreign stream is not named, and is forgotten
    assert foreign not in named and 0 in named and foreign not in record.streams
    check_against_float64(layer, x, _call_on(layer, x, torch.cuda.Stream()))
    named.clear()
    y = _call_on(layer, x, ext)  # current (alive) again: waited for at the record's next launch there
    assert foreign in named and foreign in record.streams
    check_against_float64(layer, x, y)


def test_a_foreign_stream_is_not_named_by_a_write_s_wait_on_another_stream(monkeypatch):
    from cuda.bindings import driver

    layer, x = _pdl_layer(monkeypatch, 55)
    err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert err == driver.CUresult.CUDA_SUCCESS
    try:
        _on_a_foreign_stream(monkeypatch, layer, x, int(handle))
    finally:  # the records' buffers (marked used on it) and the blocks torch cached for it freed first
        del layer
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        driver.cuStreamDestroy(handle)


def test_lasting_tells_torch_s_own_streams_from_external_ones_on_this_torch():
    """noted_streams.lasting reads torch's StreamId encoding (c10/cuda/CUDAStream.cpp, "StreamId assignment": a
    native pool stream's id has its last bit set, an external stream's id is its even cudaStream_t pointer): on
    the torch installed, each kind of stream, made current, is told apart. Pool streams of either priority and
    torch.cuda.graph's capture stream are lasting; an ExternalStream of a cuda-python stream is not; the default
    and per-thread handles are lasting by their handle."""
    from cuda.bindings import driver

    from sparsile.integrations.torch import noted_streams

    graph_stream = torch.cuda.graph(torch.cuda.CUDAGraph()).capture_stream  # (the class's default capture stream)
    for stream in (torch.cuda.Stream(), torch.cuda.Stream(priority=-1), graph_stream,
                   torch.cuda.default_stream(), torch.cuda.ExternalStream(2)):
        with torch.cuda.stream(stream):
            assert noted_streams.lasting(stream.cuda_stream, torch.cuda.current_device()), (stream, stream.stream_id)
    err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert err == driver.CUresult.CUDA_SUCCESS
    try:
        ext = torch.cuda.ExternalStream(int(handle))
        with torch.cuda.stream(ext):
            assert not noted_streams.lasting(int(handle), torch.cuda.current_device()), ext.stream_id
    finally:
        driver.cuStreamDestroy(handle)


def test_a_record_with_scratch_on_a_foreign_stream_is_kept_under_the_driver_s_stream_id():
    """An e4m3 layer's record (its own quantized x: scratch, so a record per stream) called on a cuda-python
    stream (an ExternalStream: foreign) is kept under that stream's cuStreamGetId id (capture_keys.foreign_key);
    the layer's fast path serves there, and both paths are right (float64). The stream is then destroyed and
    streams are created until the driver hands out its handle again (within 64 tries, else that part is
    skipped): the new stream's call gets a record of its own (another id), right too. Not run on the CPU
    machine that wrote it. The stream ids of torch's streams are distinct and stable (the real query)."""
    from cuda.bindings import driver

    from sparsile.integrations.torch import noted_streams
    from sparsile.integrations.torch.capture_keys import foreign_id
    from sparsile.tests.gpu.test_torch_graph_owners_gpu import e4m3_layer, eager, input_of

    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    ids = [noted_streams._cuda_stream_id(s.cuda_stream) for s in (a, b, a)]
    assert None not in ids and ids[0] == ids[2] != ids[1], ids

    def create() -> int:
        err, handle = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        assert err == driver.CUresult.CUDA_SUCCESS
        return int(handle)

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("e4m3 layers need sm_90+")
    layer = e4m3_layer()
    cache = layer.__dict__["_records"]
    x = input_of(56)
    handle = create()
    keep: list[int] = []
    old = mine = None
    destroyed = reused = False
    try:
        ext = torch.cuda.ExternalStream(handle)
        for _ in range(3):  # full path, then the fast path
            check_against_float64(layer, x, eager(layer, x, ext))
        mine = [r for r in cache.records.values() if foreign_id(r.key)[0] and r.key[-2] == handle]
        assert len(mine) == 1 and layer.__dict__["_last"] is not None, list(cache.records)
        old = mine[0]
        assert foreign_id(old.key)[1] == noted_streams._cuda_stream_id(handle)
        torch.cuda.synchronize()
        driver.cuStreamDestroy(driver.CUstream(handle))
        destroyed = True
        for _ in range(64):
            h = create()
            if h == handle:
                reused = True
                break
            keep.append(h)
        if not reused:
            pytest.skip("the driver did not hand out the destroyed stream's handle again in 64 creations")
        ext = torch.cuda.ExternalStream(handle)
        for _ in range(3):
            check_against_float64(layer, x, eager(layer, x, ext))
        mine = [r for r in cache.records.values() if foreign_id(r.key)[0] and r.key[-2] == handle]
        assert len(mine) == 2 and old in mine and cache.last[0] is not old, list(cache.records)
    finally:
        if destroyed and not reused:  # the old record's buffers are marked used on a destroyed handle: torch's
            _LEAKED.append((layer, cache, old, mine))  # free would name it, so they are never freed (a test leak)
        del layer, cache, old, mine
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        for h in (*keep, *((handle,) if reused or not destroyed else ())):
            driver.cuStreamDestroy(driver.CUstream(h))


_LEAKED: list = []
"""What a test kept alive for good: records whose buffers are marked used on a stream handle destroyed under them."""
