"""The numpy interpreter against float64 numpy references, on random (never all-zero) inputs and
on sizes that are not multiples of the block (so that masks matter)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.module import loads
from sparsile.frontend.interp.values import InterpreterError

RNG = np.random.default_rng(1234)

SIZES = (1, 100, 1000, 1025)


def compile_one(source: str):
    return next(iter(loads(source, "t.spk").kernels.values()))


def random(shape, dtype=np.float32, lo=-4.0, hi=4.0) -> np.ndarray:
    x = RNG.uniform(lo, hi, size=shape)
    x[x == 0] = 0.5
    return x.astype(dtype)


# ------------------------------------------------------------------------------------ elementwise
ELEMENTWISE_F = [
    ("x + y", lambda x, y: x + y),
    ("x - y", lambda x, y: x - y),
    ("x * y", lambda x, y: x * y),
    ("x / y", lambda x, y: x / y),
    ("x // y", lambda x, y: np.floor(x / y)),
    ("x % y", lambda x, y: np.fmod(x, y)),
    ("maximum(x, y)", np.maximum),
    ("minimum(x, y)", np.minimum),
    ("where(x > y, x, y * 2)", lambda x, y: np.where(x > y, x, y * 2)),
    ("exp(x)", lambda x, y: np.exp(x)),
    ("log(abs(x) + 1)", lambda x, y: np.log(np.abs(x) + 1)),
    ("sqrt(abs(y))", lambda x, y: np.sqrt(np.abs(y))),
    ("abs(x) - x * 0.5", lambda x, y: np.abs(x) - x * 0.5),
    ("-x + 1", lambda x, y: -x + 1),
    ("x if False else y", lambda x, y: y),
    ("(x < y).to(f32) + (x >= y).to(f32) * 2", lambda x, y: (x < y) + (x >= y) * 2.0),
    ("sigmoid(x)", lambda x, y: 1 / (1 + np.exp(-x))),
    ("exp2(x) + log2(abs(y))", lambda x, y: np.exp2(x) + np.log2(np.abs(y))),
    ("rsqrt(abs(x)) + floor(y) + ceil(x)", lambda x, y: 1 / np.sqrt(np.abs(x)) + np.floor(y) + np.ceil(x)),
    ("sin(x) * cos(y)", lambda x, y: np.sin(x) * np.cos(y)),
]


def elementwise_kernel(expr: str, dtype: str, out_dtype: str | None = None) -> str:
    return f"""
