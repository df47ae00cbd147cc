"""Sema for expressions: names, constants and folding, operators, calls (builtins, methods,
inlined helpers), attributes and subscripts."""

from __future__ import annotations

import difflib
import sys
from typing import Any

import numpy as np

from ..diagnostics import CompileError, Diagnostic, InternalError, Label, coded_error_diagnostic, not_a_value
from ..ir import types as T
from ..ir.core import Value
from ..ops.core import emit_binary, emit_unary
from ..ops.opdefs import op_def
from ..spans import Span
from ..syntax import ast as A
from .builtins import lookup_global, lookup_method, method_names, signature_text
from .call_help import not_callable_help
from .constant_kinds import NUMERIC_UNARY, check_number_use, check_operands
from .consts import (
    NOT_CONSTANT,
    PY_FOLDABLE,
    PyBuiltin,
    as_sv,
    convert_const,
    python_constant,
    try_fold_builtin,
)
from .emitter import MAX_CONSTANT_BITS, ConstantTooLarge, Emitter, check_integer_constant, describe, fold_binary
from .jit_globals import numpy_type_without_type, numpy_without_type_diagnostic
from .member_help import for_loop_help, missing_member
from .operand_help import membership_help, subscript_help
from .python_builtins import builtin_help
from .triton_names import keyword_help, name_help
from .type_ctors import TypeCtor, constexpr_call
from .typed_fold import (
    TYPED_FOLDABLE,
    any_typed,
    fold_integer_power,
    fold_typed,
    fold_typed_builtin,
    is_integer_power,
    is_typed,
)
from .values import (
    POISON,
    Arg,
    AssignedLater,
    BoundMethod,
    Builtin,
    Const,
    EmptyClosureCell,
    EnclosingScopeName,
    HelperFunction,
    Namespace,
    PoisonError,
    Unbound,
    UnreadableAnnotation,
)

# Python builtins a kernel may call on compile-time values.


def _invert(a: Any) -> Any:
    """``~`` of a constant as the run-time operator gives it: logical not on a bool (numpy's and the
    language's meaning, so a constexpr flag and a run-time mask agree), bitwise not on an int. (Python's
    ``~True`` is -2, and deprecated since 3.12.)"""
    return not a if isinstance(a, (bool, np.bool_)) else ~a


def _binds(b: Builtin, args: list[Arg]) -> bool:
    """Whether builtin ``b`` takes ``args`` (else its call reports them, SP0321)."""
    try:
        b.signature.bind(*args)
    except TypeError:
        return False
    return True


