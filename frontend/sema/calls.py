"""Sema for calls: builtins and methods (with the constant conversions and typed folds they
allow), Python builtins on constants, scalar-type conversions, and helper and ``@jit`` functions,
which are inlined. A mixin of :class:`~sparsile.frontend.sema.expr.ExprMixin`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..diagnostics import CompileError, Diagnostic, InternalError, coded_error_diagnostic, not_a_value
from ..ir import types as T
from ..spans import Span
from ..syntax import ast as A
from .builtins import signature_text
from .call_help import not_callable_help
from .consts import PyBuiltin, convert_const, try_fold_builtin
from .emitter import Emitter, check_integer_constant, describe
from .jit_globals import numpy_type_without_type, numpy_without_type_diagnostic
from .triton_names import keyword_help
from .type_ctors import constexpr_call
from .typed_fold import TYPED_FOLDABLE, any_typed, fold_typed_builtin
from .values import Arg, BoundMethod, Builtin, Const, HelperFunction, PoisonError


def _binds(b: Builtin, args: list[Arg]) -> bool:
    """Whether builtin ``b`` takes ``args`` (else its call reports them, SP0321)."""
    try:
        b.signature.bind(*args)
    except TypeError:
        return False
    return True


class CallMixin:
    """Calls for :class:`~sparsile.frontend.sema.core.Sema`."""

    if TYPE_CHECKING:
        def expr(self, node: A.Expr) -> Any: ...
        def emitter(self) -> Emitter: ...

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


def _jit_function_helper(func: Any) -> HelperFunction | None:
    """A ``@sparsile.jit`` function called from another kernel is inlined as a helper."""
    if isinstance(func, Const):
        inner = func.value
        as_helper = getattr(inner, "as_helper", None)
        if callable(as_helper):
            return as_helper()
    return None

