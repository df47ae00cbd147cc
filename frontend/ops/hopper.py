"""The ``hopper`` namespace: warpgroup MMA (``wgmma.mma_async``, dense and ``.sp``) on sm_90a.

``hopper.wgmma(a, b, acc, a_meta=None, b_kmajor=True)`` issues the MMAs computing
``acc + A @ B`` for the warpgroups of the current partition and commits them as one group; it
returns the new accumulator. ``hopper.wgmma_wait(pending, acc)`` waits until at most ``pending``
groups are in flight and returns ``acc`` ready to read (PTX ISA 9.7.15.6-7:
``wgmma.commit_group`` / ``wgmma.wait_group``).

Operands (PTX ISA 9.7.15.5): ``a`` is a shared-memory buffer of ``M x K`` elements (``M x K/2``
compressed values when ``a_meta`` is given), stored K-major, or a register tile of that shape
(PTX ISA 9.7.15.5.1.1: the compiler gives it the wgmma A-fragment layout; after such a wgmma only
``wgmma_wait(0, ...)`` in the same block may follow, SP0395/SP0396, because A's registers must not
change while the MMA runs); ``b`` is ``N x K`` (K-major,
``b_kmajor=True``) or ``K x N`` (MN-major, 16-bit types only); ``acc`` is an ``M x N`` tile. The
warpgroups of the partition split M in blocks of 64 rows (each warpgroup issues ``M / 64 /
warpgroups`` MMAs per K step). ``a_meta`` is the ``M x K/32`` (tf32: ``K/16``) block of
metadata words, in registers (load it from global or shared memory; the compiler gives it the
wgmma metadata layout). Sparse groups may stay in flight (``wgmma_wait(n > 0)``) while their
metadata registers are left alone until the wait that retires them (the hardware reads them
asynchronously); the legality pass checks it (SP0370, frontend/legality/wgmma_inflight.py).
"""

from __future__ import annotations

from typing import Any

from ..ir import types as T
from ..ir.core import Operation, Value
from ..layout.rules import accumulator
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .dot import ALLOWED_ACCUMULATORS, MIXABLE_OPERANDS, mma_reference
from .opdefs import TYPED_BY_SEMA, define_op


def wgmma_operands(op: Operation) -> tuple[str, ...]:
    """``a, b, acc``, then ``a_meta`` when the wgmma is sparse."""
    return ("a", "b", "acc", "a_meta") if op.attrs.get("sparse") else ("a", "b", "acc")


wgmma_op = define_op("hopper.wgmma", operands=wgmma_operands, verify=TYPED_BY_SEMA, layout=accumulator("acc"),
                     side_effects=True,
                     doc="Warpgroup MMA: B from shared memory, A from shared memory or registers (async, committed).")
wgmma_wait_op = define_op("hopper.wgmma_wait", operands=("acc",), verify=TYPED_BY_SEMA, layout=accumulator("acc"),
                          side_effects=True, doc="Wait for committed wgmma groups.")

INSTR_K = {"f16": 16, "bf16": 16, "tf32": 8, "f32": 8, "e4m3": 32, "e5m2": 32, "i8": 32, "u8": 32}


