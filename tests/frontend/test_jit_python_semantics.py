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


# ------------------------------------------------------------------------ side effects Python skips
@sp.jit
def atomic_in_an_arm(out, count, n: sp.i32):
    old = sp.atomic_add(count, 1.0) if n > 0 else 0.0
    sp.store(out, old)


@sp.jit
def bump(count):
    sp.atomic_add(count, 1.0)
    return True


@sp.jit
def atomic_after_and(out, count, n: sp.i32):
    sp.store(out, (n > 0) and bump(count))


@sp.jit
def atomic_decides(out, count, n: sp.i32):
    first = sp.atomic_add(count, 1.0) > 0.0 or n > 0   # the first operand always runs, in Python too
    sp.store(out, sp.atomic_add(count, 1.0) if 1 > 2 else first)   # a constant condition picks one arm


def test_a_side_effect_in_an_operand_python_would_skip_is_reported() -> None:
    # Both arms were computed: the atomic ran with n == 0, which Python's conditional never does.
    out, count = np.zeros(1, np.float32), np.zeros(1, np.float32)
    with pytest.raises(sp.CompileError) as info:
        atomic_in_an_arm.interpret[(1,)](out, count, 0)
    d = info.value.diagnostics[0]
    assert d.code == "SP0248"
    assert d.message == ("this arm of `... if ... else ...` is computed whatever the condition, and it has a side "
                         "effect (`atomic_add`) that Python would skip")
    assert (d.span.file_line, d.span.file_col) == where("sp.atomic_add(count, 1.0) if n > 0")
    assert [(lb.span.file_line, lb.span.file_col) for lb in d.labels] == [where("n > 0 else 0.0")]
    assert "`if` statement" in (d.help or "") and count[0] == 0

    with pytest.raises(sp.CompileError) as info:   # inside a helper: reported at the operand
        atomic_after_and.ir(out, count, 0)
    d = info.value.diagnostics[0]
    assert d.code == "SP0248" and d.message.startswith("this operand of `and` is computed whatever the condition")
    assert "(`atomic_add`)" in d.message
    assert (d.span.file_line, d.span.file_col) == where("bump(count))")

    atomic_decides.interpret[(1,)](out, count, 0)   # operands Python always evaluates are fine
    assert count[0] == 1.0 and out[0] == 0.0


# ------------------------------------------------------------------------ `and` / `or` give an operand
@sp.jit
def and_or_values(out_i, out_f, a: sp.i32, b: sp.i32):
    x = sp.arange(0, 4) - 1
    sp.store(out_i + 0, a and b)
    sp.store(out_i + 1, a or b)
    sp.store(out_i + 2, a > 0 and a)
    sp.store(out_i + 3, (a and b) or 7)
    sp.store(out_i + 4 + sp.arange(0, 4), x and 3)
    sp.store(out_i + 8 + sp.arange(0, 4), x or a)
    sp.store(out_f, a or 2.5)


@pytest.mark.parametrize("a, b", [(0, 5), (3, 5), (3, 0), (0, 0), (-1, 7)])
def test_and_or_give_the_deciding_operand_as_in_python(a: int, b: int) -> None:
    # They gave bools (`3 and 5` was 1, `0 or 2.5` was 1.0) where constants folded to Python's 5 and 2.5.
    out_i, out_f = np.zeros(12, np.int32), np.zeros(1, np.float32)
    and_or_values.interpret[(1,)](out_i, out_f, a, b)
    xs = [i - 1 for i in range(4)]
    assert out_i.tolist() == [a and b, a or b, a > 0 and a, (a and b) or 7, *[x and 3 for x in xs],
                              *[x or a for x in xs]]
    assert out_f[0] == (a or 2.5)


# ------------------------------------------------------------------------ max / min of two values
@sp.jit
def relu_by_max(x, out, n: sp.constexpr):
    i = sp.arange(0, n)
    sp.store(out + i, max(sp.load(x + i) - 4.0, 0))


