"""Issue 15 item 3, GPU argument path: host arrays staged to the device for a launch. The same
host memory passed for two parameters shares one device copy (so writes through one are seen by
the other and copied back once); a partial overlap with a write is SP0750. The logic is tested on
the CPU (``arguments.shared_host_copy``, ``launch._stage_tma_host_arrays`` with a stand-in device
buffer); the gpu-marked tests launch a kernel."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend import runtime as R
from sparsile.backend.runtime.host_groups import HostEntry, aliasable, plan_host_groups
from sparsile.driver import launch
from sparsile.frontend.diagnostics import LaunchError


def _groups(*arrays: tuple[str, np.ndarray, bool]) -> list[list[str]]:
    """The names in each planned device copy (aliasable as the launcher judges a numpy array)."""
    entries = [HostEntry(n, a, w, aliasable(a)) for n, a, w in arrays]
    return [[entries[i].name for i in g.members] for g in plan_host_groups(entries)]


def test_identical_host_arrays_share_a_copy_and_disjoint_ones_do_not() -> None:
    base = np.zeros(64, np.float32)
    assert _groups(("x", base[:32], False), ("y", base[32:], True), ("out", base[:32], True)) == [["x", "out"], ["y"]]
    assert _groups(("x", base[:32], False), ("y", base[32:], True), ("out", base.reshape(2, 32)[1], False)) == [
        ["x"], ["y", "out"]]
    assert _groups(("x", base[:32], True), ("out", np.zeros(32, np.float32), True)) == [["x"], ["out"]]
    # interleaved strided views share no element (their byte ranges overlap): a copy each, as the
    # interpreter's np.shares_memory test decides (tests/backend/test_launch_strided_host.py)
    assert _groups(("x", base[::2], True), ("y", base[1::2], False)) == [["x"], ["y"]]
    with pytest.raises(LaunchError):  # views sharing every other element
        _groups(("x", base[::2], True), ("y", base[::4], False))


def test_partial_overlap_of_contiguous_host_arrays_is_one_copy_of_their_union() -> None:
    """Was SP0750 ("each host array is copied to the device on its own"): C-contiguous arrays of the
    machine's byte order that overlap in part now share one copy of the union of their bytes, each at
    its own offset, as the interpreter uses them in place (host_groups.py); with a strided one, a
    write is still SP0750, naming the array copied by its values."""
    base = np.zeros(64, np.float32)
    entries = [HostEntry("x", base[:32], False, True), HostEntry("out", base[16:48], True, True)]
    (group,) = plan_host_groups(entries)
    assert (group.members, group.offsets, group.hi - group.lo, group.written) == ((0, 1), (0, 64), 192, (1,))
    assert group.lead == base.ctypes.data % 256 and group.raw
    with pytest.raises(LaunchError) as info:
        _groups(("x", base[:48:2], False), ("out", base[16:48], True))
    assert info.value.code == "SP0750"
    assert str(info.value).splitlines() == [
        "error[SP0750]: host arrays `x` and `out` overlap in memory but are not the same array, and the "
        "kernel writes `out`; `x` (not C-contiguous) is copied to the device by its values, on its own, so the "
        "writes would be lost",
        " = help: pass the same array for both, or separate arrays (e.g. `y.copy()`); C-contiguous arrays of the "
        "machine's byte order share one device copy however they overlap"]
    assert _groups(("x", base[:48:2], False), ("y", base[16:48], False)) == [["x"], ["y"]]  # both only read


class _FakeDevice:
    """Stands in for runtime.DeviceBuffer: a host copy (``streams``: the stream of each copy back)."""

    streams: ClassVar[list[Any]] = []

    def __init__(self, data: np.ndarray):
        self.data = data.copy()

    @classmethod
    def from_numpy(cls, array: np.ndarray, device: int | None = None) -> _FakeDevice:
        return cls(np.ascontiguousarray(array))

    def copy_to_host(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        _FakeDevice.streams.append(stream)
        if out is None:
            return self.data.copy()
        out[...] = self.data
        return out


def _launcher(tma: list[str], written: set[str]) -> Any:
    params = [SimpleNamespace(name=f"{n}.tmap0", kind="tensormap") for n in tma]
    return SimpleNamespace(spec=SimpleNamespace(params=params), written=written, device=SimpleNamespace(ordinal=0))


def test_tma_staging_shares_the_copy_with_a_pointer_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    x = np.arange(16, dtype=np.float32)
    bound: dict[str, Any] = {"a": x, "out": x, "n": 16}
    back = launch._stage_tma_host_arrays(_launcher(["a"], {"out"}), bound)
    assert bound["a"] is bound["out"] and isinstance(bound["a"], _FakeDevice)
    assert len(back) == 1 and back[0][0] is x  # written through `out`: copied back once
    bound["out"].data[:] = -1
    launch._copy_back(*back[0])
    np.testing.assert_array_equal(x, np.full(16, -1, np.float32))


def test_tma_staging_refuses_a_partial_overlap_with_a_strided_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """(Was: contiguous x[:16] and x[8:24]; those now share one copy of their union:
    test_tma_staging_stages_partly_overlapping_arrays_as_one_copy.)"""
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(LaunchError) as info:
        launch._stage_tma_host_arrays(_launcher(["a"], {"out"}), {"a": x[:16], "out": x[8:24:2]})
    assert info.value.code == "SP0750"


class _RawMemory:
    """Stands in for runtime.DeviceBuffer and the raw copies of runtime.memory: device memory as
    a host bytearray per buffer, at a 256-aligned fake address."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.mem: dict[int, bytearray] = {}
        fake = self

        class Buffer:
            def __init__(self, nbytes: int, device: int | None = None):
                self.ptr, self.device = 0x7F00_0000_0000 + 0x100000 * len(fake.mem), 0
                fake.mem[self.ptr] = bytearray(max(nbytes, 1))

        monkeypatch.setattr(R, "DeviceBuffer", Buffer)
        monkeypatch.setattr(R.memory, "copy_host_to_device", self.htod)
        monkeypatch.setattr(R.memory, "copy_device_to_host", self.dtoh)

    def find(self, ptr: int) -> tuple[bytearray, int]:
        for base, data in self.mem.items():
            if base <= ptr < base + len(data):
                return data, ptr - base
        raise AssertionError(f"no device memory at {ptr:#x}")

    def htod(self, ptr: int, array: np.ndarray, stream: Any = None, device: int | None = None) -> None:
        data, at = self.find(ptr)
        data[at:at + array.nbytes] = array.tobytes()

    def dtoh(self, ptr: int, out: np.ndarray, stream: Any = None, device: int | None = None) -> None:
        data, at = self.find(ptr)
        out[...] = np.frombuffer(bytes(data[at:at + out.nbytes]), out.dtype).reshape(out.shape)


