"""Legality rules of the explicit memory ops (``ops_memory.py``) and of the kernel's resources.

Shared memory (PTX ISA 5.5.7 swizzles, docs/hardware.md §5.3), TMA boxes (docs/hardware.md §5.4:
at most 256 elements per dimension, an inner extent of a multiple of 16 bytes and at most the
swizzle span), mbarriers (§5.2), warp specialization (``setmaxnreg`` acts per warpgroup, PTX ISA
9.7.17.1), the CTA's thread, register and shared-memory budgets (``SMResources`` of the target).

The shared-memory estimate is a *lower bound* of what code generation reserves: explicit
buffers (1024-byte aligned), barriers, and the scratch the backend certainly needs (layout
conversions that move data between threads, cross-warp reductions, tile-level MMA operand
staging). A kernel over the target's opt-in limit fails here, at compile time, instead of at
``cuFuncSetAttribute``.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...target.targets import Feature, feature_problem
from ..diagnostics import Diagnostic
from ..ir import types as T
from ..ir.core import OPERAND_NAMES, Function, Operation, Value
from ..layout.tile import WARP, register_coords, same_thread_part, thread_bases
from .core import (
    SP_ARRIVE_PER_WARPGROUP,
    SP_MBARRIER_IN_PARTITION,
    SP_REGISTERS,
    SP_SMEM_CAPACITY,
    SP_SMEM_SLICE_LAST_DIM,
    SP_SMEM_STRIDED_VIEW,
    SP_SMEM_SWIZZLE_ROWS,
    SP_THREADS,
    SP_TMA_BOX,
    SP_WS_NESTED,
    SP_WS_WARPGROUPS,
    SP_WS_WARPS,
    Context,
    function_rule,
    require_feature,
    rule,
)

SMEM_BUFFER_ALIGN = 1024
"""Every explicit buffer starts on a 128B-swizzle atom boundary (backend/lower/asynchronous.py)."""
TMA_MAX_BOX = 256
TMA_INNER_ALIGN = 16

require_feature("TMA", "`{op}` (TMA)", "tma.load", "tma.store", "tma.store_wait", "tma.load_cluster")
require_feature("MBARRIER", "`{op}`", "mbarrier.alloc", "mbarrier.arrive")
require_feature("MBARRIER_TX", "`{op}` (transaction counts / try_wait)", "mbarrier.expect", "mbarrier.wait")
require_feature("FENCE_PROXY_ASYNC", "`fence.async_shared` (fence.proxy.async)", "fence.async_shared")


def _err(code: str, message: str, op: Operation, help: str | None = None,
         notes: tuple[str, ...] = ()) -> Diagnostic:
    return Diagnostic(code, message, op.span, help=help, notes=notes)


# ------------------------------------------------------------------------------------------------
# Shared-memory buffers
# ------------------------------------------------------------------------------------------------
@rule("smem.alloc")
def swizzled_rows_fill_atoms(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """A swizzled buffer is stored as column panels of one swizzle span; its rows must be a whole
    number of spans (PTX ISA 5.5.7: the XOR pattern repeats every span x 8 rows)."""
    t = op.result.type
    assert isinstance(t, T.SmemType)
    row_bytes = t.shape[-1] * t.elem.bits // 8
    if t.swizzle and row_bytes % t.swizzle:
        fit = row_bytes if row_bytes in (32, 64, 128) else 0
        yield _err(SP_SMEM_SWIZZLE_ROWS, f"rows of {row_bytes} bytes do not fill whole {t.swizzle}-byte swizzle "
                   f"atoms in {t}", op, help=f"use swizzle={fit}, or make the last dimension a multiple of "
                   f"{t.swizzle * 8 // t.elem.bits} elements")


@rule("smem.slice")
def no_slice_of_swizzled_rows(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """A swizzled row is permuted in 16-byte pieces across its span (PTX ISA 5.5.7), so part of it is
    no rectangular view; an unswizzled buffer may be sliced along its last dimension (a strided view,
    which generic loads and stores take, and TMA copies and MMA descriptors do not: SP0576)."""
    t = op.operand("buf").type
    assert isinstance(t, T.SmemType)
    if op.attrs["dim"] == len(t.shape) - 1 and t.swizzle:
        yield _err(SP_SMEM_SLICE_LAST_DIM, f"cannot slice {t} along its last (contiguous, swizzled) dimension",
                   op, help="slice along a leading dimension, or allocate the buffer without a swizzle if only "
                   "loads and stores read the slice")


@rule("tcgen05.mma", "tcgen05.copy", needs=("TCGEN05",))
@rule("hopper.wgmma", needs=("WGMMA",))
@rule("tma.load", "tma.store", "tma.load_cluster")
def whole_rows_for_async_units(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """TMA boxes, wgmma/tcgen05 shared-memory descriptors and tcgen05.cp read or write rows that
    are contiguous in shared memory (docs/hardware.md §5.4, PTX ISA 9.7.15.5.1): a view sliced along
    its last dimension is not."""
    names = OPERAND_NAMES[op.name](op) if op.name in OPERAND_NAMES else ()
    for name, value in zip(names, op.operands, strict=False):
        t = value.type
        if isinstance(t, T.SmemType) and t.strided:
            yield _err(SP_SMEM_STRIDED_VIEW, f"`{op.name}` needs whole rows of shared memory, but operand `{name}` is "
                       f"{t}, a slice along the last dimension", op,
                       help="slice along a leading dimension, or allocate a buffer of the narrower shape")
        elif isinstance(t, T.SmemType) and op.name.startswith("tma.") and _gapped_matrices(value):
            yield _err(SP_SMEM_STRIDED_VIEW, f"`{op.name}` writes or reads its box as consecutive matrices, but "
                       f"operand `{name}` ({t}) is a slice of a buffer's rows or of a middle dimension, whose "
                       "matrices are not consecutive in shared memory", op,
                       help="copy each matrix with its own TMA copy (index the leading dimension), or slice the "
                            "leading dimension only")


def _gapped_matrices(value: Value) -> bool:
    """Whether a view of rank 3 or more was made by slicing a dimension other than the leading one
    of a view of rank 3 or more (then its matrices are not consecutive, while a TMA box of that rank
    is written as consecutive matrices: backend/lower/tma.tma_panel_copies)."""
    t = value.type
    if not isinstance(t, T.SmemType) or len(t.shape) < 3:
        return False
    owner = value.owner
    while owner is not None and owner.name in ("smem.slice", "smem.index"):
        buf = owner.operand("buf")
        if owner.name == "smem.slice" and owner.attrs["dim"] >= 1 and len(buf.type.shape) >= 3:
            return True
        owner = buf.owner
    return False


@rule("mbarrier.alloc")
def barriers_outside_partitions(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    if ctx.in_partition:
        yield _err(SP_MBARRIER_IN_PARTITION, "mbarriers must be allocated outside warp_specialize partitions "
                   "(their initialization must be visible to every partition)", op,
                   help="allocate them in the kernel body and pass them to the partitions")


@rule("mbarrier.arrive")
def per_warpgroup_arrival(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    if op.attrs.get("per") == "warpgroup" and ctx.num_warps % 4:
        yield _err(SP_ARRIVE_PER_WARPGROUP, f"`per=\"warpgroup\"` needs whole warpgroups, but this partition has "
                   f"{ctx.num_warps} warps", op,
                   help="give the partition a multiple of 4 warps, or arrive once per partition")


# ------------------------------------------------------------------------------------------------
# Warp specialization
# ------------------------------------------------------------------------------------------------
@rule("warp_specialize")
def partitions_fit_the_cta(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    warps = tuple(op.attrs.get("warps", ()))
    regs = tuple(op.attrs.get("regs", ()))
    if ctx.in_partition:
        yield _err(SP_WS_NESTED, "warp_specialize cannot be nested inside a partition", op,
                   help="split the work into more partitions of the outer warp_specialize")
        return
    if sum(warps) != ctx.num_warps:
        yield _err(SP_WS_WARPS, f"the partitions use {' + '.join(map(str, warps))} = {sum(warps)} warps but the "
                   f"kernel has num_warps={ctx.num_warps}", op,
                   help=f"launch with num_warps={sum(warps)} or change the partitions' `warps=`")
    for i, (w, r) in enumerate(zip(warps, regs, strict=False)):
        if r is not None and w % 4:
            yield _err(SP_WS_WARPGROUPS, f"partition {i} sets a register budget (regs={r}) but has {w} warps; "
                       "setmaxnreg applies to whole warpgroups", op,
                       help=f"give it {(w + 3) // 4 * 4} warps, or drop `regs=`")
    if any(r is not None for r in regs):

        d = feature_problem(ctx.target, Feature.SETMAXNREG, op.span, what="`partition(..., regs=)` (setmaxnreg)")
        if d is not None:
            yield d
        elif all(r is not None for r in regs):
            need = sum(32 * w * r for w, r in zip(warps, regs, strict=False))
            have = ctx.target.resources.registers_per_sm
            if need > have:
                yield _err(SP_REGISTERS, f"the partitions' register budgets need {need} registers "
                           f"(sum of 32 x warps x regs) but an SM has {have}", op,
                           help="lower `regs=` of some partitions")


# ------------------------------------------------------------------------------------------------
# TMA
# ------------------------------------------------------------------------------------------------
def tma_box(t: T.SmemType) -> tuple[tuple[int, ...], int]:
    """The box (numpy order) of each TMA copy filling ``t`` and the number of copies: a swizzled
    buffer is copied in column panels of one swizzle span (backend/lower/tma.tma_boxes)."""
    eb = max(1, t.elem.bits // 8)
    cols = t.shape[-1]
    pc = (t.swizzle // eb) if t.swizzle else cols
    return (*t.shape[:-1], min(pc, cols)), max(1, cols // max(1, pc))


@rule("tma.load", "tma.store", "tma.load_cluster")
def tma_box_limits(op: Operation, ctx: Context) -> Iterator[Diagnostic]:
    """docs/hardware.md §5.4: boxDim[i] <= 256, boxDim[0] x element size a multiple of 16 bytes and,
    with a swizzle, at most the swizzle span; the tensor has at most 5 dimensions."""
    smem = op.operand("smem")
    t = smem.type
    assert isinstance(t, T.SmemType)
    box, _ = tma_box(t)
    inner_bytes = box[-1] * t.elem.bits // 8
    if len(box) > 5:
        yield _err(SP_TMA_BOX, f"a TMA box has at most 5 dimensions, {t} has {len(box)}", op)
    big = [d for d in box if d > TMA_MAX_BOX]
    if big:
        yield _err(SP_TMA_BOX, f"a TMA box dimension is at most {TMA_MAX_BOX} elements, the box of {t} is "
                   f"{box}", op, help="split the copy into several boxes (docs/hardware.md §5.4)")
    if inner_bytes % TMA_INNER_ALIGN:
        yield _err(SP_TMA_BOX, f"the inner box dimension spans {inner_bytes} bytes, not a multiple of 16", op,
                   help="widen the buffer's last dimension (docs/hardware.md §5.4)")
    if t.swizzle and inner_bytes > t.swizzle:
        yield _err(SP_TMA_BOX, f"the inner box dimension spans {inner_bytes} bytes, more than the "
                   f"{t.swizzle}-byte swizzle span", op, help="use a wider swizzle or a narrower buffer")
    start = _constant_slice_offset(smem.owner)
    if start is not None and start % 128:
        yield _err(SP_TMA_BOX, f"a TMA copy's shared-memory box must start 128-byte aligned; this view starts "
                   f"{start} bytes into its buffer", op, help="slice at a row that starts on a 128-byte boundary")


def _constant_slice_offset(owner: Operation | None) -> int | None:
    """The byte offset of an ``smem.slice`` view with a constant start, else None."""
    if owner is None or owner.name != "smem.slice":
        return None
    start = owner.operand("start").owner
    if start is None or start.name != "arith.constant":
        return None
    t = owner.operand("buf").type
    assert isinstance(t, T.SmemType)
    d = owner.attrs["dim"]
    eb = max(1, t.elem.bits // 8)
    if len(t.shape) == 1:  # elements of a 1-D buffer
        return int(start.attrs["value"]) * eb
    row_bytes = t.swizzle if t.swizzle else (t.pitch or t.shape[-1]) * eb
    if d == len(t.shape) - 2:
        stride = row_bytes
    else:
        stride = row_bytes * t.shape[-2]
        for x in t.shape[d + 1:-2]:
            stride *= x
    return int(start.attrs["value"]) * stride


# ------------------------------------------------------------------------------------------------
# Kernel resources
# ------------------------------------------------------------------------------------------------
@function_rule()
def threads_per_cta(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    limit = ctx.target.resources.max_threads_per_block
    if ctx.num_warps * 32 > limit:
        yield Diagnostic(SP_THREADS, f"num_warps={ctx.num_warps} is {ctx.num_warps * 32} threads; "
                         f"{ctx.target.name} allows {limit} per CTA", func.span,
                         help=f"use at most {limit // 32} warps")


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _storage_bytes(elem: object) -> int:
    if isinstance(elem, T.PointerType):
        return 8
    assert isinstance(elem, T.ScalarType)
    return max(1, elem.bits // 8)


def smem_footprint(func: Function) -> list[tuple[Operation, int, str]]:
    """(op, bytes, what) of every shared-memory reservation the backend certainly makes, in
    program order (a lower bound: see the module docstring)."""
    out: list[tuple[Operation, int, str]] = []
    for op in func.walk():
        n = 0
        what = ""
        if op.name == "smem.alloc":
            t = op.result.type
            assert isinstance(t, T.SmemType)
            n, what = t.nbytes, f"buffer {t}"
        elif op.name == "mbarrier.alloc":
            n, what = 8 * op.attrs["count"], f"{op.attrs['count']} mbarriers"
        elif op.name == "convert_layout":
            n, what = _conversion_scratch(op), "layout conversion through shared memory"
        elif op.name == "reduce":
            n, what = _reduce_scratch(op), "cross-warp reduction"
        elif op.name in ("dot", "sparse_dot"):
            n, what = _mma_staging(op), f"{op.name} operand staging"
        if n:
            out.append((op, n, what))
    return out


def _conversion_scratch(op: Operation) -> int:

    src, dst = op.operand("x").layout, op.result.layout
    if src is None or dst is None or src == dst:
        return 0
    if same_thread_part(src, dst):
        have = set(register_coords(src))
        if all(off in have for off in register_coords(dst)):
            return 0
    return _numel(T.shape_of(op.result.type)) * _storage_bytes(T.element_type(op.result.type))


def _reduce_scratch(op: Operation) -> int:

    layout = op.operand("x").layout
    if layout is None:
        return 0
    axis = op.attrs["axis"]
    bits = sum(1 for b in thread_bases(layout, WARP) if b[axis])
    if not bits:
        return 0
    out_shape = T.shape_of(op.result.type)
    per = _storage_bytes(T.element_type(op.result.type))
    if op.attrs["kind"] in ("argmax", "argmin"):  # the value (at least 32 bits) and the i32 index
        per = max(4, _storage_bytes(T.element_type(op.operand("x").type))) + 4
    return (1 << bits) * _numel(out_shape) * per


def _mma_staging(op: Operation) -> int:
    a = op.operand("a")
    b = op.operand("b")
    return (_numel(T.shape_of(a.type)) * _storage_bytes(T.element_type(a.type))
            + _numel(T.shape_of(b.type)) * _storage_bytes(T.element_type(b.type)))


def smem_estimate(func: Function) -> int:
    """Bytes of dynamic shared memory the kernel needs at least."""
    total = 0
    for op, n, _ in smem_footprint(func):
        align = SMEM_BUFFER_ALIGN if op.name == "smem.alloc" else (8 if op.name == "mbarrier.alloc" else 16)
        total = _align(total, align) + n
    return total


@function_rule()
def shared_memory_capacity(func: Function, ctx: Context) -> Iterator[Diagnostic]:
    limit = ctx.target.resources.max_smem_per_block_optin
    if not limit:
        return
    total = smem_estimate(func)
    if total <= limit:
        return
    parts = sorted(smem_footprint(func), key=lambda e: -e[1])
    biggest = parts[0][0] if parts else None
    listed = "; ".join(f"{what}: {n} B" for _, n, what in parts[:4])
    yield Diagnostic(SP_SMEM_CAPACITY, f"the kernel needs at least {total} bytes of shared memory; "
                     f"{ctx.target.name} allows {limit} per CTA", biggest.span if biggest else func.span,
                     help="use fewer pipeline stages or smaller tiles", notes=(f"largest: {listed}",))
