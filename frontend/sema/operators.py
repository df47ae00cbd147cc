"""Sema for operators: binary and unary operators (constant folding, tuple arithmetic),
``and`` / ``or``, comparisons and membership tests, and conditional expressions. A mixin of
:class:`~sparsile.frontend.sema.expr.ExprMixin`."""

from __future__ import annotations

import decimal
import operator
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from ..diagnostics import CompileError, Diagnostic, Label
from ..ir import types as T
from ..ir.core import Value
from ..ops.core import emit_binary, emit_unary
from ..ops.opdefs import op_def
from ..spans import Span
from ..syntax import ast as A
from .class_code import runs_own_code
from .constant_kinds import NUMERIC_UNARY, check_number_use, check_operands
from .consts import NOT_CONSTANT, python_constant
from .emitter import MAX_CONSTANT_BITS, ConstantTooLarge, Emitter, check_integer_constant, describe, fold_binary
from .keyed_values import keyed_fold, keyed_truth, user_code_failed
from .operand_help import membership_help
from .typed_fold import fold_integer_power, fold_typed, is_integer_power, is_typed
from .values import POISON, Arg, Const, PoisonError


def _invert(a: Any) -> Any:
    """``~`` of a constant as the run-time operator gives it: logical not on a bool (numpy's and the
    language's meaning, so a constexpr flag and a run-time mask agree), bitwise not on an int. (Python's
    ``~True`` is -2, and deprecated since 3.12.)"""
    return not a if isinstance(a, (bool, np.bool_)) else ~a


