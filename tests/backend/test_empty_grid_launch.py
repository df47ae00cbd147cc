"""A grid with a 0 dimension on the GPU launch paths, on the CPU: the Launcher (the emulated GPU of
test_runtime.py: host copies included), ``kernel[grid](...)`` and its fast path, prepared launches
and the native launch records (the fake device of test_prepared.py, the fake libcuda of
tests/integrations/record_fakes.py). Such a launch checks every argument, compiles, and makes no
launch call: CUDA refuses a 0 grid dimension (docs/language.md, "Specialization and launching").
The same launches on a GPU: tests/gpu/test_empty_grid_gpu.py."""

from __future__ import annotations

import ctypes as c
import struct

import numpy as np
import pytest
from cuda.bindings import driver

import sparsile as sp
from sparsile.backend.runtime import Launcher
from sparsile.backend.runtime import arguments as A
from sparsile.backend.runtime import native_launch as nl
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.sema.values import Const
from sparsile.tests.backend.test_prepared import FakeCudaTensor, arrays, tma_launch, vadd
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)
from sparsile.tests.backend.test_runtime import VADD, EmulatedGpu, FakeDLPack, FakeFunction, make_launcher, vadd_kernel

torch = pytest.importorskip("torch")

EMPTY = [0, (0,), (1, 0), (0, 2, 3), (4, 4, 0), [0, 0, 0]]
DEVICE_ARGS = (0x10, 0x20, 0x30, 0)


# ------------------------------------------------------------------------------------------------
# the Launcher (backend/runtime/launcher.py)


@pytest.mark.parametrize("grid", EMPTY)
def test_launcher_makes_no_launch_call_for_an_empty_grid(monkeypatch, grid):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    launcher(grid, DEVICE_ARGS)
    launcher(grid, DEVICE_ARGS)  # the cached grid too
    assert gpu.launches == [] and gpu.syncs == 0
    launcher((3,), (0x10, 0x20, 0x30, 300))  # the next launch is an ordinary one
    assert [r["grid"] for r in gpu.launches] == [(3, 1, 1)]


