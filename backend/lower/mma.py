"""sm_80+ tile-level ``dot`` / ``sparse_dot`` on warp-level tensor cores: ``mma.sync.aligned`` (dense)
and ``mma.sp::ordered_metadata.sync.aligned`` (2:4 sparse), PTX ISA 9.7.14 (warp-level MMA) and
docs/hardware.md §4.4.

Chosen on targets with :attr:`Feature.MMA_SP` that have neither the wgmma (sm_90a) nor the tcgen05
(sm_100a ...) tile path: sm_80, sm_86, sm_87, sm_89, sm_90 and sm_120/121. Instructions (one warp,
``m16n8kK``, f32 / s32 accumulators):

=================  =============  ===========  =====================================
A, B               dense          sparse        targets
=================  =============  ===========  =====================================
f16, bf16          m16n8k16       m16n8k32      sm_80+
tf32 (f32 data)    m16n8k8        m16n8k16      sm_80+
i8 / u8 (mixed)    m16n8k32       m16n8k64      sm_80+ (s32 accumulator, wrapping)
e4m3 / e5m2        m16n8k32       m16n8k64      sm_89+ (ptxas rejects them on sm_80/86/87)
=================  =============  ===========  =====================================

Fragments (g = lane/4, t = lane%4, ``pw`` = elements per 32-bit register: 2 for 16-bit, 1 for tf32,
4 for 8-bit): A register p (of 4) holds row ``g + 8(p&1)``, columns ``pw·t + 4pw(p>>1) ..+pw``
(for ``.sp`` the columns of the *compressed* A); B register q (2 dense, 4 sparse) holds K
``pw·t + 4pw·q ..+pw`` of column g; C/D c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, ·) (§4.4 [H]).
Metadata (selector 0): for 16-bit and tf32 the lane with ``t%2 = h`` passes the "sm90" word of row
``16·tile + 8h + g`` (the word matrix already permutes rows like this, docs/sparse-metadata.md);
for 8-bit every lane passes the plain-row word ``(16·tile + g + 8(t%2), 2·kstep + t/2)`` (§4.2).

Data path: operands and the accumulator are staged in shared memory (A and the metadata
row-major, B K-major, rows padded so fragment loads are bank-conflict free), each warp loads its
fragments with 32-bit ``ld.shared`` and owns a set of 16x8 accumulator tiles (warps split M first),
writes its D tiles back, and every thread reads its accumulator elements in the layout inference
chose. An f16 accumulator is carried as f32 through the MMAs (rounded once at the end of the
``dot``). Shapes that do not fit (M % 16, N % 8, K % instruction K, a warp split that does not
divide the tiles) and fp8 below sm_89 use the portable lowering (``lower_dot``).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import Any

from ...frontend.diagnostics import CompileError, Diagnostic
from ...frontend.ir import types as T
from ...frontend.ir.core import Operation
from ...frontend.layout.layouts import LinearLayout
from ...frontend.layout.tile import distinct_registers, normalize
from ...target.hooks import TargetHooks
from ...target.targets import Feature
from .codegen import CodeGen, DTile, lowering
from .elementwise import cast_value
from .llvm_text import LLValue, const
from .reduce import storage_of

PTX_TYPE = {"f16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "tf32", "e4m3": "e4m3", "e5m2": "e5m2",
            "i8": "s8", "u8": "u8"}
_FP8 = ("e4m3", "e5m2")


@dataclass(frozen=True)
class MmaInstr:
    """One warp-level MMA: ``m16n8k{k}`` with ``pw`` operand elements per 32-bit register."""

    ta: str  # PTX type of A
    tb: str  # PTX type of B
    acc: str  # "f32" or "s32"
    sparse: bool
    k: int  # logical K per instruction
    pw: int

    @property
    def a_cols(self) -> int:
        """Stored A columns per instruction (compressed for ``.sp``)."""
        return self.k // 2 if self.sparse else self.k

    @property
    def b_regs(self) -> int:
        return 4 if self.sparse else 2

    def text(self) -> str:
        """The inline-asm template: D (4), A (4), B (2|4), C (4)[, metadata]."""
        nb = self.b_regs
        d = ", ".join(f"${i}" for i in range(4))
        a = ", ".join(f"${4 + i}" for i in range(4))
        b = ", ".join(f"${8 + i}" for i in range(nb))
        c = ", ".join(f"${8 + nb + i}" for i in range(4))
        types = f"{self.acc}.{self.ta}.{self.tb}.{self.acc}"
        if self.sparse:
            return (f"mma.sp::ordered_metadata.sync.aligned.m16n8k{self.k}.row.col.{types} "
                    f"{{{d}}}, {{{a}}}, {{{b}}}, {{{c}}}, ${12 + nb}, 0x0;")
        return f"mma.sync.aligned.m16n8k{self.k}.row.col.{types} {{{d}}}, {{{a}}}, {{{b}}}, {{{c}}};"

    def constraints(self) -> str:
        f = "f" if self.acc == "f32" else "r"
        cons = [f"={f}"] * 4 + ["r"] * (4 + self.b_regs) + [f] * 4 + (["r"] if self.sparse else [])
        return ",".join(cons)


def select_instr(target: Any, a_elem: Any, b_elem: Any, acc_elem: Any, sparse: bool) -> MmaInstr | None:
    """The MMA for these operand types on ``target``, or None (the portable lowering runs).

    Gated per docs/hardware.md §7 / PTX ISA 9.7.14.5.14: fp8 ``mma`` needs sm_89 or later."""
    if not isinstance(a_elem, T.ScalarType) or not isinstance(b_elem, T.ScalarType):
        return None
    ea, eb = a_elem.name, b_elem.name
    if ea not in PTX_TYPE or eb not in PTX_TYPE or acc_elem.name not in ("f32", "f16", "i32"):
        return None
    if ea in _FP8 or eb in _FP8:
        if not (ea in _FP8 and eb in _FP8) or (target.major, target.minor) < (8, 9):
            return None
    bits = 32 if ea in ("f32", "tf32") else a_elem.bits
    pw = 32 // bits
    if ea in ("i8", "u8"):
        if eb not in ("i8", "u8") or acc_elem.name != "i32":
            return None
        acc = "s32"
    else:
        if acc_elem.name == "i32" or (PTX_TYPE[ea] != PTX_TYPE[eb] and ea not in _FP8):
            return None
        acc = "f32"
    k = 8 * pw * (2 if sparse else 1)
    return MmaInstr(PTX_TYPE[ea], PTX_TYPE[eb], acc, sparse, k, pw)


@dataclass(frozen=True)
class WarpSplit:
    """Warps over the 16x8 accumulator tiles: warp ``w`` has row tiles ``w % wm + wm·i`` and
    column tiles ``w // wm + wn·j``."""

    wm: int
    wn: int
    tiles_m: int  # per warp
    tiles_n: int