@kernel
def k(xp: ptr[{dtype}], yp: ptr[{dtype}], out: ptr[{out_dtype or dtype}], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    mask = offs < n
    x = load(xp + offs, mask=mask, other=1)
    y = load(yp + offs, mask=mask, other=1)
    store(out + offs, {expr}, mask=mask)
"""


def run_elementwise(expr: str, dtype, n: int, block: int = 256, out_dtype=None):
    name = {np.float32: "f32", np.float16: "f16", np.int32: "i32", ml_dtypes.bfloat16: "bf16", np.int8: "i8",
            np.uint8: "u8"}
    k = compile_one(elementwise_kernel(expr, name[dtype], name[out_dtype] if out_dtype else None))
    x, y = random(n, dtype), random(n, dtype)
    sentinel = 12345 if np.issubdtype(np.dtype(out_dtype or dtype), np.integer) else 777.0
    out = np.full(n + 7, sentinel, dtype=out_dtype or dtype)  # past the end must stay untouched
    k.interpret[((n + block - 1) // block,)](x, y, out, n, BLOCK=block)
    return x, y, out


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("expr", "ref"), ELEMENTWISE_F, ids=[e for e, _ in ELEMENTWISE_F])
def test_elementwise_f32(expr: str, ref, n: int) -> None:
    x, y, out = run_elementwise(expr, np.float32, n)
    want = ref(x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(out[:n], want, rtol=2e-6, atol=1e-6)
    assert np.all(out[n:] == 777.0)


@pytest.mark.parametrize("expr", ["x + y", "x * y", "x - y", "x / y"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_precision_arithmetic_rounds_once(expr: str, dtype) -> None:
    x, y, out = run_elementwise(expr, dtype, 300)
    ref = dict(ELEMENTWISE_F)[expr](x.astype(np.float64), y.astype(np.float64)).astype(dtype)
    assert np.array_equal(out[:300], ref)  # exact: one rounding of the exact result


def test_half_precision_math_is_within_one_ulp() -> None:
    x, y, out = run_elementwise("exp(x) + sqrt(abs(y))", np.float16, 500)
    ref = np.exp(x.astype(np.float64)) + np.sqrt(np.abs(y.astype(np.float64)))
    np.testing.assert_allclose(out[:500].astype(np.float64), ref, rtol=2 * 2.0**-10)


def c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.trunc(a.astype(np.float64) / b).astype(np.int64)


ELEMENTWISE_I = [
    ("x + y", lambda x, y: x + y),
    ("x - y * 3", lambda x, y: x - y * 3),
    ("x // y", c_div),
    ("x % y", lambda x, y: x - y * c_div(x, y)),
    ("(x & y) | (x ^ 5)", lambda x, y: (x & y) | (x ^ 5)),
    ("(x << 2) + (y >> 1)", lambda x, y: (x << 2) + (y >> 1)),
    ("maximum(x, y) - minimum(x, 0)", lambda x, y: np.maximum(x, y) - np.minimum(x, 0)),
    ("abs(x) + ~y", lambda x, y: np.abs(x) + ~y),
    ("cdiv(abs(x) + 1, 3)", lambda x, y: (np.abs(x) + 1 + 2) // 3),
    ("where((x > 0) and (y > 0), 1, 0)", lambda x, y: ((x > 0) & (y > 0)).astype(np.int64)),
    ("(x / y).to(i32)", lambda x, y: np.trunc(x / y)),
]


@pytest.mark.parametrize(("expr", "ref"), ELEMENTWISE_I, ids=[e for e, _ in ELEMENTWISE_I])
def test_elementwise_i32_uses_c_semantics(expr: str, ref) -> None:
    k = compile_one(elementwise_kernel(expr, "i32"))
    n = 999
    x = RNG.integers(-1000, 1000, n).astype(np.int32)
    y = RNG.integers(1, 50, n).astype(np.int32) * RNG.choice([-1, 1], n).astype(np.int32)
    out = np.zeros(n, np.int32)
    k.interpret[(4,)](x, y, out, n, BLOCK=256)
    assert np.array_equal(out, ref(x.astype(np.int64), y.astype(np.int64)).astype(np.int32))


# ------------------------------------------------------------------------------------ casts
def test_float_to_int_truncates_and_saturates() -> None:
    k = compile_one("""
@kernel
def k(xp: ptr[f32], a: ptr[i32], b: ptr[u8], c: ptr[i8], BLOCK: constexpr):
    offs = arange(0, BLOCK)
    x = load(xp + offs)
    store(a + offs, x.to(i32))
    store(b + offs, x.to(u8))
    store(c + offs, x.to(i8))
""")
    x = np.array([1.7, -1.7, 300.5, -300.5, 3e10, -3e10, np.nan, 0.49, 127.9, -128.9, 255.5, 256.0,
                  np.inf, -np.inf, 2.5, -0.5], np.float32)
    a, b, c = np.zeros(16, np.int32), np.zeros(16, np.uint8), np.zeros(16, np.int8)
    k.interpret[(1,)](x, a, b, c, BLOCK=16)
    t = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0, posinf=1e300, neginf=-1e300)
    assert np.array_equal(a, np.clip(t, -(2**31), 2**31 - 1).astype(np.int64))
    assert np.array_equal(b, np.clip(t, 0, 255))
    assert np.array_equal(c, np.clip(t, -128, 127))


def test_float_narrowing_rounds_to_nearest_even() -> None:
    k = compile_one("""
@kernel
def k(xp: ptr[f32], h: ptr[f16], b: ptr[bf16], f: ptr[f32], BLOCK: constexpr):
    offs = arange(0, BLOCK)
    x = load(xp + offs)
    store(h + offs, x.to(f16))
    store(b + offs, x.to(bf16))
    store(f + offs, (x.to(i32) + 1).to(f32) + x.to(bool).to(f32))
""")
    x = random(64)
    h, b, f = np.zeros(64, np.float16), np.zeros(64, ml_dtypes.bfloat16), np.zeros(64, np.float32)
    k.interpret[(1,)](x, h, b, f, BLOCK=64)
    assert np.array_equal(h, x.astype(np.float16))
    assert np.array_equal(b, x.astype(ml_dtypes.bfloat16))
    assert np.array_equal(f, np.trunc(x) + 1 + (x != 0))


# ------------------------------------------------------------------------------------ 2-D, reductions
REDUCE = """
@kernel
def k(xp: ptr[f32], s0: ptr[f32], s1: ptr[f32], mx: ptr[f32], mn: ptr[f32], am: ptr[i32],
      rows: i32, cols: i32, R: constexpr, C: constexpr):
    r = arange(0, R)
    c = arange(0, C)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    x = load(xp + r[:, None] * cols + c[None, :], mask=mask, other=0.0)
    store(s0 + c, sum(x, axis=0), mask=c < cols)
    store(s1 + r, x.sum(axis=1), mask=r < rows)
    big = load(xp + r[:, None] * cols + c[None, :], mask=mask, other=-float("inf"))
    store(mx + r, max(big, axis=1), mask=r < rows)
    small = where(mask, x, float("inf"))
    store(mn + c, min(small, axis=0), mask=c < cols)
    store(am + r, argmax(big, axis=1), mask=r < rows)
"""


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 7), (16, 32), (13, 29)])
def test_reductions_over_an_axis_with_masks(rows: int, cols: int) -> None:
    k = compile_one(REDUCE)
    x = random((rows, cols))
    s0, mn = np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    s1, mx, am = np.zeros(rows, np.float32), np.zeros(rows, np.float32), np.zeros(rows, np.int32)
    k.interpret[(1,)](x, s0, s1, mx, mn, am, rows, cols, R=16, C=32)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s0, x64.sum(0), rtol=1e-6, atol=1e-5)  # f32 sums of up to 32 terms
    np.testing.assert_allclose(s1, x64.sum(1), rtol=1e-6, atol=1e-5)
    assert np.array_equal(mx, x.max(1)) and np.array_equal(mn, x.min(0))
    assert np.array_equal(am, x.argmax(1))


def test_whole_tile_reduction_and_scalar_store() -> None:
    k = compile_one("""
@kernel
def k(xp: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    x = load(xp + offs, mask=offs < n)
    store(out + program_id(0), sum(x))
""")
    x = random(1000)
    out = np.full(4, np.nan, np.float32)
    k.interpret[(4,)](x, out, 1000, BLOCK=256)
    blocks = [x[i * 256:(i + 1) * 256].astype(np.float64) for i in range(4)]
    # an f32 sum of 256 terms in any order is within 255 * 2**-24 * sum|x| of the exact one (and the
    # result's own rounding): a bound relative to the total would fail where the terms cancel
    bound = [(255 * 2.0**-24) * np.abs(b).sum() + 2.0**-24 * abs(b.sum()) for b in blocks]
    err = np.abs(out.astype(np.float64) - [b.sum() for b in blocks])
    assert np.all(err <= bound), (err, bound)


def test_grid_2d_num_programs_and_broadcast_store() -> None:
    k = compile_one("""
@kernel
def k(out: ptr[i32], BM: constexpr, BN: constexpr):
    pm = program_id(0)
    pn = program_id(1)
    r = pm * BM + arange(0, BM)
    c = pn * BN + arange(0, BN)
    width = num_programs(1) * BN
    store(out + r[:, None] * width + c[None, :], pm * 100 + pn + zeros((BM, BN), i32))
""")
    out = np.full((3 * 4, 5 * 8), -1, np.int32)
    k.interpret[(3, 5)](out, BM=4, BN=8)
    expected = (np.arange(12)[:, None] // 4) * 100 + np.arange(40)[None, :] // 8
    assert np.array_equal(out, expected)


def test_grid_callable_gets_the_arguments() -> None:
    k = compile_one("""
@kernel
def k(out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, offs.to(f32), mask=offs < n)
""")
    out = np.zeros(70, np.float32)
    k.interpret[lambda meta: ((meta["n"] + meta["BLOCK"] - 1) // meta["BLOCK"],)](out, 70, BLOCK=16)
    assert np.array_equal(out, np.arange(70))


# ------------------------------------------------------------------------------------ loops
def test_row_sums_with_a_runtime_loop_over_chunks() -> None:
    k = compile_one("""
@kernel
def k(xp: ptr[f32], out: ptr[f32], cols: i32, CHUNK: constexpr):
    row = program_id(0)
    acc = zeros((CHUNK,), f32)
    for start in range(0, cols, CHUNK):
        c = start + arange(0, CHUNK)
        acc += load(xp + row * cols + c, mask=c < cols)
    store(out + row, sum(acc))
""")
    x = random((6, 333))
    out = np.zeros(6, np.float32)
    k.interpret[(6,)](x, out, 333, CHUNK=64)
    np.testing.assert_allclose(out, x.astype(np.float64).sum(1), rtol=1e-5)


def test_while_loop_and_runtime_if() -> None:
    k = compile_one("""
@kernel
def k(out: ptr[i32], n: i32):
    steps = 0
    v = n
    while v != 1:
        if v % 2 == 0:
            v = v // 2
        else:
            v = 3 * v + 1
        steps += 1
    store(out + program_id(0), steps)
""")
    def collatz(v: int) -> int:
        s = 0
        while v != 1:
            v, s = (v // 2 if v % 2 == 0 else 3 * v + 1), s + 1
        return s

    for n in (1, 6, 27, 97):
        out = np.zeros(1, np.int32)
        k.interpret[(1,)](out, n)
        assert out[0] == collatz(n)


# ------------------------------------------------------------------------------------ dot and tensors
@pytest.mark.parametrize(("m", "n", "kk"), [(16, 16, 16), (37, 45, 70), (5, 70, 33)])
def test_blocked_matmul_with_dot(m: int, n: int, kk: int) -> None:
    k = compile_one("""
@kernel
def mm(a: ptr[f16], b: ptr[f16], c: ptr[f32], M: i32, N: i32, K: i32, BM: constexpr, BN: constexpr, BK: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rn = program_id(1) * BN + arange(0, BN)
    acc = zeros((BM, BN), f32)
    for k0 in range(0, K, BK):
        rk = k0 + arange(0, BK)
        ta = load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K))
        tb = load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N))
        acc = dot(ta, tb, acc)
    store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