class ExprMixin:
    # provided by Sema
    builder: Any
    current_span: Span | None

    def emitter(self) -> Emitter:
        return Emitter(self.builder, self)

    def describe(self, v: Any) -> str:
        return describe(v)

    def const_expr(self, node: A.Expr, what: str) -> Any:
        v = self.expr(node)
        if isinstance(v, Const):
            return v.value
        if isinstance(v, tuple) and all(isinstance(x, Const) for x in v):
            return tuple(x.value for x in v)
        raise CompileError([Diagnostic("SP0201", f"{what} must be a compile-time constant", node.span)])

    # ------------------------------------------------------------------------------ dispatch
    def expr(self, node: A.Expr) -> Any:
        saved = self.current_span
        self.current_span = node.span
        try:
            v = self._expr(node)
        finally:
            self.current_span = saved
        if v is POISON:
            raise PoisonError()
        if isinstance(v, Const) and isinstance(v.value, tuple):
            return as_sv(v.value)  # one representation of tuples: a Python tuple of sema values
        return v

    def _expr(self, node: A.Expr) -> Any:
        if isinstance(node, A.Constant):
            return Const(node.value)
        if isinstance(node, A.Name):
            return self.name(node)
        if isinstance(node, A.Tuple | A.List):
            return tuple(self.expr(e) for e in node.elts)
        if isinstance(node, A.BinOp):
            return self.binop(node.op, self.expr(node.left), self.expr(node.right), node.left.span,
                              node.right.span, node.span)
        if isinstance(node, A.UnaryOp):
            return self.unaryop(node)
        if isinstance(node, A.BoolOp):
            return self.boolop(node)
        if isinstance(node, A.Compare):
            return self.compare(node)
        if isinstance(node, A.IfExp):
            return self.ifexp(node)
        if isinstance(node, A.Call):
            return self.call(node)
        if isinstance(node, A.Attribute):
            return self.attribute(node)
        if isinstance(node, A.Subscript):
            return self.subscript(node)
        if isinstance(node, A.Slice):
            raise CompileError([Diagnostic("SP0227", "a slice is only allowed inside `[...]`", node.span)])
        if isinstance(node, A.Starred):
            raise CompileError([Diagnostic("SP0228", "`*` unpacking is not supported in kernels", node.span)])
        raise CompileError([Diagnostic("SP0210", f"`{type(node).__name__}` expressions are not supported", node.span)])

    # ------------------------------------------------------------------------------ names
    def name(self, node: A.Name) -> Any:
        try:
            v = self.lookup_local(node.id)  # type: ignore[attr-defined]
        except KeyError:
            pass
        else:
            if type(v) is Const and self.constant_params:  # type: ignore[attr-defined]
                self.note_constant_use(node.span, v)  # type: ignore[attr-defined]
            return _check_bound(node, v)
        frames = self.frames  # type: ignore[attr-defined]
        if frames and node.id in frames[-1].local_names:
            raise _assigned_later(node, frames[-1].name)
        try:
            v = self.resolve_global(node.id)  # type: ignore[attr-defined]
        except KeyError:
            pass
        else:
            if isinstance(v, AssignedLater):
                raise _assigned_later(node, v.function)
            if isinstance(v, EnclosingScopeName):
                raise UnreadableAnnotation([Diagnostic("SP0202", v.message, node.span, help=v.help)])
            if isinstance(v, EmptyClosureCell):
                raise CompileError([Diagnostic(
                    "SP0202", f"`{node.id}` is a variable of an enclosing function that has no value yet", node.span,
                    help=f"assign `{node.id}` in the enclosing function before the kernel's first launch: a kernel "
                         "reads its closure when it compiles, as Python reads it when the function runs")])
            return _check_bound(node, v)
        b = lookup_global(node.id)
        if b is not None:
            return b
        if node.id in PY_FOLDABLE:
            return Const(PyBuiltin(node.id))
        candidates = set(self.scope.all_names()) | set(_known_globals())  # type: ignore[attr-defined]
        close = difflib.get_close_matches(node.id, sorted(candidates), n=1)
        help_ = (for_loop_help(node.id) or name_help(node.id) or builtin_help(node.id)
                 or (f"did you mean `{close[0]}`?" if close else None))
        raise CompileError([Diagnostic("SP0202", f"unknown name `{node.id}`", node.span, help=help_)])

    # ------------------------------------------------------------------------------ operators
    def binop(self, op: str, a: Any, b: Any, a_span: Span, b_span: Span, span: Span) -> Any:
        if a is POISON or b is POISON:
            raise PoisonError()
        check_operands(self, op, ((a, a_span), (b, b_span)))  # `BLOCK * 2` with BLOCK=True: SP0723
        if isinstance(a, Const) and isinstance(b, Const) and not (is_typed(a) or is_typed(b)):
            if op == "/" and isinstance(a.value, int) and isinstance(b.value, int):  # rule 6: as run-time integers
                for c, sp in ((a, a_span), (b, b_span)):
                    check_integer_constant(c.value, sp, "integer `/`")
            return self._fold(op, a.value, b.value, span)
        if isinstance(a, tuple) or isinstance(b, tuple):
            return self._tuple_binop(op, a, b, span)
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
            if op == "@":
                raise TypeError
            if isinstance(x, tuple) or isinstance(y, tuple):
                if op in ("==", "!="):
                    return Const((x == y) if op == "==" else (x != y))
            return Const(fold_binary(op, x, y))
        except ZeroDivisionError:
            raise CompileError([Diagnostic("SP0330", "division by zero in a constant expression", span)]) from None
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

    def unaryop(self, node: A.UnaryOp) -> Any:
        v = self.expr(node.operand)
        if node.op in NUMERIC_UNARY:
            check_number_use(self, v, f"the operand of unary `{node.op}`", node.operand.span)
        if is_typed(v):
            return fold_typed(lambda em, xs: emit_unary(em, node.op, xs[0]), [Arg(v, node.operand.span)], node.span)
        if isinstance(v, Const):
            try:
                return Const({"-": lambda a: -a, "+": lambda a: +a, "~": _invert, "not": lambda a: not a}[node.op](
                    v.value))
            except (TypeError, ValueError):
                msg = f"`{node.op}` is not defined on {v.value!r}"
                raise CompileError([Diagnostic("SP0329", msg, node.span)]) from None
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
                truth = bool(v.value) if isinstance(v, Const) else bool(v) if isinstance(v, tuple) else None
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
        if op in ("is", "is not"):
            same = x is y or ((x is None) == (y is None) and (x is None or x == y))
            return Const(same if op == "is" else not same)
        try:
            inside = x in y
        except TypeError:
            msg = f"`{op}` needs a tuple on the right, found {y!r}"
            raise CompileError([Diagnostic("SP0331", msg, span)]) from None
        return Const(inside if op == "in" else not inside)

    def ifexp(self, node: A.IfExp) -> Any:
        c = self.expr(node.test)
        if isinstance(c, Const):
            return self.expr(node.body if c.value else node.orelse)
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

    # ------------------------------------------------------------------------------ calls
    def call(self, node: A.Call) -> Any:
        func = self.expr(node.func)
        args: list[Arg] = []
        for a in node.args:
            if isinstance(a, A.Starred):
                raise CompileError([Diagnostic("SP0228", "`*args` is not supported in kernel calls", a.span)])
            args.append(Arg(self.expr(a), a.span))
        kwargs: dict[str, Arg] = {}
        for k in node.keywords:
            if k.name is None:
                raise CompileError([Diagnostic("SP0228", "`**kwargs` is not supported in kernel calls", k.span)])
            if k.name in kwargs:
                raise CompileError([Diagnostic("SP0323", f"keyword argument `{k.name}` repeated", k.span)])
            kwargs[k.name] = Arg(self.expr(k.value), k.value.span)
        if isinstance(func, BoundMethod):
            target = _constant_to_target(func.builtin, [func.self_arg, *args], kwargs)
            if target is not None:  # `u8(200).to(f32)`, `(0.1).to(f64)`: converts as `f32(u8(200))`, `f64(0.1)`
                return _convert_constant(target[0], target[1], node.span)
            return self.call_builtin(func.builtin, [func.self_arg, *args], kwargs, node)
        if isinstance(func, Builtin):
            target = _constant_to_target(func, args, kwargs)
            if target is not None:  # `to(0.1, f64)`: as `f64(0.1)`
                return _convert_constant(target[0], target[1], node.span)
            items = _typed_tuple_items(func, args, kwargs)
            if items is not None:  # `max((u8(1), u8(2)))` as `max(u8(1), u8(2))`
                return items[0].value if len(items) == 1 else fold_typed_builtin(func.name, items, node.span)
            if func.name in TYPED_FOLDABLE and not kwargs and args and any_typed(args) \
                    and all(isinstance(a.value, Const) for a in args) and _binds(func, args):
                return fold_typed_builtin(func.name, args, node.span)
            folded = try_fold_builtin(func.name, args, kwargs)
            if folded is not None:
                return folded
            return self.call_builtin(func, args, kwargs, node)
        if isinstance(func, HelperFunction):
            return self.inline_call(func, [a.value for a in args], {k: v.value for k, v in kwargs.items()},  # type: ignore[attr-defined]
                                    node.span)
        if isinstance(func, Const) and isinstance(func.value, PyBuiltin):
            return func.value.call(args, kwargs, node.span)
        if isinstance(func, Const) and isinstance(func.value, T.ConstexprType):
            return constexpr_call(args, kwargs, node.span)
        if isinstance(func, Const) and isinstance(func.value, T.ScalarType):
            if len(args) != 1 or kwargs:
                raise CompileError([Diagnostic("SP0321", f"`{func.value}(x)` takes one argument", node.span)])
            em = self.emitter()
            em.span = node.span
            v = args[0].value
            if isinstance(v, Const) and isinstance(v.value, int | float | bool):
                return _convert_constant(args[0], func.value, node.span)
            return em.cast(em.tile_or_scalar(args[0]), func.value)
        jit_helper = _jit_function_helper(func)
        if jit_helper is not None:
            return self.inline_call(jit_helper, [a.value for a in args], {k: v.value for k, v in kwargs.items()},  # type: ignore[attr-defined]
                                    node.span)
        numpy_name = numpy_type_without_type(func.value) if isinstance(func, Const) else None
        if numpy_name is not None:  # `np.complex64(3)`: as a nested kernel's same default (Python's value) is
            raise CompileError([numpy_without_type_diagnostic(numpy_name, node.span)])
        help_ = not_callable_help(func.value) if isinstance(func, Const) else None
        raise CompileError([Diagnostic("SP0332", f"{describe(func)} is not callable in a kernel", node.func.span,
                                       help=help_)])

    def call_builtin(self, b: Builtin, args: list[Arg], kwargs: dict[str, Arg], node: A.Call) -> Any:
        try:
            bound = b.signature.bind(*args, **kwargs)
        except TypeError as e:
            msg = str(e).replace("'", "`")
            span, help_ = node.span, f"signature: {signature_text(b)}"
            unknown = next((k for k in node.keywords if k.name is not None and k.name in kwargs
                            and k.name not in b.signature.parameters), None)
            if unknown is not None and not any(p.kind is p.VAR_KEYWORD for p in b.signature.parameters.values()):
                # point at the keyword, and name the sparsile spelling of a Triton keyword
                assert unknown.name is not None
                span, help_ = unknown.span, keyword_help(b.name, unknown.name) or help_
            raise CompileError([Diagnostic("SP0321", f"wrong arguments to `{b.name}`: {msg}", span,
                                           help=help_)]) from None
        em = self.emitter()
        em.span = node.span
        try:
            return b.impl(em, *bound.args, **bound.kwargs)
        except (CompileError, PoisonError, RecursionError):
            raise
        except T.NotAValueTypeError as e:
            raise CompileError([not_a_value(e, f"`{b.name}`", node.span)]) from None
        except ValueError as e:  # a LayoutError / SparsityError of its arguments is the user's error
            located = coded_error_diagnostic(e, node.span)
            if located is None:
                raise InternalError(f"`{b.name}` failed on its arguments: {type(e).__name__}: {e}", node.span) from e
            raise CompileError([located]) from None
        except Exception as e:  # a builtin that failed to diagnose its arguments: a compiler bug
            raise InternalError(f"`{b.name}` failed on its arguments: {type(e).__name__}: {e}", node.span) from e

    # ------------------------------------------------------------------------------ attributes
    def attribute(self, node: A.Attribute) -> Any:
        base = self.expr(node.value)
        if isinstance(base, Namespace):
            if node.attr in base.members:
                return base.members[node.attr]
            raise CompileError([missing_member(base, node.attr, node.attr_span)])
        if isinstance(base, Value):
            found = lookup_method(base.type, node.attr)
            if found is None:
                names = method_names(base.type)
                close = difflib.get_close_matches(node.attr, names, n=1)
                raise CompileError([Diagnostic("SP0204", f"a value of type {base.type} has no attribute `{node.attr}`",
                                               node.attr_span,
                                               help=f"did you mean `{close[0]}`?" if close else
                                               (f"available: {', '.join(names)}" if names else None))])
            kind, b = found
            self_arg = Arg(base, node.value.span)
            if kind == "property":
                em = self.emitter()
                em.span = node.span
                return b.impl(em, self_arg)
            return BoundMethod(b, self_arg)
        if isinstance(base, Const):
            return self._const_attribute(base, node)
        raise CompileError([Diagnostic("SP0204", f"{describe(base)} has no attribute `{node.attr}`", node.attr_span)])

    def _const_attribute(self, base: Const, node: A.Attribute) -> Any:
        v = base.value
        if base.dtype is not None and node.attr == "dtype":  # `f16(0.5).dtype`, as a value's
            return Const(base.dtype)
        if base.dtype is not None and node.attr == "shape":  # `f16(0.5).shape`: a scalar's, `()`
            return ()
        if base.dtype is not None and node.attr == "to":  # `u8(200).to(f32)`, as a value's (folded in `call`)
            found = lookup_method(base.dtype, "to")
            assert found is not None
            return BoundMethod(found[1], Arg(base, node.value.span))
        if node.attr == "to" and isinstance(v, int | float):  # `i.to(i64)` of a static_range `i`: as `to(i, i64)`
            found = lookup_method(T.i32, "to")
            assert found is not None
            return BoundMethod(found[1], Arg(base, node.value.span))
        if isinstance(v, T.ScalarType) and node.attr in ("bits", "is_float", "is_int", "is_signed", "name"):
            return Const(getattr(v, node.attr))
        if isinstance(v, T.ScalarType | T.Type) and node.attr == "primitive_bitwidth":
            return Const(v.bits)  # type: ignore[union-attr]
        if isinstance(v, T.ScalarType) and node.attr == "element_ty":
            return base  # Triton's `out_ptr.dtype.element_ty`: a pointer's `dtype` is already its element type
        # Python module objects and other constants reached from @jit globals
        if not isinstance(v, int | float | bool | str | T.Type | TypeCtor) and v is not None:
            from .captures import note_attribute
            from .jit_globals import wrap_python_value

            try:
                attr = getattr(v, node.attr)
            except AttributeError:  # as for Python's hasattr: no such attribute
                attr = _NO_ATTR
            except Exception as e:  # the attribute is there, but reading it failed (a property that raises)
                raise CompileError([Diagnostic(
                    "SP0204", f"reading `{node.attr}` of {describe(base)} raised {type(e).__name__}: {e}",
                    node.attr_span, help="a kernel reads a Python object's attributes when it is compiled")]) from None
            if attr is not _NO_ATTR:
                note_attribute(v, node.attr, attr)
                return wrap_python_value(attr)
        raise CompileError([Diagnostic("SP0204", f"{describe(base)} has no attribute `{node.attr}`", node.attr_span)])

    # ------------------------------------------------------------------------------ subscripts
    def subscript(self, node: A.Subscript) -> Any:
        base = self.expr(node.value)
        if isinstance(base, Const) and isinstance(base.value, TypeCtor):
            params = tuple(self.const_expr(i, "a type parameter") for i in node.indices)
            t = base.value.apply(params)
            if isinstance(t, str):
                raise CompileError([Diagnostic("SP0302", t, node.span)])
            return Const(t)
        if isinstance(base, tuple) or (isinstance(base, Const) and isinstance(base.value, tuple | str)):
            if len(node.indices) != 1:
                raise CompileError([Diagnostic("SP0333", "a tuple takes one index", node.span)])
            seq = base if isinstance(base, tuple) else tuple(Const(x) for x in base.value)
            idx_node = node.indices[0]
            if isinstance(idx_node, A.Slice):
                parts = [None if p is None else self.const_expr(p, "a slice bound")
                         for p in (idx_node.lower, idx_node.upper, idx_node.step)]
                if any(p is not None and (not isinstance(p, int) or isinstance(p, bool)) for p in parts) \
                        or parts[2] == 0:
                    raise CompileError([Diagnostic("SP0333", "slice bounds must be integers and the step nonzero",
                                                   idx_node.span)])
                return tuple(seq[slice(*parts)])
            i = self.const_expr(idx_node, "a tuple index")
            if not isinstance(i, int) or isinstance(i, bool) or not -len(seq) <= i < len(seq):
                raise CompileError([Diagnostic("SP0333", f"index {i!r} is out of range for a tuple of {len(seq)}",
                                               idx_node.span)])
            return seq[i]
        if isinstance(base, Value):
            found = lookup_method(base.type, "__getitem__")
            if found is not None:  # memory references (smem buffers, barrier arrays) index by a value
                if len(node.indices) != 1:
                    raise CompileError([Diagnostic("SP0333", "memory references take one index", node.span)])
                em = self.emitter()
                em.span = node.span
                return found[1].impl(em, Arg(base, node.value.span), Arg(self.expr(node.indices[0]),
                                                                       node.indices[0].span))
            return self._tile_subscript(base, node)
        name = node.value.id if isinstance(node.value, A.Name) else None
        index = node.indices[0] if len(node.indices) == 1 else None
        key = repr(index.value) if isinstance(index, A.Constant) else "key"
        help_ = subscript_help(base.value, name, key) if isinstance(base, Const) else None
        raise CompileError([Diagnostic("SP0333", f"{describe(base)} cannot be indexed", node.span, help=help_)])

    def _tile_subscript(self, v: Value, node: A.Subscript) -> Value:
        em = self.emitter()
        em.span = node.span
        if not isinstance(v.type, T.ScalarType | T.PointerType | T.TileType):
            raise CompileError([Diagnostic("SP0333", f"a value of type {v.type} cannot be indexed", node.span)])
        shape = T.shape_of(v.type)
        out = v
        dim = 0
        for idx in node.indices:
            if isinstance(idx, A.Constant) and idx.value is None:
                cur = T.shape_of(out.type)
                new = (*cur[:dim], 1, *cur[dim:])
                if not cur:
                    out = em.broadcast_to(out, (1,))
                else:
                    out = em.op1("expand_dims", [out], T.TileType(T.element_type(out.type), new), axis=dim)
                dim += 1
            elif isinstance(idx, A.Slice) and idx.lower is None and idx.upper is None and idx.step is None:
                if dim >= len(T.shape_of(out.type)):
                    raise CompileError([Diagnostic("SP0333", f"too many indices for a tile of rank {len(shape)}",
                                                   idx.span)])
                dim += 1
            else:
                raise CompileError([Diagnostic(
                    "SP0334", "tiles can only be indexed with `:` and `None` (to insert a dimension)", idx.span,
                    help="select elements with a mask, or reduce; to read one element, load it from memory")])
        return out


