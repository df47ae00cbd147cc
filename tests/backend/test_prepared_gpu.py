"""GPU tests of the fast launch paths (marked gpu; skipped without a GPU): a prepared launch gives
the same result as ``kernel[grid](...)`` for vector add (torch, CuPy, DeviceBuffer) and for the
sparse GEMM, on a side stream and under torch CUDA-graph capture. Inputs are random and non-zero,
outputs poisoned with NaN, results compared with a float64 reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend import runtime
from sparsile.frontend.diagnostics import LaunchError

pytestmark = pytest.mark.gpu

VECTOR_ADD = Path(__file__).resolve().parents[2] / "examples" / "vector_add.spk"
N = 5000
BLOCK = 256
GRID = (-(-N // BLOCK),)


def vadd():
    return sp.load(VECTOR_ADD).kernels["vector_add"]


def torch_inputs(torch, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(N, generator=g) + 0.5).cuda()
    y = (torch.rand(N, generator=g) - 1.5).cuda()
    return x, y, torch.full((N,), float("nan"), device="cuda")


def check_sum(torch, x, y, out):
    ref = x.cpu().double() + y.cpu().double()
    assert not torch.isnan(out).any()
    assert torch.equal(out.cpu().double(), ref.float().double())  # one f32 rounding, as the reference's


def test_prepared_vector_add_matches_kernel_grid():
    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 1)
    k[GRID](x, y, out, N, BLOCK=BLOCK)
    torch.cuda.synchronize()
    check_sum(torch, x, y, out)
    launch = k[GRID].prepare(x, y, out, N, BLOCK=BLOCK, vary=("n",))
    for seed in (2, 3):
        x2, y2, out2 = torch_inputs(torch, seed)
        launch(x2, y2, out2, N)
        torch.cuda.synchronize()
        check_sum(torch, x2, y2, out2)
    x3, y3, out3 = torch_inputs(torch, 4)
    launch(x3, y3, out3, N - 7)  # n may change (vary=("n",))
    torch.cuda.synchronize()
    assert torch.isnan(out3[N - 7:]).all()
    check_sum(torch, x3[:N - 7], y3[:N - 7], out3[:N - 7])


def test_prepared_vector_add_on_a_side_stream():
    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 5)
    launch = k[GRID].prepare(x, y, out, N, BLOCK=BLOCK)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch's current stream is followed
        launch(x, y, out, N)
        result = out.clone()
    side.synchronize()
    check_sum(torch, x, y, result)
    x2, y2, out2 = torch_inputs(torch, 6)
    side.wait_stream(torch.cuda.current_stream())
    launch(x2, y2, out2, N, stream=side)  # an explicit stream
    side.synchronize()
    check_sum(torch, x2, y2, out2)
    x3, y3, out3 = torch_inputs(torch, 7)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        k[GRID](x3, y3, out3, N, BLOCK=BLOCK)  # kernel[grid] follows it too
    side.synchronize()
    check_sum(torch, x3, y3, out3)


def test_prepared_vector_add_under_cuda_graph_capture():
    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 8)
    launch = k[GRID].prepare(x, y, out, N, BLOCK=BLOCK)
    launch(x, y, out, N)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(x, y, out, N)
    out2 = torch.full((N,), float("nan"), device="cuda")
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        k[GRID](x, y, out2, N, BLOCK=BLOCK)
    for seed in (9, 10):
        x1, y1, _ = torch_inputs(torch, seed)
        x.copy_(x1)
        y.copy_(y1)
        out.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        graph2.replay()
        torch.cuda.synchronize()
        check_sum(torch, x1, y1, out)
        check_sum(torch, x1, y1, out2)


def test_buffer_collected_during_graph_capture_is_freed_after_it():
    """Garbage collection inside a capture (torch no longer collects before capturing) must not
    call cuMemFree there: that invalidates the user's capture (backend/runtime/release.py)."""
    import gc

    from sparsile.backend.runtime import release

    torch = pytest.importorskip("torch")
    k = vadd()
    x, y, out = torch_inputs(torch, 12)
    k[GRID](x, y, out, N, BLOCK=BLOCK)
    torch.cuda.synchronize()

    class Cycle:
        pass

    cycle = Cycle()
    cycle.self, cycle.buf = cycle, runtime.DeviceBuffer(1 << 20)
    del cycle
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gc.collect()  # finds the cycle and its buffer while the stream captures
        k[GRID](x, y, out, N, BLOCK=BLOCK)
    assert release.pending() >= 1
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check_sum(torch, x, y, out)
    runtime.synchronize()  # a safe point: the buffer's memory is freed now
    assert release.pending() == 0


