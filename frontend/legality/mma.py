"""Legality rules of warpgroup MMA (``hopper.wgmma``, sm_90a): the hardware's shapes and types
(docs/hardware.md §4.1 through ``backend/descriptors.wgmma_problems``), the shared-memory operand
tiling the descriptors need (§4.3: swizzled, K-major, one instruction's K within a swizzle row),
the accumulator split over the warpgroups of the partition, and what sparsile's lowering does not
implement yet (MN-major B, f16 accumulators) — all decided here, at the user's line, instead of
during emission (JAX raises these from its lowering; docs/diagnostics.md, "JAX Mosaic GPU's conditions").
"""

from __future__ import annotations

from collections.abc import Iterator

from ...target.wgmma_rules import wgmma_problems
from ..diagnostics import Diagnostic, Label
from ..ir import types as T
from ..ir.core import Operation
from .core import (
    SP_WGMMA_F16_ACC,
    SP_WGMMA_MN_MAJOR,
    SP_WGMMA_SHAPE,
    SP_WGMMA_TILING,
    SP_WGMMA_UNSWIZZLED,
    Context,
    require_feature,
    rule,
)

DENSE_K = {"f16": 16, "bf16": 16, "tf32": 8, "f32": 8, "e4m3": 32, "e5m2": 32, "i8": 32, "u8": 32}
"""K of one dense ``wgmma`` per operand type (PTX ISA 9.7.15.5; sparse: twice)."""
OPERAND_NAMES = {"f32": "tf32", "i8": "s8"}
ACC_NAMES = {"i32": "s32"}
"""Language type names -> the names of ``backend/descriptors`` (operands, accumulators)."""

require_feature("WGMMA", "`{op}` (warpgroup MMA, wgmma)", "hopper.wgmma", "hopper.wgmma_wait")


def _ptx(name: str) -> str:
    return OPERAND_NAMES.get(name, name)


def instr_k(elem: str, sparse: bool) -> int:
    """Logical K of one wgmma instruction for ``elem`` operands."""
    return DENSE_K[elem] * (2 if sparse else 1)


def wgmma_split(m: int, n: int, warps: int) -> tuple[int, int] | str:
    """(warpgroups G, instructions per warpgroup along M R) for an ``m x n`` accumulator over
    ``warps`` warps, or why it does not split (the lowering's ``acc_layout`` condition)."""
    if warps % 4:
        return f"the partition has {warps} warps, not whole warpgroups (wgmma runs on groups of 4 warps)"
    g = warps // 4
    if g & (g - 1):
        return f"the partition has {g} warpgroups; the accumulator layout needs a power of two"
    if m % (64 * g):
        return f"M = {m} is not a multiple of 64 x {g} warpgroup{'s' if g > 1 else ''} = {64 * g}"
    r = m // (64 * g)
    if r & (r - 1):
        return f"M = {m} gives {r} m64 instructions per warpgroup; that must be a power of two"
    if n % 8 or (n > 256 and n % 256):
        return f"N = {n} must be a multiple of 8 up to 256, or a multiple of 256"
    return g, r