_NO_ATTR = object()


def _convert_constant(c: Arg, t: T.ScalarType, span: Span) -> Const:
    """``t(c)`` of a constant number (``c.to(t)`` of a typed one): the run-time conversion's value
    (consts.convert_const) as a constant of type ``t``; an infinite or NaN float has no integer value
    (SP0303)."""
    v = c.value.value
    if t.is_int and not t.is_bool:
        check_integer_constant(v, c.span, f"a conversion to {t}")
    try:
        return Const(convert_const(v, t), t)
    except (OverflowError, ValueError):
        raise CompileError([Diagnostic("SP0303", f"{v!r} has no value in {t}", c.span)]) from None


def _constant_to_target(func: Builtin, args: list[Arg], kwargs: dict[str, Arg]) -> tuple[Arg, T.ScalarType] | None:
    """``(c, D)`` of ``c.to(D)`` or ``to(c, D)`` (``dtype=D`` too) where ``c`` is a constant number,
    typed or not, and ``D`` a scalar type: it converts as ``D(c)`` does, once, from the constant's
    exact value. Else None (the call goes to the ``to`` builtin, which reports wrong arguments)."""
    if func.name != "to" or len(args) + len(kwargs) != 2 or not set(kwargs) <= {"x", "dtype"}:
        return None
    given = dict(zip(("x", "dtype"), args, strict=False))
    if set(given) & set(kwargs):
        return None
    given.update(kwargs)
    c, d = given["x"], given["dtype"].value
    if not (isinstance(c.value, Const) and isinstance(c.value.value, bool | int | float)):
        return None
    t = d.value if isinstance(d, Const) else None
    t = T.scalar_type(t) if isinstance(t, str) else t  # `to(c, "f64")`, as the builtin takes it
    return (c, t) if isinstance(t, T.ScalarType) else None


