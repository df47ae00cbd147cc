"""A launch on another GPU restores the calling thread's current context afterwards, as a torch op's
device guard does (backend/runtime/devices.py ``enter`` / ``switch`` / ``leave``; docs/language.md,
"Specialization and launching"). On a faked two-GPU host: the driver's ``cuCtxGetCurrent`` /
``cuCtxSetCurrent`` keep one current context (device d's primary context is 0xC0 + d) and the
launches record which context was current when they ran; a kernel launched while another device's
context is current is refused (CUDA_ERROR_INVALID_CONTEXT), as the real driver refuses it. The
kernel compiles for sm_90a for real; its module is a stand-in on a real ``DeviceState``. The same
on two real GPUs: tests/gpu/test_multi_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import arrays as array_args
from sparsile.backend.runtime import devices, release
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.driver import array_devices, fast_launch, prepared
from sparsile.tests.backend.test_launch_devices import GPUS, STREAM, on
from sparsile.tests.backend.test_prepared import ATTRS, OK, FakeCudaTensor, vadd

torch = pytest.importorskip("torch")

INVALID_CONTEXT = driver.CUresult.CUDA_ERROR_INVALID_CONTEXT
OUT_OF_RESOURCES = driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES


def ctx(ordinal: int) -> int:
    return 0xC0 + ordinal


class Host:
    """The fake host: the thread's current context (0: none), the contexts set, the launches
    (kernel handle, context current when it ran), and the result the next launches return."""

    def __init__(self) -> None:
        self.current = ctx(0)  # torch made device 0's primary context current
        self.sets: list[int] = []
        self.gets = 0
        self.launches: list[tuple[int, int]] = []
        self.fail: list[object] = []  # results of the next launches (then OK)

    def get_current(self):
        self.gets += 1
        return (OK, driver.CUcontext(self.current))

    def set_current(self, context):
        self.current = int(context)
        self.sets.append(self.current)
        return (OK,)

    def launch(self, handle: int) -> object:
        if self.current != ctx(handle - 0x500):  # device d's kernel: handle 0x500 + d
            return INVALID_CONTEXT
        self.launches.append((handle, self.current))
        return self.fail.pop(0) if self.fail else OK


class Module:
    """A loaded module on a real DeviceState: ``activate`` is the runtime Module's."""

    activate = runtime.Module.activate

    def __init__(self, ordinal: int):
        self._state = devices._devices[ordinal]
        self.device, self.context_key = self._state.info, self._state.context

    def function(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(module=self, attributes=ATTRS, handle=0x500 + self.device.ordinal,
                               set_max_dynamic_shared=lambda n: None)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    h = Host()
    states = {d: devices.DeviceState(GPUS[d], driver.CUdevice(d), driver.CUcontext(ctx(d))) for d in GPUS}
    monkeypatch.setattr(devices, "_devices", states)
    monkeypatch.setattr(devices, "_contexts", {ctx(d): s.context for d, s in states.items()}, raising=False)
    monkeypatch.setattr(devices, "tls", threading.local())
    devices.tls.context = states[0].context  # sparsile's cache agrees: the one-GPU common case
    monkeypatch.setattr(devices, "_has_gpu", True)
    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(array_devices, "_COUNT", [2])
    monkeypatch.setattr(driver, "cuCtxGetCurrent", h.get_current)
    monkeypatch.setattr(driver, "cuCtxSetCurrent", h.set_current)
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda f, *rest: (h.launch(f),))
    monkeypatch.setattr(runtime, "load_module", lambda image, device=None: Module(
        devices.default_ordinal if device is None else device))
    monkeypatch.setattr(fast_launch, "torch_current_stream", lambda ordinal: STREAM + ordinal)
    monkeypatch.setattr(prepared, "torch_stream_getter", lambda ordinal: lambda: STREAM + ordinal)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    # what exists now is not the test's: the collection below scans only what the test made (a full
    # one took 3 to 5 s a test in an xdist worker that had run many files before this one)
    gc.freeze()
    try:
        yield h
        gc.collect()
    finally:
        gc.unfreeze()
    release.drain()  # what the test's objects left for the next safe point (graphs to destroy), with the fakes


