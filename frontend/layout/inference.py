"""Layout inference: give every tile value a register layout.

1. **Anchors**: the pointer tile of a ``load``/``store`` gets a coalesced blocked layout whose
   vector width comes from axis analysis (16-byte accesses where contiguity, alignment and mask
   constancy allow); tensor-core ops ask the target for their operand/accumulator layouts.
2. **Propagation**, forward and backward, by each op's layout rule (``OpDef.layout``, the shared
   rules of ``rules.py``): elementwise ops share one layout; ``expand_dims``, ``broadcast``,
   ``reduce``, ``permute``, ``reshape`` transform it; an MMA's accumulator and result share one;
   loop-carried and branch-merged values share one layout. The first demand wins.
3. **Defaults**: a tile nobody constrained gets the default blocked layout of its shape.
4. **Resolution**: where an op's operand does not have the layout the op needs (the op's layout
   rule says which), a ``convert_layout`` is inserted on that edge — only where two demands meet.

Layouts show in ``--emit ir`` after the type of each value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..ir.axis_info import AxisAnalysis
from ..ir.core import Block, Builder, Function, Operation, Value
from ..ops.opdefs import OPS, LayoutRule
from ..spans import UNKNOWN_SPAN
from .gf2 import LayoutError
from .layouts import LinearLayout
from .rules import ELEMENTWISE, is_tile, project
from .tile import default_blocked, remove_unit_dim

REMATERIALIZABLE = {"arith.constant", "splat", "arange", "arith.binary", "arith.cmp", "arith.unary", "arith.cast",
                    "arith.select", "addptr", "broadcast", "expand_dims"}

# A target may anchor tensor-core ops: (op, num_warps) -> {value id: layout}
AnchorHook = Callable[[Operation, int], dict[int, LinearLayout]]

SP_WARPS_NOT_POW2 = "SP0250"
"""A register tile in a kernel (or warp_specialize partition) whose warp count is not a power of
two: distributed layouts spread a tile over a power-of-two number of warps (docs/language.md)."""


def walk_partition(block: Block) -> list[Operation]:
    """The ops of ``block`` and its nested regions, except those of nested ``warp_specialize``
    partitions (which run on other warps and are inferred separately)."""
    out: list[Operation] = []
    for op in block.ops:
        out.append(op)
        if op.name == "warp_specialize":
            continue
        for region in op.regions:
            out.extend(walk_partition(region.block))
    return out


class LayoutInference:
    def __init__(self, block: Block, num_warps: int, anchor_hook: AnchorHook | None, axis: AxisAnalysis):
        self.block = block
        self.num_warps = num_warps
        self.anchor_hook = anchor_hook
        self.axis = axis
        self.layout: dict[int, LinearLayout] = {}
        self.values: dict[int, Value] = {}
        self.where: Operation | None = None  # the op being laid out, for the span of a LayoutError

    # ------------------------------------------------------------------------------ driver
    def run(self) -> None:
        """Lay out this partition's tiles, then nested partitions'; a layout that cannot be built
        is a located diagnostic at the op that needed it (never a LayoutError traceback)."""
        try:
            self._run()
        except LayoutError as e:
            raise self._located(e) from None

    def _located(self, e: LayoutError) -> CompileError:
        op = self.where or next(iter(self.block.ops), None)
        span = op.span if op is not None else UNKNOWN_SPAN
        n = self.num_warps
        if n < 1 or n & (n - 1):
            tile = next((v.type for v in self.where.results if is_tile(v)), None) if self.where else None
            what = f"a {tile}" if tile is not None else "a register tile"
            return CompileError([Diagnostic(
                SP_WARPS_NOT_POW2, f"{what} needs a power-of-two number of warps to spread over, but this code "
                f"runs on {n} warps", span,
                help="use num_warps=4 or 8, or compute tiles inside a warp_specialize partition whose `warps=` "
                     "is a power of two")])
        return e.to_compile_error(span)

    def _run(self) -> None:
        ops = walk_partition(self.block)
        for op in ops:
            for v in [*op.operands, *op.results]:
                if is_tile(v):
                    self.values[id(v)] = v
            for region in op.regions:
                for a in region.block.args:
                    if is_tile(a):
                        self.values[id(a)] = a
        n = self.num_warps
        if self.values and (n < 1 or n & (n - 1)):
            # (default_blocked spread a tile over the largest power of two below n warps: the other
            # warps computed copies of it, and an atomic or a reduction through shared memory counted
            # their copies too, on the GPU only: the interpreter has no warps)
            first = next(iter(self.values.values()))
            self.where = first.owner if isinstance(first.owner, Operation) else None
            raise self._located(LayoutError(SP_WARPS_NOT_POW2, "register tile on a non-power-of-two warp count"))
        self._anchors(ops)
        self._fixpoint(ops)
        for vid, v in self.values.items():
            if vid not in self.layout:
                self.where = v.owner if isinstance(v.owner, Operation) else self.where
                self.layout[vid] = default_blocked(T.shape_of(v.type), self.num_warps)
        for vid, v in self.values.items():
            v.layout = self.layout[vid]
        self._resolve(self.block)
        for op in ops:
            if op.name == "warp_specialize":
                for region, warps in zip(op.regions, op.attrs["warps"], strict=True):
                    LayoutInference(region.block, warps, self.anchor_hook, self.axis).run()

    # ------------------------------------------------------------------------------ anchors
    def _fixpoint(self, ops: list[Operation]) -> None:
        changed = True
        while changed:
            changed = False
            for op in ops:
                changed |= self._propagate(op)
            for op in reversed(ops):
                changed |= self._propagate(op)

    def vector_elems(self, ptr: Value) -> int:
        """Elements per 16-byte-or-narrower access that axis analysis allows for a pointer tile."""
        shape = T.shape_of(ptr.type)
        elem = T.element_type(ptr.type)
        eb = elem.elem.bytes if isinstance(elem, T.PointerType) else 4
        info = self.axis.get(ptr)
        last = len(shape) - 1
        vec = max(1, 16 // eb)
        vec = min(vec, info.contiguity[last], max(1, info.divisibility[last] // eb), shape[last])
        return 1 << (max(1, vec).bit_length() - 1)

    def _anchors(self, ops: list[Operation]) -> None:
        # Tensor-core operands first: a load feeding an MMA is cheapest in the MMA's own layout.
        if self.anchor_hook is not None:
            for op in ops:
                self.where = op
                for vid, lay in self.anchor_hook(op, self.num_warps).items():
                    if vid not in self.layout:
                        self.layout[vid] = lay
            self._fixpoint(ops)  # spread them (through loops, into the loads feeding them) first
        # One layout per tile shape for every memory access of that shape: wide enough per thread
        # for the widest access (a narrower access still works on it), so that loads and stores of
        # one shape never need a conversion between them.
        widest: dict[tuple[int, ...], int] = {}
        anchored: list[tuple[Value, tuple[int, ...]]] = []
        where: dict[int, Operation] = {}
        for op in ops:
            self.where = op
            if op.name in ("load", "store") and is_tile(ptr := op.operand("ptr")):
                if op.name == "load" and self._get(op.result) is not None:
                    self._set(ptr, self._get(op.result))  # the consumer already chose (e.g. wgmma)
                    continue
                shape = T.shape_of(ptr.type)
                widest[shape] = max(widest.get(shape, 1), self.vector_elems(ptr))
                anchored.append((ptr, shape))
                where[id(ptr)] = op
            elif op.name in ("tensor.load_tile", "tensor.store_tile"):
                v = op.result if op.name == "tensor.load_tile" else op.operand("value")
                shape = T.shape_of(v.type)
                eb = T.element_type(v.type).bytes  # type: ignore[union-attr]
                widest[shape] = max(widest.get(shape, 1), max(1, 16 // eb))
                anchored.append((v, shape))
                where[id(v)] = op
        for v, shape in anchored:
            self.where = where[id(v)]
            self._set(v, default_blocked(shape, self.num_warps, widest[shape]))

    def _set(self, v: Value, layout: LinearLayout) -> bool:
        if id(v) in self.layout or not is_tile(v):
            return False
        self.layout[id(v)] = layout
        return True

    def _get(self, v: Value) -> LinearLayout | None:
        return self.layout.get(id(v))

    # ------------------------------------------------------------------------------ propagation
    def _propagate(self, op: Operation) -> bool:
        """Spread layouts through ``op`` by its definition's layout rule (``OpDef.layout``)."""
        self.where = op
        rule = _rule(op)
        return bool(rule.propagate(op, self._get, self._set)) if rule is not None else False

    # ------------------------------------------------------------------------------ resolution
    def _resolve(self, block: Block) -> None:
        for op in list(block.ops):
            if op.name != "warp_specialize":
                for region in op.regions:
                    self._resolve(region.block)
            self._resolve_op(op)

    def _convert_before(self, op: Operation, index: int, layout: LinearLayout) -> None:
        v = op.operands[index]
        if v.layout == layout:
            return
        clone = self._rematerialize(v, layout, op, depth=0)
        if clone is not None:
            op.operands[index] = clone
            return
        b = Builder(op.block)  # type: ignore[arg-type]
        b.set_insertion_point_before(op)
        conv = b.create("convert_layout", [v], [v.type], {}, op.span)
        conv.result.layout = layout
        op.operands[index] = conv.result

    def _rematerialize(self, v: Value, layout: LinearLayout, before: Operation, depth: int) -> Value | None:
        """Recompute a cheap value (constants, splats, aranges, and elementwise ops of them) in
        ``layout`` instead of converting it."""
        d = v.owner
        if d is None or depth > 4 or not is_tile(v):
            return None
        if d.name not in REMATERIALIZABLE or d.regions:
            return None
        if d.name in ("broadcast", "expand_dims"):
            src = d.operand("x")
            if not is_tile(src):
                new_operands = [src]
            else:
                want = project(layout, T.shape_of(src.type)) if d.name == "broadcast" else \
                    remove_unit_dim(layout, d.attrs["axis"])
                y = src if src.layout == want else self._rematerialize(src, want, before, depth + 1)
                if y is None:
                    return None
                new_operands = [y]
        elif _elementwise(d) and d.name not in ("load", "store"):
            new_operands = []
            for x in d.operands:
                if not is_tile(x):
                    new_operands.append(x)
                    continue
                if x.layout == layout:
                    new_operands.append(x)
                    continue
                y = self._rematerialize(x, layout, before, depth + 1)
                if y is None:
                    return None
                new_operands.append(y)
        else:
            new_operands = list(d.operands)
        b = Builder(before.block)  # type: ignore[arg-type]
        b.set_insertion_point_before(before)
        clone = b.create(d.name, new_operands, [v.type], dict(d.attrs), d.span)
        clone.result.layout = layout
        return clone.result

    def _resolve_op(self, op: Operation) -> None:
        self.where = op
        rule = _rule(op)
        if rule is not None and rule.resolve is not None:
            rule.resolve(op, self)

    # the LayoutResolver interface of the ops' layout rules (frontend/ops/opdefs.py)
    def convert_operand(self, op: Operation, index: int, layout: LinearLayout) -> None:
        """Read operand ``index`` of ``op`` in ``layout`` (recomputed or converted if it differs)."""
        self._convert_before(op, index, layout)

    def convert_result(self, op: Operation, layout: LinearLayout) -> None:
        """Produce ``op``'s result in ``layout`` and convert it to the one its users expect."""
        _convert_result(op, layout)

    def anchored(self, op: Operation) -> dict[int, LinearLayout]:
        """The layouts the target anchors ``op``'s values at (value id -> layout)."""
        return self.anchor_hook(op, self.num_warps) if self.anchor_hook is not None else {}


def _rule(op: Operation) -> LayoutRule | None:
    """The layout rule of ``op``'s definition (None for an op that declares none)."""
    d = OPS.get(op.name)
    return d.layout if d is not None and isinstance(d.layout, LayoutRule) else None


def _elementwise(op: Operation) -> bool:
    return _rule(op) is ELEMENTWISE


def _convert_result(op: Operation, layout: LinearLayout) -> None:
    """Give ``op`` a result in ``layout`` and convert it to the layout its users expect."""
    old = op.results[0]
    new = Value(old.type, op, 0)
    new.layout = layout
    op.results[0] = new
    block = op.block
    assert block is not None
    idx = block.ops.index(op)
    conv = Operation("convert_layout", [new], [old], {}, [], op.span, block)
    old.owner = conv
    old.index = 0
    block.ops.insert(idx + 1, conv)


def infer_layouts(func: Function, num_warps: int, anchor_hook: AnchorHook | None = None) -> Any:
    LayoutInference(func.body.block, num_warps, anchor_hook, AxisAnalysis(func)).run()
    return func
