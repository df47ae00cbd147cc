"""``argmax`` / ``argmin`` on the GPU give the interpreter's indices bit for bit: every case of
tests/support/argmax_cases.py (element types, 1-D and 2-D tiles, both axes, all axes, ``keep_dims``,
1, 4 and 8 warps, a reduced axis in registers, lanes or warps, broadcast rows; fp8 where the GPU is
sm_89 or later) on random inputs with ties, NaNs, signed zeros and extremes; and the kernels of
tests/support/argmax_patterns.py (several reductions, loops, partitions, blocked layouts); outputs are poisoned
(all bits set: index -1) before every launch."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.support.argmax_cases import CASES, FP8_CASES, Case, inputs, reference
from sparsile.tests.support.argmax_patterns import PATTERNS, Pattern

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


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
def test_argmax_patterns_on_the_gpu_are_the_interpreters(pattern: Pattern) -> None:
    """Several reductions (and a sum) in one kernel, a reduction in a loop (its shared memory
    reused each iteration), a 3-D tile, warp_specialize partitions (named barriers), interleaved and
    broadcast blocked layouts: the warp simulator's kernels (tests/backend/test_argmax_sim.py) on
    the hardware."""
    k = pattern.kernel()
    for seed in range(3):
        x = pattern.inputs(seed)
        want = pattern.reference(x)
        got = np.full(pattern.out, -1, np.int32)
        k[(1,)](x, got, num_warps=pattern.num_warps, **pattern.consts)
        assert np.array_equal(got, want), f"{pattern.name} seed {seed}:\nx = {x!r}\ngot  {got}\nwant {want}"
