"""Whether an integer offset of an ``addptr`` may be ``a + c`` with c a compile-time constant, the form
whose constant LLVM's NVPTX code generation separates from a sign-extended address index.

docs/language.md rule 7: ``p + offs`` is ``p + sext(offs) * E`` with the wrapped i32 ``offs``. LLVM 22's
NVPTX pipeline (the separation of constant offsets from ``getelementptr`` indices, the straight-line
strength reduction) rewrites ``getelementptr p, sext(a + c)`` as ``getelementptr p, sext(a)`` plus
``c * E`` bytes, which is another address where the i32 sum ``a + c`` wraps
(``load(x + (s + 128))`` with ``s = 2**31 - 100`` addressed ``x + (2**31 + 28) * E``, not ``x - (2**31 -
28) * E``). lower_addptr gives such offsets wide_address.py's opaque ``mad.wide.s32`` instead.

:func:`may_hold_constant_addend` follows the offset's definition the way LLVM's O3 pipeline can move a
constant addend to the top of the index (reassociation of ``+``/``-``, ``(a + c) * k`` distributed
into ``a * k + c * k`` for a constant k, ``-(a + c)``, ``~(a + c)``, integer casts, ``select``/``or``
of such values, and the element-wise shape ops): it answers True where some ``+``/``-`` along those
paths has a compile-time constant operand (or an ``arange`` starts past 0). It stops at everything
else (parameters, loop-carried values, ``program_id``, products by run-time values, divisions,
loads), so ``pid * B``, ``rows * ldc`` and a loop's ``k * BK`` keep their ``getelementptr``: LLVM sees
no constant to separate there.
"""

from __future__ import annotations

from ...frontend.ir import types as T
from ...frontend.ir.core import Value

_THROUGH = frozenset(("splat", "broadcast", "expand_dims", "reshape", "permute", "arith.cast"))
"""Ops whose result's elements are their operand's (or its integer cast's), traced through."""


def is_compile_time_constant(v: Value) -> bool:
    """Whether ``v`` is an ``arith.constant`` or built from constants by element-wise ops only."""
    op = v.owner
    if op is None:
        return False
    if op.name == "arith.constant":
        return True
    if op.name in _THROUGH or op.name in ("arith.binary", "arith.unary"):
        return all(is_compile_time_constant(x) for x in op.operands)
    return False


def _nonzero_constant(v: Value) -> bool:
    """A compile-time constant other than a literal 0 (a splat of 0 counts: the answer may be True
    where it need not be, never the other way)."""
    op = v.owner
    return is_compile_time_constant(v) and not (op is not None and op.name == "arith.constant"
                                                 and op.attrs.get("value") == 0)


def _integer(v: Value) -> bool:
    elem = T.element_type(v.type)
    return isinstance(elem, T.ScalarType) and elem.is_int


def may_hold_constant_addend(v: Value) -> bool:
    """Whether LLVM may see the integer offset ``v`` as ``a + c``, c a nonzero compile-time constant
    (module docstring). A constant offset itself is not: its address has no run-time index."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        op = x.owner
        if op is None or is_compile_time_constant(x):
            continue
        if op.name == "arange":
            if op.attrs.get("start", 0):
                return True
            continue
        if op.name in _THROUGH or op.name == "arith.unary":
            stack.extend(y for y in op.operands if _integer(y))
        elif op.name == "arith.select":
            stack.extend(op.operands[1:])
        elif op.name == "arith.binary":
            kind, (lhs, rhs) = op.attrs.get("op"), op.operands
            if kind in ("add", "sub"):
                if _nonzero_constant(lhs) or _nonzero_constant(rhs):
                    return True
                stack.extend((lhs, rhs))
            elif kind in ("mul", "shl", "or"):
                stack.extend(y for y in (lhs, rhs) if not is_compile_time_constant(y)
                             and (kind == "or" or is_compile_time_constant(rhs if y is lhs else lhs)))
    return False
