"""A typed constant (``T(c)``, docs/language.md §Compile-time values) is a value of type ``T`` in
every context, not only in the operators that fold it (tests/frontend/test_constant_folding.py):

- next to an untyped literal in a builtin that is not folded (``maximum``, ``where``), a conditional
  expression or the two branches of an ``if``, the literal takes ``T`` (rule 1), as next to a
  run-time value of ``T``;
- carried through a run-time loop it keeps ``T`` (``acc = u8(0)`` then ``acc = acc + x_u8`` wraps
  at 256, as with a run-time ``u8`` accumulator), and a loop that assigns one carries ``T``;
- ``full(shape, c, D)`` converts it to ``D`` as at run time (wraps, saturates), not as a literal
  that must fit;
- ``tf32(c)`` of an integer rounds to tf32 as the run-time conversion (``cvt.rna.tf32.f32``).

Each case is compared with the same code on run-time values loaded from memory (random inputs,
outputs poisoned)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsile.tests.support.hw_agreement_cases import kernel


def run(src: str, *arrays: np.ndarray) -> None:
    kernel(src).interpret[(1,)](*arrays)


# -- a typed constant next to a literal -------------------------------------------------------------------
MIXED = """
@kernel
def k(C: ptr[i32], Z: ptr[u8], O: ptr[i32]):
    c = load(C) > 0
    z = {z}
    store(O, maximum(z, 0) + {w})
    store(O + 1, where(c, z, 0) + {w})
    store(O + 2, (z if c else 0) + {w})
    if c:
        y = z
    else:
        y = 0
    store(O + 3, y + {w})
    store(O + 4, minimum(0, z) - {w})
"""


@pytest.mark.parametrize("seed", range(3))
def test_a_literal_next_to_a_typed_constant_takes_its_type(seed: int) -> None:
    """``maximum(u8(200), 0) + u8(100)`` is 44 (u8 wraps), as ``maximum(z, 0) + u8(100)`` for a run-time
    ``u8`` z: the literal 0 takes u8. It was 300: the typed constant and the literal both became
    weak literals (i32) in ``maximum``, ``where``, ``... if c else ...`` and an ``if``'s branches."""
    rng = np.random.default_rng(seed)
    z, w = (int(v) for v in rng.integers(129, 256, 2))
    zs = np.array([z], np.uint8)
    for c in (1, 0):
        cs = np.array([c], np.int32)
        folded, loaded = np.full(5, 7, np.int32), np.full(5, 5, np.int32)
        run(MIXED.format(z=f"u8({z})", w=f"u8({w})"), cs, zs, folded)
        run(MIXED.format(z="load(Z)", w=f"u8({w})"), cs, zs, loaded)
        zc = z if c else 0
        want = [(z + w) % 256, (zc + w) % 256, (zc + w) % 256, (zc + w) % 256, (0 - w) % 256]
        assert loaded.tolist() == want
        assert folded.tolist() == want, (c, z, w)


def test_a_float_literal_next_to_a_typed_f16_constant_is_f16() -> None:
    src = ("@kernel\ndef k(O: ptr[f32]):\n    static_assert(maximum(f16(0.1), 0.5).dtype == f16)\n"
           "    static_assert(minimum(2, bf16(0.5)).dtype == bf16)\n    store(O, maximum(f16(0.1), 0.3))\n")
    o = np.full(1, 7.0, np.float32)
    run(src, o)
    assert o[0] == np.float32(np.float16(0.3))


# -- a typed constant carried through a run-time loop ---------------------------------------------------------
LOOP_U8 = """
@kernel
def k(X: ptr[u8], Z: ptr[u8], O: ptr[i32], n: i32):
    acc = {init}
    for i in range(n):
        acc = acc + load(X + i)
    static_assert(acc.dtype == u8)
    store(O, acc)
    m = {init}
    j = 0
    while j < n:
        m = m * load(X + j)
        j = j + 1
    static_assert(m.dtype == u8)
    store(O + 1, m)
"""

