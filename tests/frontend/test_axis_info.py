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


def _store_ptr_and_mask(src: str, args: tuple) -> tuple:
    kernel = loads(src).k
    _, bindings, key = kernel.bind(args, {})
    func = kernel.ir_for(bindings, key)
    analysis = AxisAnalysis(func)
    store = next(op for op in func.walk() if op.name == "store")
    mask = store.optional_operand("mask")
    return analysis.get(store.operand("ptr")), analysis.get(mask) if mask is not None else None


def test_a_product_of_a_contiguous_run_has_each_elements_divisibility() -> None:
    """``arange(0, 64) * 2`` is 0, 2, 4, ...: each element a multiple of 2, not of the run start's
    2^30; the rows ``2 i * ld`` with ld odd start 4-byte aligned, not 16."""
    src = '''
@kernel
def k(Y, ld: i32):
    r = arange(0, 64) * 2
    store(Y + r[:, None] * ld + arange(0, 64)[None, :], zeros((64, 64), f16))
'''
    ptr, _ = _store_ptr_and_mask(src, (np.zeros((128, 64), np.float16), 63))
    assert ptr.divisibility[1] == 4


def test_a_constant_minus_a_run_is_not_contiguous() -> None:
    """``256 - arange(0, 256)`` runs downwards: a forward vector access there reads the wrong elements."""
    src = '''
@kernel
def k(X, Y):
    offs = arange(0, 256)
    store(Y + offs, load(X + (256 - offs)))
'''
    kernel = loads(src).k
    x = np.zeros(512, np.float32)
    _, bindings, key = kernel.bind((x, x), {})
    func = kernel.ir_for(bindings, key)
    analysis = AxisAnalysis(func)
    load = next(op for op in func.walk() if op.name == "load")
    assert analysis.get(load.operand("ptr")).contiguity == (1,)


@pytest.mark.parametrize(("op", "constant"), [("<", 16), (">=", 16), ("<=", 1), (">", 1)])
def test_a_comparison_with_an_aligned_bound_is_constant_only_where_it_changes_at_a_block_start(
        op: str, constant: int) -> None:
    """``offs <= n`` with n a multiple of 16 changes between n and n + 1, inside a block of 16: a
    vector under the first element's mask would store n + 1 .. n + 3 too."""
    src = f'''
@kernel
def k(Y, n: i32):
    offs = program_id(0) * 256 + arange(0, 256)
    store(Y + offs, zeros((256,), f32), mask=offs {op} n)
'''
    _, mask = _store_ptr_and_mask(src, (np.zeros(256, np.float32), 16))
    assert mask.constancy == (constant,)


WIDENED = '''
@kernel
def k(X, Y, ld: i32, BLOCK: constexpr = 64):
    row = program_id(0).to(i64) * ld
    offs = arange(0, BLOCK)
    store(Y + row + offs.to(i64), load(X + row + offs.{cast}))
'''


@pytest.mark.parametrize(("cast", "kept"), [("to(i64)", True), ("to(u64)", False), ("to(i16)", False)])
def test_an_integer_widened_keeps_its_runs_and_factors(cast: str, kept: bool) -> None:
    """``program_id(0).to(i64) * ld`` (64-bit row offsets, as the quantizers of quantize.spk take) is a
    multiple of ld's 16, and ``arange(...).to(i64)`` the same contiguous run: a widening cast keeps
    the values, so rows of 16-byte aligned x stay 16-byte vectors (the cast made every claim unknown,
    and the 64-bit quantizers fell back to one element per access). A cast that may change values
    (signed to unsigned, narrowing) claims nothing."""
    kernel = loads(WIDENED.replace("{cast}", cast)).k
    x = np.zeros((4, 64), np.float32)
    _, bindings, key = kernel.bind((x, x.copy(), 64), {})
    func = kernel.ir_for(bindings, key)
    analysis = AxisAnalysis(func)
    load, store = (next(op for op in func.walk() if op.name == name) for name in ("load", "store"))
    stored = analysis.get(store.operand("ptr"))
    assert (stored.contiguity, stored.divisibility) == ((64,), (16,))
    loaded = analysis.get(load.operand("ptr"))
    assert (loaded.contiguity, loaded.divisibility) == (((64,), (16,)) if kept else ((1,), (4,)))
