"""Interpreter scalars are 0-d numpy arrays, tiles are n-d arrays: numpy 1.x promoted the two
differently (value-based casting, replaced by NEP 50 in numpy 2), so an op on a scalar could give
another result than the same op on a tile. Each test here has an exact answer (Python ints, or the
tile path) that holds under both rules: the interpreter gives operands of one dtype to numpy, and
does not rely on either rule (these tests failed on numpy 1.26 before it did; pyproject now asks
numpy 2.0, see docs/language.md §Promotion and arithmetic for the semantics)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp

U64_MAX = 2**64 - 1


def kernel(src: str):
    return sp.loads(src, "case.spk").kernels["k"]


def test_u64_scalar_integer_ops_are_exact() -> None:
    # numpy 1.26: `np.where(c, 0, u64_scalar)` is an f64, so // % << >> lost the low bits
    k = kernel("""
@kernel
def k(a: u64, b: u64, out: ptr[u64]):
    store(out + 0, a // b)
    store(out + 1, a % b)
    store(out + 2, a >> 1)
    store(out + 3, a << 1)
    store(out + 4, cdiv(a, b))
    store(out + 5, a % 3)
    store(out + 6, a // 0)
""")
    for a, b in [(U64_MAX - 2, 2**62 + 1), (2**63 + 12345, 7), (U64_MAX, U64_MAX - 1)]:
        out = np.zeros(7, np.uint64)
        k.interpret[(1,)](a, b, out)
        want = [a // b, a % b, a >> 1, (a << 1) % 2**64, (a + b - 1) % 2**64 // b, a % 3, 0]  # cdiv wraps as `+`
        assert [int(v) for v in out] == want, (a, b)


@pytest.mark.parametrize("t,dt", [("f32", np.float32), ("f64", np.float64)])
def test_float_scalar_to_u64_saturates(t: str, dt: type) -> None:
    # numpy 1.26: the saturated 2**64 - 1 went through f64 and came back as 0
    k = kernel(f"""
@kernel
def k(x: ptr[{t}], out: ptr[u64]):
    i = program_id(0)
    store(out + i, load(x + i).to(u64))
""")
    x = np.array([1e30, np.inf, -1.0, np.nan, 2.0**63, 3.9], dt)
    out = np.zeros(len(x), np.uint64)
    k.interpret[(len(x),)](x, out)
    assert [int(v) for v in out] == [U64_MAX, U64_MAX, 0, 0, 2**63, 3]


def test_tf32_rounding_of_a_scalar() -> None:
    # numpy 1.26: a 0-d u64 plus a Python int was an f64, and `&` on it raised (an internal error)
    k = kernel("""
@kernel
def k(x: f32, out: ptr[f32]):
    store(out, x.to(tf32).to(f32))
""")
    for x, want in [(1.0 + 2.0**-12, 1.0), (1.0 + 2.0**-11, 1.0 + 2.0**-10), (-(1.0 + 3 * 2.0**-11), -(1.0 + 2.0**-9))]:
        out = np.zeros(1, np.float32)
        k.interpret[(1,)](x, out)
        assert out[0] == np.float32(want), x


SCALAR_VS_TILE = """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], S: ptr[{t}], T: ptr[{t}], N: constexpr):
    i = program_id(0)
    store(S + i, {expr})
    o = arange(0, N)
    a = load(A + o)
    b = load(B + o)
    store(T + o, {tile_expr})
"""
CASES = [("f32", "sigmoid(a)"), ("f32", "rsqrt(a)"), ("f32", "a * 0.1 + 1"), ("f16", "a * 0.1 + b"),
         ("bf16", "sigmoid(a) + b"), ("e4m3", "a * 0.5 + b"), ("i8", "a * 3 - b"), ("u32", "(a - b) * 7"),
         ("u32", "a.to(f32) * 0.1"), ("i64", "a >> 3"), ("u64", "a // b + a % b"), ("u64", "(a >> 5) ^ b")]


@pytest.mark.parametrize("t,expr", CASES)
def test_an_op_on_scalars_equals_the_op_on_a_tile(t: str, expr: str) -> None:
    dt = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
          "i8": np.int8, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}[t]
    n = 32
    rng = np.random.default_rng(5)
    if np.issubdtype(np.dtype(dt), np.integer):
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        b = rng.integers(max(info.min, -50), 50, n, dtype=dt, endpoint=True) | np.array(1, dt)  # never 0
    else:
        a = rng.uniform(0.01, 20.0, n).astype(np.float32).astype(dt)
        b = rng.uniform(-3.0, 3.0, n).astype(np.float32).astype(dt)
    scalar = re.sub(r"\bb\b", "load(B + i)", re.sub(r"\ba\b", "load(A + i)", expr))
    k = kernel(SCALAR_VS_TILE.format(t=t, expr=scalar, tile_expr=expr))
    s, tile = np.zeros(n, dt), np.zeros(n, dt)
    k.interpret[(n,)](a, b, s, tile, N=n)
    assert s.view(np.uint8).tobytes() == tile.view(np.uint8).tobytes()
    if t == "u64":  # and both are right
        ref = {"a // b + a % b": lambda x, y: x // y + x % y, "(a >> 5) ^ b": lambda x, y: (x >> 5) ^ y}[expr]
        assert [int(v) for v in tile] == [ref(int(x), int(y)) for x, y in zip(a, b)]