def restored(host: Host) -> bool:
    """Device 0's context is current again, and sparsile's per-thread cache says so (the very
    object its launchers compare)."""
    return host.current == ctx(0) and devices.tls.context is devices._devices[0].context


# -- devices.py ---------------------------------------------------------------------------------


def test_reading_a_devices_properties_switches_no_context(host: Host) -> None:
    assert runtime.current_device(1) is GPUS[1] and runtime.current_device() is GPUS[0]
    assert host.sets == [] and host.gets == 0


def test_enter_and_leave(host: Host) -> None:
    state0, state1 = devices._devices[0], devices._devices[1]
    assert devices.enter(state0) is None and host.gets == 0  # the cache knows: no driver call
    previous = devices.enter(state1)
    assert host.current == ctx(1) and devices.tls.context is state1.context
    devices.leave(previous)
    assert restored(host) and host.sets == [ctx(1), ctx(0)]
    host.current = ctx(1)  # torch switched to device 1 behind sparsile's cache
    assert devices.switch(state1) is None and devices.tls.context is state1.context  # found current: kept
    host.current, devices.tls.context = 0, None  # a fresh thread: no context current
    assert devices.switch(state0) is None and host.current == ctx(0)  # sparsile's current device: stays
    host.current, devices.tls.context = 0, None
    previous = devices.switch(state1)  # another device: none is current again afterwards
    devices.leave(previous)
    assert host.current == 0 and devices.tls.context is None


def test_driver_work_on_another_device_restores_the_context(host: Host, monkeypatch) -> None:
    seen: list[int] = []

    def fake(name: str, *result: object) -> None:
        monkeypatch.setattr(driver, name, lambda *a: seen.append(host.current) or (OK, *result))

    fake("cuMemAlloc", driver.CUdeviceptr(0x7000))
    fake("cuCtxSynchronize")
    fake("cuTensorMapEncodeTiled", driver.CUtensorMap())
    fake("cuModuleLoadData", driver.CUmodule(0x400))
    buf = runtime.DeviceBuffer(64, device=1)
    buf._finalizer.detach()
    assert restored(host)
    runtime.synchronize(1)
    assert restored(host)
    spec = runtime.tensormap.TensorMapSpec("f16", (128, 128), (256, 2), (64, 64))
    runtime.make_tensor_map(spec, 0x7F00_0000_0000, device=1)
    assert restored(host)
    module = runtime.module.load_module(b"\x7fELF", 1)
    module._finalizer.detach()
    assert restored(host) and seen == [ctx(1)] * 4
    host.current = ctx(1)  # torch.cuda.set_device(1) behind sparsile's cache (which says device 0's)
    runtime.DeviceBuffer(64, device=0)._finalizer.detach()
    runtime.synchronize(0)
    assert seen[4:] == [ctx(0)] * 2 and host.current == ctx(1)  # asked the driver: done in device 0's
    assert devices.tls.context is devices._devices[1].context


# -- launches -------------------------------------------------------------------------------------


def test_a_launch_on_another_gpu_restores_the_context(host: Host) -> None:
    k = vadd()
    k[(4,)](*on(1), 1024, BLOCK=256)  # the full path
    assert host.launches == [(0x501, ctx(1))] and restored(host)
    k[(4,)](*on(1, base=0x7E00_0000_0000), 1024, BLOCK=256)  # the fast path: switches again (the cache is not stale)
    assert host.launches[-1] == (0x501, ctx(1)) and restored(host)
    sets = len(host.sets)
    k[(4,)](*on(0), 1024, BLOCK=256)  # device 0's launch: no context switched, no driver call for it
    assert host.launches[-1] == (0x500, ctx(0)) and len(host.sets) == sets


