"""Axis analysis is sound: what it claims about a stored integer tile holds for the values the
kernel computes (frontend/ir/axis_info.py; code generation emits 16-byte accesses on these claims,
so a wrong one is a misaligned access or a wrong element on the GPU, never seen on the CPU).

Random index expressions (``+ - * // % & >> <<``, comparisons under ``where``, unary minus,
``maximum``, ``minimum``, ``cdiv``) over ``arange`` rows and columns, ``program_id``, constants and
run-time integers (some multiples of 16, which the launch specializes on): a small kernel stores the sum v of
two of them, and forms a pointer from the first and then the second (two ``addptr``, divisibility in
bytes); the analysis of v and of the pointer is compared with the values the interpreter computes,
for every program of the grid and along both dimensions:

* contiguity c: every run starting at a multiple of c along the dimension is v, v + 1, ..., v + c - 1;
* divisibility d: the value at each such run start is a multiple of d;
* constancy k: every block starting at a multiple of k holds one value.

The four wrong rules a review found in the twenty-eighth session are explicit examples; each of them,
put back, fails this test. A longer run of the same generator (2500 pairs of expressions up to four
operators deep, then 1500 more with unary minus, maximum, minimum and cdiv; twenty-ninth session)
found no other claim that the values break.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparsile.driver.module import loads
from sparsile.frontend.ir.axis_info import AxisAnalysis, AxisInfo

R, C = 8, 16  # the stored tile: R rows (dim 0) x C columns (dim 1)
GRID = 3
CONSTANTS = (0, 1, 2, 3, 4, 8, 16, 17, 32, 64)
DIVISORS = (1, 2, 4, 8, 16, 3)  # right operands of //, % (positive: no sign conventions involved)
SHIFTS = (1, 2, 4)
RUNTIME = (0, 5, 16, 48, 64, 100, 128)  # n0, n1 (16, 48, 64, 128: specialized as multiples of 16)
FAR_BASE = 16
"""The address of Far: what its specialization promises (a multiple of 16) and no more (not of 32)."""

LEAVES = [
    ("arange(0, 16)[None, :]", (1, C)),
    ("arange(16, 32)[None, :]", (1, C)),
    ("arange(0, 8)[:, None]", (R, 1)),
    ("program_id(0)", ()),
    ("n0", ()),
    ("n1", ()),
]


def _shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast shape of two operands (scalars and (1, C) / (R, 1) / (R, C) tiles)."""
    if not a:
        return b
    if not b:
        return a
    return (max(a[0], b[0]), max(a[1], b[1]))


