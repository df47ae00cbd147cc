"""Launch records planned inside a CUDA-graph capture for that graph alone live as long as the graph
(integrations/torch/graph_life.py, backend/runtime/graph_objects.py): tied to it with a driver user
object whose destroy callback (native code) marks them, and dropped at the cache's next call outside
a capture. The capture and the driver are faked (the fake fixture's capture id, a fake
``cuUserObjectCreate`` + ``cuGraphRetainUserObject``); the callback is the real JIT-compiled one,
called as the driver would, from another thread. On the GPU: tests/gpu/test_torch_graph_scratch_gpu.py."""

from __future__ import annotations

import ctypes as c
import gc
import threading
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.backend.runtime import graph_objects  # noqa: E402
from sparsile.integrations.torch import _kernels as kernels  # noqa: E402
from sparsile.integrations.torch import graph_life  # noqa: E402
from sparsile.integrations.torch.last_call import LastCall  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import _Prepared, _weight  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)

_CALLBACK = c.CFUNCTYPE(None, c.c_void_p)


class FakeGraphs:
    """Graphs as the fake driver keeps them: the cells of the user objects each holds, and the
    native destroy callback, which :meth:`destroy` calls on a thread of its own (as the driver's)."""

    def __init__(self, state: str = graph_objects.TIED):
        self.state = state  # what attach reports
        self.cells: dict[int, list[int]] = {}
        self.released: list[int] = []  # cells of objects the graph refused (released at once)
        self.releases = graph_objects.GraphReleases(self.attach)

    def attach(self, graph: int, cell: int, callback: int) -> str:
        assert callback == self.releases.callback
        if self.state == graph_objects.TIED:
            self.cells.setdefault(graph, []).append(cell)
        elif self.state == graph_objects.RELEASED:
            self.released.append(cell)
            _CALLBACK(callback)(cell)
        return self.state

    def destroy(self, graph: int) -> None:
        """The graph and its executables destroyed: the driver calls each object's callback."""
        fn = _CALLBACK(self.releases.callback)
        worker = threading.Thread(target=lambda: [fn(cell) for cell in self.cells.pop(graph)])
        worker.start()
        worker.join()


@pytest.fixture
def graphs(fake, monkeypatch) -> FakeGraphs:
    """The fake driver's graphs; a capture of id ``i`` builds graph ``1000 + i``."""
    fakes = FakeGraphs()
    monkeypatch.setattr(graph_life, "_RELEASES", lambda: fakes.releases)
    monkeypatch.setattr(graph_life, "_CAPTURE_GRAPH", lambda stream: 1000 + fake.capture_id)
    return fakes


def _api(fake, monkeypatch) -> None:
    """The fake fixture's kernel API with the e4m3 quantizer (its outputs the record's own)."""
    base = kernels.kernel_api()

    def prepare(x, xq, scale, per_call, **kwargs):
        return _Prepared(fake.log, per_call, {"x": x, "xq": xq, "scale": scale})

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(
        plan_sparse_linear=base.plan_sparse_linear, prepare_quantize=prepare, prepare_quantize_static=prepare))


def _capture(fake, monkeypatch, capture: int | None) -> None:
    """From now on a capture of id ``capture`` is under way (None: none)."""
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: capture is not None)
    fake.capture_id = capture


KEY = (4, "quantize")


def _call(cache: RecordCache, w, x) -> torch.Tensor:
    return cache.run(KEY, x, w, None, torch.float32, stream=7, quantize=True)


def _captured_once(fake, monkeypatch) -> tuple[RecordCache, torch.Tensor, torch.Tensor, weakref.ref]:
    """A cache warmed up by one eager call, then called once in capture 31 (its record tied to graph
    1031), back outside a capture: (cache, weight, x, a weak reference to the capture's record)."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    _call(cache, w, x)
    _capture(fake, monkeypatch, 31)
    _call(cache, w, x)
    captured = weakref.ref(cache.records[(*KEY, 7, ("capture", 31))])
    _capture(fake, monkeypatch, None)
    return cache, w, x, captured


def test_a_capture_s_record_is_dropped_at_the_first_eager_call_after_its_graph_is_destroyed(fake, graphs,
                                                                                              monkeypatch):
    """A record with scratch (an e4m3 record's quantized x and scales) planned for capture 31 is
    kept while its graph lives (eager calls, another capture), and after the graph is destroyed
    until the cache's next call, which drops it (nothing else holds it: its tensors are freed), in
    another capture too; the eager record of the stream and capture 32's record, whose graph lives,
    stay."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    _call(cache, w, x)
    eager = cache.records[(*KEY, 7)]
    _capture(fake, monkeypatch, 31)
    _call(cache, w, x)
    first = weakref.ref(cache.records[(*KEY, 7, ("capture", 31))])
    assert first().captured and id(first()) in cache.tied and list(graphs.cells) == [1031]
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)  # graph 1031 alive: its record stays
    assert first() is cache.records[(*KEY, 7, ("capture", 31))]
    graphs.destroy(1031)
    assert graph_life.released()
    _capture(fake, monkeypatch, 32)
    _call(cache, w, x)  # inside another capture: graph 1031's record dropped, capture 32's planned
    second = cache.records[(*KEY, 7, ("capture", 32))]
    assert list(cache.records.values()) == [eager, second]
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)
    assert list(cache.records.values()) == [eager, second] and cache.last[0] is eager
    assert cache.tied == {id(second)} and not graph_life.released() and graphs.releases.pending() == 1
    gc.collect()
    assert first() is None  # its quantized x and scales freed with it


