"""``@sparsile.jit`` functions that use Python where the language's meaning could drift from
Python's: each either computes what Python computes on the same inputs, or is reported with a
diagnostic at the user's source line (never an internal error)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import sparsile as sp


def where(needle: str) -> tuple[int, int]:
    """The (line, 1-based column) of the first ``needle`` in this file: where a kernel above says it."""
    lines = inspect.getsource(inspect.getmodule(where)).splitlines()
    i = next(i for i, ln in enumerate(lines) if needle in ln)
    return i + 1, lines[i].index(needle) + 1


# ------------------------------------------------------------------------ unary minus of a bool
@sp.jit
def negate_bools(out, a: sp.i32):
    i = sp.arange(0, 4)
    sp.store(out + i, -(i > 1))
    sp.store(out + 4, -(a > 0))


def test_unary_minus_of_a_bool_is_an_integer_as_in_python() -> None:
    # -True == -1: the interpreter failed inside numpy (InternalError); the GPU negated an i1 (1)
    out = np.zeros(5, np.int32)
    negate_bools.interpret[(1,)](out, 3)
    assert out.tolist() == [-(i > 1) for i in range(4)] + [-1]
    negs = [op for op in negate_bools.ir(out, 3).body.block.ops if op.name == "arith.unary"]
    assert [str(op.result.type) for op in negs] == ["tile<4xi32>", "i32"]   # the GPU code negates an i32 too
    negate_bools.compile({"out": sp.ptr[sp.i32], "a": sp.i32}, target="sm_90a", stop_after="ptx")


# ------------------------------------------------------------------------ range with a zero step
@sp.jit
def zero_step(out, step: sp.i32):
    acc = 0
    for i in range(0, 8, step):
        acc += i
    sp.store(out, acc)


def test_a_run_time_zero_step_is_an_interpreter_fault_at_the_loop() -> None:
    out = np.zeros(1, np.int32)
    zero_step.interpret[(1,)](out, 3)
    assert out[0] == 0 + 3 + 6
    with pytest.raises(sp.InterpreterError) as info:  # was ValueError from Python's range()
        zero_step.interpret[(1,)](out, 0)
    e = info.value
    assert e.code == "SP0792" and "the step of this `range` loop is 0 at run time" in e.message
    assert (e.span.file_line, e.span.file_col) == where("for i in range(0, 8, step)")
    assert "step" in (e.help or "")
