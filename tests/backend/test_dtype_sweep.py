"""Every math builtin, the float arithmetic that is not one instruction (`/`, `//`, `%`, `**`) and
every conversion, on every element type, for sm_80, sm_90a and sm_100a (and sm_89 for fp8): what
the type rules and the legality pass accept compiles to PTX that ptxas assembles (where ptxas is
installed), and what they refuse is refused with its documented code at the op's line. A
dtype/target combination that reaches the LLVM or ptxas step and fails there (as f64 ``exp`` and
fp8 conversions for sm_80 once did) is a failure here, not a user's internal error.

The refusals the sweep expects (anything else must compile):

* SP0347: a math builtin other than ``frontend/ops/core.py`` ``F64_MATH``, or ``**``, on f64
  (docs/language.md, rules 6 and 10);
* SP0577: a math builtin or arithmetic on fp8, or a conversion to or from fp8 (but fp8 to bool),
  for a target without ``Feature.FP8_CVT`` (below sm_89; docs/ampere.md).
"""

from __future__ import annotations

import pytest

from sparsile.backend.toolchain.linker import assemble_with_ptxas, ptxas_available
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ops.core import F64_MATH, MATH_FUNCS
from sparsile.target.targets import Feature, get_target
from sparsile.tests.support import compile_src

DTYPES = ("bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32", "f64", "tf32",
          "e4m3", "e5m2")
INTS = DTYPES[:9]
FP8 = ("e4m3", "e5m2")
TARGETS = ("sm_80", "sm_89", "sm_90a", "sm_100a")
COMPILED = [(t, target) for target in TARGETS for t in DTYPES if target != "sm_89" or t in FP8]
"""What the accepted sweep compiles: every type for sm_80, sm_90a and sm_100a; for sm_89, the first
target with fp8 conversions, the fp8 types (the others compile there as for sm_80; under 20 s)."""

Case = tuple[str, str]  # (expression of `x`, the element type of its result)


def _cases(t: str) -> list[Case]:
    math = [(f"{fn}(x)", t if fn == "abs" or t not in INTS else "f32") for fn in MATH_FUNCS]
    arith = [] if t == "bool" else [("x / x", "f32" if t in INTS else t), ("x // x", t), ("x % x", t)]
    if t not in INTS:
        arith.append(("x ** x", t))  # `**` on run-time integers is SP0309
    return math + arith + [(f"x.to({u})", u) for u in DTYPES]


def _expected(t: str, expr: str, target: str) -> str | None:
    """The code the case must be refused with on ``target``, None where it must compile."""
    fn = expr.split("(")[0]
    if t == "f64" and ((fn in MATH_FUNCS and fn not in F64_MATH) or expr == "x ** x"):
        return "SP0347"
    dst = expr[5:-1] if expr.startswith("x.to(") else t
    converts = (dst != t and dst != "bool") or not expr.startswith("x.to(")  # fp8 -> bool tests the bits
    if converts and _no_fp8_cvt(target) and (t in FP8 or dst in FP8):
        return "SP0577"
    return None


def _no_fp8_cvt(target: str) -> bool:
    return Feature.FP8_CVT not in get_target(target).features


def _kernel(t: str, cases: list[Case]) -> str:
    params = ", ".join([f"X: ptr[{t}]"] + [f"Y{j}: ptr[{r}]" for j, (_, r) in enumerate(cases)])
    body = [f"    store(Y{j} + i, {e})" for j, (e, _) in enumerate(cases)]
    return "\n".join(["@kernel", f"def k({params}):", "    i = arange(0, 32)", "    x = load(X + i)", *body]) + "\n"


FIRST_LINE = 5
"""The line of the first case's store in :func:`_kernel`'s source."""


def test_the_sweep_covers_every_math_builtin_and_type() -> None:
    assert len(_cases("f32")) == len(MATH_FUNCS) + 4 + len(DTYPES) == 34
    assert len(_cases("i32")) == 33 and len(_cases("bool")) == 30


@pytest.mark.parametrize(("t", "target"), COMPILED)
def test_accepted_combinations_compile_through_ptx(t: str, target: str) -> None:
    ok = [c for c in _cases(t) if _expected(t, c[0], target) is None]
    ptx = compile_src(_kernel(t, ok), target, cache=False).ptx
    if ptxas_available():
        proc = assemble_with_ptxas(ptx, get_target(target))
        assert proc.returncode == 0, proc.stderr


def _refused(t: str, target: str) -> dict[str, list[Case]]:
    by_code: dict[str, list[Case]] = {}
    for c in _cases(t):
        code = _expected(t, c[0], target)
        if code is not None:
            by_code.setdefault(code, []).append(c)
    return by_code


REFUSING = [(t, target) for target in TARGETS for t in DTYPES if _refused(t, target)]


def test_the_refusals_are_f64_math_and_fp8_below_sm89() -> None:
    # below sm_89 every type has its `.to(e4m3)`; from sm_89 on only f64's transcendental math is left
    assert REFUSING == [(t, "sm_80") for t in DTYPES] + [("f64", t) for t in TARGETS[1:]]


@pytest.mark.parametrize(("t", "target"), REFUSING)
def test_refused_combinations_are_diagnosed_at_their_line(t: str, target: str) -> None:
    by_code = _refused(t, target)
    for code, cases in by_code.items():  # one kernel per code: sema errors stop before legality runs
        with pytest.raises(CompileError) as info:
            compile_src(_kernel(t, cases), target, "llvm", cache=False)
        got = sorted((d.span.line, d.code) for d in info.value.diagnostics)
        assert got == [(FIRST_LINE + j, code) for j in range(len(cases))], [d.message for d in info.value.diagnostics]
