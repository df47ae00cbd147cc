"""8-bit ``sparse_dot`` at one warpgroup (BM = 64, num_warps = 4: wgmma.mma_async.sp on sm_90a) with
BN = 8 and 16, BK = 64 and 128, for every (A, B) pair of e4m3/e5m2 and of i8/u8, mixed ones too,
against the float64 reference of tests/support/sparse_dot_8bit.py, C poisoned. Mixed pairs were
wrong on an H100 (sparse fuzzer seeds 27, 31) while the instruction named A's type for B."""

from __future__ import annotations

import pytest

import sparsile as sp
from sparsile.tests.support import sparse_dot_8bit as S

pytestmark = pytest.mark.gpu

M, N, K = 128, 24, 256


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("bn", [8, 16])
@pytest.mark.parametrize("at,bt", S.PAIRS_8BIT)
def test_8bit_sparse_dot_on_the_wgmma_path(at: str, bt: str, bn: int, bk: int) -> None:
    n = N if N % bn == 0 else 2 * bn
    kern = sp.loads(S.source(at, bt), "case.spk").kernels["k"]
    ops = S.operands(at, bt, M, n, K, 11 + bn + bk)
    consts = {"BM": 64, "BN": bn, "BK": bk}
    args = [ops[p.name] if p.name in ops else consts[p.name] for p in kern.params]
    kern[(M // 64, n // bn)](*args)
    S.check(ops["C"], ops["want"], ops["tol"])
