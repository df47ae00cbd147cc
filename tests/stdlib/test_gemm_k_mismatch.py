"""Issue 15 item 2: ``sparse_matmul`` refuses a b whose K differs from the weight's K.

A b narrower than the weight used to be accepted within the TMA padding (K = 64: widths 49..63;
e4m3/s8 with K = 128: widths 97..127), and the last weight columns were silently dropped. Plans
only: nothing is launched.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.stdlib.kernels import plan_sparse_matmul, prune_and_compress
from sparsile.stdlib.kernels.gemm_sm100 import tcgen05_metadata
from sparsile.stdlib.sparsity import SparsityError

CASES = [("f16", 64, range(49, 64)), ("bf16", 64, range(49, 64)), ("tf32", 64, range(57, 64)),
         ("e4m3", 128, range(97, 128)), ("s8", 128, range(97, 128))]
TARGETS = ("sm_90a", "sm_100a")


def _weight(dtype: str, k: int) -> object:
    rng = np.random.default_rng(k)
    w = rng.standard_normal((128, k)) * 4
    return prune_and_compress(w.astype(np.int8) if dtype == "s8" else w.astype(np.float32), dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("dtype", "k", "widths"), CASES)
def test_b_narrower_than_the_weight_is_refused(dtype: str, k: int, widths: range, target: str) -> None:
    """Every listed width is refused with a tagged buffer (it records K); raw metadata words carry
    no K, so there b is checked against values' chunk padding: all widths a chunk or more short."""
    weight = _weight(dtype, k)
    group = 2 if dtype == "tf32" else 4
    raw = weight.meta.data if target == "sm_90a" else tcgen05_metadata(weight.meta).data
    for meta, refused in ((weight.meta, widths), (raw, range(widths.start, k - group + 1))):
        for width in refused:
            b = np.ones((16, width), np.float32)
            with pytest.raises(SparsityError) as info:
                plan_sparse_matmul(weight.values, meta, b, dtype=dtype, target=target, interpret=True)
            assert info.value.code == "SP0815", (width, info.value)
            assert f"K = {width}" in info.value.message
            assert info.value.help and "b is stored N x K" in info.value.help
        plan = plan_sparse_matmul(weight.values, meta, np.ones((16, k), np.float32), dtype=dtype,
                                  target=target, interpret=True, kernel="gemm")
        assert plan.k == k


@pytest.mark.parametrize("target", TARGETS)
def test_b_within_the_chunk_padding_is_checked_against_the_tagged_metadata(target: str) -> None:
    """K = 62 pads values to 64 columns (a whole chunk); the tagged buffer knows K = 62, so b of
    61, 63 and 64 columns is refused, while raw words (which carry no K) accept only what values'
    chunk padding allows."""
    weight = _weight("f16", 62)
    assert weight.values.shape == (128, 32)
    for width in (61, 63, 64, 65):
        with pytest.raises(SparsityError) as info:
            plan_sparse_matmul(weight.values, weight.meta, np.ones((8, width), np.float16), target=target,
                               interpret=True)
        assert info.value.code == "SP0815"
        assert f"K = {width}" in info.value.message
        assert ("K = 62" if width < 65 else "values cover K = 64") in info.value.message
    plan_sparse_matmul(weight.values, weight.meta, np.ones((8, 62), np.float16), target=target, interpret=True)