def _typed_tuple_items(func: Builtin, args: list[Arg], kwargs: dict[str, Arg]) -> list[Arg] | None:
    """The items of ``max(t)`` / ``min(t)`` whose one argument is a nonempty tuple of constant
    numbers, one of them typed: they fold as ``max(*t)``. Else None."""
    if func.name not in ("max", "min") or kwargs or len(args) != 1 or not isinstance(args[0].value, tuple):
        return None
    items = [Arg(x, args[0].span) for x in args[0].value]
    numbers = all(isinstance(a.value, Const) and isinstance(a.value.value, int | float) for a in items)
    if not items or not numbers or not any_typed(items):
        return None
    return items


def _assigned_later(node: A.Name, function: str) -> CompileError:
    """SP0202 for a name read before the function it is local to assigns it."""
    return CompileError([Diagnostic(
        "SP0202", f"`{node.id}` is used before `{function}` assigns it", node.span,
        help=f"a name assigned anywhere in a function is local to it, as in Python: no `{node.id}` from outside "
             f"`{function}` (a module value, an enclosing function's) is read there; assign it before this use (before "
             "the loop, for a loop body), or rename the local")])


def _undefined(op: str, x: Any, y: Any, span: Span) -> CompileError:
    """SP0329: the binary operator ``op`` has no meaning between the constants x and y."""
    return CompileError([Diagnostic("SP0329", f"`{op}` is not defined between {describe(Const(x))} and "
                                    f"{describe(Const(y))}", span)])


def _check_bound(node: A.Name, v: Any) -> Any:
    """``v``, unless the name has no value on this path (SP0237)."""
    if isinstance(v, Unbound):
        raise CompileError([Diagnostic("SP0237", f"`{node.id}` {v.why}", node.span, help=v.help or None,
                                       labels=(Label(v.span, "here"),))])
    return v


def _known_globals() -> list[str]:
    from .builtins import ROOT

    return list(ROOT.members)


def _jit_function_helper(func: Any) -> HelperFunction | None:
    """A ``@sparsile.jit`` function called from another kernel is inlined as a helper."""
    if isinstance(func, Const):
        inner = func.value
        as_helper = getattr(inner, "as_helper", None)
        if callable(as_helper):
            return as_helper()
    return None


def _none_test(a: Any, b: Any) -> bool:
    """Whether ``a is b`` compares a run-time value (a scalar, pointer, tile or tensor) with None."""
    def is_none(x: Any) -> bool:
        return isinstance(x, Const) and x.value is None

    return (isinstance(a, Value) and is_none(b)) or (isinstance(b, Value) and is_none(a))
