"""The staging plan of a launch's host arrays (backend/runtime/host_groups.py) meets the arguments
more than once: the launcher converts them in a pass that checks them and collects the host arrays
(the plan is made from those), then again, staging each host array at its planned place from the
planned arrays; driver/launch.py plans the host arrays read through TMA. Found in a review of the
staging rework: what a host array's memory is kept alive by in the plan, and how the TMA staging
copies a group whose members are copied by their values.

No GPU: the faked device of tests/backend/test_launch_byte_order.py (vector_add on its memory) and
the raw device memory of tests/backend/test_host_staging.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sparsile.backend import runtime as R
from sparsile.driver import launch
from sparsile.frontend import dlpack
from sparsile.tests.backend.test_launch_byte_order import BLOCK, GRID, FakeDevice, N, device
from sparsile.tests.backend.test_prepared import vadd

__all__ = ["device"]  # (the fixture, imported for the tests below)


class _Owner:
    """What one export's memory belongs to: poisoned (NaN) when the export is released, as memory
    freed and reused would be (the producer keeps it allocated, so that no later export is made in
    the same memory, with the same values)."""

    def __init__(self, memory: np.ndarray):
        self.memory = memory

    def __del__(self) -> None:
        self.memory[...] = np.nan


class MaterializingExport:
    """A DLPack producer that exports its values in memory it allocates per export, alive until the
    consumer releases the capsule (a lazily computed or compressed array's pattern: read-only use)."""

    def __init__(self, values: np.ndarray):
        self.values, self.dtype, self.shape = values, values.dtype, values.shape
        self.memories: list[np.ndarray] = []

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        memory = self.values.copy()
        self.memories.append(memory)
        return dlpack.export_capsule(memory.ctypes.data, memory.shape, "f32", dlpack.DEVICE_CPU, 0,
                                     owner=_Owner(memory))

    def __dlpack_device__(self) -> Any:
        return (dlpack.DEVICE_CPU, 0)


def test_a_host_export_is_staged_from_memory_still_alive(device: FakeDevice) -> None:
    """The launcher staged a DLPack host export (a pointer argument) from the export of its
    checking pass, whose capsule it had let go (the plan held a view of the memory, not its owner):
    the copy read released memory (here poisoned: NaN results)."""
    rng = np.random.default_rng(5)
    x, y = (rng.uniform(-100, 100, N).astype(np.float32) for _ in range(2))
    out = np.full(N, np.nan, np.float32)
    vadd()[GRID](MaterializingExport(x), y, out, N, BLOCK=BLOCK)
    assert device.launches == 1
    got = out.astype(np.float64)
    assert not np.isnan(got).any(), "the staged copy read released memory"
    np.testing.assert_allclose(got, x.astype(np.float64) + y.astype(np.float64), rtol=1e-6, atol=1e-5)


class _RawMemory:
    """Stands in for runtime.DeviceBuffer and the raw copies of runtime.memory (what
    driver/launch.py stages host arrays read through TMA with): device memory as a bytearray per
    buffer, at a 256-aligned fake address."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.mem: dict[int, bytearray] = {}
        fake = self

        class Buffer:
            def __init__(self, nbytes: int, *, dtype: Any = None, shape: Any = None, device: Any = None):
                self.ptr, self.device, self.nbytes = 0x7F00_0000_0000 + 0x100000 * len(fake.mem), 0, nbytes
                self.dtype, self.shape = dtype, shape
                fake.mem[self.ptr] = bytearray(max(nbytes, 1))

        for name in ("__init__",):
            monkeypatch.setattr(R.DeviceBuffer, name, Buffer.__init__)
        monkeypatch.setattr(R.DeviceBuffer, "free", lambda self: None)
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

    def read(self, ptr: int, nbytes: int) -> bytes:
        data, at = self.find(ptr)
        return bytes(data[at:at + nbytes])

    def write(self, ptr: int, values: bytes) -> None:
        data, at = self.find(ptr)
        data[at:at + len(values)] = values


def _tma_launcher(tma: list[str], written: set[str]) -> Any:
    params = [SimpleNamespace(name=f"{n}.tmap0", kind="tensormap") for n in tma]
    return SimpleNamespace(spec=SimpleNamespace(params=params), written=written, device=SimpleNamespace(ordinal=0))


def _device_address(value: Any) -> int:
    return R.arguments.describe_array(value).ptr


def test_tma_staging_copies_a_strided_group_by_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A strided host array read through TMA and the same view of its memory as u32, written: one copy
    of their values (as the launcher stages them, staging.device_values). The TMA staging copied the
    raw bytes of their span (the elements between theirs too) and described it as their dense
    copy: the kernel read every other number of the wrong ones, and its writes came back over the
    wrong elements."""
    memory = _RawMemory(monkeypatch)
    base = np.random.default_rng(6).uniform(-100, 100, 64).astype(np.float32)
    before = base.copy()
    bound: dict[str, Any] = {"a": base[::2], "b": base.view(np.uint32)[::2], "n": 32}
    back = launch._stage_tma_host_arrays(_tma_launcher(["a"], {"b"}), bound)
    a, b = _device_address(bound["a"]), _device_address(bound["b"])
    assert a == b
    assert memory.read(a, 128) == np.ascontiguousarray(before[::2]).tobytes()
    written = np.random.default_rng(7).integers(0, 2**32, 32, dtype=np.uint32)
    memory.write(b, written.tobytes())  # the kernel writes `b`
    for host, dev in back:
        launch._copy_back(host, dev)
    np.testing.assert_array_equal(base.view(np.uint32)[::2], written)
    np.testing.assert_array_equal(base[1::2], before[1::2])  # (between its elements: left alone)


def test_tma_staging_copies_byte_swapped_views_of_two_shapes_by_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte-swapped array read through TMA as (4, 8) and passed again flat (32,), written: one copy
    of their values in the machine's byte order. The TMA staging copied their raw (swapped) bytes,
    so the kernel read other numbers, and copied the results back raw into the swapped memory."""
    memory = _RawMemory(monkeypatch)
    values = np.random.default_rng(8).uniform(-100, 100, 32).astype(np.float32)
    be = values.astype(">f4")
    bound: dict[str, Any] = {"a": be.reshape(4, 8), "out": be, "n": 32}
    back = launch._stage_tma_host_arrays(_tma_launcher(["a"], {"out"}), bound)
    a, out = _device_address(bound["a"]), _device_address(bound["out"])
    assert a == out
    assert memory.read(a, 128) == values.tobytes()
    results = np.random.default_rng(9).uniform(-100, 100, 32).astype(np.float32)
    memory.write(out, results.tobytes())  # the kernel writes `out`, in the machine's byte order
    for host, dev in back:
        launch._copy_back(host, dev)
    assert be.dtype == np.dtype(">f4")
    np.testing.assert_array_equal(be.astype(np.float32), results)


def test_tma_staging_plans_a_cpu_torch_tensor_read_through_tma_with_the_numpy_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two host arrays read through TMA, a numpy array and a CPU torch tensor overlapping it in part
    (the kernel writes the tensor): only numpy arrays and the arguments not read through TMA were
    planned, so the tensor was left to the launcher, which staged it in a copy of its own: the numpy
    array's copy never saw its writes (the interpreter, using both in place, does), silently."""
    torch = pytest.importorskip("torch")
    memory = _RawMemory(monkeypatch)
    x = np.random.default_rng(10).uniform(-100, 100, 32).astype(np.float32)
    bound: dict[str, Any] = {"a": x[:16], "b": torch.from_numpy(x)[8:24], "n": 16}
    launch._stage_tma_host_arrays(_tma_launcher(["a", "b"], {"b"}), bound)
    assert isinstance(bound["b"], R.staging.StagedView), "the tensor was left to be staged on its own"
    assert _device_address(bound["b"]) - _device_address(bound["a"]) == 32
    assert memory.read(_device_address(bound["a"]), 96) == x[:24].tobytes()


def _tma_and_pointer_spec(aligned16: bool) -> Any:
    """a: read by pointer (16-byte aligned where ``aligned16``) and through a TMA map; out: written."""
    from sparsile.backend.runtime.arguments import ParamSpec, PointerParam, ScalarParam
    from sparsile.backend.runtime.tensormap import Swizzle, TensorMapParam

    return ParamSpec((PointerParam("a", "f16", aligned16=aligned16, readonly=True),
                      TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True),
                      PointerParam("out", "f16"), ScalarParam("k", "i32")), kernel_name="tma")


