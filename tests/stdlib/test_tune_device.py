"""The tuners work on one GPU (stdlib/kernels/tune_device.py): their ``device=`` (``sparsile tune
--device N``), else sparsile's current device, whatever torch's. On a faked host whose device 0 is a
B200 and device 1 an H200, with sparsile's current device 1 (``use_device(1)``) and torch's left at
0: the operands are made on cuda:1, torch's current device is 1 while the tuner runs (its streams
and graphs), the SM count and the table's GPU name are the H200's. torch's CUDA calls are faked
(a CPU torch): what matters is the device each is asked for. On two real GPUs:
tests/gpu/test_multi_gpu.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sparsile.backend import runtime
from sparsile.backend.runtime import bench, devices
from sparsile.cli import main
from sparsile.frontend.diagnostics import LaunchError
from sparsile.stdlib.kernels import decode, decode_tuning, linear_tuning, sparsity_gpu, tuning
from sparsile.tests.stdlib.test_gemm_tuning import _device

torch = pytest.importorskip("torch")

GPUS = {0: _device("NVIDIA B200", (10, 0), 148), 1: dataclasses.replace(_device("NVIDIA H200", (9, 0), 132), ordinal=1)}


class TorchSeen:
    """The devices the tuner asked torch for: tensors and generators made, and torch's current
    device (``torch.cuda.device``) while each was made."""

    def __init__(self) -> None:
        self.made: list[tuple[str, Any, int]] = []
        self.current = 0  # torch's current device: 0, as sparsile's use_device(1) leaves it

    def __call__(self, kind: str, device: Any) -> None:
        self.made.append((kind, device, self.current))


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> TorchSeen:
    seen = TorchSeen()
    real_randn, real_generator = torch.randn, torch.Generator

    def current_device(ordinal: int | None = None) -> Any:
        ordinal = devices.default_ordinal if ordinal is None else ordinal
        if ordinal not in GPUS:
            raise LaunchError("SP0716", f"there is no CUDA device {ordinal} (2 visible)")
        return GPUS[ordinal]

    @contextlib.contextmanager
    def torch_device(ordinal: int):
        before, seen.current = seen.current, ordinal
        try:
            yield
        finally:
            seen.current = before

    def randn(*shape: int, device: Any = None, generator: Any = None) -> Any:
        seen("tensor", device)
        return real_randn(*shape, generator=generator)

    def generator(device: Any = None) -> Any:
        seen("generator", device)
        return real_generator()

    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    monkeypatch.setattr(runtime, "current_device", current_device)
    monkeypatch.setattr(devices, "default_ordinal", 1)  # sparsile.backend.runtime.use_device(1)
    monkeypatch.setattr(torch.cuda, "device", torch_device)
    monkeypatch.setattr(torch, "randn", randn)
    monkeypatch.setattr(torch, "Generator", generator)
    monkeypatch.setattr(sparsity_gpu, "compress_gpu", lambda w, dtype, arch: (w, SimpleNamespace(data=w)))
    return seen


def _timed(monkeypatch: pytest.MonkeyPatch, module: Any, planner: str) -> list[tuple[int, Any]]:
    """Fake the planner and ``tune_plan`` of ``module``; returns the (SM count, benchmarker) each
    plan was tuned with."""
    tuned: list[tuple[int, Any]] = []
    monkeypatch.setattr(module, planner, lambda *a, **kw: SimpleNamespace(kw=kw))
    monkeypatch.setattr(module, "tune_plan", lambda base, sms, bench_, **kw: tuned.append((sms, bench_))
                        or {"config": {}, "us": 1.0, "default_us": 1.0})
    return tuned


@pytest.mark.parametrize("device, ordinal", [(None, 1), (1, 1), (0, 0)])
def test_tune_sparse_matmul_works_on_one_device(host: TorchSeen, monkeypatch: pytest.MonkeyPatch, device: Any,
                                                ordinal: int) -> None:
    tuned = _timed(monkeypatch, tuning, "plan_sparse_matmul")
    table = tuning.tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), device=device)
    cuda = f"cuda:{ordinal}"
    assert host.made == [("generator", cuda, ordinal), ("tensor", cuda, ordinal), ("tensor", cuda, ordinal)]
    assert [sms for sms, _ in tuned] == [GPUS[ordinal].sm_count] and table["gpu"] == GPUS[ordinal].name
    assert host.current == 0  # torch's current device: restored


@pytest.mark.parametrize("device, ordinal", [(None, 1), (0, 0)])
def test_tune_sparse_linear_works_on_one_device(host: TorchSeen, monkeypatch: pytest.MonkeyPatch, device: Any,
                                                ordinal: int) -> None:
    tuned = _timed(monkeypatch, linear_tuning, "plan_sparse_linear")
    planned: list[Any] = []
    real_plan = linear_tuning.plan_sparse_linear
    monkeypatch.setattr(linear_tuning, "plan_sparse_linear", lambda *a, **kw: planned.append(kw) or real_plan(*a, **kw))
    table = linear_tuning.tune_sparse_linear(["256x128x256"], device=device)
    cuda = f"cuda:{ordinal}"
    assert host.made == [("generator", cuda, ordinal), ("tensor", cuda, ordinal), ("tensor", cuda, ordinal)]
    sms = GPUS[ordinal].sm_count
    assert [s for s, _ in tuned] == [sms] and planned[0]["num_sms"] == sms and table["gpu"] == GPUS[ordinal].name


@pytest.mark.parametrize("device, ordinal", [(None, 1), (0, 0)])
@pytest.mark.parametrize("graph", [True, False])
def test_tune_sparse_decode_works_on_one_device(host: TorchSeen, monkeypatch: pytest.MonkeyPatch, device: Any,
                                                ordinal: int, graph: bool) -> None:
    tuned: list[tuple[int, Any]] = []
    monkeypatch.setattr(decode, "plan_sparse_decode", lambda *a, **kw: SimpleNamespace(current=host.current))
    monkeypatch.setattr(decode_tuning, "tune_decode_plan", lambda plan, sms, bench_, **kw: tuned.append(
        (sms, bench_, plan.current)) or {"config": {}, "us": 1.0})
    table = decode_tuning.tune_sparse_decode(["256x256"], [16], device=device,
                                             **({} if graph else {"benchmarker": None}))
    cuda = f"cuda:{ordinal}"
    assert host.made == [("generator", cuda, 0), ("tensor", cuda, ordinal), ("tensor", cuda, ordinal)]
    ((sms, timer, current),) = tuned
    assert sms == GPUS[ordinal].sm_count and current == ordinal
    assert (table["gpu"], table["sms"]) == (GPUS[ordinal].name, sms)
    assert list(table["entries"]) == [decode_tuning.table_key(GPUS[ordinal].name, sms, "bf16", 256, 256, 16)]
    if graph:
        assert timer is decode_tuning.graph_bench
    else:  # the plain launches, timed with events of that device
        assert timer.func is bench.do_bench and timer.keywords == {"device": ordinal}


def test_graph_bench_times_on_its_streams_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph_bench's events are of the device of the side stream it captures on (torch's current
    one, the tuner's), not sparsile's current device: events and stream must share a context."""
    from sparsile.stdlib.kernels.graph_timing import graph_bench

    timed: list[Any] = []

    class Stream:
        device = torch.device("cuda", 1)

        def wait_stream(self, other: Any) -> None: ...

        def synchronize(self) -> None: ...

    class Graph:
        fail = False

        def capture_begin(self) -> None:
            if Graph.fail:
                raise RuntimeError("no capture here")

        def capture_end(self) -> None: ...

        def replay(self) -> None: ...

    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(bench, "do_bench", lambda fn, **kw: timed.append(kw.get("device")) or 10.0)
    assert graph_bench(lambda stream=None: None, warmup=1, rep=1) == 1.0  # one replay of ten calls
    Graph.fail = True
    assert graph_bench(lambda stream=None: None, warmup=1, rep=1) == 10.0  # the launches themselves
    assert timed == [1, 1]


