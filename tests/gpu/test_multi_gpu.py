"""Launches follow their arrays' device on a host of two GPUs (driver/array_devices.py; docs/language.md,
"Specialization and launching"; docs/torch.md, "Several GPUs"): a kernel[grid] launch, its prepared
launch and its fast path on cuda:1 while sparsile's and torch's current device is cuda:0; SparseLinear
layers on cuda:0 and cuda:1 in one model, eager (the launch record, the eager fast path, graph
replays) and captured in a CUDA graph on cuda:1, against float64; sparse_matmul on cuda:1. Outputs
are NaN-poisoned first, so an unwritten element fails. The one-GPU common path is checked too. Skipped
with a reason where torch sees fewer than two GPUs (the one-GPU test needs one). The CPU tests of the
same paths, on a faked two-GPU host: tests/backend/test_launch_devices.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs two CUDA devices (torch.cuda.device_count() < 2)")
one_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")

VECTOR_ADD = Path(__file__).resolve().parents[2] / "examples" / "vector_add.spk"


@pytest.fixture
def current_is_cuda0():
    """sparsile's current device and torch's are cuda:0 for the test."""
    from sparsile.backend import runtime

    runtime.use_device(0)
    with torch.cuda.device(0):
        yield


def _poisoned(shape, device, dtype=torch.float32):
    return torch.full(shape, float("nan"), device=device, dtype=dtype)


def _vector_add_on(device: str, n: int = 5000) -> None:
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    rng = np.random.default_rng(0)
    xh, yh = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = torch.from_numpy(xh).to(device), torch.from_numpy(yh).to(device)
    for _ in range(3):  # the full path, then the fast path
        out = _poisoned((n,), device)
        k[lambda meta: (-(-n // meta["BLOCK"]),)](x, y, out, n, BLOCK=256)
        np.testing.assert_array_equal(out.cpu().numpy(), xh + yh)
    prepared = k[(-(-n // 256),)].prepare(x, y, out, n, BLOCK=256)
    out = _poisoned((n,), device)
    prepared(x, y, out, n)
    np.testing.assert_array_equal(out.cpu().numpy(), xh + yh)


@one_gpu
def test_one_gpu_common_path(current_is_cuda0):
    """Arrays on cuda:0, the current device 0: the path every single-GPU program takes."""
    _vector_add_on("cuda:0")


@two_gpus
def test_a_kernel_runs_on_its_arrays_gpu(current_is_cuda0):
    """A kernel[grid] launch (full path, fast path, prepared) on cuda:1 while cuda:0 is current, then
    on cuda:0 again: each device's own launcher, each correct; arrays on both is SP0707."""
    from sparsile.frontend.diagnostics import LaunchError

    _vector_add_on("cuda:1")
    _vector_add_on("cuda:0")
    _vector_add_on("cuda:1")
    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    x = torch.ones(256, device="cuda:0")
    with pytest.raises(LaunchError) as exc:
        k[(1,)](x, torch.ones(256, device="cuda:1"), torch.empty(256, device="cuda:0"), 256, BLOCK=256)
    assert exc.value.code == "SP0707" and "cuda:0" in str(exc.value) and "cuda:1" in str(exc.value)


@two_gpus
def test_host_arrays_run_on_the_current_device(current_is_cuda0):
    from sparsile.backend import runtime

    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    x, y = np.arange(1000, dtype=np.float32), np.ones(1000, np.float32)
    out = np.full(1000, np.nan, np.float32)
    runtime.use_device(1)
    try:
        k[(4,)](x, y, out, 1000, BLOCK=256)
    finally:
        runtime.use_device(0)
    np.testing.assert_array_equal(out, x + y)


def _two_gpu_model(dtype="bf16", k=512):
    spt = pytest.importorskip("sparsile.torch")
    first = spt.SparseLinear.from_dense(linear(256, k, seed=1, device="cuda:0"), dtype, activation="silu")
    second = spt.SparseLinear.from_dense(linear(k, 256, seed=2, device="cuda:1"), dtype)
    return first, second


