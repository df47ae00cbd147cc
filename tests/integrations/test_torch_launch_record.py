"""The eager launch record (integrations/torch/_kernels.py) with a stand-in plan and prepared launches:
one plan per key, x / y / per-token scale substituted into the prepared arguments and everything
else bound once, the stream passed through, per-stream records only for plans with a workspace,
and the plan.rebind fallback. (The real kernels run in tests/gpu/test_torch_linear_gpu.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
kernels = pytest.importorskip("sparsile.integrations.torch._kernels")
RecordCache = pytest.importorskip("sparsile.integrations.torch.record_cache").RecordCache
graph_pools = pytest.importorskip("sparsile.integrations.torch.graph_pools")

from sparsile.tests.support.frozen_heap import frozen_heap as frozen_heap  # noqa: E402 (a fixture: autouse)


class _Kernel:
    def __init__(self, log: list, name: str, can_prepare: bool, params: tuple[str, ...]):
        self.log, self.name, self.can_prepare = log, name, can_prepare
        self.params = [SimpleNamespace(name=n) for n in params]

    def __getitem__(self, grid):
        kernel = self
        names = [p.name for p in self.params]

        class Prepared:
            def __init__(self, fixed, per_call):
                self.fixed, self.per_call = fixed, per_call  # like PreparedLaunch: per-call values not kept

            def run(self, args, stream=None):
                values = {**self.fixed, **dict(zip(self.per_call, args, strict=True))}
                kernel.log.append(("launch", kernel.name, tuple(values[n] for n in names), stream))

        class Launcher:
            if kernel.can_prepare:
                def prepare(self, *args, per_call=None, **kwargs):
                    assert not args  # every argument by name: the per-call ones are named in per_call
                    constexprs = {k: v for k, v in kwargs.items() if k not in names}
                    kernel.log.append(("prepare", kernel.name, grid, constexprs, per_call))
                    fixed = {k: v for k, v in kwargs.items() if k in names and k not in per_call}
                    return Prepared(fixed, per_call)

        return Launcher()


class _Plan:
    def __init__(self, log, x, out, scale_x, split, can_prepare, copy_x, one_launch=False):
        self.log, self.out, self.split, self.can_prepare, self.one_launch = log, out, split, can_prepare, one_launch
        self.x = x.clone() if copy_x else x
        self.scale_x = None if scale_x is None else scale_x.reshape(-1)  # a new view of the same memory
        self.workspace = torch.zeros(2, *out.shape) if split else None
        self.bias = torch.ones(out.shape[1])

    def launches(self):
        if self.one_launch:  # the decode kernel reducing split-K itself (reduce="kernel")
            main = _Kernel(self.log, "main+reduce", self.can_prepare, ("values", "meta", "x", "c", "ws"))
            return [(main, (3, 2), ("values", "meta", self.x, self.out, self.workspace), {"BN": 16})]
        main = _Kernel(self.log, "main", self.can_prepare, ("values", "meta", "x", "c", "bias", "scale_x", "n"))
        c = self.workspace if self.split else self.out
        out = [(main, (3, 1), ("values", "meta", self.x, c, self.bias, self.scale_x, 7), {"BN": 16})]
        if self.split:
            out.append((_Kernel(self.log, "reduce", self.can_prepare, ("ws", "out", "bias")), (2,),
                        (self.workspace, self.out, self.bias), {}))
        return out

    def rebind(self, x, out, *, scale_x=None):
        self.log.append(("rebind", x, out, scale_x))
        return self

    def run(self, interpret=False, stream=None):
        self.log.append(("run", stream))
        return self.out


def _fake_api(monkeypatch, split=False, can_prepare=True, copy_x=False, reduces_in_kernel=False) -> list:
    log: list = []

    def plan_sparse_linear(values, meta, x, *, out, scale_x=None, reduce=None, **kwargs):
        log.append(("plan", x, out, reduce))
        plan = _Plan(log, x, out, scale_x, split, can_prepare, copy_x, reduces_in_kernel and reduce == "kernel")
        if reduces_in_kernel:  # a decode plan (what the record looks for before planning a one-launch variant)
            plan.reduces_in_kernel = reduce == "kernel"
        return plan

    monkeypatch.setattr(kernels, "kernel_api", lambda: SimpleNamespace(plan_sparse_linear=plan_sparse_linear))
    return log


def _weight(scaled=False):
    return kernels.Weight(torch.zeros(8, 16), torch.zeros(8, 1, dtype=torch.int32), None,
                          torch.ones(8) if scaled else None, None)


def _x(t=4):
    return torch.randn(t, 32)


def test_one_plan_and_substituted_pointers(monkeypatch):
    log = _fake_api(monkeypatch)
    cache, w = RecordCache(), _weight()
    x1, x2 = _x(), _x()
    y1 = cache.run((4,), x1, w, None, torch.float32, stream=11)
    y2 = cache.run((4,), x2, w, None, torch.float32, stream=11)
    plans = [e for e in log if e[0] == "plan"]
    assert len(plans) == 1 and plans[0][1] is x1 and plans[0][2] is y1  # the first call uses the plan's y
    launches = [e for e in log if e[0] == "launch"]
    assert [e[0] for e in log].count("prepare") == 1 and len(launches) == 2
    (_, _, args1, s1), (_, _, args2, s2) = launches
    assert (s1, s2) == (11, 11)
    assert args1[2] is x1 and args1[3] is y1 and args2[2] is x2 and args2[3] is y2
    assert y2 is not y1 and y2.shape == (4, 8) and y2.dtype == torch.float32
    assert args1[:2] == args2[:2] == ("values", "meta") and args1[4] is args2[4] and args2[6] == 7
    (record,) = cache.records.values()
    (run, which), = record.prepared
    launch = run.__self__
    assert which(("X", "Y", "S")) == ("X", "Y") and launch.per_call == ("x", "c")  # x and y per call, in order
    assert record.plan is None and not any(v is x1 or v is y1 for v in launch.fixed.values())
    prepares = [e for e in log if e[0] == "prepare"]
    assert prepares[0][3] == {"BN": 16}


def test_per_token_scale_is_substituted(monkeypatch):
    log = _fake_api(monkeypatch)
    cache, w = RecordCache(), _weight(scaled=True)
    s1, s2 = torch.ones(4), torch.full((4,), 2.0)
    cache.run((4,), _x(), w, s1, torch.float32, stream=0)
    cache.run((4,), _x(), w, s2, torch.float32, stream=0)
    launches = [e[2] for e in log if e[0] == "launch"]
    assert launches[0][5].data_ptr() == s1.data_ptr() and launches[1][5] is s2


def test_records_with_a_workspace_are_per_stream(monkeypatch):
    log = _fake_api(monkeypatch, split=True)
    cache, w = RecordCache(), _weight()
    cache.run((4,), _x(), w, None, torch.float32, stream=1)
    cache.run((4,), _x(), w, None, torch.float32, stream=2)
    cache.run((4,), _x(), w, None, torch.float32, stream=1)
    assert [e[0] for e in log].count("plan") == 2 and len(cache) == 2  # not a decode plan: no eager variant
    reduce = [e for e in log if e[0] == "launch" and e[1] == "reduce"]
    assert len(reduce) == 3 and all(e[2][1].shape == (4, 8) for e in reduce)
    log = _fake_api(monkeypatch, split=False)
    cache = RecordCache()
    cache.run((4,), _x(), w, None, torch.float32, stream=1)
    cache.run((4,), _x(), w, None, torch.float32, stream=2)
    assert [e[0] for e in log].count("plan") == 1 and len(cache) == 1


@pytest.mark.parametrize(("can_prepare", "copy_x"), [(False, False), (True, True)])
def test_rebind_fallback(monkeypatch, can_prepare, copy_x):
    """Without prepare, or when the plan copies x (padding), each later call rebinds the plan."""
    log = _fake_api(monkeypatch, can_prepare=can_prepare, copy_x=copy_x)
    cache, w = RecordCache(), _weight()
    x1, x2 = _x(), _x()
    cache.run((4,), x1, w, None, torch.float32, stream=5)
    y2 = cache.run((4,), x2, w, None, torch.float32, stream=5)
    rebinds = [e for e in log if e[0] == "rebind"]
    assert [e[0] for e in log].count("plan") == 1 and not [e for e in log if e[0] == "launch"]
    assert rebinds[-1][1] is x2 and rebinds[-1][2] is y2 and [e for e in log if e[0] == "run"][-1] == ("run", 5)


def test_capacity_drops_the_oldest(monkeypatch):
    _fake_api(monkeypatch)
    cache, w = RecordCache(capacity=2), _weight()
    for t in (1, 2, 3):
        cache.run((t,), _x(t), w, None, torch.float32, stream=0)
    assert list(cache.records) == [(2,), (3,)]


def test_capacity_is_per_weight(monkeypatch):
    """More weights than the capacity keep one record each (a model's layers under torch.compile:
    a record dropped between CUDA graph trees' warm-up and recording would be rebuilt inside the
    capture); a weight's own records beyond the capacity drop its oldest."""
    _fake_api(monkeypatch)
    cache = RecordCache(capacity=2)
    weights = [_weight() for _ in range(5)]
    for i, w in enumerate(weights):
        cache.run((1, i), _x(1), w, None, torch.float32, stream=0)
    assert len(cache) == 5
    for t in (2, 3):
        cache.run((t, 0), _x(t), weights[0], None, torch.float32, stream=0)
    assert list(cache.records) == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (3, 0)]


