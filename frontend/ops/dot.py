"""Matrix multiply at tile level: ``dot(a, b, acc)`` and ``sparse_dot(a_values, a_meta, b, acc)``.

Operand and accumulator types (the union of what wgmma (PTX ISA 9.7.15) and tcgen05.mma (9.7.16)
accept; legality narrows it per target):

==================  ==========================  ===========================
A and B             accumulator (``acc``)        sparse granularity (A)
==================  ==========================  ===========================
f16, f16            f16 or f32                  2:4
bf16, bf16          f32                         2:4
tf32, tf32 (f32)    f32                         1:2
e4m3 / e5m2 (mix)   f16 or f32                  2:4
i8 / u8 (mix)       i32                         2:4
==================  ==========================  ===========================

``sparse_dot`` takes the *compressed* A values, shape ``(M, K/2)``, and the metadata words of the
same rows, shape ``(M, K/32)`` u32 (``(M, K/16)`` for tf32): the word matrix ``W`` of
``docs/sparse-metadata.md`` (its "sm90" arrangement, whose rows are permuted per 16-row group for
16-bit and tf32 operands). Its meaning is ``dot(decompress(a_values, a_meta), b, acc)``, except
that b's elements at positions the metadata does not name are never multiplied (the sparse tensor
cores select b's elements by the metadata): a NaN or inf there does not reach the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import accumulator
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .opdefs import NO_LEGALITY, TYPED_BY_SEMA, define_op

dot_op = define_op("dot", operands=("a", "b", "acc"), verify=TYPED_BY_SEMA, layout=accumulator("acc"),
                   legality=NO_LEGALITY, doc="acc + a @ b on tensor cores.")
sparse_dot_op = define_op("sparse_dot", operands=("a", "a_meta", "b", "acc"), verify=TYPED_BY_SEMA,
                          layout=accumulator("acc"),
                          doc="acc + decompress(a_values, a_meta) @ b on sparse tensor cores.")

ALLOWED_ACCUMULATORS: dict[str, tuple[str, ...]] = {
    "f16": ("f16", "f32"), "bf16": ("f32",), "tf32": ("f32",), "f32": ("f32",),
    "e4m3": ("f16", "f32"), "e5m2": ("f16", "f32"), "i8": ("i32",), "u8": ("i32",),
}
"""Operand element type -> the accumulator types a (sparse) dot on it may use."""
MIXABLE_OPERANDS = ({"e4m3", "e5m2"}, {"i8", "u8"})
"""Sets of operand element types that ``a`` and ``b`` of one dot may mix (else they must match)."""


def _check_operands(em: Emitter, a: Value, b: Value, acc: Value | None, a_span: Any, b_span: Any,
                    acc_span: Any, k_of_a: int, sparse: bool) -> tuple[T.ScalarType, tuple[int, int, int]]:
    sa, sb = T.shape_of(a.type), T.shape_of(b.type)
    what = "the compressed A values" if sparse else "A"
    if len(sa) != 2:
        em.error("SP0335", f"{what} must be a 2-D tile, found {a.type}", a_span)
    if len(sb) != 2:
        em.error("SP0335", f"B must be a 2-D tile, found {b.type}", b_span)
    m, k, n = sa[0], k_of_a, sb[1]
    if sb[0] != k:
        detail = f" (A values have K/2 = {sa[1]} columns, so K = {k})" if sparse else ""
        em.error("SP0336", f"inner dimensions differ: A is {m}x{k}{detail} but B is {sb[0]}x{n}", b_span,
                 help="B must have K rows")
    ea, eb = T.element_type(a.type), T.element_type(b.type)
    for e, span in ((ea, a_span), (eb, b_span)):
        if not isinstance(e, T.ScalarType):
            em.error("SP0337", f"tensor cores multiply numbers, found a tile of {e}", span,
                     help="load the values the pointers point at with `load(...)` first")
    assert isinstance(ea, T.ScalarType) and isinstance(eb, T.ScalarType)
    if ea.name not in ALLOWED_ACCUMULATORS:
        em.error("SP0337", f"tensor cores do not take {ea} operands", a_span,
                 help="use f16, bf16, tf32/f32, e4m3, e5m2, i8 or u8")
    if ea != eb and not any({ea.name, eb.name} <= p for p in MIXABLE_OPERANDS):
        em.error("SP0337", f"A is {ea} but B is {eb}; the two operands must have the same type "
                 "(fp8 kinds and 8-bit integers may mix)", b_span, help=f"convert B with `.to({ea})`")
    if acc is None:
        return T.i32 if ea.is_int else T.f32, (m, n, k)
    sacc = T.shape_of(acc.type)
    if sacc != (m, n):
        em.error("SP0338", f"the accumulator must be {m}x{n}, found {acc.type}", acc_span)
    eacc = T.element_type(acc.type)
    assert isinstance(eacc, T.ScalarType)
    allowed = ALLOWED_ACCUMULATORS[ea.name]
    if eacc.name not in allowed:
        em.error("SP0339", f"{ea} operands accumulate in {' or '.join(allowed)}, found {eacc}", acc_span,
                 help=f"create the accumulator with `zeros(({m}, {n}), {allowed[-1]})`")
    return eacc, (m, n, k)


def _acc_value(em: Emitter, acc: Arg | None, m: int, n: int, elem: T.ScalarType) -> Value:
    if acc is None or (isinstance(acc.value, Const) and acc.value.value is None):
        return em.constant(0, T.TileType(elem, (m, n)))
    return em.value(acc)


@builtin("dot")
def dot(em: Emitter, a: Arg, b: Arg, acc: Arg | None = None) -> Value:
    """``acc + a @ b`` for 2-D tiles on tensor cores (``acc`` defaults to zeros of f32/i32)."""
    va, vb = em.value(a), em.value(b)
    vacc = None if acc is None or (isinstance(acc.value, Const) and acc.value.value is None) else em.value(acc)
    sa = T.shape_of(va.type)
    elem, (m, n, _k) = _check_operands(em, va, vb, vacc, a.span, b.span, acc.span if acc else em.span,
                                       sa[1] if len(sa) == 2 else 0, sparse=False)
    c = vacc if vacc is not None else _acc_value(em, None, m, n, elem)
    return em.op1("dot", [va, vb, c], c.type)


@builtin("sparse_dot")
def sparse_dot(em: Emitter, a_values: Arg, a_meta: Arg, b: Arg, acc: Arg | None = None) -> Value:
    """``acc + decompress(a_values, a_meta) @ b`` with 2:4 (1:2 for tf32) sparse A; ``a_meta`` holds "sm90"
    metadata words, whose rows past M matter up to ``cdiv(M, 16) * 16`` (mask them with that, not M)."""
    va, vm, vb = em.value(a_values), em.value(a_meta), em.value(b)
    vacc = None if acc is None or (isinstance(acc.value, Const) and acc.value.value is None) else em.value(acc)
    sa = T.shape_of(va.type)
    k = 2 * sa[1] if len(sa) == 2 else 0
    elem, (m, n, k) = _check_operands(em, va, vb, vacc, a_values.span, b.span, acc.span if acc else em.span,
                                      k, sparse=True)
    ea = T.element_type(va.type)
    per_word = 16 if ea in (T.tf32, T.f32) else 32
    want = (m, max(1, k // per_word))
    sm = T.shape_of(vm.type)
    if T.element_type(vm.type) != T.u32 or sm != want:
        em.error("SP0340", f"sparse metadata for {m}x{k} {ea} A must be a {want[0]}x{want[1]} tile of u32 "
                 f"(one word per row and {per_word} K elements), found {vm.type}", a_meta.span,
                 help="load the rows of the metadata words that `sparsile.stdlib.sparsity.encode_metadata` made")
    if k % per_word:
        em.error("SP0341", f"sparse K tile must be a multiple of {per_word} for {ea}, found K = {k}", a_values.span)
    if m % 16:
        em.error("SP0341", f"sparse A tiles have a multiple of 16 rows (metadata words pair rows m and m+8), "
                 f"found M = {m}", a_values.span)
    c = vacc if vacc is not None else _acc_value(em, None, m, n, elem)
    return em.op1("sparse_dot", [va, vm, vb, c], c.type)


def _f(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if x.dtype.kind == "f" or x.dtype.name in ("bfloat16",) or "float8" in x.dtype.name \
        else x.astype(np.int64)


def mma_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray, acc_t: T.ScalarType,
                  stored: Callable[[], np.ndarray] | None = None, instr_k: int | None = None) -> np.ndarray:
    """acc + a @ b: integer exactly (wrapping to i32); float products exact in f64.

    Without ``instr_k`` (the tile-level ``dot`` / ``sparse_dot``): the sum is rounded to f32, then to
    the accumulator type. Every lowering of those ops carries an f16 accumulator as f32 through its
    MMAs (``mma.sync`` with an f32 D, wgmma and the portable path in f32, the tcgen05 tile path with
    an f32 D in tensor memory) and converts once at the end (``cvt.rn.f16.f32``), so partial sums
    beyond f16's range stay finite. The GPU's f32 sum (its per-instruction order and internal
    precision) may differ from the correctly rounded f32 of the exact sum in its last bits, which
    moves the f16 result by one f16 ulp where that f32 value lies next to an f16 rounding boundary.

    With ``instr_k`` (an instruction-level ``tcgen05.mma`` / ``hopper.wgmma``, whose D is the f16
    accumulator itself): an f16 accumulator is rounded to f16 after every ``instr_k`` columns of K,
    as the tensor core writes D once per instruction (PTX ISA 9.7.15.5 / 9.7.16.10: ``D = A*B + D``
    per instruction, the precision inside one instruction unspecified); each instruction's sum is
    modelled exact and rounded once, so a partial sum past 65504 is inf as on the GPU.

    A sparse MMA passes ``stored``, which gives the (M, K) positions its metadata names: b's elements
    elsewhere are never multiplied, so a NaN or inf there does not reach the result (a dense
    product would give 0 * inf = NaN; docs/sparse-metadata.md, "Special values")."""
    if acc_t.is_int:
        r = c.astype(np.int64) + _f(a).astype(np.int64) @ _f(b).astype(np.int64)
        return ((r + 2**31) % 2**32 - 2**31).astype(np.int32)
    fa, fb = _f(a), _f(b)
    mask = None if stored is None or np.isfinite(fb).all() else stored()

    def product(lo: int, hi: int) -> np.ndarray:
        if mask is None:
            return fa[:, lo:hi] @ fb[lo:hi]
        from ...stdlib.sparsity.reference import stored_product

        return stored_product(fa[:, lo:hi], mask[:, lo:hi], fb[lo:hi])

    k = fa.shape[1]
    with np.errstate(all="ignore"):  # (NaN / inf operands, overflow to inf: the GPU's results, no warning)
        if instr_k is None or acc_t != T.f16:
            return (c.astype(np.float64) + product(0, k)).astype(np.float32).astype(acc_t.numpy_dtype)
        r = c.astype(acc_t.numpy_dtype)
        for lo in range(0, max(k, 1), instr_k):
            r = (r.astype(np.float64) + product(lo, min(lo + instr_k, k))).astype(acc_t.numpy_dtype)
        return r


@dot_op.interpreter
def _i_dot(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    a, b, c = args
    ea = T.element_type(op.operand("a").type)
    if ea in (T.f32, T.tf32):
        from ..interp.numerics import cast_array

        a, b = cast_array(a, T.f32, T.tf32), cast_array(b, T.f32, T.tf32)
    return [mma_reference(a, b, c, T.element_type(op.result.type))]  # type: ignore[arg-type]


@sparse_dot_op.interpreter
def _i_sparse_dot(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    from ...stdlib.sparsity import SparsityError
    from ..interp.values import BAD_OPERAND_DATA, InterpreterError
    from .metadata_words import sparse_tile

    vals, meta, b, c = args
    ea = T.element_type(op.operand("a").type)
    assert isinstance(ea, T.ScalarType)
    try:
        dense, stored = sparse_tile(vals, meta, ea)
    except SparsityError as e:
        raise InterpreterError(BAD_OPERAND_DATA, f"invalid sparse metadata: {e.message}", op.span, ctx.program_id,
                               help=e.help) from None
    if ea in (T.f32, T.tf32):
        from ..interp.numerics import cast_array

        dense, b = cast_array(dense, T.f32, T.tf32), cast_array(b, T.f32, T.tf32)
    return [mma_reference(dense, b, c, T.element_type(op.result.type), stored)]  # type: ignore[arg-type]
