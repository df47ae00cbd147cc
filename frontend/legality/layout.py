"""Layouts after inference: user pins, and stores of register tiles to shared memory.

Layout inference (``layout_inference.py``) gives every tile a layout and converts only where two
demands meet. This module, run at the start of the legality pass, adds the user's word:

* **Pins** (``pin(x, lay)`` / ``convert_layout(x, lay)``, :mod:`ops_layout`): the pinned value
  gets exactly ``lay`` (normalized to the warps of its partition; more lanes or warps than run
  the code is ``SP0421``). Users of the pinned value that inference laid out otherwise read it
  through an inserted ``convert_layout`` — except ops whose operand layout is fixed by the
  hardware (explicit-level tensor-core ops: the target's anchor hook says which layout; shared
  memory stores: a layout the store cannot take). There a pin that disagrees is ``SP0422`` with
  a help line naming the layout that would work: the pin is never converted away silently.
* **Stores to shared memory** (``buf.store(x)``, seed 002: an MMA accumulator — from wgmma, or
  loaded from TMEM by tcgen05.ld — stored to a swizzled buffer): every register layout of a
  byte-sized element type is storable (``layout_smem.storable_layout``: ``st.shared`` of runs,
  or of single elements, with the swizzle applied to each address), so inference keeps the
  accumulator's own layout and no conversion is needed. A layout that no plan can store
  (sub-byte elements without adjacent pairs) gets a conversion to
  ``layout_smem.storable_register_layout`` — or ``SP0422`` when the user pinned it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..diagnostics import Diagnostic, Label
from ..ir import types as T
from ..ir.core import Builder, Function, Operation, Value
from ..layout.layouts import LinearLayout
from ..layout.tile import LANE, REG, WARP, dim_names, normalize, short_name
from .core import Context, walk_with_context

SP_PIN_SHAPE = "SP0420"
"""A layout that does not describe the pinned tile (other logical dims, or elements nobody owns)."""
SP_PIN_WARPS = "SP0421"
"""A pinned layout over more lanes or warps than run the code."""
SP_PIN_CONFLICT = "SP0422"
"""A pinned layout meets an op that needs another one."""
SP_NOT_A_LAYOUT = "SP0423"
"""A layout argument that is not a layout."""


@dataclass(frozen=True)
class PinnedLayout:
    """The ``layout`` attribute of a pin (printed compactly in ``--emit ir``)."""

    layout: LinearLayout
    explicit: bool = False

    def short_name(self) -> str:
        return short_name(self.layout)


def fit_to_tile(lay: LinearLayout, shape: tuple[int, ...]) -> LinearLayout | str:
    """``lay`` with its logical dims renamed ``dim0, dim1, ...`` and input dims ``reg, lane,
    warp`` (at most 32 lanes), or why it cannot describe a tile of ``shape``."""
    outs = lay.out_dims
    if len(outs) != len(shape) or any(s != t for (_, s), t in zip(outs, shape, strict=False)):
        have = "x".join(str(s) for _, s in outs) or "nothing"
        return f"the layout describes a {have} tile, the value is {'x'.join(map(str, shape))}"
    extra = [n for n in lay.in_names if n not in (REG, LANE, WARP)]
    if extra:
        return f"a register layout maps `reg`, `lane` and `warp`; this one also has {', '.join(extra)}"
    lay = lay.rename_outs({name: new for (name, _), new in zip(outs, dim_names(len(shape)), strict=True)})
    if not lay.is_surjective():
        return "the layout leaves some elements of the tile without an owner"
    return lay


def check_pin_warps(lay: LinearLayout, num_warps: int) -> LinearLayout | str:
    """``lay`` normalized to ``reg, lane(32), warp(num_warps)``, or why it uses more threads."""
    for name, size in ((LANE, 32), (WARP, num_warps)):
        if name in lay.in_names and lay.in_size(name) > size:
            return f"the layout spreads the tile over {lay.in_size(name)} {name}s, only {size} run this code"
    return normalize(lay, num_warps)


HARD_PREFIXES = ("hopper.", "tcgen05.", "tmem.")
"""Ops whose operand layouts the hardware fixes (a pinned operand is not converted silently)."""
ANY_LAYOUT = frozenset({"smem.store", "convert_layout"})
"""Ops whose lowering reads an operand in whatever layout it has (no conversion needed)."""


def is_pin(op: Operation) -> bool:
    return op.name == "convert_layout" and bool(op.attrs.get("pinned"))


def resolve_pins(func: Function, ctx: Context) -> list[Diagnostic]:
    """Give pinned values their layouts, report pins that conflict with a fixed demand, and
    convert for the other users; then make every shared-memory store storable."""
    out: list[Diagnostic] = []
    pins = [(op, c) for op, c in walk_with_context(func.body.block, ctx) if is_pin(op)]
    stores = [(op, c) for op, c in walk_with_context(func.body.block, ctx) if op.name == "smem.store"]
    users = _users(func)
    for op, c in pins:
        attr = op.attrs["layout"]
        assert isinstance(attr, PinnedLayout)
        lay = check_pin_warps(attr.layout, c.num_warps)
        if isinstance(lay, str):
            out.append(Diagnostic(SP_PIN_WARPS, f"this pin does not fit the {c.num_warps} warps that run it: {lay}",
                                  op.span, help=f"build the layout for num_warps={c.num_warps}"))
            continue
        r = op.result
        inferred = r.layout
        r.layout = lay
        conflicts = list(_conflicts(r, lay, op, c, users))
        out.extend(conflicts)
        if conflicts or inferred is None or inferred == lay:
            continue
        for u in users.get(id(r), []):
            if u.name not in ANY_LAYOUT:
                _convert_operand(u, r, inferred)
    for op, c in stores:
        out.extend(_make_storable(op, c))
    return out


def _users(func: Function) -> dict[int, list[Operation]]:
    table: dict[int, list[Operation]] = {}
    for op in func.walk():
        for v in op.operands:
            lst = table.setdefault(id(v), [])
            if not lst or lst[-1] is not op:
                lst.append(op)
    return table


def _convert_operand(user: Operation, value: Value, layout: LinearLayout) -> Value:
    """Make ``user`` read ``value`` through a conversion to ``layout``."""
    b = Builder(user.block)  # type: ignore[arg-type]
    b.set_insertion_point_before(user)
    conv = b.create("convert_layout", [value], [value.type], {}, user.span)
    conv.result.layout = layout
    user.operands = [conv.result if v is value else v for v in user.operands]
    return conv.result


# ------------------------------------------------------------------------------------------------
# Fixed demands
# ------------------------------------------------------------------------------------------------
def fixed_demand(user: Operation, index: int, ctx: Context) -> tuple[LinearLayout | None, str] | None:
    """The layout operand ``index`` of ``user`` must have, with a phrase naming it, when the
    hardware fixes it; None when any layout works (the compiler converts)."""
    v = user.operands[index]
    if user.name.startswith(HARD_PREFIXES):
        hook = ctx.hooks.anchor
        if hook is None:
            return None
        want = hook(user, ctx.num_warps).get(id(v))
        if want is None:
            return None
        return want, f"the layout `{user.name}` needs for this operand"
    if user.name == "smem.store" and index == user.operand_index("value"):
        plan_ok, want = _store_plan(user, v.layout, ctx)
        if plan_ok:
            return None
        return want, "a layout the shared-memory store can write"
    return None


def _conflicts(r: Value, lay: LinearLayout, pin: Operation, ctx: Context,
               users: dict[int, list[Operation]]) -> Iterator[Diagnostic]:
    for u, idx, via in _direct_uses(r, users):
        demand = fixed_demand(u, idx, ctx)
        if demand is None:
            continue
        want, what = demand
        if want is not None and want == lay:
            continue
        wanted = f"`{short_name(want)}`" if want is not None else "another layout"
        spelled = _constructor_for(u, idx, ctx) or (wanted if want is not None else "a layout the op accepts")
        help_line = f"remove the pin so that the compiler chooses (it converts where needed), or pin {spelled}"
        yield Diagnostic(SP_PIN_CONFLICT, f"the pinned layout `{short_name(lay)}` is not {what}"
                         + (f" (through the loop-carried value at {via})" if via else ""), u.span,
                         help=help_line, labels=(Label(pin.span, "pinned here"),),
                         notes=(f"{what}: {wanted}",))


def _constructor_for(user: Operation, index: int, ctx: Context) -> str | None:
    """How to write the layout a fixed demand wants, where the language has a constructor."""
    if user.name == "hopper.wgmma" and index == user.operand_index("acc"):
        m, n = T.shape_of(user.operand("acc").type)
        return f"`layout.wgmma_accumulator({m}, {n}, {ctx.num_warps})`"
    return None


def _direct_uses(r: Value, users: dict[int, list[Operation]]) -> Iterator[tuple[Operation, int, str]]:
    """(user, operand index, via) for each use of ``r``; a use as a loop's initial value is
    followed to the users of the loop-carried block argument (one level)."""
    for u in users.get(id(r), []):
        for i, v in enumerate(u.operands):
            if v is not r:
                continue
            yield u, i, ""
            if u.name == "scf.for" and i >= 3 and u.regions:
                arg = u.regions[0].block.args[i - 3 + 1]
                for u2 in users.get(id(arg), []):
                    for j, w in enumerate(u2.operands):
                        if w is arg:
                            yield u2, j, f"line {u.span.line}"


# ------------------------------------------------------------------------------------------------
# Shared-memory stores
# ------------------------------------------------------------------------------------------------
def smem_layout_of(t: T.SmemType) -> LinearLayout | None:
    """The offset -> (dim0, dim1) layout of a 2-D buffer as ``backend/lower_async`` stores it
    (column panels of one swizzle span, swizzle applied to byte addresses)."""
    from ..layout.smem_layouts import smem_tile

    if len(t.shape) != 2 or t.strided:
        return None
    try:
        return smem_tile(t.shape[0], t.shape[1], _storage_bits(t.elem), t.swizzle or None, dims=("dim0", "dim1"))
    except ValueError:
        return None


def _storage_bits(elem: T.ScalarType) -> int:
    return 8 if elem.is_bool else elem.bits


def _store_plan(op: Operation, layout: LinearLayout | None, ctx: Context) -> tuple[bool, LinearLayout | None]:
    """(storable, a storable layout) for ``layout`` stored by ``smem.store`` ``op``."""
    from ..layout.smem import storable_layout, storable_register_layout

    t = op.operand("buf").type
    assert isinstance(t, T.SmemType)
    smem = smem_layout_of(t)
    if smem is None or layout is None:
        return True, None
    bits = _storage_bits(t.elem)
    if storable_layout(layout, smem, bits).ok:
        return True, None
    try:
        return False, storable_register_layout(smem, bits, ctx.num_warps)
    except ValueError:
        return False, None


def _make_storable(op: Operation, ctx: Context) -> list[Diagnostic]:
    """A store whose value no plan can write gets a conversion (pinned values were reported)."""
    v = op.operand("value")
    owner = v.owner
    if owner is not None and is_pin(owner):
        return []
    ok, want = _store_plan(op, v.layout, ctx)
    if ok or want is None:
        return []
    _convert_operand(op, v, want)
    return []


def storable(layout: LinearLayout, buf: T.SmemType) -> bool:
    """Whether ``layout`` can be stored to ``buf`` without a conversion."""
    smem = smem_layout_of(buf)
    if smem is None:
        return True
    from ..layout.smem import storable_layout

    return storable_layout(layout, smem, _storage_bits(buf.elem)).ok


def pinned_layout(op: Operation) -> PinnedLayout | None:
    return op.attrs.get("layout") if is_pin(op) else None  # type: ignore[return-value]
