"""A NumPy scalar given at a launch is typed by its NumPy type, as a default that computes it is.

``a: sp.constexpr = np.int8(100)`` is the ``i8`` constant (``a * a + a`` wraps to 116,
tests/frontend/test_jit_numpy_defaults.py), but ``k(x, out, np.int8(100))`` took Python's number
100 (10100), for a constexpr and for an unannotated run-time parameter alike: the same value gave
another result depending on whether it was the default or the argument. Now the argument is the
constant (constexpr) or the run-time scalar (unannotated) of its own type, in the interpreter and in
the PTX, and the specialization key tells ``np.int8(3)``, ``3`` and ``np.int16(3)`` apart.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.compiler import compile_function
from sparsile.frontend.sema.specialize import fingerprint
from sparsile.tests.backend.ptx_exec import run_grid

ml_dtypes = pytest.importorskip("ml_dtypes")

N = 128


@sp.jit
def run_time(x, out, a):
    i = sp.arange(0, N)
    c = a * a + a
    sp.store(out + i, sp.load(x + i) + c)


@sp.jit
def constant(x, out, a: sp.constexpr):
    i = sp.arange(0, N)
    c = a * a + a
    sp.store(out + i, sp.load(x + i) + c)


@sp.jit
def default_i8(x, out, a: sp.constexpr = np.int8(100)):  # noqa: B008 (the default under test)
    i = sp.arange(0, N)
    c = a * a + a
    sp.store(out + i, sp.load(x + i) + c)


VALUES = [np.int8(100), np.int8(-77), np.int16(300), np.uint8(200), np.float16(1.1), np.float32(1.1),
          np.int64(3 * 2**40), np.float64(1.1), ml_dtypes.bfloat16(1.1), 100, 1.1]
IDS = [f"{type(v).__name__}({v})" for v in VALUES]


def _reference(a) -> float:
    """``a * a + a`` as NumPy computes it in ``a``'s own type (Python's arithmetic for a Python number)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # int8 overflow: it wraps, as the kernel's i8
        return float(a * a + a)


def _inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(seed).uniform(-4.0, 4.0, N).astype(np.float32)
    return x, np.full(N, np.nan, np.float32)


def _check(out: np.ndarray, x: np.ndarray, a) -> None:
    c = _reference(a)
    ref = x.astype(np.float64) + c
    # one f32 rounding of the sum (c itself is exact in f32 for these values, or the kernel's f32 of it)
    tol = 2 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))
    if isinstance(a, float) and not isinstance(a, np.floating):  # Python's float: the kernel computes in f32
        tol = tol + 4 * np.finfo(np.float32).eps * abs(c)
    assert np.all(np.abs(out - ref) <= tol), (out[:4], ref[:4])


@pytest.mark.parametrize("value", VALUES, ids=IDS)
@pytest.mark.parametrize("kernel", [run_time, constant], ids=["run-time", "constexpr"])
def test_a_numpy_scalar_argument_computes_in_its_type_in_the_interpreter(kernel, value) -> None:
    x, out = _inputs(54)
    kernel.interpret[(1,)](x, out, value)
    _check(out, x, value)


def test_an_int8_argument_is_the_int8_default() -> None:
    x, out = _inputs(55)
    default_i8.interpret[(1,)](x, out)
    by_default = out.copy()
    for kernel in (default_i8, constant, run_time):
        out[:] = np.nan
        kernel.interpret[(1,)](x, out, np.int8(100))
        assert np.array_equal(out, by_default), kernel
    _check(by_default, x, np.int8(100))  # 116, not 10100


def _bits(v) -> int:
    """A scalar kernel parameter as the PTX executor takes it: an integer's value, a float's bits."""
    if isinstance(v, np.floating | ml_dtypes.bfloat16):
        return int(np.asarray(v).view(f"u{np.asarray(v).itemsize}"))
    if isinstance(v, float):
        return int(np.float32(v).view(np.uint32))
    return int(v)


PTX_PARAMS = {"int8": ".u8", "int16": ".u16", "uint8": ".u8", "float16": ".b8 run_time_param_2[2]",
              "float32": ".f32", "int": ".u32", "float": ".f32"}


@pytest.mark.parametrize("value", [np.int8(100), np.int8(-77), np.int16(300), np.uint8(200), np.float16(1.1),
                                   np.float32(1.1), 100, 1.1], ids=str)
def test_a_numpy_scalar_argument_is_a_parameter_of_its_type_in_the_ptx(value) -> None:
    x, out = _inputs(56)
    _, bindings, key = run_time.bind((x, out, value), {})
    ptx = compile_function(run_time.ir_for(bindings, key), "sm_90a", num_warps=4, stop_after="ptx").ptx
    declared = next(line for line in ptx.splitlines() if "run_time_param_2" in line and ".param" in line)
    assert PTX_PARAMS[type(value).__name__] in declared, declared
    run_grid(ptx, N, 1, [x, out, _bits(value)])
    _check(out, x, value)


@pytest.mark.parametrize("kernel", [run_time, constant], ids=["run-time", "constexpr"])
def test_the_specialization_key_tells_numpy_types_from_pythons_number(kernel) -> None:
    """np.int8(3), then 3, then np.int16(3), then np.int8(3) again: three specializations, and each
    launch computes in its argument's type (100 in i8 is 116, in i32 10100, in i16 10100)."""
    x, _ = _inputs(57)
    keys = [kernel.bind((x, x, v), {})[2] for v in (np.int8(3), 3, np.int16(3), np.int8(3))]
    assert len(set(keys)) == 3 and keys[0] == keys[3]
    for v in (np.int8(100), 100, np.int16(300), np.int8(100), 300, np.int16(300)):
        out = np.full(N, np.nan, np.float32)
        kernel.interpret[(1,)](x, out, v)
        _check(out, x, v)


