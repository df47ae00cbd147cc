"""The builtins of the fifth-generation tensor core (namespace ``tcgen05``), the typing rules of the
``tcgen05.*`` ops of ``blackwell.py`` (whose docstring gives their semantics): ``tcgen05.mma[.sp]``
with its operand, shape, swizzle and instruction-descriptor checks (``docs/hardware.md`` §1.1-1.4,
§4.3, §11; PTX ISA 9.7.16.10), the block-scaled form (PTX ISA 9.7.16.10.7), CTA pairs
(``cta_group=2``), ``tcgen05.cp`` of metadata and scale atoms, ``tcgen05.commit`` and the fences.
Codes SP0544-SP0559.
"""

from __future__ import annotations

from typing import Any

from ..ir import types as T
from ..ir.core import Value
from ..sema.builtins import builtin
from ..sema.emitter import Emitter
from ..sema.values import Arg, Const
from .blackwell_operands import A_TYPES, CLASS_DTYPE, D_DTYPE, META_BITS, MMA_KIND, PTX_DTYPE, WORD_K, instr_k, split_n
from .tmem import tmem_arg


def _smem2d(em: Emitter, arg: Arg, what: str) -> tuple[Value, T.SmemType]:
    v = em.value(arg)
    if not isinstance(v.type, T.SmemType) or len(v.type.shape) != 2:
        em.error("SP0544", f"{what} of tcgen05.mma must be a 2-D shared-memory buffer, found {v.type}", arg.span,
                 help="allocate it with `smem.alloc(dtype, (rows, cols), swizzle=128)` and pick a stage with `buf[s]`")
    return v, v.type


def _check_swizzle(em: Emitter, t: T.SmemType, bytes_per_instr: int, span: Any, what: str) -> None:
    """K-major canonical layouts (PTX ISA 9.7.16.3.3): every instruction's K bytes must lie in one
    swizzle atom row (docs/hardware.md §4.3; JAX's "B tiling too small")."""
    if not t.swizzle:
        em.error("SP0547", f"{what} of tcgen05.mma must be swizzled (32, 64 or 128 bytes), found {t}", span,
                 help="allocate it with swizzle=128 (or the row width in bytes)")
    if t.swizzle < bytes_per_instr:
        em.error("SP0547", f"{what} tiling too small: one instruction reads {bytes_per_instr} bytes of K per row but "
                 f"the {t.swizzle}-byte swizzle atom is narrower", span,
                 help=f"use swizzle={max(64, bytes_per_instr)} or more (rows of at least {bytes_per_instr} bytes)")


def _idesc_diagnostics(em: Emitter, kind: str, ea: T.ScalarType, eb: T.ScalarType, eacc: T.ScalarType, n: int,
                       sparse: bool, span: Any, cta_group: int = 1) -> None:
    from ...target.idesc import InstrDesc, idesc_problems

    scaled = kind == "mxf8f6f4"
    for start, size in split_n(n):
        d = InstrDesc(kind, PTX_DTYPE[ea.name], PTX_DTYPE[eb.name], D_DTYPE[eacc.name], 128 * cta_group, size,
                      sparse=sparse, cta_group=cta_group, scale_dtype="ue8m0" if scaled else None,
                      block_size=32 if scaled else None)
        problems = idesc_problems(d)
        if problems:
            p = problems[0]
            where = f" (instruction N tile [{start}, {start + size}))" if n > 256 else ""
            em.error(p.code, p.message + where, span, help=p.help)


