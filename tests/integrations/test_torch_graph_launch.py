"""Repeated eager calls replayed as one CUDA-graph launch (integrations/torch/graph_launch.py): a call
at (x, y) addresses seen before is captured, a later call at exactly those addresses launches the
graph, anything else launches natively; failures turn the replays off. With the stand-ins of
record_fakes.py (a fake libcuda) and a fake graph driver that records what a capture launched and
replays it. On the H200: tests/gpu/test_torch_native_gpu.py."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llvmlite")

from sparsile.integrations.torch import graph_launch  # noqa: E402
from sparsile.integrations.torch.last_call import LastCall  # noqa: E402
from sparsile.integrations.torch.record_cache import RecordCache  # noqa: E402
from sparsile.tests.integrations.record_fakes import _weight  # noqa: E402
from sparsile.tests.integrations.record_fakes import fake as fake  # noqa: E402 (a fixture)
from sparsile.tests.support.capture_modes import GLOBAL, THREAD_LOCAL  # noqa: E402
from sparsile.tests.support.capture_modes import modes as modes  # noqa: E402 (a fixture)
from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)

CAPTURE_STREAM = 4242


class FakeGraphs:
    """A graph driver over ``fake``'s launches: a capture keeps what its launch function launched (on
    the capture stream) as a graph; ``cuGraphLaunch`` appends those launches again, on its stream, as
    ``("graph", handle, stream, params)``."""

    def __init__(self, fake):
        self.fake, self.graphs, self.destroyed, self.captures = fake, {}, [], 0
        self.capture_status = 0  # what a capture returns (nonzero: failed)
        self.launch_status = 0

    def capture(self, launch):
        self.captures += 1
        start = len(self.fake.launches)
        status = launch(CAPTURE_STREAM)
        captured = self.fake.launches[start:]
        del self.fake.launches[start:]
        assert all(entry[4] == CAPTURE_STREAM for entry in captured)
        if status or self.capture_status:
            return status or self.capture_status, 0
        handle = 0x1000 + len(self.graphs)
        self.graphs[handle] = captured
        return 0, handle

    def cuGraphLaunch(self, handle, stream):
        if self.launch_status:
            return self.launch_status
        for entry in self.graphs[handle]:
            self.fake.launches.append(("graph", handle, stream, entry[5]))
        return 0

    def cuGraphExecDestroy(self, handle):
        self.destroyed.append(handle)


@pytest.fixture
def graphs(fake, monkeypatch):
    driver = FakeGraphs(fake)
    monkeypatch.setattr(graph_launch, "DRIVER", driver)
    monkeypatch.setenv(graph_launch.ENV, "1")
    return driver


@pytest.fixture
def ys(monkeypatch):
    """The y tensors the next calls' ``torch.empty_like`` returns, in order (addresses the test picks)."""
    queue: list[torch.Tensor] = []
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **k: queue.pop(0) if queue else real(t, **k))
    return queue


def _last(x, w, stream=5):
    cache = RecordCache()
    cache.run((x.shape[0],), x, w, None, torch.float32, stream=stream)
    last = LastCall.of(cache, x, lambda: stream)
    assert last is not None and last.replays is not None
    return cache, last


def _native(entry):
    return entry[0] != "graph"


def test_a_call_repeated_at_the_same_addresses_is_captured_then_replayed(fake, graphs, ys):
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y, y, y, y])
    assert last(x) is y and graphs.captures == 0  # seen once
    assert last(x) is y and graphs.captures == 1  # seen twice: launched natively, then captured
    native_params = fake.launches[-1][5]
    assert all(_native(e) for e in fake.launches)
    for _ in range(2):
        assert last(x) is y
        assert fake.launches[-1] == ("graph", 0x1000, 5, native_params)  # the same bytes, on the call's stream
    assert last.replays.replayed == 2 and graphs.captures == 1


def test_other_addresses_launch_natively(fake, graphs, ys):
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y, y])
    last(x), last(x)
    other_x, other_y = torch.randn(4, 32), torch.empty(4, 8)
    ys.extend([y, other_y])
    last(other_x)
    assert _native(fake.launches[-1])
    last(x)  # x where it was, y elsewhere
    assert _native(fake.launches[-1]) and last.replays.replayed == 0


def test_a_caller_keeping_the_last_y_alternates_two_graphs(fake, graphs, ys):
    w, x = _weight(), torch.randn(4, 32)
    a, b = torch.empty(4, 8), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([a, b] * 4)
    for _ in range(4):
        last(x)
    assert graphs.captures == 2 and len(last.replays.graphs) == 2
    last(x), last(x)
    assert [e[:2] for e in fake.launches[-2:]] == [("graph", 0x1000), ("graph", 0x1001)]


