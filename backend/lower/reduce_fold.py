"""What a reduction folds: the combine that ``lower_reduce`` (backend/lower/reduce.py) runs in its
three stages (within a thread, across lanes, across warps).

A :class:`Fold` carries each element as a tuple of parts: one accumulator for ``sum``, ``max`` and
``min``; a (value, index) pair for ``argmax`` and ``argmin``. Its ``combine`` must give the same
result whatever order the stages bring two tuples in, so the stages need not know which kind they
fold.

``argmax`` / ``argmin`` keep the interpreter's semantics (numpy's ``argmax`` / ``argmin``, which
frontend/ops/shape.py runs; docs/language.md, "Tiles, shapes and broadcasting"): the index of the
first extreme element along the axis, as i32; for floats a NaN is more extreme than any number
(the first NaN wins, for ``argmin`` too), and ``-0.0`` equals ``0.0``. The combine is "the other
pair if its value is more extreme, or equally extreme (equal, or both NaN) with a smaller index":
a total order on (value, index) pairs with distinct indices, so the result is the same in every
combination order. Values narrower than 32 bits are compared widened, exactly: 8- and 16-bit
floats as f32 (fp8 through ``cvt``, hence sm_89 and later, as every fp8 reduction: SP0577),
integers as i32 or u32 (bool as u32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...frontend.ir import types as T
from .codegen import CodeGen, DTile
from .elementwise import binary_value, cast_value
from .llvm_text import LLValue

Parts = tuple[LLValue, ...]

ARG_KINDS = ("argmax", "argmin")


@dataclass(frozen=True)
class Fold:
    """``types``: the parts' types; ``start(r)``: register ``r``'s element as parts; ``combine``:
    two tuples of parts into one; ``finish``: the result from the final parts; ``once``: each
    element must be folded exactly once (a ``sum``; the others are idempotent, so a layout that
    repeats an element is fine)."""

    types: tuple[T.ScalarType, ...]
    start: Callable[[int], Parts]
    combine: Callable[[Parts, Parts], Parts]
    finish: Callable[[Parts], LLValue]
    once: bool


def fold_for(cg: CodeGen, kind: str, x: DTile, axis: int, res_elem: T.ScalarType) -> Fold:
    """The fold of reduction ``kind`` of tile ``x`` along ``axis`` giving ``res_elem``."""
    elem = x.elem
    assert isinstance(elem, T.ScalarType)
    if kind in ARG_KINDS:
        return _arg_fold(cg, kind, x, axis, elem)
    return _plain_fold(cg, kind, x, elem, res_elem)


def _plain_fold(cg: CodeGen, kind: str, x: DTile, elem: T.ScalarType, res_elem: T.ScalarType) -> Fold:
    """``sum``, ``max``, ``min``: one accumulator (``sum`` of 8- and 16-bit floats in f32)."""
    acc = T.f32 if kind == "sum" and elem.is_float and elem.bits < 32 else elem
    op = {"sum": "add", "max": "max", "min": "min"}[kind]
    return Fold(
        types=(acc,),
        start=lambda r: (cast_value(cg, elem, acc, x.regs[r]) if acc != elem else x.regs[r],),
        combine=lambda a, b: (binary_value(cg, op, acc, a[0], b[0]),),
        finish=lambda p: cast_value(cg, acc, res_elem, p[0]) if acc != res_elem else p[0],
        once=kind == "sum")


def compare_type(elem: T.ScalarType) -> T.ScalarType:
    """The type ``argmax`` / ``argmin`` compare ``elem`` values in: exact, at least 32 bits."""
    if elem.bits >= 32:
        return elem
    if elem.is_float:
        return T.f32
    return T.i32 if elem.is_signed else T.u32


def _arg_fold(cg: CodeGen, kind: str, x: DTile, axis: int, elem: T.ScalarType) -> Fold:
    fb = cg.fb
    vt = compare_type(elem)
    coords: list[list[LLValue]] = []

    def start(r: int) -> Parts:
        if not coords:
            coords.extend(cg.coords(x.layout))
        v = x.regs[r]
        if vt != elem:
            v = cast_value(cg, elem, vt, v) if elem.is_float else fb.cast("sext" if elem.is_signed else "zext", v,
                                                                          "i32")
        return v, coords[r][axis]

    def combine(a: Parts, b: Parts) -> Parts:
        (va, ia), (vb, ib) = a, b
        if vt.is_float:
            beats = fb.fcmp("ogt" if kind == "argmax" else "olt", vb, va)  # false where either is NaN
            a_nan, b_nan = fb.fcmp("uno", va, va), fb.fcmp("uno", vb, vb)
            beats = fb.binop("or", beats, fb.binop("and", b_nan, fb.fcmp("ord", va, va)))
            same = fb.binop("or", fb.fcmp("oeq", va, vb), fb.binop("and", a_nan, b_nan))
        else:
            pred = ("s" if vt.is_signed else "u") + ("gt" if kind == "argmax" else "lt")
            beats = fb.icmp(pred, vb, va)
            same = fb.icmp("eq", va, vb)
        take = fb.binop("or", beats, fb.binop("and", same, fb.icmp("slt", ib, ia)))
        return fb.select(take, vb, va), fb.select(take, ib, ia)

    return Fold(types=(vt, T.i32), start=start, combine=combine, finish=lambda p: p[1], once=False)
