"""Hopper (sm_90a): ``wgmma.mma_async`` (dense and ``.sp``) with B from a shared-memory descriptor and
A from one or from registers, and the layouts it anchors (PTX ISA 9.7.15; docs/hardware.md §4).

A partition of ``G`` warpgroups computes an ``M x N`` accumulator with ``M = 64·G·R``: warpgroup
``g`` issues, per K step, ``R`` instructions ``m64nNk*`` for rows ``64(r·G + g)``. Accumulators
follow PTX Fig. 149 (``wgmma_accumulator``); the sparse metadata word of an instruction sits in
the thread that the hardware reads (selector 0: lanes ``4g + {0, 1}``); a register A follows the
PTX A fragment (``a_layout``), packed into four b32 registers per instruction and kept live until
the ``wgmma.wait_group`` that retires it.

Shared-memory operands must be swizzled (32/64/128 B) and K-major; descriptors (PTX 9.7.15.5.1,
docs/hardware.md §4.3) use SBO = 8 rows x swizzle span, LBO unused, and advance along K by adding
``bytes >> 4`` to the start address inside a swizzle row.
"""

from __future__ import annotations

from typing import Any

from ...frontend.diagnostics import InternalError
from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...frontend.layout.hardware_dims import operand_class
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.library import WGMMA_A_COLS, wgmma_a_fragment, wgmma_accumulator
from ...frontend.layout.tile import normalize
from ...target.hooks import TargetHooks
from ...target.targets import Feature
from .asynchronous import SmemRef, smem_base_address, stage_kmajor
from .codegen import CodeGen, DTile, lowering
from .llvm_text import LLValue, const

DENSE_K = {"f16": 16, "bf16": 16, "tf32": 8, "f32": 8, "e4m3": 32, "e5m2": 32, "i8": 32, "u8": 32}
PTX_TYPE = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2",
            "i8": "s8", "u8": "u8"}
SWIZZLE_CODE = {128: 1, 64: 2, 32: 3}


def acc_layout(m: int, n: int, warps: int) -> LinearLayout | None:
    """The wgmma accumulator layout of an ``m x n`` tile over ``warps`` warps, or None if the
    shape does not fit wgmma (M a multiple of 64 per warpgroup, N 8..256 or a multiple of 256)."""
    if warps % 4 or n % 8 or (n > 256 and n % 256):
        return None
    g = warps // 4
    if g & (g - 1) or m % (64 * g):
        return None
    r = m // (64 * g)
    if r & (r - 1):
        return None
    base = wgmma_accumulator(n, warpgroups=g).rename_outs({"m": "dim0", "n": "dim1"})
    if r > 1:
        base = base * LinearLayout.identity("reg", r, "dim0")
    return normalize(base, warps)


def meta_layout(m: int, kw: int, elem: T.ScalarType, warps: int) -> LinearLayout | None:
    """The layout of an ``m x kw`` block of metadata words fed to sparse wgmma: each thread holds
    the word of every instruction it supplies (docs/hardware.md §4.2)."""
    if warps % 4:
        return None
    g = warps // 4
    if g & (g - 1) or m % (64 * g):
        return None
    r = m // (64 * g)
    eight_bit = elem.bits == 8
    kbits = (kw.bit_length() - 1)
    m_warp = [(16, 0), (32, 0)] + [(64 << i, 0) for i in range((g).bit_length() - 1)]
    if eight_bit:
        if kw < 2:
            return None
        lane = [(8, 0), (0, 1), (1, 0), (2, 0), (4, 0)]
        reg = [(0, 1 << b) for b in range(1, kbits)]
    else:
        lane = [(8, 0), (0, 0), (1, 0), (2, 0), (4, 0)]
        reg = [(0, 1 << b) for b in range(kbits)]
    reg += [(64 * g * (1 << i), 0) for i in range(r.bit_length() - 1)]
    return LinearLayout.from_bases({"reg": reg, "lane": lane, "warp": m_warp}, [("dim0", m), ("dim1", kw)])