def test_tma_staging_stages_partly_overlapping_arrays_as_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was SP0750: a host array read through TMA and another overlapping it in part, one written.
    Both C-contiguous of the machine's byte order, they are now one device copy of the union of
    their bytes, each argument at its host offset (its alignment mod 256 kept), and the written
    one's bytes (only) come back."""
    memory = _RawMemory(monkeypatch)
    raw = np.random.default_rng(4).standard_normal(40).astype(np.float32)
    x = raw[3:35]  # (an address 12 bytes past the allocation's)
    bound: dict[str, Any] = {"a": x[:16], "out": x[8:24].view(np.uint32), "n": 16}
    back = launch._stage_tma_host_arrays(_launcher(["a"], {"out"}), bound)
    a, out = bound["a"], bound["out"]
    assert isinstance(a, R.staging.StagedView) and a.buffer is out.buffer
    assert out.ptr - a.ptr == 32 and a.ptr % 256 == x.ctypes.data % 256
    assert R.arguments.describe_array(out).dtype == "u32" and R.arguments.describe_array(a).shape == (16,)
    data, at = memory.find(a.ptr)
    assert bytes(data[at:at + 96]) == x[:24].tobytes()
    data[at + 32:at + 96] = np.full(16, 7, np.uint32).tobytes()  # the kernel writes `out`
    data[at:at + 4] = b"\xff" * 4  # (bytes only `a` covers: never copied back)
    before = x.copy()
    for host, dev in back:
        launch._copy_back(host, dev)
    np.testing.assert_array_equal(x[8:24].view(np.uint32), np.full(16, 7, np.uint32))
    np.testing.assert_array_equal(x[:8], before[:8])


