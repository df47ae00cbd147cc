"""Shapes and reductions: ``expand_dims``, ``broadcast_to``, ``reshape``, ``permute``/``trans``,
the ``shape`` and ``dtype`` properties, and ``sum max min argmax argmin`` along an axis — each IR op
with its typing rule and interpreter semantics, next to the builtin(s) that create it.

Reductions: ``sum`` of integers narrower than 32 bits gives ``i32``; of 8/16-bit floats it
accumulates in ``f32`` and rounds once at the end. ``max``/``min`` of floats skip NaN (a NaN
results only where every element is NaN) and order ``+0.0 > -0.0``, as ``maximum``/``minimum`` and
the GPU's ``max`` / ``min`` instructions.
``argmax``/``argmin`` give the i32 index of the first extreme element (of the flattened tile when
no axis is given): numpy's, so a NaN counts as the most extreme (the first NaN wins) and -0.0 equals
0.0; the GPU lowering computes the same (backend/lower/reduce_fold.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..interp.numerics import cast_array, gpu_reduce_max_min
from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import EXPAND_DIMS, PERMUTE, REDUCE, RESHAPE
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .core import map_tile, numpy_dtype_of
from .opdefs import NO_LEGALITY, TYPED_BY_SEMA, define_op

expand_dims_op = define_op("expand_dims", operands=("x",), verify=TYPED_BY_SEMA, layout=EXPAND_DIMS,
                           legality=NO_LEGALITY, doc="Insert a size-1 dimension at `axis`.")
reshape_op = define_op("reshape", operands=("x",), verify=TYPED_BY_SEMA, layout=RESHAPE, legality=NO_LEGALITY,
                       doc="The same elements in row-major order under another shape.")
permute_op = define_op("permute", operands=("x",), verify=TYPED_BY_SEMA, layout=PERMUTE, legality=NO_LEGALITY,
                       doc="Permute the dimensions of a tile.")
reduce_op = define_op("reduce", operands=("x",), verify=TYPED_BY_SEMA, layout=REDUCE,
                      doc="Reduction of a tile along one axis.")


def _count_in_words(n: int) -> str:
    """``n`` elements, in words ("1 element", "16 elements")."""
    return f"{n} element{'' if n == 1 else 's'}"


@expand_dims_op.interpreter
def _i_expand_dims(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [map_tile(args[0], lambda a: np.expand_dims(a, op.attrs["axis"]))]


@reshape_op.interpreter
def _i_reshape(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [map_tile(args[0], lambda a: np.reshape(a, T.shape_of(op.result.type)))]


@permute_op.interpreter
def _i_permute(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [map_tile(args[0], lambda a: np.ascontiguousarray(np.transpose(a, op.attrs["perm"])))]


@reduce_op.interpreter
def _i_reduce(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    (a,) = args
    axis, kind = op.attrs["axis"], op.attrs["kind"]
    dt = numpy_dtype_of(op.result.type)
    elem = T.element_type(op.result.type)
    if kind == "sum":
        acc = a.astype(np.float32) if elem.is_float and elem.bits < 32 else a.astype(dt)
        with np.errstate(all="ignore"):  # inf + -inf is NaN, as on the GPU; not numpy's warning
            total = np.asarray(np.sum(acc, axis=axis, dtype=acc.dtype))
        # the f32 total rounds as a cast does (8-bit floats saturate, as the GPU's cvt.rn.satfinite)
        return [cast_array(total, T.f32, elem) if elem.is_float and elem.bits < 32 else total.astype(dt)]
    if kind in ("argmax", "argmin"):
        return [np.asarray((np.argmax if kind == "argmax" else np.argmin)(a, axis=axis)).astype(np.int32)]
    if elem.is_float:  # NaN skipped unless every element is NaN, +0.0 > -0.0: as `maximum` (the GPU's max.f32)
        wide = a.astype(np.float32) if elem.bits < 16 else a
        return [np.asarray(gpu_reduce_max_min(wide, axis, kind)).astype(dt)]
    fn = np.max if kind == "max" else np.min
    return [np.asarray(fn(a, axis=axis)).astype(dt)]


def _reduce(kind: str) -> None:
    def impl(em: Emitter, x: Arg, axis: Arg | None = None, keep_dims: Arg | None = None) -> Value:
        v = em.tile_or_scalar(x)
        shape = T.shape_of(v.type)
        keep = keep_dims is not None and not (isinstance(keep_dims.value, Const) and keep_dims.value.value is None) \
            and em.constexpr(keep_dims, "keep_dims", (bool, int))
        elem = T.element_type(v.type)
        if not shape:
            em.error("SP0317", f"`{kind}` reduces a tile, found a scalar", x.span)
        if isinstance(elem, T.PointerType):
            em.error("SP0317", f"cannot reduce pointers with `{kind}`", x.span)
        out = elem
        if kind == "sum" and elem.is_int and elem.bits < 32:
            out = T.i32
            v = em.cast(v, out)
        if axis is None or (isinstance(axis.value, Const) and axis.value.value is None):
            axes = list(range(len(shape)))
            kept = tuple(1 for _ in shape)
            if kind in ("argmax", "argmin") and len(shape) > 1:  # the index into the flattened tile
                v = em.op1("reshape", [v], T.TileType(elem, (int(np.prod(shape)),)))
                axes = [0]
        elif isinstance(axis.value, Value) and kind in ("max", "min"):
            em.error("SP0201", "the reduction axis must be a compile-time integer, found a run-time value",
                     axis.span, help=f"for the elementwise {kind}imum of two values use `{kind}imum(a, b)`")
        else:
            ax = em.constexpr(axis, "the reduction axis")
            if not -len(shape) <= ax < len(shape):
                em.error("SP0318", f"axis {ax} is out of range for a tile of rank {len(shape)}", axis.span)
            axes = [ax % len(shape)]
            kept = tuple(1 if i == axes[0] else d for i, d in enumerate(shape))
        narrow_sum = kind == "sum" and elem.is_float and elem.bits < 32 and len(axes) > 1
        if narrow_sum:  # one f32 accumulation over every axis, rounded once (not once per axis)
            v, out = em.cast(v, T.f32), T.f32
        for ax in sorted(axes, reverse=True):
            cur = T.shape_of(v.type)
            rest = cur[:ax] + cur[ax + 1:]
            v = em.op1("reduce", [v], T.with_shape(out if kind != "argmax" and kind != "argmin" else T.i32, rest),
                       axis=ax, kind=kind)
        if narrow_sum:
            v = em.cast(v, elem)
        if keep and shape:  # Triton's keep_dims=True (numpy's keepdims): the reduced axes stay, of size 1
            if not T.shape_of(v.type):
                return em.broadcast_to(v, kept)
            return em.op1("reshape", [v], T.TileType(T.element_type(v.type), kept))
        return v

    impl.__doc__ = {
        "sum": "The sum of a tile along ``axis`` (all axes when None). Integers narrower than 32 bits sum in i32; "
               "8- and 16-bit floats accumulate in f32 and round once.",
        "max": "The maximum of a tile along ``axis`` (all axes when None). For the elementwise maximum of two "
               "tiles use ``maximum``; ``max(a, b)`` of numbers (no tile) is ``maximum(a, b)``.",
        "min": "The minimum of a tile along ``axis`` (all axes when None). For the elementwise minimum of two "
               "tiles use ``minimum``; ``min(a, b)`` of numbers (no tile) is ``minimum(a, b)``.",
        "argmax": "The i32 index of the first maximum along ``axis``.",
        "argmin": "The i32 index of the first minimum along ``axis``.",
    }[kind] + " ``keep_dims=True`` keeps the reduced axes, of size 1."
    if kind not in ("max", "min"):
        builtin(kind, method_of=(T.TileType,))(impl)
        return
    # ``x.max(0)`` takes its axis by position, as numpy's method does; the function form takes it by
    # keyword: in a @jit kernel ``max(x, 0)`` reads as Python's two-value max (a ReLU), and reducing
    # along axis 0 instead was a silent wrong result
    builtin(kind, method_of=(T.TileType,), method_only=True)(impl)

    def function(em: Emitter, x: Arg, *_values: Arg, axis: Arg | None = None, keep_dims: Arg | None = None) -> Value:
        if _values and axis is None and keep_dims is None and all(_is_scalar(em, a) for a in (x, *_values)):
            # Python's min / max of run-time scalars (Triton tutorial 03's
            # ``min(num_pid_m - first_pid_m, GROUP_SIZE_M)``): no tile, so no axis to mean
            v = em.tile_or_scalar(x)
            for other in _values:
                a, b = em.binary_operands(Arg(v, x.span), other)
                v = em.op1("arith.binary", [a, b], a.type, op=kind)
            return v
        if _values:
            em.error("SP0321", f"`{kind}` takes one tile (and its axis by keyword): `{kind}(a, b)` is not the "
                     f"elementwise {kind}imum here", _values[0].span,
                     help=f"for the elementwise {kind}imum write `{kind}imum(a, b)`; to reduce along an axis write "
                          f"`{kind}(x, axis=...)`")
        return impl(em, x, axis, keep_dims)

    function.__doc__ = impl.__doc__
    builtin(kind)(function)


def _is_scalar(em: Emitter, a: Arg) -> bool:
    """Whether ``a`` is a number (a constant or a run-time scalar), not a tile."""
    v = em.unwrap(a)
    if isinstance(v, Const):
        return isinstance(v.value, int | float) and not isinstance(v.value, bool)
    return isinstance(v, Value) and isinstance(v.type, T.ScalarType)


for _kind in ("sum", "max", "min", "argmax", "argmin"):
    _reduce(_kind)


@builtin("expand_dims", method_of=(T.TileType, T.ScalarType))
def expand_dims(em: Emitter, x: Arg, axis: Arg) -> Value:
    """Insert a size-1 dimension at ``axis``."""
    v = em.tile_or_scalar(x)
    shape = T.shape_of(v.type)
    ax = em.constexpr(axis, "the axis")
    if not -(len(shape) + 1) <= ax <= len(shape):
        em.error("SP0318", f"axis {ax} is out of range for expand_dims of rank {len(shape)}", axis.span)
    ax %= len(shape) + 1
    if not shape:
        return em.broadcast_to(v, (1,))
    new = (*shape[:ax], 1, *shape[ax:])
    return em.op1("expand_dims", [v], T.TileType(T.element_type(v.type), new), axis=ax)


@builtin("broadcast_to", method_of=(T.TileType, T.ScalarType))
def broadcast_to(em: Emitter, x: Arg, shape: Arg) -> Value:
    """Broadcast ``x`` to ``shape`` (numpy rules)."""
    v = em.tile_or_scalar(x)
    dims = em.shape_arg(shape)
    if em.broadcast_shapes(T.shape_of(v.type), dims, x.span) != dims:
        em.error("SP0305", f"cannot broadcast {T.shape_of(v.type)} to {dims}", x.span)
    return em.broadcast_to(v, dims)


@builtin("reshape", method_of=(T.TileType,))
def reshape(em: Emitter, x: Arg, shape: Arg) -> Value:
    """The same elements, in row-major order, under ``shape`` (``()`` only for a scalar)."""
    v = em.tile_or_scalar(x)
    dims = em.shape_arg(shape)
    t = v.type
    n = t.numel if isinstance(t, T.TileType) else 1
    if int(np.prod(dims)) != n:
        em.error("SP0319", f"cannot reshape {T.shape_of(t)} ({_count_in_words(n)}) to {dims}", shape.span)
    if not dims:  # a tile type has at least one dimension: `()` is a scalar
        if isinstance(t, T.TileType):
            em.error("SP0319",
                     f"cannot reshape {t.shape} ({_count_in_words(n)}) to (): a tile keeps at least one dimension",
                     shape.span, help="to take the one element of a tile as a scalar, reduce it: `max(x, axis=0)`")
        return v
    return em.op1("reshape", [v], T.TileType(T.element_type(t), dims))


@builtin("permute", method_of=(T.TileType,), also=("trans",))
def permute(em: Emitter, x: Arg, dims: Arg | None = None) -> Value:
    """Permute dimensions (``trans(x)`` reverses them; a scalar is returned as it is)."""
    v = em.tile_or_scalar(x)
    shape = T.shape_of(v.type)
    perm = tuple(reversed(range(len(shape)))) if dims is None else em.int_tuple(dims, "the permutation")
    if sorted(perm) != list(range(len(shape))):
        em.error("SP0319", f"{perm} is not a permutation of the {len(shape)} dimensions", em.span)
    if not shape:  # a scalar: nothing to permute
        return v
    return em.op1("permute", [v], T.TileType(T.element_type(v.type), tuple(shape[i] for i in perm)), perm=perm)


@builtin("T", prop_of=(T.TileType,))
def transpose_prop(em: Emitter, x: Arg) -> Value:
    """The tile with its dimensions reversed, as ``trans(x)``."""
    return permute.impl(em, x)


@builtin("shape", prop_of=(T.TileType, T.ScalarType))
def shape_prop(em: Emitter, x: Arg) -> Any:
    """The compile-time shape of a tile (a tuple)."""
    return tuple(Const(d) for d in T.shape_of(em.tile_or_scalar(x).type))


@builtin("dtype", prop_of=(T.TileType, T.ScalarType, T.PointerType))
def dtype_prop(em: Emitter, x: Arg) -> Const:
    """The element type of a tile or scalar (of a pointer: the type it points to)."""
    e = T.element_type(em.tile_or_scalar(x).type)
    return Const(e.elem if isinstance(e, T.PointerType) else e)
