"""Axis analysis (frontend/ir/axis_info.py): what it proves about loop induction variables, which
decides whether loads and stores in a loop are vectorized (backend/lower/memory.py)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.driver.module import loads
from sparsile.frontend.ir.axis_info import AxisAnalysis

SOURCE = '''
@kernel
def two_loops(X, Y, K: i32, BLOCK: constexpr = 256):
    acc = 0.0
    for k0 in range(0, K, BLOCK):
        acc = acc + sum(load(X + k0 + arange(0, BLOCK)))
    for k0 in range(0, K, BLOCK):
        store(Y + k0 + arange(0, BLOCK), load(X + k0 + arange(0, BLOCK)) * acc)
'''


def _loop_variables(step: int) -> list[tuple[int, ...]]:
    kernel = loads(SOURCE).two_loops
    x, y = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
    _, bindings, key = kernel.bind((x, y, 1024), {"BLOCK": step})
    func = kernel.ir_for(bindings, key)
    analysis = AxisAnalysis(func)
    loops = [op for op in func.walk() if op.name == "scf.for"]
    assert [len(op.results) for op in loops] == [1, 0]  # the second loop yields nothing
    return [analysis.get(op.regions[0].block.args[0]).divisibility for op in loops]


@pytest.mark.parametrize("step", [16, 256])
def test_a_loop_that_yields_nothing_keeps_its_induction_variable_divisibility(step: int) -> None:
    assert _loop_variables(step) == [(step,), (step,)]
