"""The autotuner's ``reset_to_zero`` on a non-blocking stream (docs/autotune.md, "Streams"): an
accumulating kernel (``out += x``) tuned with ``stream=`` a non-blocking torch stream, its timed
launches queued back to back. Each zeroing must run on that stream after the previous repetition's
kernel and before the next: after a burst of launches, ``out`` holds one launch's worth (``x``),
checked against float64; after tuning, the caller's ``out`` (random, not zeros) plus ``x``. Before,
the zeroing ran on the legacy default stream (a DeviceBuffer: a synchronous memset there; torch:
``zero_`` on torch's current stream), unordered with a non-blocking stream's kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sparsile as sp

pytestmark = pytest.mark.gpu

N = 1 << 24
REP = 20


def _accumulate() -> Any:
    @sp.jit
    def accumulate(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        mask = offs < n
        sp.store(out + offs, sp.load(out + offs, mask=mask) + sp.load(x + offs, mask=mask), mask=mask)
    return accumulate


@pytest.mark.parametrize("kind", ["torch", "DeviceBuffer"])
def test_reset_to_zero_is_ordered_on_a_non_blocking_launch_stream(tmp_path, monkeypatch, kind: str) -> None:
    torch = pytest.importorskip("torch")
    from sparsile.backend import runtime

    monkeypatch.setenv("SPARSILE_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(11)
    x_host = rng.standard_normal(N).astype(np.float32) + 2
    out_host = rng.standard_normal(N).astype(np.float32) + 2
    if kind == "torch":
        x, out = torch.from_numpy(x_host).cuda(), torch.from_numpy(out_host).cuda()
        torch.cuda.synchronize()

        def read() -> np.ndarray:
            return out.cpu().numpy()
    else:
        x, out = runtime.DeviceBuffer.from_numpy(x_host), runtime.DeviceBuffer.from_numpy(out_host)

        def read() -> np.ndarray:
            return out.copy_to_host()
    side = torch.cuda.Stream()  # non-blocking: not ordered with the legacy default stream
    bursts: list[np.ndarray] = []

    def burst(fn: Any, *, warmup: int, rep: int, stream: Any) -> float:
        """Launches back to back on the stream, then one look at `out`: one launch's worth."""
        for _ in range(rep):
            fn()
        side.synchronize()
        bursts.append(read())
        return float(fn.config.kwargs["BLOCK"])

    tuned = sp.autotune([{"BLOCK": 256}, {"BLOCK": 1024}], key=["n"], rep=REP, benchmarker=burst,
                        reset_to_zero=["out"])(_accumulate())
    tuned[lambda meta: (-(-N // meta["BLOCK"]),)](x, out, N, stream=side)
    side.synchronize()
    assert len(bursts) == 2
    for seen in bursts:  # 0 + x: exact in f32
        np.testing.assert_array_equal(seen, x_host.astype(np.float64).astype(np.float32))
    expected = out_host.astype(np.float64) + x_host.astype(np.float64)
    np.testing.assert_allclose(read(), expected, rtol=1e-6, atol=0)  # restored, then one launch