def _misaligned_member() -> tuple[np.ndarray, np.ndarray]:
    """(a, out): `a` (256, 512) f16 8 bytes into `out`'s memory (not 16-byte aligned), `out` all of it."""
    memory = np.zeros(256 * 512 + 256, np.float16)
    memory = memory[(-memory.ctypes.data % 256) // 2:][:256 * 512 + 8]  # (a 256-aligned start)
    return memory[4:4 + 256 * 512].reshape(256, 512), memory


@pytest.mark.parametrize("aligned16", [False, True])
def test_an_empty_grid_checks_a_members_alignment_as_a_launch_that_runs(monkeypatch: pytest.MonkeyPatch,
                                                                        aligned16: bool) -> None:
    """`a` read through TMA (and by a pointer specialized 16-byte aligned, for a launcher built by
    hand) shares one copy with `out`, which it overlaps in part: on the device it is 8 bytes past a
    16-byte boundary, as on the host, which a tensor map's address (SP0714) and the pointer's
    specialization (SP0704) refuse. A launch of an empty grid, which stages nothing, checked neither:
    it returned where the same launch of one block was refused."""
    from cuda.bindings import driver as cuda_driver

    from sparsile.backend.runtime import launcher as launcher_module
    from sparsile.frontend.diagnostics import LaunchError
    from sparsile.tests.backend.test_runtime import OK, EmulatedGpu, make_launcher

    gpu = EmulatedGpu(monkeypatch)
    monkeypatch.setattr(cuda_driver, "cuMemcpyHtoDAsync", lambda *a: (OK,))  # (at an offset into the allocation)
    encoded: list[int] = []
    monkeypatch.setattr(launcher_module, "make_tensor_map", lambda spec, ptr, device=None, validated=False:
                        encoded.append(ptr))
    launcher = make_launcher(gpu, _tma_and_pointer_spec(aligned16), [8, 128, 8, 4])
    a, out = _misaligned_member()
    codes = []
    for grid in ((1,), (0,)):
        with pytest.raises(LaunchError) as exc:
            launcher(grid, (a, a, out, 3))
        codes.append(exc.value.code)
        assert "16-byte aligned" in str(exc.value)
    assert codes == ["SP0704" if aligned16 else "SP0714"] * 2 and encoded == [] and gpu.launches == []
    launcher((0,), (out[8:8 + 256 * 512].reshape(256, 512),) * 2 + (out, 3))  # 16 bytes in: aligned, as it runs


def test_an_empty_grids_tma_stand_in_has_the_alignment_of_its_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in of a host array read through TMA for an empty grid (``Unstaged``) was described at
    address 0, whatever the copy's address would be: a member of a copy shared with an array it
    overlaps keeps its host address's alignment mod 256, which its tensor map and pointer checks
    must see as a launch that runs sees its StagedView."""
    _RawMemory(monkeypatch)
    a, out = _misaligned_member()
    ran: dict[str, Any] = {"a": a, "out": out, "k": 3}
    launch._stage_tma_host_arrays(_tma_launcher(["a"], {"out"}), ran)
    empty: dict[str, Any] = {"a": a, "out": out, "k": 3}
    assert launch._stage_tma_host_arrays(_tma_launcher(["a"], {"out"}), empty, empty=True) == []
    for name in ("a", "out"):
        assert _device_address(empty[name]) % 256 == _device_address(ran[name]) % 256 == \
            R.arguments.describe_array(locals()[name]).ptr % 256


def test_a_host_array_staged_off_the_alignment_its_pointer_was_specialized_for(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    """SP0704 for a launcher built by hand with `a` specialized 16-byte aligned, given a host array
    8 bytes past a boundary that shares a copy with `out` (kernel[grid] specializes a host array by
    its address): in one wording, empty grid or not (it named the device address, which an empty
    grid's has none of)."""
    from cuda.bindings import driver as cuda_driver

    from sparsile.frontend.diagnostics import LaunchError
    from sparsile.tests.backend.test_runtime import OK, EmulatedGpu, make_launcher

    gpu = EmulatedGpu(monkeypatch)
    monkeypatch.setattr(cuda_driver, "cuMemcpyHtoDAsync", lambda *a: (OK,))  # (at an offset into the allocation)
    launcher = make_launcher(gpu, _tma_and_pointer_spec(True), [8, 128, 8, 4])
    a, out = _misaligned_member()
    errors = []
    for grid in ((1,), (0,)):
        with pytest.raises(LaunchError) as exc:
            launcher(grid, (a, a, out, 3))
        errors.append((exc.value.code, exc.value.message, exc.value.help))
        assert exc.value.span is not None
    assert errors == [("SP0704", f"argument `a` is a host array at {a.ctypes.data:#x}, which is not 16-byte aligned, "
                       "staged in one device copy with the host arrays it overlaps (keeping its alignment), but the "
                       "kernel was specialized assuming 16-byte alignment",
                       "specialize the kernel for this argument's alignment (kernel[grid](...) does), or pass a copy "
                       "that starts on a 16-byte boundary")] * 2
    assert gpu.launches == []