def test_a_prepared_launch_on_another_gpu_restores_the_context(host: Host) -> None:
    launch = vadd()[(4,)].prepare(*on(1), 1024, BLOCK=256)
    launch(*on(1), 1024)
    assert host.launches == [(0x501, ctx(1))] and restored(host)
    launch(*on(1, base=0x7E00_0000_0000), 1024)
    assert host.launches[-1] == (0x501, ctx(1)) and restored(host)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_failed_launch_restores_the_context(host: Host, prepare: bool) -> None:
    k = vadd()
    launch = k[(4,)].prepare(*on(1), 1024, BLOCK=256) if prepare else lambda *a: k[(4,)](*a, BLOCK=256)
    host.fail = [OUT_OF_RESOURCES]
    with pytest.raises(runtime.CudaError):
        launch(*on(1), 1024)
    assert restored(host)
    launch(*on(1), 1024)
    assert host.launches[-1] == (0x501, ctx(1)) and restored(host)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_launch_retried_in_its_context_restores_the_other(host: Host, prepare: bool) -> None:
    """torch made device 1's context current behind sparsile's cache: device 0's launch is refused,
    retried in device 0's context, and device 1's (torch's current device) is current again after."""
    k = vadd()
    launch = k[(4,)].prepare(*on(0), 1024, BLOCK=256) if prepare else lambda *a: k[(4,)](*a, BLOCK=256)
    launch(*on(0), 1024)
    host.current = ctx(1)  # torch.cuda.set_device(1)
    launch(*on(0), 1024)
    assert host.launches[-1] == (0x500, ctx(0)) and host.current == ctx(1)
    assert devices.tls.context is devices._devices[1].context


def test_host_arrays_after_use_device_run_there(host: Host, monkeypatch) -> None:
    staged: list[int] = []
    monkeypatch.setattr(launcher_module, "stage_host_array",
                        lambda name, info, writes, call, device: staged.append(device) or 0x7D00_0000_0000)
    monkeypatch.setattr(launcher_module, "finish_host_copies", lambda call, launched: None)
    runtime.use_device(1)  # an explicit choice, as torch.cuda.set_device: its context stays current
    assert host.current == ctx(1) and devices.default_ordinal == 1
    x = np.zeros(1024, np.float32)
    k = vadd()
    k[(4,)](x, x, x, 1024, BLOCK=256)
    assert staged == [1, 1, 1] and host.launches == [(0x501, ctx(1))] and host.current == ctx(1)
    k[(4,)](*on(0), 1024, BLOCK=256)  # device 0's arrays: launched there, device 1's context current after
    assert host.launches[-1] == (0x500, ctx(0)) and host.current == ctx(1)
    assert devices.tls.context is devices._devices[1].context


def test_native_record_launches_restore_the_context(host: Host) -> None:
    from sparsile.integrations.torch.native import NativeLaunch

    launch = vadd()[(4,)].prepare(*on(1), 1024, BLOCK=256, per_call=("x", "y", "out"))
    record = launch.native_record(on(1), (0, 1, 2), (True, True, True))
    words = (ctypes.c_int64 * len(record.words))(*record.words)
    results: list[object] = []

    def run(address, x, y, scale, stream):  # the record launcher: cuLaunchKernel from native code
        return int(host.launch(0x501)) if not results else int(results.pop())

    native = NativeLaunch([record], [words], SimpleNamespace(launch=run), record.context_current)
    assert native.launch(1, 2, 0, STREAM + 1) == (0, 1)
    assert host.launches == [(0x501, ctx(1))] and restored(host)
    assert native.launch(1, 2, 0, STREAM + 1) == (0, 1)  # switches again
    assert host.launches[-1] == (0x501, ctx(1)) and restored(host)
    results.append(OUT_OF_RESOURCES)  # a failed launch
    assert native.launch(1, 2, 0, STREAM + 1)[0] == int(OUT_OF_RESOURCES) and restored(host)


