"""Another thread's sparsile eager calls leave a user's global-mode CUDA graph capture intact
(backend/runtime/capture_mode.py): thread A begins a ``torch.cuda.graph`` capture (global capture
mode, torch's default) and holds it open; meanwhile thread B drains a pending free (a dropped
DeviceBuffer, collected), allocates a DeviceBuffer (cuMemAlloc) and launches a kernel into it, then
calls a SparseLinear repeatedly at the same addresses (its graph replay captures privately). Before
the fix each of B's frees and allocations invalidated A's capture. A then ends its capture, replays
and checks its numbers; B's are checked against float64. CPU side: tests/backend/test_capture_mode.py,
tests/integrations/test_torch_graph_launch.py."""

from __future__ import annotations

import gc
import threading

import pytest

from sparsile.tests.integrations.torch_helpers import check_against_float64, linear

torch = pytest.importorskip("torch")
spt = pytest.importorskip("sparsile.torch")

import sparsile as sp  # noqa: E402
from sparsile.backend.runtime import DeviceBuffer, release  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]

ADD = '''
@kernel
def add(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    store(out + offs, load(x + offs, mask=mask) + load(y + offs, mask=mask), mask=mask)
'''
N = 100_003
BLOCK = 1024
WAIT = 60  # seconds any thread waits for the other before the test fails


def _user_capture(xa: torch.Tensor, wa: torch.Tensor, began: threading.Event, b_done: threading.Event,
                  result: dict) -> None:
    """Thread A: capture ``tanh(xa) * wa + xa`` (elementwise, float32) in global mode, held open
    until B is done; then replay."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # (capture_error_mode="global")
            ya = torch.tanh(xa) * wa + xa
            began.set()
            assert b_done.wait(WAIT), "thread B did not finish"
        ya.fill_(float("nan"))  # poisoned: the replay must write it
        graph.replay()
        torch.cuda.synchronize()
        result["ya"] = ya.clone()
    except BaseException as exc:  # (reported by the main thread)
        result["error"] = exc
        began.set()


def test_eager_frees_allocations_and_replay_captures_on_another_thread_leave_a_global_capture_valid():
    gen = torch.Generator("cuda").manual_seed(51)
    xa = torch.randn(64, 128, device="cuda", generator=gen)
    wa = torch.randn(64, 128, device="cuda", generator=gen)
    x = torch.randn(N, device="cuda", generator=gen)
    y = torch.randn(N, device="cuda", generator=gen) * 3
    mod = sp.loads(ADD, "capture_modes_gpu.spk")
    kernel = mod.add[((N + BLOCK - 1) // BLOCK,)]
    layer = spt.SparseLinear.from_dense(linear(256, 512, seed=5, device="cuda"), "bf16")
    xl = torch.randn(8, 512, device="cuda", generator=gen).to(torch.bfloat16)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # warm: compiled, module loaded, the layer's record planned
        kernel(x, y, torch.empty_like(x), N, BLOCK=BLOCK)
        kernel(x, y, DeviceBuffer.empty((N,), "f32"), N, BLOCK=BLOCK)  # (the argument kinds of B's call)
        torch.tanh(xa) * wa + xa
        layer(xl)
    torch.cuda.synchronize()

    began, b_done, result = threading.Event(), threading.Event(), {}
    user = threading.Thread(target=_user_capture, args=(xa, wa, began, b_done, result))
    user.start()
    try:
        assert began.wait(WAIT) and "error" not in result, result.get("error")
        dropped = DeviceBuffer(1 << 20)  # a free pending: collected, deferred to the next drain
        del dropped
        gc.collect()
        assert release.pending() >= 1
        with torch.cuda.stream(side):
            out = DeviceBuffer.empty((N,), "f32")  # drains (cuMemFree), then cuMemAlloc: during A's capture
            assert release.pending() == 0
            out_t = torch.as_tensor(out, device="cuda")
            out_t.fill_(float("nan"))
            kernel(x, y, out, N, BLOCK=BLOCK)
            ys = []
            for _ in range(4):  # the same x and y addresses: the replay captures on this thread
                yl = layer(xl)
                ys.append(yl.clone())
                del yl
    finally:
        b_done.set()
        user.join(WAIT)
    assert "error" not in result, f"thread A's capture failed: {result.get('error')!r}"
    side.synchronize()

    expected_a = torch.tanh(xa.double()) * wa.double() + xa.double()
    # float32: tanh within a few ulp, then a product and a sum each rounded once
    torch.testing.assert_close(result["ya"].double(), expected_a, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out_t.double(), x.double() + y.double(), rtol=2.0 ** -23, atol=0.0)
    for yl in ys:
        check_against_float64(layer, xl, yl)
