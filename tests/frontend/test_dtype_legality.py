"""Math builtins on f64 and fp8 below sm_89: bad input is a diagnostic at the user's line, and the
interpreter computes what the GPU computes.

* f64 (docs/language.md, rule 10): ``sqrt``, ``rsqrt``, ``abs``, ``floor``, ``ceil`` compute in
  f64 (IEEE-exact ``sqrt.rn.f64``, ``div.rn.f64``, ``cvt.rmi``/``cvt.rpi``), in the interpreter too;
  the transcendental builtins refuse f64 at their type rule (SP0347) in both paths, since PTX has no
  f64 ``ex2``/``lg2``/``sin``/``cos`` (they used to reach the lowering: "fpext double to float").
* fp8 (docs/ampere.md): arithmetic, math, comparisons, reductions and conversions of e4m3 / e5m2
  need ``cvt`` with .e4m3x2 / .e5m2x2, which ptxas accepts only from sm_89 on: SP0577 at the op's
  span from the legality pass; loads, stores, ``where`` and negation of fp8 compile for sm_80.
"""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ops.core import F64_MATH, MATH_FUNCS
from sparsile.target.targets import get_target
from sparsile.tests.support import compile_src

F64_SRC = """
@kernel
def k(X: ptr[f64], Y: ptr[f64]):
    i = arange(0, 16)
    x = load(X + i)
    store(Y + i, {fn}(x))
"""

REFUSED_F64 = [f for f in MATH_FUNCS if f not in F64_MATH]


def _diags(src: str, target: str = "sm_90a", stop_after: str = "ptx") -> list:
    with pytest.raises(CompileError) as info:
        compile_src(src, target, stop_after, cache=False)
    assert "Traceback" not in info.value.render()
    return info.value.diagnostics


def test_the_refused_set_is_the_transcendental_builtins() -> None:
    assert set(REFUSED_F64) == {"exp", "exp2", "log", "log2", "sin", "cos", "sigmoid", "tanh", "erf"}


@pytest.mark.parametrize("fn", REFUSED_F64)
def test_transcendental_of_f64_is_sp0347_at_the_argument(fn: str) -> None:
    (d,) = _diags(F64_SRC.format(fn=fn))
    assert d.code == "SP0347"
    assert d.message == (f"`{fn}` of f64 is not supported: the GPU computes it only with f32 approximations "
                         "(PTX has no f64 ex2, lg2, sin or cos)")
    assert (d.span.line, d.span.col) == (6, 19 + len(fn))  # the `x` of `fn(x)`
    assert d.help.startswith(f"compute in f32: `{fn}(x.to(f32))`")


@pytest.mark.parametrize("fn", ["exp", "tanh"])
def test_the_interpreter_refuses_f64_transcendentals_too(fn: str) -> None:
    kern = sp.loads(F64_SRC.format(fn=fn), "case.spk").kernels["k"]
    with pytest.raises(CompileError) as info:
        kern.interpret[(1,)](np.ones(16), np.zeros(16))
    assert [d.code for d in info.value.diagnostics] == ["SP0347"]


def test_a_scalar_f64_is_refused_too() -> None:
    src = """
@kernel
def k(Y: ptr[f64], s: f64):
    store(Y, log(s))
"""
    (d,) = _diags(src)
    assert (d.code, d.span.line, d.span.col) == ("SP0347", 4, 18)


def test_pow_of_f64_is_sp0347_in_both_paths() -> None:
    """`**` on floats is ex2(y * lg2(x)) in f32 (docs/language.md, rule 6): on f64 it was the same
    internal error as `exp`, and an f32 result in the interpreter."""
    src = F64_SRC.replace("{fn}(x)", "x ** x")
    (d,) = _diags(src)
    assert (d.code, d.span.line, d.span.col) == ("SP0347", 6, 18)
    assert d.message.startswith("`**` of f64 is not supported")
    assert "x.to(f32) ** y.to(f32)" in d.help
    kern = sp.loads(src, "case.spk").kernels["k"]
    with pytest.raises(CompileError) as info:
        kern.interpret[(1,)](np.ones(16), np.zeros(16))
    assert [d.code for d in info.value.diagnostics] == ["SP0347"]


def _f64_values() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(0.0, 1e6, 12), [2.0, 0.1, 2.0**25 + 0.5, 1e-300]])
    return x.astype(np.float64)


