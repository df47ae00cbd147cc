"""The interpreter computes what the GPU code computes, on the inputs where numpy's own function
and the PTX the backend emits part ways (docs/language.md §Promotion and arithmetic). Each case
runs a kernel in the interpreter against a model of the emitted instruction, and reads the LLVM
IR or PTX the backend emits for the same op."""

from __future__ import annotations

import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.interp.numerics import fma_f32
from sparsile.frontend.interp.values import InterpreterError
from sparsile.target.targets import get_target
from sparsile.tests.support import compile_src

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2

BINARY = """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], Q: ptr[{t}], R: ptr[{t}]):
    i = arange(0, {n})
    a = load(A + i)
    b = load(B + i)
    store(Q + i, a {op1} b)
    store(R + i, a {op2} b)
"""


def run(src: str, *args: object) -> None:
    sp.loads(src, "case.spk").kernels["k"].interpret[(1,)](*args)


def llvm_ir(src: str) -> str:
    return compile_src(src, stop_after="llvm", cache=False).llvm


def ptx(src: str) -> str:
    return compile_src(src, stop_after="ptx", cache=False).ptx


# -- integers ------------------------------------------------------------------------------------
def test_integer_remainder_by_zero_is_zero_as_the_quotient() -> None:
    """The GPU code selects 0 for both `//` and `%` by zero; the interpreter gave the dividend for `%`."""
    src = BINARY.format(t="i32", n=4, op1="//", op2="%")
    a, b = np.array([5, -5, 7, -7], np.int32), np.array([0, 0, 2, 2], np.int32)
    q, r = np.ones(4, np.int32), np.ones(4, np.int32)
    run(src, a, b, q, r)
    assert q.tolist() == [0, 0, 3, -3] and r.tolist() == [0, 0, 1, -1]
    ir = llvm_ir(src)
    assert re.search(r"srem i32 %\w+, %(\w+)", ir) and "select i1 %v" in ir


