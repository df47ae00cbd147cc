"""The layout rules the ops share (``OpDef.layout``, frontend/ops/opdefs.py).

Layout inference (``inference.py``) asks each op's rule to propagate layouts through it, forward and
backward, and then to insert the conversions its edges need. The rules here:

* :data:`ELEMENTWISE` — every tile operand and result shares one layout (arithmetic, ``load``,
  ``store``, ``addptr``);
* :data:`EXPAND_DIMS`, :data:`BROADCAST`, :data:`REDUCE`, :data:`PERMUTE`, :data:`RESHAPE` —
  the result's layout is the operand's, transformed;
* :func:`accumulator` — the accumulator operand and the result share a layout (the MMA family); the
  other operands take the target's anchors (``target.hooks.TargetHooks``);
* :data:`CARRIED` — loop-carried and branch-merged values share one layout (``scf.*``).
"""

from __future__ import annotations

from ..ir import types as T
from ..ir.core import Block, Operation, Value
from ..ops.opdefs import LayoutGet, LayoutResolver, LayoutRule, LayoutSet
from .layouts import LinearLayout
from .tile import broadcast_layout, drop_dim, insert_unit_dim, permute_layout, remove_unit_dim, reshape_layout


def is_tile(v: Value) -> bool:
    return isinstance(v.type, T.TileType)


def project(layout: LinearLayout, src_shape: tuple[int, ...]) -> LinearLayout:
    """``layout`` of a broadcast result, seen from its size-1 source dims (their bits zeroed)."""
    rows = {}
    for name in layout.in_names:
        rows[name] = [tuple(c if src_shape[d] != 1 else 0 for d, c in enumerate(layout.basis(name, b).values()))
                      for b in range(layout.in_bits(name))]
    return LinearLayout.from_bases(rows, [(f"dim{i}", s) for i, s in enumerate(src_shape)])


def _share(group: list[Value], get: LayoutGet, set: LayoutSet) -> bool:
    known = next((get(v) for v in group if get(v) is not None), None)
    changed = False
    if known is not None:
        for v in group:
            changed |= set(v, known)
    return changed


