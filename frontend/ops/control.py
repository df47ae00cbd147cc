"""Structured control flow ops. Their interpretation walks regions, so it lives in the
interpreter; here are their definitions and typing rules.

* ``scf.for %lb, %ub, %step, %inits... { ^(%iv, %args...): ...; scf.yield %next... }`` — results
  are the final carried values. The trip count is ``max(0, ceil((ub - lb) / step))``.
* ``scf.if %cond { ...; scf.yield ... } { ...; scf.yield ... }`` — results merge both branches.
* ``scf.while %inits... { ^(%args): ...; scf.condition %c, %args... } { ^(%args): ...; scf.yield }``.
* ``device_assert %cond {message}`` — checked by the interpreter; GPU code ignores it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..interp.values import ASSERTION_FAILED, InterpreterError
from ..ir.core import Operation
from ..layout.rules import BRANCH, LOOP
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, RUN_BY_REGION_WALK, TYPED_BY_SEMA, define_op, none, variadic

scf_for = define_op("scf.for", operands=variadic(("lower", "upper", "step"), "init"), interpret=RUN_BY_REGION_WALK,
                    layout=LOOP, legality=NO_LEGALITY, doc="A counted loop with loop-carried values.")
scf_if = define_op("scf.if", operands=("cond",), interpret=RUN_BY_REGION_WALK, layout=BRANCH, legality=NO_LEGALITY,
                   doc="A two-way branch on a scalar bool, with merged results.")
scf_while = define_op("scf.while", operands=variadic((), "init"), verify=TYPED_BY_SEMA, interpret=RUN_BY_REGION_WALK,
                      layout=LOOP, legality=NO_LEGALITY,
                      doc="A loop whose condition is computed in its first region.")
scf_yield = define_op("scf.yield", operands=variadic((), "value"), verify=TYPED_BY_SEMA, interpret=RUN_BY_REGION_WALK,
                      layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                      lower=none("read by the enclosing op's lowering (backend/lower/control.py)"), terminator=True,
                      doc="The values a region passes on.")
scf_condition = define_op("scf.condition", operands=variadic(("cond",), "value"), verify=TYPED_BY_SEMA,
                          interpret=RUN_BY_REGION_WALK, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                          lower=none("read by the enclosing op's lowering (backend/lower/control.py)"),
                          terminator=True, doc="The condition of a while loop and its values.")
device_assert = define_op("device_assert", operands=("cond",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          legality=NO_LEGALITY, side_effects=True, doc="A run-time assertion (interpreter only).")


@scf_for.verifier
def _verify_for(op: Operation) -> str | None:
    body = op.regions[0].block
    n_carried = len(op.operands) - 3
    if len(body.args) != 1 + n_carried:
        return f"scf.for body has {len(body.args)} arguments, expected {1 + n_carried}"
    if len(op.results) != n_carried:
        return "scf.for results do not match its carried values"
    term = body.terminator
    if term is None or term.name != "scf.yield" or len(term.operands) != n_carried:
        return "scf.for body must end in scf.yield of the carried values"
    for r, y in zip(op.results, term.operands, strict=True):
        if r.type != y.type:
            return f"scf.for carries {r.type} but yields {y.type}"
    return None


@scf_if.verifier
def _verify_if(op: Operation) -> str | None:
    for region in op.regions:
        term = region.block.terminator
        if term is None or term.name != "scf.yield" or len(term.operands) != len(op.results):
            return "each branch of scf.if must end in scf.yield of its results"
        for r, y in zip(op.results, term.operands, strict=True):
            if r.type != y.type:
                return f"scf.if result {r.type} but a branch yields {y.type}"
    return None


@device_assert.interpreter
def _i_assert(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    if not np.all(args[0]):
        raise InterpreterError(ASSERTION_FAILED,
                               f"device assertion failed: {op.attrs.get('message', '')}", op.span, ctx.program_id)
    return []
