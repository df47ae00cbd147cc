"""Atomic read-modify-write of global memory: ``atomic_add``, ``atomic_max``, ``atomic_min``,
``atomic_xchg`` and ``atomic_cas`` (docs/language.md §"Atomics"), each IR op with its typing rule
and interpreter semantics next to the builtins that create it; the lowering is in
backend/lower/memory.py.

Semantics shared by the interpreter and the GPU:

* each builtin returns the values memory held *before* the operation (the tile's shape; a scalar
  pointer gives a scalar); where ``mask`` is false nothing is accessed and the result is 0;
* every element of the tile is one atomic, performed exactly once, also when the tile's layout
  holds the element in several registers or threads;
* the interpreter runs programs one after another and, within one op, applies the elements in
  row-major order: several elements of one tile naming the same address see each other's results
  in that order (the GPU applies them in some order; each returns the value before its own update);
* an f32 ``atomic_add`` flushes subnormal operands and sums to a zero of their sign, as
  ``atom.global.add.f32`` does (PTX ISA 9.1, §9.7.13.5 "atom": on global memory it "flushes subnormal
  inputs and results to sign-preserving zero"); the old value returned is memory's, unflushed;
  f16 (``atom.add.noftz``) and f64 keep subnormals;
* ``sem`` ("relaxed", "acquire", "release", "acq_rel"; default "acq_rel" as in Triton) and
  ``scope`` ("cta", "gpu", "sys"; default "gpu") are PTX's ``atom.<sem>.<scope>`` qualifiers; the
  interpreter is sequential, so they do not change its results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..interp.numerics import flush_f32_subnormals
from ..interp.values import PtrVal
from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import ELEMENTWISE
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .core import numpy_dtype_of
from .global_memory import check_bounds, mask_operand, pointer_operand
from .opdefs import NO_LAYOUT_RULE, NO_LEGALITY, TYPED_BY_SEMA, define_op, flagged

SEMS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "gpu", "sys")
DEFAULT_SEM, DEFAULT_SCOPE = "acq_rel", "gpu"

_INTS = ("i32", "u32", "i64", "u64")
_WORDS = (*_INTS, "f32", "f64")
SUPPORTED: dict[str, tuple[str, ...]] = {
    "add": (*_INTS, "f16", "f32", "f64"),
    "max": _INTS,
    "min": _INTS,
    "xchg": _WORDS,
    "cas": _WORDS,
}
"""The element types each atomic takes: what PTX ``atom.global`` has on every target (sm_80 on);
PTX has no scalar float ``atom.max``/``atom.min`` and no 8/16-bit integer atomics."""

atomic_rmw = define_op("atomic_rmw", operands=flagged(("ptr", "value"), ("mask", "has_mask")),
                       verify=TYPED_BY_SEMA, layout=ELEMENTWISE, legality=NO_LEGALITY, side_effects=True,
                       doc="Atomic read-modify-write (add, max, min, xchg) of global memory; gives the old values.")
atomic_cas = define_op("atomic_cas", operands=flagged(("ptr", "cmp", "value"), ("mask", "has_mask")),
                       verify=TYPED_BY_SEMA, layout=ELEMENTWISE, legality=NO_LEGALITY, side_effects=True,
                       doc="Atomic compare-and-swap of global memory; gives the old values.")
fence_op = define_op("fence.memory", verify=TYPED_BY_SEMA, layout=NO_LAYOUT_RULE, legality=NO_LEGALITY,
                     side_effects=True, doc="A memory fence (PTX fence.<sem>.<scope>): orders this thread's accesses.")
FENCE_SEMS = ("acq_rel", "sc")
"""PTX ``fence`` orders (PTX ISA "Parallel synchronization: membar/fence")."""


# ------------------------------------------------------------------------------------------------
# Interpreter semantics
# ------------------------------------------------------------------------------------------------
def _combine(kind: str, old: np.ndarray, val: np.ndarray, cmp: np.ndarray | None) -> np.ndarray:
    """The new value of one element (0-d arrays of the element's dtype)."""
    dt = old.dtype
    with np.errstate(all="ignore"):
        if kind == "add":
            if dt == np.float32:  # atom.global.add.f32 flushes subnormal inputs and result (PTX ISA §9.7.13.5)
                total = flush_f32_subnormals(old).astype(np.float64) + flush_f32_subnormals(val).astype(np.float64)
                return np.asarray(flush_f32_subnormals(total.astype(np.float32)))
            if np.issubdtype(dt, np.floating):
                return np.asarray(old.astype(np.float64) + val.astype(np.float64)).astype(dt)
            return np.asarray(old + val).astype(dt)  # wraps around, as the hardware
        if kind == "max":
            return np.maximum(old, val)
        if kind == "min":
            return np.minimum(old, val)
        if kind == "xchg":
            return val
    assert cmp is not None
    bits = np.dtype(f"u{dt.itemsize}")  # compare-and-swap compares bit patterns (-0.0 != 0.0)
    return val if old.view(bits) == cmp.view(bits) else old


def _interpret(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    n = 3 if op.name == "atomic_cas" else 2  # ptr, (cmp,) value, then the mask
    p: PtrVal = args[0]
    cmp = np.asarray(args[1]) if n == 3 else None
    val = np.asarray(args[n - 1])
    mask = args[n] if op.attrs.get("has_mask") else None
    live = check_bounds(ctx, op, p, mask, "atomic access")
    dt = numpy_dtype_of(op.result.type)
    data = p.buf.data
    shape = p.off.shape
    out = np.zeros(shape, dt)
    val = np.broadcast_to(val.astype(dt), shape)
    cmp = np.broadcast_to(cmp.astype(dt), shape) if cmp is not None else None
    kind = op.attrs["kind"]
    for idx in np.ndindex(*shape):  # row-major element order
        if not live[idx]:
            continue
        off = int(p.off[idx])
        old = np.asarray(data[off]).astype(dt)
        out[idx] = old
        data[off] = _combine(kind, old, np.asarray(val[idx]), None if cmp is None else np.asarray(cmp[idx]))
    return [out]


atomic_rmw.interpreter(_interpret)
atomic_cas.interpreter(_interpret)


@fence_op.interpreter
def _interpret_fence(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return []  # the interpreter runs one thread of one program at a time: every write is already visible


# ------------------------------------------------------------------------------------------------
# Builtins
# ------------------------------------------------------------------------------------------------
def _choice(em: Emitter, arg: Arg | None, what: str, allowed: tuple[str, ...], default: str,
            of: str = "an atomic") -> str:
    if arg is None or (isinstance(arg.value, Const) and arg.value.value is None):
        return default
    v = em.unwrap(arg)
    if not (isinstance(v, Const) and isinstance(v.value, str) and v.value in allowed):
        found = repr(v.value) if isinstance(v, Const) else "a run-time value"
        em.error("SP0399", f"`{what}` of {of} must be one of {', '.join(map(repr, allowed))}, found {found}",
                 arg.span, help=f"pass a string constant, e.g. `{what}={default!r}` (the default)")
    return v.value


_FIX = {
    "add": "atomic_add takes i32, u32, i64, u64, f16, f32 and f64; accumulate in an f32 (or i32) buffer "
           "and convert afterwards",
    "max": "PTX has atomic max/min for 32- and 64-bit integers only: for floats, reduce the tile first "
           "(`max(x, axis=0)`) and combine the partial results in a second pass, or loop on `atomic_cas`",
    "xchg": "atomic_xchg and atomic_cas take 32- and 64-bit types (i32, u32, i64, u64, f32, f64)",
}


def _emit(em: Emitter, kind: str, pointer: Arg, values: list[Arg], mask: Arg | None, sem: Arg | None,
          scope: Arg | None) -> Value:
    p = pointer_operand(em, pointer)
    shape = T.shape_of(p.type)
    elem = T.element_type(p.type).elem  # type: ignore[union-attr]
    name = "atomic_" + kind
    if elem.name not in SUPPORTED[kind]:
        fix = _FIX["max" if kind in ("max", "min") else "xchg" if kind in ("xchg", "cas") else "add"]
        em.error("SP0398", f"`{name}` is not supported on {elem} (the GPU has no such atomic)", em.span,
                 help=fix)
    operands = [p]
    for a in values:
        v = em.tile_or_scalar(a, like=elem)
        if isinstance(T.element_type(v.type), T.PointerType):
            em.error("SP0398", f"the operand of `{name}` must be a number, found {v.type}", a.span)
        vs = T.shape_of(v.type)
        if em.broadcast_shapes(vs, shape, a.span) != shape:
            em.error("SP0305", f"the operand of `{name}` has shape {vs}, which does not broadcast to the "
                     f"pointer shape {shape}", a.span)
        operands.append(em.broadcast_to(em.cast(v, elem), shape))
    m = mask_operand(em, mask, shape)
    if m is not None:
        operands.append(m)
    attrs = {"kind": kind, "has_mask": m is not None, "sem": _choice(em, sem, "sem", SEMS, DEFAULT_SEM),
             "scope": _choice(em, scope, "scope", SCOPES, DEFAULT_SCOPE)}
    return em.create("atomic_cas" if kind == "cas" else "atomic_rmw", operands, [T.with_shape(elem, shape)],
                     attrs).result


def _rmw_builtin(kind: str, what: str) -> None:
    def impl(em: Emitter, pointer: Arg, val: Arg, mask: Arg | None = None, sem: Arg | None = None,
             scope: Arg | None = None) -> Value:
        return _emit(em, kind, pointer, [val], mask, sem, scope)

    impl.__doc__ = (f"Atomically {what} where ``mask`` is true and give the old values (0 where masked); "
                    f"``sem`` (default \"acq_rel\") and ``scope`` (default \"gpu\") as PTX ``atom``.")
    builtin(f"atomic_{kind}")(impl)


_rmw_builtin("add", "add ``val`` to each element ``pointer`` points at")
_rmw_builtin("max", "replace each element ``pointer`` points at by its maximum with ``val``")
_rmw_builtin("min", "replace each element ``pointer`` points at by its minimum with ``val``")
_rmw_builtin("xchg", "write ``val`` to each element ``pointer`` points at")


@builtin("atomic_cas")
def atomic_cas_builtin(em: Emitter, pointer: Arg, cmp: Arg, val: Arg, mask: Arg | None = None,
                       sem: Arg | None = None, scope: Arg | None = None) -> Value:
    """Atomically write ``val`` to each element ``pointer`` points at that equals ``cmp`` (bit for bit)
    and give the old values (0 where ``mask`` is false); ``sem`` and ``scope`` as ``atomic_add``."""
    return _emit(em, "cas", pointer, [cmp, val], mask, sem, scope)


@builtin("memory", ns="fence")
def fence_memory(em: Emitter, sem: Arg | None = None, scope: Arg | None = None) -> None:
    """Order this thread's memory accesses before the fence against those after it, as seen by the
    threads of ``scope`` (PTX ``fence.<sem>.<scope>``; ``sem`` "acq_rel" (default) or "sc", ``scope``
    "cta", "gpu" (default) or "sys"). With a barrier and an atomic it publishes a CTA's stores to
    another CTA: every thread stores, fences, meets the others at a barrier, and one thread then
    signals with an atomic (docs/language.md, "Atomics")."""
    attrs = {"sem": _choice(em, sem, "sem", FENCE_SEMS, DEFAULT_SEM, of="a fence"),
             "scope": _choice(em, scope, "scope", SCOPES, DEFAULT_SCOPE, of="a fence")}
    em.create("fence.memory", [], [], attrs)
    return None