def test_min_divided_by_minus_one_is_reported_as_the_gpu_leaves_it_undefined() -> None:
    """`sdiv MIN, -1` is undefined in LLVM and unspecified for PTX `div.s`: the interpreter reports it
    (SP0790, at the operation) rather than give a value the GPU need not give; other negative
    divisors, and a -1 divisor of other values, truncate toward zero as before. The lowering adds
    no test for it (no select on -1 before the division)."""
    for t, dt in (("i32", np.int32), ("i64", np.int64)):
        lo = np.iinfo(dt).min
        for op1, op2 in (("//", "+"), ("+", "%")):
            src = BINARY.format(t=t, n=2, op1=op1, op2=op2)
            with pytest.raises(InterpreterError) as info:
                run(src, np.array([lo, -9], dt), np.array([-1, -1], dt), np.ones(2, dt), np.ones(2, dt))
            sign = "//" if op1 == "//" else "%"
            assert (info.value.code, info.value.message) == (
                "SP0790", f"{t} overflow: {lo} {sign} -1 has no {t} result (undefined on the GPU)")
            line = 7 if op1 == "//" else 8
            assert (info.value.span.line, info.value.span.col) == (line, 18)  # at `a // b` (`a % b`)
        src = BINARY.format(t=t, n=4, op1="//", op2="%")
        q, r = np.ones(4, dt), np.ones(4, dt)
        run(src, np.array([lo + 1, -9, 9, lo], dt), np.array([-1, -1, -2, -2], dt), q, r)
        assert q.tolist() == [-(lo + 1), 9, -4, lo // -2] and r.tolist() == [0, 0, 1, 0]
        assert not re.search(rf"icmp eq {t} %\w+, -1", llvm_ir(src))


def test_abs_of_an_unsigned_value_is_the_value() -> None:
    """`llvm.abs` reads its operand as signed (abs(0xFFFFFFFF) would be 1 on the GPU)."""
    src = """
@kernel
def k(A: ptr[u32], Q: ptr[u32]):
    i = arange(0, 4)
    store(Q + i, abs(load(A + i)))
"""
    a = np.array([0xFFFFFFFF, 0x80000000, 5, 0], np.uint32)
    q = np.zeros(4, np.uint32)
    run(src, a, q)
    assert q.tolist() == a.tolist()
    assert "llvm.abs" not in llvm_ir(src)


def test_a_pointer_minus_an_unsigned_offset_moves_back_in_both() -> None:
    """A u32 offset is zero-extended to i64 (the GPU sign-extended it: `p + u32(2**31)` went back
    2**31 elements); `p - u32(n)` goes back n elements (the interpreter went 2**32 - n forward)."""
    src = """
@kernel
def k(A: ptr[f32], Q: ptr[f32], n: u32):
    store(Q, load(A + 8 - n))
"""
    a, q = np.arange(16, dtype=np.float32), np.zeros(1, np.float32)
    run(src, a, q, np.uint32(5))
    assert q[0] == 3.0
    ir = llvm_ir(src.replace("8 - n", "n"))
    assert re.search(r"zext i32 %\w+ to i64", ir) and not re.search(r"sext i32 %p_n to i64", ir)


# -- conversions -----------------------------------------------------------------------------------
CAST = """
@kernel
def k(A: ptr[{s}], Q: ptr[{d}]):
    i = arange(0, 8)
    store(Q + i, load(A + i).to({d}))
"""


@pytest.mark.parametrize("src_t,src_dt", [("f32", np.float32), ("f64", np.float64)])
def test_float_to_64_bit_integers_saturates(src_t: str, src_dt: type) -> None:
    """`cvt.rzi.s64.f32` / `cvt.rzi.u64.f64` saturate; numpy's cast of 2**63 and above wrapped."""
    x = np.array([1e30, -1e30, 2.0**63, 2.0**64, np.nan, -1.5, np.inf, -np.inf], src_dt)
    q = np.zeros(8, np.int64)
    run(CAST.format(s=src_t, d="i64"), x, q)
    hi, lo = 2**63 - 1, -2**63
    assert q.tolist() == [hi, lo, hi, hi, 0, -1, hi, lo]
    u = np.zeros(8, np.uint64)
    run(CAST.format(s=src_t, d="u64"), x, u)
    assert u.tolist() == [2**64 - 1, 0, 2**63, 2**64 - 1, 0, 0, 2**64 - 1, 0]
    assert "llvm.fptosi.sat.i64" in llvm_ir(CAST.format(s=src_t, d="i64"))


@pytest.mark.parametrize("d,dt,top", [("e4m3", E4M3, 448.0), ("e5m2", E5M2, 57344.0)])
def test_integer_to_fp8_saturates_as_the_gpu(d: str, dt: type, top: float) -> None:
    """The GPU converts an integer to f32, then `cvt.rn.satfinite`: 1000 is 448 in e4m3, not NaN."""
    x = np.array([1000, -1000, 100000, 3, 2**31 - 1, -2**31, 7, 0], np.int32)
    q = np.zeros(8, dt)
    run(CAST.format(s="i32", d=d), x, q)
    want = np.clip(x.astype(np.float32), -top, top).astype(dt)
    assert q.view(np.uint8).tolist() == want.view(np.uint8).tolist()
    assert not np.isnan(q.astype(np.float32)).any()
    assert "cvt.rn.satfinite" in ptx(CAST.format(s="i32", d=d))


# -- 8-bit floats ----------------------------------------------------------------------------------
FP8 = """
@kernel
def k(A: ptr[{t}], Q: ptr[{t}], R: ptr[{t}], S: ptr[{t}], C: ptr[{t}], M: ptr[bool]):
    i = arange(0, 8)
    x = load(A + i)
    store(Q + i, x * 2.0 + x)
    store(R + i, maximum(-x, x // 1.5))
    store(S + i, exp(x))
    store(C + i, full((8,), {c}, {t}))
    store(M + i, x > 1.0)
"""


@pytest.mark.parametrize("t,dt", [("e4m3", E4M3), ("e5m2", E5M2)])
def test_fp8_arithmetic_compiles_and_saturates_in_both(t: str, dt: type) -> None:
    """Arithmetic on 8-bit floats (held as i8 bits) was emitted as `fadd i8` (an internal error),
    and their constants as int(value) (2.0 stored as the bits 0x02); every op rounds to the type
    as a cast does (through f32, saturating)."""
    src = FP8.format(t=t, c=-1.5)
    x = np.array([300, 400, -448, 1, 2, 0.5, 448, -3], np.float32).astype(dt)
    q, r, s, c = (np.zeros(8, dt) for _ in range(4))
    m = np.zeros(8, bool)
    run(src, x, q, r, s, c, m)
    top = float(ml_dtypes.finfo(dt).max)

    def rounded(v: np.ndarray) -> list[int]:
        return np.clip(v.astype(np.float32), -top, top).astype(dt).view(np.uint8).tolist()

    xf = x.astype(np.float64)
    x3 = np.clip((xf * 2.0).astype(np.float32), -top, top).astype(dt).astype(np.float64) + xf
    assert q.view(np.uint8).tolist() == rounded(x3)
    fl = np.floor(np.clip((xf / 1.5).astype(np.float32), -top, top).astype(dt).astype(np.float64))
    assert r.view(np.uint8).tolist() == rounded(np.fmax(-xf, fl))
    with np.errstate(over="ignore"):
        assert s.view(np.uint8).tolist() == rounded(np.exp(x.astype(np.float32)))
    assert c.view(np.uint8).tolist() == rounded(np.full(8, -1.5))
    assert m.tolist() == (xf > 1.0).tolist()
    ir = llvm_ir(src)
    want = int(np.array(-1.5, np.float32).astype(dt).view(np.int8))
    assert f"i8 {want} to i32" in ir or f"i8 {want}," in ir, "the constant's bits are not its fp8 encoding"
    text = ptx(src)
    if ptxas_available():
        proc = assemble_with_ptxas(text, get_target("sm_90a"))
        assert proc.returncode == 0, proc.stderr


def test_sum_of_fp8_saturates_as_the_gpu() -> None:
    src = """
@kernel
def k(A: ptr[e4m3], Q: ptr[e4m3]):
    i = arange(0, 8)
    store(Q + i, full((8,), sum(load(A + i)), e4m3))
"""
    x = np.full(8, 300.0, np.float32).astype(E4M3)
    q = np.zeros(8, E4M3)
    run(src, x, q)
    assert q.astype(np.float32).tolist() == [448.0] * 8


# -- floats -------------------------------------------------------------------------------------
def test_max_and_min_reductions_skip_nan_as_maximum_does() -> None:
    """The GPU combines with `max.f32` (llvm.maxnum), which skips NaN; np.max propagated it."""
    src = """
@kernel
def k(A: ptr[f32], Q: ptr[f32]):
    i = arange(0, 8)
    x = load(A + i)
    store(Q + arange(0, 4), full((4,), max(x), f32))
    store(Q + 4 + arange(0, 4), full((4,), min(x), f32))
"""
    x = np.array([1.0, np.nan, 5.0, -2.0, np.nan, 3.0, 0.0, 4.0], np.float32)
    q = np.zeros(8, np.float32)
    run(src, x, q)
    assert q.tolist() == [5.0] * 4 + [-2.0] * 4
    assert "max.f32" in ptx(src)


def test_float_floordiv_floors_the_rounded_quotient() -> None:
    """`//` on f16 is `floor` of the quotient rounded to f16 (div.rn.f32, cvt.rn.f16, cvt.rmi):
    2047 / (1 - 2**-11) rounds to 2048, so the floor is 2048 (the interpreter floored the f64
    quotient, 2047.9995, to 2047); at compile time too, `7.0 // 0.1` is floor(70.0)."""
    src = BINARY.format(t="f16", n=2, op1="//", op2="*")
    a, b = np.array([2047, 7], np.float16), np.array([1 - 2**-11, 2], np.float16)
    q, r = np.zeros(2, np.float16), np.zeros(2, np.float16)
    run(src, a, b, q, r)
    assert q.tolist() == [2048.0, 3.0]
    assert re.search(r"cvt\.rn\.f16\.f32[^\n]*\n\s*cvt\.rmi\.f16\.f16", ptx(src))
    src_c = """
@kernel
def k(Q: ptr[f32]):
    store(Q + arange(0, 1), full((1,), 7.0 // 0.1, f32))
"""
    out = np.zeros(1, np.float32)
    sp.loads(src_c, "case.spk").kernels["k"].interpret[(1,)](out)
    assert out[0] == 70.0


def _ptx_fmod_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """PTX div.rn.f32, cvt.rzi.f32.f32, fma.rn.f32 (exact rationals), |y| == inf + selp."""
    out = []
    for a, b in zip(x.tolist(), y.tolist(), strict=True):
        if np.isinf(b):
            out.append(a)
            continue
        with np.errstate(all="ignore"):
            t = float(np.trunc(np.float32(a) / np.float32(b)))
        if not (np.isfinite(t) and np.isfinite(a) and np.isfinite(b)):
            out.append(float(np.float32(-t * b + a)))
            continue
        out.append(float(np.float32(float(Fraction(-t) * Fraction(b) + Fraction(a)))))
    return np.array(out, np.float32)


def test_float_remainder_is_the_gpu_fma_sequence_not_fmod() -> None:
    """Float `%` compiles to fma(-trunc(x / y), y, x) (x where y is infinite); numpy's fmod is exact
    and differed wherever the quotient rounds: 1e10 % 3.0 is 256 on the GPU, 1 in fmod."""
    src = BINARY.format(t="f32", n=64, op1="%", op2="*")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(64) * 10.0 ** rng.integers(-3, 12, 64)).astype(np.float32)
    y = (rng.standard_normal(64) * 10.0 ** rng.integers(-3, 3, 64)).astype(np.float32)
    x[:6] = [1e10, 7.0, -7.0, np.inf, 5.0, 3e7]
    y[:6] = [3.0, np.inf, 2.0, 2.0, 0.0, 0.1]
    q, r = np.zeros(64, np.float32), np.zeros(64, np.float32)
    run(src, x, y, q, r)
    want = _ptx_fmod_f32(x, y)
    np.testing.assert_array_equal(q, want)
    assert q[0] == 256.0 and q[1] == 7.0 and q[2] == -1.0
    text = ptx(src)
    assert "fma.rn.f32" in text and "cvt.rzi.f32.f32" in text and "0f7F800000" in text  # |y| == inf
    assert "frem" not in llvm_ir(src)


