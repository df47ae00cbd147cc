"""The GPU's ``tanh`` and ``erf`` (backend/lower/special_math.py): a numpy model of the exact
instruction sequence (f32 roundings, ``fma.rn`` rounded once, ``ex2.approx`` / ``rcp.approx`` off by
the most the bounds the module assumes allow, both ways) stays within the documented ulp bounds
(docs/language.md, rule 10) against float64; the PTX is that sequence on every target (opcodes and
the coefficients), and ptxas assembles it."""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest

from sparsile.backend.lower import special_math as S
from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.interp.numerics import fma_f32
from sparsile.target.targets import get_target
from sparsile.tests.support import compile_src

F32 = np.float32
TARGETS = ("sm_80", "sm_90a", "sm_100a")


# -- the model ----------------------------------------------------------------------------------
def _ex2(v: np.ndarray, way: int) -> np.ndarray:
    """2**v off by ``way`` times the largest relative error assumed of ``ex2.approx.f32``."""
    with np.errstate(all="ignore"):
        return (np.exp2(v.astype(np.float64)) * (1 + way * S.EX2_MAX_REL_ERROR)).astype(F32)


def _rcp(v: np.ndarray, way: int) -> np.ndarray:
    """1 / v correctly rounded, then 1 ulp up (``way`` 1), down (-1) or not (0); 0 for a huge v (ftz)."""
    with np.errstate(all="ignore"):
        r = (1.0 / v.astype(np.float64)).astype(F32)
    r = np.where(np.abs(r) < F32(2.0 ** -126), F32(0), r)
    if way:
        r = np.where(r == 0, r, np.nextafter(r, F32(np.inf) if way > 0 else F32(0)))
    return r.astype(F32)


def _horner(coeffs: tuple[float, ...], v: np.ndarray) -> np.ndarray:
    p = np.full_like(v, F32(coeffs[-1]))
    for c in reversed(coeffs[:-1]):
        p = fma_f32(p, v, np.full_like(v, F32(c)))
    return p


def _pick(x: np.ndarray, small: np.ndarray, big: np.ndarray) -> np.ndarray:
    return np.copysign(np.where(~(np.abs(x) >= F32(S.SMALL)), small, big), x).astype(F32)


def tanh_model(x: np.ndarray, ex2_way: int = 0, rcp_way: int = 0) -> np.ndarray:
    with np.errstate(all="ignore"):
        s = (x * x).astype(F32)
        small = fma_f32(x, (s * _horner(S.TANH_POLY, s)).astype(F32), x)
        e = _ex2((np.abs(x) * F32(S.TANH_EXP_SCALE)).astype(F32), ex2_way)
        q = _rcp((e + F32(1)).astype(F32), rcp_way)
        big = fma_f32(np.full_like(q, F32(-2)), q, np.ones_like(q))
    return _pick(x, small, big)


def erf_model(x: np.ndarray, ex2_way: int = 0) -> np.ndarray:
    with np.errstate(all="ignore"):
        s = (x * x).astype(F32)
        small = fma_f32(x, _horner(S.ERF_POLY, s), x)
        b = np.minimum(np.abs(x), F32(S.ERFC_CLAMP))
        big = (F32(1) - _ex2(_horner(S.ERFC_LOG2_POLY, b), ex2_way)).astype(F32)
    return _pick(x, small, big)