def test_capturing_a_layer_again_and_again_keeps_a_bounded_number_of_records(fake, graphs, monkeypatch):
    """50 captures of one layer's call on one stream, each graph destroyed after it (a benchmark, a
    server capturing again), with an eager call (the warm-up) before each: the cache holds the
    eager record and the live graph's only (before: one per capture, 51 records)."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    for capture in range(100, 150):
        _capture(fake, monkeypatch, None)
        _call(cache, w, x)
        _capture(fake, monkeypatch, capture)
        _call(cache, w, x)
        assert len(cache.records) <= 2
        graphs.destroy(1000 + capture)
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)
    assert list(cache.records) == [(*KEY, 7)] and not cache.tied and graphs.releases.pending() == 0


def test_captures_with_no_eager_call_between_them_keep_a_bounded_number_of_records(fake, graphs, monkeypatch):
    """One warm-up, then 50 captures of the layer's call, each graph destroyed after it, and no
    eager call in between (a benchmark or a server capturing again after one warm-up): each capture
    drops the records of the graphs destroyed before it. Before, only a call outside a capture
    dropped them: the cache kept one record per capture (with its scratch, and the destroyed graph's
    pool memory it pins) for as long as no eager call came."""
    _api(fake, monkeypatch)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    _call(cache, w, x)
    for capture in range(200, 250):
        _capture(fake, monkeypatch, capture)
        _call(cache, w, x)
        assert len(cache.records) <= 2 and len(cache.tied) == 1
        graphs.destroy(1000 + capture)
    assert graphs.releases.pending() == 1  # (the last graph's: collected at the next call)


def test_a_split_k_record_of_the_custom_op_s_cache_is_dropped_with_its_graph(fake, graphs, monkeypatch):
    """A 16-bit record with a split-K workspace (two launches), planned per capture, likewise; the
    records of a cleared cache (retired, kept for their graph) too."""
    fake.reads_weight, fake.n_launches = True, 2
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    for capture in (8, 9):
        _capture(fake, monkeypatch, capture)
        cache.run((4,), x, w, None, torch.float32, stream=5)
    _capture(fake, monkeypatch, None)
    cache.clear()
    assert len(cache.retired) == 2 and not cache.records
    graphs.destroy(1008)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert [r.key for r in cache.retired.values()] == [(4, 5, ("capture", 9))]
    graphs.destroy(1009)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert not cache.retired and list(cache.records) == [(4, 5)]


@pytest.mark.parametrize("fill_first", [False, True])
def test_an_unfilled_record_goes_with_its_graph_unless_an_eager_call_filled_it(fake, graphs, monkeypatch, fill_first):
    """A record without scratch planned inside a capture (no warm-up) reads copies of the weight that
    only that graph's replay fills: tied to the graph. Destroyed before any eager call, the record
    is dropped (not filled) and the eager call plans its own; filled first by an eager call, it
    serves every call (other graphs may capture it): it stays."""
    cache, w = RecordCache(), _weight()  # (the fake plan reads a padded copy of the weight)
    x = torch.randn(4, 32)
    _capture(fake, monkeypatch, 60)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    (planned,) = cache.records.values()
    assert planned.unfilled and planned.key == (4,) and id(planned) in cache.tied
    _capture(fake, monkeypatch, None)
    if fill_first:
        cache.run((4,), x, w, None, torch.float32, stream=5)
        assert not planned.unfilled
    graphs.destroy(1060)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    (now,) = cache.records.values()
    assert (now is planned) == fill_first and not now.unfilled and not cache.tied and not cache.unfilled


def test_a_graph_destroyed_after_its_weight_is_gone(fake, graphs, monkeypatch):
    """The weight collected first drops its records (as before) and the cache's tie to them (its
    calls no longer look at the releases); its graph destroyed later: collecting frees the user
    object's cell and hands nothing back."""
    _api(fake, monkeypatch)
    cache, w, other = RecordCache(), _weight(), _weight()
    x = torch.randn(4, 32)
    _capture(fake, monkeypatch, 70)
    _call(cache, w, x)
    _capture(fake, monkeypatch, None)
    _call(cache, other, x)
    del w
    gc.collect()
    assert not cache.tied and len(cache.records) == 1
    graphs.destroy(1070)
    assert graph_life.released()
    cache.run((5,), torch.randn(5, 32), other, None, torch.float32, stream=7, quantize=True)
    assert len(cache.records) == 2 and graphs.releases.pending() == 1
    assert graph_life.released_records() == [] and graphs.releases.pending() == 0 and not graph_life.released()


@pytest.mark.parametrize("how", ["no releases", "no graph", "attach failed", "graph refused", "attach raised"])
def test_without_user_objects_records_are_kept_as_before(fake, graphs, monkeypatch, how):
    """Where no user object can be tied to the graph (no llvmlite engine, the capture's graph not
    readable, the driver refusing) the capture's record is kept while its weight lives, silently,
    and the capture goes on; past UNTIED_WARN such records in one cache, one warning per process.
    An attach that raised may have made the object: its cell stays pending (a callback may still
    write to it), never handed back."""
    _api(fake, monkeypatch)
    if how == "no releases":
        monkeypatch.setattr(graph_life, "_RELEASES", lambda: None)
    elif how == "no graph":
        monkeypatch.setattr(graph_life, "_CAPTURE_GRAPH", lambda stream: None)
    elif how == "attach raised":
        monkeypatch.setattr(graphs, "attach", lambda graph, cell, callback: 1 / 0)
        graphs.releases = graph_objects.GraphReleases(graphs.attach)
    else:
        graphs.state = graph_objects.FAILED if how == "attach failed" else graph_objects.RELEASED
    monkeypatch.setattr(graph_life, "UNTIED_WARN", 2)
    monkeypatch.setattr(graph_life, "_warned", [])
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    for capture in (80, 81):
        _capture(fake, monkeypatch, capture)
        _call(cache, w, x)
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)
    assert len(cache.records) == 3 and not cache.tied and cache.untied == 2
    _capture(fake, monkeypatch, 82)
    untied = r"3 launch records planned inside CUDA-graph captures are kept by one cache .*\(no driver user object"
    with pytest.warns(UserWarning, match=untied):
        _call(cache, w, x)
    _capture(fake, monkeypatch, 83)
    _call(cache, w, x)  # (once per process: no second warning; pytest's filter makes one an error)
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)
    assert len(cache.records) == 5 and not cache.tied
    if how == "graph refused":  # each released object's cell: marked by its callback, freed when collected
        assert len(graphs.released) == 4 and not graphs.cells and graphs.releases.pending() == 4
        assert graph_life.released() and graph_life.released_records() == []
    if how == "attach raised":  # an object may have been made: each cell kept until a callback marks it,
        assert graphs.releases.pending() == 4  # none does here (nothing handed back, nothing freed)
        assert graph_life.released_records() == [] and graphs.releases.pending() == 4
    else:
        assert graphs.releases.pending() == 0
    assert not graph_life.released()


def test_graph_releases_counts_and_frees_cells():
    """GraphReleases: released() is one memory read that turns True when a callback ran; collect
    hands back the payloads of the marked cells once (the others stay pending); an object the graph
    refused (released at once) hands nothing back."""
    fakes = FakeGraphs()
    releases = fakes.releases
    assert releases.watch(1, "a") and releases.watch(1, "b") and releases.watch(2, "c")
    assert not releases.released() and releases.collect() == [] and releases.pending() == 3
    fakes.destroy(1)
    assert releases.released() and sorted(releases.collect()) == ["a", "b"]
    assert not releases.released() and releases.pending() == 1 and releases.collect() == []
    fakes.state = graph_objects.RELEASED
    assert not releases.watch(3, "d") and releases.released() and releases.collect() == []
    assert releases.pending() == 1 and not releases.released()
    fakes.destroy(2)
    assert releases.collect() == ["c"] and releases.pending() == 0


