"""``cvt`` with float types in the CPU PTX executor (tests/backend/ptx_fcvt.py) against an independent
rational model (tests/backend/ptx_float_reference.py): narrowing float conversions in every
rounding, tf32 (``.rna``), the packed fp8 forms (``.satfinite``, which value goes to which byte),
integers to floats in every rounding (64-bit values next to ties), floats to integers (integer
roundings, saturation, NaN to 0) and rounding to an integral float; the register formats' decoding
against numpy and ml_dtypes; the conversions it refuses."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from sparsile.tests.backend.address_eval import UnknownInstruction
from sparsile.tests.backend.ptx_fcvt import convert
from sparsile.tests.backend.ptx_float_reference import BITS, round_mode, same, values
from sparsile.tests.backend.ptx_fround import FORMATS, decode
from sparsile.tests.support.op_table_reference import FMTS

MODES = ("rn", "rz", "rm", "rp")


@pytest.mark.parametrize("t", ["f16", "bf16", "e4m3", "e5m2"])
def test_decode_matches_numpy_and_ml_dtypes(t: str) -> None:
    pytest.importorskip("ml_dtypes")
    bits = np.arange(1 << BITS[t], dtype=np.uint64)
    want, got = values(bits, t), decode(bits, FORMATS[t]).tolist()
    assert all(same(g, w) for g, w in zip(got, want, strict=True))


def sources(src: str, dst: str, n: int, seed: int) -> np.ndarray:
    """Bit patterns of ``src``: random bits, and values of ``dst`` moved by a fraction of their ulp
    (exactly half of it among them: ties) or near its limits."""
    rng = np.random.default_rng(seed)
    w, f = BITS[src], FMTS[dst]
    top = (1 << w) - 1
    raw = (rng.integers(0, 2**62, n // 2, dtype=np.int64).astype(np.uint64) * np.uint64(3)) & np.uint64(top)
    vals = []
    for k in range(n - n // 2):
        base = float(rng.standard_normal() * 2.0 ** int(rng.integers(f.emin - f.p, f.emax + 1)))
        base = round_mode(Fraction(base), dst, "rn")
        if math.isinf(base):
            base = math.copysign(f.max, base)
        step = Fraction(f.ulp(base)) * Fraction(int(rng.integers(-4, 5)), 8)
        vals.append(float(Fraction(base) + step) if k % 7 else [f.max, -f.max, f.min_subnormal / 2][k % 3])
    dt = {"f64": np.float64, "f32": np.float32}[src]
    with np.errstate(over="ignore"):
        near = np.array(vals, np.float64).astype(dt).view(f"u{w // 8}").astype(np.uint64)
    return np.concatenate([raw, near])


def ref_convert(x: float, dst: str, mode: str, satfinite: bool = False) -> float:
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return math.copysign(FMTS[dst].max, x) if satfinite or FMTS[dst].saturates else x
    return round_mode(Fraction(x), dst, mode, negative_zero=math.copysign(1, x) < 0, satfinite=satfinite)


@pytest.mark.parametrize("src, dst", [("f64", "f32"), ("f64", "f16"), ("f64", "bf16"), ("f32", "f16"), ("f32", "bf16")])
@pytest.mark.parametrize("mode", MODES)
def test_narrowing_float_conversions_are_exactly_rounded(src: str, dst: str, mode: str) -> None:
    x = sources(src, dst, 2000, sum(map(ord, src + dst + mode)))
    got = values(convert(f"cvt.{mode}.{dst}.{src}", [x]), dst)
    bad = [(v, g, ref_convert(v, dst, mode)) for v, g in zip(values(x, src), got, strict=True)
           if not same(g, ref_convert(v, dst, mode))]
    assert not bad, f"cvt.{mode}.{dst}.{src}: {len(bad)} differ, e.g. (x, got, exact) {bad[:4]}"


def test_tf32_rounds_to_nearest_ties_away_into_the_top_19_bits() -> None:
    x = sources("f32", "tf32", 2000, 7)
    got = convert("cvt.rna.tf32.f32", [x])
    assert not (got & np.uint64(0x1FFF)).any()
    want = [ref_convert(v, "tf32", "rna") for v in values(x, "f32")]
    assert all(same(g, w) for g, w in zip(values(got, "f32"), want, strict=True))
    assert values(convert("cvt.rna.tf32.f32", [np.array([0x3F801000], np.uint64)]), "f32") == [1 + 2**-10]


@pytest.mark.parametrize("t", ["e4m3", "e5m2"])
def test_fp8_pairs_saturate_and_pack_a_high(t: str) -> None:
    pytest.importorskip("ml_dtypes")
    a, b = sources("f32", t, 1000, 11), sources("f32", t, 1000, 12)[::-1].copy()
    got = convert(f"cvt.rn.satfinite.{t}x2.f32", [a, b])
    assert not (got >> np.uint64(16)).any()
    for byte, src in ((got >> np.uint64(8), a), (got & np.uint64(0xFF), b)):
        want = [ref_convert(v, t, "rn", satfinite=True) for v in values(src, "f32")]
        assert all(same(g, w) for g, w in zip(values(byte, t), want, strict=True))
    every = np.arange(256, dtype=np.uint64)
    wide = convert(f"cvt.rn.f16x2.{t}x2", [every | (np.uint64(0x38) << np.uint64(8))])  # (high byte: 0x38)
    assert all(same(g, w) for g, w in zip(values(wide & np.uint64(0xFFFF), "f16"), values(every, t), strict=True))
    assert set(values(wide >> np.uint64(16), "f16")) == set(values(np.array([0x38], np.uint64), t))


INT_PROBES = [0, 1, -1, 2**24 + 1, 2**24 + 3, 2**53 + 1, 2**53 + 3, 2**63 - 1, -(2**63), 2**62 + 2**38 + 1,
              2**31 - 1, -(2**31), 65519, 65520, -65520, 2**64 - 1, 2**64 - 2**39, 2**63 + 2**39 + 1, 3 * 2**52 + 1]


@pytest.mark.parametrize("src", ["s64", "u64", "s32", "u32", "s16", "u16"])
@pytest.mark.parametrize("dst", ["f64", "f32", "f16", "bf16"])
def test_integer_to_float_is_exactly_rounded(src: str, dst: str) -> None:
    w = int(src[1:])
    rng = np.random.default_rng(w + len(dst))
    ints = [v & ((1 << w) - 1) for v in INT_PROBES]
    ints += [int(v) * 3 % (1 << w) for v in rng.integers(0, 2**62, 300, dtype=np.int64)]
    ints += [(1 << int(k)) + int(d) for k, d in zip(rng.integers(0, w - 1, 200), rng.integers(-9, 9, 200),
                                                    strict=True) if 0 <= (1 << int(k)) + int(d) < (1 << w)]
    x = np.array(ints, np.uint64)
    for mode in MODES:
        got = values(convert(f"cvt.{mode}.{dst}.{src}", [x]), dst)
        exact = [v - (1 << w) if src[0] == "s" and v >> (w - 1) else v for v in ints]
        want = [round_mode(Fraction(v), dst, mode) for v in exact]
        bad = [(v, g, e) for v, g, e in zip(exact, got, want, strict=True) if not same(g, e)]
        assert not bad, f"cvt.{mode}.{dst}.{src}: {bad[:4]}"


@pytest.mark.parametrize("src", ["f32", "f64"])
@pytest.mark.parametrize("dst", ["s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64"])
def test_float_to_integer_rounds_saturates_and_gives_0_for_nan(src: str, dst: str) -> None:
    w = int(dst[1:])
    lo, hi = (-(2 ** (w - 1)), 2 ** (w - 1) - 1) if dst[0] == "s" else (0, 2**w - 1)
    probes = [0.5, -0.5, 1.5, 2.5, -2.5, -0.0, 0.0, hi + 0.5, hi + 1.0, lo - 0.5, lo - 1.0, lo, -1e30, 1e30,
              2.0**63, -(2.0**63), 2.0**64, 2.0**64 - 2**40, math.inf, -math.inf, math.nan, 255.5, -128.5]
    rng = np.random.default_rng(w)
    dt = {"f64": np.float64, "f32": np.float32}[src]
    vals = np.concatenate([np.array(probes), rng.standard_normal(300) * 2.0 ** rng.integers(0, 70, 300)]).astype(dt)
    x = vals.view(f"u{BITS[src] // 8}").astype(np.uint64)
    rounding = {"rni": lambda q: round(q), "rzi": math.trunc, "rmi": math.floor, "rpi": math.ceil}
    for irnd, fn in rounding.items():
        got = convert(f"cvt.{irnd}.{dst}.{src}", [x]).tolist()
        want = [0 if math.isnan(v) else min(max(fn(Fraction(v)) if math.isfinite(v) else int(math.copysign(2**70, v)),
                                                lo), hi) & ((1 << w) - 1) for v in values(x, src)]
        bad = [(v, g, e) for v, g, e in zip(values(x, src), got, want, strict=True) if g != e]
        assert not bad, f"cvt.{irnd}.{dst}.{src}: {bad[:4]}"


@pytest.mark.parametrize("t", ["f32", "f64", "f16", "bf16"])
def test_rounding_to_an_integral_float(t: str) -> None:
    probes = [0.5, -0.5, 1.5, 2.5, -2.5, -0.25, 0.0, -0.0, 3.75, -3.75, 1e30, math.inf, -math.inf, math.nan, 2**-140]
    x = np.array([_bits(p, t) for p in probes], np.uint64)
    xs = values(x, t)
    for irnd, fn in {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}.items():
        got = values(convert(f"cvt.{irnd}.{t}.{t}", [x]), t)
        assert all(same(g, float(fn(v))) for g, v in zip(got, xs, strict=True)), (irnd, got)


def _bits(v: float, t: str) -> int:
    r = ref_convert(v, t, "rn")
    if t == "bf16":
        return int(np.array([r], np.float32).view(np.uint32)[0]) >> 16
    dt = {"f64": np.float64, "f32": np.float32, "f16": np.float16}[t]
    return int(np.array([r], dt).view(f"u{np.dtype(dt).itemsize}")[0])


@pytest.mark.parametrize("op", ["cvt.rn.ftz.f32.f64", "cvt.rn.relu.f16.f32", "cvt.f16.f32", "cvt.rn.f32.f16",
                                "cvt.s32.f32", "cvt.rn.s32.f32", "cvt.rzi.f16.f32", "cvt.rn.sat.f32.f64",
                                "cvt.rn.e4m3x2.f32", "cvt.rz.satfinite.e4m3x2.f32", "cvt.rna.tf32.f64",
                                "cvt.rni.f32.s32"])
def test_unmodeled_conversions_are_refused(op: str) -> None:
    x = np.array([0x3F800000], np.uint64)
    with pytest.raises(UnknownInstruction):
        convert(op, [x, x])
