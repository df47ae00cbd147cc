"""What "agree" means for each case of the op table (tests/support/op_table_cases.py), and the
runs that compare: the interpreter against the independent reference (the CPU test) and a device
(the GPU, or the interpreter standing in for it) against the interpreter (the GPU test).

* Exact (everything PTX defines exactly: integer ops, IEEE ``.rn`` arithmetic, comparisons,
  selects, conversions, ``sqrt`` / ``floor`` / ``ceil`` / ``abs``, f64 ``rsqrt``): the same bits,
  except that any NaN equals any NaN (PTX gives the canonical NaN, numpy keeps payloads) and the
  sign of a zero counts.
* Approximate (:data:`~.op_table_reference.APPROX` on f32 / 16- / 8-bit floats, and float ``**``):
  NaN where the other is NaN, else ``|x - y|`` within the bound the PTX ISA's stated errors give
  (:func:`~.op_table_reference.approx_bound`), an infinity counting as the first value that
  rounds to it; against the interpreter twice that bound (both are within it of the exact value)
  plus an ulp of each result's rounding to a narrower type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sparsile.tests.support.op_table_cases import Case
from sparsile.tests.support.op_table_reference import (
    APPROX,
    FMTS,
    ideal,
    pow_ideal_and_bound,
    ref_compare,
    ref_convert,
    ref_float_binary,
    ref_int_binary,
    round_op,
    round_to,
    wrap,
)


def decode(a: np.ndarray) -> list:
    """An array's elements as Python values (floats exactly, as float64; integers as int)."""
    if a.dtype == np.bool_:
        return [bool(v) for v in a.tolist()]
    if np.issubdtype(a.dtype, np.integer):
        return [int(v) for v in a.tolist()]
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on NaN
        return np.asarray(a).astype(np.float64).tolist()


def is_approx(case: Case) -> bool:
    return (case.op == "math" and case.kind in APPROX) or (case.op == "arith.binary" and case.kind == "pow")


def _math_exact(fn: str, t: str, x: float) -> float:
    """``sqrt``, ``floor``, ``ceil``, ``abs`` (floats) and f64 ``rsqrt``: exact IEEE results."""
    if math.isnan(x):
        return math.nan
    if fn == "abs":
        return abs(x)
    if fn in ("floor", "ceil"):
        if not math.isfinite(x) or x == 0:
            return x
        r = float(math.floor(x) if fn == "floor" else math.ceil(x))
        return r if r != 0 else math.copysign(0.0, x)
    # sqrt / rsqrt
    if x == 0:
        return x if fn == "sqrt" else math.copysign(math.inf, x)
    if x < 0:
        return math.nan
    if math.isinf(x):
        return x if fn == "sqrt" else 0.0
    s = math.sqrt(x)  # correctly rounded f64; f32 from it: innocuous double rounding (53 >= 2 * 24 + 2)
    if fn == "sqrt":
        return s
    from fractions import Fraction

    return round_to(1 / Fraction(s), "f64")  # 1 / sqrt: two roundings (rule 10)


def expected(case: Case) -> list[tuple[Any, float | None]]:
    """Each element's reference value, with None (exact) or its bound (approximate: the bound of
    one device result, already widened by an ulp of a narrower result type)."""
    t, r = case.t, case.result
    assert r is not None
    ins = {k: decode(v) for k, v in case.inputs.items()}
    a = ins["a"]
    out: list[tuple[Any, float | None]] = []
    if case.op == "arith.cast":
        return [(ref_convert(x, t, case.kind), None) for x in a]
    if case.op == "arith.select":
        return [(int(x if c else y) if r == "i32" else (x if c else y), None)
                for c, x, y in zip(ins["c"], a, ins["b"], strict=True)]
    if case.op == "arith.cmp":
        return [(ref_compare(case.kind, x, y), None) for x, y in zip(a, ins["b"], strict=True)]
    if case.op == "arith.unary":
        for x in a:
            if case.kind == "not":
                out.append((not (x != 0) if not (isinstance(x, float) and math.isnan(x)) else False, None))
            elif case.kind == "invert":
                out.append((not x if t == "bool" else wrap(~x, t), None))
            elif isinstance(x, float):
                out.append((-x, None))
            else:
                out.append((wrap(-int(x), r), None))
        return out
    if case.op == "arith.binary":
        for x, y in zip(a, ins["b"], strict=True):
            if r == "bool":
                out.append(({"and": x and y, "or": x or y, "xor": x != y}[case.kind], None))
            elif case.kind == "div" and r == "f32" and t != "f32":  # integers: both to f32 first
                out.append((ref_float_binary("div", "f32", ref_convert(x, t, "f32"), ref_convert(y, t, "f32")), None))
            elif case.kind == "pow":
                v, b = pow_ideal_and_bound(x, y)
                out.append((round_op(v, r), _widen(b, v, r)))
            elif r in FMTS:
                out.append((ref_float_binary(case.kind, r, x, y), None))
            else:
                out.append((ref_int_binary(case.kind, r, int(x), int(y)), None))
        return out
    # math
    for x in a:
        if case.kind == "abs" and r in FMTS:  # |x| rounded to the type: an 8-bit float's as a cast (inf saturates)
            out.append((round_op(abs(x), r), None))
            continue
        if case.kind == "abs":
            out.append((x if t in ("bool",) or t[0] == "u" else wrap(abs(x), t), None))
            continue
        v = ref_convert(x, t, "f32") if t not in FMTS else x
        if case.kind in APPROX and r != "f64":
            iv = ideal(case.kind, v)
            out.append((round_op(iv, r), _widen(_bound(case.kind, v, iv), iv, r)))
        elif r == "f64":
            out.append((_math_exact(case.kind, r, v), None))
        else:  # computed in f32, rounded once to the type (rule 10)
            out.append((round_op(round_to(_math_exact(case.kind, "f32", v), "f32"), r), None))
    return out