def test_records_of_a_collected_weight_are_dropped(monkeypatch):
    """A record pins its weight's memory through aliases only: once the caller's values tensor is
    collected (the layer or model deleted), its records go, and their memory with them."""
    import gc
    import weakref

    _fake_api(monkeypatch)
    cache, kept, gone = RecordCache(), _weight(), _weight()
    cache.run((4, "kept"), _x(), kept, None, torch.float32, stream=0)
    cache.run((4, "gone"), _x(), gone, None, torch.float32, stream=0)
    record = cache.records[(4, "gone")]
    assert record.weight.values is not gone.values and record.weight.values.data_ptr() == gone.values.data_ptr()
    storage = weakref.ref(record.weight.values)
    del gone, record
    gc.collect()
    assert list(cache.records) == [(4, "kept")] and storage() is None


def test_misaligned_x_is_copied(monkeypatch):
    log = _fake_api(monkeypatch)
    cache, w = RecordCache(), _weight()
    base = torch.randn(4 * 32 + 1)
    x = base[1:].view(4, 32)  # 4 bytes past an aligned address
    assert x.data_ptr() % 16
    cache.run((4,), x, w, None, torch.float32, stream=0)
    (plan,) = [e for e in log if e[0] == "plan"]
    assert plan[1].data_ptr() % 16 == 0 and torch.equal(plan[1], x)