def test_a_device_that_is_not_there(host: TorchSeen, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad, text in ((5, "there is no CUDA device 5 (2 visible)"), ("1", "device='1' is no CUDA device ordinal"),
                      (True, "device=True is no CUDA device ordinal")):
        with pytest.raises(LaunchError) as exc:
            tuning.tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), device=bad)
        assert exc.value.code == "SP0716" and text in str(exc.value)
    assert host.made == []


@pytest.mark.parametrize("spelling", ["torch.device", "str"])
def test_a_torch_device_or_its_string_names_the_gpu(host: TorchSeen, monkeypatch: pytest.MonkeyPatch,
                                                     spelling: str) -> None:
    """torch users write devices as torch.device("cuda", 0) or "cuda:0"; both were SP0716 "is no
    CUDA device ordinal". "cuda" alone is sparsile's current device; another type stays SP0716."""
    import torch

    tuned = _timed(monkeypatch, tuning, "plan_sparse_matmul")
    for given, ordinal in (("cuda:0", 0), ("cuda", 1)):
        host.made.clear()
        device = torch.device(given) if spelling == "torch.device" else given
        table = tuning.tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), device=device)
        assert host.made[0][1:] == (f"cuda:{ordinal}", ordinal) and table["gpu"] == GPUS[ordinal].name
    assert len(tuned) == 2
    bad = torch.device("cpu") if spelling == "torch.device" else "cpu"
    with pytest.raises(LaunchError) as exc:
        tuning.tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), device=bad)
    assert exc.value.code == "SP0716" and "is no CUDA device" in str(exc.value)