def test_at_most_max_graphs_per_last_call(fake, graphs, ys, monkeypatch):
    monkeypatch.setattr(graph_launch, "MAX_GRAPHS", 2)
    w, x = _weight(), torch.randn(4, 32)
    outs = [torch.empty(4, 8) for _ in range(3)]
    _cache, last = _last(x, w)
    ys.extend(outs * 2)
    for _ in range(6):
        last(x)
    assert graphs.captures == 2 and len(last.replays.graphs) == 2


def test_a_failed_capture_turns_the_captures_off(fake, graphs, ys):
    graphs.capture_status = 999
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y] * 6)
    for _ in range(6):
        assert last(x) is y
    assert graphs.captures == 1 and not last.replays.graphs
    assert len(fake.launches) == 1 + 6 and all(_native(e) for e in fake.launches)  # (the first: the full path)


def test_a_failed_graph_launch_launches_natively_and_turns_the_replays_off(fake, graphs, ys):
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y] * 5)
    last(x), last(x)
    graphs.launch_status = 700
    n = len(fake.launches)
    assert last(x) is y
    assert len(fake.launches) == n + 1 and _native(fake.launches[-1])
    graphs.launch_status = 0
    last(x), last(x)
    assert last.replays.replayed == 0 and graphs.captures == 1 and not last.replays.graphs


def test_a_graph_of_another_gpu_is_captured_and_replayed_in_its_own_context(fake, graphs, ys, monkeypatch):
    """Layers on two GPUs: the context current when a layer's graph is captured or replayed may be the
    other GPU's (the layer before ran there). The capture makes the record's context current first
    (its stream is created in the current context); a replay refused for the wrong context
    (CUDA_ERROR_INVALID_CONTEXT) is retried in the record's context, not turned off."""
    from cuda.bindings import driver as cuda

    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    native = last.replays.native
    made: list[bool] = []
    real = native._context_current
    native._context_current = lambda force=False: made.append(force) or real(force)
    real_capture = graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda launch: made.append("capture") or real_capture(launch))
    ys.extend([y] * 4)
    last(x), last(x)  # the second call is captured
    assert made[made.index("capture") - 1] is True  # the record's context forced current before the capture
    refused = [int(cuda.CUresult.CUDA_ERROR_INVALID_CONTEXT)]
    real_launch = graphs.cuGraphLaunch
    monkeypatch.setattr(graphs, "cuGraphLaunch", lambda h, s: refused.pop() if refused else real_launch(h, s))
    made.clear()
    assert last(x) is y and fake.launches[-1][0] == "graph" and last.replays.replayed == 1
    assert made == [False, True] and last.replays.graphs  # checked, then retried in its context; the replays stay on


def test_a_native_launch_that_fails_in_the_capture_is_not_kept(fake, graphs, ys):
    """A capture whose native launch does not launch (a status) keeps no graph."""
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y] * 3)
    last(x)
    fake.results = [0, 719]  # the second call launches, its capture's launch fails
    assert last(x) is y
    assert graphs.captures == 1 and not last.replays.graphs
    assert last(x) is y and _native(fake.launches[-1])  # no more captures: natively


def test_turned_off_by_the_environment(fake, graphs, monkeypatch):
    monkeypatch.setenv(graph_launch.ENV, "0")
    cache = RecordCache()
    x = torch.randn(4, 32)
    w = _weight()
    cache.run((4,), x, w, None, torch.float32, stream=5)
    assert LastCall.of(cache, x, lambda: 5).replays is None


def test_the_graphs_are_destroyed_after_their_last_call_at_a_safe_point(fake, graphs, ys):
    """Garbage collection may run inside a user's CUDA graph capture, where a driver call can
    invalidate it: the collected replays' graphs are destroyed at the next drain (release.py), the
    next capture of a replay or a synchronize, not by the collector."""
    from sparsile.backend.runtime import release

    release.drain()
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y, y])
    last(x), last(x)
    del last, _cache
    gc.collect()
    assert graphs.destroyed == [] and release.pending() == 1
    release.drain()
    assert graphs.destroyed == [0x1000] and release.pending() == 0
    _cache, last = _last(x, w)  # collected again; then another replay's capture (an eager call) drains
    ys.extend([y, y])
    last(x), last(x)
    del last, _cache
    gc.collect()
    assert release.pending() == 1
    _cache, last = _last(x, w)
    ys.extend([y, y])
    last(x), last(x)
    assert len(graphs.destroyed) == 2 and release.pending() == 0


