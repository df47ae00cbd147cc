"""Global memory: masked ``load`` and ``store`` through pointers (tiles of pointers), each IR op with
its typing rule and interpreter semantics next to the builtin that creates it, and the pointer and
mask operands every global access (atomics too, :mod:`.atomic`) takes.

Semantics shared by the interpreter and every backend: masked-off lanes of a ``load`` without
``other`` read as zero; an unmasked lane outside its buffer is an interpreter error (SP0781).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..interp.values import OUT_OF_BOUNDS, InterpreterError, PtrVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import ELEMENTWISE
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .core import numpy_dtype_of
from .opdefs import NO_LEGALITY, TYPED_BY_SEMA, define_op, flagged

load_op = define_op("load", operands=flagged(("ptr",), ("mask", "has_mask"), ("other", "has_other")),
                    verify=TYPED_BY_SEMA, layout=ELEMENTWISE, legality=NO_LEGALITY,
                    doc="Masked gather from global memory.")
store_op = define_op("store", operands=flagged(("ptr", "value"), ("mask", "has_mask")), verify=TYPED_BY_SEMA,
                     layout=ELEMENTWISE, legality=NO_LEGALITY, side_effects=True,
                     doc="Masked scatter to global memory.")


def check_bounds(ctx: Any, op: Operation, p: PtrVal, mask: np.ndarray | None, what: str) -> np.ndarray:
    """The live lanes of an access through ``p`` (``mask``, or all); an out-of-bounds live lane is
    an interpreter error naming the argument and the tile index (loads, stores, atomics)."""
    off = p.off
    live = np.ones(off.shape, bool) if mask is None else np.broadcast_to(mask, off.shape)
    bad = live & ((off < 0) | (off >= p.buf.data.size))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InterpreterError(
            OUT_OF_BOUNDS,
            f"out-of-bounds {what} of `{p.buf.name}`: element offset {int(off[idx])} at tile index {idx} "
            f"is outside [0, {p.buf.data.size})", op.span, ctx.program_id,
            help=f"mask the lanes outside `{p.buf.name}` (`mask=offs < n`)")
    return live


@load_op.interpreter
def _i_load(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    p = args[0]
    mask = args[1] if op.attrs.get("has_mask") else None
    other = args[2 if mask is not None else 1] if op.attrs.get("has_other") else None
    live = check_bounds(ctx, op, p, mask, "load")
    dt = numpy_dtype_of(op.result.type)
    safe = np.where(live, p.off, 0)
    out = p.buf.data[safe].astype(dt) if p.buf.data.size else np.zeros(safe.shape, dt)
    fill = np.zeros((), dt) if other is None else np.asarray(other).astype(dt)
    return [np.where(live, out, fill).astype(dt)]


@store_op.interpreter
def _i_store(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    p, val = args[0], args[1]
    mask = args[2] if op.attrs.get("has_mask") else None
    live = check_bounds(ctx, op, p, mask, "store")
    val = np.broadcast_to(np.asarray(val), p.off.shape)
    p.buf.data[p.off[live]] = val[live].astype(p.buf.data.dtype)
    return []


def pointer_operand(em: Emitter, pointer: Arg) -> Value:
    """The pointer (or tile of pointers) operand of a memory access, or SP0315."""
    p = em.value(pointer, what="the pointer")
    if not isinstance(p.type, T.PointerType | T.TileType) or not isinstance(T.element_type(p.type), T.PointerType):
        em.error("SP0315", f"expected a pointer or a tile of pointers, found {p.type}", pointer.span,
                 help="index a pointer parameter, e.g. `x + offsets`")
    return p


def mask_operand(em: Emitter, mask: Arg | None, shape: tuple[int, ...]) -> Value | None:
    """The ``mask=`` of a memory access broadcast to the pointers' ``shape`` (None when absent)."""
    if mask is None or (isinstance(mask.value, Const) and mask.value.value is None):
        return None
    m = em.tile_or_scalar(mask, what="the mask")
    if T.element_type(m.type) != T.bool_:
        em.error("SP0312", f"a mask must be bool, found {m.type}", mask.span, help="compare, e.g. `offs < n`")
    ms = T.shape_of(m.type)
    if em.broadcast_shapes(ms, shape, mask.span) != shape:
        em.error("SP0305", f"the mask shape {ms} does not broadcast to the pointer shape {shape}", mask.span)
    return em.broadcast_to(m, shape)


@builtin("load")
def load(em: Emitter, pointer: Arg, mask: Arg | None = None, other: Arg | None = None) -> Value:
    """Load the elements ``pointer`` points at; where ``mask`` is false, give ``other`` (default 0)."""
    p = pointer_operand(em, pointer)
    shape = T.shape_of(p.type)
    elem = T.element_type(p.type).elem  # type: ignore[union-attr]
    operands = [p]
    m = mask_operand(em, mask, shape)
    if m is not None:
        operands.append(m)
    has_other = other is not None and not (isinstance(other.value, Const) and other.value.value is None)
    if has_other:
        assert other is not None
        if m is None:
            em.error("SP0316", "`other` has no effect without a `mask`", other.span,
                     help="add `mask=...` or drop `other`")
        o = em.cast(em.tile_or_scalar(other, like=elem), elem)
        operands.append(em.broadcast_to(o, shape))
    return em.op1("load", operands, T.with_shape(elem, shape), has_mask=m is not None, has_other=has_other)


@builtin("store")
def store(em: Emitter, pointer: Arg, value: Arg, mask: Arg | None = None) -> None:
    """Store ``value`` (converted to the pointee type) where ``mask`` is true."""
    p = pointer_operand(em, pointer)
    shape = T.shape_of(p.type)
    elem = T.element_type(p.type).elem  # type: ignore[union-attr]
    v = em.tile_or_scalar(value, like=elem)
    vs = T.shape_of(v.type)
    if em.broadcast_shapes(vs, shape, value.span) != shape:
        em.error("SP0305", f"cannot store a value of shape {vs} through pointers of shape {shape}", value.span)
    v = em.broadcast_to(em.cast(v, elem), shape)
    operands = [p, v]
    m = mask_operand(em, mask, shape)
    if m is not None:
        operands.append(m)
    em.create("store", operands, [], {"has_mask": m is not None})
    return None
