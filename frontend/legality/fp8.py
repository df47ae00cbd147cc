"""fp8 (e4m3 / e5m2) values below sm_89 (SP0577).

sparsile holds fp8 values as their bytes and computes on them in f32: every conversion to or from
fp8, and so every arithmetic op, math function, comparison and reduction of fp8 values, is a
``cvt`` with ``.e4m3x2`` / ``.e5m2x2`` (``backend/lower/elementwise.py``), which ptxas accepts only
from sm_89 on (PTX ISA, "cvt"; docs/ampere.md). Loads, stores, ``where``, negation and constants of
fp8, and conversions of fp8 to bool, move or test bits and need no conversion, so they stay legal
everywhere. fp8 ``dot`` below
sm_89 is SP0620 (``backend/lower/mma.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..diagnostics import Diagnostic
from ..ir import types as T
from ..ir.core import Operation
from .core import SP_FP8_CONVERSION, Context, rule

FP8 = ("e4m3", "e5m2")

_BINARY = {"add": "`+`", "sub": "`-`", "mul": "`*`", "div": "`/`", "floordiv": "`//`", "mod": "`%`",
           "pow": "`**`", "max": "`maximum`", "min": "`minimum`"}


def _fp8(op: Operation) -> list[str]:
    """The fp8 element types among the op's operands and result (in that order, once each)."""
    names = [getattr(T.element_type(v.type), "name", "") for v in (*op.operands, *op.results)]
    return list(dict.fromkeys(n for n in names if n in FP8))


def _what(op: Operation, kind: str) -> str | None:
    """The user's operation in words, or None where it converts nothing."""
    if op.name == "arith.cast":
        src = T.element_type(op.operand("x").type)
        dst = T.element_type(op.result.type)
        if src == dst or dst == T.bool_:  # to bool tests the bits (backend/lower/elementwise.py)
            return None
        return f"converting {src} to {dst}"
    if op.name == "arith.binary":
        return f"{_BINARY.get(op.attrs['op'], '`' + op.attrs['op'] + '`')} on {kind}"
    if op.name == "arith.cmp":
        return f"comparing {kind} values"
    if op.name == "math":
        return f"`{op.attrs['fn']}` of {kind}"
    return f"the `{op.attrs['kind']}` reduction of {kind}"


@rule("arith.binary", "arith.cmp", "math", "arith.cast", "reduce", unless=("FP8_CVT",))
def fp8_needs_sm89(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    kinds = _fp8(op)
    what = _what(op, "/".join(kinds)) if kinds else None
    if what is None:
        return
    yield Diagnostic(
        SP_FP8_CONVERSION, f"{what} cannot be compiled for {ctx.target.name}: fp8 values are computed on in f32, "
        "and conversions to and from fp8 (`cvt` with .e4m3x2 / .e5m2x2) need sm_89 or later", op.span,
        help="compile for sm_89, sm_90a or later; or keep the fp8 data as u8 (loads and stores need no conversion) "
             "and convert it on the host")
