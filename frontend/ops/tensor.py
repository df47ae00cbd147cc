"""Global tensors (``tensor[T, rank]`` parameters): shape and stride queries and whole-tile I/O.

``t.load_tile(offsets, shape)`` reads the box ``[offsets, offsets + shape)``; elements outside the
tensor read as zero. ``t.store_tile(offsets, value)`` writes the box, skipping elements outside the
tensor. These are exactly the semantics of a TMA tensor-map copy (PTX ISA 9.7.9.25,
``cp.async.bulk.tensor`` with out-of-bound fill zero), which is how GPUs that have TMA execute them.
Shapes and strides are counted in elements, as i32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..interp.values import TensorVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, TYPED_BY_SEMA, define_op, variadic

tensor_dim = define_op("tensor.dim", operands=("tensor",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                       legality=NO_LEGALITY, doc="The size of one dimension of a global tensor.")
tensor_stride = define_op("tensor.stride", operands=("tensor",), verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE,
                          legality=NO_LEGALITY, doc="The stride (in elements) of one dimension of a global tensor.")
load_tile_op = define_op("tensor.load_tile", operands=variadic(("tensor",), "offset"), verify=TYPED_BY_SEMA,
                         layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                         doc="Read a box of a global tensor; outside reads zero.")
store_tile_op = define_op("tensor.store_tile", operands=variadic(("tensor",), "offset", ("value",)),
                          verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY, side_effects=True,
                          doc="Write a box of a global tensor, clipped.")


def _tensor(em: Emitter, arg: Arg) -> tuple[Value, T.TensorType]:
    v = em.value(arg)
    if not isinstance(v.type, T.TensorType):
        em.error("SP0342", f"expected a global tensor, found {v.type}", arg.span)
    return v, v.type


def _offsets(em: Emitter, arg: Arg, rank: int) -> list[Value]:
    raw = em.unwrap(arg)
    items = list(raw) if isinstance(raw, tuple) else [raw]
    if len(items) != rank:
        em.error("SP0343", f"a tensor of rank {rank} needs {rank} offsets, found {len(items)}", arg.span)
    out = []
    for x in items:
        v = em.tile_or_scalar(Arg(x, arg.span), like=T.i32)
        e = T.element_type(v.type)
        if T.shape_of(v.type) or not isinstance(e, T.ScalarType) or not e.is_int:
            em.error("SP0343", f"tile offsets must be integer scalars, found {v.type}", arg.span)
        out.append(em.cast(v, T.i32))
    return out


@builtin("load_tile", method_of=(T.TensorType,))
def load_tile(em: Emitter, tensor: Arg, offsets: Arg, shape: Arg) -> Value:
    """The box of ``shape`` at ``offsets`` (zero outside the tensor)."""
    t, tt = _tensor(em, tensor)
    dims = em.shape_arg(shape)
    if len(dims) != tt.rank:
        em.error("SP0343", f"a tensor of rank {tt.rank} needs a {tt.rank}-D tile shape, found {dims}", shape.span)
    offs = _offsets(em, offsets, tt.rank)
    return em.op1("tensor.load_tile", [t, *offs], T.TileType(tt.elem, dims))


@builtin("store_tile", method_of=(T.TensorType,))
def store_tile(em: Emitter, tensor: Arg, offsets: Arg, value: Arg) -> None:
    """Write ``value`` (converted to the tensor's type) at ``offsets``, skipping outside elements."""
    t, tt = _tensor(em, tensor)
    v = em.tile_or_scalar(value, like=tt.elem)
    if len(T.shape_of(v.type)) != tt.rank:
        em.error("SP0343", f"a tensor of rank {tt.rank} stores a {tt.rank}-D tile, found {v.type}", value.span)
    v = em.cast(v, tt.elem)
    offs = _offsets(em, offsets, tt.rank)
    em.create("tensor.store_tile", [t, *offs, v], [])
    return None


@builtin("shape", prop_of=(T.TensorType,))
def tensor_shape(em: Emitter, tensor: Arg) -> tuple[Value, ...]:
    """The run-time shape of a global tensor (a tuple of i32)."""
    t, tt = _tensor(em, tensor)
    return tuple(em.op1("tensor.dim", [t], T.i32, dim=d) for d in range(tt.rank))


@builtin("strides", prop_of=(T.TensorType,))
def tensor_strides(em: Emitter, tensor: Arg) -> tuple[Value, ...]:
    """The run-time strides of a global tensor in elements (a tuple of i32)."""
    t, tt = _tensor(em, tensor)
    return tuple(em.op1("tensor.stride", [t], T.i32, dim=d) for d in range(tt.rank))


@tensor_dim.interpreter
def _i_dim(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.array(args[0].shape[op.attrs["dim"]], np.int32)]


@tensor_stride.interpreter
def _i_stride(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [np.array(args[0].strides[op.attrs["dim"]], np.int32)]


def box_offsets(t: TensorVal, offs: list[int], shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    grids = np.meshgrid(*[np.arange(o, o + s, dtype=np.int64) for o, s in zip(offs, shape, strict=True)],
                        indexing="ij")
    inside = np.ones(shape, bool)
    flat = np.zeros(shape, np.int64)
    for g, size, stride in zip(grids, t.shape, t.strides, strict=True):
        inside &= (g >= 0) & (g < size)
        flat += g * stride
    return np.where(inside, flat, 0), inside


@load_tile_op.interpreter
def _i_load_tile(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t: TensorVal = args[0]
    shape = T.shape_of(op.result.type)
    flat, inside = box_offsets(t, [int(x) for x in args[1:]], shape)
    dt = T.element_type(op.result.type).numpy_dtype  # type: ignore[union-attr]
    vals = t.buf.data[flat] if t.buf.data.size else np.zeros(shape, dt)
    return [np.where(inside, vals, np.zeros((), dt)).astype(dt)]


@store_tile_op.interpreter
def _i_store_tile(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    t: TensorVal = args[0]
    value = np.asarray(args[-1])
    flat, inside = box_offsets(t, [int(x) for x in args[1:-1]], value.shape)
    t.buf.data[flat[inside]] = value[inside].astype(t.buf.data.dtype)
    return []
