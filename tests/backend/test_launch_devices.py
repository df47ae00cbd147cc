"""CPU tests of launches following their arrays' device (driver/array_devices.py, docs/language.md
"Specialization and launching"), on a faked two-GPU host: the kernel compiles for sm_90a for real,
``runtime.load_module`` makes a fake module on the device it is asked for, and the driver's launch
records which device's kernel ran on which stream. Device arrays are :class:`FakeCudaTensor`
objects (test_prepared.py) on cuda:0 or cuda:1; sparsile's current device is 0 unless a test
chooses another. The same launches on two real GPUs: tests/gpu/test_multi_gpu.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

from sparsile.backend import runtime
from sparsile.backend.runtime import arrays as array_args
from sparsile.backend.runtime import devices
from sparsile.backend.runtime import launcher as launcher_module
from sparsile.driver import array_devices, fast_launch, launch, prepared
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared import ATTRS, H200, OK, FakeCudaTensor, vadd

torch = pytest.importorskip("torch")

GPUS = {0: H200, 1: dataclasses.replace(H200, ordinal=1)}
STREAM = 0x7000  # torch's current stream on device d: STREAM + d


class TwoGpus:
    """What the fake host saw: modules loaded (device), contexts made current, launches
    (kernel handle, stream), tensor maps encoded (device), host arrays staged (device)."""

    def __init__(self) -> None:
        self.loads: list[int] = []
        self.current: list[int | None] = []
        self.activated: list[int] = []
        self.launches: list[tuple[int, int]] = []
        self.maps: list[int] = []
        self.staged: list[int] = []


class FakeModule:
    def __init__(self, host: TwoGpus, ordinal: int):
        self.host, self.device, self.context_key, self._state = host, GPUS[ordinal], f"ctx{ordinal}", ordinal

    def activate(self, force: bool = False) -> None:
        self.host.activated.append(self.device.ordinal)

    def function(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(module=self, attributes=ATTRS, handle=0x500 + self.device.ordinal,
                               set_max_dynamic_shared=lambda n: None)


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> TwoGpus:
    host = TwoGpus()

    def current_device(ordinal: int | None = None) -> runtime.DeviceInfo:
        host.current.append(ordinal)
        return GPUS[devices.default_ordinal if ordinal is None else ordinal]

    def load_module(image: bytes, device: int | None = None) -> FakeModule:
        ordinal = devices.default_ordinal if device is None else device
        host.loads.append(ordinal)
        return FakeModule(host, ordinal)

    def launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        host.launches.append((f, stream))
        return (OK,)

    def stage(name, info, writes, call, device):
        host.staged.append(device)
        return 0x7D00_0000_0000 + 0x10000 * len(host.staged)

    monkeypatch.setattr(devices, "_has_gpu", True)
    monkeypatch.setattr(array_devices, "_COUNT", [2])
    monkeypatch.setattr(devices, "default_ordinal", 0)
    monkeypatch.setattr(devices.tls, "context", None, raising=False)
    monkeypatch.setattr(runtime, "current_device", current_device)
    monkeypatch.setattr(runtime, "load_module", load_module)
    monkeypatch.setattr(driver, "cuLaunchKernel", launch_kernel)
    monkeypatch.setattr(launcher_module, "stage_host_array", stage)
    monkeypatch.setattr(fast_launch, "torch_current_stream", lambda ordinal: STREAM + ordinal)
    monkeypatch.setattr(prepared, "torch_stream_getter", lambda ordinal: lambda: STREAM + ordinal)
    monkeypatch.setitem(array_args._extractors, FakeCudaTensor, array_args._describe_torch)
    return host


def on(device: int, base: int = 0x7F00_0000_0000) -> tuple[FakeCudaTensor, ...]:
    return tuple(FakeCudaTensor(base + device * 0x1_0000_0000 + i * 0x10000, (1024,), device=device) for i in range(3))


def test_a_launch_runs_on_the_device_of_its_arrays(gpus: TwoGpus) -> None:
    k = vadd()
    k[(4,)](*on(1), 1024, BLOCK=256)  # the current device is 0
    assert gpus.loads == [1] and 1 in gpus.current
    assert gpus.launches == [(0x501, STREAM + 1)]  # device 1's kernel, on torch's stream of device 1
    assert gpus.activated == [1]  # device 1's context made current for the launch
    k[(4,)](*on(1, base=0x7E00_0000_0000), 1024, BLOCK=256)  # the fast path: the same device
    assert gpus.loads == [1] and gpus.launches[-1] == (0x501, STREAM + 1)


def test_the_launcher_of_one_device_is_never_handed_to_another(gpus: TwoGpus, monkeypatch) -> None:
    k = vadd()
    k[(4,)](*on(1), 1024, BLOCK=256)
    k[(4,)](*on(0), 1024, BLOCK=256)  # same fingerprint, other device: its own launcher
    assert gpus.loads == [1, 0] and gpus.launches == [(0x501, STREAM + 1), (0x500, STREAM)]
    binds: list[object] = []
    real_bind = k.bind
    monkeypatch.setattr(k, "bind", lambda *a: binds.append(a) or real_bind(*a))
    for device in (1, 0, 1, 0):  # a model spread over two GPUs: both stay on the fast path
        k[(4,)](*on(device), 1024, BLOCK=256)
        assert gpus.launches[-1] == (0x500 + device, STREAM + device)
    assert not binds and gpus.loads == [1, 0]
    k[(4,)].prepare(*on(1), 1024, BLOCK=256)(*on(1), 1024)  # a prepared launch: device 1's launcher
    assert gpus.loads == [1, 0] and gpus.launches[-1] == (0x501, STREAM + 1)


def test_host_arrays_run_on_the_current_device(gpus: TwoGpus, monkeypatch) -> None:
    k = vadd()
    x, y, out = (np.zeros(1024, np.float32) for _ in range(3))
    k[(4,)](x, y, out, 1024, BLOCK=256)
    assert gpus.loads == [0] and gpus.staged == [0, 0, 0] and gpus.launches == [(0x500, 0)]
    monkeypatch.setattr(devices, "default_ordinal", 1)  # runtime.use_device(1)
    k[(4,)](x, y, out, 1024, BLOCK=256)
    assert gpus.loads == [0, 1] and gpus.staged[3:] == [1, 1, 1] and gpus.launches[-1] == (0x501, 0)
    dx, dy, _ = on(1)
    monkeypatch.setattr(devices, "default_ordinal", 0)
    k[(4,)](dx, dy, out, 1024, BLOCK=256)  # a host array with device 1's: staged on device 1
    assert gpus.staged[-1] == 1 and gpus.launches[-1] == (0x501, STREAM + 1)


@pytest.mark.parametrize("first", [0, 1])
def test_arrays_on_two_gpus_are_sp0707_naming_both(gpus: TwoGpus, first: int) -> None:
    k = vadd()
    x, y, out = on(first)
    other = on(1 - first)[1]
    with pytest.raises(LaunchError) as exc:
        k[(4,)](x, other, out, 1024, BLOCK=256)
    message = str(exc.value)
    assert exc.value.code == "SP0707" and f"cuda:{first}" in message and f"cuda:{1 - first}" in message
    assert "`x`" in message and "`y`" in message and "one device" in (exc.value.help or "")
    assert not gpus.launches and not gpus.loads
    k[(4,)](x, y, out, 1024, BLOCK=256)  # a fast entry for these fingerprints on device `first`
    with pytest.raises(LaunchError) as again:  # the fast path refuses it as the full path does
        k[(4,)](x, other, out, 1024, BLOCK=256)
    assert str(again.value) == message and len(gpus.launches) == 1


def test_a_prepared_launch_stays_on_its_device(gpus: TwoGpus) -> None:
    made = vadd()[(4,)].prepare(*on(1), 1024, BLOCK=256)
    made(*on(1), 1024)
    assert gpus.loads == [1] and gpus.launches == [(0x501, STREAM + 1)]
    with pytest.raises(LaunchError) as exc:
        made(*on(0), 1024)
    assert exc.value.code == "SP0707" and "is on cuda:0 but the kernel runs on cuda:1" in str(exc.value)
    assert "prepare" in (exc.value.help or "")


def test_tensor_maps_are_encoded_for_the_launchers_device(gpus: TwoGpus, monkeypatch) -> None:
    from sparsile.backend.runtime import arguments as A
    from sparsile.backend.runtime.tensormap import Swizzle, TensorMap, TensorMapParam

    def fake_make(spec, ptr, owner=None, device=None, validated=False):
        gpus.maps.append(device)
        return TensorMap(spec, ptr, b"\1" * 128)

    monkeypatch.setattr(launcher_module, "make_tensor_map", fake_make)
    monkeypatch.setattr(runtime, "make_tensor_map", fake_make)
    spec = A.ParamSpec((A.PointerParam("a", "f16", aligned16=True, readonly=True),
                        TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True)),
                       kernel_name="tma")
    fn = FakeModule(gpus, 1).function("tma")
    made = runtime.Launcher(fn, spec, num_warps=4)
    a = FakeCudaTensor(0x7A00_0000_0000, (256, 512), dtype=torch.float16, device=1)
    made((1,), [a, a])
    assert gpus.maps == [1] and gpus.launches == [(0x501, 0)]


def test_tma_host_arrays_are_staged_on_the_launchers_device(monkeypatch) -> None:
    made: list[int | None] = []

    class Buffer:
        @classmethod
        def from_numpy(cls, array, device=None, stream=None):
            made.append(device)
            return cls()

    monkeypatch.setattr(runtime, "DeviceBuffer", Buffer)
    spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
    fake = SimpleNamespace(spec=spec, written=set(), device=GPUS[1])
    bound = {"a": np.zeros((64, 64), np.float16)}
    assert launch._stage_tma_host_arrays(fake, bound) == []
    assert made == [1] and isinstance(bound["a"], Buffer)


def test_the_fast_key_holds_the_arrays_device(gpus: TwoGpus) -> None:
    k = vadd()
    k[(4,)](*on(0), 1024, BLOCK=256)
    fast = k.__dict__["_fast_launches"]
    assert fast.key((*on(0), 1024), {"BLOCK": 256}) != fast.key((*on(1), 1024), {"BLOCK": 256})
    host = np.zeros(1024, np.float32)
    # a host array first: the device of the first CUDA tensor after it
    assert fast.key((host, *on(1)[1:], 1024), {"BLOCK": 256}) != fast.key((host, *on(0)[1:], 1024), {"BLOCK": 256})


def test_array_devices() -> None:
    from sparsile.driver.array_devices import array_device, launch_device
    from sparsile.frontend.sema.values import Const

    class Dl:
        def __init__(self, kind: int, ordinal: int):
            self.kind, self.ordinal = kind, ordinal

        def __dlpack_device__(self) -> tuple[int, int]:
            return self.kind, self.ordinal

    assert [array_device(v) for v in (Dl(2, 1), Dl(13, 1), Dl(1, 0), np.zeros(2), torch.zeros(2), 3, None)] == \
        [1, None, None, None, None, None, None]
    assert launch_device({"x": np.zeros(2), "y": Dl(2, 1), "n": 4}) == 1
    assert launch_device({"x": np.zeros(2)}) is None
    assert launch_device({"x": Dl(2, 1), "c": Dl(2, 0)}, {"x": None, "c": Const(0)}) == 1  # a constexpr: not passed
    with pytest.raises(LaunchError) as exc:
        launch_device({"x": Dl(2, 1), "w": Dl(2, 0)})
    assert exc.value.code == "SP0707" and "`w` is on cuda:0 but argument `x` is on cuda:1" in str(exc.value)


class DataPtrArray:
    """A CUDA array of another library that is no torch tensor but has ``data_ptr()`` (as paddle's
    tensors do), read through ``__cuda_array_interface__``: its device is its pointer's, asked from
    the driver (``runtime.pointer_device``, faked by :func:`owners`)."""

    def __init__(self, ptr: int, n: int):
        self._ptr, self.dtype, self.ndim, self.shape = ptr, np.dtype(np.float32), 1, (n,)

    def data_ptr(self) -> int:
        return self._ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": "<f4", "data": (self._ptr, False), "version": 3, "strides": None}


def owners(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fake ``pointer_device``: cuda:1 owns the addresses from 0x7F01_0000_0000 on (see
    :func:`on_data_ptr`), cuda:0 those below; returns the list of pointers asked about."""
    asked: list[int] = []

    def pointer_device(ptr: int) -> int:
        asked.append(ptr)
        return 1 if ptr >= 0x7F01_0000_0000 else 0

    monkeypatch.setattr(runtime, "pointer_device", pointer_device)
    monkeypatch.setattr(launcher_module, "pointer_device", pointer_device)
    return asked