@sp.jit
def reductions_by_axis(x, out, n: sp.constexpr):
    i = sp.arange(0, n)
    v = sp.load(x + i[:, None] * n + i[None, :])
    sp.store(out + i, max(v, axis=1))
    sp.store(out + n + i, v.min(0))  # (the method takes its axis by position, as numpy's does)


def test_max_of_two_values_is_reported_not_reduced() -> None:
    """``max(x - 4, 0)`` reads as Python's two-value max (a ReLU); the language reduced x along axis 0
    and stored that one value everywhere. The function form takes its axis by keyword now."""
    x, out = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    with pytest.raises(sp.CompileError) as info:
        relu_by_max.interpret[(1,)](x, out, n=8)
    d = info.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0321", "`max` takes one tile (and its axis by keyword): `max(a, b)` is not "
                                   "the elementwise maximum here")
    assert d.help == ("for the elementwise maximum write `maximum(a, b)`; to reduce along an axis write "
                      "`max(x, axis=...)`")
    line, col = where("- 4.0, 0))")
    assert (d.span.file_line, d.span.file_col) == (line, col + len("- 4.0, "))  # at the second value
    g = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    out = np.full(16, np.nan, np.float32)
    reductions_by_axis.interpret[(1,)](g, out, n=8)
    assert np.array_equal(out[:8], g.max(1)) and np.array_equal(out[8:], g.min(0))


# ------------------------------------------------------------------------ ~ of a bool
@sp.jit
def inverted_flags(out, a: sp.i32, FLAG: sp.constexpr):
    if ~FLAG:  # (folded: the branch is chosen at compile time)
        sp.store(out, 1)
    else:
        sp.store(out, 0)
    sp.store(out + 1, sp.where(~(a > 0), 1, 0))


def test_invert_of_a_bool_is_the_same_constant_or_not() -> None:
    """``~`` on a run-time bool is logical not (numpy's meaning, a mask's idiom); a constexpr flag
    folded Python's ``~True == -2``, so a kernel changed behaviour with the flag's kind."""
    out = np.full(2, 7, np.int32)
    for flag in (True, False):
        inverted_flags.interpret[(1,)](out, 1 if flag else 0, FLAG=flag)
        assert out.tolist() == [int(not flag)] * 2


@sp.jit
def prints(out):
    print(out)


def test_print_points_to_static_print() -> None:
    with pytest.raises(sp.CompileError) as info:
        prints.interpret[(1,)](np.zeros(1, np.float32))
    d = info.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0202", "unknown name `print`")
    assert d.help == "kernels do not print at run time; `static_print(...)` prints constants at compile time"
    assert (d.span.file_line, d.span.file_col) == where("print(out)")


# ------------------------------------------------------------------------ a local read before its assignment
scale = 5.0   # module globals named as locals of the kernels below
offset = 100.0
BLOCK = 64


@sp.jit
def local_before_assignment(x, out):
    y = sp.load(x) * scale  # noqa: F823 - the point: Python says UnboundLocalError
    scale = 2.0
    sp.store(out, y + scale)


@sp.jit
def local_assigned_in_a_folded_branch(out, FLAG: sp.constexpr):
    if FLAG:
        BLOCK = 16
    sp.store(out + sp.arange(0, 4), BLOCK)


@sp.jit
def closure_before_assignment(x, out):
    def shifted(v):
        return v + offset

    y = shifted(sp.load(x))
    offset = 1.0
    sp.store(out, y + offset)


LOCAL_BEFORE_ASSIGNMENT_SPK = """
scale = 5.0


@kernel
def k(x: ptr[f32], out: ptr[f32]):
    y = load(x) * scale
    scale = 2.0
    store(out, y + scale)
"""