@pytest.mark.parametrize("fn", F64_MATH)
def test_the_interpreter_computes_f64_math_in_f64(fn: str) -> None:
    """Not through f32 (it was): each is IEEE-exact in f64 on the GPU, so the interpreter gives the same
    bits: sqrt and floor/ceil correctly rounded, rsqrt as 1 / sqrt with two roundings."""
    kern = sp.loads(F64_SRC.format(fn=fn), "case.spk").kernels["k"]
    x = _f64_values() * np.where(np.arange(16) % 2 == 0, 1.0, -1.0) if fn in ("abs", "floor", "ceil") else _f64_values()
    y = np.zeros(16)
    kern.interpret[(1,)](x, y)
    want = {"sqrt": np.sqrt, "rsqrt": lambda v: 1.0 / np.sqrt(v), "abs": np.abs, "floor": np.floor,
            "ceil": np.ceil}[fn](x)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "sm_100a"])
def test_f64_math_lowers_to_the_exact_f64_instructions(target: str) -> None:
    src = """
@kernel
def k(X: ptr[f64], Y: ptr[f64]):
    i = arange(0, 16)
    x = load(X + i)
    store(Y + i, sqrt(x))
    store(Y + 16 + i, rsqrt(x))
    store(Y + 32 + i, floor(x))
    store(Y + 48 + i, ceil(x))
    store(Y + 64 + i, abs(x))
"""
    ptx = compile_src(src, target, cache=False).ptx
    for instr in ("sqrt.rn.f64", "rcp.rn.f64", "cvt.rmi.f64.f64", "cvt.rpi.f64.f64", "abs.f64"):
        assert instr in ptx, instr
    assert ".f32" not in ptx  # nothing computed in f32
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target(target))
        assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------------
# fp8 below sm_89
# ------------------------------------------------------------------------------------------------
FP8_SRC = """
@kernel
def k(X: ptr[e4m3], Y: ptr[{out}]):
    i = arange(0, 16)
    x = load(X + i)
    store(Y + i, {expr})
"""

HELP = ("compile for sm_89, sm_90a or later; or keep the fp8 data as u8 (loads and stores need no conversion) "
        "and convert it on the host")
TAIL = ("cannot be compiled for sm_80: fp8 values are computed on in f32, and conversions to and from fp8 "
        "(`cvt` with .e4m3x2 / .e5m2x2) need sm_89 or later")

FP8_CASES = [  # (store type, expression, what the message names, column of the op's span)
    ("f32", "x.to(f32)", "converting e4m3 to f32", 18),
    ("e5m2", "x.to(e5m2)", "converting e4m3 to e5m2", 18),
    ("i32", "x.to(i32)", "converting e4m3 to i32", 18),
    ("e4m3", "x + x", "`+` on e4m3", 18),
    ("e4m3", "x * x", "`*` on e4m3", 18),
    ("e4m3", "maximum(x, x)", "`maximum` on e4m3", 18),
    ("e4m3", "exp(x)", "`exp` of e4m3", 18),
    ("i32", "(x < -x).to(i32)", "comparing e4m3 values", 19),
    ("e4m3", "sum(x, 0)", "the `sum` reduction of e4m3", 18),
    ("e4m3", "x.max(0)", "the `max` reduction of e4m3", 18),
]


@pytest.mark.parametrize(("out", "expr", "what", "col"), FP8_CASES)
def test_fp8_compute_below_sm89_is_sp0577_at_the_op(out: str, expr: str, what: str, col: int) -> None:
    (d,) = _diags(FP8_SRC.format(out=out, expr=expr), "sm_80", stop_after="llvm")
    assert d.code == "SP0577"
    assert d.message == f"{what} {TAIL}"
    assert (d.span.line, d.span.col) == (6, col)
    assert d.help == HELP


def test_f32_stored_to_an_fp8_pointer_below_sm89_is_sp0577() -> None:
    src = """
@kernel
def k(X: ptr[f32], Y: ptr[e5m2]):
    i = arange(0, 16)
    store(Y + i, load(X + i))
"""
    (d,) = _diags(src, "sm_86", stop_after="llvm")
    assert d.code == "SP0577" and d.message.startswith("converting f32 to e5m2 cannot be compiled for sm_86")


@pytest.mark.parametrize("expr", ["x", "-x", "where(i < 8, x, -x)"])
def test_fp8_data_movement_compiles_for_sm80(expr: str) -> None:
    """Loads, stores, negation (a sign-bit flip) and `where` of fp8 need no `cvt`: legal and assembled."""
    ptx = compile_src(FP8_SRC.format(out="e4m3", expr=expr), "sm_80", cache=False).ptx
    assert "e4m3" not in ptx
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target("sm_80"))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("target", ["sm_89", "sm_90a", "sm_100a"])
@pytest.mark.parametrize(("out", "expr", "what", "col"), FP8_CASES)
def test_fp8_compute_compiles_from_sm89(target: str, out: str, expr: str, what: str, col: int) -> None:
    ptx = compile_src(FP8_SRC.format(out=out, expr=expr), target, cache=False).ptx
    assert "e4m3x2" in ptx
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target(target))
        assert proc.returncode == 0, proc.stderr