""")
    a, b = random((m, kk), np.float16), random((kk, n), np.float16)
    c = np.zeros((m, n), np.float32)
    k.interpret[((m + 15) // 16, (n + 15) // 16)](a, b, c, m, n, kk, BM=16, BN=16, BK=32)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_integer_dot_is_exact() -> None:
    k = compile_one("""
@kernel
def mm(a: ptr[i8], b: ptr[i8], c: ptr[i32], B: constexpr):
    r = arange(0, B)
    ta = load(a + r[:, None] * B + r[None, :])
    tb = load(b + r[:, None] * B + r[None, :])
    store(c + r[:, None] * B + r[None, :], dot(ta, tb))
""")
    a = RNG.integers(-128, 128, (32, 32)).astype(np.int8)
    b = RNG.integers(-128, 128, (32, 32)).astype(np.int8)
    c = np.zeros((32, 32), np.int32)
    k.interpret[(1,)](a, b, c, B=32)
    assert np.array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_tensor_tiles_fill_zero_outside_and_clip_stores() -> None:
    k = compile_one("""
@kernel
def copy(x: tensor[f32, 2], y: tensor[f32, 2], B: constexpr):
    rows, cols = x.shape
    r0 = program_id(0) * B
    c0 = program_id(1) * B
    t = x.load_tile((r0, c0), (B, B))
    y.store_tile((r0, c0), t * 2.0 + 1.0)
