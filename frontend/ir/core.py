"""The typed IR: SSA values, operations with attributes and spans, and regions for structured
control flow (``scf.for``, ``scf.if``, ``scf.while``).

Operations are generic records (``name``, operands, results, attributes, regions, span); what an op
*means* (its typing rule, interpreter semantics, layout rule, legality rule) lives in its
:class:`~sparsile.frontend.ops.opdefs.OpDef`, registered once by name. The printer gives a stable text
form (``sparsile compile --emit ir``) that tests snapshot; the verifier checks structural
invariants and each op's own ``verify`` rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import InternalError
from ..spans import UNKNOWN_SPAN, Span
from .types import Type


class Value:
    """An SSA value: the result of an operation or an argument of a block."""

    __slots__ = ("block", "index", "layout", "name_hint", "owner", "type")

    def __init__(self, type: Type, owner: Operation | None = None, index: int = 0, name_hint: str = ""):
        self.type = type
        self.owner = owner
        self.block: Block | None = None
        self.index = index
        self.name_hint = name_hint
        self.layout: Any = None  # set by layout inference (a LinearLayout or a memory layout)

    def __repr__(self) -> str:
        return f"Value({self.name_hint or '?'}: {self.type})"


@dataclass(eq=False)
class Block:
    """A straight-line list of operations with block arguments (loop induction variables and
    loop-carried values)."""

    args: list[Value] = field(default_factory=list)
    ops: list[Operation] = field(default_factory=list)
    parent: Operation | None = None

    def add_arg(self, type: Type, name_hint: str = "") -> Value:
        v = Value(type, None, len(self.args), name_hint)
        v.block = self
        self.args.append(v)
        return v

    def append(self, op: Operation) -> Operation:
        op.block = self
        self.ops.append(op)
        return op

    def insert_before(self, anchor: Operation, op: Operation) -> Operation:
        op.block = self
        self.ops.insert(self.ops.index(anchor), op)
        return op

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops else None


@dataclass(eq=False)
class Region:
    """A single-block region (sparsile's control flow is structured)."""

    block: Block = field(default_factory=Block)


OPERAND_NAMES: dict[str, Callable[[Operation], tuple[str, ...]]] = {}
"""Op name -> the names of an op's operands; filled by ``frontend/ops/opdefs.define_op`` (the IR
sits below the op registry, so the registry fills this table in)."""


@dataclass(eq=False)
class Operation:
    name: str
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    span: Span = UNKNOWN_SPAN
    block: Block | None = None

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def walk(self) -> Iterator[Operation]:
        """This op and every op nested in its regions, in program order."""
        yield self
        for region in self.regions:
            for op in region.block.ops:
                yield from op.walk()

    def operand_index(self, name: str) -> int:
        """The position of the operand named ``name`` by the op's definition (``frontend/ops/opdefs.py``)."""
        names = OPERAND_NAMES[self.name](self) if self.name in OPERAND_NAMES else ()
        if name not in names:
            raise InternalError(f"`{self.name}` has no operand named {name!r} (it has {names})")
        return names.index(name)

    def operand(self, name: str) -> Value:
        """The operand named ``name`` by the op's definition (``op.operand("acc")``)."""
        return self.operands[self.operand_index(name)]

    def optional_operand(self, name: str) -> Value | None:
        """The operand named ``name``, or None where this op has none of that name (``load``'s
        ``mask`` without ``has_mask``)."""
        names = OPERAND_NAMES[self.name](self) if self.name in OPERAND_NAMES else ()
        return self.operands[names.index(name)] if name in names else None

    def operand_group(self, prefix: str) -> list[Value]:
        """The operands of a variadic group, in order: those named ``prefix0, prefix1, ...``
        (``scf.for``'s ``init``, ``scf.yield``'s ``value``, ``tma.load``'s ``offset``)."""
        names = OPERAND_NAMES[self.name](self) if self.name in OPERAND_NAMES else ()
        return [v for n, v in zip(names, self.operands, strict=False)
                if n.startswith(prefix) and n[len(prefix):].isdigit()]

    def set_operand(self, index: int, value: Value) -> None:
        self.operands[index] = value

    def __repr__(self) -> str:
        return f"Operation({self.name})"


@dataclass(eq=False)
class Param:
    """A kernel parameter: a runtime value (``value`` is its block argument) or a compile-time
    constant (``value`` is None and ``constant`` holds it)."""

    name: str
    type: Type | None
    value: Value | None = None
    constant: Any = None
    span: Span = UNKNOWN_SPAN
    divisible_16: bool = False  # pointer 16-byte aligned / integer a multiple of 16 (specialization)

    @property
    def is_constexpr(self) -> bool:
        return self.value is None


@dataclass(eq=False)
class Function:
    """A kernel after sema: parameters, a body region and kernel attributes (``num_warps``,
    ``target``, constexpr values, ...)."""

    name: str
    params: list[Param]
    body: Region
    attrs: dict[str, Any] = field(default_factory=dict)
    span: Span = UNKNOWN_SPAN

    @property
    def runtime_params(self) -> list[Param]:
        return [p for p in self.params if not p.is_constexpr]

    def walk(self) -> Iterator[Operation]:
        for op in self.body.block.ops:
            yield from op.walk()


def replace_all_uses(func: Function, old: Value, new: Value) -> None:
    """Point every use of ``old`` in ``func`` at ``new``."""
    for op in func.walk():
        for i, v in enumerate(op.operands):
            if v is old:
                op.operands[i] = new


def users(func: Function, value: Value) -> list[Operation]:
    return [op for op in func.walk() if any(v is value for v in op.operands)]


class Builder:
    """Appends operations at an insertion point; every op it builds carries a span."""

    def __init__(self, block: Block):
        self.block = block
        self._before: Operation | None = None

    def set_insertion_point_end(self, block: Block) -> None:
        self.block = block
        self._before = None

    def set_insertion_point_before(self, op: Operation) -> None:
        assert op.block is not None
        self.block = op.block
        self._before = op

    def create(self, name: str, operands: list[Value], result_types: list[Type], attrs: dict[str, Any] | None = None,
               span: Span = UNKNOWN_SPAN, regions: int = 0) -> Operation:
        op = Operation(name, list(operands), [], dict(attrs or {}), [Region(Block()) for _ in range(regions)], span)
        for r in op.regions:
            r.block.parent = op
        op.results = [Value(t, op, i) for i, t in enumerate(result_types)]
        if self._before is not None:
            self.block.insert_before(self._before, op)
        else:
            self.block.append(op)
        return op