def test_a_name_the_kernel_assigns_is_its_own_before_the_assignment_too() -> None:
    """A name assigned anywhere in a function is local to it (Python: UnboundLocalError before the
    assignment). Sema read the module's value of the same name until the assignment, silently (the
    module global 5.0 here: out was 12.0); a nested helper read it through its closure the same way.
    Found by the differential test of the two frontends (tests/frontend/test_program_fuzz_jit.py),
    whose @jit renderings define module globals named as the program's locals."""
    x, out = np.ones(1, np.float32), np.full(4, 77, np.float32)
    cases = [(local_before_assignment, (x, out), {}, "scale", "y = sp.load(x) * scale"),
             (local_assigned_in_a_folded_branch, (out,), {"FLAG": False}, "BLOCK", "BLOCK)"),
             (closure_before_assignment, (x, out), {}, "offset", "v + offset")]
    for kern, args, kwargs, name, needle in cases:
        with pytest.raises(sp.CompileError) as info:
            kern.interpret[(1,)](*args, **kwargs)
        d = info.value.diagnostics[0]
        assert (d.code, d.message) == ("SP0202", f"`{name}` is used before `{kern.name}` assigns it"), kern.name
        assert d.help == (f"a name assigned anywhere in a function is local to it, as in Python: no `{name}` from "
                          f"outside `{kern.name}` (a module value, an enclosing function's) is read there; assign it "
                          "before this use (before the loop, for a loop body), or rename the local")
        line, col = where(needle)
        assert (d.span.file_line, d.span.file_col) == (line, col + needle.index(name)), kern.name
    local_assigned_in_a_folded_branch.interpret[(1,)](out, FLAG=True)  # assigned on this path: 16
    assert out.tolist() == [16.0] * 4
    with pytest.raises(sp.CompileError) as info:  # a .spk module constant likewise
        sp.loads(LOCAL_BEFORE_ASSIGNMENT_SPK, "case.spk").k.interpret[(1,)](x, out)
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.span.line, d.span.col) == ("SP0202", "`scale` is used before `k` assigns it", 7, 19)


# ------------------------------------------------ a helper's defaults are read where it is defined
@sp.jit
def scaled_by_block(v, BLOCK: sp.constexpr = BLOCK):
    return v * BLOCK


@sp.jit
def doubled_block(v, n: sp.constexpr = BLOCK):
    BLOCK = n * 2  # (the default above is the module's BLOCK)
    return v * BLOCK


@sp.jit
def defaults_of_helpers(x, out):
    def by_scale(v, scale=scale):
        return v * scale

    def shifted(v, offset, by=offset):  # `by` is the module's offset, not the argument
        return v + offset + by

    v = sp.load(x + sp.arange(0, 4))
    i = sp.arange(0, 4)
    sp.store(out + i, scaled_by_block(v))
    sp.store(out + 4 + i, doubled_block(v))
    sp.store(out + 8 + i, by_scale(v))
    sp.store(out + 12 + i, shifted(v, 1.0))


DEFAULTS_OF_HELPERS_SPK = """
BLOCK = 64


def scaled(v, BLOCK: constexpr = BLOCK):
    return v * BLOCK


@kernel
def k(x: ptr[f32], out: ptr[f32]):
    i = arange(0, 4)
    store(out + i, scaled(load(x + i)))
"""


def test_a_helpers_defaults_are_read_where_it_is_defined() -> None:
    """Python evaluates a parameter's default where the ``def`` is (the module, or the function it
    is nested in): ``def f(v, BLOCK: constexpr = BLOCK)`` is the module's BLOCK. Sema evaluated
    defaults inside the helper, where its own names (its parameters and what its body assigns) are
    local from the first statement: SP0202 'used before `f` assigns it' (since 9c49aa5), and an
    earlier parameter's argument for a default naming it (`by=offset` read the argument)."""
    x = np.random.default_rng(46).standard_normal(4).astype(np.float32)
    out = np.full(16, np.nan, np.float32)
    defaults_of_helpers.interpret[(1,)](x, out)
    v = x.astype(np.float64)
    want = np.concatenate([v * BLOCK, v * BLOCK * 2, v * scale, v + 1.0 + offset])
    np.testing.assert_allclose(out, want, rtol=1e-6)
    out = np.full(4, np.nan, np.float32)
    sp.loads(DEFAULTS_OF_HELPERS_SPK, "case.spk").k.interpret[(1,)](x, out)
    np.testing.assert_allclose(out, v * 64, rtol=1e-6)