@pytest.mark.parametrize("retained", [True, False])
def test_driver_attach_moves_the_object_s_reference_to_the_graph(monkeypatch, retained):
    """driver_attach: cuUserObjectCreate of the cell with the native callback (one reference, no
    destructor sync), then cuGraphRetainUserObject moving it to the graph; refused, the reference is
    released (cuUserObjectRelease) and it reports RELEASED; a failed create reports FAILED."""
    calls = []

    def create(out, ptr, destroy, refcount, flags):
        calls.append(("create", ptr, destroy, refcount, flags))
        out._obj.value = 0xAB  # (a byref: its object)
        return 0

    def retain(graph, obj, count, flags):
        calls.append(("retain", graph, obj.value, count, flags))
        return 0 if retained else 1

    monkeypatch.setattr(graph_objects, "_user_objects", lambda: (
        create, retain, lambda obj, count: calls.append(("release", obj.value, count)) or 0))
    state = graph_objects.driver_attach(0x51, 0x60, 0x70)
    assert state == (graph_objects.TIED if retained else graph_objects.RELEASED)
    assert calls == [("create", 0x60, 0x70, 1, 1), ("retain", 0x51, 0xAB, 1, 1)] + \
        ([] if retained else [("release", 0xAB, 1)])
    monkeypatch.setattr(graph_objects, "_user_objects", lambda: (lambda *args: 2, retain, None))
    assert graph_objects.driver_attach(0x51, 0x60, 0x70) == graph_objects.FAILED


def test_driver_attach_reports_what_was_made_when_a_call_raises(monkeypatch):
    """No entry points (libcuda's lookup raising): FAILED, nothing made (the cell may be freed); the
    retain raising (a ctypes error before the call) after the create: the object's reference is
    still ours, released (its callback runs): RELEASED, so the cell is freed only after it ran."""
    calls = []

    def create(out, ptr, destroy, refcount, flags):
        out._obj.value = 0xAB
        return 0

    def retain(graph, obj, count, flags):
        raise c.ArgumentError("argument 1: wrong type")

    def missing():
        raise AttributeError("cuGraphRetainUserObject")

    monkeypatch.setattr(graph_objects, "_user_objects", missing)
    assert graph_objects.driver_attach(0x51, 0x60, 0x70) == graph_objects.FAILED
    monkeypatch.setattr(graph_objects, "_user_objects", lambda: (
        create, retain, lambda obj, count: calls.append(("release", obj.value, count)) or 0))
    assert graph_objects.driver_attach(0x51, 0x60, 0x70) == graph_objects.RELEASED
    assert calls == [("release", 0xAB, 1)]


def test_the_shared_graph_releases_is_built_once(monkeypatch):
    """graph_releases() builds the process's GraphReleases once, or answers None for good where it
    cannot be built."""
    monkeypatch.setattr(graph_objects, "_shared", [])
    first = graph_objects.graph_releases()
    assert first is not None and graph_objects.graph_releases() is first
    monkeypatch.setattr(graph_objects, "_shared", [])
    monkeypatch.setattr(graph_objects, "compile_ir", lambda text: 1 / 0)
    assert graph_objects.graph_releases() is None and graph_objects.graph_releases() is None


def test_capture_graph_never_asks_the_legacy_stream_and_swallows_errors(monkeypatch):
    """The capture's graph is not asked of the legacy default stream (an implicit synchronization
    there invalidates a capture), and a failed query is None (the record is then kept, untied)."""
    asked = []
    monkeypatch.setattr(graph_life, "_CAPTURE_GRAPH", lambda stream: asked.append(stream) or 77)
    assert graph_life.capture_graph(0) is None and graph_life.capture_graph(None) is None and not asked
    assert graph_life.capture_graph(5) == 77 and asked == [5]
    monkeypatch.setattr(graph_life, "_CAPTURE_GRAPH", lambda stream: 1 / 0)
    assert graph_life.capture_graph(5) is None


def test_the_driver_is_asked_for_a_capture_graph_only_while_torch_captures(monkeypatch):
    """_cuda_capture_graph asks cuStreamGetCaptureInfo only while torch says its current stream
    captures: a fake stream handle (these tests' small ints) given to the real driver crashed the
    test process on a GPU machine (the fiftieth session's H100 run of this directory)."""
    from cuda.bindings import driver

    def refused(*args):
        raise AssertionError("the driver was asked")

    monkeypatch.setattr(driver, "cuStreamGetCaptureInfo", refused)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert graph_life._cuda_capture_graph(7) is None
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(AssertionError, match="the driver was asked"):
        graph_life._cuda_capture_graph(7)


def test_a_refused_object_s_payload_is_never_handed_back_to_a_collect_on_another_thread():
    """An object the graph refused (RELEASED: its callback runs at once) while another thread
    collects: that collect must not hand its payload back (the graph captured the record but holds
    no reference to it: dropping the record would free memory the graph replays), and the cell, freed
    once, must not be left pending (a later collect read the freed cell and freed it again)."""
    seen: list[list] = []
    collectors: list[threading.Thread] = []

    def refused_while_another_thread_collects(graph: int, cell: int, callback: int) -> str:
        _CALLBACK(callback)(cell)  # the object released at once: its callback has run, the cell is marked
        collector = threading.Thread(target=lambda: seen.append(releases.collect()))
        collectors.append(collector)
        collector.start()
        collector.join(0.5)  # (it may have to wait for watch to return)
        return graph_objects.RELEASED

    releases = graph_objects.GraphReleases(refused_while_another_thread_collects)
    assert not releases.watch(5, "record of graph 5")
    collectors[0].join()
    assert seen == [[]], seen  # nothing handed back: the record is kept
    assert releases.collect() == [] and releases.pending() == 0 and not releases.released()