@st.composite
def expressions(draw: Any, depth: int = 3) -> tuple[str, tuple[int, ...], bool]:
    """(source text, shape, whether it is a compile-time constant) of a random integer expression."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 3)):  # a constant one time in four
            return (*draw(st.sampled_from(LEAVES)), False)
        return str(draw(st.sampled_from(CONSTANTS))), (), True
    kind = draw(st.sampled_from(["+", "+", "-", "*", "*", "//", "%", "&", ">>", "<<", "where", "cmp", "cmp",
                                 "neg", "max", "min", "cdiv"]))
    a, sa, ca = draw(expressions(depth - 1))
    if kind == "neg":
        return f"(-{a})", sa, ca
    if kind == "cdiv":
        return f"cdiv({a}, {draw(st.sampled_from(DIVISORS))})", sa, ca
    if kind in ("//", "%"):
        return f"({a} {kind} {draw(st.sampled_from(DIVISORS))})", sa, ca
    if kind == "&":
        return f"({a} & {draw(st.sampled_from((1, 3, 7, 15, 16, 31, 48)))})", sa, ca
    if kind in (">>", "<<"):
        return f"({a} {kind} {draw(st.sampled_from(SHIFTS))})", sa, ca
    b, sb, cb = draw(expressions(depth - 1))
    if kind in ("where", "cmp"):
        if ca and cb:  # a comparison of two constants folds to a Python bool: compare with n0
            b, sb, cb = "n0", (), False
        pred = draw(st.sampled_from(["<", "<=", ">", ">=", "=="]))
        if kind == "cmp":  # a comparison as a 0 / 1 integer (the masks of loads and stores)
            return f"where({a} {pred} {b}, 1, 0)", _shape(sa, sb), False
        c, sc, _ = draw(expressions(depth - 1))
        return f"where({a} {pred} {b}, {c}, {a})", _shape(_shape(sa, sb), sc), False
    if kind in ("max", "min"):
        if ca and cb:  # (folded to a Python number)
            return f"({a} + {b})", _shape(sa, sb), True
        return f"{'maximum' if kind == 'max' else 'minimum'}({a}, {b})", _shape(sa, sb), False
    return f"({a} {kind} {b})", _shape(sa, sb), ca and cb


def _kernel(first: str, second: str) -> Any:
    """Stores v = first + second at Out; forms the pointer (Far + first) + second (two ``addptr``, the
    second on a pointer tile) and loads through it under a mask that is never true (its analysis is
    checked, no address is read)."""
    src = f'''
@kernel
def k(Out, Far, n0: i32, n1: i32):
    v = ({first}) + ({second}) + zeros((8, 16), i32)
    w = load((Far + ({first})) + (({second}) + zeros((8, 16), i32)), mask=v < -1000000, other=0)
    store(Out + program_id(0) * 128 + arange(0, 8)[:, None] * 16 + arange(0, 16)[None, :], v + w)
'''
    return loads(src).k


def _claimed(kernel: Any, out: np.ndarray, n0: int, n1: int) -> tuple[AxisInfo, AxisInfo]:
    """The analysis of v (the stored values, as the mask's left operand) and of the pointer."""
    _, bindings, key = kernel.bind((out, out, n0, n1), {})
    func = kernel.ir_for(bindings, key)
    load = next(op for op in func.walk() if op.name == "load")
    analysis = AxisAnalysis(func)
    return analysis.get(load.operand("mask").owner.operand("lhs")), analysis.get(load.operand("ptr"))


def _violations(tile: np.ndarray, info: AxisInfo, step: int = 1) -> list[str]:
    """Every claim of ``info`` that the (R, C) tile of values breaks; ``step``: the difference of
    consecutive values in a contiguous run (a pointer's element size, its values being addresses)."""
    bad = []
    for dim in (0, 1):
        lines = tile if dim == 1 else tile.T  # each row of ``lines`` runs along ``dim``
        size = lines.shape[1]
        c, d, k = info.contiguity[dim], info.divisibility[dim], info.constancy[dim]
        for start in range(0, size, c):
            run = lines[:, start:start + c]
            if c > 1 and not (run - run[:, :1] == step * np.arange(run.shape[1])[None, :]).all():
                bad.append(f"dim {dim}: not contiguous over {c} from {start}")
            if (run[:, 0] % d).any():
                bad.append(f"dim {dim}: a run start at {start} is not a multiple of {d}")
        for start in range(0, size, min(k, size)):
            block = lines[:, start:start + min(k, size)]
            if not (block == block[:, :1]).all():
                bad.append(f"dim {dim}: not constant over {k} from {start}")
    return bad


ZERO = ("0", (), True)


@settings(max_examples=150)
@given(expressions(), expressions(depth=2), st.sampled_from(RUNTIME), st.sampled_from(RUNTIME))
# the wrong claims found by review before this test existed (twenty-eighth session), each a case here
@example(("arange(0, 8)[:, None] * n0", (R, 1), False), ZERO, 16, 0)  # a new unit axis: each element's divisibility
@example(("(arange(16, 32)[None, :] * 16)", (1, C), False), ZERO, 0, 0)  # a product: each element's, not a run start's
@example(("(0 - arange(0, 16)[None, :])", (1, C), False), ZERO, 0, 0)  # c - x runs downwards
@example(("where(arange(0, 16)[None, :] <= n0, 1, 0)", (1, C), False), ZERO, 16, 0)  # x <= n changes inside a block
@example(("where(arange(0, 16)[None, :] > n0, 1, 0)", (1, C), False), ZERO, 0, 0)
@example(("arange(0, 16)[None, :]", (1, C), False), ("arange(0, 8)[:, None] * 5", (R, 1), False), 0, 0)  # ptr tile + x
def test_the_analysis_of_a_stored_index_holds_for_its_values(first: tuple[str, tuple[int, ...], bool],
                                                             second: tuple[str, tuple[int, ...], bool],
                                                             n0: int, n1: int) -> None:
    expr = f"({first[0]}) + ({second[0]})"
    kernel = _kernel(first[0], second[0])
    out = np.full(GRID * R * C, -(2 ** 31), np.int32)
    info, pointer = _claimed(kernel, out, n0, n1)
    kernel.interpret[(GRID,)](out, out, n0, n1)
    values = out.reshape(GRID, R, C).astype(np.int64)
    for pid in range(GRID):
        bad = _violations(values[pid], info)
        assert not bad, f"{expr} (n0={n0}, n1={n1}, program {pid}): {info} claims too much: {bad[:3]}"
        # (Far + first) + second: addresses of 4-byte elements from a base known only to be 16-byte aligned
        bad = _violations(FAR_BASE + 4 * values[pid], pointer, step=4)
        assert not bad, f"Far + {expr} (n0={n0}, n1={n1}, program {pid}): {pointer} claims too much: {bad[:3]}"


def test_the_checker_sees_a_false_claim() -> None:
    """The check itself: a tile of columns 0..15 is contiguous over 16 from multiples of 16, but
    not constant, and its odd rows' starts are not even."""
    tile = np.broadcast_to(np.arange(C)[None, :] + np.arange(R)[:, None] * 17, (R, C))
    assert _violations(tile, AxisInfo((1, C), (1, 1), (1, 1))) == []
    assert _violations(tile, AxisInfo((1, C), (1, 2), (1, 1))) == ["dim 1: a run start at 0 is not a multiple of 2"]
    assert _violations(tile, AxisInfo((1, 1), (1, 1), (1, 2)))[0] == "dim 1: not constant over 2 from 0"
    assert _violations(tile, AxisInfo((2, 1), (1, 1), (1, 1)))[0] == "dim 0: not contiguous over 2 from 0"
