"""Whether an integer offset of an ``addptr`` may be ``a + c`` with c a compile-time constant, the form
whose constant LLVM's NVPTX code generation separates from a sign-extended address index, and whether
a tile's registers may differ by constants.

docs/language.md rule 7: ``p + offs`` is ``p + sext(offs) * E`` with the wrapped i32 ``offs``. LLVM 22's
NVPTX pipeline (the separation of constant offsets from ``getelementptr`` indices, the straight-line
strength reduction) rewrites ``getelementptr p, sext(a + c)`` as ``getelementptr p, sext(a)`` plus
``c * E`` bytes, which is another address where the i32 sum ``a + c`` wraps
(``load(x + (s + 128))`` with ``s = 2**31 - 100`` addressed ``x + (2**31 + 28) * E``, not ``x - (2**31 -
28) * E``). lower_addptr gives such offsets wide_address.py's opaque ``mad.wide.s32`` instead.

LLVM finds constants where the source has none next to a ``+``: ``s ^ -2**31`` is canonicalized to
``s + -2**31``, ``where(c, 129, 128)`` to ``zext(c) + 128``, ``(t & 0) | 128`` and ``128 >> (t * 0)``
fold to ``128`` (review 51 executed each). So :func:`may_hold_constant_addend` does not look for
constants; it proves their absence and answers True wherever it cannot. The proof: an offset built
from opaque leaves (parameters, loop-carried values, ``program_id``, ``num_programs``, loads, tensor
dims and strides, ``arange(0, ...)``, whose per-register constants address_form.py's proof or
:func:`registers_may_differ_by_constants` covers) by operations ``f`` with ``f(0, ..., 0) = 0``
(``+``, ``-``, ``*``, ``&``, ``|``, ``^``, shifts of such a value, ``max``/``min``, negation, integer
casts, ``select`` of such arms, the shape ops; a constant operand only where the result stays 0 at 0:
a factor, a mask, a shift amount, a divisor) is 0 where every leaf is 0, so any constant LLVM folds
out of it is 0 and no ``+ c`` with c nonzero can appear. A division by a run-time value is not
such a value (``s // s`` is 1), nor ``~x``, a comparison, ``math`` or an ``scf.if`` result.
"""

from __future__ import annotations

from ...frontend.ir.core import Value

_THROUGH = frozenset(("splat", "broadcast", "expand_dims", "reshape", "permute", "arith.cast",
                      "convert_layout", "reduce"))
"""Ops whose result's elements are their operand's (or its integer cast's, or a reduction of them),
traced through."""

_LEAVES = frozenset(("program_id", "num_programs", "load", "tensor.dim", "tensor.stride", "cluster.rank",
                     "atomic_rmw", "atomic_cas", "smem.load", "tmem.load", "scf.for", "scf.while"))
"""Ops whose integer results LLVM cannot see as a sum with a constant (loop results: docs/language.md
rule 7's documented exception)."""

_ZERO_AT_ZERO = frozenset(("add", "sub", "and", "or", "xor", "max", "min", "mul"))
"""Binary kinds with ``f(0, 0) = 0``: addend-free operands give an addend-free result."""


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


def _zero_constant(v: Value) -> bool:
    op = v.owner
    return op is not None and op.name == "arith.constant" and op.attrs.get("value") in (0, 0.0, False)