def test_the_last_call_s_fast_path_sees_a_destroyed_graph_and_the_full_path_drops_its_records(fake, graphs,
                                                                                               monkeypatch):
    """A decode loop: a warm-up, one capture (its record tied to graph 1031), then eager calls that
    take the layer's fast path (LastCall) step after step. Graph 1031 destroyed: the next call goes
    back to the full path (None from the fast path, nothing launched), which drops the graph's
    record (before, the fast path kept launching and the record, with its scratch and the graph
    pool memory it pins, stayed as long as the loop ran); the fast path serves the call after."""
    from sparsile.integrations.torch.last_call import LastCall

    cache, w, x, captured = _captured_once(fake, monkeypatch)
    _call(cache, w, x)
    last = LastCall.of(cache, x, lambda: 7, KEY)
    assert last is not None and last(x) is not None and id(captured()) in cache.tied  # graph 1031 alive
    graphs.destroy(1031)
    launched = len(fake.launches)
    assert last(x) is None and len(fake.launches) == launched
    _call(cache, w, x)  # the full path: the destroyed graph's record dropped
    assert list(cache.records) == [(*KEY, 7)] and not cache.tied and graphs.releases.pending() == 0
    gc.collect()
    assert captured() is None
    last = LastCall.of(cache, x, lambda: 7, KEY)
    launched = len(fake.launches)
    assert last is not None and last(x) is not None and len(fake.launches) > launched  # the fast path again


def test_a_graph_of_another_cache_destroyed_costs_the_fast_path_one_full_call(fake, graphs, monkeypatch):
    """The destroy callbacks raise one process-wide counter: another cache's graph destroyed sends a
    last call with tied records back to the full path once (it collects for every cache: the other
    cache's record dropped), then the fast path goes on; a last call of a cache with no tied records
    never looks at the counter."""
    from sparsile.integrations.torch.last_call import LastCall

    _api(fake, monkeypatch)
    mine, other, plain, w = RecordCache(), RecordCache(), RecordCache(), _weight()
    x = torch.randn(4, 32)
    for capture, cache in ((40, mine), (41, other)):
        _capture(fake, monkeypatch, capture)
        _call(cache, w, x)
    _capture(fake, monkeypatch, None)
    for cache in (mine, other, plain):
        _call(cache, w, x)
    last, untied = LastCall.of(mine, x, lambda: 7, KEY), LastCall.of(plain, x, lambda: 7, KEY)
    graphs.destroy(1041)
    assert untied(x) is not None
    assert last(x) is None
    _call(mine, w, x)
    assert not other.tied and list(other.records) == [(*KEY, 7)] and mine.tied
    last = LastCall.of(mine, x, lambda: 7, KEY)
    assert last(x) is not None and last(x) is not None


class _PausedGet(dict):
    """A cache's ``records`` whose ``get`` on the thread ``paused`` waits (once) for ``resume``,
    after setting ``reached``: a collect on that thread held inside ``RecordCache.release``, after
    its look at the record and before it drops it, while the test runs calls on the main thread."""

    def __init__(self, records: dict):
        super().__init__(records)
        self.paused: threading.Thread | None = None
        self.reached, self.resume = threading.Event(), threading.Event()

    def get(self, key, default=None):
        if threading.current_thread() is self.paused and not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(10)
        return super().get(key, default)


def test_a_record_filled_while_another_thread_releases_it_is_kept_for_the_capture_that_took_it(fake, graphs,
                                                                                                monkeypatch):
    """Two threads: a record planned in capture 60 without an eager call (unfilled: tied to graph
    1060), graph 1060 destroyed. Thread A collects and looks at the record (unfilled: graph 1060's
    alone); before it drops it, the main thread's eager call fills it (every call's record now) and
    capture 61 captures it. A must not drop it: graph 1061 replays its memory. It is kept (retired)
    and the next eager call takes it back. Before, A dropped it: graph 1061 replayed freed memory."""
    cache, w = RecordCache(), _weight()  # (the fake plan reads a padded copy of the weight)
    x = torch.randn(4, 32)
    _capture(fake, monkeypatch, 60)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    (planned,) = cache.records.values()
    assert planned.unfilled and id(planned) in cache.tied
    _capture(fake, monkeypatch, None)
    graphs.destroy(1060)
    records = cache.records = _PausedGet(cache.records)
    collector = records.paused = threading.Thread(target=cache.graphs_released)
    collector.start()
    assert records.reached.wait(10)  # A looked at the record, and has not dropped it yet
    cache.run((4,), x, w, None, torch.float32, stream=5)  # the eager call fills it
    _capture(fake, monkeypatch, 61)
    cache.run((4,), x, w, None, torch.float32, stream=5)  # capture 61 takes it
    assert cache.last[0] is planned and not planned.unfilled and planned.captured
    _capture(fake, monkeypatch, None)
    records.resume.set()
    collector.join()
    assert planned in (*cache.records.values(), *cache.retired.values()), "dropped while graph 1061 replays it"
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert list(cache.records.values()) == [planned] and not cache.retired and not cache.tied


class _HookedUpdate(dict):
    """A cache's ``retired`` whose ``update`` runs ``hook`` first (once): another thread's work
    between ``RecordCache.clear``'s look at the records and its retiring of them."""

    def __init__(self, hook):
        super().__init__()
        self.hook = hook

    def update(self, *args, **kwargs):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        super().update(*args, **kwargs)


def test_a_clear_racing_a_collect_does_not_keep_the_released_record(fake, graphs, monkeypatch):
    """A cache cleared on the main thread while a collect on another thread releases a destroyed
    graph's record: clear looked at the records (the graph's among them) before the collect dropped
    it, and retires what it saw after. The released record must not come back as retired (kept
    while its weight lives, with its scratch: never revived, a capture's own). Before, it did."""
    cache, _w, _x, captured = _captured_once(fake, monkeypatch)  # (_w: the weight kept alive)
    graphs.destroy(1031)

    def collect_on_another_thread() -> None:
        collector = threading.Thread(target=cache.graphs_released)
        collector.start()
        collector.join()

    cache.retired = _HookedUpdate(collect_on_another_thread)
    cache.clear()
    assert graphs.releases.pending() == 0 and not cache.tied
    assert [r.key for r in cache.retired.values()] == [], "a released record retired by clear"
    gc.collect()
    assert captured() is None


