"""``tanh`` and ``erf``: their type rule (that of the other math builtins: integers become f32, floats
keep their type) and the interpreter's values, float64 rounded once to f32 and then to the type
(docs/language.md, rule 10), on random inputs and the special ones: huge, infinite, NaN, subnormal,
signed zero. The GPU's kernels are checked in tests/backend/test_special_math.py and
tests/gpu/test_special_math_gpu.py."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.tests.support import compile_src

FNS = {"tanh": math.tanh, "erf": math.erf}

TYPED = """
@kernel
def k(A: ptr[{t}], Q: ptr[f32], s: {t}):
    x = load(A + arange(0, 16))
    y = {fn}(x)
    z = {fn}(s)
    static_assert(y.dtype == {r} and z.dtype == {r})
    static_assert(y.shape == (16,) and z.shape == ())
    store(Q + arange(0, 16), y + z)
"""


@pytest.mark.parametrize("fn", sorted(FNS))
@pytest.mark.parametrize(("t", "r"), [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("e4m3", "e4m3"),
                                      ("i32", "f32"), ("u8", "f32"), ("i64", "f32"), ("bool", "f32")])
def test_type_rule_is_that_of_exp(fn: str, t: str, r: str) -> None:
    """As `exp`: a float tile or scalar keeps its type, an integer or bool one becomes f32."""
    compile_src(TYPED.format(t=t, r=r, fn=fn), stop_after="ir", cache=False)
    compile_src(TYPED.format(t=t, r=r, fn="exp"), stop_after="ir", cache=False)


def test_a_pointer_is_reported_with_its_span() -> None:
    src = "@kernel\ndef k(A: ptr[f32]):\n    x = erf(A)\n    y = tanh(A + 1)\n"
    with pytest.raises(sp.CompileError) as info:
        sp.loads(src, "case.spk").kernels["k"].ir(np.zeros(4, np.float32))
    ds = info.value.diagnostics
    assert [(d.code, d.span.line, d.span.col) for d in ds] == [("SP0311", 3, 13), ("SP0311", 4, 14)]
    assert ds[0].message == "`erf` needs a numeric operand, found ptr[f32]"
    assert ds[1].message == "`tanh` needs a numeric operand, found ptr[f32]"


def test_triton_names_no_longer_say_they_are_missing() -> None:
    from sparsile.frontend.sema.triton_names import name_help

    assert name_help("tanh") is None and name_help("erf") is None
    assert "`tanh`, `erf`" in (name_help("libdevice") or "")


ELEMENTWISE = """
@kernel
def k(A: ptr[{t}], T: ptr[{t}], E: ptr[{t}], S: ptr[f32], s: f32, n: i32):
    i = arange(0, 1024)
    m = i < n
    x = load(A + i, mask=m)
    store(T + i, tanh(x), mask=m)
    store(E + i, erf(x), mask=m)
    store(S, tanh(s))
    store(S + 1, erf(s))
"""

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, -3e-39, 3.4028235e38,
                    -3.4028235e38, 1.0, -1.0, 0.99999994, 3.92, -3.93, 9.01, 44.4, -100.0, 1e-4, 0.5],
                   np.float32)


def _inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random f32 values of every magnitude (subnormal to 2**30) and sign, around 1 densely, and SPECIAL."""
    wide = np.exp2(rng.uniform(-149, 30, n // 2)) * rng.choice([-1.0, 1.0], n // 2)
    near = rng.normal(0.0, 2.5, n - n // 2 - SPECIAL.size)
    return np.concatenate([SPECIAL, wide, near]).astype(np.float32)


def _reference(fn: str, x: np.ndarray) -> np.ndarray:
    """``fn`` in float64 (Python's math module, not numpy) rounded to f32."""
    return np.array([FNS[fn](float(v)) for v in x.astype(np.float64)], np.float32)


@pytest.mark.parametrize(("t", "dt"), [("f32", np.float32), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_interpreter_is_float64_rounded_to_the_type(t: str, dt: type) -> None:
    rng = np.random.default_rng(7)
    with np.errstate(over="ignore"):  # huge values round to inf in f16
        x = _inputs(rng, 1000).astype(dt)
    tanh_out, erf_out = np.full(1024, 7, dt), np.full(1024, 7, dt)
    scalars = np.zeros(2, np.float32)
    sp.loads(ELEMENTWISE.format(t=t), "case.spk").kernels["k"].interpret[(1,)](
        x, tanh_out, erf_out, scalars, np.float32(-0.75), len(x))
    for fn, out in (("tanh", tanh_out), ("erf", erf_out)):
        want = _reference(fn, x.astype(np.float32)).astype(dt)
        got = out[:len(x)]
        assert np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True), fn
        assert np.array_equal(np.signbit(got.astype(np.float32)), np.signbit(want.astype(np.float32))), fn
        assert np.all(out[len(x):].astype(np.float64) == 7)  # masked lanes untouched
    assert scalars.tolist() == [np.float32(math.tanh(-0.75)), np.float32(math.erf(-0.75))]


def test_interpreter_special_values() -> None:
    """The limits the GPU's kernels keep too: odd functions, 0 -> 0 with its sign, +-inf -> +-1,
    NaN -> NaN, a subnormal x: tanh x = x and erf x = 2 x / sqrt(pi) rounded."""
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -2e-40, 20.0], np.float32)
    t, e, s = np.zeros(8, np.float32), np.zeros(8, np.float32), np.zeros(2, np.float32)
    sp.loads(ELEMENTWISE.format(t="f32"), "case.spk").kernels["k"].interpret[(1,)](x, t, e, s, np.float32(0), 8)
    assert np.array_equal(np.signbit(t[:2]), [False, True]) and np.array_equal(np.signbit(e[:2]), [False, True])
    assert t[2:4].tolist() == [1.0, -1.0] and e[2:4].tolist() == [1.0, -1.0]
    assert np.isnan(t[4]) and np.isnan(e[4])
    assert t[5:7].tolist() == x[5:7].tolist()
    assert e[5:7].tolist() == (x[5:7].astype(np.float64) * 2 / math.sqrt(math.pi)).astype(np.float32).tolist()
    assert t[7] == 1.0 and e[7] == 1.0
