"""What the kernel API caches across calls (stdlib/kernels/gemm_operands.py: a tagged buffer's
validation and device copy; gemm_sm100.py: its "tcgen05" re-encoding) is never reused where it
does not apply: a buffer checked as "tcgen05" words on a Blackwell target is not taken as "sm90"
words on sm_90a, and a buffer built over a torch tensor owns its words, so an edit of the tensor
after the first call reaches no cached copy. Interpreter runs against float64 references, outputs
poisoned."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul
from sparsile.stdlib.sparsity import MetadataBuffer, SparsityError, decompress


def _operands(m: int, n: int, k: int, seed: int, fmt: str = "sm90"):
    rng = np.random.default_rng(seed)
    weight = prune_and_compress(rng.standard_normal((m, k)).astype(np.float32), "f16", fmt=fmt)
    b = rng.standard_normal((n, k)).astype(np.float16)
    return weight, b


def _reference(values, meta, b) -> np.ndarray:
    return decompress(values, meta).astype(np.float64) @ b.astype(np.float64).T


def _assert_close(c: np.ndarray, ref: np.ndarray, k: int) -> None:
    """f32 accumulation of f16 products, one rounding to f16."""
    c64 = c.astype(np.float64)
    assert not np.isnan(c64).any(), "unwritten outputs"
    bound = k * 2.0 ** -22 * np.abs(ref).max() + 2.0 ** -10 * np.abs(ref) + 2.0 ** -24
    assert (np.abs(c64 - ref) <= bound).all(), f"max error {np.abs(c64 - ref).max()}"


def _poisoned(m: int, n: int) -> np.ndarray:
    return np.full((m, n), np.nan, np.float16)


@pytest.mark.parametrize("n", [80, 16])  # the tiled kernels; the decode kernel (N <= 64)
def test_a_tcgen05_buffer_checked_on_blackwell_is_still_refused_on_sm90(n: int) -> None:
    """The validation of a tagged buffer is remembered per format too: a "tcgen05" buffer validated by
    a Blackwell call was then taken as "sm90" words by an sm_90a call (the tiled kernels computed a
    wrong C, errors of 70 on this problem; the decode route reported a shape mismatch, SP0805)."""
    m, k = 128, 256
    weight, b = _operands(m, n, k, seed=n)
    ref = _reference(weight.values, weight.meta, b)
    tc = prune_and_compress(np.asarray(weight.dense(), np.float32), "f16", fmt="tcgen05").meta
    out = _poisoned(m, n)
    sparse_matmul(weight.values, tc, b, interpret=True, target="sm_100a", out=out)
    _assert_close(out, ref, k)
    with pytest.raises(SparsityError) as info:
        sparse_matmul(weight.values, tc, b, interpret=True, target="sm_90a", out=_poisoned(m, n))
    assert info.value.code == "SP0810"
    assert info.value.message == "metadata is in the 'tcgen05' format but 'sm90' is expected"
    # and the "sm90" buffer of the same weight, used on Blackwell first, still runs on sm_90a
    sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_100a", out=_poisoned(m, n))
    out = _poisoned(m, n)
    sparse_matmul(weight.values, weight.meta, b, interpret=True, target="sm_90a", out=out)
    _assert_close(out, ref, k)


@pytest.mark.parametrize("target", ["sm_100a", "sm_90a"])
def test_a_buffer_over_a_torch_tensor_owns_its_words(target: str) -> None:
    """MetadataBuffer(tensor, ...) copies the words as it does a numpy array's: it used to keep the
    caller's tensor, so an edit of it after a Blackwell call left that call's "tcgen05" re-encoding
    (cached per buffer) stale: the next call computed with the old words and the new values."""
    torch = pytest.importorskip("torch")
    m, n, k = 128, 80, 128
    first, b = _operands(m, n, k, seed=1)
    second, _ = _operands(m, n, k, seed=2)
    mine = torch.from_numpy(np.array(first.meta.data))
    meta = MetadataBuffer(mine, "sm90", "f16", m, k)
    assert isinstance(meta.data, np.ndarray) and not meta.data.flags.writeable
    assert not np.shares_memory(meta.data, mine.numpy())
    out = _poisoned(m, n)
    sparse_matmul(first.values, meta, b, interpret=True, target=target, out=out)
    _assert_close(out, _reference(first.values, first.meta, b), k)
    mine.copy_(torch.from_numpy(np.array(second.meta.data)))  # the caller's tensor: another weight's words
    assert np.array_equal(meta.data, first.meta.data)
    out = _poisoned(m, n)
    sparse_matmul(second.values, meta, b, interpret=True, target=target, out=out)
    _assert_close(out, _reference(second.values, first.meta, b), k)  # the buffer's words, as they were