def test_a_replacement_racing_a_collect_does_not_keep_the_released_record(fake, graphs, monkeypatch):
    """A record planned in capture 60 without an eager call (unfilled, tied to graph 1060) found by
    capture 61, which plans its own and retires it for graph 1060; graph 1060 destroyed and a collect
    on another thread releasing it after capture 61 looked at it and before it retired it. The released
    record must not stay retired (never revived: kept while its weight lives). Before, it did."""
    cache, w = RecordCache(), _weight()  # (the fake plan reads a padded copy of the weight)
    x = torch.randn(4, 32)
    _capture(fake, monkeypatch, 60)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    planned = weakref.ref(cache.records[(4,)])

    def destroyed_and_collected_on_another_thread() -> None:
        graphs.destroy(1060)
        collector = threading.Thread(target=cache.graphs_released)
        collector.start()
        collector.join()

    cache.retired = _HookedSet(destroyed_and_collected_on_another_thread)
    _capture(fake, monkeypatch, 61)
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert cache.retired.hook is None and graphs.releases.pending() == 1  # (graph 1061's record's)
    assert not cache.retired, "a released record retired by the replacement"
    assert [r.capture for r in cache.records.values()] == [61]
    gc.collect()
    assert planned() is None


class _HookedSet(dict):
    """A cache's ``retired`` whose first item set runs ``hook`` first: another thread's work between
    ``RecordCache._replaced``'s look at a record and its retiring of it."""

    def __init__(self, hook):
        super().__init__()
        self.hook = hook

    def __setitem__(self, key, value):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        super().__setitem__(key, value)


class _CountedLibc:
    """libc as GraphReleases uses it, each ``free`` noted."""

    def __init__(self):
        self.libc, self.freed = graph_objects._libc(), []
        self.calloc = self.libc.calloc

    def free(self, address: int) -> None:
        self.freed.append(address)
        self.libc.free(address)


def test_a_cell_whose_user_object_was_made_before_attach_raised_is_freed_only_after_its_callback(monkeypatch):
    """attach raising after cuUserObjectCreate made the object (an error on the way to the graph):
    the driver will call the object's callback on the cell, whenever it releases the object. The cell
    must stay allocated until that callback ran (then the collect frees it, once, and hands nothing
    back: the record is kept, untied). Before, watch freed the cell at once, and the callback wrote
    into freed memory."""
    made: list[int] = []

    def made_then_raised(graph: int, cell: int, callback: int) -> str:
        made.append(cell)  # (the driver's object holds the cell now)
        raise RuntimeError("an error after cuUserObjectCreate")

    libc = _CountedLibc()
    monkeypatch.setattr(graph_objects, "_libc", lambda: libc)
    releases = graph_objects.GraphReleases(made_then_raised)
    assert not releases.watch(5, "record of graph 5")
    assert libc.freed == [] and releases.pending() == 1 and not releases.released(), "the cell freed"
    worker = threading.Thread(target=_CALLBACK(releases.callback), args=(made[0],))  # the driver, later
    worker.start()
    worker.join()
    assert releases.released() and releases.collect() == [] and libc.freed == made
    assert releases.pending() == 0 and not releases.released()


class _TiedMeanwhile(set):
    """A cache's ``tied`` that another thread's capture fills while ``LastCall.of`` works: empty at its
    first look, then (as ``RecordCache._tie`` and ``run`` on that thread do) holding that capture's
    record, the cache's last call that capture's (``releases_seen`` still unread: a first tie)."""

    def __init__(self, cache: RecordCache, other: tuple):
        super().__init__()
        self.cache, self.other, self.looks = cache, other, 0

    def __len__(self) -> int:
        self.looks += 1
        n = super().__len__()
        if self.looks == 1:  # (the thread switch: right after the first look, which saw none)
            self.add(id(self.other[0]))
            self.cache.last = self.other
        return n


def test_a_last_call_made_while_another_thread_ties_the_cache_s_first_record(fake, graphs, monkeypatch):
    """An eager call's LastCall is made while another thread's capture ties the cache's first record
    (``releases_seen`` not read yet): no exception (before, the LastCall read ``tied`` again and
    unpacked the unread ``releases_seen``: TypeError out of the layer's call), and the last call
    made, if any, does not serve (the cache's last call is that capture's now): the full path runs."""
    from sparsile.integrations.torch.last_call import LastCall

    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    cache.run((4,), x, w, None, torch.float32, stream=7)
    assert cache.last is not None and not cache.tied and cache.releases_seen is None
    cache.tied = _TiedMeanwhile(cache, (cache.last[0], 9))
    last = LastCall.of(cache, x, lambda: 7, (4,))
    assert cache.tied.looks >= 1 and cache.tied
    launched = len(fake.launches)
    assert last is None or (last(x) is None and len(fake.launches) == launched)


def test_under_torch_s_cuda_malloc_async_backend_a_capture_frees_no_record(fake, graphs, monkeypatch, held):
    """With torch's ``cudaMallocAsync`` allocator a tensor allocated in a capture (a capture's record's
    scratch) freed while another capture is under way is ``cudaFreeAsync``-ed on the stream it was
    allocated on: torch.cuda.graph's shared capture stream, capturing now, so the free would become a
    node of the new graph (each replay freeing that memory again). So there a destroyed graph's
    record dropped inside a capture is held (capture_frees.py: the finalizer of a capture's record)
    and freed at the cache's next call outside a capture (before the hold: freed inside capture 32, as
    with the native allocator, whose freed blocks only go back to their pool; before the holds were
    one: kept in the cache until that call)."""
    _api(fake, monkeypatch)
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync", raising=False)
    cache, w = RecordCache(), _weight()
    x = torch.randn(4, 32)
    _call(cache, w, x)
    _capture(fake, monkeypatch, 31)
    _call(cache, w, x)
    first = cache.records[(*KEY, 7, ("capture", 31))]
    tensors = _capture_s_tensors(first)
    first = weakref.ref(first)
    graphs.destroy(1031)
    _capture(fake, monkeypatch, 32)
    _call(cache, w, x)  # inside capture 32: graph 1031's record is dropped but held (its tensors not freed here)
    assert (*KEY, 7, ("capture", 31)) not in cache.records and not graph_life.released()
    assert list(held.values()) == [first()] and all(t() is not None for t in tensors)
    _capture(fake, monkeypatch, None)
    _call(cache, w, x)  # outside a capture: freed
    assert not held and len(cache.tied) == 1
    gc.collect()
    assert first() is None and all(t() is None for t in tensors)


@pytest.fixture
def other_captures(monkeypatch) -> set[int]:
    """The streams another thread captures on now (what ``cuStreamIsCapturing`` answers); the capture
    streams noted by the calls, fresh for the test; a call in a capture runs on torch's stream 7."""
    from sparsile.backend.runtime import capture_mode

    streams: set[int] = set()
    monkeypatch.setattr(capture_mode, "_capture_streams", {})
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: stream in streams)
    monkeypatch.setattr(graph_life, "_NATIVE_STREAM", lambda device: 7)
    return streams