def on_data_ptr(device: int) -> tuple[DataPtrArray, ...]:
    return tuple(DataPtrArray(0x7F00_0000_0000 + device * 0x1_0000_0000 + i * 0x10000, 1024) for i in range(3))


def test_data_ptr_arrays_on_two_gpus_each_keep_their_fast_entry(gpus: TwoGpus, monkeypatch) -> None:
    """Alternating calls with non-torch ``data_ptr`` arrays on cuda:0 and cuda:1: each call runs on
    its arrays' device (the prepared launch and the launcher check every array's device, so an
    entry of the other device is never launched with them) and, the key holding the device, stays
    on the fast path (without the device in the key both devices shared one entry: every call
    missed it, took the full path and replaced it)."""
    owners(monkeypatch)
    k = vadd()
    k[(4,)](*on_data_ptr(0), 1024, BLOCK=256)
    k[(4,)](*on_data_ptr(1), 1024, BLOCK=256)
    assert gpus.loads == [0, 1] and [f for f, _ in gpus.launches] == [0x500, 0x501]
    binds: list[object] = []
    real_bind = k.bind
    monkeypatch.setattr(k, "bind", lambda *a: binds.append(a) or real_bind(*a))
    for device in (0, 1, 0, 1):
        k[(4,)](*on_data_ptr(device), 1024, BLOCK=256)
        assert gpus.launches[-1] == (0x500 + device, 0)  # that device's kernel, on the legacy stream
    assert not binds and gpus.loads == [0, 1]
    fast = k.__dict__["_fast_launches"]
    assert fast.key((*on_data_ptr(0), 1024), {"BLOCK": 256}) != fast.key((*on_data_ptr(1), 1024), {"BLOCK": 256})


def test_a_jax_cpu_array_the_kernel_writes_is_refused_by_kernel_grid(gpus: TwoGpus) -> None:
    """``kernel[grid](...)`` given a JAX CPU array for the output (outside sparsile.jax) staged it and
    copied the result back into JAX's immutable buffer; it is SP0719 now, as in the interpreter,
    before it is staged. JAX arrays the kernel only reads are staged as host arrays."""
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(11)
    x, y = (jnp.asarray(rng.standard_normal(1024).astype(np.float32)) for _ in range(2))
    k = vadd()
    with pytest.raises(LaunchError) as info:
        k[(4,)](x, y, jnp.zeros(1024, jnp.float32), 1024, BLOCK=256)
    assert info.value.code == "SP0719" and "argument `out` is a read-only ArrayImpl (a JAX array" in str(info.value)
    assert "sparsile.jax.call" in info.value.help
    assert gpus.staged == [0, 0] and gpus.launches == []  # `x` and `y` (read), not `out`
    k[(4,)](x, y, np.zeros(1024, np.float32), 1024, BLOCK=256)
    assert gpus.staged == [0, 0] * 2 + [0] and gpus.launches == [(0x500, 0)]