def test_tma_staging_copies_a_strided_array_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    base = np.zeros(32, np.float32)
    bound: dict[str, Any] = {"a": base[::2]}
    (host, dev), = launch._stage_tma_host_arrays(_launcher(["a"], {"a"}), bound)
    dev.data[:] = 7
    launch._copy_back(host, dev)
    np.testing.assert_array_equal(base[::2], np.full(16, 7, np.float32))
    np.testing.assert_array_equal(base[1::2], np.zeros(16, np.float32))


def test_tma_staging_shares_the_copy_with_a_torch_cpu_tensor_of_the_same_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only numpy arrays were compared with the host arrays staged for TMA: a CPU torch tensor of
    the same memory passed for a pointer was staged by the launcher on its own, so the writes
    through it were overwritten by the TMA copy's copy-back (last wins)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    x = np.arange(16, dtype=np.float32)
    bound: dict[str, Any] = {"a": x, "out": torch.from_numpy(x), "n": 16}
    back = launch._stage_tma_host_arrays(_launcher(["a"], {"a", "out"}), bound)
    assert bound["out"] is bound["a"] and isinstance(bound["a"], _FakeDevice)
    assert len(back) == 1 and back[0][0] is x
    with pytest.raises(LaunchError) as info:  # (a strided tensor: contiguous ones would share a copy)
        launch._stage_tma_host_arrays(_launcher(["a"], {"out"}), {"a": x[:8], "out": torch.from_numpy(x)[4:12:2]})
    assert info.value.code == "SP0750"


def test_host_copies_of_tma_arrays_come_back_on_the_launch_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch is asynchronous when every host array was staged for TMA; their copy back ran on
    the legacy default stream, which does not wait for a kernel on a non-blocking stream (torch's
    side streams, a ``stream=`` handle): it could copy the results back before the kernel wrote
    them. It now runs on the launch's stream."""
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    monkeypatch.setattr(launch, "user_values", lambda spec, bound: bound)
    monkeypatch.setattr(_FakeDevice, "streams", [])
    x = np.zeros(16, np.float32)
    fake = _FakeLauncher(["a"], {"a"})
    gpu = launch.GpuLaunch(SimpleNamespace(), (1,))
    monkeypatch.setattr(gpu, "_launcher", lambda args, kwargs: (fake, {"a": x}, {}))
    gpu(x, stream=0x1234)
    assert fake.streams == [0x1234] and _FakeDevice.streams == [0x1234]
    np.testing.assert_array_equal(x, np.full(16, 5, np.float32))


class _FakeLauncher:
    """A stand-in runtime Launcher whose kernel writes 5 into the staged `a` (``streams``: the
    stream of each launch)."""

    def __init__(self, tma: list[str], written: set[str]):
        vars(self).update(vars(_launcher(tma, written)))
        self.spec_has_tensormaps = True
        self.streams: list[Any] = []

    def __call__(self, grid: Any, values: dict[str, Any], stream: Any = None) -> None:
        self.streams.append(stream)
        values["a"].data[:] = 5


SOURCE = """
@kernel
def twice(a: ptr[f32], b: ptr[f32], n: i32, BLOCK: constexpr = 128):
    offs = arange(0, BLOCK)
    m = offs < n
    store(a + offs, load(a + offs, mask=m) + 1.0, mask=m)
    store(b + offs, load(b + offs, mask=m) * 10.0, mask=m)
"""


@pytest.mark.gpu
def test_gpu_same_host_array_for_two_written_parameters() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal(128).astype(np.float32)
    ref = (x.astype(np.float64) + 1) * 10
    k = sp.loads(SOURCE, "twice.spk").kernels["twice"]
    k[(1,)](x, x, 128)  # one device copy: b sees a's writes; copied back once
    np.testing.assert_allclose(x, ref, rtol=1e-6)