@pytest.mark.parametrize("backend", ["cudaMallocAsync", "native"])
def test_an_eager_collect_waits_for_another_thread_s_capture_under_cuda_malloc_async(fake, graphs, monkeypatch,
                                                                                      other_captures, held, backend):
    """Thread A's eager call after graph 1031 is destroyed, while thread B captures on stream 7 (torch's
    capture stream, where capture 31 ran and allocated the record's scratch): with ``cudaMallocAsync``
    the record is dropped from the cache but held, its tensors not freed (their ``cudaFreeAsync`` on
    stream 7 would land in B's graph), no fast path serves meanwhile, and the first call after B's
    capture frees it. Before, A freed it (only A's own stream was looked at). With the native allocator
    it is freed at once, as before."""
    from sparsile.integrations.torch.last_call import LastCall

    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: backend)
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    tensors = _capture_s_tensors(captured())
    graphs.destroy(1031)
    other_captures.add(7)  # thread B's capture, on the stream capture 31 ran on
    _call(cache, w, x)
    assert (*KEY, 7, ("capture", 31)) not in cache.records and not cache.tied
    if backend == "native":
        assert captured() is None and not held
        return
    assert list(held.values()) == [captured()] and all(t() is not None for t in tensors)
    last = LastCall.of(cache, x, lambda: 7, KEY)
    assert last is not None and last(x) is None  # (the fast path takes the full path meanwhile)
    _call(cache, w, x)
    assert list(held.values()) == [captured()]
    other_captures.clear()  # B's capture ended
    _call(cache, w, x)
    assert list(cache.records) == [(*KEY, 7)] and not held and not graph_life.released()
    last = LastCall.of(cache, x, lambda: 7, KEY)
    assert last is not None and last(x) is not None
    gc.collect()
    assert captured() is None and all(t() is None for t in tensors)


def test_only_torch_s_own_streams_are_noted_as_capture_streams(fake, graphs, monkeypatch, other_captures):
    """A capture on a stream torch does not own (an external stream: _NATIVE_STREAM None) notes nothing:
    its handle may be destroyed by its owner before the driver would be asked about it."""
    from sparsile.backend.runtime import capture_mode

    monkeypatch.setattr(graph_life, "_NATIVE_STREAM", lambda device: None)
    _captured_once(fake, monkeypatch)
    assert capture_mode._capture_streams == {}
    monkeypatch.setattr(graph_life, "_NATIVE_STREAM", lambda device: 7)
    _captured_once(fake, monkeypatch)
    assert capture_mode._capture_streams == {7: -1}  # (x on the CPU here: device -1)


def test_a_capture_stream_forgotten_after_a_look_without_answer_is_noted_again_by_its_next_capture(
        fake, graphs, monkeypatch, other_captures, held):
    """The driver gave no answer about torch's capture stream 7 once (capture_mode forgets such a
    stream): the next sparsile call in a capture on stream 7 notes it again, so that a later capture
    there (thread B's) is seen again, and a record an eager collect drops under cudaMallocAsync is held
    for it. Before, graph_life kept its own set of the streams it had noted and never noted stream 7
    again: B's capture went unseen and the eager call freed the record (its frees captured into B's graph)."""
    from sparsile.backend.runtime import capture_mode

    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    assert capture_mode._capture_streams == {7: -1}
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: None)  # (no answer, once)
    assert capture_mode.captures_under_way() and capture_mode._capture_streams == {}
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: stream in other_captures)
    _capture(fake, monkeypatch, 32)  # a later capture of this thread on stream 7
    _call(cache, w, x)
    _capture(fake, monkeypatch, None)
    assert capture_mode._capture_streams == {7: -1}
    graphs.destroy(1031)
    other_captures.add(7)  # thread B's capture on stream 7
    _call(cache, w, x)
    assert (*KEY, 7, ("capture", 31)) not in cache.records and list(held.values()) == [captured()]
    other_captures.clear()
    _call(cache, w, x)
    assert not held and id(captured() or 0) not in cache.tied


@pytest.mark.parametrize(("stream_id", "handle", "noted"), [
    ((3 << 5) | (1 << 1) | 1, 0x7F00_0000_1200, True),  # a pool stream (index 3, priority type 1): torch's own
    ((0 << 5) | (2 << 1) | 1, 0x7F00_0000_3400, True),   # a high-priority pool stream
    (0x7F00_0000_5600, 0x7F00_0000_5600, False),        # torch.cuda.ExternalStream: its id is the handle (even)
    (0, 0, False),                                       # the default (legacy) stream
])
def test_only_a_torch_pool_stream_s_handle_is_taken_for_a_capture_stream(monkeypatch, stream_id, handle, noted):
    """graph_life's reading of torch's stream ids (c10/cuda/CUDAStream.cpp, "StreamId assignment": a
    native stream's id ends in a 1 bit, an external stream's id is its cudaStream_t pointer, even; the
    default stream's id is 0): only a pool stream, which torch never destroys, is noted; an external
    stream, which its owner may destroy before the driver is asked about it, is not."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(stream_id=stream_id, cuda_stream=handle))
    assert graph_life._torch_native_stream(0) == (handle if noted else None)


def _side_call(cache: RecordCache, w, x, stream: int = 9) -> torch.Tensor:
    """An eager call on a side stream (9), not the stream the capture ran on (7): a record of its own."""
    return cache.run(KEY, x, w, None, torch.float32, stream=stream, quantize=True)


def _capture_s_tensors(record) -> list[weakref.ref]:
    """Weak references to what a capture's record allocated in that capture (its quantized x and scales,
    its y template): what torch's cudaMallocAsync would ``cudaFreeAsync`` on the capture's stream."""
    return [weakref.ref(t) for t in (*record.kept, record.y_like._base if record.y_like._base is not None
                                     else record.y_like)]


def test_the_scenario_s_side_stream_call_during_another_thread_s_capture_frees_nothing_of_the_capture(
        fake, graphs, monkeypatch, other_captures, held):
    """The GPU scenario (tests/gpu/test_capture_threads_gpu.py, ``_MALLOC_ASYNC``) on fakes: a record planned
    in capture 31 on torch's capture stream 7, its graph destroyed, thread B capturing on stream 7, and this
    thread's eager call on side stream 9 (a new per-stream record, a trim, no fast path): under cudaMallocAsync
    nothing of capture 31's record is freed meanwhile (a free would be captured into B's graph: the record is
    dropped from the cache and held); the first call after B's capture frees it."""
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    tensors = _capture_s_tensors(captured())
    graphs.destroy(1031)
    other_captures.add(7)
    _side_call(cache, w, x)
    last = LastCall.of(cache, x, lambda: 9, KEY)
    assert last is not None and last(x) is None  # (the full path meanwhile)
    gc.collect()
    assert list(held.values()) == [captured()] and all(t() is not None for t in tensors)
    assert (*KEY, 7, ("capture", 31)) not in cache.records
    other_captures.clear()
    _side_call(cache, w, x)
    assert not held and not cache.tied and not graph_life.released()
    gc.collect()
    assert captured() is None and all(t() is None for t in tensors)


