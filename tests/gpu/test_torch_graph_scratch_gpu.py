"""CUDA graphs of one layer replayed concurrently (integrations/torch/capture_keys.py): two graphs
captured on one stream after a warm-up there, each with its own static x, replayed at once on two
streams many times; and one graph replayed on a side stream while eager calls run on the capture
stream. Each launch record with scratch (an e4m3 layer's quantized copy of x and its per-token
scales; a split-K workspace) belongs to one capture or one stream: shared, the replays raced on it
and returned another input's numbers (a silent wrong result). Every output is compared with float64
(y poisoned with NaN before each replay). The CPU side: tests/integrations/test_torch_capture_scratch.py.
A capture's own records live as long as its graph (graph_life.py): 50 captures of one layer, each
graph deleted, keep a bounded number of records and memory, with or without eager calls between
the captures, and a layer's last-call fast path notices a destroyed graph (CPU side:
test_torch_graph_life.py)."""

from __future__ import annotations

import time

import pytest

from sparsile.tests.integrations.test_torch_checkpoint_static import check_static
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import ops  # noqa: E402
from sparsile.integrations.torch.capture_keys import is_capture_key  # noqa: E402
from sparsile.integrations.torch.graph_life import graph_releases  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]

T, K = 16, 8192  # decode: the kernel splits K (a workspace); e4m3: the record's quantizer, then the GEMM
REPLAYS = 100


def _layer(kind: str, n: int = 256):
    dtype = "bf16" if kind == "bf16 op" else "e4m3"
    layer = spt.SparseLinear.from_dense(linear(n, K, seed=5, device="cuda"), dtype)
    if kind == "e4m3 static":
        layer.input_scale = torch.tensor([0.02], device="cuda")
    return layer


def _call(layer, kind: str):
    """The layer's eager forward, or for "bf16 op" the custom op as torch.compile's graphs call it."""
    if kind == "bf16 op":
        return lambda x: torch.ops.sparsile.sparse_linear(x, layer.values, layer.meta, layer.bias)
    return layer


def _x(seed: int) -> torch.Tensor:
    gen = torch.Generator("cuda").manual_seed(seed)
    return (torch.randn(T, K, device="cuda", generator=gen) * (seed + 1)).to(torch.bfloat16)


def _check(layer, kind: str, x: torch.Tensor, history: torch.Tensor) -> None:
    """Every output in ``history`` (replays, T, N) against float64 for x (all rows at once)."""
    rows = history.reshape(-1, history.shape[-1])
    xs = x.repeat(history.shape[0], 1)
    if kind == "e4m3 static":
        wq = (layer.to_dense().double() / layer.scale_w.double()[:, None]).cpu().numpy()
        check_static(rows.cpu(), xs.cpu(), wq, layer.scale_w.double().cpu().numpy(),
                     layer.bias.double().cpu().numpy(), float(layer.input_scale.item()))
    else:
        check_against_float64(layer, xs, rows)


def _capture(call, x: torch.Tensor, stream: torch.cuda.Stream):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = call(x)
    return graph, y


def _layer_on_a_stream(kind: str, seed: int):
    """A layer of ``kind``, its call, the record cache it plans into, a side stream and an input."""
    layer = _layer(kind)
    call = _call(layer, kind)
    cache = ops.RECORDS if kind == "bf16 op" else layer.__dict__["_records"]
    return layer, call, cache, torch.cuda.Stream(), _x(seed)


def _replay_checked(graph, y: torch.Tensor, layer, kind: str, x: torch.Tensor) -> None:
    """``graph`` replayed into ``y`` poisoned first, the result checked against float64."""
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check(layer, kind, x, y.clone()[None])