def _bound(fn: str, x: float, value: float) -> float:
    from sparsile.tests.support.op_table_reference import approx_bound

    return approx_bound(fn, x, value) if not math.isnan(value) else 0.0


def _widen(bound: float, value: float, t: str) -> float:
    """A bound on an f32 result carried to type ``t``: plus an ulp of ``t`` (the rounding of two
    results within ``bound`` of each other can straddle one tie)."""
    if t in ("f32", "tf32") or not math.isfinite(value):
        return bound
    return bound + FMTS[t].ulp(round_op(value, t))


def _finite(v: float, t: str) -> float:
    """An infinity as the first value of ``t`` that rounds to it (2**(emax + 1))."""
    if math.isinf(v):
        return math.copysign(2.0 ** (FMTS["f32" if t == "tf32" else t].emax + 1), v)
    return v


def same(x: Any, y: Any) -> bool:
    """Exact agreement: equal values with equal zero signs, or both NaN."""
    if isinstance(x, float) or isinstance(y, float):
        x, y = float(x), float(y)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1, x) == math.copysign(1, y)
    return bool(x == y) and type(x) is type(y) if isinstance(x, bool) or isinstance(y, bool) else x == y


def close(x: float, y: float, bound: float, t: str) -> bool:
    """Approximate agreement: both NaN, or neither and ``|x - y| <= bound`` (infinities counted as
    the first value that rounds to them)."""
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if x == y:
        return True
    return abs(_finite(x, t) - _finite(y, t)) <= bound


def check_interpreter(case: Case) -> list[str]:
    """The interpreter's results of ``case`` against :func:`expected`: a row per disagreement."""
    out = case.output()
    case.kernel().interpret[(1,)](*case.inputs.values(), out)
    rows = []
    got = decode(out)
    for i, ((want, bound), g) in enumerate(zip(expected(case), got, strict=True)):
        ok = same(g, want) if bound is None else close(g, want, bound, case.result or "")
        if not ok:
            rows.append(row(case, i, f"interp={g!r}", f"ref={want!r}" + (f" (bound {bound:.3g})" if bound else "")))
    return rows


def row(case: Case, i: int, *values: str) -> str:
    ins = ", ".join(f"{k}={decode(v[i:i + 1])[0]!r}" for k, v in case.inputs.items())
    return f"{case.kind} {case.t}->{case.result} [{i}] {ins}: " + " ".join(values)


def check_device(case: Case, launch: Callable[[Any, tuple], None]) -> list[str]:
    """``case`` run by ``launch(kernel, arrays)`` (the GPU; or the interpreter standing in for it)
    against the interpreter, outputs poisoned first: a row per disagreement, with the reference."""
    dev, ref = case.output(), case.output()
    args = tuple(case.inputs.values())
    launch(case.kernel(), (*args, dev))
    case.kernel().interpret[(1,)](*args, ref)
    want = expected(case)
    rows = []
    for i, (g, r, (w, bound)) in enumerate(zip(decode(dev), decode(ref), want, strict=True)):
        if bound is None:
            ok = same(g, r)
        else:  # both within `bound` of the exact value
            ok = close(g, r, 2 * bound, case.result or "")
        if not ok:
            rows.append(row(case, i, f"device={g!r}", f"interp={r!r}", f"ref={w!r}",
                            f"(bound {2 * bound:.3g})" if bound is not None else "(exact)"))
    return rows


def interpreter_launch(kernel: Any, args: tuple) -> None:
    """The interpreter as the device (the GPU test's body checked on a machine without one)."""
    kernel.interpret[(1,)](*args)


def gpu_launch(kernel: Any, args: tuple) -> None:
    kernel[(1,)](*args)
