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


def test_launcher_empty_grid_leaves_host_outputs_alone_and_frees_the_copies(monkeypatch):
    gpu = EmulatedGpu(monkeypatch)
    gpu.kernel = vadd_kernel(gpu)
    launcher = make_launcher(gpu, VADD, [8, 8, 8, 4])
    x, y = np.ones(64, np.float32), np.full(64, 2, np.float32)
    out = np.full(64, np.nan, np.float32)
    launcher((0,), (x, y, out, 64))
    assert gpu.launches == [] and np.isnan(out).all()
    assert len(gpu.freed) == 3 and gpu.syncs == 1  # staged, never copied back, freed
    launcher((1,), (x, y, out, 64))
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize(("args", "kwargs", "code"), [
    ((FakeDLPack(0x1000, (64,), "f16"), 0x20, 0x30, 0), {}, A.ARG_DTYPE),
    ((0x10, 0x20, 0x30, 2**31), {}, A.ARG_RANGE),
    ((0x10, 0x20, 0x30, 1.5), {}, A.ARG_KIND),
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
