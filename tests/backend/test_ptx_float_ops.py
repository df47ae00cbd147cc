"""The float arithmetic of the CPU PTX executor (tests/backend/ptx_float.py) against an independent
rational model (tests/backend/ptx_float_reference.py): ``add`` / ``sub`` / ``mul`` / ``fma`` /
``div`` / ``sqrt`` / ``rcp`` in every rounding on f32, f16, bf16 and f64 (and packed f16x2), on
random bit patterns, edge values and operands built to land on or next to rounding ties; the NaN
and signed-zero rules of ``min`` / ``max`` / ``setp`` / ``testp`` / ``copysign``; float literals in
a kernel; the instructions it refuses."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from sparsile.tests.backend.address_eval import UnknownInstruction
from sparsile.tests.backend.ptx_exec import run_program
from sparsile.tests.backend.ptx_float import float_op
from sparsile.tests.backend.ptx_float_reference import BITS, round_mode, same, sqrt_rounded, values
from sparsile.tests.support.op_table_reference import FMTS

MODES = ("rn", "rz", "rm", "rp")


def operand_bits(t: str, n: int, seed: int, near: np.ndarray | None = None) -> np.ndarray:
    """``n`` bit patterns of ``t``: edge values, random bits and (with ``near``) patterns a few
    ulps from ``near``'s or scaled by powers of two around the precision (sums that tie)."""
    rng = np.random.default_rng(seed)
    w = BITS[t]
    f = FMTS[t]
    top = np.uint64((1 << w) - 1) if w < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    edge = [0.0, -0.0, 1.0, -1.0, 1.5, 3.0, f.max, -f.max, f.min_normal, f.min_subnormal, -f.min_subnormal,
            math.inf, -math.inf, math.nan, 1 + f.ulp(1.0), 0.1]
    edge_bits = np.array([_bits_of(v, t) for v in edge], np.uint64)
    raw = rng.integers(0, 2**62, n, dtype=np.int64).astype(np.uint64) * np.uint64(3) & top
    out = np.concatenate([edge_bits, raw])[:n]
    if near is not None:
        k = n // 2
        delta = rng.integers(-3, 4, k).astype(np.int64).astype(np.uint64)
        out[:k] = (near[:k] + delta) & top
        shift = rng.integers(f.p - 3, f.p + 3, n - k)
        sign = np.uint64(1 << (w - 1))
        scaled = [_bits_of(math.ldexp(v, -int(s)), t) if math.isfinite(v) and v != 0 else int(b) for v, s, b in
                  zip(values(near[k:], t), shift, near[k:], strict=True)]
        flip = rng.integers(0, 2, n - k).astype(np.uint64) * sign
        out[k:] = np.array(scaled, np.uint64) ^ flip
    return out


def _bits_of(v: float, t: str) -> int:
    """The bits of ``v`` rounded to ``t`` (to nearest)."""
    if math.isnan(v):
        return {"f64": 0x7FF8000000000000, "f32": 0x7FC00000, "f16": 0x7E00, "bf16": 0x7FC0}[t]
    r = round_mode(Fraction(v), t, "rn", negative_zero=math.copysign(1, v) < 0) if math.isfinite(v) else v
    if t == "bf16":
        return int(np.array([r], np.float32).view(np.uint32)[0]) >> 16
    dt = {"f64": np.float64, "f32": np.float32, "f16": np.float16}[t]
    return int(np.array([r], dt).view(f"u{np.dtype(dt).itemsize}")[0])


def reference(base: str, mode: str, t: str, xs: list[float]) -> float:
    """The exact result of ``base`` on the operand values, rounded once by ``mode``."""
    if not all(math.isfinite(x) for x in xs) or (base in ("div", "rcp") and xs[-1] == 0):
        with np.errstate(all="ignore"):
            a = [np.float64(x) for x in xs]
            v = {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "mul": lambda: a[0] * a[1],
                 "fma": lambda: a[0] * a[1] + a[2], "div": lambda: a[0] / a[1], "rcp": lambda: 1 / a[0],
                 "sqrt": lambda: np.sqrt(a[0])}[base]()
        return float(v) if not math.isfinite(v) or v == 0 else round_mode(Fraction(float(v)), t, mode)
    q = [Fraction(x) for x in xs]
    neg = [math.copysign(1, x) < 0 for x in xs]
    if base == "sqrt":
        if xs[0] < 0:
            return math.nan
        return xs[0] if xs[0] == 0 else sqrt_rounded(xs[0], t, mode)
    if base in ("mul", "div", "rcp"):
        if base == "rcp":
            q, neg = [Fraction(1), q[0]], [False, neg[0]]
        exact = q[0] * q[1] if base == "mul" else q[0] / q[1]
        return round_mode(exact, t, mode, negative_zero=neg[0] != neg[1])
    if base == "sub":
        q[1], neg[1] = -q[1], not neg[1]
    if base == "fma":
        q, neg = [q[0] * q[1], q[2]], [neg[0] != neg[1], neg[2]]
    exact = q[0] + q[1]
    both_zero_same = q[0] == 0 and q[1] == 0 and neg[0] == neg[1]
    return round_mode(exact, t, mode, negative_zero=neg[0] if both_zero_same else mode == "rm")


