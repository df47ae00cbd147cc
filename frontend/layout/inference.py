"""Layout inference: give every tile value a register layout.

1. **Anchors**: the pointer tile of a ``load``/``store`` gets a coalesced blocked layout whose
   vector width comes from axis analysis (16-byte accesses where contiguity, alignment and mask
   constancy allow); tensor-core ops ask the target for their operand/accumulator layouts.
2. **Propagation**, forward and backward, through ops that move no data: elementwise ops share one
   layout; ``expand_dims``, ``broadcast``, ``reduce``, ``permute``, ``reshape`` transform it;
   loop-carried and branch-merged values share one layout. The first demand wins.
3. **Defaults**: a tile nobody constrained gets the default blocked layout of its shape.
4. **Resolution**: where an op's operand does not have the layout the op needs, a
   ``convert_layout`` is inserted on that edge — only where two demands meet.

Layouts show in ``--emit ir`` after the type of each value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..diagnostics import CompileError, Diagnostic
from ..ir import types as T
from ..ir.axis_info import AxisAnalysis
from ..ir.core import Block, Builder, Function, Operation, Value
from ..ops.opdefs import OPS
from ..spans import UNKNOWN_SPAN
from .layouts import LayoutError, LinearLayout
from .tile import (
    broadcast_layout,
    default_blocked,
    drop_dim,
    insert_unit_dim,
    permute_layout,
    remove_unit_dim,
    reshape_layout,
)

SAME = {"arith.binary", "arith.cmp", "arith.unary", "math", "arith.select", "arith.cast", "addptr", "load",
        "store"}

# ops whose accumulator operand (at this index) and result share a layout
ACC_INDEX = {"dot": 2, "sparse_dot": 3, "hopper.wgmma": 2, "hopper.wgmma_wait": 0}

REMATERIALIZABLE = {"arith.constant", "splat", "arange", "arith.binary", "arith.cmp", "arith.unary", "arith.cast",
                    "arith.select", "addptr", "broadcast", "expand_dims"}

# A target may anchor tensor-core ops: (op, num_warps) -> {value id: layout}
AnchorHook = Callable[[Operation, int], dict[int, LinearLayout]]

SP_WARPS_NOT_POW2 = "SP0250"
"""A register tile in a kernel (or warp_specialize partition) whose warp count is not a power of
two: distributed layouts spread a tile over a power-of-two number of warps (docs/language.md)."""


def is_tile(v: Value) -> bool:
    return isinstance(v.type, T.TileType)


def project(layout: LinearLayout, src_shape: tuple[int, ...]) -> LinearLayout:
    """``layout`` of a broadcast result, seen from its size-1 source dims (their bits zeroed)."""
    rows = {}
    for name in layout.in_names:
        rows[name] = [tuple(c if src_shape[d] != 1 else 0 for d, c in enumerate(layout.basis(name, b).values()))
                      for b in range(layout.in_bits(name))]
    return LinearLayout.from_bases(rows, [(f"dim{i}", s) for i, s in enumerate(src_shape)])


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
            if op.name == "load" and is_tile(op.operands[0]) and self._get(op.result) is not None:
                self._set(op.operands[0], self._get(op.result))  # the consumer already chose (e.g. wgmma)
                continue
            if op.name in ("load", "store") and is_tile(op.operands[0]):
                shape = T.shape_of(op.operands[0].type)
                widest[shape] = max(widest.get(shape, 1), self.vector_elems(op.operands[0]))
                anchored.append((op.operands[0], shape))
                where[id(op.operands[0])] = op
            elif op.name in ("tensor.load_tile", "tensor.store_tile"):
                v = op.result if op.name == "tensor.load_tile" else op.operands[-1]
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
        self.where = op
        name = op.name
        changed = False
        if name in SAME:
            group = [v for v in [*op.operands, *op.results] if is_tile(v)]
            known = next((self._get(v) for v in group if self._get(v) is not None), None)
            if known is not None:
                for v in group:
                    changed |= self._set(v, known)
        elif name == "expand_dims" and is_tile(op.operands[0]):
            src, res, ax = op.operands[0], op.result, op.attrs["axis"]
            if self._get(src) is not None:
                changed |= self._set(res, insert_unit_dim(self._get(src), ax))  # type: ignore[arg-type]
            elif self._get(res) is not None:
                changed |= self._set(src, remove_unit_dim(self._get(res), ax))  # type: ignore[arg-type]
        elif name == "broadcast":
            src, res = op.operands[0], op.result
            if self._get(res) is not None:
                changed |= self._set(src, project(self._get(res), T.shape_of(src.type)))  # type: ignore[arg-type]
            elif self._get(src) is not None:
                changed |= self._set(res, broadcast_layout(self._get(src), T.shape_of(res.type)))  # type: ignore[arg-type]
        elif name == "reduce" and self._get(op.operands[0]) is not None and is_tile(op.result):
            changed |= self._set(op.result, drop_dim(self._get(op.operands[0]), op.attrs["axis"]))  # type: ignore[arg-type]
        elif name == "permute":
            perm = op.attrs["perm"]
            inv = [perm.index(i) for i in range(len(perm))]
            if self._get(op.operands[0]) is not None:
                changed |= self._set(op.result, permute_layout(self._get(op.operands[0]), perm))  # type: ignore[arg-type]
            elif self._get(op.result) is not None:
                changed |= self._set(op.operands[0], permute_layout(self._get(op.result), inv))  # type: ignore[arg-type]
        elif name == "reshape" and is_tile(op.operands[0]):
            if self._get(op.operands[0]) is not None:
                changed |= self._set(op.result, reshape_layout(self._get(op.operands[0]), T.shape_of(op.result.type)))  # type: ignore[arg-type]
            elif self._get(op.result) is not None:
                changed |= self._set(op.operands[0], reshape_layout(self._get(op.result),  # type: ignore[arg-type]
                                                                    T.shape_of(op.operands[0].type)))
        elif name in ACC_INDEX:
            acc, res = op.operands[ACC_INDEX[name]], op.result
            for a, b in ((acc, res), (res, acc)):
                if self._get(a) is not None:
                    changed |= self._set(b, self._get(a))  # type: ignore[arg-type]
        elif (d := OPS.get(name)) is not None and d.layout is not None:  # the op's own rule (ops/opdefs.py)
            changed |= bool(d.layout(op, self._get, self._set))
        for group in _carried_groups(op):
            known = next((self._get(v) for v in group if self._get(v) is not None), None)
            if known is not None:
                for v in group:
                    changed |= self._set(v, known)
        return changed

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
            src = d.operands[0]
            if not is_tile(src):
                new_operands = [src]
            else:
                want = project(layout, T.shape_of(src.type)) if d.name == "broadcast" else \
                    remove_unit_dim(layout, d.attrs["axis"])
                y = src if src.layout == want else self._rematerialize(src, want, before, depth + 1)
                if y is None:
                    return None
                new_operands = [y]
        elif d.name in SAME and d.name not in ("load", "store"):
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
        name = op.name
        if name in SAME:
            ref = op.results[0].layout if op.results and is_tile(op.results[0]) else op.operands[0].layout
            for i, v in enumerate(op.operands):
                if is_tile(v) and ref is not None:
                    self._convert_before(op, i, ref)
        elif name == "expand_dims" and is_tile(op.operands[0]):
            self._convert_before(op, 0, remove_unit_dim(op.result.layout, op.attrs["axis"]))
        elif name == "broadcast":
            self._convert_before(op, 0, project(op.result.layout, T.shape_of(op.operands[0].type)))
        elif name == "permute":
            perm = op.attrs["perm"]
            inv = [perm.index(i) for i in range(len(perm))]
            self._convert_before(op, 0, permute_layout(op.result.layout, inv))
        elif name == "reshape" and is_tile(op.operands[0]):
            self._convert_before(op, 0, reshape_layout(op.result.layout, T.shape_of(op.operands[0].type)))
        elif name == "reduce" and is_tile(op.result):
            derived = drop_dim(op.operands[0].layout, op.attrs["axis"])
            if derived != op.result.layout:
                _convert_result(op, derived)
        elif name in ACC_INDEX:
            self._convert_before(op, ACC_INDEX[name], op.result.layout)
            if self.anchor_hook is not None:
                for i, v in enumerate(op.operands):
                    want = self.anchor_hook(op, self.num_warps).get(id(v))
                    if want is not None and is_tile(v) and i != ACC_INDEX[name]:
                        self._convert_before(op, i, want)
        elif name in ("scf.for", "scf.while"):
            first = 3 if name == "scf.for" else 0
            for i, r in enumerate(op.results):
                if is_tile(r):
                    for region in op.regions:  # block args carry the results' layout
                        arg = region.block.args[i + (1 if name == "scf.for" else 0)]
                        if arg.layout != r.layout:
                            _retype_block_arg(region.block, arg, r.layout)
                    self._convert_before(op, first + i, r.layout)
                    for region in op.regions:
                        term = region.block.terminator
                        if term is not None:
                            off = 1 if term.name == "scf.condition" else 0
                            self._convert_before(term, off + i, r.layout)
        elif name == "scf.if":
            for i, r in enumerate(op.results):
                if is_tile(r):
                    for region in op.regions:
                        term = region.block.terminator
                        assert term is not None
                        self._convert_before(term, i, r.layout)


def _carried_groups(op: Operation) -> list[list[Value]]:
    groups: list[list[Value]] = []
    if op.name == "scf.for":
        body = op.regions[0].block
        term = body.terminator
        for i, r in enumerate(op.results):
            g = [op.operands[3 + i], body.args[1 + i], r]
            if term is not None:
                g.append(term.operands[i])
            groups.append([v for v in g if is_tile(v)])
    elif op.name == "scf.if":
        for i, r in enumerate(op.results):
            g = [r] + [reg.block.terminator.operands[i] for reg in op.regions if reg.block.terminator is not None]
            groups.append([v for v in g if is_tile(v)])
    elif op.name == "scf.while":
        before, after = op.regions[0].block, op.regions[1].block
        for i, r in enumerate(op.results):
            g = [op.operands[i], before.args[i], after.args[i], r]
            if before.terminator is not None:
                g.append(before.terminator.operands[1 + i])
            if after.terminator is not None:
                g.append(after.terminator.operands[i])
            groups.append([v for v in g if is_tile(v)])
    return groups


def _retype_block_arg(block: Block, arg: Value, layout: LinearLayout) -> None:
    """Give a loop-carried block argument the loop's layout; its users that expected another one
    read it through a conversion at the top of the body."""
    old_layout = arg.layout
    arg.layout = layout
    users = [op for op in block.ops if any(v is arg for v in op.operands)]
    if not users or old_layout is None:
        return
    conv = Operation("convert_layout", [arg], [], {}, [], block.ops[0].span, block)
    new = Value(arg.type, conv, 0)
    new.layout = old_layout
    conv.results = [new]
    block.ops.insert(0, conv)
    for op in block.ops[1:]:
        _replace_in(op, arg, new)


def _replace_in(op: Operation, old: Value, new: Value) -> None:
    op.operands = [new if v is old else v for v in op.operands]
    for region in op.regions:
        for inner in region.block.ops:
            _replace_in(inner, old, new)


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