def test_launcher_callable_grid_of_an_empty_batch(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    launcher(lambda meta: (sp.cdiv(meta["n"], 128),), DEVICE_ARGS)
    assert gpu.launches == []


class Staging:
    """What an emulated GPU saw of host-array staging: allocations, copies each way, syncs, frees."""

    def __init__(self, gpu: EmulatedGpu, monkeypatch):
        self.gpu, self.htod, self.dtoh = gpu, [], []
        monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", lambda *a: self.htod.append(a) or gpu.htod(*a))
        monkeypatch.setattr(driver, "cuMemcpyDtoHAsync", lambda *a: self.dtoh.append(a) or gpu.dtoh(*a))

    def counts(self) -> tuple[int, int, int, int, int]:
        """(allocations, host-to-device copies, device-to-host copies, syncs, frees)."""
        return len(self.gpu.memory), len(self.htod), len(self.dtoh), self.gpu.syncs, len(self.gpu.freed)


def test_launcher_empty_grid_stages_no_host_array(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    gpu.kernel = vadd_kernel(gpu)
    staging = Staging(gpu, monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    x, y = np.ones(64, np.float32), np.full(64, 2, np.float32)
    out = np.full(64, np.nan, np.float32)
    for grid in EMPTY:
        launcher(grid, (x, y, out, 64))
        launcher(grid, (x, y, x, 64))  # (the same host array twice: one copy, had it been staged)
    assert gpu.launches == [] and np.isnan(out).all()
    assert staging.counts() == (0, 0, 0, 0, 0)  # nothing allocated, copied, synchronized or freed
    launcher((1,), (x, y, out, 64))  # a launch that runs stages as before
    np.testing.assert_array_equal(out, x + y)
    assert staging.counts() == (3, 3, 1, 1, 3)


def _bad_host_arguments():
    shared = np.zeros(128, np.float32)
    repeating = np.lib.stride_tricks.as_strided(np.zeros(64, np.float32), (64,), (0,))  # one element, written
    return [
        # a strided view written in part (two contiguous views overlapping in part now share one copy:
        # tests/backend/test_launch_partial_overlap.py)
        ((shared[::2], np.zeros(64, np.float32), shared[32:96], 64), A.ARG_OVERLAP),
        ((np.zeros(64, np.float32), np.zeros(64, np.float32), repeating, 64), A.ARG_OVERLAP),
        ((np.zeros(64, np.float16), np.zeros(64, np.float32), np.zeros(64, np.float32), 64), A.ARG_DTYPE),
    ]


@pytest.mark.parametrize("case", range(3))
def test_launcher_empty_grid_checks_host_arrays_as_a_launch_that_runs(monkeypatch, case):
    gpu = EmulatedGpu(monkeypatch)
    staging = Staging(gpu, monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    args, code = _bad_host_arguments()[case]
    with pytest.raises(LaunchError) as empty:
        launcher((0,), args)
    assert empty.value.code == code and staging.counts() == (0, 0, 0, 0, 0)
    with pytest.raises(LaunchError) as runs:
        launcher((1,), args)
    assert (str(empty.value), empty.value.help) == (str(runs.value), runs.value.help)


def _tma_spec():
    from sparsile.backend.runtime.tensormap import Swizzle, TensorMapParam

    return A.ParamSpec((A.PointerParam("a", "f16", aligned16=True, readonly=True),
                        A.DerivedParam("a.tensor_dim0", "a", "shape", 0),
                        TensorMapParam("a.tmap0", "f16", (64, 64), swizzle=Swizzle.B128, readonly=True),
                        A.ScalarParam("k", "i32")), kernel_name="tma")


def test_launcher_empty_grid_encodes_no_tensor_map_of_a_host_array(monkeypatch):
    from sparsile.backend.runtime import launcher as launcher_module
    from sparsile.backend.runtime.tensormap import TensorMap

    gpu = EmulatedGpu(monkeypatch)
    staging = Staging(gpu, monkeypatch)
    encoded = []
    monkeypatch.setattr(launcher_module, "make_tensor_map",
                        lambda spec, ptr, device=None, validated=False: (None if validated else spec.validate(ptr))
                        or encoded.append(ptr) or TensorMap(spec, ptr, b"\1" * 128))  # (validated as the real one)
    launcher = make_launcher(gpu, _tma_spec(), [8, 4, 128, 4])
    a = np.zeros((256, 512), np.float16)
    launcher((0,), (a, a, 3))
    assert encoded == [] and staging.counts() == (0, 0, 0, 0, 0) and gpu.launches == []
    narrow = np.zeros((256, 4), np.float16)  # rows of 8 bytes: no tensor map takes them
    messages = []
    for grid in ((0,), (1,)):  # the same diagnostic, empty grid or not
        with pytest.raises(LaunchError) as exc:
            launcher(grid, (narrow, narrow, 3))
        assert exc.value.code == A.TENSOR_MAP
        messages.append(str(exc.value))
    assert messages[0] == messages[1] and encoded == []
    before = staging.counts()
    launcher((1,), (a, a, 3))  # one copy for the pointer and the map
    after = staging.counts()
    assert len(encoded) == 1 and (after[0] - before[0], after[1] - before[1]) == (1, 1) and len(gpu.launches) == 1


@pytest.mark.parametrize(("args", "kwargs", "code"), [
    ((FakeDLPack(0x1000, (64,), "f16"), 0x20, 0x30, 0), {}, A.ARG_DTYPE),
    ((0x10, 0x20, 0x30, 2**31), {}, A.ARG_RANGE),
    ((0x10, 0x20, 0x30, 1.5), {}, A.ARG_DTYPE),  # a float for an integer: SP0703 on every path
    ((0x10, 0x20, 0x30), {}, A.ARG_COUNT),
    ((0x10, 0x20, 0x30, 0), {"nope": 1}, A.ARG_KEYWORD),
    ((0x10, 0x20, 0x30, 0), {"BLOCK": 64}, A.CONSTEXPR),
    ((FakeDLPack(0x1000, (64,), "f32", device_id=1), 0x20, 0x30, 0), {}, A.ARG_DEVICE),
    (("x", 0x20, 0x30, 0), {}, A.ARG_KIND),
])
def test_launcher_checks_every_argument_of_an_empty_grid(monkeypatch, args, kwargs, code):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    with pytest.raises(LaunchError) as exc:
        launcher((0,), args, kwargs)
    assert exc.value.code == code and not gpu.launches


def test_launcher_refuses_host_arrays_of_an_empty_grid_when_told_to(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    strict = make_launcher(gpu, VADD, [8, 8, 8, 4], allow_host_copies=False)
    with pytest.raises(LaunchError) as exc:
        strict((0,), (np.zeros(4, np.float32), 0x20, 0x30, 4))
    assert exc.value.code == A.ARG_HOST_MEMORY and not gpu.launches


@pytest.mark.parametrize(("grid", "message"), [
    ((-1,), "grid (-1, 1, 1) has -1 blocks along x; a grid dimension cannot be negative"),
    ((0, -3), "grid (0, -3, 1) has -3 blocks along y; a grid dimension cannot be negative"),
    ((0, 70000), "grid (0, 70000, 1) exceeds the device limit along y (70000 > 65535 on NVIDIA H200)"),
    ((0.0,), "grid (0.0,) contains the non-integer 0.0"),
])
def test_launcher_still_refuses_bad_grids_with_a_zero_dimension(monkeypatch, grid, message):
    gpu = EmulatedGpu(monkeypatch)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    with pytest.raises(LaunchError) as exc:
        launcher(grid, DEVICE_ARGS)
    assert exc.value.code == A.GRID and message in str(exc.value) and not gpu.launches


@pytest.mark.parametrize("cluster,pdl", [((2, 1, 1), False), ((1, 1, 1), True)])
def test_cluster_and_pdl_launches_of_an_empty_grid_make_no_launch_ex_call(monkeypatch, cluster, pdl):
    EmulatedGpu(monkeypatch)
    seen = []
    launcher = Launcher(FakeFunction(), A.ParamSpec((A.PointerParam("out", "u32"),)), num_warps=2, cluster=cluster,
                        pdl=pdl)

    def launch_ex(config, f, params, extra):
        seen.append(config.gridDimX)
        return (driver.CUresult.CUDA_SUCCESS,)

    launcher._launch_kernel_ex = launch_ex
    launcher._launch_kernel = lambda *a: pytest.fail("cuLaunchKernel called")
    launcher((0, 4), (0xA000,))
    assert seen == []
    launcher((2, 4), (0xA000,))
    assert seen == [2]
    if cluster != (1, 1, 1):  # the grid must still fit the cluster
        with pytest.raises(LaunchError) as exc:
            launcher((3, 0), (0xA000,))
        assert exc.value.code == A.CLUSTER


# ------------------------------------------------------------------------------------------------
# kernel[grid](...), its fast path, prepared launches (driver/launch.py, fast_launch.py, prepared.py)


def test_kernel_launch_of_an_empty_grid_compiles_and_launches_nothing(gpu):
    k = vadd()
    x, y, out = arrays()
    k[(0,)](x, y, out, 0, BLOCK=256)
    assert len(gpu.built) == 1 and gpu.launches == []  # compiled (and cached) by the first launch
    assert len(k._fast_launches.entries) == 1
    k[(0,)](x, y, out, 0, BLOCK=256)  # the fast path
    k[lambda meta: (sp.cdiv(0, meta["BLOCK"]),)](x, y, out, 0, BLOCK=256)
    assert gpu.launches == []
    k[(4,)](x, y, out, 1024, BLOCK=256)  # the next non-empty launch: same specialization, one launch
    assert len(gpu.built) == 1 and [r["grid"] for r in gpu.launches] == [(4, 1, 1)]


@pytest.mark.parametrize(("change", "code"), [
    (lambda a: (FakeCudaTensor(a[0].data_ptr(), (1024,), dtype=torch.float16), *a[1:]), "SP0703"),
    (lambda a: (a[0], FakeCudaTensor(0x7F00_0001_0000, (1024,), device=1), a[2]), "SP0707"),
    (lambda a: (a[0], a[1], "out"), "SP0708"),
])
def test_kernel_launch_of_an_empty_grid_checks_arguments_on_both_paths(gpu, change, code):
    k = vadd()
    good = arrays()
    for _ in range(2):  # the full path, then the fast path (its entry made by the good launch)
        with pytest.raises(LaunchError) as exc:
            k[(0,)](*change(good), 0, BLOCK=256)
        assert exc.value.code == code
        k[(0,)](*good, 0, BLOCK=256)
    with pytest.raises(LaunchError) as exc:
        k[(0,)](*good, BLOCK=256)
    assert exc.value.code == "SP0701"
    with pytest.raises(LaunchError) as exc:
        k[(-1,)](*good, 0, BLOCK=256)
    assert exc.value.code == "SP0710"
    assert gpu.launches == []


def test_prepared_launch_of_an_empty_grid(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(0,)].prepare(x, y, out, 1024, BLOCK=256)
    assert len(gpu.built) == 1
    launch_(*arrays(base=0x7E00_0000_0000), 2048)
    assert gpu.launches == []
    with pytest.raises(LaunchError) as exc:  # the per-call checks still run
        launch_(FakeCudaTensor(x.data_ptr(), (1024,), dtype=torch.float16), y, out, 1024)
    assert exc.value.code == "SP0703"
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 1000)  # 1000 is no multiple of 16, as the specialization assumed
    assert exc.value.code == "SP0709"
    launch_(x, y, out, 1024, grid=(4,))
    launch_(x, y, out, 1024, grid=(4, 0))
    launch_(x, y, out, 1024)
    assert [r["grid"] for r in gpu.launches] == [(4, 1, 1)]
    assert struct.unpack("<i", gpu.launches[0]["params"][3]) == (1024,)
    with pytest.raises(LaunchError) as exc:
        launch_(x, y, out, 1024, grid=(0, -1))
    assert exc.value.code == "SP0710"


def test_a_prepared_launch_of_a_non_empty_grid_called_with_an_empty_one(gpu):
    x, y, out = arrays()
    launch_ = vadd()[(4,)].prepare(x, y, out, 1024, BLOCK=256)
    launch_(x, y, out, 1024, grid=(0,))
    assert gpu.launches == []
    launch_(x, y, out, 1024)
    assert [r["grid"] for r in gpu.launches] == [(4, 1, 1)]


# ------------------------------------------------------------------------------------------------
# native launch records (backend/runtime/native_launch.py)


def _replay(launcher: nl.RecordLauncher, words: list[int], a: int) -> int:
    record = launcher.record(words)
    return launcher.launch(c.addressof(record), a, 0, 0, 0x5100)


def test_no_native_record_of_an_empty_prepared_grid(monkeypatch):
    made, recorder, a = tma_launch(monkeypatch, [], per_call=(0,), grid=(0,))
    assert made.native_record((a,), (0,), (True,)) is None  # its callers fall back to the prepared launch
    made.run((a,))
    assert recorder.launches == []


@pytest.mark.parametrize("axis", [nl.R_GX, nl.R_GY, nl.R_GZ])
@pytest.mark.parametrize("cluster", [(1, 1, 1), (2, 1, 1)])
def test_a_record_with_a_zero_grid_dimension_is_not_launched_natively(monkeypatch, axis, cluster):
    """The backstop in the record launch's IR: a record whose grid has a 0 dimension goes to the
    slow path (the caller's Python launch, which launches nothing) instead of cuLaunchKernel(Ex)."""
    from sparsile.tests.integrations.record_fakes import FakeDriver

    made, recorder, a = tma_launch(monkeypatch, [], per_call=(0,))
    made.launcher.cluster = cluster
    record = made.native_record((a,), (0,), (True,))
    fake = FakeDriver(recorder.sizes)
    launcher = nl.RecordLauncher(fake.entry_points())
    words = list(record.words)
    words[axis] = 0
    assert _replay(launcher, words, a.data_ptr()) == -1
    assert fake.launches == [] and launcher.counts() == {"launched": 0, "declined": 1, "launch_failures": 0}
    assert _replay(launcher, record.words, a.data_ptr()) == 0 and len(fake.launches) == 1


# ------------------------------------------------------------------------------------------------
# host arrays of kernel[grid](...) and its fast path: nothing staged for an empty grid


def test_kernel_launch_of_an_empty_grid_stages_no_host_array(gpu, monkeypatch):
    emulated = EmulatedGpu(monkeypatch)
    emulated.kernel = vadd_kernel(emulated)
    gpu.built.clear()
    staging = Staging(emulated, monkeypatch)
    k = vadd()
    x, y = np.ones(1024, np.float32), np.full(1024, 2, np.float32)
    out = np.full(1024, np.nan, np.float32)
    k[(0,)](x, y, out, 0, BLOCK=256)  # the full path
    assert len(k._fast_launches.entries) == 1
    k[(0,)](x, y, out, 0, BLOCK=256)  # the fast path (its entry holds the launcher: host arrays)
    k[lambda meta: (sp.cdiv(0, meta["BLOCK"]),)](x, y, out, 0, BLOCK=256)
    assert gpu.launches == [] and np.isnan(out).all() and staging.counts() == (0, 0, 0, 0, 0)
    with pytest.raises(LaunchError) as exc:  # its checks: as before
        k[(0,)](x, y, np.zeros(1024, np.float16), 0, BLOCK=256)
    assert exc.value.code == A.ARG_DTYPE and staging.counts() == (0, 0, 0, 0, 0)
    with pytest.raises(LaunchError) as exc:  # a prepared launch refuses host arrays, empty grid or not
        k[(0,)].prepare(x, y, out, 1024, BLOCK=256)
    assert exc.value.code == "SP0733" and staging.counts() == (0, 0, 0, 0, 0)
    k[(4,)](x, y, out, 1024, BLOCK=256)  # a launch that runs: staged, launched, copied back
    assert staging.counts() == (3, 3, 1, 1, 3) and len(gpu.launches) == 1


def _count_staging(monkeypatch) -> list:
    """Replace ``runtime.DeviceBuffer`` by a stand-in that records the device of each host array it
    stages and each copy back ("copied back"); the record, in order."""
    from sparsile.backend import runtime

    made: list = []

    class Buffer:
        @classmethod
        def from_numpy(cls, array, device=None, stream=None):
            made.append(device)
            return cls()

        def copy_to_host(self, host, stream=None):
            made.append("copied back")

    monkeypatch.setattr(runtime, "DeviceBuffer", Buffer)
    return made


def test_tma_host_arrays_of_an_empty_grid_are_not_staged(monkeypatch):
    """``kernel[grid](...)`` copies a host array read through TMA to the device itself
    (driver/launch.py); for an empty grid it checks the same (SP0750) and passes an ``Unstaged``
    stand-in, which the launcher checks as that copy, without encoding its tensor map."""
    from types import SimpleNamespace

    from sparsile.backend.runtime import launcher as launcher_module
    from sparsile.backend.runtime.staging import Unstaged
    from sparsile.backend.runtime.tensormap import TensorMap
    from sparsile.driver import launch

    made = _count_staging(monkeypatch)

    spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
    fake = SimpleNamespace(spec=spec, written={"a", "c"}, device=SimpleNamespace(ordinal=0))
    a = np.zeros((256, 512), np.float16)[:, ::2]  # strided: its device copy is dense
    bound = {"a": a, "b": a, "k": 3}
    assert launch._stage_tma_host_arrays(fake, bound, empty=True) == []
    assert made == [] and type(bound["a"]) is Unstaged and bound["b"] is bound["a"] and bound["a"].host is a
    shared = np.zeros((128, 64), np.float16)
    for empty in (True, False):  # a partial overlap with a strided write: the same SP0750 (contiguous
        with pytest.raises(LaunchError) as exc:  # views share one copy: tests/backend/test_host_staging.py)
            launch._stage_tma_host_arrays(fake, {"a": shared[:64], "c": shared[32:, ::2]}, empty=empty)
        assert exc.value.code == A.ARG_OVERLAP
    assert made == []  # (refused before anything is copied: it copied `a` first, then refused)
    gpu = EmulatedGpu(monkeypatch)
    staging = Staging(gpu, monkeypatch)
    encoded = []
    monkeypatch.setattr(launcher_module, "make_tensor_map",
                        lambda spec, ptr, device=None, validated=False: encoded.append(ptr)
                        or TensorMap(spec, ptr, b"\1" * 128))
    launcher = make_launcher(gpu, _tma_spec(), [8, 4, 128, 4])
    launcher((0,), (bound["a"], bound["a"], 3))  # (a host array itself would be refused: not contiguous)
    assert encoded == [] and gpu.launches == [] and staging.counts() == (0, 0, 0, 0, 0)
    with pytest.raises(LaunchError) as exc:  # checked as its copy: a dtype the parameter does not take
        launcher((0,), (Unstaged(np.zeros((64, 64), np.float32)),) * 2 + (3,))
    assert exc.value.code == A.ARG_DTYPE and "DeviceBuffer" in str(exc.value)


@pytest.mark.parametrize("grid", [np.int64(0), (np.int64(0),), (4, np.int32(0)), [np.uint8(0), 2],
                                  lambda meta: (np.int64(0), meta["BK"])])
def test_tma_host_arrays_of_an_empty_grid_of_numpy_integers_are_not_staged(monkeypatch, grid):
    """A grid's dimensions may be numpy integers (the launcher takes any integer: ``np.prod(shape)
    // BM``); one of 0 is an empty grid there too: ``kernel[grid](...)`` stages no TMA host array
    (no device copy, nothing copied back)."""
    from types import SimpleNamespace

    from sparsile.backend.runtime.staging import Unstaged
    from sparsile.driver import launch

    made = _count_staging(monkeypatch)

    class FakeLauncher:
        spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
        spec_has_tensormaps, written, device = True, {"a"}, SimpleNamespace(ordinal=0)

        def __init__(self) -> None:
            self.calls: list = []

        def __call__(self, grid, values, stream=None):
            self.calls.append((grid, values))

    fake = FakeLauncher()
    a = np.zeros((256, 512), np.float16)
    monkeypatch.setattr(launch, "user_values", lambda spec, bound: list(bound.values()))
    monkeypatch.setattr(launch.GpuLaunch, "_launcher", lambda self, args, kwargs: (
        fake, {"a": args[0], "k": args[1]}, {"BK": Const(64)}))
    launch.GpuLaunch(SimpleNamespace(name="tma"), grid)(a, 3)
    ((_, (copy, k)),) = fake.calls
    assert made == [] and type(copy) is Unstaged and copy.host is a and k == 3


def test_a_read_only_host_array_written_through_tma_is_refused_before_staging(monkeypatch):
    """A host array the kernel writes must be writable (SP0719, the launcher's check): one read
    through TMA reaches the launcher as its device copy (or, for an empty grid, an ``Unstaged``
    stand-in), which is writable, so ``kernel[grid](...)`` checks the host array itself before
    staging it, empty grid or not. (It was copied, the kernel ran, and copying back into it failed:
    SP0720 for a dense one, numpy's ValueError for a strided one; an empty grid accepted it.)"""
    from types import SimpleNamespace

    from sparsile.driver import launch

    made = _count_staging(monkeypatch)

    spec = SimpleNamespace(params=[SimpleNamespace(kind="tensormap", name="a.tmap0")])
    writes_a = SimpleNamespace(spec=spec, written={"a"}, device=SimpleNamespace(ordinal=0))
    writes_c = SimpleNamespace(spec=spec, written={"c"}, device=SimpleNamespace(ordinal=0))
    frozen = np.zeros((128, 64), np.float16)
    frozen.flags.writeable = False
    shared = np.zeros((128, 64), np.float16)
    alias = shared.view()
    alias.flags.writeable = False
    for launcher, bound, name in ((writes_a, {"a": frozen, "k": 3}, "a"), (writes_a, {"a": frozen[:, ::2]}, "a"),
                                  (writes_c, {"a": shared, "c": alias}, "c")):
        for empty in (True, False):
            with pytest.raises(LaunchError) as exc:
                launch._stage_tma_host_arrays(launcher, dict(bound), empty=empty)
            assert exc.value.code == A.READ_ONLY and f"argument `{name}` is a read-only numpy array" in str(exc.value)
            assert exc.value.help == "pass a writable copy"
    assert made == []
    read_only_read = {"a": frozen, "c": np.zeros(4, np.float32)}  # read through TMA, not written: staged
    assert launch._stage_tma_host_arrays(writes_c, read_only_read) == [] and made == [0]