def _poisoned_call(layer, x):
    """layer(x) with a NaN block of y's size freed just before on x's device (torch's caching
    allocator hands it to y: an unwritten element stays NaN)."""
    torch.cuda.synchronize(x.device)
    poison = _poisoned((*x.shape[:-1], layer.out_features), x.device, layer.out_dtype or x.dtype)
    del poison
    y = layer(x)
    torch.cuda.synchronize(x.device)
    return y


@two_gpus
@pytest.mark.parametrize("dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("tokens", [1, 16, 300])
def test_sparse_layers_on_two_gpus_in_one_model(current_is_cuda0, dtype, tokens):
    """A model spread over two GPUs (as device_map="auto" does): layer 0 on cuda:0, layer 1 on cuda:1,
    eager calls repeated (the record, the eager fast path, then its graph replays) with torch's
    current device left at cuda:0, each against float64 from its own input."""
    first, second = _two_gpu_model(dtype)
    gen = torch.Generator("cuda:0").manual_seed(tokens)
    for _ in range(5):
        x = torch.randn(tokens, 512, device="cuda:0", generator=gen).to(torch.bfloat16)
        h = _poisoned_call(first, x)
        check_against_float64(first, x, h)
        h1 = h.to("cuda:1")
        y = _poisoned_call(second, h1)
        assert y.device == torch.device("cuda:1")
        check_against_float64(second, h1, y)


@two_gpus
def test_a_layer_on_cuda1_in_a_cuda_graph(current_is_cuda0):
    """A layer on cuda:1 captured in a CUDA graph on cuda:1 (torch's current device for the capture)
    while sparsile's current device is cuda:0: replays equal eager calls and float64."""
    _, layer = _two_gpu_model()
    static_x = torch.randn(16, 512, device="cuda:1").to(torch.bfloat16)
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(static_x)  # compiled and planned outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layer(static_x)
        for seed in range(3):
            new = torch.randn(16, 512, device="cuda:1", generator=torch.Generator("cuda:1").manual_seed(seed))
            static_x.copy_(new.to(torch.bfloat16))
            static_y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize(1)
            check_against_float64(layer, static_x, static_y)
            assert torch.equal(static_y, layer(static_x))


@two_gpus
@pytest.mark.parametrize("n", [16, 700])  # the decode kernel, the tiled kernel
def test_sparse_matmul_on_cuda1(current_is_cuda0, n):
    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    m, k = 1024, 2048
    g = torch.Generator(device="cuda:1").manual_seed(n)
    w = torch.randn(m, k, device="cuda:1", generator=g)
    groups = w.view(m, k // 4, 4)
    keep = groups.abs().topk(2, dim=-1).indices
    w = (groups * torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)).view(m, k).to(torch.bfloat16)
    x = torch.randn(n, k, device="cuda:1", generator=g).to(torch.bfloat16)
    values, meta = prune_and_compress(w, "bf16")
    ref = w.double() @ x.double().T
    for _ in range(3):  # planned, then replayed from the call cache
        out = _poisoned((m, n), "cuda:1", torch.float16)
        c = sparse_matmul(values, meta, x, out=out)
        assert c is out and c.device == torch.device("cuda:1") and not c.isnan().any()
        err = (c.double() - ref).abs()
        assert (err <= 2.0 ** -10 * ref.abs() + 1e-3 * k ** 0.5).all(), f"max error {err.max().item()}"


def _on_cuda0_after(launch) -> None:
    """``launch()`` (work on cuda:1) leaves torch's current device at cuda:0, as a torch op would:
    torch.cuda.current_device(), device="cuda" and the current stream still mean cuda:0, and
    torch.cuda.synchronize() waits for cuda:0's work (about a second of it, queued just before)."""
    torch.cuda.synchronize(0)
    torch.cuda._sleep(2_000_000_000)  # ~1 s of cuda:0 cycles on its current stream
    done = torch.cuda.Event()
    done.record()
    launch()
    assert torch.cuda.current_device() == 0
    assert torch.empty(1, device="cuda").device == torch.device("cuda:0")
    assert torch.cuda.current_stream().device == torch.device("cuda:0")
    torch.cuda.synchronize()  # cuda:0's: the sleep is over after it
    assert done.query(), "torch.cuda.synchronize() did not wait for cuda:0 after a launch on cuda:1"
    torch.cuda.synchronize(1)


@two_gpus
def test_a_launch_on_cuda1_leaves_torchs_current_device_alone(current_is_cuda0):
    """A kernel[grid] launch (full path, fast path, prepared), SparseLinear calls (the record, the
    eager fast path, graph replays) and sparse_matmul calls (planned, replayed) on cuda:1, with
    cuda:0 torch's current device: cuda:0 stays current after each (backend/runtime/devices.py
    restores the thread's context, as a torch op's device guard does)."""
    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    k = sp.load(VECTOR_ADD).kernels["vector_add"]
    n = 4096
    x1, y1, out1 = (torch.ones(n, device="cuda:1") for _ in range(3))
    prepared = k[(n // 256,)].prepare(x1, y1, out1, n, BLOCK=256)
    for _ in range(2):  # the full path, then the fast path
        _on_cuda0_after(lambda: k[(n // 256,)](x1, y1, out1, n, BLOCK=256))
    _on_cuda0_after(lambda: prepared(x1, y1, out1, n))
    assert torch.equal(out1, torch.full((n,), 2.0, device="cuda:1"))
    _, layer = _two_gpu_model()
    x = torch.randn(16, 512, device="cuda:1").to(torch.bfloat16)
    for _ in range(5):
        _on_cuda0_after(lambda: layer(x))
    w = torch.randn(256, 512, device="cuda:1")
    groups = w.view(256, 128, 4)
    keep = groups.abs().topk(2, dim=-1).indices
    w = (groups * torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)).view(256, 512)
    values, meta = prune_and_compress(w.to(torch.bfloat16), "bf16")
    b = torch.randn(16, 512, device="cuda:1").to(torch.bfloat16)
    for _ in range(3):
        _on_cuda0_after(lambda: sparse_matmul(values, meta, b))


@two_gpus
def test_tuning_works_on_one_device(current_is_cuda0):
    """``sparsile tune`` on cuda:1 (stdlib/kernels/tune_device.py): after ``use_device(1)`` with torch's
    current device left at 0, and with ``device=1`` while both are 0: the table is cuda:1's, and
    torch's current device is 0 again after the run."""
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels.tuning import tune_sparse_matmul

    name = runtime.current_device(1).name
    table = tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), warmup=1, rep=2, device=1)
    assert table["gpu"] == name and set(table["entries"]) == {"bf16 256x128x256"}
    assert torch.cuda.current_device() == 0
    runtime.use_device(1)
    try:
        table = tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), warmup=1, rep=2)
    finally:
        runtime.use_device(0)
    assert table["gpu"] == name and table["entries"]["bf16 256x128x256"]["us"] > 0
    assert torch.cuda.current_device() == 0


@two_gpus
def test_a_custom_benchmarker_times_the_tuned_device(current_is_cuda0):
    """A ``benchmarker=`` given with ``device=1`` while sparsile's and torch's current device is 0
    runs with cuda:1 current for both (stdlib/kernels/tune_device.py ``timer``): ``do_bench``
    without ``device=`` then records its events on cuda:1, where the configs launch; both are 0
    again after."""
    from sparsile.backend import runtime
    from sparsile.backend.runtime.bench import do_bench
    from sparsile.stdlib.kernels.tuning import tune_sparse_matmul

    seen: list[tuple[int, int]] = []

    def bench(fn, *, warmup, rep, stream):
        seen.append((runtime.devices.default_ordinal, torch.cuda.current_device()))
        return do_bench(fn, warmup=warmup, rep=rep, stream=stream)

    table = tune_sparse_matmul(["256x128x256"], dtypes=("bf16",), warmup=1, rep=2, device=1, benchmarker=bench)
    assert seen and set(seen) == {(1, 1)} and table["entries"]["bf16 256x128x256"]["us"] > 0
    assert (runtime.devices.default_ordinal, torch.cuda.current_device()) == (0, 0)