@builtin("mma", ns="tcgen05")
def mma(em: Emitter, a: Arg, b: Arg, acc: Arg, a_meta: Arg | None = None, accumulate: Arg | None = None,
        b_kmajor: Arg | None = None, cta_group: Arg | None = None, a_scale: Arg | None = None,
        b_scale: Arg | None = None) -> None:
    """``acc = A @ B^T (+ acc if accumulate)`` on the tensor cores, asynchronously (sparse A when
    ``a_meta`` is given; block-scaled, ``(A·SA) @ (B·SB)^T``, when ``a_scale`` / ``b_scale`` are);
    one call may span several instruction tiles."""
    va, vb, vacc = em.value(a), em.value(b), em.value(acc)
    group = _cta_group(em, cta_group, "tcgen05.mma")
    kmajor = True if b_kmajor is None else bool(em.constexpr(b_kmajor, "b_kmajor", (bool, int)))
    if not kmajor:
        em.error("SP0545", "an MN-major B is not supported by sparsile's tcgen05 lowering yet", b_kmajor.span,  # type: ignore[union-attr]
                 help="store B as N x K (K-major)")
    sparse = a_meta is not None and not (isinstance(a_meta.value, Const) and a_meta.value.value is None)
    if isinstance(va.type, T.TmemType):
        _, ta = tmem_arg(em, a, kinds=("a",), what="an A operand in TMEM (kind=\"a\")")
        a_shape, ea = ta.shape, ta.elem
    else:
        _, sa = _smem2d(em, a, "A")
        a_shape, ea = sa.shape, sa.elem
    _, tb = _smem2d(em, b, "B")
    _, tacc = tmem_arg(em, acc, kinds=("acc",), what="a TMEM accumulator (kind=\"acc\")")
    m, n = tacc.shape
    scaled = any(x is not None and not (isinstance(x.value, Const) and x.value.value is None)
                 for x in (a_scale, b_scale))
    if scaled:
        _check_scaled_form(em, a, b, a_scale, b_scale, va, ea, tb.elem, group)
    if ea.name not in MMA_KIND:
        em.error("SP0544", f"tcgen05.mma does not take {ea} operands", a.span, help=f"use one of {', '.join(A_TYPES)}")
    eb = tb.elem
    if MMA_KIND.get(eb.name) != MMA_KIND[ea.name] or (MMA_KIND[ea.name] in ("f16", "tf32") and
                                                     PTX_DTYPE[eb.name] != PTX_DTYPE[ea.name]):
        em.error("SP0544", f"A is {ea} but B is {eb}: the operands must have the same type (8-bit floats may mix, "
                 "and 8-bit integers may mix signedness)", b.span)
    if a_shape[0] != m:
        em.error("SP0544", f"A has {a_shape[0]} rows but the accumulator {tacc} has {m}", a.span)
    if isinstance(va.type, T.TmemType) and (m != 128 or group == 2):
        em.error("SP0545", "an A operand in TMEM needs M = 128 and cta_group=1", a.span)
    k = a_shape[1] * (2 if sparse else 1)
    if group == 2:
        _check_pair_shapes(em, m, n, k, tb, acc, b)
    elif tb.shape != (n, k):
        why = f" for compressed A of K/2 = {a_shape[1]}" if sparse else ""
        em.error("SP0544", f"B must be N x K = {n} x {k} (K-major){why}, found {tb}", b.span)
    step = instr_k(ea, sparse)
    if k % step:
        em.error("SP0544", f"K = {k} is not a multiple of the {'sparse ' if sparse else ''}tcgen05 K step {step} "
                 f"for {ea}", a.span)
    _idesc_diagnostics(em, "mxf8f6f4" if scaled else MMA_KIND[ea.name], ea, eb, tacc.elem, n, sparse, acc.span,
                       group)
    if m % 128:
        em.error("SP0545", f"M = {m} is not supported (sparsile issues M = 128 tiles)", acc.span)
    if not isinstance(va.type, T.TmemType):
        _check_swizzle(em, va.type, step // (2 if sparse else 1) * max(1, ea.bits // 8), a.span, "A")
    _check_swizzle(em, tb, step * max(1, eb.bits // 8), b.span, "B")
    operands = [va, vb, vacc]
    if sparse:
        assert a_meta is not None
        vm, tm = tmem_arg(em, a_meta, kinds=("meta",), what="sparse metadata in TMEM (kind=\"meta\")")
        want_bits = META_BITS[ea.name]
        if tm.meta_bits != want_bits:
            em.error("SP0546", f"the metadata was allocated for {CLASS_DTYPE[tm.meta_bits]}-class operands but A is "
                     f"{ea}: its layout differs", a_meta.span,
                     help=f"allocate it with meta_dtype={ea} and encode it for {ea}")
        words = k // WORD_K[want_bits]
        if tm.shape[0] != m or tm.shape[1] < words:
            em.error("SP0544", f"metadata for {m}x{k} {ea} A needs {m} rows and {words} word columns, found {tm}",
                     a_meta.span)
        operands.append(vm)
    if scaled:
        assert a_scale is not None and b_scale is not None
        steps = k // step
        operands += [_scale_operand(em, a_scale, "A", m, steps, step), _scale_operand(em, b_scale, "B", n, steps, step)]
    en = Const(True) if accumulate is None else em.unwrap(accumulate)
    if isinstance(en, Const):
        if not isinstance(en.value, bool | int):
            em.error("SP0551", f"`accumulate` must be a bool, found {en.value!r}",
                     accumulate.span if accumulate else em.span)
        ven = em.constant(bool(en.value), T.bool_)
    else:
        assert accumulate is not None
        ven = em.value(accumulate)
        if not isinstance(ven.type, T.ScalarType):
            em.error("SP0551", f"`accumulate` is one flag for the whole MMA, found {ven.type}", accumulate.span)
        ven = em.cast(ven, T.bool_)
    operands.append(ven)
    em.create("tcgen05.mma", operands, [], {"sparse": sparse, "kind": MMA_KIND[ea.name], "m": m, "n": n, "k": k,
                                            "a_tmem": isinstance(va.type, T.TmemType), "cta_group": group,
                                            "block_scale": scaled})
    return None


SCALED_TYPES = ("e4m3", "e5m2")
"""Operand types of the block-scaled kind::mxf8f6f4 sparsile can express (the kind also takes e2m3,
e3m2 and e2m1, which the language has no types for)."""


def _check_scaled_form(em: Emitter, a: Arg, b: Arg, a_scale: Arg | None, b_scale: Arg | None, va: Value,
                       ea: T.ScalarType, eb: T.ScalarType, group: int) -> None:
    """What sparsile supports of block-scaled MMAs (PTX ISA 9.7.16.10.7; docs/hardware.md §1.1-1.3):
    kind::mxf8f6f4 with ``scale_vec::1X`` (UE8M0, one scale per instruction K), both scales given,
    A and B in shared memory, cta_group::1, e4m3 / e5m2 operands."""
    missing = "a_scale" if a_scale is None else ("b_scale" if b_scale is None else None)
    if missing is not None:
        em.error("SP0559", f"a block-scaled tcgen05.mma needs both a_scale= and b_scale=; {missing}= is missing",
                 em.span, help="pass one kind=\"scale\" TMEM ref for each operand (a scale of 1.0 is byte 127)")
    for what, arg, e in (("A", a, ea), ("B", b, eb)):
        if e.name not in SCALED_TYPES:
            em.error("SP0559", f"block-scaled tcgen05.mma (kind::mxf8f6f4) takes e4m3 or e5m2 operands, but {what} is "
                     f"{e}", arg.span, help="quantize the operand with `stdlib.blockscale.quantize_mx`")
    if isinstance(va.type, T.TmemType):
        em.error("SP0559", "a block-scaled tcgen05.mma reads A from shared memory in sparsile (A in TMEM is not "
                 "lowered for kind::mxf8f6f4)", a.span)
    if group != 1:
        em.error("SP0559", "block-scaled tcgen05.mma with cta_group=2 is not supported by sparsile (its scale "
                 "layout over a CTA pair is not derived)", em.span, help="use cta_group=1 (M = 128 per instruction)")


def _scale_operand(em: Emitter, arg: Arg, what: str, rows: int, steps: int, step: int) -> Value:
    """A ``kind="scale"`` view wide enough for ``steps`` instructions over ``rows`` rows of the operand
    (``tmem_scales.scale_columns_needed``)."""
    from .tmem_scales import scale_columns_needed

    v, t = tmem_arg(em, arg, kinds=("scale",), what=f"the {what} scale factors in TMEM (kind=\"scale\")")
    need = scale_columns_needed(rows, steps)
    if t.shape[0] != 128 or t.shape[1] < need:
        em.error("SP0559", f"{what} scales for {rows} rows and {steps} instruction(s) of K {step} need a "
                 f"(128, >= {need}) scale view (4 columns per 128 rows and 4 K blocks), found {t}", arg.span,
                 help="copy one 512-byte scale atom per 128 rows and 4 instructions into it with tcgen05.copy")
    return v


def _cta_group(em: Emitter, arg: Arg | None, what: str) -> int:
    """The ``cta_group=`` of a tcgen05 op: 1, or 2 (a CTA pair of a cluster of even size)."""
    group = 1 if arg is None else em.constexpr(arg, "cta_group")
    span = arg.span if arg is not None else em.span
    if group not in (1, 2):
        em.error("SP0545", f"cta_group must be 1 or 2, found {group}", span)
    if group == 2:
        from .cluster import cluster_size, require_cluster

        shape = require_cluster(em, f"`{what}(..., cta_group=2)`", span)
        if cluster_size(shape) % 2:
            em.error("SP0557", f"cta_group=2 runs on CTA pairs (ranks differing in bit 0), but the cluster {shape} "
                     f"has an odd number of CTAs ({cluster_size(shape)})", span,
                     help="declare a cluster of an even size, e.g. cluster=(2, 1, 1)")
    return group


def _check_pair_shapes(em: Emitter, m: int, n: int, k: int, tb: T.SmemType, acc: Arg, b: Arg) -> None:
    """cta_group=2 (docs/hardware.md §1.2, PTX ISA 9.7.16.10.5.1 Layout A): M = 256 over the pair,
    each CTA holding 128 accumulator and A rows and half of B's N rows (the even CTA the first
    half); one instruction's N (sparsile does not split a 2-CTA MMA over N tiles)."""
    if m != 128:
        em.error("SP0555", f"with cta_group=2 each CTA holds 128 accumulator rows (M = 256 over the CTA pair), "
                 f"found {m}", acc.span, help="allocate `tmem.alloc(dtype, (128, N))` in each CTA")
    if n > 256 or n % 2:
        em.error("SP0555", f"a cta_group=2 MMA is one instruction of N <= 256 (even), found N = {n}", acc.span,
                 help="issue one MMA per 256-column slice of the accumulator")
    if tb.shape != (n // 2, k):
        em.error("SP0555", f"with cta_group=2 each CTA holds half of B: N/2 x K = {n // 2} x {k} (K-major), "
                 f"found {tb}", b.span, help="the even CTA of the pair holds B rows [0, N/2), the odd one [N/2, N)")


@builtin("copy", ns="tcgen05")
def copy(em: Emitter, src: Arg, dst: Arg, cta_group: Arg | None = None) -> None:
    """``tcgen05.cp.128x128b``: 2 KB metadata atoms ``(128, 4)`` u32 (or ``(n, 128, 4)``) from shared
    memory to the columns of a metadata ref (atom ``i`` to columns ``4i..4i+3``); with
    ``cta_group=2`` the even CTA of the pair copies in both CTAs (each from its own shared memory).
    Into a ``kind="scale"`` ref: ``tcgen05.cp.32x128b.warpx4`` of 512-byte scale atoms ``(32, 4)``
    u32 (or ``(32n, 4)``, ``(n, 32, 4)``), each duplicated into the four TMEM lane quarters."""
    group = _cta_group(em, cta_group, "tcgen05.copy")
    vs = em.value(src)
    ts = vs.type
    vd0 = em.value(dst)
    if isinstance(vd0.type, T.TmemType) and vd0.type.kind == "scale":
        _copy_scales(em, src, dst, vs, group)
        return None
    if not isinstance(ts, T.SmemType) or ts.elem != T.u32 or ts.shape[-2:] != (128, 4) or len(ts.shape) > 3 \
            or ts.swizzle:
        em.error("SP0548", f"tcgen05.copy copies 2 KB atoms: a shared buffer of (128, 4) or (n, 128, 4) u32 without "
                 f"swizzle, found {ts}", src.span, help="allocate `smem.alloc(u32, (128, 4))` and fill it by TMA from "
                 "metadata in the \"tcgen05\" format")
    vd, td = tmem_arg(em, dst, kinds=("meta",), what="a TMEM metadata reference")
    atoms = ts.shape[0] if len(ts.shape) == 3 else 1
    if td.shape != (128, 4 * atoms):
        em.error("SP0548", f"{atoms} atom(s) fill a (128, {4 * atoms}) metadata view, found {td}", dst.span)
    em.create("tcgen05.copy", [vs, vd], [], {"atoms": atoms, "cta_group": group})
    return None


def _copy_scales(em: Emitter, src: Arg, dst: Arg, vs: Value, group: int) -> None:
    """``tcgen05.cp.32x128b.warpx4`` per 512-byte scale atom (``tmem_scales.py``): a shared buffer of
    ``(32n, 4)`` or ``(n, 32, 4)`` u32 words into the ``4n`` columns of a scale ref."""
    from .tmem_scales import SCALE_ATOM_COLUMNS, SCALE_ATOM_LINES

    ts = vs.type
    ok = isinstance(ts, T.SmemType) and ts.elem == T.u32 and not ts.swizzle and (
        (len(ts.shape) == 2 and ts.shape[1] == 4 and ts.shape[0] % SCALE_ATOM_LINES == 0)
        or (len(ts.shape) == 3 and ts.shape[1:] == (SCALE_ATOM_LINES, 4)))
    if not ok:
        em.error("SP0548", f"tcgen05.copy of scale factors copies 512-byte atoms: a shared buffer of (32·n, 4) or "
                 f"(n, 32, 4) u32 without swizzle, found {ts}", src.span,
                 help="allocate `smem.alloc(u32, (32, 4))` per 128 rows and fill it by TMA from scales encoded by "
                      "`stdlib.blockscale.encode_scales`")
    if group != 1:
        em.error("SP0559", "block scale factors are copied with cta_group=1 only (sparsile has no block-scaled "
                 "CTA-pair MMA)", em.span)
    vd, td = tmem_arg(em, dst, kinds=("scale",), what="a TMEM scale reference")
    atoms = ts.shape[0] if len(ts.shape) == 3 else ts.shape[0] // SCALE_ATOM_LINES
    if td.shape != (128, SCALE_ATOM_COLUMNS * atoms):
        em.error("SP0548", f"{atoms} scale atom(s) fill a (128, {SCALE_ATOM_COLUMNS * atoms}) scale view, found {td}",
                 dst.span)
    em.create("tcgen05.copy", [vs, vd], [], {"atoms": atoms, "cta_group": 1, "scale": True})


@builtin("commit", ns="tcgen05")
def commit(em: Emitter, bar: Arg, cta_group: Arg | None = None, multicast: Arg | None = None) -> None:
    """Arrive once on ``bar`` when every tcgen05 operation issued so far by the issuing thread is
    done; ``multicast`` (a mask of cluster ranks): on the barrier at ``bar``'s offset in each of
    those CTAs instead."""
    group = _cta_group(em, cta_group, "tcgen05.commit")
    v = em.value(bar)
    if not isinstance(v.type, T.BarrierType) or v.type.count != 1:
        em.error("SP0549", f"tcgen05.commit arrives on one mbarrier, found {v.type}", bar.span,
                 help="pick one with `bars[i]`")
    operands = [v]
    if multicast is not None:
        from .cluster import cluster_size, require_cluster

        size = cluster_size(require_cluster(em, "`tcgen05.commit(..., multicast=)`", multicast.span))
        m = em.unwrap(multicast)
        if isinstance(m, Const) and isinstance(m.value, int) and not 0 < m.value < (1 << size):
            em.error("SP0554", f"the multicast mask {m.value:#x} must name CTAs of the {size}-CTA cluster "
                     f"(a non-zero mask below {1 << size:#x})", multicast.span)
        mv = em.value(multicast, like=T.i32)
        if not (isinstance(mv.type, T.ScalarType) and mv.type.is_int):
            em.error("SP0554", f"the multicast mask must be an integer scalar, found {mv.type}", multicast.span)
        operands.append(em.cast(mv, T.i32))
    em.create("tcgen05.commit", operands, [], {"cta_group": group, "multicast": multicast is not None})
    return None


@builtin("fence_before", ns="tcgen05")
def fence_before(em: Emitter) -> None:
    """``tcgen05.fence::before_thread_sync``: before an arrive/barrier that publishes TMEM work."""
    em.create("tcgen05.fence_before", [], [])
    return None


@builtin("fence_after", ns="tcgen05")
def fence_after(em: Emitter) -> None:
    """``tcgen05.fence::after_thread_sync``: after a wait, before ``tcgen05.ld`` / ``mma``."""
    em.create("tcgen05.fence_after", [], [])
    return None