LOOP_F16 = """
@kernel
def k(X: ptr[f16], Z: ptr[f16], O: ptr[f32], n: i32):
    acc = {init}
    for i in range(n):
        acc = acc + load(X + i)
    static_assert(acc.dtype == f16)
    store(O, acc)
"""


@pytest.mark.parametrize("seed", range(3))
def test_a_typed_constant_keeps_its_type_through_a_run_time_loop(seed: int) -> None:
    """``acc = u8(z)`` then ``acc = acc + x_u8`` in a loop: a u8 accumulator (wraps at 256), as
    ``acc = load(Z)``. It was carried as i32 (the placeholder of the loop's trial run took the
    literal type of the constant's value): the sum did not wrap. Likewise ``f16(z)`` was carried as
    f32 (the sum was not rounded to f16 at each step)."""
    rng = np.random.default_rng(seed)
    n = 9
    x = rng.integers(1, 256, n).astype(np.uint8)
    z = int(rng.integers(1, 256))
    zs = np.array([z], np.uint8)
    folded, loaded = np.full(2, 7, np.int32), np.full(2, 5, np.int32)
    run(LOOP_U8.format(init=f"u8({z})"), x, zs, folded, n)
    run(LOOP_U8.format(init="load(Z)"), x, zs, loaded, n)
    want = [(z + int(x.sum())) % 256, int(np.prod([z, *x.tolist()], dtype=object)) % 256]
    assert loaded.tolist() == want
    assert folded.tolist() == want

    xf = (rng.standard_normal(n) * 100).astype(np.float16)
    zf = np.float16(rng.standard_normal() * 1000)
    acc = np.float64(zf)
    for v in xf:  # float64 sum of two f16 values is exact: rounded once to f16 per step
        acc = np.float64(np.float16(acc + np.float64(v)))
    fo, lo = np.full(1, 7.0, np.float32), np.full(1, 5.0, np.float32)
    run(LOOP_F16.format(init=f"f16({float(zf)!r})"), xf, np.array([zf]), fo, n)
    run(LOOP_F16.format(init="load(Z)"), xf, np.array([zf]), lo, n)
    assert lo[0] == np.float32(acc)
    assert fo[0] == np.float32(acc)


def test_a_loop_that_assigns_a_typed_constant_carries_its_type() -> None:
    """``x = 0.0`` then ``x = f16(0.1)`` in a run-time loop: x is carried as f16, as when the loop
    assigns a run-time f16 value (``x = load(X).to(f16)``). It was SP0226 ("enters the loop as f32
    and leaves an iteration as f16"): the carried type came from the literal before the loop."""
    rng = np.random.default_rng(11)
    v = float(rng.uniform(-10, 10))
    src = ("@kernel\ndef k(X: ptr[f32], O: ptr[f32], n: i32):\n    x = 0.0\n    for i in range(n):\n"
           "        x = {body}\n    static_assert(x.dtype == f16)\n    store(O, x)\n")
    xs = np.array([v], np.float32)
    folded, loaded = np.full(1, 7.0, np.float32), np.full(1, 5.0, np.float32)
    run(src.format(body=f"f16({v!r})"), xs, folded, 3)
    run(src.format(body="load(X).to(f16)"), xs, loaded, 3)
    want = np.float32(np.float16(np.float32(v)))
    assert loaded[0] == want
    assert folded[0] == np.float32(np.float16(v))