def test_a_record_waits_while_its_own_capture_stream_captures_though_no_call_noted_that_stream(
        fake, graphs, monkeypatch, other_captures, held):
    """Capture 31 ran on stream 7, which no sparsile call noted (an external stream: graph_life.saw_capture
    notes torch's own streams only; or a note the backend dropped after a look without answer), so
    captures_under_way() cannot see thread B's capture there. The record's tensors would still be
    ``cudaFreeAsync``-ed on stream 7 under cudaMallocAsync: graph_life.frees_captured asks about stream 7
    itself, and the record is held (before: freed, its frees captured into B's graph)."""
    from sparsile.backend.runtime import capture_mode

    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    monkeypatch.setattr(graph_life, "_NATIVE_STREAM", lambda device: None)
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    tensors = _capture_s_tensors(captured())
    assert capture_mode._capture_streams == {} and not capture_mode.captures_under_way()
    graphs.destroy(1031)
    other_captures.add(7)  # thread B's capture, on the stream capture 31 allocated on
    _side_call(cache, w, x)
    assert (*KEY, 7, ("capture", 31)) not in cache.records and list(held.values()) == [captured()]
    last = LastCall.of(cache, x, lambda: 9, KEY)
    assert last is not None and last(x) is None  # (the full path meanwhile)
    _side_call(cache, w, x)  # (asked again at each call meanwhile)
    gc.collect()
    assert captured() is not None and all(t() is not None for t in tensors)
    other_captures.clear()  # B's capture ended
    _side_call(cache, w, x)
    assert not held and not cache.tied and not graph_life.released()
    last = LastCall.of(cache, x, lambda: 9, KEY)
    assert last is not None and last(x) is not None
    gc.collect()
    assert captured() is None and all(t() is None for t in tensors)


@pytest.mark.parametrize("backend", ["cudaMallocAsync", "native"])
def test_frees_captured_asks_the_record_s_own_streams_under_cuda_malloc_async_only(monkeypatch, backend):
    """graph_life.frees_captured: with cudaMallocAsync, True where one of the record's streams captures (never
    asking the legacy stream 0); a stream the driver gives no answer about does not hold the record; with the
    native allocator, never (its frees only go back to a pool) and the driver is not asked."""
    from sparsile.backend.runtime import capture_mode

    answers = {7: True, 8: False, 9: None}
    asked: list[int] = []
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: backend)
    monkeypatch.setattr(capture_mode, "_IS_CAPTURING", lambda stream: asked.append(stream) or answers[stream])
    expected = {(0, 7): True, (8,): False, (9,): False, (0, 8, 9): False, (8, 7): True}
    for streams, held in expected.items():
        got = graph_life.frees_captured(SimpleNamespace(marked=set(streams)))
        assert got is (held and backend == "cudaMallocAsync"), (streams, got)
    assert 0 not in asked and (asked == [] if backend == "native" else set(asked) == {7, 8, 9})


def _held() -> dict:
    """The records whose free waits for the captures under way (integrations/torch/capture_frees.py), or {}
    where that module is not there (before the fix)."""
    try:
        from sparsile.integrations.torch import capture_frees
    except ImportError:
        return {}
    return capture_frees.HELD


@pytest.fixture
def held():
    """The held records, empty before and after the test (a held record must not outlive its test's fakes). No
    automatic garbage collection meanwhile: its hook (capture_frees._after_collection) lets a held record go at
    the end of any collection that finds no capture, so one at a moment no test chose (on Python 3.12+ at any
    eval-breaker check after an allocation) would free a record the test expects held, or free one the test
    expects a call to free. The tests collect where they mean to."""
    records = _held()
    assert not records
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield records
    finally:
        records.clear()
        if enabled:
            gc.enable()


@pytest.mark.parametrize("backend", ["cudaMallocAsync", "native"])
@pytest.mark.parametrize("capture", ["another thread's", "this thread's"])
@pytest.mark.parametrize("cleared", [False, True])
def test_a_weight_collected_during_a_capture_frees_nothing_its_capture_allocated_under_cuda_malloc_async(
        fake, graphs, monkeypatch, other_captures, held, backend, capture, cleared):
    """A record planned in capture 31 on stream 7 (its scratch and y template allocated in that capture); its
    weight is collected (its layer deleted; the custom op's cache drops the records of a collected weight in
    the weakref callback RecordCache._dropped) while a capture is under way: thread B's on stream 7, or this
    thread's own (capture 32, of something else). Under cudaMallocAsync the record's tensors would be
    ``cudaFreeAsync``-ed on stream 7 into that capture's graph (each replay freeing them again): so nothing of
    them is freed then; the first call outside a capture after it ends drops them. Before, the callback freed
    them at once. With the native allocator they are freed at once, as before (a free goes back to the pool).
    ``cleared``: the cache was cleared before (a layer's ``.to()``, a replaced buffer): the record, retired (kept
    while its weight lives: a graph may replay it), goes the same way."""
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: backend)
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    tensors = _capture_s_tensors(captured())
    eager = weakref.ref(cache.records[(*KEY, 7)])
    if cleared:
        cache.clear()
        assert list(cache.retired.values()) == [captured()] and all(t() is not None for t in tensors)
    if capture == "this thread's":
        _capture(fake, monkeypatch, 32)
    else:
        other_captures.add(7)
    del w
    gc.collect()
    assert not cache.records and not cache.retired and eager() is None  # (the eager record's: not a capture's)
    if backend == "native":
        assert captured() is None and all(t() is None for t in tensors)
        return
    assert captured() is not None and all(t() is not None for t in tensors)
    other = _weight()
    _capture(fake, monkeypatch, 33)
    _call(cache, other, x)  # (a call inside a capture drops nothing)
    gc.collect()
    assert all(t() is not None for t in tensors)
    other_captures.add(7)  # (B's capture begins before this thread's ends: no moment without a capture)
    _capture(fake, monkeypatch, None)
    _side_call(cache, other, x)  # (outside a capture, but B captures on stream 7)
    gc.collect()
    assert all(t() is not None for t in tensors)
    other_captures.clear()  # the captures ended
    _side_call(cache, other, x)
    assert not held  # let go of by the call, not by a collection (its hook would let it go too)
    gc.collect()
    assert captured() is None and all(t() is None for t in tensors) and not held