@pytest.mark.gpu
def test_gpu_partially_overlapping_host_arrays_are_sp0750() -> None:
    base = np.zeros(256, np.float32)
    k = sp.loads(SOURCE, "twice.spk").kernels["twice"]
    with pytest.raises(LaunchError) as info:
        k[(1,)](base[:128], base[64:192], 128)
    assert info.value.code == "SP0750"
    assert not base.any()


# ------------------------------------------------------------------------------------------------
# JAX arrays are immutable: a launch refuses to write one (SP0719, as the interpreter does)

JAX_HELP = ("pass a numpy array or a torch tensor (e.g. `np.array(x)`), or call the kernel through sparsile.jax.call, "
            "whose outputs JAX allocates")


def _assert_jax_written(exc: LaunchError, name: str) -> None:
    assert exc.code == "SP0719"
    assert str(exc).splitlines()[0] == (
        f"error[SP0719]: argument `{name}` is a read-only ArrayImpl (a JAX array: immutable, and JAX may share its "
        "memory with other arrays, constants or caches), but the kernel writes through it")
    assert exc.help == JAX_HELP


def test_a_jax_cpu_array_the_kernel_writes_is_refused_before_it_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JAX CPU array reached the launcher as DLPack host memory, not marked read-only (JAX's export
    does not say so): the launch copied it to the device and the result back into JAX's buffer,
    mutating an immutable array in place. It is SP0719 now, before it is copied (the arguments
    before it were staged and are freed); one the kernel only reads is still staged. (The launcher
    runs against the fake driver.)"""
    jnp = pytest.importorskip("jax.numpy")
    from sparsile.tests.backend.test_runtime_driver import FakeDriver

    if R.has_gpu():
        pytest.skip("the fake driver is for machines without a GPU")
    fake = FakeDriver(monkeypatch)
    module = R.load_module(b"\x7fELF fake cubin")
    spec = R.arguments.ParamSpec((R.arguments.PointerParam("x", "f32", readonly=True),
                                  R.arguments.PointerParam("out", "f32"), R.arguments.ScalarParam("n", "i32")))
    launcher = R.Launcher(module.function("axpy"), spec)
    fake.param_sizes = [8, 8, 4]
    values = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    x, out = jnp.asarray(values), jnp.asarray(values[::-1].copy())
    before = len(fake.calls)
    with pytest.raises(LaunchError) as info:
        launcher(1, (x, out, 100))
    _assert_jax_written(info.value, "out")
    copies = [(n, args) for n, args in fake.calls[before:] if n.startswith("cuMem")]
    # (the arguments are checked before any host array is staged: staging.PlanNeeded; `x` was
    # allocated, copied and freed before)
    assert copies == [] and fake.launches == []
    np.testing.assert_array_equal(np.asarray(out), values[::-1])
    before = len(fake.calls)
    launcher(1, (x, np.zeros(100, np.float32), 100))  # a JAX array the kernel only reads: staged as before
    assert len(fake.launches) == 1
    copies = [n for n, _ in fake.calls[before:] if n.startswith("cuMemcpy")]
    assert copies == ["cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"]  # in, in, `out` back


def test_tma_staging_refuses_a_written_jax_cpu_array_before_staging(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernel[grid](...)`` stages host arrays read through TMA itself; a JAX CPU array the kernel
    writes through another parameter is checked there, before the TMA copy, empty grid or not."""
    jnp = pytest.importorskip("jax.numpy")
    monkeypatch.setattr(R, "DeviceBuffer", _FakeDevice)
    a = np.arange(16, dtype=np.float32)
    out = jnp.asarray(np.arange(16, dtype=np.float32) * 2)
    for empty in (False, True):
        bound: dict[str, Any] = {"a": a, "out": out}
        with pytest.raises(LaunchError) as info:
            launch._stage_tma_host_arrays(_launcher(["a"], {"out"}), bound, empty=empty)
        _assert_jax_written(info.value, "out")
        assert bound["a"] is a  # not staged
    bound = {"a": a, "x": out}  # read, not written: the TMA array is staged
    assert launch._stage_tma_host_arrays(_launcher(["a"], set()), bound) == [] and isinstance(bound["a"], _FakeDevice)