class OperatorMixin:
    """Operators and conditional expressions for :class:`~sparsile.frontend.sema.core.Sema`."""

    # provided by Sema
    builder: Any

    if TYPE_CHECKING:
        def expr(self, node: A.Expr) -> Any: ...
        def emitter(self) -> Emitter: ...

    # ------------------------------------------------------------------------------ operators
    def binop(self, op: str, a: Any, b: Any, a_span: Span, b_span: Span, span: Span) -> Any:
        if a is POISON or b is POISON:
            raise PoisonError()
        check_operands(self, op, ((a, a_span), (b, b_span)))  # `BLOCK * 2` with BLOCK=True: SP0723
        if isinstance(a, Const) and isinstance(b, Const) and not (is_typed(a) or is_typed(b)):
            if op == "/" and isinstance(a.value, int) and isinstance(b.value, int):  # rule 6: as run-time integers
                for c, sp in ((a, a_span), (b, b_span)):
                    check_integer_constant(c.value, sp, "integer `/`")
            x, y = a.value, b.value
            folded = self._fold(op, x, y, span)
            # (`v == w` ran the objects' Python code: SP0329 first where it failed)
            keyed_fold(f"`{op}`", ((a, a_span), (b, b_span)), span, lambda: _fold_value(op, x, y), folded.value)
            return folded
        if isinstance(a, tuple) or isinstance(b, tuple):
            folded = self._tuple_binop(op, a, b, span)
            if isinstance(folded, Const):  # (a comparison folded: `+` and `*` run no element's code)
                ca, cb = python_constant(a), python_constant(b)
                keyed_fold(f"`{op}`", ((a, a_span), (b, b_span)), span, lambda: _fold_value(op, ca, cb), folded.value)
            return folded
        for v, sp in ((a, a_span), (b, b_span)):
            if not isinstance(v, Value | Const):
                raise CompileError([Diagnostic("SP0329", f"`{op}` needs numbers or tiles, found {describe(v)}", sp)])
            if isinstance(v, Const) and not isinstance(v.value, bool | int | float):
                raise CompileError([Diagnostic("SP0329", f"`{op}` needs numbers or tiles, found {describe(v)}", sp)])
        if isinstance(a, Const) and isinstance(b, Const) and op == "**" and is_integer_power(a, b):
            return fold_integer_power(Arg(a, a_span), Arg(b, b_span), span)  # (no run-time integer `**`)
        if isinstance(a, Const) and isinstance(b, Const):  # one is typed: fold as the run-time op
            return fold_typed(lambda em, xs: emit_binary(em, op, *xs), [Arg(a, a_span), Arg(b, b_span)], span)
        em = self.emitter()
        em.span = span
        return emit_binary(em, op, Arg(a, a_span), Arg(b, b_span))

    def _tuple_binop(self, op: str, a: Any, b: Any, span: Span) -> Any:
        """Tuples exist at compile time: ``+`` concatenates, ``*`` repeats, comparisons fold when
        every element is a constant."""
        if op == "+" and isinstance(a, tuple) and isinstance(b, tuple):
            return a + b
        if op == "*" and (isinstance(a, tuple) != isinstance(b, tuple)):
            seq, times = (a, b) if isinstance(a, tuple) else (b, a)
            if isinstance(times, Const) and isinstance(times.value, int) and not isinstance(times.value, bool):
                if len(seq) * times.value > MAX_CONSTANT_BITS:
                    raise CompileError([Diagnostic("SP0346", f"the tuple would have {len(seq) * times.value} "
                                                   f"elements (the limit is {MAX_CONSTANT_BITS})", span)])
                return seq * times.value
        if op in ("==", "!=", "<", "<=", ">", ">="):
            ca, cb = python_constant(a), python_constant(b)
            if ca is not NOT_CONSTANT and cb is not NOT_CONSTANT:
                return self._fold(op, ca, cb, span)
            raise CompileError([Diagnostic("SP0331", f"`{op}` compares tuples at compile time only; this one holds "
                                           "run-time values", span)])
        raise CompileError([Diagnostic("SP0329", f"`{op}` is not defined between {describe(a)} and {describe(b)}",
                                       span)])

    def _fold(self, op: str, x: Any, y: Any, span: Span) -> Const:
        try:
            return Const(_fold_value(op, x, y))
        except ZeroDivisionError:
            raise CompileError([Diagnostic("SP0330", "division by zero in a constant expression", span)]) from None
        except decimal.DecimalException as e:  # (ZeroDivisionError above: `Decimal(1) / 0`)
            raise decimal_signal(op, (x, y), e, span) from None
        except ConstantTooLarge:
            raise CompileError([Diagnostic("SP0346", f"the constant expression is too large (more than "
                                           f"{MAX_CONSTANT_BITS} bits or elements)", span)]) from None
        except OverflowError:
            big = next((v for v in (x, y) if isinstance(v, int) and abs(v) > sys.float_info.max), None)
            if big is not None:  # `2**2000 // 3.0`: the integer has no f64 value
                raise CompileError([Diagnostic("SP0303", f"`{op}` with a float converts the integer constant {big} "
                                               "to f64, whose range it exceeds", span)]) from None
            raise _undefined(op, x, y, span) from None
        except (TypeError, ValueError):
            raise _undefined(op, x, y, span) from None
        except Exception as e:  # (a special method of the user's class raised: RuntimeError, KeyError)
            if runs_own_code((x, y)):
                raise user_code_failed(f"`{op}`", e, span) from None
            raise

    def unaryop(self, node: A.UnaryOp) -> Any:
        v = self.expr(node.operand)
        if node.op in NUMERIC_UNARY:
            check_number_use(self, v, f"the operand of unary `{node.op}`", node.operand.span)
        if is_typed(v):
            return fold_typed(lambda em, xs: emit_unary(em, node.op, xs[0]), [Arg(v, node.operand.span)], node.span)
        if isinstance(v, Const):
            if node.op == "not":
                return Const(not keyed_truth(v, node.operand.span, "`not`"))
            fold, x = {"-": operator.neg, "+": operator.pos, "~": _invert}[node.op], v.value
            try:
                folded = Const(fold(x))
            except decimal.DecimalException as e:
                raise decimal_signal(node.op, (x,), e, node.span) from None
            except (TypeError, ValueError):
                msg = f"`{node.op}` is not defined on {v.value!r}"
                raise CompileError([Diagnostic("SP0329", msg, node.span)]) from None
            except Exception as e:
                if runs_own_code((x,)):
                    raise user_code_failed(f"`{node.op}`", e, node.span) from None
                raise
            keyed_fold(f"`{node.op}`", ((v, node.operand.span),), node.span, lambda: fold(x), folded.value)
            return folded
        if isinstance(v, tuple):
            if node.op == "not":
                return Const(not v)
            raise CompileError([Diagnostic("SP0329", f"`{node.op}` is not defined on a tuple", node.span)])
        em = self.emitter()
        em.span = node.span
        return emit_unary(em, node.op, Arg(v, node.operand.span))

    def boolop(self, node: A.BoolOp) -> Any:
        """``and`` / ``or`` as Python's: the value is the operand that decides (``a or 2.5`` is ``a``
        when ``a`` is true, else 2.5). Constants short-circuit; from the first run-time operand on,
        the value is chosen elementwise (``where(a, b, a)`` for ``and``), which for bools is the
        logical ``&`` / ``|``. Every operand is computed (SP0248 for a side effect)."""
        result: Any = None
        result_span = node.span
        for i, e in enumerate(node.values):
            if result is None or isinstance(result, Const | tuple):
                v = self.expr(e)
                truth = keyed_truth(v, e.span, f"`{node.op}`") if isinstance(v, Const | tuple) else None
                if truth is None or result is None or (node.op == "and") == truth:
                    result, result_span = v, e.span  # a run-time operand, or a constant that does not decide
                if truth is not None and (node.op == "and") != truth:
                    return v                          # a constant decides, as in Python
                continue
            # Python would skip this operand when the run-time ones before it decide
            v = self._evaluated_anyway(e, f"this operand of `{node.op}`", node.values[i - 1].span)
            result = self._choose(node.op, result, result_span, v, e.span, node.span)
            result_span = node.span
        return result

    def _choose(self, op: str, a: Any, a_span: Span, b: Any, b_span: Span, span: Span) -> Any:
        """``a and b`` / ``a or b`` for a run-time ``a``: Python's value, elementwise."""
        if isinstance(b, tuple):
            raise CompileError([Diagnostic("SP0329", f"`{op}` is not defined between {describe(a)} and a tuple",
                                           b_span)])
        em = self.emitter()
        em.span = span

        def is_bool(v: Any) -> bool:
            if isinstance(v, Const):
                return isinstance(v.value, bool)
            return isinstance(v, Value) and T.element_type(v.type) == T.bool_

        if is_bool(a) and is_bool(b):  # the logical operation (a constant may decide it)
            if isinstance(b, Const):
                return b if (op == "and") != b.value else a
            x, y = em.binary_operands(Arg(a, a_span), Arg(b, b_span), span, keep_bool=True)
            return em.op1("arith.binary", [x, y], x.type, op=op)
        cond = self._as_bool(a, a_span)
        x, y = em.binary_operands(Arg(b if op == "and" else a, b_span if op == "and" else a_span),
                                  Arg(a if op == "and" else b, a_span if op == "and" else b_span), span,
                                  pointers=True)
        shape = em.broadcast_shapes(T.shape_of(cond.type), T.shape_of(x.type), span)
        cond, x, y = em.broadcast_to(cond, shape), em.broadcast_to(x, shape), em.broadcast_to(y, shape)
        return em.op1("arith.select", [cond, x, y], x.type)

    def _evaluated_anyway(self, node: A.Expr, what: str, decider: Span) -> Any:
        """``node`` evaluated where Python evaluates it only on some run-time condition (an arm of a
        conditional expression, an operand of ``and``/``or`` after a run-time one): kernels compute
        it whatever the condition, so an operation with a side effect in it (a store, an atomic, a
        barrier, ...) would happen where Python's would not: SP0248."""
        block = self.builder.block
        before = {id(op) for op in block.ops}
        v = self.expr(node)
        for top in block.ops:
            if id(top) in before:
                continue
            for op in top.walk():
                if op_def(op.name).side_effects:
                    inside = (op.span.source is node.span.source
                              and (node.span.line, node.span.col) <= (op.span.line, op.span.col)
                              and (op.span.end_line, op.span.end_col) <= (node.span.end_line, node.span.end_col))
                    span = op.span if inside else node.span
                    name = f"atomic_{op.attrs['kind']}" if op.name == "atomic_rmw" else op.name
                    raise CompileError([Diagnostic(
                        "SP0248", f"{what} is computed whatever the condition, and it has a side effect "
                        f"(`{name}`) that Python would skip", span,
                        labels=[Label(decider, "a run-time value: both sides are computed")],
                        help="use an `if` statement to run it only when needed, or the operation's `mask=`")])
        return v

    def _as_bool(self, v: Any, span: Span) -> Value:
        em = self.emitter()
        val = em.tile_or_scalar(Arg(v, span))
        e = T.element_type(val.type)
        if e == T.bool_:
            return val
        if isinstance(e, T.PointerType):
            raise CompileError([Diagnostic("SP0312", "a pointer is not a condition", span)])
        if getattr(e, "name", "") in ("e4m3", "e5m2"):  # `.to(bool)`'s bit test, as scalar_condition
            return em.cast(val, T.bool_)
        zero = em.broadcast_to(em.constant(0, e), T.shape_of(val.type))
        return em.op1("arith.cmp", [val, zero], T.with_shape(T.bool_, T.shape_of(val.type)), pred="ne")

    def compare(self, node: A.Compare) -> Any:
        left = self.expr(node.left)
        left_span, left_node = node.left.span, node.left
        result: Any = None
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = self.expr(comp)
            if op in ("in", "not in", "is", "is not"):
                name = left_node.id if isinstance(left_node, A.Name) else "x"
                r = self._const_membership(op, left, right, node.span, name)
            else:
                r = self.binop(op, left, right, left_span, comp.span, node.span)
            if result is None:
                result = r
            elif isinstance(result, Const) and isinstance(r, Const):
                result = Const(bool(result.value) and bool(r.value))
            else:
                em = self.emitter()
                em.span = node.span
                x = self._as_bool(result, node.span)
                y = self._as_bool(r, node.span)
                x, y = em.binary_operands(Arg(x, node.span), Arg(y, node.span), node.span, keep_bool=True)
                result = em.op1("arith.binary", [x, y], x.type, op="and")
            left, left_span, left_node = right, comp.span, comp
        return result

    def _const_membership(self, op: str, a: Any, b: Any, span: Span, left: str = "x") -> Const:
        def val(x: Any) -> Any:
            if isinstance(x, Const):
                return x.value
            if isinstance(x, tuple):
                return tuple(val(e) for e in x)
            raise CompileError([Diagnostic("SP0331", f"`{op}` works on compile-time values only, found {describe(x)}",
                                           span, help=membership_help(op, left, b))])

        if op in ("is", "is not") and _none_test(a, b):
            # `bias_ptr is not None` on a run-time value: never None (None arguments are compile-time
            # constants, docs/language.md, "Specialization and launching"), as in Triton
            return Const(op == "is not")
        x, y = val(a), val(b)

        def decide() -> bool:
            if op in ("is", "is not"):
                same = x is y or ((x is None) == (y is None) and (x is None or x == y))
            else:
                same = x in y
            return same if op in ("is", "in") else not same

        try:
            result = decide()
        except decimal.DecimalException as e:  # `SNAN in (1, 2)`: its `==` signals
            raise decimal_signal(op, (x, y), e, span) from None
        except TypeError:
            if op in ("is", "is not"):
                raise
            msg = f"`{op}` needs a tuple on the right, found {y!r}"
            raise CompileError([Diagnostic("SP0331", msg, span)]) from None
        except Exception as e:  # (`x in y` ran a `__contains__` / `__eq__` of the user's class that raised)
            if runs_own_code((x, y)):
                raise user_code_failed(f"`{op}`", e, span) from None
            raise
        if not (op in ("is", "is not") and (x is None or y is None)):  # (`obj is None` runs no code of obj)
            keyed_fold(f"`{op}`", ((a, span), (b, span)), span, decide, result)
        return Const(result)

    def ifexp(self, node: A.IfExp) -> Any:
        c = self.expr(node.test)
        if isinstance(c, Const):
            return self.expr(node.body if keyed_truth(c, node.test.span) else node.orelse)
        a = self._evaluated_anyway(node.body, "this arm of `... if ... else ...`", node.test.span)
        b = self._evaluated_anyway(node.orelse, "this arm of `... if ... else ...`", node.test.span)
        if a is b:
            return a
        em = self.emitter()
        em.span = node.span
        cond = self._as_bool(c, node.test.span)
        x, y = em.binary_operands(Arg(a, node.body.span), Arg(b, node.orelse.span), node.span, keep_bool=True,
                                  pointers=True)
        shape = em.broadcast_shapes(T.shape_of(cond.type), T.shape_of(x.type), node.span)
        cond, x, y = em.broadcast_to(cond, shape), em.broadcast_to(x, shape), em.broadcast_to(y, shape)
        return em.op1("arith.select", [cond, x, y], x.type)