CASES = [(base, t, mode) for t in ("f32", "f16", "bf16", "f64") for base in ("add", "sub", "mul") for mode in MODES]
CASES += [("fma", t, "rn") for t in ("f16", "bf16")] + [("fma", t, m) for t in ("f32", "f64") for m in MODES]
CASES += [(b, t, m) for b in ("div", "sqrt", "rcp") for t in ("f32", "f64") for m in MODES]


@pytest.mark.parametrize("base, t, mode", CASES)
def test_arithmetic_is_exactly_rounded(base: str, t: str, mode: str) -> None:
    n = 400 if t == "f64" else 1500
    seed = sum(map(ord, base + t + mode))
    arity = {"fma": 3, "sqrt": 1, "rcp": 1}.get(base, 2)
    a = operand_bits(t, n, seed)
    ops = [a] + [operand_bits(t, n, seed + k, near=a) for k in range(1, arity)]
    if base == "fma":  # c near -a*b: cancellation, and sums next to the product's ties
        prods = [Fraction(x) * Fraction(y) if math.isfinite(x * y) else Fraction(0)
                 for x, y in zip(values(ops[0], t), values(ops[1], t), strict=True)]
        guess = np.array([_bits_of(float(-p * (1 + Fraction(k % 5 - 2, 2**30))), t) if abs(p) < FMTS[t].max
                          else 0 for k, p in enumerate(prods)], np.uint64)
        ops[2] = np.where(np.arange(n) % 2 == 0, guess, ops[2])
    got = values(float_op(f"{base}.{mode}.{t}", ops), t)
    xs = list(zip(*(values(o, t) for o in ops), strict=True))
    bad = [(x, g, reference(base, mode, t, list(x))) for x, g in zip(xs, got, strict=True)
           if not same(g, reference(base, mode, t, list(x)))]
    assert not bad, f"{base}.{mode}.{t}: {len(bad)} differ, e.g. (operands, got, exact) {bad[:4]}"


def test_fma_rounds_once() -> None:
    """(1 + 2**-12)**2 + 2**-80: the product ties between two f32 values, the addend decides
    (a float64 product-sum rounded again to f32 would round the tie to even, down)."""
    a = np.array([0x3F800800], np.uint64)  # 1 + 2**-12
    c = np.array([0x17800000], np.uint64)  # 2**-80
    got = values(float_op("fma.rn.f32", [a, a, c]), "f32")[0]
    assert got == 1 + 2**-11 + 2**-23


def test_packed_f16x2_is_lane_by_lane() -> None:
    a = np.array([0x3C00_4000], np.uint64)  # (low 2.0, high 1.0)
    b = np.array([0xBC00_3800], np.uint64)  # (low 0.5, high -1.0)
    assert int(float_op("add.rn.f16x2", [a, b])[0]) == 0x0000_4100  # (low 2.5, high +0.0)
    assert int(float_op("mul.rn.bf16x2", [np.array([0x3F80_4000], np.uint64)] * 2)[0]) == 0x3F80_4080


NAN32, QNAN32 = 0x7FC00000, 0x7FFFFFFF


def f32(*vals: float | int) -> np.ndarray:
    return np.array([v if isinstance(v, int) else int(np.float32(v).view(np.uint32)) for v in vals], np.uint64)