def warp_split(m: int, n: int, warps: int) -> WarpSplit | None:
    if m % 16 or n % 8:
        return None
    mt, nt = m // 16, n // 8
    wm = gcd(warps, mt)
    wn = warps // wm
    if nt % wn:
        return None
    return WarpSplit(wm, wn, mt // wm, nt // wn)


def acc_layout(m: int, n: int, warps: int) -> LinearLayout | None:
    """The accumulator layout of :func:`warp_split`'s tiling in the C/D fragment layout (§4.4),
    when every count is a power of two (else None): ``reg`` = (c0/c1 column, c2/c3 row + 8,
    column tiles, row tiles), ``lane`` = (2t, g), ``warp`` = (row-tile warps, column-tile warps).
    Register ``c + 4(j + tiles_n·i)`` is element ``c`` of the warp's tile (i, j)."""
    split = warp_split(m, n, warps)
    if split is None or any(x & (x - 1) for x in (m, n, warps, split.wm, split.wn, split.tiles_m, split.tiles_n)):
        return None
    reg = [(0, 1), (8, 0)]
    reg += [(0, 8 * split.wn << b) for b in range(split.tiles_n.bit_length() - 1)]
    reg += [(16 * split.wm << b, 0) for b in range(split.tiles_m.bit_length() - 1)]
    lane = [(0, 2), (0, 4), (1, 0), (2, 0), (4, 0)]
    warp = [(16 << b, 0) for b in range(split.wm.bit_length() - 1)]
    warp += [(0, 8 << b) for b in range(split.wn.bit_length() - 1)]
    lay = LinearLayout.from_bases({"reg": reg, "lane": lane, "warp": warp}, [("dim0", m), ("dim1", n)])
    return normalize(lay, warps)


def anchor(op: Operation, num_warps: int) -> dict[int, LinearLayout]:
    """Layout-inference anchor: the accumulator and result of ``dot`` / ``sparse_dot`` in the
    MMA fragment layout, so no accumulator round trip through shared memory is needed."""
    if op.name not in ("dot", "sparse_dot"):
        return {}
    shape = T.shape_of(op.result.type)
    lay = acc_layout(shape[0], shape[1], num_warps)
    if lay is None:
        return {}
    return {id(op.result): lay, id(op.operand("acc")): lay}


HOOKS = TargetHooks(anchor=anchor)
"""Target hooks for the warp-level MMA targets (backend/lower/hooks.py chooses them)."""


def padded_words(words: int) -> int:
    """A row stride in 32-bit words that is 4 (mod 8): the 8 rows x 4 words a fragment load reads
    then fall in 32 different banks."""
    s = -(-words // 4) * 4
    return s + 4 if (s // 4) % 2 == 0 else s


# ------------------------------------------------------------------------------------------------
def _stage(cg: CodeGen, x: DTile, base: int, stride: int, transpose: bool, elem: Any = None) -> None:
    """Store every element a thread holds at ``base + (row·stride + col)·size`` (``row, col`` the
    tile coordinates, swapped with ``transpose``), converted to ``elem`` if given."""
    fb = cg.fb
    src = x.elem
    dst = elem or src
    sty, eb = storage_of(dst)
    coords = cg.coords(x.layout)
    for r in distinct_registers(x.layout):
        row, col = coords[r]
        if transpose:
            row, col = col, row
        lin = fb.binop("add", fb.binop("mul", row, const(stride, "i32")), col)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(eb, "i32")), const(base, "i32")))
        v = x.regs[r] if dst == src else cast_value(cg, src, dst, x.regs[r])  # type: ignore[arg-type]
        fb.emit(f"store {sty} {v.ref}, ptr addrspace(3) {ptr.ref}, align {eb}")