@rule("hopper.wgmma", needs=("WGMMA",))
def wgmma_operands(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """Shared-memory operands: swizzled, K-major, each instruction's K bytes within a swizzle row
    (docs/hardware.md §4.3; JAX's "B tiling too small", row 21 of docs/diagnostics.md)."""
    a, b = op.operand("a"), op.operand("b")
    sparse = bool(op.attrs.get("sparse"))
    ta, tb = a.type, b.type
    assert isinstance(tb, T.SmemType)
    a_elem = _a_elem(op)
    elem = a_elem.name
    if elem not in DENSE_K:
        return  # sema reported the operand type
    ik = instr_k(elem, sparse)
    eb = max(1, a_elem.bits // 8)
    smem_operands = [("B", b, tb, ik)]
    if isinstance(ta, T.SmemType):  # a register A (PTX ISA 9.7.15.5.1.1) has no tiling to check
        smem_operands.insert(0, ("A", a, ta, ik // 2 if sparse else ik))
    for what, v, t, k_elems in smem_operands:
        if not t.swizzle:
            yield Diagnostic(SP_WGMMA_UNSWIZZLED, f"{what} of wgmma is in an unswizzled buffer {t}", op.span,
                             help=f"allocate {what} with `swizzle=` 32, 64 or 128 (the row width in bytes, "
                                  "up to 128)", labels=_decl(v, f"{what} allocated here"))
            continue
        need = k_elems * eb
        if need > t.swizzle:
            kind = "sparse " if sparse else ""
            yield Diagnostic(SP_WGMMA_TILING, f"{what}'s swizzle rows are {t.swizzle} bytes but one {kind}wgmma "
                             f"reads {need} bytes of K ({k_elems} x {a_elem}) per row", op.span,
                             help=f"allocate {what} with swizzle={min(128, max(need, 32))} (the K extent of one "
                                  "instruction must fit in a swizzle row)", labels=_decl(v, f"{what} allocated here"))
    if not op.attrs.get("b_kmajor", True):
        yield Diagnostic(SP_WGMMA_MN_MAJOR, "an MN-major B (b_kmajor=False) is legal for 16-bit types but "
                         "sparsile's wgmma lowering does not implement it yet", op.span,
                         help="store B as N x K (K-major) and pass b_kmajor=True")


@rule("hopper.wgmma", needs=("WGMMA",))
def wgmma_accumulator(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """The accumulator splits into ``m64nN`` instructions per warpgroup of the partition, N per
    instruction obeys §4.1, and the types form a wgmma (``descriptors.wgmma_problems``)."""

    m, n = op.attrs["m"], op.attrs["n"]
    sparse = bool(op.attrs.get("sparse"))
    acc_elem = T.element_type(op.result.type)
    assert isinstance(acc_elem, T.ScalarType)
    if acc_elem.name == "f16":
        yield Diagnostic(SP_WGMMA_F16_ACC, "an f16 wgmma accumulator is legal PTX but sparsile's wgmma lowering "
                         "does not implement it yet", op.span,
                         help="accumulate in f32 (`zeros((M, N), f32)`) and convert the result with `.to(f16)`")
    split = wgmma_split(m, n, ctx.num_warps)
    if isinstance(split, str):
        yield Diagnostic(SP_WGMMA_SHAPE, f"a {m}x{n} wgmma accumulator does not fit this partition: {split}",
                         op.span, help="wgmma gives each warpgroup m64 row blocks: use M = 64 x warpgroups x "
                                       "a power of two, and partitions of 4, 8, ... warps")
    tb = op.operand("b").type
    assert isinstance(tb, T.SmemType)
    n_instr = 256 if n > 256 else n
    for p in wgmma_problems(_ptx(_a_elem(op).name), _ptx(tb.elem.name), ACC_NAMES.get(acc_elem.name, acc_elem.name),
                                n_instr, sparse=sparse):
        if p.code == "SP0531" and acc_elem.name == "f16":
            continue
        yield Diagnostic(p.code, p.message, op.span, help=p.help)


SP_WGMMA_REG_A_WAIT = "SP0396"
"""A register-A wgmma whose group is not retired by ``wgmma_wait(0)`` in the same block."""


@rule("hopper.wgmma", needs=("WGMMA",))
def wgmma_register_a_waited(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """The registers of A of a register-A wgmma must stay unmodified until a ``wgmma.wait_group``
    retires it (PTX ISA 9.7.15.5.2). sparsile keeps them live up to that wait, so it must be a
    ``hopper.wgmma_wait(0, ...)`` in the same block, reached from this wgmma's result directly or
    through the accumulators of further wgmmas of that block (``acc = hopper.wgmma(a, b, acc)``
    repeated, then one wait)."""
    if not op.attrs.get("a_regs") or op.block is None:
        return
    ops = op.block.ops
    cur = op.result
    for later in ops[ops.index(op) + 1:]:
        if cur not in later.operands:
            if any(cur in inner.operands for inner in later.walk()):
                break  # used inside a nested region before any wait
            continue
        if later.name == "hopper.wgmma" and later.operand("acc") is cur:
            cur = later.result
            continue
        if later.name == "hopper.wgmma_wait" and later.attrs.get("pending") == 0:
            return
        break
    yield Diagnostic(SP_WGMMA_REG_A_WAIT, "this wgmma reads A from registers but its result is not passed to "
                     "`hopper.wgmma_wait(0, ...)` in the same block before any other use", op.span,
                     help="write `acc = hopper.wgmma_wait(0, hopper.wgmma(a, b, acc))` (or further wgmmas on the "
                          "accumulator, then the wait) in one block: A's registers must stay unchanged until the "
                          "wait, and the compiler keeps them live up to it",
                     notes=("PTX ISA 9.7.15.5.2: the registers of A must not be modified before the "
                            "wgmma.wait_group that retires the MMA",))


def _a_elem(op: Operation) -> T.ScalarType:
    """The element type of wgmma's A, from shared memory or from registers."""
    ta = op.operand("a").type
    elem = ta.elem if isinstance(ta, T.SmemType) else T.element_type(ta)
    assert isinstance(elem, T.ScalarType)
    return elem


def _decl(v: object, text: str) -> tuple[Label, ...]:
    owner = getattr(v, "owner", None)
    while owner is not None and owner.name in ("smem.index", "smem.slice"):
        owner = owner.operand("buf").owner
    if owner is None or owner.span.line <= 0:
        return ()
    return (Label(owner.span, text),)