""")
    x = random((21, 13))
    y = np.full((21, 13), 5.0, np.float32)
    k.interpret[(3, 2)](x, y, B=8)
    assert np.array_equal(y, x * 2 + 1)


def test_strided_output_is_written_back() -> None:
    k = compile_one("""
@kernel
def k(out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    store(out + offs, offs.to(f32) + 1.0, mask=offs < n)
""")
    big = np.zeros((4, 10), np.float32)
    view = big[1, ::2]  # not contiguous
    k.interpret[(1,)](view, 5, BLOCK=8)
    assert np.array_equal(big[1, ::2], np.arange(1, 6)) and np.all(big[1, 1::2] == 0) and np.all(big[0] == 0)


# ------------------------------------------------------------------------------------ run-time faults
def test_out_of_bounds_load_is_reported_with_its_line() -> None:
    k = compile_one("@kernel\ndef k(x: ptr[f32], BLOCK: constexpr):\n"
                    "    v = load(x + program_id(0) * BLOCK + arange(0, BLOCK))\n")
    k.interpret[(1,)](np.ones(16, np.float32), BLOCK=16)
    msg = r"t.spk:3:9: out-of-bounds load of `x`: element offset 20 at tile index \(4,\).*program \(1, 0, 0\)"
    with pytest.raises(InterpreterError, match=msg):
        k.interpret[(2,)](np.ones(20, np.float32), BLOCK=16)


def test_masked_out_of_bounds_lanes_are_fine() -> None:
    k = compile_one("@kernel\ndef k(x: ptr[f32], o: ptr[f32], n: i32, B: constexpr):\n"
                    "    i = arange(0, B)\n    store(o + i, load(x + i, mask=i < n, other=-1.0), mask=i < n + 2)\n")
    x, o = random(5), np.zeros(7, np.float32)
    k.interpret[(1,)](x, o, 5, B=8)
    assert np.array_equal(o, np.concatenate([x, [-1.0, -1.0]]))


def test_device_assert_fails_at_run_time() -> None:
    k = compile_one('@kernel\ndef k(n: i32):\n    assert n > 3, "n is too small"\n')
    k.interpret[(1,)](5)
    with pytest.raises(InterpreterError, match="n is too small"):
        k.interpret[(1,)](2)


def test_operation_budget_stops_endless_loops() -> None:
    k = compile_one("@kernel\ndef k(n: i32):\n    i = 0\n    while i < n:\n        i += 0\n")
    with pytest.raises(InterpreterError, match="budget of 500 operations"):
        k.interpret[(1,)](1, max_ops=500)


def test_builtins_raise_outside_kernels() -> None:
    with pytest.raises(RuntimeError, match="only be called inside a kernel"):
        sp.program_id(0)


def test_argmax_over_all_axes_indexes_the_flattened_tile() -> None:
    k = compile_one("""
@kernel
def k(xp: ptr[f32], out: ptr[i32]):
    r = arange(0, 4)
    c = arange(0, 8)
    x = load(xp + r[:, None] * 8 + c[None, :])
    store(out, argmax(x))
    store(out + 1, argmin(x))
""")
    x = random((4, 8))
    out = np.zeros(2, np.int32)
    k.interpret[(1,)](x, out)
    assert list(out) == [x.argmax(), x.argmin()]


def test_tf32_round_is_nearest_ties_away_and_truncate_drops_bits():
    """``x.to(tf32)`` is ``cvt.rna.tf32.f32`` (ties away from zero); an MMA reading raw f32 drops
    the low 13 bits. Both keep NaN and infinities."""
    from sparsile.frontend.interp.numerics import tf32_round, tf32_truncate

    ulp = 2.0 ** -10
    x = np.array([1 + 0.75 * ulp, 1 + 0.5 * ulp, 1 + 0.25 * ulp, -(1 + 0.5 * ulp), 1 + 1.5 * ulp,
                  np.inf, -np.inf, np.nan], np.float32)
    r = tf32_round(x)
    t = tf32_truncate(x)
    np.testing.assert_array_equal(r[:7], np.array([1 + ulp, 1 + ulp, 1, -(1 + ulp), 1 + 2 * ulp, np.inf, -np.inf],
                                                  np.float32))
    np.testing.assert_array_equal(t[:7], np.array([1, 1, 1, -1, 1 + ulp, np.inf, -np.inf], np.float32))
    assert np.isnan(r[7]) and np.isnan(t[7])
    rng = np.random.default_rng(0)
    y = rng.standard_normal(10000).astype(np.float32)
    for z in (tf32_round(y), tf32_truncate(y)):
        assert (z.view(np.uint32) & 0x1FFF == 0).all() and (np.abs(z - y) <= 2.0 ** -10 * np.abs(y)).all()