def test_graph_replays_and_captures_restore_the_context(host: Host) -> None:
    from sparsile.integrations.torch.graph_launch import GraphReplays

    launch = vadd()[(4,)].prepare(*on(1), 1024, BLOCK=256, per_call=("x", "y", "out"))
    record = launch.native_record(on(1), (0, 1, 2), (True, True, True))
    graph_launches: list[int] = []

    class Driver:
        def cuGraphLaunch(self, graph_exec, stream):
            if host.current != ctx(1):
                return int(INVALID_CONTEXT)
            graph_launches.append(host.current)
            return 0

        def capture(self, launch):
            graph_launches.append(-host.current)
            return 0, 0x6000

    native = SimpleNamespace(_context_current=record.context_current,
                             launch=lambda x, y, s, stream: (0, 1))
    replays = GraphReplays(native, Driver())
    replays.graphs[(1, 2)] = 0x6000
    assert replays.launch((1, 2), STREAM + 1) and graph_launches == [ctx(1)] and restored(host)
    assert replays.launch((1, 2), STREAM + 1) and graph_launches == [ctx(1)] * 2 and restored(host)
    for _ in range(2):
        replays.launched_natively((3, 4))
    assert graph_launches[-1] == -ctx(1) and replays.graphs[(3, 4)] == 0x6000 and restored(host)


def test_sparse_matmul_native_replays_restore_the_context(host: Host, monkeypatch) -> None:
    from sparsile.stdlib.kernels import call_native

    launch = vadd()[(4,)].prepare(*on(1), 1024, BLOCK=256, per_call=("x", "y", "out"))
    record = launch.native_record(on(1), (0, 1, 2), (True, True, True))
    results: list[object] = []
    monkeypatch.setattr(call_native, "_launcher", SimpleNamespace(
        launch=lambda address, b, c, w, stream: int(host.launch(0x501)) if not results else int(results.pop())))
    monkeypatch.setattr(call_native, "_capturing", lambda: False)
    monkeypatch.setattr(call_native, "mark_unreplayable", lambda what: None)
    natives = tuple(call_native._Native(0, None, record, lambda: STREAM + 1) for _ in range(2))
    plan = call_native.NativePlan((), ("out", 0), records={(1, 2): natives})
    values, words, b, c = (FakeCudaTensor(p, (16,), device=1) for p in (1, 2, 0x100, 0x200))
    assert plan.launch(values, words, b, c) == 2
    assert host.launches == [(0x501, ctx(1))] * 2 and restored(host)
    assert host.sets == [ctx(1), ctx(0)]  # one switch for the replay's launches
    results.append(OUT_OF_RESOURCES)
    with pytest.warns(RuntimeWarning):
        assert plan.launch(values, words, b, c) == 0
    assert restored(host)


def test_plans_and_table_lookups_switch_no_context(host: Host) -> None:
    from sparsile.stdlib.kernels import plan_device
    from sparsile.stdlib.kernels.gemm import gpu_sm_count, plan_target
    from sparsile.stdlib.kernels.gemm_sm100 import device_sm_count
    from sparsile.stdlib.kernels.tuning import shipped_config

    x = object()
    probe = plan_device.plans_on_arrays(lambda values, meta, x: (
        plan_target(None, False), gpu_sm_count(False), device_sm_count(False),
        shipped_config("bf16", 4096, 4096, 4096, ordinal=plan_device.plan_ordinal())))
    original = plan_device.device_ordinal
    plan_device.device_ordinal = lambda a: 1 if a is x else original(a)
    try:
        assert probe(None, None, x)[:3] == ("sm_90a", 132, 132)
    finally:
        plan_device.device_ordinal = original
    assert host.sets == [] and host.gets == 0 and restored(host)
