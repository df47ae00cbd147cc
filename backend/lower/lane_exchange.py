"""Wider global stores by exchanging registers between lanes (``shfl.sync.bfly``).

An MMA accumulator's layout gives each thread short runs along the last dimension: in a wgmma
accumulator (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate", the register
fragment of D) register bit 0 walks column bit 0, lane bits 0-1 walk column bits 1-2 and register
bits 2, 3, ... walk column bits 3, 4, ... So a store of that tile writes two elements per thread
and instruction: a warp's store covers 16 bytes of each of 8 rows, half of every 32-byte sector,
and the tile takes four times the store instructions 16-byte accesses would. That epilogue was
about a tenth of the e4m3 GEMM's warp samples on the H200 (docs/hopper.md, "Epilogue").

Where the low lane bits walk the last dimension right above a thread's run and register bits
walk it right above the lanes, swapping those k lane bits with those k register bits is a
2^k x 2^k transpose within each group of 2^k lanes: k butterfly rounds of ``shfl.sync.bfly``
(round j exchanges the runs whose register bit j differs from lane bit j with lane ^ 2^j). After
it each thread holds 2^k runs that are adjacent in memory, and stores them as one access of
2^k times the width. :func:`exchange_plan` says whether a store can (the layout, the alignment
and contiguity axis analysis proves, a mask constant across the wider access); :func:`store_exchanged`
emits it. The elements stored and their addresses are the same; only which thread stores which
element changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...frontend.ir import types as T
from ...frontend.ir.core import Value
from ...frontend.layout.tile import LANE, REG, WARP, register_coords, replicated_thread_bits, thread_bases
from .codegen import CodeGen, DTile
from .llvm_text import const

ENV_SWITCH = "SPARSILE_LANE_EXCHANGE_STORES"
"""``0`` turns the exchange off (every store keeps its layout's own runs): for measuring it. Read
when a kernel is compiled; the disk cache keys on it (driver/cache.py ``_versions_now``), while a
kernel already compiled in this process keeps its build: set it before the process compiles."""

SECTOR_BYTES = 32
"""The exchange applies where a warp's store covers at most one 32-byte sector of each row (its
lanes along the row times the run: an MMA fragment's 16 or 32 bytes). Where the lanes already
cover whole sectors (a blocked layout with 8 or more lanes along the row) the stores are coalesced,
and the shuffles would only trade instructions for instructions; that case was not measured."""


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


@dataclass(frozen=True)
class ExchangePlan:
    """``run``: elements of the layout's own run (register bits 0 .. log2(run) - 1); ``lanes``:
    the low lane bits walking the last dimension right above it (lane bit j: ``run << j``); ``k``:
    lane bits 0 .. k - 1 (k <= lanes) exchanged with register bits ``reg_bits`` (register bit j
    walking ``run << (lanes + j)``); the store is then ``run << k`` elements wide. A wgmma
    accumulator has lanes = 2: f16 (run 2, 4 bytes) exchanges both (k = 2, 16 bytes), f32 (run 2,
    8 bytes) one (k = 1, 16 bytes)."""

    run: int
    k: int
    reg_bits: tuple[int, ...]
    lanes: int

    @property
    def width(self) -> int:
        return self.run << self.k


def _unit(rank: int, last: int, step: int) -> tuple[int, ...]:
    return tuple(step if d == last else 0 for d in range(rank))


def exchange_plan(ptr_v: Value, val_v: Value, mask_v: Value | None, run: int, allowed: int, contiguous: int,
                  elem_bytes: int) -> ExchangePlan | None:
    """The exchange for a store of ``val_v`` through ``ptr_v`` whose layout gives runs of ``run``
    elements, where axis analysis allows ``allowed`` elements per access (contiguity, alignment and
    the mask's constancy along the last dimension, at most 16 bytes) and proves the addresses
    contiguous over runs of ``contiguous`` elements (a group of lanes' whole span must be one: the
    exchanged block's address is computed from the thread's own); None where it does not apply."""
    if not enabled() or allowed <= run or (run * elem_bytes) % 4 or T.element_type(val_v.type).is_bool:
        return None
    layout = ptr_v.layout
    if val_v.layout != layout or (mask_v is not None and isinstance(mask_v.type, T.TileType)
                                  and mask_v.layout != layout):
        return None
    if replicated_thread_bits(layout) != (0, 0) or len(set(register_coords(layout))) != len(register_coords(layout)):
        return None  # replicated elements: each thread stores its own, once
    rank = len(T.shape_of(ptr_v.type))
    last = rank - 1
    rbits = layout.in_bits(REG) if REG in layout.in_names else 0
    reg_bases = [tuple(layout.basis(REG, b).values()) for b in range(rbits)]
    lane_bases = thread_bases(layout, LANE)
    lanes = 0  # low lane bits walking the last dimension right above the run
    while lanes < len(lane_bases) and lane_bases[lanes] == _unit(rank, last, run << lanes):
        lanes += 1
    if (run << lanes) * elem_bytes > SECTOR_BYTES:
        return None  # the warp's stores are whole sectors already
    for k in range(lanes, 0, -1):  # the widest exchange that fits
        if run << k > allowed or run << (lanes + k) > contiguous:
            continue
        # one register bit per exchanged lane bit, walking the last dimension right above all the lanes
        found = [[b for b, basis in enumerate(reg_bases) if basis == _unit(rank, last, run << (lanes + j))]
                 for j in range(k)]
        if all(found):
            plan = ExchangePlan(run, k, tuple(f[0] for f in found), lanes)
            if _others_clear_of_span(layout, plan, last):
                return plan
    return None


def _others_clear_of_span(layout: object, plan: ExchangePlan, last: int) -> bool:
    """Every basis other than the run's register bits, the low ``plan.lanes`` lane bits and the
    exchanged register bits leaves the last-dim bits below ``run << (lanes + k)`` alone: the
    coordinates are XORs of bases, and the emitted addresses (the thread's own first element moved
    by ``quad``) assume the exchanged span is an aligned block those other bases only translate."""
    span = plan.run << (plan.lanes + plan.k)
    rbits = layout.in_bits(REG) if REG in layout.in_names else 0  # type: ignore[attr-defined]
    own = set(range(plan.run.bit_length() - 1)) | set(plan.reg_bits)
    regs = [tuple(layout.basis(REG, b).values()) for b in range(rbits) if b not in own]  # type: ignore[attr-defined]
    rest = regs + thread_bases(layout, LANE)[plan.lanes:] + thread_bases(layout, WARP)  # type: ignore[arg-type]
    return all(basis[last] % span == 0 for basis in rest)


def store_exchanged(cg: CodeGen, plan: ExchangePlan, ptr: DTile, val: DTile, mask: DTile | None,
                    elem: T.ScalarType, elem_bytes: int) -> None:
    """Emit the store of ``val`` through ``ptr`` (under ``mask``) with ``plan``'s lane exchange."""
    from .memory import global_access, pack_words, unpack_words
    from .reduce import shuffle_xor

    fb = cg.fb
    k, run = plan.k, plan.run
    lane = cg.lane_id()
    lane_bit = [fb.icmp("ne", fb.binop("and", lane, const(1 << j, "i32")), const(0, "i32")) for j in range(k)]
    quad = fb.binop("and", lane, const((1 << k) - 1, "i32"))  # this lane's index within its group
    own = set(range(run.bit_length() - 1)) | set(plan.reg_bits)  # the run's and the exchanged register bits
    others = [b for b in range(len(ptr.regs).bit_length() - 1) if b not in own]
    word = max(4, elem_bytes)  # 8-byte elements (run 1) travel as i64 words: two shuffles each
    for rest in range(1 << len(others)):
        base = sum(((rest >> i) & 1) << b for i, b in enumerate(others))

        def reg(t: int, i: int, base: int = base) -> int:  # register i of run t (exchanged bits = t)
            return base + i + sum(((t >> j) & 1) << plan.reg_bits[j] for j in range(k))

        runs = [pack_words(cg, [val.regs[reg(t, i)] for i in range(run)], elem_bytes, word) for t in range(1 << k)]
        for j in range(k):
            for t in range(1 << k):
                if t >> j & 1:
                    continue
                t1 = t | 1 << j
                for w in range(len(runs[t])):
                    send = fb.select(lane_bit[j], runs[t][w], runs[t1][w])
                    recv = shuffle_xor(cg, send, 1 << j)
                    runs[t][w], runs[t1][w] = (fb.select(lane_bit[j], recv, runs[t][w]),
                                               fb.select(lane_bit[j], runs[t1][w], recv))
        ety = val.regs[0].type
        elems = [e for t in range(1 << k) for e in unpack_words(cg, runs[t], elem_bytes, word, ety)]
        # this lane now holds the elements that lanes 0 .. 2^k - 1 of its group held in its run `quad`
        # (offset quad * run << lanes): the address of its run 0 (offset quad * run, from the lanes)
        # moved there
        step = const(((run << plan.lanes) - run) * elem_bytes, "i64")
        first = ptr.regs[reg(0, 0)]
        at = fb.gep("i8", first, fb.binop("mul", fb.cast("zext", quad, "i64"), step))
        m = None
        if mask is not None:  # constant across the block: run `quad`'s own mask (its exchanged bits = quad)
            m = mask.regs[reg(0, 0)]
            for t in range(1, 1 << k):
                m = fb.select(fb.icmp("eq", quad, const(t, "i32")), mask.regs[reg(t, 0)], m)
        global_access(cg, False, at, m, elems, None, elem, plan.width)
