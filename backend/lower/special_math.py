"""f32 ``tanh`` and ``erf`` on the GPU: short polynomial kernels around the approximate PTX ``ex2`` and
``rcp`` (docs/language.md, "Promotion and arithmetic", rule 10, gives their accuracy).

Neither is one instruction that fits: PTX has no ``erf``, and ``tanh.approx.f32`` (PTX ISA,
"Floating Point Instructions: tanh", sm_75+) is documented only to a relative error of 2**-11, far
from the few ulp of the other math builtins (and of Triton's libdevice ``tanh``). LLVM 22's
``llvm.tanh.f32`` is no way round it: without ``afn`` the NVPTX selector aborts the process
("Cannot select: ftanh"), with ``afn`` it is that same ``tanh.approx.f32``.

Both kernels use an odd polynomial in ``s = x * x`` for ``|x| < 1`` and an exponential beyond; the
coefficients are this project's own weighted least-squares (Lawson) fits, rounded to f32, and are
read by ``tests/backend/test_special_math.py``, which models the instruction sequence with the ISA's
error bounds for ``ex2.approx`` / ``rcp.approx`` and checks the documented bound against float64.
"""

from __future__ import annotations

from .codegen import CodeGen
from .llvm_text import LLValue, const

LOG2E = 1.4426950408889634

SMALL = 1.0
"""Both kernels take the polynomial for ``|x| < SMALL`` (and for NaN), the exponential form beyond."""

TANH_POLY = (-0.33333295583724976, 0.13332344591617584, -0.05387980118393898, 0.021486656740307808,
             -0.007946105673909187, 0.0023013639729470015, -0.0003584517980925739)
"""``p(s)`` (lowest degree first) with ``tanh(x) ~ x + x * s * p(s)``, ``s = x * x``, ``|x| < 1``:
relative error of the fit 2**-27.7."""

TANH_EXP_SCALE = 2.0 * LOG2E
"""``|x| >= 1``: ``tanh|x| = 1 - 2 / (1 + 2**(|x| * 2 log2 e))``."""

ERF_POLY = (0.12837916612625122, -0.3761262595653534, 0.1128358542919159, -0.026853812858462334,
            0.005188328679651022, -0.0008010201272554696, 7.853884744690731e-05)
"""``q(s)`` (lowest degree first) with ``erf(x) ~ x + x * q(s)``, ``s = x * x``, ``|x| < 1``:
relative error of the fit 2**-29.6."""

ERFC_LOG2_POLY = (-0.0004927112604491413, -1.6260459423065186, -0.9206483960151672, -0.1487516164779663,
                  0.03150567412376404, -0.004252573475241661, 0.00026888848515227437)
"""``r(a)`` (lowest degree first) with ``log2(erfc(a)) ~ r(a)`` on ``1 <= a <= 4``, so that
``erf|x| = 1 - 2**r(min(|x|, 4))`` (erf rounds to 1 in f32 from |x| = 3.92 on); the fit's error,
weighted by its effect on erf, is 2**-29.8."""

ERFC_CLAMP = 4.0

EX2_MAX_REL_ERROR = 2.0 ** -22
"""What the bounds below assume of ``ex2.approx.f32``: within 2 ulp of 2**x (PTX ISA, "Floating Point
Instructions: ex2"; the relative error of 2 ulp is at most 2**-22); ``rcp.approx.ftz.f32`` within 1 ulp of
the correctly rounded reciprocal (PTX ISA, "Floating Point Instructions: rcp")."""

TANH_MAX_ULP = 3.0
"""Documented bound (docs/language.md, rule 10): the f32 ``tanh`` is within this many ulp of the exact
value (ulp of the f32 it rounds to); the model of this sequence reaches 2.4."""

ERF_MAX_ULP = 2.0
"""As :data:`TANH_MAX_ULP` for ``erf``; the model reaches 1.8."""


def _horner(cg: CodeGen, coeffs: tuple[float, ...], v: LLValue) -> LLValue:
    """``sum(coeffs[k] * v**k)`` by Horner's rule, one ``fma.rn.f32`` per step."""
    p = const(coeffs[-1], "float")
    for c in reversed(coeffs[:-1]):
        r = cg.intrinsic("float", "llvm.fma.f32", [p, v, const(c, "float")])
        assert r is not None
        p = r
    return p


def _f(cg: CodeGen, name: str, args: list[LLValue]) -> LLValue:
    r = cg.intrinsic("float", name, args)
    assert r is not None
    return r


def _pick(cg: CodeGen, x: LLValue, a: LLValue, small: LLValue, big: LLValue) -> LLValue:
    """``small`` where ``|x| < SMALL`` or ``x`` is NaN (``small`` is then NaN), else ``big``; with the
    sign of ``x`` (both functions are odd; ``fma(-0, t, -0)`` would give tanh(-0) = +0)."""
    r = cg.fb.select(cg.fb.fcmp("ult", a, const(SMALL, "float")), small, big)
    return _f(cg, "llvm.copysign.f32", [r, x])


def tanh_f32(cg: CodeGen, x: LLValue) -> LLValue:
    """``tanh(x)`` of an f32 value (docs/language.md, rule 10: within :data:`TANH_MAX_ULP`)."""
    fb = cg.fb
    a = _f(cg, "llvm.fabs.f32", [x])
    s = fb.binop("fmul", x, x)
    t = fb.binop("fmul", s, _horner(cg, TANH_POLY, s))
    small = _f(cg, "llvm.fma.f32", [x, t, x])
    # 1 + e >= 4 is never subnormal, and rcp.approx.ftz of an infinite 1 + e is 0 (tanh = 1)
    e = _f(cg, "llvm.nvvm.ex2.approx.f", [fb.binop("fmul", a, const(TANH_EXP_SCALE, "float"))])
    q = _f(cg, "llvm.nvvm.rcp.approx.ftz.f", [fb.binop("fadd", e, const(1.0, "float"))])
    big = _f(cg, "llvm.fma.f32", [const(-2.0, "float"), q, const(1.0, "float")])
    return _pick(cg, x, a, small, big)


def erf_f32(cg: CodeGen, x: LLValue) -> LLValue:
    """``erf(x)`` of an f32 value (docs/language.md, rule 10: within :data:`ERF_MAX_ULP`)."""
    fb = cg.fb
    a = _f(cg, "llvm.fabs.f32", [x])
    s = fb.binop("fmul", x, x)
    small = _f(cg, "llvm.fma.f32", [x, _horner(cg, ERF_POLY, s), x])
    b = _f(cg, "llvm.minnum.f32", [a, const(ERFC_CLAMP, "float")])
    e = _f(cg, "llvm.nvvm.ex2.approx.f", [_horner(cg, ERFC_LOG2_POLY, b)])
    big = fb.binop("fsub", const(1.0, "float"), e)
    return _pick(cg, x, a, small, big)