def test_a_single_launch_with_a_workspace_is_per_stream(monkeypatch):
    """The decode kernel's in-kernel split-K reduction: one launch, but a workspace and arrival
    counters that two streams must not share."""
    log = _fake_api(monkeypatch, split=True)
    monkeypatch.setattr(_Plan, "launches", lambda self: [(_Kernel(self.log, "main", True, ("values", "meta", "x",
                                                                                          "c", "bias", "scale_x",
                                                                                          "n")),
                                                          (3, 1), ("values", "meta", self.x, self.out, self.bias,
                                                                   self.scale_x, 7), {})])
    cache, w = RecordCache(), _weight()
    cache.run((4,), _x(), w, None, torch.float32, stream=1)
    cache.run((4,), _x(), w, None, torch.float32, stream=2)
    assert [e[0] for e in log].count("plan") == 2 and len(cache) == 2  # not a decode plan: no eager variant


@pytest.mark.parametrize("env", [None, "launch"])
def test_eager_calls_reduce_split_k_in_the_kernel_and_captures_in_a_second_launch(monkeypatch, env):
    """Up to 16 tokens an eager call takes the one-launch variant (reduce="kernel"), a call captured
    into a CUDA graph the two-launch plan; SPARSILE_DECODE_REDUCE set keeps one plan for both."""
    if env is None:
        monkeypatch.delenv("SPARSILE_DECODE_REDUCE", raising=False)
    else:
        monkeypatch.setenv("SPARSILE_DECODE_REDUCE", env)
    log = _fake_api(monkeypatch, split=True, reduces_in_kernel=True)
    capturing = [False]
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: capturing[0])
    monkeypatch.setattr(kernels, "_CAPTURE_ID", lambda stream: 1)
    cache, w = RecordCache(), _weight()
    cache.run((4,), _x(), w, None, torch.float32, stream=1)
    capturing[0] = True
    cache.run((4,), _x(), w, None, torch.float32, stream=1)  # (a record of the capture's own: its workspace)
    names = [e[1] for e in log if e[0] == "launch"]
    if env is None:
        assert [e[3] for e in log if e[0] == "plan"] == [None, "kernel", None]
        assert names == ["main+reduce", "main", "reduce"]
    else:
        assert names == ["main", "reduce", "main", "reduce"]
    log = _fake_api(monkeypatch, split=True, reduces_in_kernel=True)
    capturing[0] = False
    assert kernels.EAGER_REDUCE_MAX_T == 16
    RecordCache().run((16,), _x(16), w, None, torch.float32, stream=1)
    RecordCache().run((17,), _x(17), w, None, torch.float32, stream=1)  # beyond: the plan's launches
    assert [e[1] for e in log if e[0] == "launch"] == (["main+reduce"] if env is None else ["main", "reduce"]) + [
        "main", "reduce"]


