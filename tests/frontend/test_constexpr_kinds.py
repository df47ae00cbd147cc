"""A bool given to a constexpr parameter the kernel uses as a number is SP0723 at the use, naming the
parameter and the value, on every path that binds constexprs (``kernel.interpret[grid]``,
``kernel[grid]``, ``.prepare``, ``kernel.ir``, ``compile`` with a dict or a text signature, ``@jit``
functions, ``sparsile.jax.call``): Python's bool is an int, and ``BLOCK=True`` used to run as 1. A
bool constexpr used as a flag (``if``, ``not``, ``and``/``or``, ``==``, ``&``, ``int(FLAG)``) still
works. A compile-time constant of the wrong type where an integer is needed (a float, a bool that is
no parameter's) is SP0201 whose help says what is wrong with the constant, not how to make a
run-time value constant (frontend/sema/constant_kinds.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError, Diagnostic, LaunchError
from sparsile.tests.backend.test_prepared import arrays as arrays_on_the_fake_device
from sparsile.tests.backend.test_prepared import gpu as gpu  # (the fake device, a fixture)
from sparsile.tests.backend.test_prepared import vadd

SRC = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr = 16):
    offs = arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n) * 2.0, mask=offs < n)
"""
LINE = "    offs = arange(0, BLOCK)"
COL = LINE.index("BLOCK") + 1  # the use `arange(0, BLOCK)` gets the diagnostic
HELP = ("pass an integer for `BLOCK` (`int(flag)` for 0 / 1); a bool constexpr is a flag, for `if BLOCK:`, `not`, "
        "`and` / `or` and `==`")
BOOLS = [True, False, np.True_]


def kernel(src: str = SRC) -> sp.Kernel:
    return sp.loads(src, "case.spk").kernels["k"]