def test_cli_tune_device(host: TorchSeen, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(tuning, "tune_sparse_matmul",
                        lambda shapes, **kw: asked.append(kw["device"]) or {"entries": {}})
    monkeypatch.setattr(linear_tuning, "tune_sparse_linear",
                        lambda shapes, **kw: asked.append(("linear", kw["device"])) or {"entries": {}})
    out, err = io.StringIO(), io.StringIO()
    assert main(["tune", "256x128x256"], stdout=out, stderr=err) == 0
    assert main(["tune", "256x128x256", "--device", "0"], stdout=out, stderr=err) == 0
    assert main(["tune", "256x128x256", "--linear", "--device", "1"], stdout=out, stderr=err) == 0
    assert asked == [None, 0, ("linear", 1)]
    assert main(["tune", "256x128x256", "--device", "2"], stdout=out, stderr=err) == 2  # before any timing
    assert "SP0716" in err.getvalue() and "there is no CUDA device 2" in err.getvalue() and len(asked) == 3


def test_sweep_tuned_draws_its_operands_on_sparsiles_current_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/sweep_tuned.py reads sparsile's current device's SM count and table: its operands
    are drawn there too (they were on torch's current device, ``"cuda"``)."""
    from sparsile.tests.support import load_script

    sweep = load_script("benchmarks/sweep_tuned.py", "sweep_tuned", register=True)  # (as test_sweep_tuned.py)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "default_ordinal", 1)
    assert sweep.operand_device() == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep.operand_device() is None


@pytest.mark.parametrize("bad", [5, -1, np.int64(2)])
def test_a_device_that_is_not_there_says_which_are(monkeypatch: pytest.MonkeyPatch, bad: Any) -> None:
    """The real range check (``devices.device_state``, on a host of 2 GPUs): SP0716 with a help line
    naming the indices there are, for ``device=`` and ``sparsile tune --device``."""
    from sparsile.stdlib.kernels.tune_device import tuning_ordinal

    monkeypatch.setattr(devices, "_init_driver", lambda: 2)
    monkeypatch.setattr(devices, "_devices", {})
    monkeypatch.setattr(runtime, "has_gpu", lambda: True)
    with pytest.raises(LaunchError) as exc:
        tuning_ordinal(bad)
    assert exc.value.code == "SP0716" and f"there is no CUDA device {int(bad)} (2 visible)" in str(exc.value)
    assert exc.value.help is not None and "0 to 1" in exc.value.help
    out, err = io.StringIO(), io.StringIO()
    assert main(["tune", "256x128x256", "--device", "2"], stdout=out, stderr=err) == 2
    assert "SP0716" in err.getvalue() and "help: " in err.getvalue() and "0 to 1" in err.getvalue()


class FakeContexts:
    """sparsile's device contexts on the faked host: ``device_state`` of each GPU, and the context
    current on the thread as ``switch`` / ``leave`` leave it (no driver)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current: Any = "ctx1"  # use_device(1) left device 1's context current
        monkeypatch.setattr(devices, "device_state", lambda ordinal=None: devices.DeviceState(
            GPUS[devices.default_ordinal if ordinal is None else ordinal], None, f"ctx{ordinal}"))
        monkeypatch.setattr(devices, "switch", self.switch)
        monkeypatch.setattr(devices, "leave", self.leave)

    def switch(self, state: Any) -> Any:
        previous, self.current = self.current, state.context
        return previous

    def leave(self, previous: Any) -> None:
        if previous is not None:
            self.current = previous


@pytest.mark.parametrize("tuner", ["matmul", "linear", "decode"])
@pytest.mark.parametrize("device, ordinal", [(None, 1), (0, 0)])
def test_a_custom_benchmarker_sees_the_tuned_device_as_current(host: TorchSeen, monkeypatch: pytest.MonkeyPatch,
                                                               tuner: str, device: Any, ordinal: int) -> None:
    """A benchmarker given to a tuner times with the current device's events (``do_bench`` without
    ``device=``, ``torch.cuda.Event``): while it runs, sparsile's current device (and its context)
    and torch's are the tuned GPU, restored after. It timed sparsile's current device (1 here)
    with ``device=0``: events of one GPU around launches on another."""
    contexts = FakeContexts(monkeypatch)
    seen: list[tuple[int, int, int, Any]] = []

    def custom(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        fn()
        seen.append((devices.default_ordinal, runtime.current_device().ordinal, host.current, contexts.current))
        return 1.0

    def timed(base: Any, sms: int, bench_: Any, **kw: Any) -> dict[str, Any]:
        bench_(lambda stream=None: None, warmup=1, rep=1, stream=None)
        return {"config": {}, "us": 1.0, "default_us": 1.0}
    if tuner == "decode":
        monkeypatch.setattr(decode, "plan_sparse_decode", lambda *a, **kw: SimpleNamespace())
        monkeypatch.setattr(decode_tuning, "tune_decode_plan", timed)
        decode_tuning.tune_sparse_decode(["256x256"], [16], device=device, benchmarker=custom)
    else:
        module, planner = (tuning, "plan_sparse_matmul") if tuner == "matmul" else (linear_tuning, "plan_sparse_linear")
        monkeypatch.setattr(module, planner, lambda *a, **kw: SimpleNamespace())
        monkeypatch.setattr(module, "tune_plan", timed)
        run = tuning.tune_sparse_matmul if tuner == "matmul" else linear_tuning.tune_sparse_linear
        run(["256x128x256"], dtypes=("bf16",), device=device, benchmarker=custom)
    assert seen == [(ordinal, ordinal, ordinal, f"ctx{ordinal}")]
    assert (devices.default_ordinal, host.current, contexts.current) == (1, 0, "ctx1")  # restored