# -- tf32(c) of an integer ----------------------------------------------------------------------------------
def _tf32_rna(v: float) -> float:
    """``v`` (an f32 value) rounded to tf32's 11 significant bits, ties away from zero (cvt.rna)."""
    bits = int(np.array([v], np.float32).view(np.uint32)[0])
    bits = ((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF
    return float(np.array([bits], np.uint32).view(np.float32)[0])


def test_tf32_of_an_integer_constant_rounds_as_the_run_time_conversion() -> None:
    """``tf32(2049)`` is 2050.0, as ``x.to(tf32)`` of an i64 2049 at run time (to f32, then
    ``cvt.rna.tf32.f32``); the constant was 2049.0 (rounded to f32 only)."""
    rng = np.random.default_rng(7)
    vals = [2049, -2049, 4097, 2**62 + 2**51, *(int(v) for v in rng.integers(-2**40, 2**40, 5))]
    n = len(vals)
    src = ("@kernel\ndef k(X: ptr[i64], G: ptr[f32], W: ptr[f32]):\n"
           + "".join(f"    store(G + {j}, tf32({v}))\n" for j, v in enumerate(vals))
           + "".join(f"    store(W + {j}, load(X + {j}).to(tf32))\n" for j in range(n)))
    got, want = np.full(n, 7.0, np.float32), np.full(n, 5.0, np.float32)
    run(src, np.array(vals, np.int64), got, want)
    ref = [_tf32_rna(float(np.float32(v))) for v in vals]
    assert want.tolist() == ref
    assert got.tolist() == ref


# -- full() of a typed constant ---------------------------------------------------------------------------
def test_full_converts_a_typed_constant_as_at_run_time() -> None:
    """``full(shape, u8(255), i8)`` is -1 and ``full(shape, f32(3e9), i32)`` 2147483647: the value is
    converted to the tile's type (rule 8), as ``full`` of a run-time ``u8`` / ``f32`` value. Both were
    SP0303 (the typed constant was checked as an untyped literal, which must fit)."""
    rng = np.random.default_rng(5)
    u, f = int(rng.integers(128, 256)), float(np.float32(rng.uniform(3e9, 4e9)))
    body = "    i = arange(0, 4)\n    store(O + i, full((4,), {u}, i8))\n    store(O + 4 + i, full((4,), {f}, i32))\n"
    src = "@kernel\ndef k(U: ptr[u8], F: ptr[f32], O: ptr[i32]):\n" + body
    us, fs = np.array([u], np.uint8), np.array([f], np.float32)
    folded, loaded = np.full(8, 7, np.int32), np.full(8, 5, np.int32)
    run(src.format(u=f"u8({u})", f=f"f32({f!r})"), us, fs, folded)
    run(src.format(u="load(U)", f="load(F)"), us, fs, loaded)
    want = [u - 256] * 4 + [2**31 - 1] * 4
    assert loaded.tolist() == want
    assert folded.tolist() == want


def test_abs_of_a_typed_constant_with_two_arguments_is_sp0331() -> None:
    """``abs(f16(-2.0), 1)`` raised Python's TypeError from inside the fold (the builtin's ``impl``
    was called without binding its arguments); it is the diagnostic ``abs(-2.0, 1)`` gets."""
    from sparsile.frontend.diagnostics import CompileError
    from sparsile.tests.support import compile_src

    with pytest.raises(CompileError) as e:
        compile_src("@kernel\ndef k(O: ptr[f32]):\n    store(O, abs(f16(-2.0), 1))\n", stop_after="ir", cache=False)
    (d,) = e.value.diagnostics
    assert (d.code, d.message) == ("SP0331", "`abs` failed on compile-time values: abs() takes exactly one "
                                             "argument (2 given)")
    assert (d.span.line, d.span.col) == (3, 18)


# -- ** of integer constants ------------------------------------------------------------------------------
POWER = """
@kernel
def k(O: ptr[{t}]):
    store(O, {expr})
"""


@pytest.mark.parametrize(("t", "expr", "want"), [
    ("i32", "i32(2) ** 3", 8),
    ("u8", "u8(3) ** 5", 243),
    ("i8", "i8(2) ** 7", -128),  # 128 wraps in i8, as i8 multiplication does
    ("u8", "u8(2) ** 8", 0),
    ("i32", "2 ** i32(30)", 2**30),
    ("i64", "i64(3) ** 1000000000000000000", pow(3, 10**18, 2**64) - 2**64 if pow(3, 10**18, 2**64) >= 2**63
     else pow(3, 10**18, 2**64)),
])
def test_a_power_of_integer_constants_folds_and_wraps_to_its_type(t: str, expr: str, want: int) -> None:
    """``i32(2) ** 3`` is 8: ``**`` between constants is Python's (docs/language.md), wrapped to the type
    the product would have. It was SP0309 ("`**` on run-time integers"), the typed fold running the
    run-time op, which integers do not have."""
    out = np.full(1, 7, {"i32": np.int32, "u8": np.uint8, "i8": np.int8, "i64": np.int64}[t])
    run(POWER.format(t=t, expr=expr), out)
    assert int(out[0]) == want


def test_a_negative_exponent_of_integer_constants_is_sp0329() -> None:
    from sparsile.frontend.diagnostics import CompileError

    src = POWER.format(t="f32", expr="f32(i32(2) ** -1)")
    with pytest.raises(CompileError) as e:
        run(src, np.zeros(1, np.float32))
    (d,) = e.value.diagnostics
    assert d.code == "SP0329" and "negative exponent -1" in d.message and "float type" in d.help
    line = src.splitlines()[d.span.line - 1]
    assert line[d.span.col - 1:].startswith("-1")


# -- `.to(D)` of a typed constant, and `max` / `min` of one tuple -------------------------------------------
TO = """
@kernel
def k(Z: ptr[{t}], O: ptr[f32], P: ptr[i8], Q: ptr[i32]):
    z = {z}
    store(O, z.to(f32) + 0.25)
    store(P, z.to(i8))
    store(Q, (z.to(f16) * 0.5).to(i32))
"""


@pytest.mark.parametrize("t,lo,hi", [("u8", 129, 256), ("f32", -300.0, 300.0), ("i16", -30000, 30000)])
def test_to_of_a_typed_constant_is_the_run_time_conversion(t: str, lo: float, hi: float) -> None:
    """``u8(200).to(f32)`` is 200.0 and ``.to(i8)`` wraps (-56), as ``.to`` on a run-time ``u8``: the
    typed constant converts as ``D(c)`` does. It was SP0204 "has no attribute `to`"."""
    rng = np.random.default_rng(4)
    for _ in range(3):
        if t == "f32":
            v: float = float(np.float32(rng.uniform(lo, hi)))
        else:
            v = int(rng.integers(lo, hi))
        zs = np.array([v], getattr(np, {"u8": "uint8", "f32": "float32", "i16": "int16"}[t]))
        outs = [[np.full(1, p, np.float32), np.full(1, p, np.int8), np.full(1, p, np.int32)] for p in (7, 5)]
        run(TO.format(t=t, z=f"{t}({v!r})"), zs, *outs[0])
        run(TO.format(t=t, z="load(Z)"), zs, *outs[1])
        for a, b in zip(*outs, strict=True):
            assert a.tobytes() == b.tobytes(), (t, v, a, b)


MAX_TUPLE = """
@kernel
def k(O: ptr[i32]):
    store(O, {f}((u8({a}), u8({b}))) + {c})
    store(O + 1, {f}(u8({a}), u8({b})) + {c})
"""


@pytest.mark.parametrize("f", ["max", "min"])
def test_max_min_of_a_tuple_of_typed_constants_is_typed(f: str) -> None:
    """``max((u8(a), u8(b))) + c`` wraps at 256 as ``max(u8(a), u8(b)) + c`` does: the tuple
    form folds as the varargs form, to a ``u8`` constant. It was an untyped constant (a + c > 255
    stored unwrapped)."""
    rng = np.random.default_rng(5)
    a, b, c = (int(v) for v in rng.integers(129, 256, 3))  # a + c and b + c exceed 255
    out = np.full(2, 7, np.int32)
    run(MAX_TUPLE.format(f=f, a=a, b=b, c=c), out)
    want = ({"max": max, "min": min}[f](a, b) + c) % 256
    assert out.tolist() == [want, want]


def test_to_of_an_infinite_typed_constant_to_an_integer_type_is_sp0303() -> None:
    """``f32(1e39).to(i32)`` has no value, as ``i32(f32(1e39))``: SP0303 at the constant."""
    from sparsile.frontend.diagnostics import CompileError

    src = "@kernel\ndef k(O: ptr[i32]):\n    store(O, f32(1e39).to(i32))\n"
    with pytest.raises(CompileError) as e:
        run(src, np.full(1, 7, np.int32))
    d = e.value.diagnostics[0]
    assert (d.code, d.message) == ("SP0303", "inf has no value in i32")
    assert (d.span.line, d.span.col, d.span.end_col) == (3, 14, 23)


UNTYPED_TO = """
@kernel
def k(X: ptr[i32], O: ptr[i64], F: ptr[f16], B: ptr[f32]):
    x = load(X + arange(0, 8))
    for i in static_range(3):
        store(O + i * 8 + arange(0, 8), x.to(i64) * {a} + {i_to})
    c = {c}
    store(F + arange(0, 8), x.to(f16) + {c_to})
    store(B + arange(0, 8), x.to(f32) + {b_to})
"""


def test_to_of_an_untyped_constant_is_the_function_form() -> None:
    """``i.to(i64)`` of a ``static_range`` variable (an untyped constant) computes ``to(i, i64)``;
    so do ``c.to(f16)`` of a float constant and ``(1 > 0).to(f32)`` of a constant comparison. It was
    SP0204 "0 has no attribute `to`" (found by the program fuzzer, seed 174)."""
    rng = np.random.default_rng(6)
    xs = rng.integers(-2**20, 2**20, 8).astype(np.int32)
    a = int(rng.integers(2**31, 2**40))
    c = float(np.float32(rng.uniform(-100, 100)))
    outs = [[np.full(24, p, np.int64), np.full(8, p, np.float16), np.full(8, p, np.float32)] for p in (7, 5)]
    run(UNTYPED_TO.format(a=a, c=c, i_to="i.to(i64)", c_to="c.to(f16)", b_to="(1 > 0).to(f32)"), xs, *outs[0])
    run(UNTYPED_TO.format(a=a, c=c, i_to="to(i, i64)", c_to="to(c, f16)", b_to="to(1 > 0, f32)"), xs, *outs[1])
    for got, want in zip(*outs, strict=True):
        assert got.tobytes() == want.tobytes()
    want_o = np.concatenate([xs.astype(np.int64) * a + i for i in range(3)])
    assert outs[0][0].tolist() == want_o.tolist()


TO_OF_A_CONSTANT = """
@kernel
def k(O64: ptr[f64], O16: ptr[f16], OU: ptr[u64]):
    c = {c}
    store(O64, {to64})
    store(O16, {to16})
    store(OU, {tou})
"""


@pytest.mark.parametrize("form", ["method", "function"])
def test_to_of_an_untyped_constant_converts_as_the_type_constructor(form: str) -> None:
    """``c.to(D)`` and ``to(c, D)`` of an untyped constant convert it as ``D(c)`` does, once, from its
    exact value (docs/language.md: untyped constants are Python's exact values): they made ``c`` an
    ``f32`` (or ``i64``) value first, so ``(0.1).to(f64)`` was 0.10000000149011612, ``1e300`` became
    inf, ``c.to(f16)`` rounded twice, and ``(2**63).to(u64)`` was SP0303 "does not fit in i64"."""
    rng = np.random.default_rng(45)
    # an f64 just above the midpoint of two f16 neighbours, by less than f32 resolves: f32 rounds it to
    # the midpoint, which then rounds to even (down) in f16; rounded once it goes up
    base = float(rng.integers(1024, 2048))  # f16 spacing 1.0 here, f32 spacing 2**-13
    c = base + 0.5 + 2.0**-20
    u = int(rng.integers(2**63, 2**64, dtype=np.uint64))
    big = float(rng.uniform(1e300, 1e301))
    if form == "method":
        body = TO_OF_A_CONSTANT.format(c=repr(c), to64=f"({big!r}).to(f64)", to16="c.to(f16)", tou=f"({u}).to(u64)")
    else:
        body = TO_OF_A_CONSTANT.format(c=repr(c), to64=f"to({big!r}, f64)", to16="to(c, f16)", tou=f"to({u}, u64)")
    o64, o16, ou = np.full(1, np.nan), np.full(1, np.nan, np.float16), np.zeros(1, np.uint64)
    run(body, o64, o16, ou)
    assert (float(o64[0]), float(o16[0]), int(ou[0])) == (big, base + 1.0, u)
    assert float(np.float16(np.float32(c))) == base  # the double rounding the test tells apart