def arrays(n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(0).standard_normal(n).astype(np.float32), np.full(n, np.nan, np.float32)


def sp0723(launch: Any, value: Any, use: str = "`end` of arange", line: int = 4, col: int = COL) -> Diagnostic:
    with pytest.raises(CompileError) as info:
        launch()
    d = info.value.diagnostics[0]
    assert d.code == "SP0723"
    assert d.message == f"constexpr argument `BLOCK` is the bool {bool(value)}, used as a number here ({use})"
    assert d.help == HELP
    assert (d.span.file_line, d.span.file_col) == (line, col)
    return d


@pytest.mark.parametrize("value", BOOLS)
def test_interpret_and_ir_refuse_a_bool_used_as_a_size(value: Any) -> None:
    x, out = arrays()
    d = sp0723(lambda: kernel().interpret[(1,)](x, out, 16, BLOCK=value), value)
    assert f"`BLOCK` is a constexpr parameter, given {bool(value)} (bool)" in d.notes
    assert np.isnan(out).all()
    sp0723(lambda: kernel().ir(x, out, 16, BLOCK=value), value)


@pytest.mark.parametrize("value", BOOLS)
def test_ahead_of_time_compiles_refuse_a_bool_used_as_a_size(value: Any) -> None:
    f32 = sp.ptr[sp.f32]
    sp0723(lambda: kernel().compile({"x": f32, "out": f32, "n": sp.i32, "BLOCK": value}, target="sm_90a"), value)
    text = f"BLOCK={bool(value)}"
    sp0723(lambda: kernel().compile(text, target="sm_90a"), value)
    sp0723(lambda: kernel().compile(text, target="sm_90a", stop_after="ir"), value)


@pytest.mark.parametrize("value", BOOLS)
def test_gpu_launches_and_prepare_refuse_a_bool_used_as_a_size(gpu: Any, value: Any) -> None:
    x, y, out = arrays_on_the_fake_device()
    k = vadd()  # examples/vector_add.spk: `offs = program_id(0) * BLOCK + arange(0, BLOCK)`
    use, col = "an operand of `*`", len("    offs = program_id(0) * ") + 1
    sp0723(lambda: k[(4,)](x, y, out, 1024, BLOCK=value), value, use, 10, col)
    sp0723(lambda: k[(4,)].prepare(x, y, out, 1024, BLOCK=value), value, use, 10, col)
    k[(4,)](x, y, out, 1024, BLOCK=256)
    sp0723(lambda: k[(4,)](x, y, out, 1024, BLOCK=value), value, use, 10, col)  # after the fast path has an entry
    assert len(gpu.launches) == 1


@sp.jit
def jit_copy(x: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
    offs = sp.arange(0, BLOCK)
    sp.store(out + offs, sp.load(x + offs, mask=offs < n) * 2.0, mask=offs < n)


@pytest.mark.parametrize("value", BOOLS)
def test_a_jit_function_refuses_a_bool_used_as_a_size(value: Any) -> None:
    x, out = arrays()
    with pytest.raises(CompileError) as info:
        jit_copy.interpret[(1,)](x, out, 16, BLOCK=value)
    d = info.value.diagnostics[0]
    assert d.code == "SP0723" and d.help == HELP
    assert d.message == f"constexpr argument `BLOCK` is the bool {bool(value)}, used as a number here (`end` of arange)"
    assert np.isnan(out).all()


def test_jax_call_refuses_a_bool_used_as_a_size() -> None:
    jax = pytest.importorskip("jax")
    from sparsile.integrations.jax import call

    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    for interpret in (False, True):
        with pytest.raises(CompileError) as info:
            call(jit_copy, (1,), x, out_shapes=jax.ShapeDtypeStruct((16,), np.float32), n=16, BLOCK=True,
                 interpret=interpret)
        d = info.value.diagnostics[0]
        assert d.code == "SP0723" and d.help == HELP
        assert d.message == "constexpr argument `BLOCK` is the bool True, used as a number here (`end` of arange)"


@pytest.mark.parametrize(("body", "use", "text"), [
    ("    for i in static_range(BLOCK):\n        pass", "a bound of `static_range`", "BLOCK"),
    ("    for i in range(0, n, BLOCK):\n        pass", "a bound of `range`", "BLOCK"),
    ("    for i in range(BLOCK):\n        pass", "a bound of `range`", "BLOCK"),
    ("    t = zeros((BLOCK, 4), f32)", "each dimension of the shape", "(BLOCK, 4)"),
    ("    t = zeros(BLOCK, f32)", "the shape", "BLOCK"),
    ("    y = -BLOCK", "the operand of unary `-`", "BLOCK"),
    ("    m = arange(0, 4) < BLOCK", "an operand of `<`", "BLOCK"),
    ("    y = program_id(0) * BLOCK", "an operand of `*`", "BLOCK"),
    ("    y = BLOCK // 2", "an operand of `//`", "BLOCK"),
    ("    acc = 1\n    acc += BLOCK", "an operand of `+`", "BLOCK"),
    ("    B = BLOCK\n    t = arange(0, B)", "`end` of arange", "B)"),
    ("    t = sum(zeros((4, 4), f32), axis=BLOCK)", "the reduction axis", "BLOCK"),
    ("    p = program_id(BLOCK)", "the grid axis", "BLOCK"),
])
def test_every_numeric_use_of_a_bool_constexpr_is_sp0723(body: str, use: str, text: str) -> None:
    src = f"@kernel\ndef k(x: ptr[f32], n: i32, BLOCK: constexpr):\n{body}\n"
    with pytest.raises(CompileError) as info:
        kernel(src).interpret[(1,)](np.ones(4, np.float32), 4, BLOCK=True)
    d = info.value.diagnostics[0]
    assert d.code == "SP0723" and d.help == HELP
    assert d.message == f"constexpr argument `BLOCK` is the bool True, used as a number here ({use})"
    lines = body.splitlines()
    line = next(i for i, t in enumerate(lines) if text in t)
    assert (d.span.file_line, d.span.file_col) == (3 + line, lines[line].rindex(text) + 1)


def test_a_helper_parameter_carries_the_name_of_the_kernel_parameter() -> None:
    src = """
def first(t, B: constexpr):
    return arange(0, B)

@kernel
def k(x: ptr[f32], n: i32, BLOCK: constexpr):
    offs = first(x, BLOCK)
"""
    with pytest.raises(CompileError) as info:
        kernel(src).interpret[(1,)](np.ones(4, np.float32), 4, BLOCK=True)
    d = info.value.diagnostics[0]
    assert d.code == "SP0723" and d.message.startswith("constexpr argument `BLOCK` is the bool True")
    assert (d.span.file_line, d.span.file_col) == (3, len("    return arange(0, ") + 1)


FLAGS = """
@kernel
def k(x: ptr[f32], out: ptr[f32], n: i32, NEG: constexpr, TWICE: constexpr = False, BLOCK: constexpr = 16):
    offs = arange(0, BLOCK)
    v = load(x + offs, mask=offs < n)
    if NEG:
        v = -v
    if not TWICE and NEG == True:
        v = v + 1.0
    if NEG & (TWICE | True) ^ False:
        v = v * 3.0
    v = v * (int(NEG) * 2 + 1)
    if NEG and TWICE or False:
        v = v * 0.5
    store(out + offs, v, mask=offs < n)
"""


def _flags_reference(x: np.ndarray, neg: bool, twice: bool) -> np.ndarray:
    v = x.astype(np.float64)
    if neg:
        v = -v
    if not twice and neg:
        v = v + 1.0
    if neg:
        v = v * 3.0
    v = v * (int(neg) * 2 + 1)
    if neg and twice:
        v = v * 0.5
    return v


@pytest.mark.parametrize(("neg", "twice"), [(True, False), (np.True_, True), (False, True), (np.False_, False)])
def test_bool_constexprs_used_as_flags_still_work(neg: Any, twice: Any) -> None:
    x, out = arrays(16)
    kernel(FLAGS).interpret[(1,)](x, out, 13, NEG=neg, TWICE=twice)
    ref = _flags_reference(x, bool(neg), bool(twice))
    # three f32 roundings at most (`+ 1.0`, two `* 3.0`), each within half an ulp of its result
    assert (np.abs(out[:13] - ref[:13]) <= 2 * np.finfo(np.float32).eps * np.abs(ref[:13])).all()
    assert np.isnan(out[13:]).all()


@pytest.mark.parametrize(("value", "what"), [
    (4.0, "it is a compile-time constant, but a float: give an int (`int(x)`, or `//` for integer division)"),
    ("4", "it is a compile-time constant of type str: give an int"),
])
def test_sp0201_for_a_constant_of_the_wrong_type_says_what_is_wrong(value: Any, what: str) -> None:
    src = "@kernel\ndef k(x: ptr[f32], n: i32, BLOCK: constexpr):\n    t = arange(0, BLOCK)\n"
    with pytest.raises(CompileError) as info:
        kernel(src).interpret[(1,)](np.ones(4, np.float32), 4, BLOCK=value)
    d = info.value.diagnostics[0]
    assert d.code == "SP0201" and d.message == f"`end` of arange must be a compile-time constant int, found `{value!r}`"
    assert d.help == what


@pytest.mark.parametrize(("body", "message", "help_"), [
    ("    t = arange(0, True)", "`end` of arange must be a compile-time constant int, found the bool True",
     "it is a compile-time constant, but a bool: give an int (`int(flag)` for 0 / 1)"),
    ("    for i in static_range(2.0):\n        pass",
     "the bounds of `static_range` must be compile-time integers, found 2.0",
     "it is a compile-time constant, but a float: give an integer (`int(x)`, or `//` for integer division)"),
    ("    t = zeros(4.0, f32)", "the shape must be a compile-time tuple of integers, found 4.0",
     "it is a compile-time constant, but a float: give a tuple of integers (`int(x)`, or `//` for integer division)"),
    ("    t = arange(0, n)", "`end` of arange must be a compile-time constant int, found a run-time value",
     "pass a literal, a `constexpr` parameter, or an expression of them"),
    ("    for i in static_range(n):\n        pass",
     "the bounds of `static_range` must be compile-time integers, found a run-time value of type i32",
     "use `range(...)` for a loop with run-time bounds"),
])
def test_sp0201_help_per_case(body: str, message: str, help_: str) -> None:
    src = f"@kernel\ndef k(x: ptr[f32], n: i32):\n{body}\n"
    with pytest.raises(CompileError) as info:
        kernel(src).interpret[(1,)](np.ones(4, np.float32), 4)
    d = info.value.diagnostics[0]
    assert (d.code, d.message, d.help) == ("SP0201", message, help_)


def test_a_numpy_bool_constexpr_is_a_bool_not_the_type_bool() -> None:
    src = "@kernel\ndef k(x: ptr[f32], F: constexpr):\n    static_assert(F == True and not (F is bool))\n"
    kernel(src).interpret[(1,)](np.ones(4, np.float32), F=np.True_)  # was the type `bool`: SP0320


def test_nested_lists_and_numpy_scalars_in_a_constexpr_tuple() -> None:
    src = """
@kernel
def k(x: ptr[f32], out: ptr[f32], S: constexpr):
    offs = arange(0, S[0][1])
    store(out + offs, load(x + offs) + S[1])
"""
    x, out = arrays(8)
    kernel(src).interpret[(1,)](x, out, S=[[np.int64(1), np.int64(8)], np.float32(0.5)])  # was a TypeError
    ref = x.astype(np.float64) + 0.5
    assert (np.abs(out - ref) <= np.finfo(np.float32).eps / 2 * np.abs(ref)).all()  # one f32 rounding
    with pytest.raises(LaunchError) as info:
        kernel(src).interpret[(1,)](x, out, S=[[1, object()]])
    assert info.value.code == "SP0723"
    assert info.value.message == ("constexpr argument `S` must be a number, bool, string, tuple or dtype, found "
                                  "object inside a tuple or list")
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(LaunchError) as info:
        kernel(src).interpret[(1,)](x, out, S=deep)
    assert info.value.code == "SP0723" and info.value.message == ("constexpr argument `S` nests tuples or lists more "
                                                                  "than 32 deep")