def test_planning_for_the_custom_op_runs_in_another_thread_on_a_side_stream(monkeypatch):
    """torch.compile's CUDA graph trees route every allocation of the warming-up thread into their
    pool: the custom op plans in a short-lived thread on a side stream, ordered both ways with the
    current stream; an error raised there is raised to the caller."""
    import contextlib
    import threading

    events: list = []

    class Stream:
        def __init__(self, name, device=None):
            self.name, self.device, self.device_index = name, device, 0

        def wait_stream(self, other):
            events.append((self.name, "waits", other.name))

    current = Stream("current", "cuda:0")
    monkeypatch.setattr(graph_pools, "_SIDE_STREAMS", {})
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream("side", device))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext(events.append(("on", s.name))))
    main = threading.get_ident()
    graph_pools.outside_graph_pools(torch.device("cuda", 0), lambda: events.append(threading.get_ident() != main))
    assert events == [("side", "waits", "current"), ("on", "side"), True, ("current", "waits", "side")]

    def fails():
        raise ValueError("planned badly")

    with pytest.raises(ValueError, match="planned badly"):
        graph_pools.outside_graph_pools(torch.device("cuda", 0), fails)
    events.clear()
    # capturing: in place, no thread, no side stream
    graph_pools.outside_graph_pools(torch.device("cuda", 0), lambda: events.append(threading.get_ident() == main),
                                    capturing=True)
    assert events == [True]


def test_records_a_graph_captured_are_never_dropped(monkeypatch):
    """A replayed graph writes the workspace of the record it captured: the cache keeps that record
    past its capacity and drops the oldest uncaptured ones instead."""
    _fake_api(monkeypatch, split=True)
    capturing = [False]
    monkeypatch.setattr(kernels, "_IS_CAPTURING", lambda: capturing[0])
    monkeypatch.setattr(kernels, "_CAPTURE_ID", lambda stream: 1)
    cache, w = RecordCache(capacity=2), _weight()
    cache.run((1,), _x(1), w, None, torch.float32, stream=1)  # warmed up (one planned in a capture, whose
    capturing[0] = True  # stand-in copies cannot be filled, would be retired at the next eager call)
    cache.run((1,), _x(1), w, None, torch.float32, stream=1)
    capturing[0] = False
    for t in (2, 3, 4):
        cache.run((t,), _x(t), w, None, torch.float32, stream=1)
    # (T, stream): per-stream records (a workspace); the capacity bounds the uncaptured ones. The capture
    # planned a record of its own (its own workspace), whose stand-in copies cannot be filled: retired at
    # the next eager call, kept for its graph (a captured record the cache keeps in use past its capacity:
    # test_torch_capture_scratch.py)
    assert list(cache.records) == [(3, 1), (4, 1)] and not cache.records[(4, 1)].captured
    (captured,) = cache.retired.values()
    assert captured.key == (1, 1, ("capture", 1)) and captured.captured
