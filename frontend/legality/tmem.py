"""Legality rules of the Blackwell explicit level (``ops_blackwell.py``: tensor memory and
``tcgen05``), decided per target before emission.

``ops_blackwell`` checks operand types and shapes when the call is typed (SP054x); these rows
decide what depends on the target and on where the op runs, and re-derive what the emitted
instructions will encode, so that nothing is left to the lowering:

* every ``tcgen05.*`` / ``tmem.*`` op needs a target with tcgen05 (``SP0602``: sm_100a/f,
  sm_103a/f, sm_110a/f — docs/hardware.md §7); ``kind::i8`` needs ``TCGEN05_I8`` (sm_100a and
  sm_110a only, §0 item 5);
* **instruction descriptors** (ptxas checks none of them, §0 item 1): a ``tcgen05.mma`` whose
  accumulator spans several instruction tiles (M = 256 as two M = 128 tiles, N > 256 in chunks of
  256 — the lifted JAX restriction of seed 001) is issued as one instruction per tile; each
  tile's :class:`~sparsile.target.descriptors.InstrDesc` must have no
  :func:`~sparsile.target.descriptors.idesc_problems` (SP050x codes), with the selector each K
  step uses (16-bit/tf32: alternating column 0/1; 8-bit: 0; docs/hardware.md §11);
* **TMEM capacity** (§1.4, §2): every region is placed in one allocation of a power of two
  between 32 and the target's 512 columns (``SP0575``) — not one allocation per buffer as JAX
  does (docs/hardware.md §11);
* **lane access** (§2 "Lane access"): warp ``w`` reaches TMEM lanes ``32(w%4)..+31`` only, so
  ``tcgen05.ld``/``st`` of a 128-lane tile needs the partition to be whole warpgroups
  (``SP0550``, the code the lowering's guard uses).
"""

from __future__ import annotations

from collections.abc import Iterator

from ...target.idesc import InstrDesc, idesc_problems
from ...target.targets import Feature, feature_problem
from ..diagnostics import Diagnostic
from ..ir import types as T
from ..ir.core import Function, Operation
from .core import SP_TMEM_CAPACITY, SP_TMEM_LANES, Context, function_rule, require_feature, rule

TMEM_LANES = 128
MIN_ALLOC_COLUMNS = 32
M_TILE = 128
N_TILE = 256

require_feature("TCGEN05", "`{op}` (tcgen05 / tensor memory)", "tcgen05.", "tmem.")

PTX_DTYPE = {"f32": "tf32", "i8": "s8"}
D_DTYPE = {"i32": "s32"}
SELECTORS = {"f16": (0, 1), "tf32": (0, 1)}
"""Selectors the K steps of a sparse MMA use (docs/hardware.md §11: 16-bit and tf32 read one
column of a pair per instruction; 8-bit kinds read two columns with selector 0)."""


def allocation_columns(end: int) -> int:
    """The power-of-two ``tcgen05.alloc`` size (>= 32 columns) covering columns [0, end)."""
    n = MIN_ALLOC_COLUMNS
    while n < end:
        n *= 2
    return n