def _warm_up(call, x: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Calls on ``stream`` (the one the graphs are captured on: its eager record is the one a capture
    reused before the fix), ordered both ways with the current stream."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call(x)
    torch.cuda.current_stream().wait_stream(stream)


@pytest.mark.parametrize("kind", ["e4m3", "e4m3 static", "bf16 op"])
def test_two_graphs_of_one_layer_replayed_at_once_on_two_streams(kind):
    layer = _layer(kind)
    call = _call(layer, kind)
    capture_stream = torch.cuda.Stream()
    x1, x2 = _x(1), _x(2)
    _warm_up(call, x1, capture_stream)
    g1, y1 = _capture(call, x1, capture_stream)
    g2, y2 = _capture(call, x2, capture_stream)
    torch.cuda.synchronize()
    # each capture planned a record of its own (its scratch: the quantized x, the split-K workspace)
    records = (ops.RECORDS if kind == "bf16 op" else layer.__dict__["_records"]).records
    captured = [r for key, r in records.items() if isinstance(key[-1], tuple) and key[-1][0] == "capture"
                and r.owner() is layer.values]
    assert len(captured) == 2 and all(r.owns_workspace for r in captured)
    if kind != "bf16 op":
        assert captured[0].xq.data_ptr() != captured[1].xq.data_ptr()
    h1 = torch.empty((REPLAYS, *y1.shape), dtype=y1.dtype, device="cuda")
    h2 = torch.empty_like(h1)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    for i in range(REPLAYS):
        for s, g, y, h in ((s1, g1, y1, h1), (s2, g2, y2, h2)):
            with torch.cuda.stream(s):
                y.fill_(float("nan"))
                g.replay()
                h[i].copy_(y)
    for s in (s1, s2):
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _check(layer, kind, x1, h1)
    _check(layer, kind, x2, h2)


@pytest.mark.parametrize("kind", ["e4m3", "e4m3 static"])
def test_a_graph_replayed_on_a_side_stream_while_eager_calls_run_on_the_capture_stream(kind, monkeypatch):
    # eager calls through the record's quantizer and GEMM (not the one launch that quantizes x itself,
    # which a small layer's eager call takes): the scratch a capture reused before the fix
    monkeypatch.setattr(kernels, "quantizes_in_kernel", lambda t, n, k: False)
    layer = _layer(kind)
    capture_stream = torch.cuda.Stream()
    x1, x2 = _x(3), _x(4)
    _warm_up(layer, x2, capture_stream)
    graph, y1 = _capture(layer, x1, capture_stream)
    h1 = torch.empty((REPLAYS, *y1.shape), dtype=y1.dtype, device="cuda")
    h2 = torch.empty_like(h1)
    side = torch.cuda.Stream()
    for s in (side, capture_stream):
        s.wait_stream(torch.cuda.current_stream())
    for i in range(REPLAYS):
        with torch.cuda.stream(side):
            y1.fill_(float("nan"))
            graph.replay()
            h1[i].copy_(y1)
        with torch.cuda.stream(capture_stream):  # the eager record of this stream, its own scratch
            h2[i].copy_(layer(x2))
    for s in (side, capture_stream):
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    _check(layer, kind, x1, h1)
    _check(layer, kind, x2, h2)


def test_cuda_graph_trees_reuse_the_warm_up_record_of_their_stream():
    """torch.compile(mode="reduce-overhead"): while CUDA graph trees record, the custom op reuses the
    record their warm-up built on their stream (capture_keys.trees_recording: a record planned in
    the capture would leave its workspace in their pool, which they refuse), so no record of the op
    is keyed by a capture; the replays match float64."""
    layer = _layer("bf16 op")
    compiled = torch.compile(lambda x: layer(x), mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # warm-up, recording, then replays
        x = _x(10 + seed)
        y = compiled(x).clone()
        torch.cuda.synchronize()
        check_against_float64(layer, x, y)
    mine = [(key, r) for key, r in ops.RECORDS.records.items() if r.owner() is layer.values]
    assert mine and any(r.captured and r.owns_workspace for _, r in mine)
    assert not any(isinstance(key[-1], tuple) and key[-1][0] == "capture" for key, _ in mine)


CAPTURES = 50


@pytest.mark.parametrize("kind", ["e4m3", "bf16 op"])
def test_capturing_a_layer_again_and_again_keeps_its_records_and_memory_bounded(kind):
    """A layer's call captured 50 times on one stream (a warm-up there before each, as torch
    recommends), each graph replayed with y poisoned, checked against float64, then deleted: each
    capture plans a record of its own (its quantized x, its split-K workspace), tied to its graph
    with a driver user object, and dropped at the first eager call after the graph is destroyed (the
    driver's callback may lag: polled). Before, the cache kept all 50, and their memory."""
    assert graph_releases() is not None  # the native destroy callback could be built
    layer, call, cache, stream, x = _layer_on_a_stream(kind, 21)

    def captured() -> list:
        return _captured_of(layer, cache)

    def settle() -> None:
        """Until the destroyed graphs' records are dropped: eager calls (and the driver's callbacks)."""
        for _ in range(500):
            torch.cuda.synchronize()
            _warm_up(call, x[:1], stream)  # (two shapes: no call takes the layer's last-call fast path;
            _warm_up(call, x, stream)      # the fast path's own look: the tests below)
            if not captured():
                return
            time.sleep(0.01)

    memory = []
    for i in range(CAPTURES):
        _warm_up(call, x, stream)
        graph, y = _capture(call, x, stream)
        assert len(cache.tied) >= 1 and len(captured()) <= 8  # this graph's, and a few whose release lags
        _replay_checked(graph, y, layer, kind, x)
        del graph, y
        if i in (4, CAPTURES - 1):
            settle()
            assert not captured()
            memory.append(torch.cuda.memory_allocated())
    assert memory[1] <= memory[0], memory
    y = call(x)  # the eager record after it all
    torch.cuda.synchronize()
    _check(layer, kind, x, y[None])


def _captured_of(layer, cache) -> list:
    """``layer``'s records in ``cache`` planned for one capture (stored or retired)."""
    return [r for key, r in (*cache.records.items(), *cache.retired.items())
            if r.owner() is layer.values and (isinstance(key, int) or is_capture_key(key))]


def test_the_last_call_fast_path_drops_a_destroyed_graph_s_records():
    """A decode loop after one capture: eager calls of one shape on one stream take the layer's
    last-call fast path. The graph deleted, the fast path sees the driver's destroy callback (the
    counter it bumps) and sends the next call down the full path, which drops the graph's record
    (polled: the callback may lag); the fast path goes on after, with float64-checked outputs.
    Before, the fast path never looked, and the record stayed as long as the loop ran."""
    assert graph_releases() is not None
    layer = _layer("e4m3")
    cache = layer.__dict__["_records"]
    stream = torch.cuda.Stream()
    x = _x(31)
    _warm_up(layer, x, stream)
    graph, y = _capture(layer, x, stream)
    graph.replay()
    _warm_up(layer, x, stream)
    assert layer.__dict__["_last"] is not None and _captured_of(layer, cache) and cache.tied
    del graph, y
    torch.cuda.synchronize()
    for _ in range(500):
        _warm_up(layer, x, stream)
        if not _captured_of(layer, cache):
            break
        time.sleep(0.01)
    assert not _captured_of(layer, cache) and not cache.tied
    last = layer.__dict__["_last"]
    with torch.cuda.stream(stream):
        ys = torch.stack([layer(x) for _ in range(3)])
    torch.cuda.synchronize()
    assert layer.__dict__["_last"] is last  # the fast path served them
    _check(layer, "e4m3", x, ys)


@pytest.mark.parametrize("kind", ["e4m3", "bf16 op"])
def test_captures_with_no_eager_call_between_them_keep_records_and_memory_bounded(kind):
    """One warm-up, then 50 captures on one stream with no eager call between them, each graph
    replayed (y poisoned, checked against float64) and deleted: each capture drops the records of
    the graphs destroyed before it (a few may lag behind the driver's callback). Before, only an
    eager call dropped them: 50 records, with their scratch and the destroyed graphs' pool memory."""
    assert graph_releases() is not None
    layer, call, cache, stream, x = _layer_on_a_stream(kind, 41)
    _warm_up(call, x, stream)
    memory = []
    for i in range(CAPTURES):
        graph, y = _capture(call, x, stream)
        assert len(_captured_of(layer, cache)) <= 8  # this graph's, and a few whose release lags
        _replay_checked(graph, y, layer, kind, x)
        del graph, y
        torch.cuda.synchronize()
        time.sleep(0.02)  # (the driver's callback thread)
        if i in (9, CAPTURES - 1):
            memory.append(torch.cuda.memory_allocated())
    assert memory[1] <= memory[0] + 8 * (T * K + 4 * T + (1 << 20)), memory  # at most the lagging records' scratch


def test_the_driver_calls_the_destroy_callback_only_after_the_destroyed_graph_s_replay_is_done():
    """What graph_life relies on, with the real driver and the native callback: a user object given
    to a capture's graph (graph_objects.driver_attach) is released only once the graph and its
    executable are destroyed and the launch in flight is complete. A graph that spins for a while is
    replayed and deleted at once: while its stream is busy the callback has not run (its records'
    scratch would be freed under the replay); after the stream is done it runs (polled: the driver's
    thread may lag), and collect hands the payload back once."""
    from sparsile.backend.runtime.graph_objects import GraphReleases
    from sparsile.integrations.torch.graph_life import capture_graph

    releases = GraphReleases()  # (its own: the process's holds the records' payloads)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        torch.cuda._sleep(200_000_000)  # (about 0.1 s on an H100 at 1.98 GHz)
        handle = capture_graph(stream.cuda_stream)
        assert handle is not None and releases.watch(handle, "graph")
    assert releases.pending() == 1 and not releases.released()
    graph.replay()
    del graph  # its executable destroyed while the replay runs
    while not torch.cuda.current_stream().query():  # (none where torch's destructor waited for the replay)
        assert not releases.released(), "the callback ran while the destroyed graph's replay was in flight"
    torch.cuda.synchronize()
    for _ in range(500):
        if releases.released():
            break
        time.sleep(0.01)
    assert releases.collect() == ["graph"] and releases.pending() == 0 and not releases.released()


@pytest.mark.parametrize("kind", ["e4m3", "bf16 op"])
def test_a_capture_s_real_record_and_its_cache_are_freed_by_reference_counting(kind):
    """No reference cycle runs through a real launch record (its plan, prepared and native launches) or a
    layer's cache: a capture's record, out of its cache's dicts (as the weakref callback of its collected
    weight takes it out), is freed at once, and so is a cache nothing refers to, with the garbage collector
    off. What capture_frees.py relies on under cudaMallocAsync: a record its finalizer held is freed by the
    call that lets it go, not by a later collection that may come during a capture (its tensors'
    ``cudaFreeAsync`` would be captured into that graph). The CPU side, on fakes: test_torch_graph_life.py."""
    import gc
    import weakref

    layer, call, cache, stream, x = _layer_on_a_stream(kind, 41)
    _warm_up(call, x, stream)
    graph, y = _capture(call, x, stream)
    _replay_checked(graph, y, layer, kind, x)
    captured = [weakref.ref(r) for r in _captured_of(layer, cache)]
    assert captured
    del graph, y
    torch.cuda.synchronize()
    layer.__dict__["_last"] = None  # (the layer's last call refers to its cache's last record)
    gc.collect()
    gc.disable()
    try:
        cache.last = None
        ids = {id(ref()) for ref in captured}
        for kept in (cache.records, cache.retired, cache.unfilled):
            for key in [k for k, r in kept.items() if id(r) in ids]:
                kept.pop(key, None)
        record_freed = all(ref() is None for ref in captured)
        if kind != "bf16 op":  # (the custom op's cache is the process's)
            whole = weakref.ref(cache)
            del cache
            layer.__dict__.pop("_records")
            cache_freed = whole() is None
        else:
            cache_freed = True
    finally:
        gc.enable()
    assert record_freed and cache_freed, (record_freed, cache_freed)