FP8_BOOL_SRC = """
@kernel
def k(X: ptr[{t}], Y: ptr[i32]):
    i = arange(0, 8)
    store(Y + i, load(X + i).to(bool).to(i32))
"""


@pytest.mark.parametrize("t", ["e4m3", "e5m2"])
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_fp8_to_bool_tests_the_bits_on_every_target(t: str, target: str) -> None:
    """`.to(bool)` of fp8 is `bits & 0x7f != 0` (NaN true, -0 false), no `cvt`: it compiles for sm_80,
    and it no longer reaches LLVM as an `fcmp` of the i8 bits (an internal error on every target)."""
    ptx = compile_src(FP8_BOOL_SRC.format(t=t), target, cache=False).ptx
    assert "cvt.rn.f16x2.e" not in ptx
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target(target))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("t", ["e4m3", "e5m2"])
def test_fp8_to_bool_in_the_interpreter_is_the_same_bit_test(t: str) -> None:
    bits = np.array([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x38, 0x7E], np.uint8)
    y = np.full(8, -1, np.int32)
    kern = sp.loads(FP8_BOOL_SRC.format(t=t), "case.spk").kernels["k"]
    kern.interpret[(1,)](bits.view(sp.e4m3.numpy_dtype if t == "e4m3" else sp.e5m2.numpy_dtype), y)
    np.testing.assert_array_equal(y, ((bits & 0x7F) != 0).astype(np.int32))


FP8_TRUTH_SRC = """
@kernel
def k(X: ptr[{t}], Y: ptr[i32]):
    for j in static_range(0, 8):
        x = load(X + j)
        r = 0
        if x:
            r = 1
        store(Y + j, r + 2 * (not x).to(i32))
"""


@pytest.mark.parametrize("t", ["e4m3", "e5m2"])
def test_fp8_truthiness_is_the_bit_test_on_every_target(t: str) -> None:
    """`if x:` and `not x` of an fp8 value test it as `.to(bool)` does (nonzero bits but the sign's:
    NaN true, -0 false), so they compile for sm_80 as `.to(bool)` does; they compared it with 0 in
    f32 (a `cvt`), SP0577 at sm_80, although the language lets `.to(bool)` through."""
    src = FP8_TRUTH_SRC.format(t=t)
    for target in ("sm_80", "sm_90a"):
        ptx = compile_src(src, target, cache=False).ptx
        assert "cvt.rn.f16x2.e" not in ptx
    bits = np.array([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x38, 0x7E], np.uint8)
    y = np.full(8, -1, np.int32)
    kern = sp.loads(src, "case.spk").kernels["k"]
    kern.interpret[(1,)](bits.view(sp.e4m3.numpy_dtype if t == "e4m3" else sp.e5m2.numpy_dtype), y)
    truth = (bits & 0x7F) != 0
    np.testing.assert_array_equal(y, truth + 2 * ~truth)


def test_a_numpy_float64_launch_argument_s_sp0347_says_where_its_f64_came_from() -> None:
    """`1 / np.sqrt(d)` at a launch is NumPy's float64, typed f64 (docs/language.md); `exp` of it is
    SP0347 at the operand, and the help names that origin and both fixes (float(v), an f32 annotation),
    which then run right (float64 reference, poisoned output)."""

    @sp.jit
    def scaled_exp(x, out, alpha, BLOCK: sp.constexpr):
        offs = sp.arange(0, BLOCK)
        sp.store(out + offs, sp.exp(alpha * sp.load(x + offs)))

    rng = np.random.default_rng(54)
    x = rng.uniform(-1.0, 1.0, 64).astype(np.float32)
    alpha = 1 / np.sqrt(np.float64(7.0))
    with pytest.raises(CompileError) as info:
        scaled_exp.interpret[(1,)](x, np.full(64, np.nan, np.float32), alpha, BLOCK=64)
    (d,) = info.value.diagnostics
    assert d.code == "SP0347" and d.message.startswith("`exp` of f64 is not supported")
    assert "NumPy float64 at the launch" in d.help and "`float(v)`" in d.help and "`f32`" in d.help
    out = np.full(64, np.nan, np.float32)
    scaled_exp.interpret[(1,)](x, out, float(alpha), BLOCK=64)
    np.testing.assert_allclose(out, np.exp(float(alpha) * x.astype(np.float64)), rtol=2e-6)
