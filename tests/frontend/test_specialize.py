"""frontend/sema/specialize.py: the launch path's remembered specializations give exactly what a fresh
specialization gives, and every check still runs for an argument that would fail it."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import LaunchError
from sparsile.frontend.sema.specialize import specialize

SOURCE = """
@kernel
def k(x: ptr[f32], n: i32, scale: f32, untyped, BLOCK: constexpr):
    i = program_id(0) * BLOCK + arange(0, BLOCK)
    store(x + i, load(x + i, mask=i < n) * scale, mask=i < n)
"""


@pytest.fixture()
def kernel():
    return sp.loads(SOURCE).k


def fresh(kernel, *args, **kwargs):
    bound, _, _ = kernel.bind(args, dict(kwargs))
    return specialize(kernel.name, kernel.params, bound)


def test_memo_agrees_with_a_fresh_specialization(kernel):
    x = np.zeros(64, np.float32)
    cases = [(x, 16, 1.5, 3, 64), (x, 17, 2.5, 3, 64), (x, 17, 2.5, 2**40, 64), (x, 17, 2.5, -7, 64),
             (x, 32, 0.5, 3, 128), (x[1:], 16, 1.5, 3, 64)]
    for _ in range(2):  # the second round is answered from the memo
        for args in cases:
            _, bindings, key = kernel.bind(args[:4], {"BLOCK": args[4]})
            assert (bindings, key[:-1]) == fresh(kernel, *args[:4], BLOCK=args[4])


def test_distinct_specializations_stay_distinct(kernel):
    x = np.zeros(64, np.float32)
    keys = {kernel.bind((x, n, 1.0, u), {"BLOCK": b})[2] for n, u, b in
            [(16, 1, 64), (17, 1, 64), (16, 2**40, 64), (16, 1, 128)]}
    assert len(keys) == 4


def test_run_time_floats_do_not_grow_the_memo(kernel):
    x = np.zeros(64, np.float32)
    for i in range(50):
        kernel.bind((x, 16, float(i) / 7, 1), {"BLOCK": 64})
    assert len(kernel._spec_memo) == 1


def test_an_integer_out_of_range_is_refused_after_one_in_range(kernel):
    x = np.zeros(64, np.float32)
    kernel.bind((x, 5, 1.0, 1), {"BLOCK": 64})
    with pytest.raises(LaunchError) as err:
        kernel.bind((x, 2**40, 1.0, 1), {"BLOCK": 64})
    assert err.value.code == "SP0709"


@pytest.mark.parametrize(("first", "then"), [(-2**31, -2**31 - 16), (-2**63, -2**63 - 16), (-2**31 - 16, -2**31),
                                           (2**31 - 16, 2**31 - 32), (-2**7, -2**7 - 16)])
@pytest.mark.parametrize("position", [1, 3])  # n: i32, untyped (i32 or i64 by range)
def test_integers_at_the_edge_of_a_range_are_specialized_as_fresh(kernel, first, then, position):
    """-2**31 fits i32 and -2**31 - 16 does not, yet both have bit length 32, the same sign and are
    multiples of 16: the memo gave the second the first's specialization (an untyped one i32, not
    i64; an `i32` one no SP0709, and the interpreter then failed in numpy)."""
    x = np.zeros(64, np.float32)
    args = [x, 16, 1.0, 1]
    for value in (first, then):
        args[position] = value
        try:
            expected = fresh(kernel, *args, BLOCK=64)
        except LaunchError as e:
            with pytest.raises(LaunchError) as err:
                kernel.bind(tuple(args), {"BLOCK": 64})
            assert (err.value.code, str(err.value)) == (e.code, str(e))
        else:
            _, bindings, key = kernel.bind(tuple(args), {"BLOCK": 64})
            assert (bindings, key[:-1]) == expected


def test_an_untyped_integer_past_i32_runs_after_one_at_the_edge() -> None:
    """The interpreter launch of the case above: -2**31 - 16 is an i64, whatever came before."""
    k = sp.loads("@kernel\ndef k(out: ptr[i64], n):\n    store(out, n.to(i64) * 2)\n").k
    for n in (-2**31, -2**31 - 16):
        out = np.full(1, 7, np.int64)  # poisoned
        k.interpret[(1,)](out, n)
        assert out[0] == 2 * n


def test_a_wrong_dtype_is_refused_after_a_right_one(kernel):
    kernel.bind((np.zeros(64, np.float32), 5, 1.0, 1), {"BLOCK": 64})
    with pytest.raises(LaunchError) as err:
        kernel.bind((np.zeros(64, np.float16), 5, 1.0, 1), {"BLOCK": 64})
    assert err.value.code == "SP0703"


# ------------------------------------------------------------------------------------------------
# constexpr values that compare equal in Python but compile to other code

EQUAL_BUT_OTHER = """
@kernel
def scale(x: ptr[f32], out: ptr[f32], V: constexpr, BLOCK: constexpr = 16):
    i = arange(0, BLOCK)
    store(out + i, load(x + i) * V)


