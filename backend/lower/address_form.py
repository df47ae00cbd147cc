"""Per-register addresses of a pointer tile as constant offsets from a few base addresses.

``p + offs`` on a tile lowers register by register. Written as ``gep p, sext(offs_r)`` for every
register r, LLVM's NVPTX straight-line strength reduction compares each address with every earlier
one: its time grows with the square of the elements per thread (3 s of code generation for 256
elements per thread of a masked ``program_id(0) * B + arange(0, B)`` tile). Where axis analysis
proves that register r's offset is register q's plus a compile-time constant k *without wrapping*,
the address is written ``gep (gep p, sext(offs_q)), k`` instead: one extension and one variable
address per base, constant offsets from it, and the pass runs in linear time (the shipped kernels'
PTX: the same or fewer instructions, no spills).

The proof: ``contiguity[d] = C`` and ``divisibility[d] = D`` of the offsets (``axis_info.py``) say
that along dim d, in aligned blocks of ``L`` elements (L the largest power of two <= min(C, D)), the
values are ``s, s + 1, ..., s + L - 1`` with s a multiple of L: as bit patterns ``s | i``, the high
bits (the sign bit among them, L <= 2**(width - 1)) the same across the block, so ``sext(s | i) ==
sext(s) + i``: a register's extended offset is its block representative's plus the difference of
their coordinates. That difference is a constant when the register part of the layout's dim d
shares no bit with the lane and warp parts (the thread's coordinate is then ``thread | register``,
not an XOR that mixes them). Where any of this is not proven (offsets that may wrap, such as an
unaligned ``arange(3, 3 + B)`` added to an arbitrary value), each register keeps its own extended
offset, exactly as before.

The base address keeps ``inbounds`` (the straight-line strength reduction relates the bases of
successive tiles through it; without it the sparse GEMM's metadata loads cost a 64-bit multiply
more per K step, seen in a build without 16-byte-aligned arguments) and the constant offsets from
it carry no flag. Where the pointer is one value (``x + offs``, x a scalar), the base is register
q's own address, with the ``inbounds`` it always had; the address of register r is then poison
where register q's is, i.e. where ``x + offs_q`` (masked off, say) lies outside the allocation while
``x + offs_r`` lies inside: LLVM cannot know the bounds of a kernel parameter's allocation, so it
cannot act on that.
"""

from __future__ import annotations

from ...frontend.ir.axis_info import AxisInfo
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import LANE, WARP, register_coords, thread_bases

AddressPlan = list[tuple[int, int]]
"""Per register r: (q, k), register q's offset plus the constant k being register r's offset."""


def disjoint_dims(layout: LinearLayout) -> list[bool]:
    """Per logical dim: whether the register bases share no bit with the lane and warp bases (a
    thread's coordinate there is then ``thread part | register part``)."""
    rank = len(layout.out_dims)
    reg_bits = [0] * rank
    thr_bits = [0] * rank
    for off in register_coords(layout):
        for d in range(rank):
            reg_bits[d] |= off[d]
    for name in (LANE, WARP):
        for basis in thread_bases(layout, name):
            for d in range(rank):
                thr_bits[d] |= basis[d]
    return [(reg_bits[d] & thr_bits[d]) == 0 for d in range(rank)]


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def aligned_block(info: AxisInfo, dim: int, width: int) -> int:
    """The length L of the aligned blocks along ``dim`` whose values are ``s | i`` (s a multiple of
    L, i < L) for offsets of ``width`` bits with axis facts ``info``; 1 where nothing is proven."""
    return min(_pow2_floor(min(info.contiguity[dim], info.divisibility[dim])), 1 << (width - 1))


def address_plan(layout: LinearLayout, info: AxisInfo, width: int) -> AddressPlan | None:
    """For the offset tile of an ``addptr`` (``layout``, axis facts ``info``, ``width``-bit integers):
    per register its base register and constant offset from it (see the module docstring), along
    the dim with the longest proven blocks; None where no register gains a constant offset."""
    rank = len(layout.out_dims)
    if len(info.contiguity) != rank:
        return None
    disjoint = disjoint_dims(layout)
    blocks = [aligned_block(info, d, width) if disjoint[d] else 1 for d in range(rank)]
    best = max(blocks)
    if best == 1:
        return None
    dim = max(d for d in range(rank) if blocks[d] == best)  # the innermost of the longest
    shift = best.bit_length() - 1
    coords = register_coords(layout)
    reps: dict[tuple[tuple[int, ...], int], int] = {}
    for r, c in enumerate(coords):
        key = (c[:dim] + c[dim + 1:], c[dim] >> shift)
        q = reps.get(key)
        if q is None or c[dim] < coords[q][dim]:
            reps[key] = r
    plan = []
    for c in coords:
        q = reps[(c[:dim] + c[dim + 1:], c[dim] >> shift)]
        plan.append((q, c[dim] - coords[q][dim]))
    if all(k == 0 for _, k in plan):
        return None
    return plan
