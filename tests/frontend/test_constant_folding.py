"""Constant folding computes what the same operation computes at run time (docs/language.md
§Promotion and arithmetic and §Compile-time values).

- ``max`` / ``min`` of float constants follow rule 9 (NaN skipped, ``+0.0 > -0.0``), not Python's;
- an integer constant used as a float rounds once to that type (rule 8), not through float64;
- ``T(c)`` gives the value the run-time conversion gives, as a constant of type ``T``, and operators,
  ``abs``, ``max`` and ``min`` on such typed constants fold to what the run-time op computes
  (sema/typed_fold.py): checked for every operator and type against the same operation on values
  loaded from memory, bit for bit (tests/support/fold_cases.py);
- untyped float ``%`` folds as the run-time f64 ``%`` (rule 6);
- where only the GPU lowering folds (operations on ``full`` tiles, which LLVM folds), the constants
  in the PTX are what the interpreter computes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparsile.frontend.diagnostics import CompileError
from sparsile.tests.support import compile_src
from sparsile.tests.support.fold_cases import (
    TYPES,
    Group,
    bits_of,
    folded_kernel,
    groups,
    literal,
    padded,
    poisoned,
    ptx_stored_bytes,
    runtime_kernel,
    size,
    tile_cases,
    tile_kernel,
    untyped_defined,
    untyped_kernel,
)
from sparsile.tests.support.hw_agreement_cases import kernel


def run(src: str, *arrays: np.ndarray) -> None:
    kernel(src).interpret[(1,)](*arrays)


def _f32_out(body: str, n: int = 4, *inputs: np.ndarray) -> np.ndarray:
    params = "".join(f"X{j}: ptr[f32], " for j in range(len(inputs)))
    out = np.full(n, 7.0, np.float32)
    run(f"@kernel\ndef k({params}O: ptr[f32]):\n{body}", *inputs, out)
    return out


def _same(got: float, want: float) -> bool:
    return (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))


# -- max / min of constants (rule 9) ---------------------------------------------------------------------
@pytest.mark.parametrize("expr,want", [
    ("max(-0.0, 0.0)", 0.0), ("max(0.0, -0.0)", 0.0), ("min(0.0, -0.0)", -0.0), ("min(-0.0, 0.0)", -0.0),
    ('max(float("nan"), 1.0)', 1.0), ('min(2.0, float("nan"))', 2.0), ('max(float("nan"), float("nan"))', math.nan),
    ("max(-0.0, 0)", 0), ("min(0, -0.0)", -0.0), ('max(float("nan"), -0.0, 0.0, -1.0)', 0.0),
    ("max((-0.0, 0.0))", 0.0), ('min((float("nan"), 0.0, -0.0))', -0.0), ("max(3, 4)", 4.0),
])
def test_max_and_min_of_constants_follow_the_run_time_rules(expr: str, want: float) -> None:
    """Python's ``max(-0.0, 0.0)`` is ``-0.0`` and ``max(nan, 1.0)`` NaN; ``maximum`` at run time (and
    PTX ``max``, PTX ISA 9.1 §9.7.3.12) gives ``+0.0`` and ``1.0``. The fold now gives the same as
    ``maximum`` / ``minimum`` on the same values loaded from memory."""
    got = float(_f32_out(f"    store(O, {expr})\n", 1)[0])
    assert _same(got, want), (expr, got)


def test_max_of_constants_agrees_with_maximum_at_run_time() -> None:
    """Every pair of -0.0, 0.0, NaN, 1.0, -1.0: ``max`` / ``min`` folded equal ``maximum`` / ``minimum``
    of the same values loaded from memory."""
    vals = [-0.0, 0.0, math.nan, 1.0, -1.0]
    pairs = [(a, b) for a in vals for b in vals]
    src = "".join(f"    store(O + {2 * k}, max({literal(a)}, {literal(b)}))\n"
                  f"    store(O + {2 * k + 1}, min({literal(a)}, {literal(b)}))\n" for k, (a, b) in enumerate(pairs))
    folded = _f32_out(src, 64)[:2 * len(pairs)]
    a = np.array([p[0] for p in pairs] + [0.0] * (32 - len(pairs)), np.float32)
    b = np.array([p[1] for p in pairs] + [0.0] * (32 - len(pairs)), np.float32)
    mx, mn = np.full(32, 7.0, np.float32), np.full(32, 5.0, np.float32)
    run("@kernel\ndef k(A: ptr[f32], B: ptr[f32], MX: ptr[f32], MN: ptr[f32]):\n    i = arange(0, 32)\n"
        "    store(MX + i, maximum(load(A + i), load(B + i)))\n    store(MN + i, minimum(load(A + i), load(B + i)))\n",
        a, b, mx, mn)
    for k in range(len(pairs)):
        assert _same(float(folded[2 * k]), float(mx[k])) and _same(float(folded[2 * k + 1]), float(mn[k])), pairs[k]


# -- integer constants as floats (rule 8: rounded once) ---------------------------------------------------
BIG = 2**62 + 2**38 + 1        # f32: just above half an ulp (2**39) past 2**62; float64 first made it a tie
BIG_BF16 = 2**62 + 2**54 + 1   # bf16: the same, half an ulp being 2**54


def test_an_integer_literal_next_to_an_f32_value_rounds_once() -> None:
    """``x + 4611686293305294849`` on f32 added ``2**62`` (float64 rounded the literal to ``2**62 + 2**38``,
    a tie that f32 rounded to even) instead of ``2**62 + 2**39``, the integer rounded once to f32."""
    body = f"    store(O, load(X0) + {BIG})\n    store(O + 1, {BIG} + load(X0))\n    store(O + 2, f32({BIG}))\n"
    out = _f32_out(body, 4, np.zeros(1, np.float32))
    want = float(2**62 + 2**39)
    assert out[:3].tolist() == [want] * 3 and out[3] == 7.0


def test_an_integer_literal_as_bf16_rounds_once() -> None:
    import ml_dtypes

    x, o = np.zeros(1, ml_dtypes.bfloat16), np.full(2, 7.0, ml_dtypes.bfloat16)
    run(f"@kernel\ndef k(X: ptr[bf16], O: ptr[bf16]):\n    store(O, load(X) + {BIG_BF16})\n"
        f"    store(O + 1, bf16({BIG_BF16}))\n", x, o)
    assert [float(v) for v in o] == [float(2**62 + 2**55)] * 2


def test_integers_beyond_float64_become_infinity_in_f32_not_an_internal_error() -> None:
    out = _f32_out(f"    store(O, load(X0) + {2**1100})\n    store(O + 1, load(X0) - {2**200})\n", 2,
                   np.zeros(1, np.float32))
    assert out.tolist() == [math.inf, -math.inf]


# -- typed constants --------------------------------------------------------------------------------------
def test_a_conversion_of_a_constant_gives_the_run_time_value() -> None:
    """``f32(16777217) - 16777216.0`` folded to 1.0 (the f32 conversion was kept in float64); at run
    time it is 0.0. ``u8(-1)`` wraps, ``i8(1000.0)`` saturates (rule 8), as `.to` at run time."""
    i = np.full(4, 7, np.int32)
    out = _f32_out("    store(O, f32(16777217) - 16777216.0)\n    store(O + 1, f32(1.0) // f32(0.1))\n"
                   "    store(O + 2, f16(0.1) * 3)\n", 3)
    assert out.tolist() == [0.0, 10.0, float(np.float16(0.1) * np.float16(3))]
    run("@kernel\ndef k(I: ptr[i32]):\n    store(I, u8(-1))\n    store(I + 1, i8(1000.0))\n"
        "    store(I + 2, u8(200) + 100)\n    store(I + 3, abs(i8(-128)))\n", i)
    assert i.tolist() == [255, 127, 44, -128]


def test_typed_constants_keep_their_type() -> None:
    """A typed constant is a value of its type in promotion (not a weak literal), and ``.dtype`` says so."""
    src = ("@kernel\ndef k(O: ptr[f32]):\n    static_assert((f16(1.5) + 1).dtype == f16)\n"
           "    static_assert((u8(1) + i32(1)).dtype == i32 and (i8(1) < 2).dtype == bool)\n"
           "    static_assert(i32(2.9) == 2 and f32(0.1) == 0.1 and f64(f32(0.1)) != 0.1)\n"
           "    store(O, f16(0.5) + f32(0.25))\n")
    o = np.full(1, 7.0, np.float32)
    run(src, o)
    assert o[0] == 0.75


def test_min_over_minus_one_of_typed_constants_is_sp0790() -> None:
    with pytest.raises(CompileError) as e:
        compile_src("@kernel\ndef k(O: ptr[i32]):\n    store(O, i32(-2147483648) // -1)\n", stop_after="ir",
                    cache=False)
    (d,) = e.value.diagnostics
    assert d.code == "SP0790" and "overflow" in d.message and (d.span.line, d.span.col) == (3, 14)


# -- untyped float % (rule 6) -----------------------------------------------------------------------------
def test_untyped_float_remainder_folds_as_the_run_time_f64_remainder() -> None:
    x = np.array([1e17, 3.0, -7.5, 2.0], np.float64)
    o, f = np.full(2, 7.0, np.float64), np.full(2, 5.0, np.float64)
    run("@kernel\ndef k(X: ptr[f64], O: ptr[f64], F: ptr[f64]):\n    i = arange(0, 2)\n"
        "    store(O + i, load(X + 2 * i) % load(X + 2 * i + 1))\n"
        "    store(F, 1e17 % 3.0)\n    store(F + 1, -7.5 % 2.0)\n",
        x, o, f)
    assert bits_of(f) == bits_of(o) and f[1] == -1.5
    assert f[0] == 4.0 and math.fmod(1e17, 3.0) == 1.0  # the quotient rounds: not the exact fmod


# -- the differential test: folded typed constants against the same ops at run time -----------------------
@pytest.mark.parametrize("t", TYPES)
def test_folded_typed_constants_equal_the_run_time_results_bit_for_bit(t: str) -> None:
    """Every operator (and ``abs`` / ``max`` / ``min``) on every pair of edge values of ``t``: folded
    from typed constants and computed on loaded values, bit for bit (any NaN for a NaN)."""
    gs = groups(t)
    n = size(gs)
    got = [poisoned(n, g.out, 7) for g in gs]
    want = [poisoned(n, g.out, 5) for g in gs]
    run(folded_kernel(gs), *got)
    inputs = []
    for g, w in zip(gs, want, strict=True):
        inputs += [*padded(g.cases, t, n), w]
    run(runtime_kernel(gs, n), *inputs)
    for g, a, b in zip(gs, got, want, strict=True):
        k = len(g.cases)
        bad = [(g.cases[j], a[j], b[j]) for j in range(k) if bits_of(a[j:j + 1]) != bits_of(b[j:j + 1])]
        assert not bad, (g.op, t, bad[:5])


@pytest.mark.parametrize("t", ["f64", "i64"])
def test_folded_untyped_constants_equal_f64_and_i64_run_time_results(t: str) -> None:
    """Untyped constants fold as Python's exact integers and float64 with the run-time rules (C
    division, rule 6's integer ``/`` in f32 and float ``//`` and ``%``, rule 9's ``max`` / ``min``):
    equal to the same op on ``f64`` / ``i64`` values wherever the fold has a value (see
    ``untyped_defined``). Before, ``0.0 // -1.0`` folded to ``+0.0`` (``math.floor`` dropped the sign;
    ``floor`` at run time keeps it), ``-0.0 % 1.0`` to ``-0.0`` (C's fmod; the run-time
    ``fma(-trunc(x / y), y, x)`` gives ``+0.0``), and integer ``/`` was Python's true division, not the
    f32 one (``(2**24 + 1) / 1`` was 16777217.0, 16777216.0 at run time)."""
    gs = [Group(g.op, t, [c for c in g.cases if untyped_defined(g.op, t, c)]) for g in groups(t)]
    gs = [g for g in gs if g.cases]
    n = size(gs)
    inputs: list[np.ndarray] = []
    want = [poisoned(n, g.out, 5) for g in gs]
    for g, w in zip(gs, want, strict=True):
        inputs += [*padded(g.cases, t, n), w]
    run(runtime_kernel(gs, n), *inputs)
    for g, w in zip(gs, want, strict=True):
        got = poisoned(n, g.out, 7)
        run(untyped_kernel(g), got)
        k = len(g.cases)
        bad = [(g.cases[j], got[j], w[j]) for j in range(k) if bits_of(got[j:j + 1]) != bits_of(w[j:j + 1])]
        assert not bad, (g.op, t, bad[:5])


# -- where only the GPU lowering folds: LLVM's constants equal the interpreter's results ----------------
@pytest.mark.parametrize("t", ["f32", "f16", "bf16", "i8", "u32"])
def test_llvm_folds_ops_on_constant_tiles_to_what_the_interpreter_computes(t: str) -> None:
    """Sema does not fold ops on ``full`` tiles; LLVM does, in the GPU lowering (llvm.maxnum of -0.0
    and 0.0, fdiv, the float ``%`` sequence, guarded shifts and divisions...). The immediates the PTX
    stores must be the interpreter's results, bit for bit; ``**`` (``lg2.approx`` / ``ex2.approx``) is not
    folded, so it is not compared. Every other op must have been folded and compared."""
    cases = tile_cases(t)
    src = tile_kernel(t, cases)
    stored = ptx_stored_bytes(compile_src(src, stop_after="ptx", cache=False).ptx)
    out = poisoned(len(cases), t, 7)
    run(src, out)
    width = out.dtype.itemsize
    raw = out.view(np.uint8)
    compared: set[str] = set()
    for k, (op, a, b) in enumerate(cases):
        at = range(k * width, (k + 1) * width)
        if not all(i in stored for i in at):
            continue
        got = np.array([stored[i] for i in at], np.uint8).view(out.dtype)
        assert bits_of(got) == bits_of(raw[k * width:(k + 1) * width].view(out.dtype)), (op, a, b, got, out[k])
        compared.add(op)
    assert compared == {op for op, _, _ in cases} - {"**"}, sorted({op for op, _, _ in cases} - compared)


# -- integer constants no integer type holds (rule 6's `/`, rule 8's conversion to an integer type) -------
def _sp0303(body: str) -> tuple[str, str, tuple[int, int]]:
    """The one diagnostic of a kernel storing ``body``: code, message and (line, column) of its span."""
    with pytest.raises(CompileError) as e:
        run(f"@kernel\ndef k(X: ptr[f32], O: ptr[f32]):\n    store(O, {body})\n",
            np.ones(1, np.float32), np.full(1, 7.0, np.float32))
    (d,) = e.value.diagnostics
    return d.code, d.message, (d.span.line, d.span.col)


@pytest.mark.parametrize(("body", "big", "col"), [
    ("(2**200) / 3", 2**200, 15), ("load(X) * (2**130 / 2**129)", 2**130, 25), ("3 / -2**64", -2**64, 18),
    ("2**64 / 1", 2**64, 14),
])
def test_integer_division_of_a_constant_no_integer_type_holds_is_sp0303(body: str, big: int, col: int) -> None:
    """``/`` of integer constants divides them in f32 as run-time integers (rule 6); ``(2**200) / 3``
    folded to inf and ``2**130 / 2**129`` to inf / inf = NaN, silently. No integer type holds such a
    constant: SP0303 at the constant."""
    code, msg, at = _sp0303(body)
    assert (code, at) == ("SP0303", (3, col))
    assert msg == f"integer `/` of the integer constant {big}, which no integer type holds"


def test_integer_division_at_the_ends_of_the_integer_range_still_folds() -> None:
    out = _f32_out("    store(O, (2**64 - 1) / 3)\n    store(O + 1, (-2**63) / 2)\n", 2)
    assert out.tolist() == [float(np.float32(2.0**64) / np.float32(3)), -(2.0**62)]


@pytest.mark.parametrize(("body", "t", "big", "col"), [
    ("u8(2**200)", "u8", 2**200, 17), ("i64(2**64) + 1", "i64", 2**64, 18), ("u64(-2**63 - 1)", "u64", -2**63 - 1, 18),
    ("i32(2**200 // 3)", "i32", 2**200 // 3, 18), ("i8(2**70 % (2**69 + 1))", "i8", 2**70 % (2**69 + 1), 17),
])
def test_a_conversion_to_an_integer_type_of_a_constant_no_integer_type_holds_is_sp0303(
        body: str, t: str, big: int, col: int) -> None:
    """``u8(2**200)`` wrapped to 0 as if 2**200 were a run-time integer; `//`, `%` and `**` results
    beyond i64 / u64 are the same case."""
    code, msg, at = _sp0303(body)
    assert (code, at) == ("SP0303", (3, col))
    assert msg == f"a conversion to {t} of the integer constant {big}, which no integer type holds"


@pytest.mark.parametrize(("body", "big", "t"), [("i32(1) + 2**64 // 2", 2**63, "i32"),
                                              ("load(X).to(i64) + 2**65 % (2**64 + 1)", 2**64 - 1, "i64")])
def test_results_beyond_the_integer_range_meeting_an_integer_value_are_sp0303(body: str, big: int, t: str) -> None:
    """``//``, ``%``, ``**`` of untyped constants stay exact; a result that does not fit the integer
    type it meets is SP0303 (one that meets a float rounds once to it, as ``load(X) + 2**1100``)."""
    code, msg, _ = _sp0303(body)
    assert (code, msg) == ("SP0303", f"the literal {big} does not fit in {t}")


def test_an_integer_beyond_f64_with_a_float_constant_is_sp0303_not_undefined() -> None:
    code, msg, at = _sp0303("2**2000 // 3.0")
    assert (code, at) == ("SP0303", (3, 14))
    assert msg == f"`//` with a float converts the integer constant {2**2000} to f64, whose range it exceeds"
