"""A grid with a 0 dimension (an empty batch) on the GPU: ``kernel[grid](...)`` (full and fast
path, device and host arrays, a ``pdl=True`` launch through cuLaunchKernelEx), a prepared launch
(eager and under CUDA-graph capture), a native launch record and ``sparsile.jax.call``. Each
launches nothing (the poisoned output stays NaN after a synchronize; a CUDA error would raise
SP0715), and the next non-empty launch is correct. The CPU versions: tests/backend/
test_empty_grid_launch.py, tests/frontend/test_empty_grid.py, tests/integrations/test_jax_native.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend import runtime
from sparsile.frontend.diagnostics import LaunchError
from sparsile.tests.backend.test_prepared_gpu import N, torch_inputs, vadd

pytestmark = pytest.mark.gpu

BLOCK = 256
GRID = (sp.cdiv(N, BLOCK),)
EMPTY = [(0,), (0, 1), (4, 0), (1, 1, 0), lambda meta: (sp.cdiv(0, meta["BLOCK"]),)]


def check_sum(torch, x, y, out):
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert torch.equal(out.cpu().double(), (x.cpu().double() + y.cpu().double()).float().double())


def still_poisoned(torch, out):
    torch.cuda.synchronize()  # a failed launch would surface here at the latest
    return bool(torch.isnan(out).all())


@pytest.mark.parametrize("grid", EMPTY)
def test_kernel_launch_of_an_empty_grid_launches_nothing(grid):
    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 1)
    k[grid](x, y, out, N, BLOCK=BLOCK)  # the full path: compiles, caches the launcher
    assert len(k._launchers) == 1 and still_poisoned(torch, out)
    k[grid](x, y, out, N, BLOCK=BLOCK)  # the fast path
    assert still_poisoned(torch, out)
    with pytest.raises(LaunchError) as exc:  # arguments still checked
        k[grid](x.half(), y, out, N, BLOCK=BLOCK)
    assert exc.value.code == "SP0703"
    k[GRID](x, y, out, N, BLOCK=BLOCK)
    check_sum(torch, x, y, out)
    assert len(k._launchers) == 1  # the empty launch's compile served the real one


def test_host_arrays_of_an_empty_grid_are_left_alone(monkeypatch):
    from sparsile.backend.runtime import staging

    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    out = np.full(N, np.nan, np.float32)
    k = vadd()
    staged = []
    real_stage = staging.DeviceBuffer  # what stage_host_array allocates: nothing for an empty grid
    monkeypatch.setattr(staging, "DeviceBuffer", lambda *a, **kw: staged.append(a) or real_stage(*a, **kw))
    k[(0,)](x, y, out, N, BLOCK=BLOCK)  # the full path
    k[(0,)](x, y, out, N, BLOCK=BLOCK)  # the fast path
    assert np.isnan(out).all() and staged == []
    k[GRID](x, y, out, N, BLOCK=BLOCK)
    assert len(staged) == 3
    np.testing.assert_array_equal(out, x + y)


PDL_VADD = """
@kernel(pdl=True)
def vector_add_pdl(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 1024):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    pdl.wait()  # x and y may be an earlier kernel's output (SP0590 without it)
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
"""


def test_pdl_launch_of_an_empty_grid_makes_no_launch_ex_call():
    torch = pytest.importorskip("torch")
    if runtime.current_device().compute_capability < (9, 0):
        pytest.skip("pdl=True needs compute capability 9.0")
    k = sp.loads(PDL_VADD, "pdl_vadd.spk").kernels["vector_add_pdl"]
    x, y, out = torch_inputs(torch, 3)
    k[(0,)](x, y, out, N, BLOCK=BLOCK)
    assert still_poisoned(torch, out)
    k[GRID](x, y, out, N, BLOCK=BLOCK)
    check_sum(torch, x, y, out)


def test_prepared_launch_of_an_empty_grid_and_its_native_record():
    torch = pytest.importorskip("torch")
    from sparsile.backend.runtime import native_launch as nl

    k = vadd()
    x, y, out = torch_inputs(torch, 4)
    empty = k[(0,)].prepare(x, y, out, N, BLOCK=BLOCK, per_call=("x", "y", "out"))
    empty(x, y, out)
    assert still_poisoned(torch, out)
    assert empty.native_record((x, y, out), (0, 1, 2), (True, True, True)) is None
    full = k[GRID].prepare(x, y, out, N, BLOCK=BLOCK, per_call=("x", "y", "out"))
    full(x, y, out, grid=(0,))
    assert still_poisoned(torch, out)
    record = full.native_record((x, y, out), (0, 1, 2), (True, True, True))
    launcher = nl.RecordLauncher()
    words = list(record.words)
    words[nl.R_GX] = 0  # the launch core's backstop: declined, not launched
    stream = torch.cuda.current_stream().cuda_stream
    record.context_current()
    empty_words = launcher.record(words)
    assert launcher.launch(ctypes.addressof(empty_words), x.data_ptr(), y.data_ptr(), out.data_ptr(), stream) == -1
    assert still_poisoned(torch, out)
    real = launcher.record(record.words)
    assert launcher.launch(ctypes.addressof(real), x.data_ptr(), y.data_ptr(), out.data_ptr(), stream) == 0
    check_sum(torch, x, y, out)
    assert launcher.counts() == {"launched": 1, "declined": 1, "launch_failures": 0}


def test_empty_launches_under_cuda_graph_capture():
    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 5)
    empty = k[(0,)].prepare(x, y, out, N, BLOCK=BLOCK, per_call=("x", "y", "out"))
    full = k[GRID].prepare(x, y, out, N, BLOCK=BLOCK, per_call=("x", "y", "out"))
    empty(x, y, out)
    full(x, y, out)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        empty(x, y, out)
        k[(0,)](x, y, out, N, BLOCK=BLOCK)
        full(x, y, out, grid=(0, 2))
    out.fill_(float("nan"))
    graph.replay()
    assert still_poisoned(torch, out)
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        empty(x, y, out)
        full(x, y, out)
    graph2.replay()
    check_sum(torch, x, y, out)


def test_jax_call_of_an_empty_grid():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if jax.default_backend() != "gpu":
        pytest.skip(f"jax has no CUDA backend here (default backend: {jax.default_backend()})")
    from sparsile.integrations.jax import call, native
    from sparsile.tests.integrations.test_jax_call import scale_add

    rng = np.random.default_rng(6)
    x, y = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    out = jax.ShapeDtypeStruct((N,), jnp.float32)
    empty = jax.jit(lambda a, b: call(scale_add, (0,), a, b, out_shapes=out, n=N, alpha=1.5, BLOCK=1024))
    for _ in range(3):  # the Python handler each time (no record is armed for an empty grid)
        empty(jnp.asarray(x), jnp.asarray(y)).block_until_ready()
    if native.handler() is not None:
        assert "the grid is empty (a 0 dimension): nothing to launch" in native.DISABLED.values()
    f = jax.jit(lambda a, b: call(scale_add, (sp.cdiv(N, 1024),), a, b, out_shapes=out, n=N, alpha=1.5,
                                  BLOCK=1024))
    got = np.asarray(f(jnp.asarray(x), jnp.asarray(y)), np.float64)
    ref = 1.5 * x.astype(np.float64) + y
    assert (np.abs(got - ref) <= 2 * np.finfo(np.float32).eps * (1.5 * np.abs(x) + np.abs(y))).all()