def _marked(record) -> set[int]:
    """Mark each tensor a capture's ``record`` allocated in that capture (an attribute of the tensor object: a
    tensor allocated later at a freed one's address has none; a weak reference would not do, the garbage
    collector clears those to a collected cycle even where a finalizer keeps it); the marks."""
    marks = set()
    for ref in _capture_s_tensors(record):
        tensor = ref()
        tensor.capture_mark = id(tensor)
        marks.add(id(tensor))
    return marks


def _alive(marks: set[int]) -> set[int]:
    """The marks among ``marks`` (:func:`_marked`) of the tensors the garbage collector tracks now."""
    return {o.capture_mark for o in gc.get_objects()
            if type(o) is torch.Tensor and getattr(o, "capture_mark", None) in marks}


def _layer_collected_in_a_cycle_during_capture(fake, monkeypatch, other_captures) -> tuple:
    """Under cudaMallocAsync, a layer (its cache and weight, in a reference cycle) whose cache planned a record in
    capture 31 is collected by the garbage collector while thread B captures on stream 7: (x, the marks of
    that record's tensors)."""
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    cache, w, x, captured = _captured_once(fake, monkeypatch)
    marks = _marked(captured())
    layer: list = [cache, w]
    layer.append(layer)  # (a cycle: only the garbage collector frees it)
    del cache, w, layer, captured
    other_captures.add(7)
    gc.collect()
    return x, marks


def test_a_cache_collected_with_its_layer_during_a_capture_frees_nothing_its_capture_allocated(
        fake, graphs, monkeypatch, other_captures, held):
    """A layer in a reference cycle is collected, with its cache and the weight (no weakref callback runs:
    the weak references are garbage too), while thread B captures on stream 7, where the cache's record of
    capture 31 allocated its tensors: under cudaMallocAsync they are not freed by that collection (they would
    be ``cudaFreeAsync``-ed into B's graph) but held until the next call outside a capture after B's capture
    ends (another cache's). Before, the collection freed them."""
    x, marks = _layer_collected_in_a_cycle_during_capture(fake, monkeypatch, other_captures)
    assert _alive(marks) == marks
    other_captures.clear()
    second, other = RecordCache(), _weight()
    _side_call(second, other, x)
    assert not _alive(marks) and not held  # freed by the call, before any collection (whose hook would free them)


def test_a_layer_s_fast_path_takes_the_full_path_while_records_are_held(fake, graphs, monkeypatch, other_captures,
                                                                          held):
    """Another layer's last call (its fast path: no cache lookup) falls through to the full path while a capture's
    record whose weight was collected during thread B's capture is held (under cudaMallocAsync), also after B's
    capture ended: that full path frees it; then the fast path serves again. Before, the fast path served while
    the record's tensors were still there (freed at once by the callback, before the fix; kept for no call to
    free them, with the hold but no fast-path check)."""
    monkeypatch.setattr(graph_life, "_ALLOCATOR_BACKEND", lambda: "cudaMallocAsync")
    _cache, w, x, captured = _captured_once(fake, monkeypatch)  # (the cache lives: the callback drops the record)
    tensors = _capture_s_tensors(captured())
    layer, other = RecordCache(), _weight()
    layer.run((4,), x, other, None, torch.float32, stream=9)
    last = LastCall.of(layer, x, lambda: 9, (4,))
    assert last is not None and last(x) is not None
    other_captures.add(7)
    del w
    gc.collect()
    assert all(t() is not None for t in tensors) and last(x) is None
    other_captures.clear()  # (no automatic collection: the held fixture; its hook would let the record go now)
    assert last(x) is None and all(t() is not None for t in tensors)
    layer.run((4,), x, other, None, torch.float32, stream=9)  # the full path
    assert not held  # let go of by that call, not by a collection
    gc.collect()
    assert all(t() is None for t in tensors) and not held
    last = LastCall.of(layer, x, lambda: 9, (4,))
    assert last is not None and last(x) is not None


def test_a_cache_and_its_records_die_by_reference_counting_not_by_a_garbage_collection(fake, graphs, monkeypatch):
    """A record's weak reference to its weight calls the cache back through a weak reference to the cache, not
    a strong one: a cache (with an eager record and a capture's) that nothing else refers to is freed at once,
    with its records, and no garbage collection is needed for it (one may come at any allocation, while a
    capture is under way: a capture's tensors freed then under cudaMallocAsync land in that capture's graph).
    Before, the callback's bound method made a cycle of the cache and each of its records."""
    cache, w, _x, captured = _captured_once(fake, monkeypatch)
    eager, whole = weakref.ref(cache.records[(*KEY, 7)]), weakref.ref(cache)
    gc.collect()
    gc.disable()
    try:
        del cache
        assert whole() is None and eager() is None and captured() is None
    finally:
        gc.enable()
    assert w is not None  # (the weight lives on: only the cache went)


def test_records_held_through_a_collection_of_their_layer_are_freed_by_the_call_that_lets_them_go(
        fake, graphs, monkeypatch, other_captures, held):
    """The layer of a capture's record is collected in a reference cycle, with its cache, during thread B's
    capture on stream 7 (under cudaMallocAsync: the record is held, capture_frees.py). The first call outside a
    capture after B's capture ends lets it go: its tensors are freed by that call, not left to a later garbage
    collection, which may come while another capture is under way on stream 7 (there, their ``cudaFreeAsync``
    would be captured into that graph, and each replay would free them again). Before, the record, resurrected
    with its cache (the weakref callback's bound method refers to the cache, which refers to the record), stayed
    in a cycle after the call let it go, and the next collection freed its tensors, during a capture too."""
    x, marks = _layer_collected_in_a_cycle_during_capture(fake, monkeypatch, other_captures)
    assert _alive(marks) == marks and held
    other_captures.clear()  # B's capture ended (no collection but the ones below: the held fixture)
    try:
        _side_call(RecordCache(), _weight(), x)  # lets the held record go
        before = _alive(marks)
        other_captures.add(7)  # B captures again on stream 7
        gc.collect()  # a collection during that capture (at any allocation)
        during = before - _alive(marks)
    finally:
        other_captures.clear()
    assert not held and not during and not before, (before, during)
