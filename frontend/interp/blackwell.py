"""Interpreter semantics of the Blackwell explicit ops (``frontend/ops/blackwell.py``: namespaces
``tmem`` and ``tcgen05``). Tensor memory is a per-program numpy array per allocation; an MMA or a
copy runs when it is issued (a valid order of the asynchronous hardware: completion is only
observable through ``tcgen05.commit`` + ``mbarrier.wait``), and leaves records of what it writes and
reads, so that an access the GPU would not order after its completion is reported (SP0791,
``tcgen05_async.py``)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..ir import types as T
from ..ir.core import Operation
from ..ops.blackwell import (
    commit_op,
    copy_op,
    fence_after_op,
    fence_before_op,
    mma_op,
    mma_operands,
    tmem_alloc_op,
    tmem_index_op,
    tmem_init_op,
    tmem_load_chunks_op,
    tmem_load_op,
    tmem_release_op,
    tmem_slice_op,
    tmem_store_op,
)
from ..ops.blackwell_operands import CLASS_DTYPE, META_BITS, WORD_K, instr_k
from . import tcgen05_async as race
from .values import BAD_OPERAND_DATA, OUT_OF_BOUNDS, InterpreterError

_POISON_I32 = 0x7EADBEEF


@tmem_alloc_op.interpreter
def _i_alloc(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    key = ("tmem", id(op))
    if key not in ctx.shared:
        t = op.result.type
        if t.kind == "meta":
            arr = np.zeros(t.shape, np.uint32)  # never-copied metadata reads as undefined nibbles 0x0
        elif t.kind == "scale":
            arr = np.full(t.shape, 0xFFFFFFFF, np.uint32)  # never-copied scales read as UE8M0 NaN
        elif t.elem.is_float:
            arr = np.full(t.shape, np.nan, T.numpy_dtype(t.elem if t.elem != T.tf32 else T.f32))
        else:
            arr = np.full(t.shape, _POISON_I32 if t.elem.bits == 32 else 0x5A, T.numpy_dtype(t.elem))
        ctx.shared[key] = arr
    return [ctx.shared[key]]


@tmem_index_op.interpreter
def _i_index(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    ref, i = args
    if not 0 <= int(i) < ref.shape[0]:
        raise InterpreterError(OUT_OF_BOUNDS,
                               f"TMEM stage {int(i)} is out of range [0, {ref.shape[0]})", op.span, ctx.program_id)
    return [ref[int(i)]]


@tmem_slice_op.interpreter
def _i_slice(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    ref, start = args
    d, n, s = op.attrs["dim"], op.attrs["size"], int(start)
    if not 0 <= s <= ref.shape[d] - n:
        raise InterpreterError(OUT_OF_BOUNDS,
                               f"TMEM slice [{s}, {s + n}) of dimension {d} is outside {ref.shape[d]}", op.span,
                               ctx.program_id)
    return [ref[s:s + n] if d == 0 else ref[:, s:s + n]]


@tmem_load_op.interpreter
def _i_load(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    race.check(ctx, op, args[0], "tcgen05.ld", write=False, tcgen05=True, pipelined=False)
    return [np.array(args[0], copy=True)]


@functools.cache
def _chunk_positions(rows: int, cols: int, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(word row, word column, nibble slot) of every (row, chunk) of a metadata word matrix, from
    the sparsity toolkit's "sm90" placement (independent of the layout algebra)."""
    from ...stdlib.sparsity import operand_type, word_position

    op_t = operand_type(CLASS_DTYPE[bits])
    r = np.zeros((rows, 8 * cols), np.int64)
    c, s = np.zeros_like(r), np.zeros_like(r)
    for m in range(rows):
        for j in range(8 * cols):
            (lane, col), slot = word_position("sm90", op_t, m, j)
            r[m, j], c[m, j], s[m, j] = lane, col, slot
    return r, c, s