def test_fma_model_rounds_once() -> None:
    """The interpreter's fma: a*b + c rounded once to f32 (checked against exact rationals)."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(2000).astype(np.float32), rng.standard_normal(2000).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(2000) * 2.0**-20)).astype(np.float32)
    got = fma_f32(a, b, c)
    want = [np.float32(float(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(s))))
            for p, q, s in zip(a, b, c, strict=True)]
    np.testing.assert_array_equal(got, np.array(want, np.float32))


def test_float_power_is_exp2_of_y_log2_x_as_the_gpu() -> None:
    """`x ** y` compiles to ex2.approx(y * lg2.approx(x)): a negative base gives NaN, 0 ** 0 is NaN
    (numpy's power gave 4 and 1)."""
    src = BINARY.format(t="f32", n=4, op1="**", op2="*")
    x, y = np.array([-2.0, 0.0, 2.0, 0.0], np.float32), np.array([2.0, 0.0, 10.0, 3.0], np.float32)
    q, r = np.zeros(4, np.float32), np.zeros(4, np.float32)
    run(src, x, y, q, r)
    assert np.isnan(q[0]) and np.isnan(q[1]) and q[2] == 1024.0 and q[3] == 0.0
    text = ptx(src)
    assert "lg2.approx.f32" in text and "ex2.approx.f32" in text


def test_an_f32_literal_beyond_the_range_is_infinity_in_both() -> None:
    src = """
@kernel
def k(Q: ptr[f32]):
    store(Q + arange(0, 2), full((2,), 1e40, f32))
"""
    q = np.zeros(2, np.float32)
    run(src, q)
    assert np.isinf(q).all()
    assert "0x7FF0000000000000" in llvm_ir(src)


def test_an_out_of_bounds_unsigned_offset_is_reported() -> None:
    src = """
@kernel
def k(A: ptr[f32], Q: ptr[f32], n: u32):
    store(Q, load(A + n))
"""
    with pytest.raises(InterpreterError):
        run(src, np.zeros(4, np.float32), np.zeros(1, np.float32), np.uint32(2**31 + 1))