def _fold_value(op: str, x: Any, y: Any) -> Any:
    """``x op y`` of two Python constants, as a kernel folds it (tuples compare with ``==`` / ``!=``);
    TypeError where the language has no such fold."""
    if op == "@":
        raise TypeError
    if (isinstance(x, tuple) or isinstance(y, tuple)) and op in ("==", "!="):
        return (x == y) if op == "==" else (x != y)
    return fold_binary(op, x, y)


def decimal_signal(op: str, operands: tuple[Any, ...], e: decimal.DecimalException, span: Span) -> CompileError:
    """SP0329: ``op`` of constants raised a signal the thread's decimal context traps
    (``Decimal("NaN") < 1``: decimal.InvalidOperation)."""
    kind = next((c for c in type(e).__mro__ if c.__module__ == "decimal"), type(e))  # (C's: `decimal.` too)
    return CompileError([Diagnostic(
        "SP0329", f"`{op}` of {' and '.join(describe(Const(v)) for v in operands)} signals "
                  f"decimal.{kind.__name__} in the thread's decimal context", span,
        help="Python raises it there too: fold values it is defined for, or compile under a "
             "`decimal.localcontext()` that does not trap the signal (the context is part of the key)")])


def _undefined(op: str, x: Any, y: Any, span: Span) -> CompileError:
    """SP0329: the binary operator ``op`` has no meaning between the constants x and y."""
    return CompileError([Diagnostic("SP0329", f"`{op}` is not defined between {describe(Const(x))} and "
                                    f"{describe(Const(y))}", span)])


def _none_test(a: Any, b: Any) -> bool:
    """Whether ``a is b`` compares a run-time value (a scalar, pointer, tile or tensor) with None."""
    def is_none(x: Any) -> bool:
        return isinstance(x, Const) and x.value is None

    return (isinstance(a, Value) and is_none(b)) or (isinstance(b, Value) and is_none(a))
