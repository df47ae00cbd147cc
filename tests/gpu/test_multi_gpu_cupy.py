"""cupy arrays on cuda:1 while cupy's, sparsile's and torch's current device is cuda:0: the GPU
sparsity toolkit and sparse_matmul make everything for them on cuda:1 (stdlib/kernels/arrays.py
``cupy_device``), with K not a multiple of the chunk (a padded copy) and of the kernel's alignment.
The CPU tests of the same paths, against a strict cupy stand-in: tests/stdlib/test_cupy_devices.py.
Skipped with a reason where cupy sees fewer than two GPUs."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cupy.cuda.runtime.getDeviceCount() < 2,
                                                  reason="needs two CUDA devices (cupy sees fewer)")]


@pytest.mark.parametrize("n", [16, 700])  # the decode kernel, the tiled kernel
def test_cupy_operands_on_cuda1(n):
    from sparsile.backend import runtime
    from sparsile.stdlib.kernels import sparse_matmul
    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu, decompress_gpu
    from sparsile.stdlib.sparsity import prune

    runtime.use_device(0)
    m, k = 512, 1002  # K: neither a whole chunk nor 16-byte rows
    rng = np.random.default_rng(n)
    w, x = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((n, k)).astype(np.float16)
    with cupy.cuda.Device(1):
        w1, x1 = cupy.asarray(w), cupy.asarray(x)
    assert cupy.cuda.Device().id == 0
    values, meta = compress_gpu(w1, "f16", "sm90")
    assert values.device.id == 1 and meta.data.device.id == 1
    dense = decompress_gpu(values, meta)
    pruned = prune(w, "f16")
    assert dense.device.id == 1 and np.array_equal(dense.get(), pruned)
    ref = pruned.astype(np.float64) @ x.astype(np.float64).T
    for _ in range(2):
        c = sparse_matmul(values, meta.data, x1)
        assert c.device.id == 1 and cupy.cuda.Device().id == 0
        err = np.abs(c.get().astype(np.float64) - ref)
        assert (err <= 2.0 ** -10 * np.abs(ref) + 1e-3 * k ** 0.5).all(), f"max error {err.max()}"