def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in ulp of the f32 that ``exact`` rounds to."""
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact.astype(F32))).astype(np.float64)


def _grid() -> np.ndarray:
    """Every 397th f32 from 2**-30 to 12 (all binades the polynomials and exponentials see), every
    f32 within 2**14 ulp of the switch at 1 and the clamp at 4, both signs."""
    lo, hi = F32(2.0 ** -30).view(np.int32), F32(12.0).view(np.int32)
    parts = [np.arange(lo, hi, 397, dtype=np.int32)]
    for edge in (S.SMALL, S.ERFC_CLAMP):
        b = int(F32(edge).view(np.int32))
        parts.append(np.arange(b - 2**14, b + 2**14, dtype=np.int32))
    x = np.concatenate(parts).view(F32)
    return np.concatenate([x, -x[::5]])


GRID = _grid()


@pytest.mark.parametrize(("ex2_way", "rcp_way"), [(e, r) for e in (-1, 0, 1) for r in (-1, 0, 1)])
def test_tanh_model_is_within_the_documented_bound(ex2_way: int, rcp_way: int) -> None:
    err = ulp_error(tanh_model(GRID, ex2_way, rcp_way), np.tanh(GRID.astype(np.float64)))
    assert err.max() <= S.TANH_MAX_ULP, (err.max(), GRID[np.argmax(err)])


@pytest.mark.parametrize("ex2_way", [-1, 0, 1])
def test_erf_model_is_within_the_documented_bound(ex2_way: int) -> None:
    exact = np.array([math.erf(v) for v in GRID.astype(np.float64).tolist()])
    err = ulp_error(erf_model(GRID, ex2_way), exact)
    assert err.max() <= S.ERF_MAX_ULP, (err.max(), GRID[np.argmax(err)])


def test_model_special_values() -> None:
    """+-inf -> +-1, NaN -> NaN, 0 keeps its sign, a subnormal x gives x (tanh), 2 x / sqrt(pi) (erf);
    large |x| gives exactly +-1."""
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -3e-39, 9.5, -50.0, 20.0, -1e30], F32)
    for way in (-1, 0, 1):
        t, e = tanh_model(x, way, way), erf_model(x, way)
        assert t[[0, 1]].tolist() == [1.0, -1.0] and e[[0, 1]].tolist() == [1.0, -1.0]
        assert np.isnan(t[2]) and np.isnan(e[2])
        assert np.array_equal(np.signbit(t[3:5]), [False, True]) and np.array_equal(np.signbit(e[3:5]), [False, True])
        assert t[5:7].tolist() == x[5:7].tolist()
        assert e[5:7].tolist() == (x[5:7].astype(np.float64) * (2 / math.sqrt(math.pi))).astype(F32).tolist()
        assert t[7:].tolist() == [1.0, -1.0, 1.0, -1.0] and e[7:].tolist() == [1.0, -1.0, 1.0, -1.0]


# -- the PTX ------------------------------------------------------------------------------------
SCALAR = """
@kernel
def k(A: ptr[f32], Q: ptr[f32]):
    store(Q + program_id(0), {fn}(load(A + program_id(0))))
"""

TILE = """
@kernel
def k(A: ptr[{t}], Q: ptr[{t}], n: i32):
    i = program_id(0) * 256 + arange(0, 256)
    x = load(A + i, mask=i < n)
    store(Q + i, {fn}(x) + {fn}(x * 0.5), mask=i < n)
"""

HORNER = ["fma.rn.f32"] * 6
SEQUENCE = {
    "tanh": ["abs.f32", "mul.rn.f32", *HORNER, "mul.rn.f32", "fma.rn.f32", "mul.rn.f32", "ex2.approx.f32",
             "add.rn.f32", "rcp.approx.ftz.f32", "fma.rn.f32", "setp.ltu.f32", "selp.f32", "copysign.f32"],
    "erf": ["abs.f32", "mul.rn.f32", *HORNER, "fma.rn.f32", "min.f32", *HORNER, "ex2.approx.f32", "mov.b32",
            "sub.rn.f32", "setp.ltu.f32", "selp.f32", "copysign.f32"],
}
COEFFS = {"tanh": (*S.TANH_POLY, S.TANH_EXP_SCALE, -2.0), "erf": (*S.ERF_POLY, *S.ERFC_LOG2_POLY, S.ERFC_CLAMP)}


def _ptx_immediate(v: float) -> str:
    return "0f{:08X}".format(struct.unpack("<I", struct.pack("<f", v))[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", ["tanh", "erf"])
def test_ptx_is_the_modelled_sequence(fn: str, target: str) -> None:
    ptx = compile_src(SCALAR.format(fn=fn), target=target, stop_after="ptx", cache=False).ptx
    body = ptx[ptx.index("ld.global"):ptx.index("st.global")]
    ops = [m.group(1) for m in re.finditer(r"^\s*([a-z][\w.]*)\s", body, re.M)]
    assert [o for o in ops if o.endswith((".f32", ".b32")) and not o.startswith("ld.")] == SEQUENCE[fn], body
    for c in COEFFS[fn]:
        assert _ptx_immediate(c) in body, (c, body)
    assert "tanh.approx" not in ptx and "call" not in body


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", ["tanh", "erf"])
@pytest.mark.parametrize("t", ["f32", "bf16", "f16"])
def test_ptxas_assembles(fn: str, target: str, t: str) -> None:
    ptx = compile_src(TILE.format(fn=fn, t=t), target=target, stop_after="ptx", cache=False).ptx
    res = assemble_with_ptxas(ptx, get_target(target))
    assert res.returncode == 0, res.stderr
