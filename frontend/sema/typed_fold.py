"""Folding of operations on *typed* constants: ``f16(0.1) * 3``, ``u8(200) + u8(100)``,
``f32(1.0) // f32(0.1)``, ``-i8(-128)``.

A conversion of a constant to a scalar type (``T(c)``, docs/language.md rule 8) gives a constant of
that type; an operator, ``abs``, ``max`` or ``min`` with a typed constant among its constant operands
folds to a constant of the type the run-time operation gives. The fold does not reimplement the
arithmetic: it emits the very ops that the operation emits on run-time values (promotion, casts,
diagnostics such as SP0309 included) into a scratch block and runs them with their interpreter
semantics (frontend/ops/core.py, frontend/interp/numerics.py), so that a folded typed constant is
bit for bit what the same operation computes at run time: integers wrap, 16-bit floats round each
result, float ``//`` and ``%`` follow the GPU's sequences, ``max`` / ``min`` skip NaN and order
``+0.0 > -0.0``. Untyped constants (literals and their arithmetic) keep Python's exact integers
and float64 (emitter.fold_binary).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..diagnostics import CompileError, Diagnostic
from ..interp.interpreter import ProgramContext
from ..interp.numerics import int_to_int
from ..interp.values import InterpreterError
from ..ir import types as T
from ..ir.core import Block, Builder, Value
from ..ops.core import emit_binary
from ..ops.opdefs import op_def
from ..spans import Span
from .builtins import lookup_global
from .emitter import Emitter
from .values import Arg, Const

Emit = Callable[[Emitter, list[Arg]], Any]
"""What the operation emits on its operands (already materialized where typed)."""


def is_typed(v: Any) -> bool:
    """Whether ``v`` is a constant of a scalar type (made by ``T(c)`` or by folding one)."""
    return isinstance(v, Const) and v.dtype is not None


def any_typed(args: list[Arg]) -> bool:
    return any(is_typed(a.value) for a in args)


def python_value(x: Any, t: T.ScalarType) -> bool | int | float:
    """The 0-d interpreter value ``x`` of type ``t`` as a Python number (exact: every value of a
    float type is a float64)."""
    a = np.asarray(x)
    if t.is_bool:
        return bool(a)
    if t.is_int:
        return int(a)
    return float(a.astype(np.float64))


def fold_typed(emit: Emit, args: list[Arg], span: Span) -> Const:
    """The constant that ``emit`` computes on ``args`` at run time: typed constants become
    ``arith.constant`` values of their type (untyped ones stay weakly typed literals), the ops
    ``emit`` creates run with their interpreter semantics, and the scalar result becomes a constant
    of its type."""
    block = Block()
    em = Emitter(Builder(block), None)
    em.span = span
    operands = [Arg(em.constant(a.value.value, a.value.dtype), a.span) if is_typed(a.value) else a for a in args]
    result = emit(em, operands)
    if not isinstance(result, Value) or not isinstance(result.type, T.ScalarType):
        return result
    env: dict[int, Any] = {}
    ctx = ProgramContext((0, 0, 0), (1, 1, 1), {})
    for op in block.ops:
        try:
            outs = op_def(op.name).interpret(ctx, op, [env[id(v)] for v in op.operands])
        except InterpreterError as e:  # MIN // -1 (SP0790): no value at run time, none at compile time
            raise CompileError([Diagnostic(e.code, e.message, span, help=e.help)]) from None
        for r, v in zip(op.results, outs, strict=True):
            env[id(r)] = v
    return Const(python_value(env[id(result)], result.type), result.type)


TYPED_FOLDABLE = frozenset({"abs", "max", "min"})
"""The builtins that fold on constants (consts.try_fold_builtin) and, given a typed constant, fold
as their run-time counterparts: ``abs`` as the ``abs`` math op (``abs(i8(-128))`` wraps to -128),
``max`` / ``min`` of two or more as ``maximum`` / ``minimum`` applied left to right."""


def fold_typed_builtin(name: str, args: list[Arg], span: Span) -> Any:
    """``abs`` / ``max`` / ``min`` of constants, one of them typed (see :data:`TYPED_FOLDABLE`)."""
    if name in ("max", "min") and len(args) >= 2:
        pairwise = lookup_global("maximum" if name == "max" else "minimum")
        acc = args[0]
        for a in args[1:]:
            acc = Arg(fold_typed(lambda em, xs: pairwise.impl(em, *xs), [acc, a], span), span)
        return acc.value
    b = lookup_global(name)
    return fold_typed(lambda em, xs: b.impl(em, *xs), args, span)


def is_integer_power(a: Const, b: Const) -> bool:
    """Whether ``a ** b`` of two constants, one typed, is a power of integers (no float among them):
    :func:`fold_integer_power` folds it, where the run-time ``**`` of integers is SP0309."""
    def integral(c: Const) -> bool:
        return isinstance(c.value, int) and (c.dtype is None or not c.dtype.is_float)
    return integral(a) and integral(b)


def fold_integer_power(a: Arg, b: Arg, span: Span) -> Const:
    """``a ** b`` of integer constants, one typed: Python's exact power (docs/language.md: ``**``
    between constants is Python's), wrapped to the type ``a * b`` would have at run time, as that
    type's arithmetic wraps (``u8(3) ** 5`` is 243, ``i8(2) ** 7`` is -128). A negative exponent has
    no integer value: SP0329."""
    exponent = b.value.value
    if exponent < 0:
        raise CompileError([Diagnostic("SP0329", f"`**` of integer constants with the negative exponent {exponent}",
                                       b.span, help="convert the base to a float type for a fractional result")])
    dtype = fold_typed(lambda em, xs: emit_binary(em, "*", *xs), [a, b], span).dtype
    assert dtype is not None
    return Const(int_to_int(pow(a.value.value, exponent, 1 << dtype.bits), dtype), dtype)