@kernel
def divide(out: ptr[f32], S: constexpr, BLOCK: constexpr = 16):
    i = arange(0, BLOCK)
    store(out + i, (i - 7) // S[0] + S[1])
"""


def run_scale(kernel, x: np.ndarray, v) -> np.ndarray:
    out = np.full_like(x, np.nan)  # poisoned
    kernel.interpret[(1,)](x, out, v)
    return out


@pytest.mark.parametrize("first", [0.0, np.float32(0.0)])
@pytest.mark.parametrize("second", [-0.0, np.float32(-0.0)])
def test_negative_zero_is_not_the_zero_specialization(first, second):
    """0.0 == -0.0 (and hash alike), but x * -0.0 is -0.0 for a positive x: a kernel specialized
    for 0.0 must not run for V = -0.0 (the memo and the key told them apart by value only)."""
    scale = sp.loads(EQUAL_BUT_OTHER).scale
    x = np.random.default_rng(0).uniform(0.5, 2.0, 16).astype(np.float32)
    for v in (first, second, first):
        out = run_scale(scale, x, v)
        expected = x.astype(np.float64) * float(v)
        assert np.array_equal(out, expected) and np.array_equal(np.signbit(out), np.signbit(expected))
    assert scale.ir(x, x, first) is not scale.ir(x, x, second)


def c_floor_division(a: np.ndarray, b: int) -> np.ndarray:
    """The language's integer ``//``: rounded toward zero (docs/language.md, rule 6)."""
    return np.trunc(a / b)


@pytest.mark.parametrize("order", [0, 1])
def test_tuple_elements_of_equal_value_but_other_type_are_other_specializations(order):
    """(2, 1) == (2.0, 1.0) == (2, True) in Python, but ``-7 // 2`` is -3 on ints (C division) and
    -4.0 on floats: each tuple is its own specialization, whichever comes first."""
    divide = sp.loads(EQUAL_BUT_OTHER).divide
    i = np.arange(16, dtype=np.float64) - 7
    cases = [((2, 1), c_floor_division(i, 2) + 1), ((2.0, 1.0), np.floor(i / 2.0) + 1.0),
             ((2, True), c_floor_division(i, 2) + 1)]
    for (s, expected) in (cases if order == 0 else cases[::-1]) * 2:
        out = np.full(16, np.nan, np.float32)
        divide.interpret[(1,)](out, s)
        assert np.array_equal(out.astype(np.float64), expected), s
    keys = {divide.bind((out, s), {})[2] for s, _ in cases}
    assert len(keys) == 3


TENSOR = """
@kernel
def k(t: tensor[f32, 1], n: i32):
    pass
"""


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_a_tensor_of_a_type_sparsile_has_no_element_type_for_names_the_type(dtype: str) -> None:
    """The tensor branch of SP0708 said "found ndarray" for an array of such a type (the pointer
    branch names the element type)."""
    k = sp.loads(TENSOR, "tensor.spk").kernels["k"]
    with pytest.raises(LaunchError) as info:
        k.interpret[(1,)](np.zeros(4, dtype), 4)
    assert info.value.code == "SP0708"
    assert info.value.message == (f"argument `t` expects a tensor, found an array of {dtype}, which has no sparsile "
                                  "element type")
    assert info.value.help == "convert the array to f32 before the call"


def test_a_tensor_parameter_given_no_array_names_what_it_got() -> None:
    k = sp.loads(TENSOR, "tensor.spk").kernels["k"]
    with pytest.raises(LaunchError) as info:
        k.interpret[(1,)]("not an array", 4)
    assert info.value.code == "SP0708" and info.value.message == "argument `t` expects a tensor, found str"
    assert info.value.help == "pass a numpy array or a device tensor"


NAN_FILL = """
@kernel
def fill(x: ptr[f32], out: ptr[f32], K: constexpr, BLOCK: constexpr = 64):
    i = arange(0, BLOCK)
    v = load(x + i)
    store(out + i, where(v > 0, v * 2.0, K))
"""


def _nan(payload: int = 0) -> float:
    """A fresh float NaN object (``float('nan')`` is a new object each time) with ``payload``."""
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | payload))[0]