# ------------------------------------------------------------------------------------------------
# elementwise
# ------------------------------------------------------------------------------------------------
def _elementwise(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    return _share([v for v in [*op.operands, *op.results] if is_tile(v)], get, set)


def _elementwise_resolve(op: Operation, r: LayoutResolver) -> None:
    # the result's layout (a scalar result has scalar operands: nothing to convert); ``store``, the
    # one elementwise op without a result, follows its pointers
    if op.results:
        ref = op.results[0].layout if is_tile(op.results[0]) else None
    else:
        ref = op.operand("ptr").layout
    for i, v in enumerate(op.operands):
        if is_tile(v) and ref is not None:
            r.convert_operand(op, i, ref)


ELEMENTWISE = LayoutRule("elementwise", _elementwise, _elementwise_resolve)


# ------------------------------------------------------------------------------------------------
# shape ops
# ------------------------------------------------------------------------------------------------
def _expand_dims(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    src, res, ax = op.operand("x"), op.result, op.attrs["axis"]
    if not is_tile(src):
        return False
    if get(src) is not None:
        return set(res, insert_unit_dim(get(src), ax))
    if get(res) is not None:
        return set(src, remove_unit_dim(get(res), ax))
    return False


def _expand_dims_resolve(op: Operation, r: LayoutResolver) -> None:
    if is_tile(op.operand("x")):
        r.convert_operand(op, op.operand_index("x"), remove_unit_dim(op.result.layout, op.attrs["axis"]))


EXPAND_DIMS = LayoutRule("expand_dims", _expand_dims, _expand_dims_resolve)


def _broadcast(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    src, res = op.operand("x"), op.result
    if get(res) is not None:
        return set(src, project(get(res), T.shape_of(src.type)))
    if get(src) is not None:
        return set(res, broadcast_layout(get(src), T.shape_of(res.type)))
    return False


def _broadcast_resolve(op: Operation, r: LayoutResolver) -> None:
    r.convert_operand(op, op.operand_index("x"), project(op.result.layout, T.shape_of(op.operand("x").type)))


BROADCAST = LayoutRule("broadcast", _broadcast, _broadcast_resolve)


def _reduce(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    if get(op.operand("x")) is not None and is_tile(op.result):
        return set(op.result, drop_dim(get(op.operand("x")), op.attrs["axis"]))
    return False


def _reduce_resolve(op: Operation, r: LayoutResolver) -> None:
    if is_tile(op.result):
        derived = drop_dim(op.operand("x").layout, op.attrs["axis"])
        if derived != op.result.layout:
            r.convert_result(op, derived)


REDUCE = LayoutRule("reduce", _reduce, _reduce_resolve)


def _inverse(perm: list[int]) -> list[int]:
    return [perm.index(i) for i in range(len(perm))]


def _permute(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    perm, src = op.attrs["perm"], op.operand("x")
    if get(src) is not None:
        return set(op.result, permute_layout(get(src), perm))
    if get(op.result) is not None:
        return set(src, permute_layout(get(op.result), _inverse(perm)))
    return False


def _permute_resolve(op: Operation, r: LayoutResolver) -> None:
    r.convert_operand(op, op.operand_index("x"), permute_layout(op.result.layout, _inverse(op.attrs["perm"])))


PERMUTE = LayoutRule("permute", _permute, _permute_resolve)


def _reshape(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    src = op.operand("x")
    if not is_tile(src):
        return False
    if get(src) is not None:
        return set(op.result, reshape_layout(get(src), T.shape_of(op.result.type)))
    if get(op.result) is not None:
        return set(src, reshape_layout(get(op.result), T.shape_of(src.type)))
    return False


def _reshape_resolve(op: Operation, r: LayoutResolver) -> None:
    src = op.operand("x")
    if is_tile(src):
        r.convert_operand(op, op.operand_index("x"), reshape_layout(op.result.layout, T.shape_of(src.type)))


RESHAPE = LayoutRule("reshape", _reshape, _reshape_resolve)


# ------------------------------------------------------------------------------------------------
# the MMA family
# ------------------------------------------------------------------------------------------------
def accumulator(name: str = "acc") -> LayoutRule:
    """The operand ``name`` and the result share a layout; the other operands are converted to the
    layouts the target anchors them at."""

    def propagate(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
        acc, res = op.operand(name), op.result
        changed = False
        for a, b in ((acc, res), (res, acc)):
            if get(a) is not None:
                changed |= set(b, get(a))
        return changed

    def resolve(op: Operation, r: LayoutResolver) -> None:
        index = op.operand_index(name)
        r.convert_operand(op, index, op.result.layout)
        anchors = r.anchored(op)
        for i, v in enumerate(op.operands):
            want = anchors.get(id(v))
            if want is not None and is_tile(v) and i != index:
                r.convert_operand(op, i, want)

    return LayoutRule(f"accumulator({name!r})", propagate, resolve)


# ------------------------------------------------------------------------------------------------
# structured control flow
# ------------------------------------------------------------------------------------------------
def carried_groups(op: Operation) -> list[list[Value]]:
    """The values of ``scf.for`` / ``scf.if`` / ``scf.while`` that must share one layout: an
    initial value, the block arguments, the yielded values and the result."""
    groups: list[list[Value]] = []
    if op.name == "scf.for":
        body = op.regions[0].block
        term = body.terminator
        inits = op.operand_group("init")
        for i, r in enumerate(op.results):
            g = [inits[i], body.args[1 + i], r]
            if term is not None:
                g.append(term.operand_group("value")[i])
            groups.append([v for v in g if is_tile(v)])
    elif op.name == "scf.if":
        for i, r in enumerate(op.results):
            g = [r] + [reg.block.terminator.operand_group("value")[i] for reg in op.regions
                       if reg.block.terminator is not None]
            groups.append([v for v in g if is_tile(v)])
    elif op.name == "scf.while":
        before, after = op.regions[0].block, op.regions[1].block
        inits = op.operand_group("init")
        for i, r in enumerate(op.results):
            g = [inits[i], before.args[i], after.args[i], r]
            if before.terminator is not None:  # scf.condition: cond, value0, ...
                g.append(before.terminator.operand_group("value")[i])
            if after.terminator is not None:
                g.append(after.terminator.operand_group("value")[i])
            groups.append([v for v in g if is_tile(v)])
    return groups


def _carried(op: Operation, get: LayoutGet, set: LayoutSet) -> bool:
    changed = False
    for group in carried_groups(op):
        changed |= _share(group, get, set)
    return changed


def _loop_resolve(op: Operation, r: LayoutResolver) -> None:
    name = op.name
    first = 3 if name == "scf.for" else 0
    for i, res in enumerate(op.results):
        if is_tile(res):
            for region in op.regions:  # block args carry the results' layout
                arg = region.block.args[i + (1 if name == "scf.for" else 0)]
                if arg.layout != res.layout:
                    retype_block_arg(region.block, arg, res.layout)
            r.convert_operand(op, first + i, res.layout)
            for region in op.regions:
                term = region.block.terminator
                if term is not None:
                    off = 1 if term.name == "scf.condition" else 0
                    r.convert_operand(term, off + i, res.layout)


def _if_resolve(op: Operation, r: LayoutResolver) -> None:
    for i, res in enumerate(op.results):
        if is_tile(res):
            for region in op.regions:
                term = region.block.terminator
                assert term is not None
                r.convert_operand(term, i, res.layout)


LOOP = LayoutRule("carried (loop)", _carried, _loop_resolve)
BRANCH = LayoutRule("carried (branch)", _carried, _if_resolve)


def retype_block_arg(block: Block, arg: Value, layout: LinearLayout) -> None:
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