@function_rule(needs=("TCGEN05",))
def tmem_capacity(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    allocs = [op for op in func.walk() if op.name == "tmem.alloc"]
    if not allocs:
        return
    have = ctx.target.resources.tmem_columns
    ends = [(op.attrs.get("col", 0) + op.attrs.get("ncols", 0), op) for op in allocs]
    end, last = max(ends, key=lambda e: e[0])
    need = allocation_columns(end)
    if need > have:
        yield Diagnostic(SP_TMEM_CAPACITY, f"the kernel's TMEM regions end at column {end} (one allocation of "
                         f"{need} columns); a CTA of {ctx.target.name} has {have}", last.span,
                         help="use fewer accumulator stages or a narrower N tile")


TRANSFERS = ("tmem.load", "tmem.load_chunks", "tmem.store")


@rule(*TRANSFERS, needs=("TCGEN05",))
def tmem_lane_access(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """``tcgen05.ld``/``st`` of a 128-lane tile: warp ``w`` reaches lanes ``32(w%4)..+31``, so the
    partition's warps must be whole warpgroups, and start at a warpgroup boundary so that its warp
    ``i`` has quarter ``i % 4`` (the addressing ``backend/lower_blackwell`` emits)."""
    kind = "tcgen05.st" if op.name == "tmem.store" else "tcgen05.ld"
    plural = "s" if ctx.num_warps != 1 else ""
    if ctx.num_warps % 4:
        yield Diagnostic(SP_TMEM_LANES, f"{kind} of a {TMEM_LANES}-lane TMEM tile by {ctx.num_warps} warp{plural} "
                         f"starting at warp {ctx.first_warp}: warp w reaches lanes 32(w%4)..32(w%4)+31 only, so it "
                         "needs whole warpgroups", op.span,
                         help="run TMEM loads and stores on a partition of 4, 8, ... warps")
    elif ctx.first_warp % 4:
        yield Diagnostic(SP_TMEM_LANES, f"{kind} by a partition of {ctx.num_warps} warps starting at warp "
                         f"{ctx.first_warp}: its warps do not line up with the TMEM lane quarters (warp w reaches "
                         "lanes 32(w%4)..+31)", op.span,
                         help="list this partition first in warp_specialize, or make the partitions before it "
                              "a multiple of 4 warps")


def instruction_tiles(m: int, n: int) -> list[tuple[int, int, int, int]]:
    """(m0, m_size, n0, n_size) of the instructions an ``m x n`` accumulator is split into."""
    out = []
    for m0 in range(0, m, M_TILE):
        n0 = 0
        while n0 < n:
            size = min(N_TILE, n - n0)
            out.append((m0, min(M_TILE, m - m0), n0, size))
            n0 += size
    return out


@rule("tcgen05.mma", needs=("TCGEN05",))
def tcgen05_descriptors(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """The descriptor of every instruction the MMA is split into, and the target's kinds."""

    kind = op.attrs.get("kind")
    if kind is None:
        return
    a, b, acc = op.operand("a"), op.operand("b"), op.operand("d")
    ea = a.type.elem if isinstance(a.type, T.SmemType | T.TmemType) else None
    eb = b.type.elem if isinstance(b.type, T.SmemType) else None
    ed = acc.type.elem if isinstance(acc.type, T.TmemType) else None
    if ea is None or eb is None or ed is None:
        return
    if kind == "i8":
        d = feature_problem(ctx.target, Feature.TCGEN05_I8, op.span, what="`tcgen05.mma` with kind::i8")
        if d is not None:
            yield d
    sparse = bool(op.attrs.get("sparse"))
    selectors = SELECTORS.get(kind, (0,)) if sparse else (0,)
    seen: set[tuple[int, int, int]] = set()
    for _m0, m_size, _n0, n_size in instruction_tiles(op.attrs.get("m", M_TILE), op.attrs.get("n", N_TILE)):
        for sel in selectors:
            if (m_size, n_size, sel) in seen:
                continue
            seen.add((m_size, n_size, sel))
            if op.attrs.get("block_scale"):  # checked as the block-scaled kind the instruction is (UE8M0, 1X)
                descs = [InstrDesc("mxf8f6f4", PTX_DTYPE.get(ea.name, ea.name), PTX_DTYPE.get(eb.name, eb.name),
                                   D_DTYPE.get(ed.name, ed.name), m_size, n_size, sparse=sparse, selector=sel,
                                   scale_dtype="ue8m0", block_size=32, a_scale_id=i, b_scale_id=i)
                         for i in range(4)]
            else:
                descs = [InstrDesc(kind, PTX_DTYPE.get(ea.name, ea.name), PTX_DTYPE.get(eb.name, eb.name),
                                   D_DTYPE.get(ed.name, ed.name), m_size, n_size, sparse=sparse, selector=sel)]
            problems = [p for desc in descs for p in idesc_problems(desc)]
            for p in problems:
                yield Diagnostic(p.code, f"{p.message} (instruction tile M={m_size}, N={n_size}"
                                 f"{', selector ' + str(sel) if sparse else ''})", op.span, help=p.help)
            if problems:
                return
