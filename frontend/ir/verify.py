"""The IR verifier: structural invariants (every operand defined before use and visible from its
use, terminators where regions need them, known ops, one operand per name the op's definition
gives) plus each op's own ``verify`` rule.

A failure is a compiler bug (:class:`InternalError`), never a user diagnostic: sema and the passes
must only build valid IR.
"""

from __future__ import annotations

from ..diagnostics import InternalError
from ..ops.opdefs import OPS, load_all_ops
from .core import Block, Function, Operation


def verify_function(func: Function) -> None:
    load_all_ops()
    visible: set[int] = set()
    for p in func.runtime_params:
        assert p.value is not None
        visible.add(id(p.value))
    _verify_block(func.body.block, visible, top=True)


def _verify_block(block: Block, visible: set[int], top: bool = False) -> None:
    scope = set(visible)
    for a in block.args:
        scope.add(id(a))
    for i, op in enumerate(block.ops):
        _verify_op(op, scope)
        d = OPS.get(op.name)
        if d is not None and d.terminator and i != len(block.ops) - 1:
            raise InternalError(f"`{op.name}` must be the last op of its block", op.span)
        for r in op.results:
            scope.add(id(r))


def _verify_op(op: Operation, scope: set[int]) -> None:
    d = OPS.get(op.name)
    if d is None:
        raise InternalError(f"unknown IR op `{op.name}`", op.span)
    names = d.operand_names(op)
    if len(names) != len(op.operands):
        raise InternalError(f"`{op.name}` has {len(op.operands)} operands, its definition names {len(names)}: "
                            f"{', '.join(names) or 'none'}", op.span)
    for v in op.operands:
        if id(v) not in scope:
            raise InternalError(f"`{op.name}` uses a value that is not defined before it", op.span)
    for i, r in enumerate(op.results):
        if r.owner is not op or r.index != i:
            raise InternalError(f"`{op.name}` result {i} is not linked to its op", op.span)
    for region in op.regions:
        _verify_block(region.block, scope)
    if callable(d.verify):  # none(...) where the builtin types the op
        problem = d.verify(op)
        if problem:
            raise InternalError(f"invalid `{op.name}`: {problem}", op.span)
