"""The kernel API's per-buffer caches on the GPU (stdlib/kernels/gemm_operands.py: validation and
the device copy of a tagged buffer's words): a buffer built over a CUDA tensor owns a copy of its
words, so an edit of the tensor after the first call reaches neither the device copy nor the
call cache's replay; a "tcgen05" buffer planned for Blackwell is still refused on sm_90a. Against
float64 references, outputs poisoned (the CPU halves: tests/stdlib/test_api_cache_reuse.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import plan_sparse_matmul, prune_and_compress, sparse_matmul
from sparsile.stdlib.sparsity import MetadataBuffer, SparsityError, decompress

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA device here")]


def _operands(m: int, n: int, k: int, seed: int, fmt: str = "sm90"):
    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), "f16", fmt=fmt)
    b = rng.standard_normal((n, k)).astype(np.float16)
    return weight, b


def _assert_close(c, values, meta, b) -> None:
    """f32 accumulation of f16 products, one rounding to f16."""
    ref = decompress(values, meta).astype(np.float64) @ b.astype(np.float64).T
    c64 = c.cpu().double().numpy()
    assert not np.isnan(c64).any(), "unwritten outputs"
    bound = b.shape[1] * 2.0 ** -22 * np.abs(ref).max() + 2.0 ** -10 * np.abs(ref) + 2.0 ** -24
    assert (np.abs(c64 - ref) <= bound).all(), f"max error {np.abs(c64 - ref).max()}"


@pytest.mark.parametrize("n", [80, 16])  # the tiled kernels; the decode kernel
def test_a_buffer_over_a_cuda_tensor_is_not_read_through_a_stale_device_copy(n: int) -> None:
    """The device copy of a buffer's words is made once: a buffer that kept the caller's CUDA tensor
    (edited after the first call) computed the second call with the old words and the new values."""
    m, k = 256, 256
    first, b = _operands(m, n, k, seed=n)
    second, _ = _operands(m, n, k, seed=n + 1)
    mine = torch.from_numpy(np.array(first.meta.data).view(np.int32)).cuda()
    meta = MetadataBuffer(mine, "sm90", "f16", m, k)
    bt = torch.from_numpy(b).cuda()
    for values in (first.values, second.values, second.values):  # planned, recorded, replayed
        if values is second.values:
            mine.copy_(torch.from_numpy(np.array(second.meta.data).view(np.int32)).cuda())
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        sparse_matmul(torch.from_numpy(values).cuda(), meta, bt, out=out)
        torch.cuda.synchronize()
        _assert_close(out, values, first.meta, b)  # the buffer's words, as they were built


def test_a_tcgen05_buffer_planned_for_blackwell_is_refused_on_sm90() -> None:
    """A Blackwell plan (made, not run, on a Hopper GPU) validates a "tcgen05" buffer; an sm_90a call
    then took its words as "sm90" ones (the validation was remembered without its format)."""
    m, n, k = 256, 80, 256
    weight, b = _operands(m, n, k, seed=3)
    tc = prune_and_compress(np.asarray(weight.dense(), np.float32), "f16", fmt="tcgen05").meta
    values, bt = torch.from_numpy(weight.values).cuda(), torch.from_numpy(b).cuda()
    plan_sparse_matmul(values, tc, bt, target="sm_100a")
    with pytest.raises(SparsityError) as info:
        sparse_matmul(values, tc, bt, target="sm_90a")
    assert (info.value.code, info.value.message) == (
        "SP0810", "metadata is in the 'tcgen05' format but 'sm90' is expected")
    out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    sparse_matmul(values, weight.meta, bt, target="sm_90a", out=out)
    _assert_close(out, weight.values, weight.meta, b)