def _load(cg: CodeGen, ty: str, lane_off: LLValue, static: int) -> LLValue:
    fb = cg.fb
    ptr = cg.smem_ptr(fb.binop("add", lane_off, const(static, "i32")))
    return fb.value(f"load {ty}, ptr addrspace(3) {ptr.ref}, align 4", ty, "fr")


def _store(cg: CodeGen, v: LLValue, lane_off: LLValue, static: int) -> None:
    fb = cg.fb
    ptr = cg.smem_ptr(fb.binop("add", lane_off, const(static, "i32")))
    fb.emit(f"store {v.type} {v.ref}, ptr addrspace(3) {ptr.ref}, align 4")


def _lane_offset(cg: CodeGen, row_terms: list[tuple[LLValue, int]], row_const: int, row_bytes: int,
                 col_bytes: LLValue | None) -> LLValue:
    """``(sum(v·c) + row_const)·row_bytes + col_bytes`` as i32."""
    fb = cg.fb
    row: LLValue = const(row_const, "i32")
    for v, c in row_terms:
        row = fb.binop("add", row, fb.binop("mul", v, const(c, "i32")))
    off = fb.binop("mul", row, const(row_bytes, "i32"))
    return off if col_bytes is None else fb.binop("add", off, col_bytes)


def _refuse_fp8_below_sm89(cg: CodeGen, op: Operation, a_elem: Any, b_elem: Any) -> None:
    """fp8 operands below sm_89: neither ``mma`` with .e4m3/.e5m2 nor the portable path's
    ``cvt`` from fp8 exists there (ptxas: "requires .target sm_89 or higher"), so say so here
    instead of letting nvJitLink reject the PTX."""
    names = {getattr(a_elem, "name", ""), getattr(b_elem, "name", "")}
    if names & set(_FP8) and not cg.target.has(Feature.FP8_CVT):
        kind = "/".join(sorted(names & set(_FP8)))
        raise CompileError([Diagnostic(
            "SP0620", f"`{op.name}` of {kind} operands cannot be compiled for {cg.target.name}: fp8 tensor-core "
            "instructions and fp8 conversions need sm_89 or later", op.span,
            help="compile for sm_89, sm_90a or later; for sm_80, give the kernel f16 or bf16 operands (fp8 data "
                 "converted on the host: converting fp8 in the kernel needs sm_89 too, SP0577)")])


