"""``argmax`` / ``argmin`` on the GPU give the interpreter's indices bit for bit: every case of
tests/support/argmax_cases.py (element types, 1-D and 2-D tiles, both axes, all axes, ``keep_dims``,
1, 4 and 8 warps, a reduced axis in registers, lanes or warps, broadcast rows; fp8 where the GPU is
sm_89 or later) on random inputs with ties, NaNs, signed zeros and extremes; outputs are poisoned
(all bits set: index -1) before every launch."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.support.argmax_cases import CASES, FP8_CASES, Case, inputs, reference

pytestmark = pytest.mark.gpu


def _check(case: Case, seed: int) -> None:
    x = inputs(case, seed)
    want = reference(case, x)
    got = np.full(case.out_numel(), -1, np.int32)
    case.kernel()[(1,)](x, got, num_warps=case.num_warps, **case.consts())
    assert np.array_equal(got, want), f"{case.id} seed {seed}:\nx = {x!r}\ngot  {got}\nwant {want}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_argmax_on_the_gpu_is_the_interpreters(case: Case) -> None:
    for seed in range(3):
        _check(case, seed)


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: c.id)
def test_fp8_argmax_on_the_gpu_is_the_interpreters(case: Case) -> None:
    from sparsile.backend import runtime

    if runtime.current_device().compute_capability < (8, 9):
        pytest.skip("fp8 reductions need sm_89 or later (SP0577)")
    for seed in range(3):
        _check(case, seed)