@tmem_load_chunks_op.interpreter
def _i_load_chunks(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    race.check(ctx, op, args[0], "tcgen05.ld", write=False, tcgen05=True, pipelined=False)
    words = np.asarray(args[0])
    t = op.operand("ref").type
    r, c, s = _chunk_positions(words.shape[0], words.shape[1], t.meta_bits)
    return [((words[r, c] >> (4 * s).astype(np.uint32)) & 0xF).astype(np.uint8)]


@tmem_store_op.interpreter
def _i_store(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    race.check(ctx, op, args[0], "tcgen05.st", write=True, tcgen05=True, pipelined=False)
    args[0][...] = args[1]
    return []


def _pair(ctx: Any, op: Operation) -> tuple[int, int] | None:
    """(this CTA's rank, its peer's) for a cta_group=2 op issued by the even CTA of the pair; None
    in the odd CTA, where such an op does nothing (PTX ISA 9.7.16.5: one thread of the pair issues)."""
    from ..ops.cluster import cluster_of

    cl = cluster_of(ctx)
    me = cl[1] if cl else 0
    return None if me & 1 else (me, me ^ 1)


@mma_op.interpreter
def _i_mma(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    if op.attrs.get("cta_group", 1) == 2:
        return _i_mma_pair(ctx, op, args)
    _track_mma(ctx, op, args)
    _mma_one(ctx, op, args)
    return []


def _track_mma(ctx: Any, op: Operation, args: list[Any]) -> None:
    """SP0791 if a TMEM operand of the MMA is in flight for another thread; then record the
    accumulator it writes and the operands it reads (shared memory or TMEM) as in flight."""
    names = [n for n in mma_operands(op) if n != "enable"]
    in_tmem = {n: isinstance(op.operand(n).type, T.TmemType) for n in names}
    for n in names:
        if in_tmem[n]:
            race.check(ctx, op, args[op.operand_index(n)], "tcgen05.mma", write=n == "d", tcgen05=True,
                       pipelined=True)
    for n in names:
        race.issue(ctx, op, args[op.operand_index(n)], writes=n == "d", tmem=in_tmem[n])


def _i_mma_pair(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    """M = 256 over the CTA pair: D rows of each CTA = its A (and metadata) @ [B of the even CTA;
    B of the odd CTA]^T (docs/hardware.md §1.2; PTX ISA 9.7.16.10.5.1)."""
    from ..ops.cluster import peer_array

    pair = _pair(ctx, op)
    if pair is None:
        return []
    _, peer = pair
    what = "tcgen05.mma(cta_group=2)"
    enable, ib = op.operand_index("enable"), op.operand_index("b")
    peer_args = [peer_array(ctx, op, np.asarray(x), peer, what) if i != enable else x
                 for i, x in enumerate(args)]
    b_full = np.concatenate([np.asarray(args[ib]), np.asarray(peer_args[ib])], axis=0)
    for which in (args, peer_args):
        _track_mma(ctx, op, which)
        _mma_one(ctx, op, [b_full if i == ib else x for i, x in enumerate(which)])
    return []


def _mma_one(ctx: Any, op: Operation, args: list[Any]) -> None:
    from ..ops.dot import mma_reference
    from .numerics import tf32_truncate

    a, b, acc = (args[op.operand_index(n)] for n in ("a", "b", "d"))
    a, b = np.asarray(a), np.asarray(b)
    en = bool(args[op.operand_index("enable")])
    ta = op.operand("a").type
    ea = ta.elem
    stored = None
    if op.attrs["sparse"]:
        from ...stdlib.sparsity import SparsityError
        from ..ops.metadata_words import sparse_tile

        meta = np.asarray(args[op.operand_index("a_meta")])[:, :op.attrs["k"] // WORD_K[META_BITS[ea.name]]]
        try:
            a, stored = sparse_tile(a, meta, ea)
        except SparsityError as e:
            raise InterpreterError(BAD_OPERAND_DATA, f"invalid sparse metadata in TMEM: {e.message}", op.span,
                                   ctx.program_id, help=e.help) from None
    if op.attrs.get("block_scale"):
        a, b = _scaled_operands(ctx, op, args, a, b)
    bm = b.T
    if ea in (T.f32, T.tf32):  # as wgmma on the H200: low 13 bits dropped (assumed for tcgen05, not measured)
        a, bm = tf32_truncate(a), tf32_truncate(bm)
    eacc = op.operand("d").type.elem
    base = acc if en else np.zeros(acc.shape, acc.dtype)
    acc[...] = mma_reference(a, bm, base, eacc, stored, instr_k(ea, op.attrs["sparse"]))  # D rounded per instruction


def _scaled_operands(ctx: Any, op: Operation, args: list[Any], a: np.ndarray,
                     b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A and B (float64) multiplied by the block scales the MMA reads from TMEM (PTX ISA
    9.7.16.10.7: ``(A * scale_A) @ (B * scale_B)``), one scale per row and instruction K."""
    from ..ops.tmem_scales import apply_scales, read_scales

    i = op.operand_index("a_scale")
    step = instr_k(op.operand("a").type.elem, op.attrs["sparse"])
    steps = op.attrs["k"] // step
    try:
        sa = read_scales(np.asarray(args[i]), a.shape[0], steps, "A")
        sb = read_scales(np.asarray(args[op.operand_index("b_scale")]), b.shape[0], steps, "B")
    except ValueError as e:
        raise InterpreterError(BAD_OPERAND_DATA, str(e), op.span, ctx.program_id) from None
    return apply_scales(a, sa, step), apply_scales(b, sb, step)


@copy_op.interpreter
def _i_copy(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    from ..ops.cluster import peer_array

    if op.attrs.get("scale"):
        _track_copy(ctx, op, args[0], args[1])
        atoms = np.asarray(args[0]).reshape(-1, 32, 4)
        for i in range(atoms.shape[0]):  # tcgen05.cp.32x128b.warpx4: line r to lane r of every quarter
            args[1][:, 4 * i:4 * i + 4] = np.tile(atoms[i], (4, 1))
        return []

    ranks: tuple[int, ...] = (-1,)
    if op.attrs.get("cta_group", 1) == 2:
        pair = _pair(ctx, op)
        if pair is None:
            return []
        ranks = pair
    for r in ranks:
        src, dst = np.asarray(args[0]), args[1]
        if r >= 0:
            src = peer_array(ctx, op, src, r, "tcgen05.copy(cta_group=2)")
            dst = peer_array(ctx, op, dst, r, "tcgen05.copy(cta_group=2)")
        _track_copy(ctx, op, src, dst)
        atoms = src.reshape(-1, 128, 4)
        for i in range(atoms.shape[0]):
            dst[:, 4 * i:4 * i + 4] = atoms[i]
    return []


def _track_copy(ctx: Any, op: Operation, src: Any, dst: Any) -> None:
    """SP0791 if the destination is in flight for another thread; then record the copy."""
    race.check(ctx, op, dst, "tcgen05.cp", write=True, tcgen05=True, pipelined=True)
    race.issue(ctx, op, dst, writes=True, tmem=True)
    race.issue(ctx, op, src, writes=False, tmem=False)


@commit_op.interpreter
def _i_commit(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    from ..ops.cluster import cluster_of, mask_ranks, peer_barrier

    if op.attrs.get("cta_group", 1) == 2 and _pair(ctx, op) is None:
        return []
    bars = [args[0][0]]
    if op.attrs.get("multicast"):
        cl = cluster_of(ctx)
        bars = [args[0][0] if cl is not None and r == cl[1] else
                peer_barrier(ctx, op, args[0][0], r, "tcgen05.commit multicast")
                for r in mask_ranks(ctx, op, int(args[1]), "tcgen05.commit")]
    with args[0][0].cond:  # the phases the commit counts toward are those its arrivals complete
        race.commit(ctx, op, bars)
        for bar in bars:
            bar.arrive()
    return []


@fence_after_op.interpreter
def _i_fence_after(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    race.fence_after(ctx)
    return []


@tmem_init_op.interpreter
@tmem_release_op.interpreter
@fence_before_op.interpreter
def _i_noop(ctx: Any, op: Operation, args: list[Any]) -> list[Any]:
    return []