def a_layout(m: int, ka: int, elem: T.ScalarType, warps: int) -> LinearLayout | None:
    """The layout of an ``m x ka`` register A tile (``ka`` stored columns: ``K``, or ``K/2`` for a
    sparse A) fed to wgmma: the A fragment of one instruction (``wgmma_a_fragment``, PTX ISA
    9.7.15.5.1.1) repeated along K (register bits next) and then over the ``R`` m64 blocks of each
    warpgroup (rows ``64(r·G + g)``, as the accumulator), or None if the shape does not fit."""
    if warps % 4 or elem.name not in PTX_TYPE:
        return None
    g = warps // 4
    if g & (g - 1) or m % (64 * g):
        return None
    r = m // (64 * g)
    cols = WGMMA_A_COLS[operand_class(elem.name)]
    if r & (r - 1) or ka % cols or (ka // cols) & (ka // cols - 1):
        return None
    base = wgmma_a_fragment(elem.name, warpgroups=g).rename_outs({"m": "dim0", "k": "dim1"})
    if ka > cols:
        base = base * LinearLayout.identity("reg", ka // cols, "dim1")
    if r > 1:
        base = base * LinearLayout.identity("reg", r, "dim0")
    return normalize(base, warps)


def anchor(op: Operation, num_warps: int) -> dict[int, LinearLayout]:
    """Layouts that wgmma imposes on accumulators and metadata (the inference anchor hook)."""
    out: dict[int, LinearLayout] = {}
    if op.name in ("hopper.wgmma", "dot", "sparse_dot"):
        shape = T.shape_of(op.result.type)
        lay = acc_layout(shape[0], shape[1], num_warps)
        if lay is None:
            return out
        acc = op.operand("acc")
        out[id(op.result)] = lay
        out[id(acc)] = lay
        a_v = op.operand("a")
        if op.name == "hopper.wgmma" and isinstance(a_v.type, T.TileType):
            a_elem = T.element_type(a_v.type)
            if isinstance(a_elem, T.ScalarType):
                al = a_layout(shape[0], T.shape_of(a_v.type)[1], a_elem, num_warps)
                if al is not None:
                    out[id(a_v)] = al
        meta = None
        if (op.name == "hopper.wgmma" and op.attrs.get("sparse")) or op.name == "sparse_dot":
            meta = op.operand("a_meta")
        if meta is not None:
            at = a_v.type
            a_elem = at.elem if isinstance(at, T.SmemType) else T.element_type(at)
            ml = meta_layout(shape[0], T.shape_of(meta.type)[1], a_elem, num_warps)  # type: ignore[arg-type]
            if ml is not None:
                out[id(meta)] = ml
    return out


HOOKS = TargetHooks(anchor=anchor)


# ------------------------------------------------------------------------------------------------
def _desc(cg: CodeGen, ref: SmemRef, row: int, col: int) -> LLValue:
    """The sm90 shared-memory descriptor of the K-major operand sub-tile starting at (row, col)."""
    if not ref.swizzle:
        raise InternalError("an unswizzled wgmma operand reached the lowering (legality SP0567 decides this)")
    fb = cg.fb
    eb = ref.ebytes
    pc = ref.panel_cols
    panel, within = divmod(col, pc)
    off = panel * ref.full_rows * ref.swizzle + row * ref.swizzle + within * eb
    addr = fb.binop("add", smem_base_address(cg), fb.binop("add", ref.base, const(off, "i32")))
    lo = fb.binop("and", fb.binop("lshr", addr, const(4, "i32")), const(0x3FFF, "i32"))
    lbo = 1
    sbo = (8 * ref.swizzle) >> 4
    hi = (SWIZZLE_CODE[ref.swizzle] << 30) | sbo
    lo64 = fb.cast("zext", fb.binop("or", lo, const(lbo << 16, "i32")), "i64")
    return fb.binop("or", lo64, const(hi << 32, "i64"))


def instr_text(sparse: bool, ea: str, eb: str, eacc: str, n: int, k: int, nregs: int, a_regs: bool = False
               ) -> tuple[str, str]:
    """The wgmma asm template and its operand constraints (acc out, A descriptor or the four b32
    A registers, B descriptor, [meta], scale, acc in tied). ``ea`` and ``eb`` are the element
    types of A and B: the 8-bit kinds may mix (``.e4m3.e5m2``, ``.s8.u8``), so the instruction
    names both. The register-A form has no A transpose immediate (PTX ISA 9.7.15.5.2;
    docs/hardware.md §4.1)."""
    dt = {"f32": "f32", "f16": "f16", "i32": "s32"}[eacc]
    ta, tb = PTX_TYPE[ea], PTX_TYPE[eb]
    shape = f"m64n{n}k{k}"
    sp = ".sp" if sparse else ""
    regs = "{" + ", ".join(f"${i}" for i in range(nregs)) + "}"
    if a_regs:
        a = "{" + ", ".join(f"${nregs + i}" for i in range(4)) + "}"
        nxt = nregs + 4
    else:
        a = f"${nregs}"
        nxt = nregs + 1
    b = f"${nxt}"
    nxt += 1
    meta = ""
    if sparse:
        meta = f", ${nxt}, 0"
        nxt += 1
    scale = f"${nxt}"
    if ta in ("s8", "u8"):
        tail = ""
    elif ta in ("f16", "bf16"):
        tail = ", 1, 1, 0" if a_regs else ", 1, 1, 0, 0"
    else:
        tail = ", 1, 1"
    text = (f"{{ .reg .pred p; setp.ne.b32 p, {scale}, 0; wgmma.mma_async{sp}.sync.aligned.{shape}.{dt}.{ta}.{tb} "
            f"{regs}, {a}, {b}{meta}, p{tail}; }}")
    con = "f" if dt in ("f32",) else "r"
    a_con = ",r,r,r,r" if a_regs else ",l"
    cons = ",".join([f"={con}"] * nregs) + a_con + ",l" + (",r" if sparse else "") + ",r," + ",".join(
        str(i) for i in range(nregs))
    return text, cons


A_ELEMS_PER_REG = {"16bit": 2, "tf32": 1, "8bit": 4}
"""Elements of A per b32 register of the register-A wgmma form (PTX ISA 9.7.15.5.1.1)."""


def pack_a(cg: CodeGen, a: DTile) -> list[LLValue]:
    """The b32 registers of a register A tile in the ``a_layout`` order: element ``a_i`` of an
    instruction goes to register ``i // per`` at position ``i % per`` (low bits first)."""
    elem = a.elem
    assert isinstance(elem, T.ScalarType)
    per = A_ELEMS_PER_REG[operand_class(elem.name)]
    fb = cg.fb
    out: list[LLValue] = []
    for i in range(0, len(a.regs), per):
        chunk = a.regs[i:i + per]
        if per == 1:
            out.append(chunk[0] if chunk[0].type == "i32" else fb.cast("bitcast", chunk[0], "i32"))
            continue
        vec = LLValue("poison", f"<{per} x {chunk[0].type}>")
        for j, x in enumerate(chunk):
            vec = fb.insert_element(vec, x, j)
        out.append(fb.cast("bitcast", vec, "i32"))
    return out


@lowering("hopper.wgmma")
def lower_wgmma(cg: CodeGen, op: Operation) -> None:
    if not op.attrs["b_kmajor"]:
        raise InternalError("an MN-major wgmma B reached the lowering (legality SP0569 decides this)", op.span)
    meta = cg.tile(op.operand("a_meta")) if op.attrs["sparse"] else None
    a_v = op.operand("a")
    a = cg.tile(a_v) if isinstance(a_v.type, T.TileType) else cg.get(a_v)
    out = emit_wgmma(cg, a, cg.get(op.operand("b")), cg.tile(op.operand("acc")), meta,
                     op.attrs["m"], op.attrs["n"], op.attrs["k"], T.element_type(op.result.type), op)
    cg.set(op.result, out)


def emit_wgmma(cg: CodeGen, a_ref: SmemRef | DTile, b_ref: SmemRef, acc: DTile, meta: DTile | None, m: int, n: int,
               k: int, acc_elem: Any, op: Operation) -> DTile:
    """Issue the wgmma instructions computing ``acc + A @ B`` (sparse when ``meta`` is given) for
    the warpgroups of the current partition, and commit them as one group. ``a_ref`` is a
    shared-memory buffer (descriptor form) or a register tile in ``a_layout`` (register form:
    its packed registers stay live until the next ``wgmma_wait``, see ``emit_wgmma_wait``)."""
    sparse = meta is not None
    warps = cg.num_warps
    want = acc_layout(m, n, warps)
    if want is None or acc.layout != want:
        raise InternalError(f"a {m}x{n} wgmma accumulator over {warps} warps is not in the wgmma layout "
                            "(legality SP0571 and layout inference decide this)", op.span)
    a_elem = a_ref.elem
    assert isinstance(a_elem, T.ScalarType)
    ea = a_elem.name
    eb = b_ref.elem.name  # B's own type: e4m3 x e5m2 and i8 x u8 mix (PTX ISA 9.7.15.5.2)
    eacc = acc_elem.name
    if eacc == "f16":
        raise InternalError("an f16 wgmma accumulator reached the lowering (legality SP0570 decides this)", op.span)
    if meta is not None:
        kw = T.shape_of(op.operand("a_meta").type)[1]
        if meta.layout != meta_layout(m, kw, a_elem, warps):
            raise InternalError("wgmma metadata is not in the wgmma metadata layout", op.span)
    g = warps // 4
    r_count = m // (64 * g)
    instr_k = DENSE_K[ea] * (2 if sparse else 1)
    a_k = instr_k // 2 if sparse else instr_k  # stored A columns per instruction
    k_steps = k // instr_k
    a_packed: list[LLValue] | None = None
    if isinstance(a_ref, DTile):
        if a_ref.layout != a_layout(m, k // 2 if sparse else k, a_elem, warps):
            raise InternalError("a register wgmma A is not in the wgmma A-fragment layout (layout inference "
                                "anchors it)", op.span)
        a_packed = pack_a(cg, a_ref)  # before the fence: wgmma.fence orders register writes of A
    n_split = 256 if n > 256 else n
    nregs_instr = n_split // 2
    fb = cg.fb
    wg = fb.binop("lshr", cg.warp_id(), const(2, "i32"))
    regs = list(acc.regs)
    cg.intrinsic("void", "llvm.nvvm.wgmma.fence.sync.aligned", [], convergent=True)
    one = const(1, "i32")
    for ks in range(k_steps):
        for r in range(r_count):
            a_args: list[LLValue]
            if a_packed is not None:
                first = 4 * (ks + r * k_steps)  # a_layout: K steps, then the m64 blocks
                a_args = a_packed[first:first + 4]
            else:
                assert isinstance(a_ref, SmemRef)
                # A rows 64(r·G + g): the warpgroup index is a run-time value; descriptors take the
                # offset as an addition (64 rows = 8 swizzle atoms, so the swizzle phase is unchanged)
                a_desc0 = _desc(cg, a_ref, 64 * r * g, ks * a_k)
                row_off = fb.binop("mul", wg, const((64 * a_ref.swizzle) >> 4, "i32"))
                a_args = [fb.binop("add", a_desc0, fb.cast("zext", row_off, "i64"))]
            for j in range(n // 256 if n > 256 else 1):
                b_desc = _desc(cg, b_ref, j * n_split, ks * instr_k)
                base = r * (n // 2) + j * nregs_instr
                chunk = regs[base:base + nregs_instr]
                text, cons = instr_text(sparse, ea, eb, eacc, n_split, instr_k, nregs_instr,
                                        a_packed is not None)
                args = [*a_args, b_desc]
                if meta is not None:
                    per = k // 32 if ea not in ("tf32", "f32") else k // 16
                    instr_words = per // (k // instr_k)  # words per row per instruction (1, or 2 for 8-bit)
                    args.append(meta.regs[ks + r * (per // instr_words)])
                args.append(one)
                args.extend(chunk)
                ty = "float" if eacc == "f32" else "i32"
                ret = "{" + ", ".join([ty] * nregs_instr) + "}"
                res = cg.asm(ret, text, cons, args, side_effect=True, convergent=True)
                assert res is not None
                for i in range(nregs_instr):
                    regs[base + i] = fb.extract(res, i, ty)
    cg.intrinsic("void", "llvm.nvvm.wgmma.commit_group.sync.aligned", [], convergent=True)
    if a_packed is not None:
        cg.state.live_a.extend(a_packed)
    return DTile(acc.layout, regs, acc.elem)


@lowering("hopper.wgmma_wait")
def lower_wgmma_wait(cg: CodeGen, op: Operation) -> None:
    cg.set(op.result, emit_wgmma_wait(cg, cg.tile(op.operand("acc")), op.attrs["pending"]))


def emit_wgmma_wait(cg: CodeGen, acc: DTile, n: int) -> DTile:
    """``wgmma.wait_group N`` that also *redefines* the accumulator registers (tied in/out asm
    operands): LLVM must not move a read of the accumulator above the wait (ptxas C7514)."""
    uniq: list[LLValue] = []
    seen: dict[str, int] = {}
    for v in acc.regs:
        if v.ref not in seen:
            seen[v.ref] = len(uniq)
            uniq.append(v)
    fb = cg.fb
    out: list[LLValue] = []
    for start in range(0, len(uniq), 128):
        chunk = uniq[start:start + 128]
        con = "f" if chunk[0].type == "float" else "r"
        ty = chunk[0].type
        text = f"wgmma.wait_group.sync.aligned {n};"
        cons = ",".join([f"={con}"] * len(chunk)) + "," + ",".join(str(i) for i in range(len(chunk)))
        ret = "{" + ", ".join([ty] * len(chunk)) + "}"
        res = cg.asm(ret, text, cons, chunk, side_effect=True, convergent=True)
        assert res is not None
        out.extend(fb.extract(res, i, ty) for i in range(len(chunk)))
    regs = [out[seen[v.ref]] for v in acc.regs]
    if n == 0:  # wait_group 0 retires every group; with n > 0 a register-A group may be the pending one
        keep_a_live(cg)
    return DTile(acc.layout, regs, acc.elem)


def keep_a_live(cg: CodeGen) -> None:
    """Use the A registers of the register-A wgmmas committed so far right after the wait that
    retires them: LLVM then cannot reuse or coalesce them (e.g. with a loop-carried next A) while
    the MMA may still read them (PTX ISA 9.7.15.5.2: A must not be modified before the wait).
    The asm is empty: it emits no instruction. Legality (SP0396) puts that wait in the block of the
    wgmma, so the values dominate it."""
    live, cg.state.live_a = cg.state.live_a, []
    for start in range(0, len(live), 64):
        chunk = live[start:start + 64]
        cg.asm("void", "", ",".join(["r"] * len(chunk)), chunk, side_effect=True, convergent=True)


# ------------------------------------------------------------------------------------------------
# Tile level: dot / sparse_dot with operands in registers, through swizzled shared memory
# ------------------------------------------------------------------------------------------------
def _tile_wgmma(cg: CodeGen, op: Operation, sparse: bool) -> bool:
    """Lower a tile-level dot through wgmma; False when the shapes do not fit (portable path)."""

    if not cg.target.has(Feature.WGMMA):
        return False
    a_v = op.operand("a")
    b_v = op.operand("b")
    acc = cg.tile(op.operand("acc"))
    m, ka = T.shape_of(a_v.type)
    k = 2 * ka if sparse else ka
    n = T.shape_of(b_v.type)[1]
    ea = T.element_type(a_v.type)
    eacc = T.element_type(op.result.type)
    warps = cg.num_warps
    if not isinstance(ea, T.ScalarType) or ea.name not in DENSE_K or eacc.name == "f16":  # type: ignore[union-attr]
        return False
    if acc.layout != acc_layout(m, n, warps) or (n > 256 and n % 256) or n % 8:
        return False
    if ea.is_int and n not in (8, 16, 24) and n % 16:
        return False
    instr_k = DENSE_K[ea.name] * (2 if sparse else 1)
    if k % instr_k:
        return False
    a = cg.tile(a_v)
    b = cg.tile(b_v)
    if ea in (T.f32, T.tf32):
        from .dot import round_to_tf32

        a, b = round_to_tf32(cg, a), round_to_tf32(cg, b)
    cg.barrier()  # the previous use of these buffers (another warpgroup's MMA) is over
    a_ref = stage_kmajor(cg, a, False, m, ka)
    b_ref = stage_kmajor(cg, b, True, n, k)
    if a_ref is None or b_ref is None:
        return False
    cg.intrinsic("void", "llvm.nvvm.fence.proxy.async.shared_cta", [])
    cg.barrier()
    meta = cg.tile(op.operand("a_meta")) if sparse else None
    out = emit_wgmma(cg, a_ref, b_ref, acc, meta, m, n, k, eacc, op)
    cg.set(op.result, emit_wgmma_wait(cg, out, 0))
    return True


def _portable(name: str) -> Any:
    from . import dot as lower_dot

    return lower_dot.lower_dot_portable if name == "dot" else lower_dot.lower_sparse_dot_portable


def _has_wgmma(cg: CodeGen) -> bool:

    return cg.target.has(Feature.WGMMA)


@lowering("dot", when=_has_wgmma)
def lower_dot_hopper(cg: CodeGen, op: Operation) -> None:
    if not _tile_wgmma(cg, op, sparse=False):
        _portable("dot")(cg, op)


@lowering("sparse_dot", when=_has_wgmma)
def lower_sparse_dot_hopper(cg: CodeGen, op: Operation) -> None:
    if not _tile_wgmma(cg, op, sparse=True):
        _portable("sparse_dot")(cg, op)