@pytest.mark.parametrize("typed", [False, True])
def test_a_nan_constexpr_specializes_once(monkeypatch, typed: bool) -> None:
    """NaN != NaN: keyed by value, a NaN constexpr matched neither the memo nor the IR cache, so every
    launch ran specialize and sema again and both caches grew with each launch. Floats are keyed by
    their bits: 1000 launches compile once, and each gives the right result."""
    import sparsile.frontend.sema.specialize as spec

    kernel = sp.loads(NAN_FILL).fill
    calls = []
    real = spec.specialize
    monkeypatch.setattr(spec, "specialize", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(7)
    for launch in range(1000):
        x = rng.uniform(-1.0, 1.0, 64).astype(np.float32)
        out = np.full(64, 12345.0, np.float32)  # poisoned
        k = sp.f32(float("nan")) if typed else float("nan")
        kernel.interpret[(1,)](x, out, k)
        if launch % 97 == 0:
            x64 = x.astype(np.float64)
            assert np.array_equal(out.astype(np.float64), np.where(x64 > 0, x64 * 2.0, np.nan), equal_nan=True)
    assert len(calls) == 1
    assert len(kernel._spec_memo) == 1 and len(kernel._ir_cache) == 1


def test_float_constexprs_are_keyed_by_their_bits() -> None:
    """Every NaN of one payload is one specialization, a NaN of another payload or sign another, and
    ``-0.0`` is not ``0.0``."""
    kernel = sp.loads(NAN_FILL).fill
    x = np.zeros(64, np.float32)

    def key(v):
        return kernel.bind((x, x, v), {})[2]

    assert key(_nan()) == key(_nan()) == key(float("nan"))
    # a numpy scalar constexpr is the typed constant of its type (docs/language.md), NaN keyed by its bits
    assert key(np.float32("nan")) == key(np.float32("nan")) == key(sp.f32(float("nan"))) != key(float("nan"))
    assert len({key(_nan()), key(_nan(1)), key(-_nan()), key(0.0), key(-0.0)}) == 5
    assert key(sp.f32(_nan())) == key(sp.f32(_nan()))
    assert key((1.0, _nan())) == key((1.0, _nan()))


def test_ml_dtypes_scalars_are_the_floats_they_hold() -> None:
    """``ml_dtypes.bfloat16(1.5)`` for a bf16 scalar (and an e4m3 / e5m2 scalar for an f32 one) was
    SP0708 "expects a scalar bf16, found bfloat16" (they are numpy scalars but no ``np.floating``);
    an ``np.float16`` was taken. They bind as the Python float they hold, positionally or by name
    (found by the launch-path fuzz's hand probes)."""
    import ml_dtypes

    @sp.jit
    def scale(X: sp.ptr[sp.f32], O: sp.ptr[sp.f32], s: sp.bf16, t: sp.f32):
        o = sp.arange(0, 8)
        sp.store(O + o, sp.load(X + o) * s.to(sp.f32) + t)

    rng = np.random.default_rng(7)
    x = rng.standard_normal(8).astype(np.float32)
    for s, t in [(ml_dtypes.bfloat16(1.5), ml_dtypes.float8_e4m3fn(-2.5)),
                 (ml_dtypes.bfloat16(-0.375), ml_dtypes.float8_e5m2(24.0))]:
        want = np.full(8, np.nan, np.float32)
        scale.interpret[(1,)](x, want, float(s), float(t))
        for by_name in (False, True):
            got = np.full(8, np.nan, np.float32)
            if by_name:
                scale.interpret[(1,)](x, got, s=s, t=t)
            else:
                scale.interpret[(1,)](x, got, s, t)
            assert got.tobytes() == want.tobytes()
        assert np.allclose(want, x * np.float32(float(s)) + np.float32(float(t)), rtol=0, atol=1e-6)