def test_min_max_nan_and_zero_rules() -> None:
    """A NaN operand gives the other operand; both NaN (or either, with ``.NaN``) a NaN; ``+0.0``
    above ``-0.0`` in either order (PTX ISA, "min" / "max")."""
    a, b = f32(NAN32, 1.5, NAN32, -0.0, 0.0, -2.0), f32(3.0, NAN32, NAN32, 0.0, -0.0, -3.0)
    assert values(float_op("max.f32", [a, b]), "f32")[:2] == [3.0, 1.5]
    assert math.isnan(values(float_op("max.f32", [a, b]), "f32")[2])
    mx, mn = values(float_op("max.f32", [a, b]), "f32")[3:], values(float_op("min.f32", [a, b]), "f32")[3:]
    assert [math.copysign(1, v) for v in mx[:2]] == [1, 1] and mx[2] == -2.0
    assert [math.copysign(1, v) for v in mn[:2]] == [-1, -1] and mn[2] == -3.0
    assert all(math.isnan(v) for v in values(float_op("max.NaN.f32", [a, b]), "f32")[:3])


def test_setp_ordered_unordered_num_nan() -> None:
    a, b = f32(1.0, NAN32, -0.0, 2.0), f32(1.0, 1.0, 0.0, 1.0)
    table = {"eq": [1, 0, 1, 0], "ne": [0, 0, 0, 1], "lt": [0, 0, 0, 0], "ge": [1, 0, 1, 1], "equ": [1, 1, 1, 0],
             "neu": [0, 1, 0, 1], "ltu": [0, 1, 0, 0], "gtu": [0, 1, 0, 1], "num": [1, 0, 1, 1], "nan": [0, 1, 0, 0]}
    for cmp, want in table.items():
        assert float_op(f"setp.{cmp}.f32", [a, b]).tolist() == want, cmp


def test_testp_copysign_abs_neg() -> None:
    x = f32(1.0, 2.0**-130, 0.0, math.inf, NAN32)
    table = {"finite": [1, 1, 1, 0, 0], "infinite": [0, 0, 0, 1, 0], "number": [1, 1, 1, 1, 0],
             "notanumber": [0, 0, 0, 0, 1], "normal": [1, 0, 0, 0, 0], "subnormal": [0, 1, 0, 0, 0]}
    for kind, want in table.items():
        assert float_op(f"testp.{kind}.f32", [x]).tolist() == want, kind
    # copysign d, a, b: b's magnitude, a's sign
    assert values(float_op("copysign.f32", [f32(-1.0, 1.0), f32(2.5, -0.0)]), "f32") == [-2.5, 0.0]
    assert values(float_op("abs.f64", [np.array([0x8000000000000001], np.uint64)]), "f64") == [5e-324]
    assert int(float_op("neg.bf16", [np.array([0x3F80], np.uint64)])[0]) == 0xBF80


PTX = """.visible .entry k(.param .u64 k_param_0) {
  .reg .b32 %f<4>; .reg .b64 %fd<3>; .reg .b64 %rd<3>; .reg .b16 %rs<2>;
  ld.param.u64 %rd1, [k_param_0];
  mov.f32 %f1, 0f3FC00000;
  add.rn.f32 %f2, %f1, 0f40200000;
  mov.b16 %rs1, 0x3E00;
  cvt.f32.f16 %f3, %rs1;
  st.global.f32 [%rd1], %f2;
  st.global.f32 [%rd1+4], %f3;
  mov.f64 %fd1, 0d3FF8000000000000;
  st.global.f64 [%rd1+8], %fd1;
  ret;
}
"""


def test_float_literals_in_a_kernel() -> None:
    out = np.full(4, np.nan, np.float32)
    run_program(PTX, 1, 0, [out])
    assert out[:2].tolist() == [4.0, 1.5] and out[2:].view(np.float64)[0] == 1.5


@pytest.mark.parametrize("op, arity", [
    ("add.ftz.f32", 2), ("add.rn.ftz.f32", 2), ("add.sat.f32", 2), ("mul.f32", 2), ("fma.rn.ftz.f32", 3),
    ("fma.rn.sat.f32", 3), ("ex2.approx.f32", 1), ("lg2.approx.f32", 1), ("sin.approx.f32", 1),
    ("tanh.approx.f32", 1), ("div.approx.f32", 2), ("div.full.f32", 2), ("sqrt.approx.f32", 1),
    ("rcp.approx.ftz.f32", 1), ("rsqrt.approx.f32", 1), ("min.xorsign.abs.f32", 2), ("max.relu.f16", 2),
    ("setp.lt.and.f32", 3), ("max.f32", 3), ("add.rn.f32", 3), ("testp.normal.f16", 1), ("setp.lt.f16x2", 2),
])
def test_inexact_or_unmodeled_instructions_are_refused(op: str, arity: int) -> None:
    with pytest.raises(UnknownInstruction):
        float_op(op, [f32(1.0, 2.0)] * arity)