def emit_mma_dot(cg: CodeGen, op: Operation, sparse: bool) -> bool:
    """Lower ``op`` through warp-level MMAs; False when it does not fit (nothing was emitted)."""
    a_v = op.operand("a")
    b_v = op.operand("b")
    _refuse_fp8_below_sm89(cg, op, T.element_type(a_v.type), T.element_type(b_v.type))
    m, ka = T.shape_of(a_v.type)
    k = 2 * ka if sparse else ka
    n = T.shape_of(b_v.type)[1]
    acc_elem = T.element_type(op.result.type)
    instr = select_instr(cg.target, T.element_type(a_v.type), T.element_type(b_v.type), acc_elem, sparse)
    split = warp_split(m, n, cg.num_warps)
    if instr is None or split is None or k % instr.k:
        return False
    from .dot import round_to_tf32

    a = round_to_tf32(cg, cg.tile(a_v))
    b = round_to_tf32(cg, cg.tile(b_v))
    acc = cg.tile(op.operand("acc"))
    a_eb = storage_of(a.elem)[1]
    b_eb = storage_of(b.elem)[1]
    work = T.f32 if instr.acc == "f32" else T.i32
    ty = "float" if instr.acc == "f32" else "i32"
    # shared-memory images (row strides in words, padded)
    sa_w = padded_words(ka * a_eb // 4)
    sb_w = padded_words(k * b_eb // 4)
    sc_w = n + 8 if n % 32 == 0 else n
    direct = acc.layout == acc_layout(m, n, cg.num_warps)  # anchored: registers are the C fragments
    a_base = cg.smem_alloc(m * sa_w * 4, 16)
    b_base = cg.smem_alloc(n * sb_w * 4, 16)
    c_base = 0 if direct else cg.smem_alloc(m * sc_w * 4, 16)
    meta = None
    if sparse:
        meta = cg.tile(op.operand("a_meta"))
        kw = T.shape_of(op.operand("a_meta").type)[1]
        sm_w = kw
        m_base = cg.smem_alloc(m * sm_w * 4, 16)
    cg.barrier()  # the previous readers of these buffers (this op in an earlier iteration) are done
    _stage(cg, a, a_base, sa_w * 4 // a_eb, False)
    _stage(cg, b, b_base, sb_w * 4 // b_eb, True)
    if not direct:
        _stage(cg, acc, c_base, sc_w, False, work if acc.elem != work else None)
    if meta is not None:
        _stage(cg, meta, m_base, sm_w, False)
    cg.barrier()

    fb = cg.fb
    lane = cg.lane_id()
    g = fb.binop("lshr", lane, const(2, "i32"))
    t = fb.binop("and", lane, const(3, "i32"))
    w = cg.warp_id()
    wm = fb.binop("urem", w, const(split.wm, "i32")) if split.wm > 1 else const(0, "i32")
    wn = fb.binop("udiv", w, const(split.wm, "i32")) if split.wn > 1 else const(0, "i32")
    t4 = fb.binop("shl", t, const(2, "i32"))
    a_lane = fb.binop("add", _lane_offset(cg, [(wm, 16), (g, 1)], 0, sa_w * 4, t4), const(a_base, "i32"))
    b_lane = fb.binop("add", _lane_offset(cg, [(wn, 8), (g, 1)], 0, sb_w * 4, t4), const(b_base, "i32"))
    t2 = fb.binop("shl", t, const(3, "i32"))  # 2t words = 8t bytes
    c_lane = fb.binop("add", _lane_offset(cg, [(wm, 16), (g, 1)], 0, sc_w * 4,
                                          fb.binop("add", fb.binop("mul", wn, const(32, "i32")), t2)),
                      const(c_base, "i32"))
    if sparse:
        th = fb.binop("and", t, const(1, "i32"))
        if instr.pw == 4:  # 8-bit: row g + 8(t%2), word column t/2 of the instruction's pair
            col = fb.binop("shl", fb.binop("lshr", t, const(1, "i32")), const(2, "i32"))
        else:  # 16-bit / tf32: row 8(t%2) + g, one word per instruction
            col = None
        m_lane = fb.binop("add", _lane_offset(cg, [(wm, 16), (g, 1), (th, 8)], 0, sm_w * 4, col),
                          const(m_base, "i32"))

    tm, tn = split.tiles_m, split.tiles_n
    row_step_a = 16 * split.wm * sa_w * 4
    col_step_b = 8 * split.wn * sb_w * 4
    cregs: dict[tuple[int, int], list[LLValue]] = {}
    for i in range(tm):
        for j in range(tn):
            if direct:
                regs = acc.regs[4 * (j + tn * i):4 * (j + tn * i) + 4]
                cregs[i, j] = [r if acc.elem == work else cast_value(cg, acc.elem, work, r)  # type: ignore[arg-type]
                               for r in regs]
                continue
            base = 16 * split.wm * i * sc_w * 4 + 8 * split.wn * j * 4
            cregs[i, j] = [_load(cg, ty, c_lane, base + (8 * sc_w * (p >> 1) + (p & 1)) * 4) for p in range(4)]
    text, cons = instr.text(), instr.constraints()
    ret = "{" + ", ".join([ty] * 4) + "}"
    words_per_step = 2 if instr.pw == 4 else 1  # metadata words per row per instruction
    for ks in range(k // instr.k):
        afr = [[_load(cg, "i32", a_lane, row_step_a * i + 8 * sa_w * 4 * (p & 1)
                      + (ks * instr.a_cols + 4 * instr.pw * (p >> 1)) * a_eb) for p in range(4)] for i in range(tm)]
        bfr = [[_load(cg, "i32", b_lane, col_step_b * j + (ks * instr.k + 4 * instr.pw * q) * b_eb)
                for q in range(instr.b_regs)] for j in range(tn)]
        mfr = [_load(cg, "i32", m_lane, 16 * split.wm * i * sm_w * 4 + ks * words_per_step * 4)
               for i in range(tm)] if sparse else []
        for i in range(tm):
            for j in range(tn):
                args = afr[i] + bfr[j] + cregs[i, j] + ([mfr[i]] if sparse else [])
                res = cg.asm(ret, text, cons, args, side_effect=False, convergent=True)
                assert res is not None
                cregs[i, j] = [fb.extract(res, p, ty) for p in range(4)]
    if direct:
        out = [cregs[i, j][p] if acc.elem == work else cast_value(cg, work, acc.elem, cregs[i, j][p])  # type: ignore[arg-type]
               for i in range(tm) for j in range(tn) for p in range(4)]
        cg.set(op.result, DTile(acc.layout, out, acc.elem))
        return True
    for i in range(tm):
        for j in range(tn):
            base = 16 * split.wm * i * sc_w * 4 + 8 * split.wn * j * 4
            for p in range(4):
                _store(cg, cregs[i, j][p], c_lane, base + (8 * sc_w * (p >> 1) + (p & 1)) * 4)
    cg.barrier()
    coords = cg.coords(acc.layout)
    out = []
    for r in range(len(acc.regs)):
        row, col = coords[r]
        lin = fb.binop("add", fb.binop("mul", row, const(sc_w, "i32")), col)
        ptr = cg.smem_ptr(fb.binop("add", fb.binop("mul", lin, const(4, "i32")), const(c_base, "i32")))
        v = fb.value(f"load {ty}, ptr addrspace(3) {ptr.ref}, align 4", ty, "acc")
        out.append(v if acc.elem == work else cast_value(cg, work, acc.elem, v))  # type: ignore[arg-type]
    cg.set(op.result, DTile(acc.layout, out, acc.elem))
    return True


# ------------------------------------------------------------------------------------------------
def uses_warp_mma(cg: CodeGen) -> bool:
    """Targets whose tile-level MMAs are warp-level: mma.sp present, no wgmma / tcgen05 path."""

    tgt = cg.target
    return tgt.has(Feature.MMA_SP) and not tgt.has(Feature.WGMMA) and not tgt.has(Feature.TCGEN05)


@lowering("dot", when=uses_warp_mma)
def lower_dot_mma(cg: CodeGen, op: Operation) -> None:
    if not emit_mma_dot(cg, op, sparse=False):
        from .dot import lower_dot_portable

        lower_dot_portable(cg, op)


@lowering("sparse_dot", when=uses_warp_mma)
def lower_sparse_dot_mma(cg: CodeGen, op: Operation) -> None:
    if not emit_mma_dot(cg, op, sparse=True):
        from .dot import lower_sparse_dot_portable

        lower_sparse_dot_portable(cg, op)