def test_a_bool_argument_stays_a_flag() -> None:
    x, out = _inputs(58)
    run_time.interpret[(1,)](x, out, np.bool_(True))  # bool + bool is i32 (rule 5): 1 * 1 + 1
    _check(out, x, 1)  # as 1 * 1 + 1
    assert run_time.bind((x, x, np.True_), {})[2] == run_time.bind((x, x, True), {})[2]


@pytest.mark.parametrize(("value", "name"), [(np.complex64(1 + 2j), "complex64"), (np.longdouble(2.5), "longdouble"),
                                             (np.timedelta64(3, "s"), "timedelta64"),
                                             (np.datetime64("2020-01-01"), "datetime64")])
def test_a_numpy_scalar_of_no_language_type_is_refused_at_the_launch(value, name) -> None:
    x, out = _inputs(59)
    for kernel, code, what in ((run_time, "SP0708", "argument"), (constant, "SP0723", "constexpr argument")):
        with pytest.raises(sp.LaunchError) as info:
            kernel.interpret[(1,)](x, out, value)
        assert (info.value.code, info.value.message) == (
            code, f"{what} `a` is NumPy's `{name}`, which has no type in the language")
        assert "np.int8 to np.int64" in info.value.help
    assert np.isnan(out).all()


def test_an_8_bit_float_scalar_argument_for_a_run_time_parameter_is_refused() -> None:
    x, out = _inputs(60)
    with pytest.raises(sp.LaunchError) as info:
        run_time.interpret[(1,)](x, out, ml_dtypes.float8_e4m3fn(1.5))
    assert (info.value.code, info.value.message) == (
        "SP0708", "argument `a` is the 8-bit float scalar float8_e4m3fn(1.5): 8-bit float scalars cannot be "
                  "kernel parameters")
    assert np.isnan(out).all()
    constant.interpret[(1,)](x, out, ml_dtypes.float8_e4m3fn(1.5))  # a constexpr of it computes in e4m3
    _check(out, x, ml_dtypes.float8_e4m3fn(1.5))


@sp.jit
def divided(x, out, a):
    i = sp.arange(0, N)
    sp.store(out + i, sp.load(x + i) + (a // 7) + (a % 100) * 0.5)


@pytest.mark.parametrize("value", [np.int8(-77), np.int8(100), np.int16(-300), np.int32(-70001), np.int64(-2**40 - 3),
                                   np.uint8(200), np.uint16(65000)], ids=repr)
def test_a_narrow_signed_scalar_parameter_is_sign_extended_in_the_ptx(value) -> None:
    """``a // 7`` and ``a % 100`` of a negative narrow integer tell a sign-extended parameter from a
    zero-extended one (``a * a + a`` wraps to the same 8 bits either way): ``ld.param.s8`` of
    ``np.int8(-77)`` into a 16-bit register is -77, not 179 (the CPU PTX executor's ``ld.param``
    zero-extended every parameter; the PTX itself was right)."""
    x, out = _inputs(61)
    v = int(value)
    c = math.trunc(v / 7) + math.fmod(v, 100) * 0.5  # the language's // and % truncate, as C's
    _, bindings, key = divided.bind((x, out, value), {})
    ptx = compile_function(divided.ir_for(bindings, key), "sm_90a", num_warps=4, stop_after="ptx").ptx
    run_grid(ptx, N, 1, [x, out, v])
    ref = x.astype(np.float64) + c
    assert np.all(np.abs(out - ref) <= 2 * np.finfo(np.float32).eps * (np.abs(x) + abs(c))), (out[:4], ref[:4])
    interpreted = np.full(N, np.nan, np.float32)
    divided.interpret[(1,)](x, interpreted, value)
    assert np.array_equal(interpreted, out)


@sp.jit
def scaled(x, out, V: sp.constexpr):
    i = sp.arange(0, N)
    sp.store(out + i, sp.load(x + i) * V)


@pytest.mark.parametrize("kind", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_an_ml_dtypes_zero_constexpr_is_not_its_negative(kind) -> None:
    """``ml_dtypes.bfloat16(-0.0) == bfloat16(0.0)`` (and hashes alike), and an ml_dtypes float is no
    ``np.floating``: the per-kernel memo of specializations (and the GPU fast path's key, the same
    fingerprint) keyed it by value, so a launch with -0.0 after one with 0.0 reused the kernel for
    0.0 (``x * V`` was +0.0). Keyed by bits, as every other float constexpr."""
    scalar = getattr(ml_dtypes, kind)
    x = np.random.default_rng(62).uniform(0.5, 4.0, N).astype(np.float32)
    for v, negative in ((scalar(0.0), False), (scalar(-0.0), True), (scalar(0.0), False)):
        out = np.full(N, np.nan, np.float32)
        scaled.interpret[(1,)](x, out, v)
        assert np.all(out == 0.0) and np.all(np.signbit(out) == negative), (v, out[:4])
    assert fingerprint(scalar(0.0), True) != fingerprint(scalar(-0.0), True)
