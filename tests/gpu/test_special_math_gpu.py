"""``tanh`` and ``erf`` run on the GPU against float64: f32 within the documented ulp bounds
(docs/language.md, rule 10; backend/lower/special_math.py) over a sweep of every binade, around the
switch between the two forms, and the special values; 16-bit results within one ulp of the type
(one rounding of the f32 value)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower import special_math as S

pytestmark = pytest.mark.gpu

SRC = """
@kernel
def k(A: ptr[{t}], T: ptr[{t}], E: ptr[{t}], n: i32):
    i = program_id(0) * 256 + arange(0, 256)
    m = i < n
    x = load(A + i, mask=m)
    store(T + i, tanh(x), mask=m)
    store(E + i, erf(x), mask=m)
"""

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, -3e-39, 1.1754942e-38, 3.4028235e38,
                    -3.4028235e38, 1.0, -1.0, 0.99999994, -1.0000001, 3.92, -3.93, 4.0, 9.01, 44.4, -100.0],
                   np.float32)


def _sweep() -> np.ndarray:
    """Every 1009th f32 from 2**-149 to 16, every f32 within 2**12 ulp of 1 and of 4, both signs."""
    parts = [np.arange(1, np.float32(16.0).view(np.int32), 1009, dtype=np.int32)]
    for edge in (S.SMALL, S.ERFC_CLAMP):
        b = int(np.float32(edge).view(np.int32))
        parts.append(np.arange(b - 2**12, b + 2**12, dtype=np.int32))
    x = np.concatenate(parts).view(np.float32)
    return np.concatenate([SPECIAL, x, -x[::3]])


def _run(x: np.ndarray, t: str) -> tuple[np.ndarray, np.ndarray]:
    kern = sp.loads(SRC.format(t=t), "case.spk").kernels["k"]
    tanh_out, erf_out = np.full_like(x, np.nan), np.full_like(x, np.nan)
    kern[(sp.cdiv(len(x), 256),)](x, tanh_out, erf_out, len(x))
    return tanh_out, erf_out


def _exact(x: np.ndarray) -> dict[str, np.ndarray]:
    x64 = x.astype(np.float64)
    return {"tanh": np.tanh(x64), "erf": np.array([math.erf(v) for v in x64.tolist()])}


def _ulps(got: np.ndarray, exact: np.ndarray, dt: type) -> np.ndarray:
    """|got - exact| in ulp of the ``dt`` value ``exact`` rounds to (NaN where both are NaN: 0)."""
    r = np.abs(exact.astype(dt))
    spacing = np.nextafter(r, np.array(np.inf, dt)).astype(np.float64) - r.astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(got.astype(np.float64) - exact) / spacing
    both_nan = np.isnan(got.astype(np.float64)) & np.isnan(exact)
    same_inf = np.isinf(exact) & (got.astype(np.float64) == exact)
    return np.where(both_nan | same_inf, 0.0, err)


def test_f32_within_the_documented_bounds() -> None:
    x = _sweep()
    tanh_out, erf_out = _run(x, "f32")
    exact = _exact(x)
    for fn, got, bound in (("tanh", tanh_out, S.TANH_MAX_ULP), ("erf", erf_out, S.ERF_MAX_ULP)):
        err = _ulps(got, exact[fn], np.float32)
        worst = int(np.nanargmax(err))
        assert not np.any(np.isnan(err)) and err[worst] <= bound, (fn, float(x[worst]), float(got[worst]), err[worst])


def test_f32_special_values() -> None:
    """+-inf -> +-1, NaN -> NaN, zeros keep their sign, a subnormal x: tanh x = x exactly."""
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -3e-39, 50.0, -1e30], np.float32)
    t, e = _run(x, "f32")
    assert t[[0, 1, 7, 8]].tolist() == [1.0, -1.0, 1.0, -1.0] and e[[0, 1, 7, 8]].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert np.isnan(t[2]) and np.isnan(e[2])
    assert np.signbit(t[3:5]).tolist() == [False, True] and np.signbit(e[3:5]).tolist() == [False, True]
    assert t[5:7].tolist() == x[5:7].tolist()


@pytest.mark.parametrize(("t", "dt"), [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_16_bit_types_round_the_f32_value_once(t: str, dt: type) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([SPECIAL[np.abs(SPECIAL) < 6e4], rng.normal(0, 2.5, 20000),
                        np.exp2(rng.uniform(-24, 15, 20000)) * rng.choice([-1.0, 1.0], 20000)]).astype(dt)
    tanh_out, erf_out = _run(x, t)
    exact = _exact(x.astype(np.float32))
    for fn, got in (("tanh", tanh_out), ("erf", erf_out)):
        err = _ulps(got, exact[fn], dt)
        worst = int(np.argmax(err))
        assert err[worst] <= 1.0, (fn, float(x[worst]), float(got[worst]), err[worst])