def test_a_replays_capture_runs_with_its_thread_in_thread_local_mode(fake, graphs, ys, modes, monkeypatch):
    """The replay's private capture (begun in THREAD_LOCAL capture mode) and this thread's calls around
    it (stream creation, instantiation, destroys) run with the thread in THREAD_LOCAL mode: a user's
    global-mode torch.cuda.graph capture on another thread neither refuses them nor is invalidated by
    them. The thread's mode is GLOBAL again after."""
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y, y])
    during = []
    real_capture = graphs.capture
    monkeypatch.setattr(graphs, "capture", lambda launch: during.append(modes.mode()) or real_capture(launch))
    last(x), last(x)  # the second call is captured
    assert graphs.captures == 1 and during == [THREAD_LOCAL]
    assert modes.mode() == GLOBAL and modes.log[-1][1] == GLOBAL


def test_the_steady_state_fast_path_exchanges_no_capture_mode(fake, graphs, ys, modes):
    """The capture-mode exchange (a driver call each way) is paid once per replay capture, never per
    call: after the capture, replayed calls and native calls at other addresses make no exchange."""
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    other_y = torch.empty(4, 8)
    ys.extend([y, y, y, y, other_y])
    last(x), last(x)  # the second call is captured: an exchange there and back (and its drain's, if any)
    assert graphs.captures == 1 and modes.log[-2:] == [("MainThread", THREAD_LOCAL), ("MainThread", GLOBAL)]
    exchanges = len(modes.log)
    for _ in range(3):
        last(x)  # two replays, then a native call at another y address
    assert last.replays.replayed == 2 and _native(fake.launches[-1])
    assert len(modes.log) == exchanges and modes.mode() == GLOBAL


def test_a_failing_replays_capture_restores_the_threads_mode(fake, graphs, ys, modes, monkeypatch):
    w, x, y = _weight(), torch.randn(4, 32), torch.empty(4, 8)
    _cache, last = _last(x, w)
    ys.extend([y, y])

    def broken(launch):
        assert modes.mode() == THREAD_LOCAL
        raise RuntimeError("the driver went away")

    monkeypatch.setattr(graphs, "capture", broken)
    last(x)
    with pytest.raises(RuntimeError, match="went away"):
        last(x)
    assert modes.mode() == GLOBAL and [mode for _, mode in modes.log][-2:] == [THREAD_LOCAL, GLOBAL]


class _Lib:
    """Stand-in libcuda functions for :class:`graph_launch.Driver` (each returns a CUresult from
    ``results``), recording the calls."""

    def __init__(self, results=None):
        self.calls, self.results = [], results or {}
        for name in ("cuStreamCreate", "cuStreamDestroy_v2", "cuStreamBeginCapture_v2", "cuStreamEndCapture",
                     "cuGraphInstantiateWithFlags", "cuGraphDestroy", "cuGraphExecDestroy", "cuGraphLaunch"):
            setattr(self, name, self._entry(name))

    def _entry(self, name):
        def call(*args):
            self.calls.append(name)
            out = {"cuStreamCreate": 0x51, "cuStreamEndCapture": 0x6A, "cuGraphInstantiateWithFlags": 0xE7}
            if name in out and not self.results.get(name):
                handle, = (a for a in args if hasattr(a, "contents"))  # where the real call writes its handle
                handle.contents.value = out[name]
            return self.results.get(name, 0)
        return call  # (Driver sets argtypes and restype on it, as on a ctypes function)


@pytest.mark.parametrize("failing", [None, "cuStreamCreate", "cuStreamBeginCapture_v2", "launch",
                                     "cuStreamEndCapture", "cuGraphInstantiateWithFlags"])
def test_driver_capture_cleans_up_on_every_path(failing):
    lib = _Lib({failing: 7} if failing and failing != "launch" else {})
    driver = graph_launch.Driver(lib)
    launched = []
    status, handle = driver.capture(lambda stream: launched.append(stream) or (5 if failing == "launch" else 0))
    if failing is None:
        assert (status, handle) == (0, 0xE7) and launched == [0x51]
    else:
        assert status != 0 and handle == 0
    created = failing != "cuStreamCreate"
    assert lib.calls.count("cuStreamDestroy_v2") == int(created)  # the stream never leaks
    ended = failing not in ("cuStreamCreate", "cuStreamBeginCapture_v2")
    assert lib.calls.count("cuStreamEndCapture") == int(ended)  # a capture begun is always ended
    has_graph = ended and failing != "cuStreamEndCapture"
    assert lib.calls.count("cuGraphDestroy") == int(has_graph)  # the captured graph never leaks
