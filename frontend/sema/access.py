"""Sema for attributes and subscripts: namespace members, methods and properties of values,
attributes of constants (types, Python objects reached from ``@jit`` globals), and indexing of
type constructors, tuples, memory references and tiles. A mixin of
:class:`~sparsile.frontend.sema.expr.ExprMixin`."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..ir.core import Value
from ..syntax import ast as A
from .builtins import lookup_method, method_names
from .emitter import Emitter, describe, plain_number
from .member_help import missing_member
from .operand_help import subscript_help
from .type_ctors import TypeCtor
from .values import Arg, BoundMethod, Builtin, Const, Namespace


def _item(em: Emitter, x: Arg) -> Const:
    """``c.item()`` of a typed constant ``c`` (``np.int8(5).item()``, ``sp.f16(1.5).item()``): its value
    as Python's (untyped) number, as NumPy's ``item`` returns a Python ``int`` / ``float`` / ``bool``."""
    return Const(x.value.value)


_ITEM = Builtin("item", _item)


class AccessMixin:
    """Attributes and subscripts for :class:`~sparsile.frontend.sema.core.Sema`."""

    if TYPE_CHECKING:
        def expr(self, node: A.Expr) -> Any: ...
        def emitter(self) -> Emitter: ...
        def const_expr(self, node: A.Expr, what: str) -> Any: ...

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
        if base.dtype is not None and node.attr == "item":  # `np.int8(5).item()`: NumPy's Python number
            return BoundMethod(_ITEM, Arg(base, node.value.span))
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
            if not isinstance(i, int) or isinstance(i, bool):
                raise CompileError([Diagnostic("SP0333", f"a tuple index must be an integer constant, found {i!r}",
                                               idx_node.span)])
            i = plain_number(i)  # (`class Size(int)` by its value, its key: not through its own `<`)
            if not -len(seq) <= i < len(seq):
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