def _operands_ok(op_name: str, kind: object, operands: list[Value], free: dict[int, bool]) -> bool | None:
    """Whether the result of ``op_name`` (binary ``kind``) over ``operands`` is addend-free given the
    operands' answers in ``free`` (None: an operand is not decided yet)."""
    def ok(x: Value, const_ok: bool) -> bool | None:
        if is_compile_time_constant(x):
            return const_ok or _zero_constant(x)
        return free.get(id(x))

    if op_name == "arith.binary":
        lhs, rhs = operands
        if kind in ("mul", "and") and (_zero_constant(lhs) or _zero_constant(rhs)):
            checks = [True]
        elif kind in ("mul", "and") and (is_compile_time_constant(lhs) or is_compile_time_constant(rhs)):
            checks = [ok(rhs if is_compile_time_constant(lhs) else lhs, False)]
        elif kind in ("mul", "and"):  # (0 times / and a run-time value is 0: one such operand suffices)
            a, b = ok(lhs, False), ok(rhs, False)
            checks = [True if a or b else (None if None in (a, b) else False)]
        elif kind in _ZERO_AT_ZERO:
            checks = [ok(lhs, False), ok(rhs, False)]
        elif kind in ("floordiv", "div", "mod") and not is_compile_time_constant(rhs):
            checks = [kind == "mod" or lhs is not rhs]  # (a quotient by a run-time value: opaque, but x // x)
        elif kind in ("shl", "shr", "mod"):
            checks = [ok(lhs, False)]
        elif kind in ("floordiv", "div"):
            checks = [ok(lhs, False), not _zero_constant(rhs)]
        else:
            return False
    elif op_name == "arith.select":
        checks = [ok(x, False) for x in operands[1:]]
    else:  # _THROUGH, neg
        checks = [ok(x, False) for x in operands]
    if any(c is False for c in checks):
        return False
    return None if any(c is None for c in checks) else True


def _addend_free(v: Value) -> bool:
    """Whether ``v`` is built from opaque leaves by operations that keep it 0 where they are 0 (module
    docstring): LLVM then finds no nonzero constant in it."""
    free: dict[int, bool] = {}
    stack = [v]
    while stack:
        x = stack[-1]
        if id(x) in free:
            stack.pop()
            continue
        op = x.owner
        if op is None or op.name in _LEAVES:
            free[id(x)] = True
        elif op.name == "arange":
            free[id(x)] = not op.attrs.get("start", 0)
        elif is_compile_time_constant(x):
            free[id(x)] = _zero_constant(x)
        elif op.name in _THROUGH or op.name in ("arith.binary", "arith.select") or (
                op.name == "arith.unary" and op.attrs.get("op") == "neg"):
            answer = _operands_ok(op.name, op.attrs.get("op"), list(op.operands), free)
            if answer is None:
                stack.extend(y for y in op.operands if id(y) not in free and not is_compile_time_constant(y))
                continue
            free[id(x)] = answer
        else:
            free[id(x)] = False
        stack.pop()
    return free[id(v)]


def may_hold_constant_addend(v: Value) -> bool:
    """Whether LLVM may see the integer offset ``v`` as ``a + c``, c a nonzero compile-time constant
    (module docstring: True unless proven otherwise). A constant offset itself is not: its address has
    no run-time index."""
    return not is_compile_time_constant(v) and not _addend_free(v)


def registers_may_differ_by_constants(v: Value) -> bool:
    """Whether some registers of the offset tile ``v`` may differ by compile-time constants, which
    LLVM's straight-line strength reduction relates: ``v`` depends on an ``arange`` other than
    through a product or quotient by a run-time value (``s + arange(0, B) * 2``; ``rows * ldc`` is
    not)."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen or x.owner is None:
            continue
        seen.add(id(x))
        op = x.owner
        if op.name == "arange":
            return True
        if op.name == "arith.binary":
            kind, (lhs, rhs) = op.attrs.get("op"), op.operands
            if kind == "mul" and not (is_compile_time_constant(lhs) or is_compile_time_constant(rhs)):
                continue  # (a product by a run-time value)
            if kind in ("shl", "shr", "floordiv", "div", "mod", "pow") and not is_compile_time_constant(rhs):
                continue
            stack.extend((lhs, rhs))
        elif op.name == "arith.select":
            stack.extend(op.operands[1:])
        elif op.name == "arith.unary" or op.name in _THROUGH:
            stack.extend(op.operands)
    return False


def depends_on_loop_value(v: Value) -> bool:
    """Whether ``v`` is computed from a loop's induction variable or carried value (docs/language.md
    rule 7's documented exception: a proven block's base offset ``(k + 2) * KW + ...`` in a K loop
    keeps its ``getelementptr inbounds``, which the strength reduction relates from step to step)."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.owner is None:
            if x.block is not None and x.block.parent is not None:
                return True
            continue
        if x.owner.name in ("scf.for", "scf.while"):
            return True
        stack.extend(x.owner.operands)
    return False