@builtin("wgmma", ns="hopper")
def wgmma(em: Emitter, a: Arg, b: Arg, acc: Arg, a_meta: Arg | None = None, b_kmajor: Arg | None = None) -> Value:
    """``acc + A @ B`` on the warpgroup tensor cores (sparse A when ``a_meta`` is given)."""
    va, vb, vacc = em.value(a), em.value(b), em.value(acc)
    a_regs = isinstance(va.type, T.TileType)
    if a_regs:
        shape_a = T.shape_of(va.type)
        ea_t = T.element_type(va.type)
        if len(shape_a) != 2 or not isinstance(ea_t, T.ScalarType):
            em.error("SP0391", f"A of wgmma must be a 2-D tile of numbers (register A) or a 2-D shared-memory "
                     f"buffer, found {va.type}", a.span,
                     help="pass an M x K tile (M x K/2 compressed values when sparse) of f16, bf16, tf32, e4m3, "
                          "e5m2, i8 or u8")
    elif not isinstance(va.type, T.SmemType) or len(va.type.shape) != 2:
        em.error("SP0391", f"A of wgmma must be a 2-D shared-memory buffer or a 2-D register tile, found {va.type}",
                 a.span, help="allocate it with `smem.alloc(dtype, (rows, cols), swizzle=128)` and fill it by TMA, "
                              "or pass a tile in registers")
    if not isinstance(vb.type, T.SmemType) or len(vb.type.shape) != 2:
        em.error("SP0391", f"B of wgmma must be a 2-D shared-memory buffer, found {vb.type}", b.span,
                 help="allocate it with `smem.alloc(dtype, (rows, cols), swizzle=128)` and fill it by TMA "
                      "(only A may come from registers, PTX ISA 9.7.15.5.1)")
    ta, tb = va.type, vb.type
    assert isinstance(tb, T.SmemType)
    a_shape = T.shape_of(ta) if a_regs else ta.shape  # type: ignore[union-attr]
    kmajor = True if b_kmajor is None else bool(em.constexpr(b_kmajor, "b_kmajor", (bool, int)))
    sparse = a_meta is not None and not (isinstance(a_meta.value, Const) and a_meta.value.value is None)
    m = a_shape[0]
    k = a_shape[1] * (2 if sparse else 1)
    n, kb = (tb.shape[0], tb.shape[1]) if kmajor else (tb.shape[1], tb.shape[0])
    if kb != k:
        em.error("SP0336", f"wgmma inner dimensions differ: A covers K = {k}"
                 f"{' (compressed, K/2 = ' + str(a_shape[1]) + ')' if sparse else ''} but B has K = {kb}", b.span,
                 help="B is N x K when b_kmajor=True (the default), K x N otherwise")
    ea, eb = (T.element_type(ta) if a_regs else ta.elem), tb.elem  # type: ignore[union-attr]
    assert isinstance(ea, T.ScalarType)
    if ea.name not in ALLOWED_ACCUMULATORS:
        em.error("SP0337", f"wgmma does not take {ea} operands", a.span)
    if a_regs and ea.name in ("f32", "tf32"):
        em.error("SP0397", f"wgmma with a {ea} A in registers is not supported: on the H200 its results were off by "
                 "about 2^-12 relative to the float64 product of the operands as the tensor cores read them "
                 "(shared-memory A is exact to f32 accumulation)", a.span,
                 help="store A to shared memory (`smem.alloc(tf32, ...)`, `.store(a)`) and pass the buffer")
    if ea != eb and not any({ea.name, eb.name} <= p for p in MIXABLE_OPERANDS):
        em.error("SP0337", f"A is {ea} but B is {eb}", b.span)
    if not kmajor and ea.bits != 16:
        em.error("SP0392", f"an MN-major B is only allowed for 16-bit operands, found {ea}", b.span,
                 help="store B K-major (N x K) for tf32 and 8-bit types (PTX ISA 9.7.15.5.1)")
    if T.shape_of(vacc.type) != (m, n):
        em.error("SP0338", f"the accumulator must be {m}x{n}, found {vacc.type}", acc.span)
    eacc = T.element_type(vacc.type)
    allowed = ALLOWED_ACCUMULATORS[ea.name]
    if eacc.name not in allowed:  # type: ignore[union-attr]
        em.error("SP0339", f"{ea} operands accumulate in {' or '.join(allowed)}, found {eacc}", acc.span)
    instr_k = INSTR_K[ea.name] * (2 if sparse else 1)
    if k % instr_k:
        em.error("SP0393", f"K = {k} is not a multiple of the {'sparse ' if sparse else ''}wgmma K step {instr_k} "
                 f"for {ea}", a.span)
    operands = [va, vb, vacc]
    if sparse:
        assert a_meta is not None
        vm = em.value(a_meta)
        per_word = 16 if ea.name in ("tf32", "f32") else 32
        want = (m, k // per_word)
        if T.element_type(vm.type) != T.u32 or T.shape_of(vm.type) != want:
            em.error("SP0340", f"wgmma sparse metadata for {m}x{k} {ea} A must be a {want[0]}x{want[1]} u32 tile, "
                     f"found {vm.type}", a_meta.span)
        operands.append(vm)
    return em.op1("hopper.wgmma", operands, vacc.type, sparse=sparse, b_kmajor=kmajor, m=m, n=n, k=k,
                  a_regs=a_regs)


@builtin("wgmma_wait", ns="hopper")
def wgmma_wait(em: Emitter, pending: Arg, acc: Arg) -> Value:
    """Wait until at most ``pending`` wgmma groups are in flight; returns ``acc`` ready to read.

    Sparse groups may stay in flight (``pending > 0``) as long as the metadata register each one
    reads is not rewritten before the wait that retires it: the hardware reads it asynchronously.
    The legality pass proves that or reports SP0370 at the line that rewrites it
    (frontend/legality/wgmma_inflight.py): on an H200, one group pending with a metadata rotation
    (``meta = meta_next``) gave wrong results, while three register sets, each reloaded only after
    the wait that retired its MMA, gave right ones (benchmarks/RESULTS.md)."""
    n = em.constexpr(pending, "the number of pending groups")
    if not 0 <= n <= 7:
        em.error("SP0394", f"wgmma.wait_group takes 0 to 7 pending groups, found {n}", pending.span)
    v = em.value(acc)
    if not isinstance(v.type, T.TileType):
        em.error("SP0394", f"wgmma_wait passes an accumulator tile through, found {v.type}", acc.span)
    if n > 0:
        src = v.owner
        if src is not None and src.name == "hopper.wgmma" and src.attrs.get("a_regs"):
            em.error("SP0395", f"hopper.wgmma_wait({n}, ...) after a wgmma with A in registers: the registers of A "
                     "must not change while the MMA is in flight", pending.span,
                     help="wait for all groups after register-A MMAs: `hopper.wgmma_wait(0, acc)`; overlap comes "
                          "from several warpgroups working independently (PTX ISA 9.7.15.5.2)")
    return em.op1("hopper.wgmma_wait", [v], v.type, pending=n)


@wgmma_op.interpreter
def _i_wgmma(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    import numpy as np

    from ..interp.numerics import tf32_truncate

    a, b, acc = (args[op.operand_index(n)] for n in ("a", "b", "acc"))
    ta = op.operand("a").type
    ea = ta.elem if isinstance(ta, T.SmemType) else T.element_type(ta)  # A in shared memory or registers
    bm = np.asarray(b) if op.attrs["b_kmajor"] is False else np.asarray(b).T
    stored = None
    if op.attrs["sparse"]:
        from ...stdlib.sparsity import SparsityError
        from ..interp.values import BAD_OPERAND_DATA, InterpreterError
        from .metadata_words import sparse_tile

        try:
            a, stored = sparse_tile(np.asarray(a), np.asarray(args[op.operand_index("a_meta")]), ea)
        except SparsityError as e:
            raise InterpreterError(BAD_OPERAND_DATA, f"invalid sparse metadata: {e.message}", op.span,
                                   ctx.program_id, help=e.help) from None
    if ea in (T.f32, T.tf32):  # the tensor cores drop the low 13 bits of f32 data (measured, docs/hopper.md)
        a, bm = tf32_truncate(a), tf32_truncate(bm)
    from .blackwell_operands import instr_k  # (wgmma's instruction K is tcgen05's: 16 / 8 / 32, twice that sparse)

    return [mma_reference(np.asarray(a), bm, acc, T.element_type(op.result.type), stored,  # type: ignore[arg-type]
                          instr_k(ea, op.attrs["sparse"]))]


@wgmma_wait_op.interpreter
def _i_wgmma_wait(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return [args[0]]
