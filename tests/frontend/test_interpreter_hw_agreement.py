"""The interpreter computes what the PTX the backend emits computes, where they once parted ways
(docs/language.md §Promotion and arithmetic, rules 8 to 10, and §Atomics): the sign of a zero from
``maximum`` / ``minimum`` and the ``max`` / ``min`` reductions, the flush to zero of ``sigmoid``
and of an f32 ``atomic_add``, and integer -> bf16 conversions rounding once on every target. Each
case checks the interpreter against values computed independently, and the PTX for the instruction
whose semantics it models. The GPU runs the same kernels in
tests/gpu/test_interpreter_hw_agreement_gpu.py."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.target.targets import get_target
from sparsile.tests.support import compile_src
from sparsile.tests.support.hw_agreement_cases import (
    ATOMIC_NEW,
    ATOMIC_P,
    ATOMIC_SRC,
    DOT_SRC,
    INT_BF16_SRC,
    MINMAX_SRC,
    SIGMOID_SRC,
    SIGMOID_X,
    atomic_inputs,
    f16_overflow_inputs,
    int_bf16_inputs,
    kernel,
    minmax_expected,
    minmax_inputs,
    round_to_bf16,
    sigmoid_exact,
    tf32_inputs,
)


def _bits_equal(got: np.ndarray, want: list[float]) -> None:
    """Equal values and equal signs (of zeros too)."""
    g = np.asarray(got).astype(np.float64)
    w = np.array(want, np.float64)
    assert g.tolist() == w.tolist() and np.signbit(g).tolist() == np.signbit(w).tolist(), (g, w)


# -- maximum / minimum and the max / min reductions ----------------------------------------------------
@pytest.mark.parametrize("t", ["f32", "f64", "f16", "bf16", "e4m3"])
def test_maximum_and_minimum_order_positive_zero_above_negative_zero(t: str) -> None:
    """PTX ``max`` / ``min`` (PTX ISA 9.1, §9.7.3.11 / §9.7.3.12, §9.7.4 for 16-bit floats) order
    +0.0 > -0.0 and skip NaN; numpy's fmax / fmin returned whichever zero came first (a ReLU
    ``maximum(x, 0.0)`` of -0.0 gave -0.0, the GPU +0.0), and the reductions likewise."""
    a, b, mx, mn, relu, rmx, rmn = minmax_inputs(t)
    kernel(MINMAX_SRC.format(t=t)).interpret[(1,)](a, b, mx, mn, relu, rmx, rmn)
    want = minmax_expected()
    for got, key in ((mx, "max"), (mn, "min"), (relu, "relu"), (rmx, "rmax"), (rmn, "rmin")):
        _bits_equal(got, want[key])


def test_maximum_lowers_to_ptx_max_without_nan_propagation() -> None:
    """The instructions whose zero and NaN rules the interpreter models: ``max.f32`` / ``min.f32``
    (not ``max.NaN``), for the elementwise ops and the reductions alike."""
    text = compile_src(MINMAX_SRC.format(t="f32"), stop_after="ptx", cache=False).ptx
    assert re.search(r"\bmax\.f32\b", text) and re.search(r"\bmin\.f32\b", text)
    assert ".NaN" not in text


# -- sigmoid -----------------------------------------------------------------------------------------
def test_sigmoid_flushes_results_below_the_smallest_normal_f32_to_zero() -> None:
    """``sigmoid`` ends with ``rcp.approx.ftz.f32``: where the exact value is below 2**-126 the GPU
    gives +0.0 (docs/language.md rule 10), for f32 and for bf16 (whose subnormals are f32's) alike;
    the interpreter gave the subnormal. Above the threshold both give the (normal) value."""
    x = np.array(SIGMOID_X, np.float32)
    y, yb = np.full(8, 7.0, np.float32), np.full(8, 7.0, ml_dtypes.bfloat16)
    kernel(SIGMOID_SRC).interpret[(1,)](x, y, yb)
    for i, xi in enumerate(SIGMOID_X):
        exact = sigmoid_exact(xi)
        xb = float(np.float32(xi).astype(ml_dtypes.bfloat16))
        exact_b = sigmoid_exact(xb)
        if exact < 2.0**-126:
            assert y[i] == 0.0 and not np.signbit(y[i]), (xi, y[i])
        else:
            assert abs(float(y[i]) - exact) <= 2e-6 * exact, (xi, y[i], exact)
        if exact_b < 2.0**-126:
            assert float(yb[i]) == 0.0, (xb, yb[i])
        else:
            assert abs(float(yb[i]) - exact_b) <= 2.0**-8 * exact_b, (xb, yb[i], exact_b)
    assert (y[:4] == 0).all()  # the four inputs below -87.34 do flush
    text = compile_src(SIGMOID_SRC, stop_after="ptx", cache=False).ptx
    assert "rcp.approx.ftz.f32" in text


# -- atomic_add on f32 ------------------------------------------------------------------------------
def test_f32_atomic_add_flushes_subnormal_inputs_and_results() -> None:
    """``atom.global.add.f32`` flushes subnormal inputs and results to a zero of their sign (PTX
    ISA 9.1, §9.7.13.5 "atom"; the CUDA programming guide: "atomic single-precision floating-point
    adds on global memory always operate in flush-to-zero mode"); the interpreter added them. The
    old values it returns are memory's bits before the update, unflushed."""
    p, v, old = atomic_inputs()
    kernel(ATOMIC_SRC).interpret[(1,)](p, v, old)
    _bits_equal(p, ATOMIC_NEW)
    assert old.view(np.uint32).tolist() == np.array(ATOMIC_P, np.float32).view(np.uint32).tolist()
    text = compile_src(ATOMIC_SRC, stop_after="ptx", cache=False).ptx
    assert "atom.acq_rel.gpu.global.add.f32" in text  # global memory: the flushing form


def test_f64_and_f16_atomic_add_keep_subnormals() -> None:
    """``atom.add.f64`` and ``atom.add.noftz.f16`` keep subnormals: only f32 flushes."""
    src = """
@kernel
def k(P: ptr[{t}], V: ptr[{t}]):
    i = arange(0, 2)
    atomic_add(P + i, load(V + i))
"""
    for t, dt, tiny in (("f64", np.float64, 1e-310), ("f16", np.float16, 2.0**-20)):
        p, v = np.array([tiny, 0.0], dt), np.array([tiny, tiny], dt)
        kernel(src.format(t=t)).interpret[(1,)](p, v)
        assert p.tolist() == [2 * tiny, tiny]


# -- integer -> bf16 ------------------------------------------------------------------------------
@pytest.mark.parametrize("s", ["i32", "u32", "i64", "u64"])
def test_integer_to_bf16_rounds_once_in_the_interpreter(s: str) -> None:
    """The interpreter rounds each integer once to bf16 (docs/language.md rule 8), as an exact
    rational rounding does; these inputs give another value when rounded through f32 first."""
    x = int_bf16_inputs(s)
    y = np.full(8, 7.0, np.float32).astype(ml_dtypes.bfloat16)
    kernel(INT_BF16_SRC.format(s=s)).interpret[(1,)](x, y)
    assert y.astype(np.float64).tolist() == [round_to_bf16(int(v)) for v in x]
    via_f32 = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    assert (via_f32 != y.astype(np.float64)).sum() >= 2  # the inputs do tell one rounding from two


@pytest.mark.parametrize("s", ["i32", "u32", "i64", "u64"])
@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89"])
def test_integer_to_bf16_rounds_once_below_sm90(s: str, target: str) -> None:
    """Below sm_90 PTX has no ``cvt.rn.bf16.s32`` (or .u32/.s64/.u64), and LLVM converted to f32
    and then to bf16: two roundings (2**24 + 2**16 + 1 became 2**24, not 2**24 + 2**17). The
    lowering converts toward zero to f32, sets the last bit where that was inexact (round to
    odd: 24 bits carry the sticky information for 8) and then rounds once to bf16."""
    sfx = {"i32": "s32", "u32": "u32", "i64": "s64", "u64": "u64"}[s]
    text = compile_src(INT_BF16_SRC.format(s=s), stop_after="ptx", cache=False, target=target).ptx
    assert f"cvt.rn.f32.{sfx}" not in text
    assert f"cvt.rz.f32.{sfx}" in text and "cvt.rn.bf16.f32" in text
    if ptxas_available():
        proc = assemble_with_ptxas(text, get_target(target))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("s", ["i32", "i64"])
def test_integer_to_bf16_is_one_instruction_from_sm90(s: str) -> None:
    """sm_90 has the direct conversion (one rounding): the lowering keeps it."""
    sfx = {"i32": "s32", "i64": "s64"}[s]
    text = compile_src(INT_BF16_SRC.format(s=s), stop_after="ptx", cache=False, target="sm_90a").ptx
    assert f"cvt.rn.bf16.{sfx}" in text and "cvt.rz" not in text


def _model_wide_int_to_bf16(v: int) -> float:
    """The instruction sequence the lowering emits below sm_90, step by step with exact integers:
    ``cvt.rz.f32`` (keep the 24 leading bits), ``cvt.rzi`` back and ``setp.ne`` (inexact?), ``or``
    of that into the last bit, ``cvt.rn.bf16.f32`` (round the 24-bit value to 8 bits, ties even)."""
    m = abs(v)
    e = max(m.bit_length() - 24, 0)
    q = m >> e  # cvt.rz.f32: the truncated 24-bit significand
    if q << e != m:  # back != x: set the sticky (odd) bit
        q |= 1
    return round_to_bf16(q << e if v >= 0 else -(q << e))


def test_the_round_to_odd_sequence_rounds_once() -> None:
    """The sequence of test_integer_to_bf16_rounds_once_below_sm90, modelled exactly, gives the
    once-rounded bf16 of every integer tried (random 32- and 64-bit ones and near-ties); the plain
    f32 -> bf16 path (cvt.rn.f32 first) does not."""
    rng = np.random.default_rng(5)
    vals = [int(v) for v in rng.integers(-2**63, 2**63 - 1, 4000, dtype=np.int64)]
    vals += [int(v) >> int(s) for v, s in zip(rng.integers(-2**63, 2**63 - 1, 4000, dtype=np.int64),
                                                rng.integers(0, 40, 4000), strict=True)]
    vals += [2**k + 2**(k - 8) + d for k in range(9, 64) for d in (-1, 0, 1)]
    vals += [int(v) for s in ("i32", "u32", "i64", "u64") for v in int_bf16_inputs(s)]
    assert all(_model_wide_int_to_bf16(v) == round_to_bf16(v) for v in vals)
    twice = [round_to_bf16(int(np.float32(v))) for v in vals[-32:]]  # through f32 first
    assert twice != [round_to_bf16(v) for v in vals[-32:]]


def _bf16_exact(x: float) -> float:
    """``x`` rounded once to bf16 (8 significant bits, exponents from -126 with subnormals below,
    overflow to infinity), to nearest even, in exact rational arithmetic."""
    from fractions import Fraction

    if not np.isfinite(x) or x == 0:
        return x
    f, e = abs(Fraction(x)), 0
    while Fraction(2) ** (e + 1) <= f:
        e += 1
    while Fraction(2) ** e > f:
        e -= 1
    q = Fraction(2) ** (max(e, -126) - 7)
    n, r = divmod(f, q)
    n = int(n) + (1 if r > q / 2 or (r == q / 2 and int(n) % 2) else 0)
    v = n * q
    return float(np.copysign(np.inf if v >= Fraction(2) ** 128 else float(v), x))


def test_f64_to_bf16_rounds_once_in_the_interpreter() -> None:
    """f64 -> bf16 rounds once, as ``cvt.rn.bf16.f64`` does: on the H100 host's ml_dtypes the
    interpreter rounded through f32 (``2**24 + 2**16 + 1`` gave ``2**24``; the GPU ``2**24 + 2**17``),
    found by the op table's first GPU run. This machine's ml_dtypes rounds once by itself, so the
    conversion is checked against exact rounding on ties, their neighbours and random magnitudes."""
    from sparsile.frontend.interp.numerics import cast_array, f64_to_bf16
    from sparsile.frontend.ir import types as T

    rng = np.random.default_rng(11)
    ties = [2.0**24 + 2**16 + 1, 1.0 + 2**-8 + 2**-40, 3.3961e38, 3.3962e38, 1e39, 2.0**-133, 2.0**-134,
            2.0**-134 * (1 + 2**-30), 2.0**-126 * (1 - 2**-9), 1e-45]
    xs = np.concatenate([ties, np.negative(ties), rng.standard_normal(1000) * 10.0 ** rng.integers(-45, 39, 1000),
                         [0.0, -0.0, np.inf, -np.inf, np.nan]])
    want = np.array([_bf16_exact(float(x)) for x in xs])
    for got in (f64_to_bf16(xs), cast_array(xs, T.f64, T.bf16)):
        got = got.astype(np.float64)
        same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), list(zip(xs[~same][:5], got[~same][:5], want[~same][:5], strict=True))


F64_BF16_SRC = INT_BF16_SRC.format(s="f64")


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89"])
def test_f64_to_bf16_rounds_once_below_sm90(target: str) -> None:
    """Below sm_90 PTX has no ``cvt.rn.bf16.f64`` (PTX ISA 9.1, §9.7.9.21 "cvt": bf16 from f64 needs
    sm_90), and LLVM's ``fptrunc double to bfloat`` became ``cvt.rn.f32.f64`` then ``cvt.rn.bf16.f32``:
    two roundings (``2**24 + 2**16 + 1`` gave ``2**24``, where the interpreter, sm_90's one
    instruction and docs/language.md rule 8 give ``2**24 + 2**17``). The lowering rounds to f32
    toward zero, sets the last bit where that was inexact (round to odd) and rounds once to bf16."""
    text = compile_src(F64_BF16_SRC, stop_after="ptx", cache=False, target=target).ptx
    assert "cvt.rn.f32.f64" not in text
    assert "cvt.rz.f32.f64" in text and "cvt.rn.bf16.f32" in text
    if ptxas_available():
        proc = assemble_with_ptxas(text, get_target(target))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_f64_to_bf16_is_one_instruction_from_sm90(target: str) -> None:
    text = compile_src(F64_BF16_SRC, stop_after="ptx", cache=False, target=target).ptx
    assert "cvt.rn.bf16.f64" in text and "cvt.rz" not in text


def _model_f64_to_bf16_below_sm90(x: float) -> float:
    """The sequence the lowering emits below sm_90, in exact arithmetic where it is exact:
    ``cvt.rz.f32.f64`` (toward zero; beyond f32's range the largest finite f32, infinities and NaN
    kept), ``cvt.f64.f32`` back and ``setp.neu`` (inexact or NaN?), ``or`` of that into the last bit,
    then ``cvt.rn.bf16.f32`` (:func:`_bf16_exact` of the f32 value, exact in f64)."""
    if not np.isfinite(x):
        return x
    with np.errstate(over="ignore"):
        y = np.float32(x)  # to nearest; one step toward zero where that went away from zero
    if abs(float(y)) > abs(x):
        y = np.nextafter(y, np.float32(0.0), dtype=np.float32)
    bits = np.array(y, np.float32).view(np.uint32)
    if float(y) != x:
        bits = bits | np.uint32(1)
    return _bf16_exact(float(bits.view(np.float32)))


def test_the_f64_round_to_odd_sequence_rounds_once() -> None:
    """The sequence of test_f64_to_bf16_rounds_once_below_sm90, modelled step by step, gives the
    once-rounded bf16 of every f64 tried (ties, their neighbours, overflow, subnormals, random
    magnitudes); rounding to nearest f32 first does not."""
    rng = np.random.default_rng(12)
    ties = [2.0**24 + 2**16 + 1, 1.0 + 2**-8 + 2**-40, 3.3961e38, 3.3962e38, 3.5e38, 1e39, 2.0**-133,
            2.0**-134, 2.0**-134 * (1 + 2**-30), 2.0**-126 * (1 - 2**-9), 1e-45, 2.0**-150, 2.0**-149 * 1.5]
    ties += [2.0**k * (1 + 2**-8 + 2**-30) for k in range(-140, 128, 7)]
    xs = ties + [-t for t in ties] + [float(v) for v in rng.standard_normal(3000) * 10.0 ** rng.integers(-45, 39, 3000)]
    xs += [0.0, -0.0, np.inf, -np.inf]
    assert all(_model_f64_to_bf16_below_sm90(x) == _bf16_exact(x) for x in xs)
    assert all(np.signbit(_model_f64_to_bf16_below_sm90(x)) == np.signbit(_bf16_exact(x)) for x in xs)
    assert np.isnan(_model_f64_to_bf16_below_sm90(np.nan))
    with np.errstate(over="ignore"):
        twice = [_bf16_exact(float(np.float32(x))) for x in ties]
    assert twice != [_bf16_exact(x) for x in ties]


# -- dot: f16 accumulators and tf32 operands -------------------------------------------------------
def test_f16_accumulator_of_a_tile_dot_is_rounded_once() -> None:
    """Every lowering of the tile ``dot`` carries an f16 accumulator as f32 and rounds once at the end
    (``mma.sync`` with an f32 D or f32 FMAs, then ``cvt.rn.f16.f32``): partial sums past 65504 stay finite."""
    a, b, c = f16_overflow_inputs()
    kernel(DOT_SRC.format(t="f16", acc="f16")).interpret[(1,)](a, b, c)
    assert (c == 8.0).all(), c
    text = compile_src(DOT_SRC.format(t="f16", acc="f16"), stop_after="ptx", cache=False, target="sm_80").ptx
    assert ".f16.f16.f16.f16" not in text and "cvt.rn.f16.f32" in text  # no MMA with an f16 D


def test_f32_operands_of_a_tile_dot_are_rounded_to_tf32_to_nearest() -> None:
    """The tile ``dot`` rounds f32 operands with ``cvt.rna.tf32.f32`` before the MMA (every target's
    lowering), so ``1 + 3 * 2**-12`` is read as ``1 + 2**-10``, not truncated to 1."""
    a, b, c = tf32_inputs()
    kernel(DOT_SRC.format(t="f32", acc="f32")).interpret[(1,)](a, b, c)
    assert np.diag(c).tolist() == [1 + 2.0**-10] * 16
    assert (c[~np.eye(16, dtype=bool)] == 0).all()
    for target in ("sm_80", "sm_90a"):
        text = compile_src(DOT_SRC.format(t="f32", acc="f32"), stop_after="ptx", cache=False, target=target).ptx
        assert "cvt.rna.tf32.f32" in text, target