def test_prepared_vector_add_with_cupy_and_device_buffers():
    rng = np.random.default_rng(11)
    hx = (rng.random(N) + 0.5).astype(np.float32)
    hy = (rng.random(N) - 1.5).astype(np.float32)
    k = vadd()
    dx, dy = runtime.DeviceBuffer.from_numpy(hx), runtime.DeviceBuffer.from_numpy(hy)
    dout = runtime.DeviceBuffer.empty((N,), "f32")
    dout.fill_byte(0xFF)
    launch = k[GRID].prepare(dx, dy, dout, N, BLOCK=BLOCK)
    launch(dx, dy, dout, N)
    runtime.synchronize()
    np.testing.assert_array_equal(dout.copy_to_host(), (hx.astype(np.float64) + hy).astype(np.float32))
    with pytest.raises(LaunchError) as exc:
        launch(hx, dy, dout, N)
    assert exc.value.code == "SP0733"
    cupy = pytest.importorskip("cupy")
    cx, cy = cupy.asarray(hx), cupy.asarray(hy)
    cout = cupy.full(N, cupy.nan, dtype=cupy.float32)
    launch_c = k[GRID].prepare(cx, cy, cout, N, BLOCK=BLOCK)
    launch_c(cx, cy, cout, N)
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(cout), (hx.astype(np.float64) + hy).astype(np.float32))


def gemm_problem(torch, m, n, k, seed):
    from sparsile.stdlib.kernels import CompressedWeight, prune_and_compress

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(m, k, generator=g).cuda()
    x = torch.randn(n, k, generator=g).cuda().to(torch.bfloat16)
    values, meta = prune_and_compress(w, "bf16")
    dense = torch.from_numpy(CompressedWeight(values, meta).dense().astype(np.float64))
    return values, meta, x, dense


def test_prepared_sparse_gemm_matches_plan_run():
    torch = pytest.importorskip("torch")
    from sparsile.stdlib.kernels import plan_sparse_matmul

    m, n, k = 512, 16, 1024
    values, meta, x, dense = gemm_problem(torch, m, n, k, 12)
    # the tiled kernel (N <= 64 would run the decode kernel, whose plan has another interface)
    plan = plan_sparse_matmul(values, meta, x, split_k=1, kernel="gemm")
    y_plan = plan.run().clone()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    args = list(plan.arguments())
    args[3] = out
    launch = plan.kernel[plan.grid].prepare(*args, **plan._constexprs())
    x2 = torch.randn(n, k, generator=torch.Generator().manual_seed(13)).cuda().to(torch.bfloat16)
    args[2] = x2  # a new activation: only its tensor map is encoded
    launch(*args)
    torch.cuda.synchronize()
    ref2 = dense @ x2.cpu().double().T
    tol = 2.0 ** -10 * ref2.abs() + 0.02
    assert not torch.isnan(out).any() and ((out.cpu().double() - ref2).abs() <= tol).all()
    args[2] = x
    launch(*args)
    torch.cuda.synchronize()
    assert torch.equal(out, y_plan)
    # captured in a CUDA graph on torch's capture stream, replayed with new activations
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(*args)
    x.copy_(x2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert ((out.cpu().double() - ref2).abs() <= tol).all()
    # and on a side stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out.fill_(float("nan"))
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(*args)
    side.synchronize()
    assert ((out.cpu().double() - ref2).abs() <= tol).all()
    with pytest.raises(LaunchError) as exc:  # the weight's dtype is part of the specialization
        bad = list(args)
        bad[0] = values.to(torch.float16)
        launch(*bad)
    assert exc.value.code == "SP0703"


@pytest.mark.parametrize("kernel,split,reduce,launches", [("gemm", 1, None, 1), ("gemm", 4, None, 2),
                                                          ("decode", 1, None, 1), ("decode", 4, "launch", 2),
                                                          ("decode", 4, "kernel", 1)])
def test_prepared_sparse_linear_steps_match_plan_run(kernel, split, reduce, launches):
    """The contract a torch layer codes against: every launch of a SparseLinearPlan prepared once
    (``kernel[grid].prepare(*args, **constexprs)``), then called with the same arguments, gives
    plan.run()'s output bit for bit, also replayed from a CUDA graph."""
    torch = pytest.importorskip("torch")
    from sparsile.stdlib.kernels import plan_sparse_linear, prune_and_compress

    g = torch.Generator().manual_seed(20)
    w = torch.randn(1024, 2048, generator=g) / 64
    values, meta = prune_and_compress(w.cuda(), "bf16")
    x = torch.randn(16, 2048, generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(1024, generator=g).cuda()
    plan = plan_sparse_linear(values, meta, x, bias=bias, activation="silu", split_k=split, kernel=kernel,
                              reduce=reduce)
    expected = plan.run().clone()
    assert not torch.isnan(expected.float()).any()
    steps = [(kernel[grid].prepare(*args, **cx), args) for kernel, grid, args, cx in plan.launches()]
    assert len(steps) == launches
    plan.out.fill_(float("nan"))
    for launch, args in steps:
        launch(*args)
    torch.cuda.synchronize()
    assert torch.equal(plan.out, expected)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch, args in steps:
            launch(*args)
    plan.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(plan.out, expected)
