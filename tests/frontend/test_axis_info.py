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


ROWS = '''
@kernel
def rows(Y, ld: i32, BLOCK: constexpr = 64):
    r = program_id(0) * 128 + arange(0, BLOCK)
    c = arange(0, BLOCK)
    store(Y + r[:, None] * ld + c[None, :], zeros((BLOCK, BLOCK), f32))
'''


def test_a_new_unit_axis_has_the_divisibility_of_each_element_not_of_a_run_start() -> None:
    """``r[:, None]`` with r = 128 p + (0, 1, ..., 63): along the new axis each element is its own
    run, and only every 64th element is a multiple of 128, so its divisibility there is 1; times an
    ld not known to be aligned, the row starts are not aligned either (a 4-byte store there would
    fault at run time: the analysis once claimed r's run-start divisibility, 128, for each element)."""
    kernel = loads(ROWS).rows
    y = np.zeros((64, 64), np.float32)
    for ld, aligned in ((63, False), (64, True)):
        _, bindings, key = kernel.bind((y, ld), {})
        func = kernel.ir_for(bindings, key)
        analysis = AxisAnalysis(func)
        expand = next(op for op in func.walk() if op.name == "expand_dims" and op.attrs["axis"] == 1)
        assert analysis.get(expand.result).divisibility[1] == 1
        ptr = next(op for op in func.walk() if op.name == "store").operand("ptr")
        # bytes: with ld a multiple of 16 the rows start where Y does (16-byte aligned), else at 4
        assert analysis.get(ptr).divisibility[1] == (16 if aligned else 4)
