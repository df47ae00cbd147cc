"""Lowering of the Blackwell explicit ops (backend/lower/blackwell.py, blackwell_mma.py).

* The MMA split of seed 001 (:func:`mma_plan`) against golden values written by hand from
  docs/hardware.md §11 and §1.3 (idesc) — not taken from the implementation.
* The emitted LLVM IR: every ``tcgen05.mma.sp`` call is resolved back to its accumulator column,
  metadata column (relative to the kernel's TMEM base), instruction descriptor and shared-memory
  operand addresses, and compared with the same golden values.
* The TMEM allocation (one per CTA, power of two, freed at the end), the metadata copy
  descriptor, the access atoms of loads/stores and the layout algebra of the metadata image
  (seed 000), target gating and the warpgroup rule of TMEM access.
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path

import pytest

import sparsile as sp
from sparsile.backend.lower.blackwell import register_layout
from sparsile.backend.lower.blackwell_mma import mma_plan
from sparsile.driver.module import loads
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.frontend.ops.blackwell_operands import tmem_chunk_layout
from sparsile.frontend.sema.core import ArgSpec
from sparsile.tests import support

compile_src = functools.partial(support.compile_src, target="sm_100a", aligned=True)


def kernel(body: str, params: str, warps: int = 4) -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return f"@kernel(num_warps={warps})\ndef k({params}):\n" + "\n".join("    " + ln for ln in lines) + "\n"


# ------------------------------------------------------------------------------------------------
# The split plan: golden values from the formulas (docs/hardware.md §11, §1.3)
# ------------------------------------------------------------------------------------------------
def _idesc(a: int, b: int, d: int, n: int, sel: int, sparse: bool = True) -> int:
    """§1.3 bit table, written out: selector 0-1, sparse 2, D 4-5, A 7-9, B 10-12, N>>3 at 17, M>>4 at 24."""
    return sel | (int(sparse) << 2) | (d << 4) | (a << 7) | (b << 10) | ((n >> 3) << 17) | ((128 >> 4) << 24)


def test_idesc_helper_reproduces_the_fact_sheet_examples():
    assert _idesc(0, 0, 1, 256, 0) == 0x08400014  # f16 -> f32
    assert _idesc(1, 1, 1, 256, 0) == 0x08400494  # bf16 -> f32
    assert _idesc(1, 1, 2, 256, 0) == 0x084004A4  # s8 -> s32


def test_plan_16bit_column_pairs_and_alternating_selector():
    """f16, K = 256: 8 instructions of K = 32; instruction k reads column 2·(k//2) with selector k%2."""
    plan = mma_plan(T.f16, T.f16, T.f32, 128, 128, 256, True, 128, 4)
    assert [(i.k_step, i.meta_col, i.selector) for i in plan] == [
        (0, 0, 0), (1, 0, 1), (2, 2, 0), (3, 2, 1), (4, 4, 0), (5, 4, 1), (6, 6, 0), (7, 6, 1)]
    assert [i.idesc for i in plan] == [_idesc(0, 0, 1, 128, k % 2) for k in range(8)]
    assert [(i.a_col, i.b_col, i.d_col) for i in plan] == [(16 * k, 32 * k, 0) for k in range(8)]
    assert [i.first for i in plan] == [True] + [False] * 7


def test_plan_tf32_is_16bit_like_with_half_the_k():
    plan = mma_plan(T.f32, T.f32, T.f32, 128, 64, 64, True, 64, 4)
    assert [(i.meta_col, i.selector, i.a_col, i.b_col) for i in plan] == [
        (0, 0, 0, 0), (0, 1, 8, 16), (2, 0, 16, 32), (2, 1, 24, 48)]
    assert plan[1].idesc == _idesc(2, 2, 1, 64, 1)


def test_plan_8bit_two_columns_selector_zero():
    """e4m3 / s8, K = 256: 4 instructions of K = 64, columns 0, 2, 4, 6, selector always 0."""
    for a, d in ((T.e4m3, T.f32), (T.i8, T.i32), (T.u8, T.i32)):
        plan = mma_plan(a, a, d, 128, 256, 256, True, 256, 8)
        assert [(i.meta_col, i.selector) for i in plan] == [(0, 0), (2, 0), (4, 0), (6, 0)]
        code = {"e4m3": 0, "i8": 1, "u8": 0}[a.name]
        assert plan[0].idesc == _idesc(code, code, 1 if d == T.f32 else 2, 256, 0)


def test_plan_m256_two_tiles_with_their_own_metadata_rows():
    """1-CTA M = 256: tile mt has A rows 128·mt, accumulator columns mt·N (the second 128 rows sit
    in the next N columns) and its metadata in the next tile_stride columns."""
    plan = mma_plan(T.f16, T.f16, T.f32, 256, 128, 128, True, 128, 4)
    assert [(i.k_step, i.m_tile, i.a_row, i.d_col, i.meta_col, i.selector) for i in plan] == [
        (0, 0, 0, 0, 0, 0), (0, 1, 128, 128, 4, 0), (1, 0, 0, 0, 0, 1), (1, 1, 128, 128, 4, 1),
        (2, 0, 0, 0, 2, 0), (2, 1, 128, 128, 6, 0), (3, 0, 0, 0, 2, 1), (3, 1, 128, 128, 6, 1)]


def test_plan_n512_reuses_the_metadata_of_each_k_step():
    """N = 512: two N = 256 instructions per K step, same metadata column and selector (metadata
    depends on the M tile and K step only). (Sparse N = 512 f32 does not fit TMEM next to its
    metadata — 512 + 4 columns — so kernels use N <= 384; the plan is the same.)"""
    plan = mma_plan(T.f16, T.f16, T.f32, 128, 512, 64, True, 512, 4)
    assert [(i.n_start, i.n_size, i.b_row, i.d_col, i.meta_col, i.selector, i.idesc) for i in plan] == [
        (0, 256, 0, 0, 0, 0, _idesc(0, 0, 1, 256, 0)), (256, 256, 256, 256, 0, 0, _idesc(0, 0, 1, 256, 0)),
        (0, 256, 0, 0, 0, 1, _idesc(0, 0, 1, 256, 1)), (256, 256, 256, 256, 0, 1, _idesc(0, 0, 1, 256, 1))]


def test_plan_n384_splits_256_plus_128():
    plan = mma_plan(T.e4m3, T.e4m3, T.f32, 128, 384, 64, True, 384, 4)
    assert [(i.n_start, i.n_size, i.idesc) for i in plan] == [
        (0, 256, _idesc(0, 0, 1, 256, 0)), (256, 128, _idesc(0, 0, 1, 128, 0))]


def test_plan_dense_has_no_metadata():
    plan = mma_plan(T.bf16, T.bf16, T.f32, 128, 256, 64, False, 256)
    assert [(i.meta_col, i.selector, i.a_col, i.b_col) for i in plan] == [(None, 0, 16 * k, 16 * k) for k in range(4)]
    assert plan[0].idesc == _idesc(1, 1, 1, 256, 0, sparse=False)


# ------------------------------------------------------------------------------------------------
# The emitted LLVM IR, resolved back to addresses
# ------------------------------------------------------------------------------------------------
DEF = re.compile(r"^\s*(%[\w.]+) = (.*)$")
ARG_SPLIT = re.compile(r", (?=ptr |i64 |i32 |i1 )")


class IR:
    """Just enough of an LLVM IR reader to follow constant offsets back to their root value."""

    def __init__(self, text: str):
        self.text = text
        self.defs = {m.group(1): m.group(2) for m in (DEF.match(ln) for ln in text.splitlines()) if m}

    def resolve(self, v: str) -> tuple[str | None, int]:
        off = 0
        while True:
            if re.fullmatch(r"-?\d+", v):
                return None, off + int(v)
            rhs = self.defs.get(v, "")
            m = re.fullmatch(r"(?:add|or disjoint) i32 (\S+), (\S+)", rhs)
            if m and re.fullmatch(r"-?\d+", m.group(2)):
                v, off = m.group(1), off + int(m.group(2))
                continue
            if m and re.fullmatch(r"-?\d+", m.group(1)):
                v, off = m.group(2), off + int(m.group(1))
                continue
            m = re.fullmatch(r"inttoptr i32 (\S+) to ptr addrspace\(6\)", rhs)
            if m:
                v = m.group(1)
                continue
            return v, off

    def descriptor(self, v: str) -> tuple[int, int]:
        """(constant high fields, shared-memory byte offset) of a descriptor built as
        ``or(zext(and(lshr(add(smem_base, offset), 4), 0x3FFF)), CONST)``."""
        rhs = self.defs[v]
        z, const = re.fullmatch(r"or i64 (\S+), (\d+)", rhs).groups()
        a = re.fullmatch(r"zext i32 (\S+) to i64", self.defs[z]).group(1)
        s = re.fullmatch(r"and i32 (\S+), 16383", self.defs[a]).group(1)
        addr = re.fullmatch(r"lshr i32 (\S+), 4", self.defs[s]).group(1)
        base, off = re.fullmatch(r"add i32 (\S+), (\S+)", self.defs[addr]).groups()
        assert self.defs[base].startswith("ptrtoint ptr addrspace(3) @sparsile_smem")
        root, offset = self.resolve(off)
        assert root is None
        return int(const), offset

    def calls(self, name: str) -> list[list[tuple[str, str]]]:
        out = []
        for ln in self.text.splitlines():
            m = re.search(rf"call void @{re.escape(name)}\((.*)\)", ln)
            if m:
                out.append([tuple(a.rsplit(" ", 1)) for a in ARG_SPLIT.split(m.group(1))])
        return out


MMA_KERNEL = kernel("""\
a_s = smem.alloc(DT, (M, K // 2), swizzle=ASW)
b_s = smem.alloc(DT, (N, K), swizzle=128)
acc = tmem.alloc(ACC, (M, N))
meta = tmem.alloc(u32, (M, K // 32 + (4 - K // 32 % 4) % 4), kind="meta", meta_dtype=DT)
tcgen05.mma(a_s, b_s, acc, a_meta=meta, accumulate=False)
""", "")


def mma_ir(dt: str, acc: str, m: int, n: int, k: int, asw: int) -> IR:
    src = MMA_KERNEL
    for key, val in (("DT", dt), ("ACC", acc), ("ASW", asw), ("M", m), ("N", n), ("K", k)):
        src = re.sub(rf"\b{key}\b", str(val), src)
    return IR(compile_src(src, stop_after="llvm").llvm)


@pytest.mark.parametrize("dt,acc,m,n,k,asw", [("f16", "f32", 128, 128, 256, 128), ("e4m3", "f32", 128, 256, 256, 128),
                                             ("f16", "f32", 256, 64, 128, 128), ("i8", "i32", 128, 384, 128, 64)])
def test_emitted_mma_addresses_match_the_golden_plan(dt, acc, m, n, k, asw):
    ir = mma_ir(dt, acc, m, n, k, asw)
    elem = {"f16": T.f16, "e4m3": T.e4m3, "i8": T.i8}[dt]
    acc_t = {"f32": T.f32, "i32": T.i32}[acc]
    words = k // 32 + (4 - k // 32 % 4) % 4
    plan = mma_plan(elem, elem, acc_t, m, n, k, True, n, words)
    calls = ir.calls("llvm.nvvm.tcgen05.mma.sp.shared")
    assert len(calls) == len(plan)
    eb = elem.bits // 8
    meta_col = n * (m // 128)  # the metadata region is placed after the accumulator (4-aligned)
    for call, ins in zip(calls, plan):
        (_, d), (_, adesc), (_, bdesc), (_, idesc), (_, en), (_, meta), *imm = call
        assert ir.resolve(d)[1] == ins.d_col
        assert ir.resolve(meta)[1] == meta_col + ins.meta_col
        assert int(idesc) == ins.idesc
        assert en == ("false" if ins.first else "true")
        a_hi, a_off = ir.descriptor(adesc)
        b_hi, b_off = ir.descriptor(bdesc)
        # K-major swizzled: start = row·S + K bytes within a swizzle row (+ panels of all rows);
        # LBO 16 (unused), SBO = 8·S, version bit 46, swizzle code at 61-63 (docs/hardware.md §1.5, §9)
        for hi, sw in ((a_hi, asw), (b_hi, 128)):
            assert hi == (1 << 16) | ((8 * sw >> 4) << 32) | (1 << 46) | ({128: 2, 64: 4, 32: 6}[sw] << 61)
        a_bytes = ins.a_col * eb
        assert a_off - a_off_base(ir) == (a_bytes // asw) * m * asw + ins.a_row * asw + a_bytes % asw
        b_bytes = ins.b_col * eb
        assert b_off - b_off_base(ir, m, k, eb) == (b_bytes // 128) * n * 128 + ins.b_row * 128 + b_bytes % 128
        assert [v for _, v in imm] == [{"f16": "0", "e4m3": "2", "i8": "3"}[dt], "1", "0"]


def a_off_base(ir: IR) -> int:
    """A is the first shared-memory buffer of the kernel (after the 16-byte TMEM address slot,
    1024-aligned)."""
    return 1024


def b_off_base(ir: IR, m: int, k: int, eb: int) -> int:
    return 1024 + -(-(m * (k // 2) * eb) // 1024) * 1024


def test_tmem_is_allocated_once_and_freed_at_the_end():
    ck = compile_src(kernel("""\
x = tmem.alloc(f32, (128, 100))
y = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=f16)
z = tmem.alloc(f32, (128, 16))
""", ""))
    ptx = ck.ptx
    assert ptx.count("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32") == 1
    assert ptx.count("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;") == 1
    assert ptx.count("tcgen05.dealloc.cta_group::1.sync.aligned.b32") == 1
    # 100 + 8 (at 100) + 16 (at 112, 16-aligned) = 128 columns: a power of two >= 32
    assert re.search(r"mov\.b32\s+%r\d+, 128;\s*\n\s*tcgen05\.alloc", ptx)
    alloc = ptx.index("tcgen05.alloc")
    assert ptx.index("tcgen05.fence::before_thread_sync", alloc) < ptx.index("bar.sync", alloc) < \
        ptx.index("tcgen05.fence::after_thread_sync", alloc)
    dealloc = ptx.index("tcgen05.dealloc")
    assert ptx.rindex("bar.sync", 0, dealloc) < dealloc and ptx.rindex("ret;") > dealloc


COPY = kernel("""\
e_s = smem.alloc(u32, (2, 128, 4))
meta = tmem.alloc(u32, (128, 8), kind="meta", meta_dtype=f16)
tcgen05.copy(e_s, meta)
""", "")


def test_metadata_copy_descriptor_and_columns():
    """tcgen05.cp.128x128b per 2 KB atom: no swizzle, SBO = 128 B, version bit 46 (docs/hardware.md
    §1.4); atom i to metadata columns 4i."""
    ck = compile_src(COPY, stop_after="ptx")
    ir = IR(ck.llvm)
    calls = ir.calls("llvm.nvvm.tcgen05.cp.128x128b.cg1")
    assert len(calls) == 2
    for i, ((_, taddr), (_, desc)) in enumerate(calls):
        assert ir.resolve(taddr)[1] == 4 * i
        assert ir.descriptor(desc) == ((128 >> 4) << 32 | 1 << 46, 1024 + 2048 * i)
    assert ck.ptx.count("tcgen05.cp.cta_group::1.128x128b") == 2
    assert "elect.sync" in ck.ptx


def test_metadata_chunk_layout_agrees_with_the_toolkit_placement():
    """Seed 000: the TMEM image the layout algebra gives the metadata (row m and m+8 share a cell
    for 16-bit operands, a K bit in the lane) is the word placement of the sparsity toolkit."""
    from sparsile.stdlib.sparsity import operand_type, word_position

    for dtype, bits in (("f16", 16), ("tf32", 32), ("e4m3", 8)):
        for rows in (128, 256):
            t = T.TmemType(T.u32, (rows, 4), "meta", bits)
            lay = tmem_chunk_layout(t)
            op_t = operand_type(dtype)
            for m in range(rows):
                for j in range(32):
                    (lane, col), slot = word_position("sm90", op_t, m, j)
                    tile, lane = divmod(lane, 128)
                    assert lay(lane=lane, col=4 * tile + col, sub=slot) == {"dim0": m, "dim1": j}


def test_metadata_register_layout_holds_rows_m_and_m_plus_8_together():
    """What a TiledLayout with one vector dim cannot express (docs/hardware.md §1.4): one thread
    holds chunks of rows m and m+8 in one 32-bit word for 16-bit operands, of row m only for 8-bit."""
    f16 = register_layout(T.TmemType(T.u32, (128, 4), "meta", 16), 4, chunks=True)
    e4m3 = register_layout(T.TmemType(T.u32, (128, 4), "meta", 8), 4, chunks=True)
    regs16 = [f16.basis("reg", b) for b in range(f16.in_bits("reg"))]
    regs8 = [e4m3.basis("reg", b) for b in range(e4m3.in_bits("reg"))]
    assert {"dim0": 8, "dim1": 0} in regs16 and all(r["dim0"] == 0 for r in regs8)
    assert [f16.basis("lane", b) for b in range(5)] == [{"dim0": 1 << b, "dim1": 0} for b in (0, 1, 2)] + [
        {"dim0": 0, "dim1": 4}, {"dim0": 16, "dim1": 0}]


LOADS = kernel("""\
meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)
acc = tmem.alloc(f32, (128, 64))
a_t = tmem.alloc(f16, (128, 64), kind="a")
rows = arange(0, 128)
store(W + rows[:, None] * 4 + arange(0, 4)[None, :], meta.load())
store(CH + rows[:, None] * 32 + arange(0, 32)[None, :], meta.load_chunks())
store(C + rows[:, None] * 64 + arange(0, 64)[None, :], acc.load())
a_t.store(load(X + rows[:, None] * 64 + arange(0, 64)[None, :]))
""", "W: ptr[u32], CH: ptr[u8], C: ptr[f32], X: ptr[f16]")


def test_tmem_loads_and_stores_use_the_derived_atoms():
    ptx = compile_src(LOADS).ptx
    # words and chunks: 32x32b.x4 (one lane per thread, 4 columns); accumulator: 2 x 32x32b.x32;
    # packed f16 A (64 values = 32 columns): one 32x32b.x32 store of two halves per register
    assert ptx.count("tcgen05.ld.sync.aligned.32x32b.x4.b32") == 2
    assert ptx.count("tcgen05.ld.sync.aligned.32x32b.x32.b32") == 2
    assert ptx.count("tcgen05.st.sync.aligned.32x32b.x32.b32") == 1
    assert "tcgen05.wait::ld.sync.aligned" in ptx and "tcgen05.wait::st.sync.aligned" in ptx


def test_eight_warps_split_columns_between_warpgroups():
    ptx = compile_src(kernel("""\
acc = tmem.alloc(f32, (128, 64))
rows = arange(0, 128)
store(C + rows[:, None] * 64 + arange(0, 64)[None, :], acc.load())
""", "C: ptr[f32]", warps=8)).ptx
    assert ptx.count("tcgen05.ld.sync.aligned.32x32b.x32.b32") == 1  # 32 columns per warpgroup


PARTITIONS = """\
def reader(acc, C):
    rows = arange(0, 128)
    store(C + rows[:, None] * 32 + arange(0, 32)[None, :], acc.load())


def idle(C):
    pass


@kernel(num_warps=5)
def k(C: ptr[f32]):
    acc = tmem.alloc(f32, (128, 32))
    warp_specialize(partition(idle, C, warps=1), partition(reader, acc, C, warps=4))
"""


def test_tmem_access_needs_a_warpgroup_aligned_partition():
    with pytest.raises(CompileError) as info:
        compile_src(PARTITIONS)
    d = info.value.diagnostics[0]
    assert d.code == "SP0550" and "starting at warp 1" in d.message and d.span.line == 3
    compile_src(PARTITIONS.replace("partition(idle, C, warps=1), partition(reader, acc, C, warps=4)",
                                   "partition(reader, acc, C, warps=4), partition(idle, C, warps=1)"))


def test_a_operand_in_tmem_uses_the_tensor_form():
    ptx = compile_src(kernel("""\
b_s = smem.alloc(f16, (64, 128), swizzle=128)
a_t = tmem.alloc(f16, (128, 64), kind="a")
acc = tmem.alloc(f32, (128, 64))
meta = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=f16)
tcgen05.mma(a_t, b_s, acc, a_meta=meta)
""", "")).ptx
    mma = [ln for ln in ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == 4 and all(re.search(r"discard \[%r\d+\], \[%r\d+\], %rd\d+, \[%r\d+\]", ln) for ln in mma)


@pytest.mark.parametrize("target", ["sm_90a", "sm_120a", "sm_100f"])
def test_gated_by_target(target):
    src = kernel('x = tmem.alloc(u32, (128, 4), kind="meta", meta_dtype=i8)', "")
    if target == "sm_100f":  # tcgen05 exists; kind::i8 does not
        src = MMA_KERNEL
        for key, val in (("DT", "i8"), ("ACC", "i32"), ("ASW", 64), ("M", 128), ("N", 64), ("K", 128)):
            src = re.sub(rf"\b{key}\b", str(val), src)
    with pytest.raises(CompileError) as info:
        compile_src(src, target=target)
    d = info.value.diagnostics[0]
    assert d.code == "SP0602" and target in d.message


def test_mixed_operand_types_encode_both_codes():
    """kind::f8f6f4 may mix e4m3 and e5m2, kind::i8 signedness (docs/hardware.md §1.3: e5m2 = 1,
    u8 = 0, s8 = 1 at bits 7-9 (A) and 10-12 (B))."""
    assert mma_plan(T.e5m2, T.e4m3, T.f16, 128, 64, 64, True, 64)[0].idesc == (
        _idesc(1, 0, 0, 64, 0))
    assert mma_plan(T.u8, T.i8, T.i32, 128, 64, 64, True, 64)[0].idesc == _idesc(0, 1, 2, 64, 0)
    src = MMA_KERNEL.replace("b_s = smem.alloc(DT,", "b_s = smem.alloc(u8,")
    for key, val in (("DT", "i8"), ("ACC", "i32"), ("ASW", 64), ("M", 128), ("N", 64), ("K", 128)):
        src = re.sub(rf"\b{key}\b", str(val), src)
    ir = IR(compile_src(src, stop_after="llvm").llvm)
    assert {int(c[3][1]) for c in ir.calls("llvm.nvvm.tcgen05.mma.sp.shared")} == {_idesc(1, 0, 2, 64, 0)}


# ------------------------------------------------------------------------------------------------
# Tile level: dot / sparse_dot on tcgen05 (backend/lower/blackwell_tile.py)
# ------------------------------------------------------------------------------------------------
TILE_SPARSE = Path(__file__).resolve().parents[2] / "stdlib" / "kernels" / "sparse_gemm_tile.spk"

TILE_DOT = """\
@kernel(num_warps=NW)
def k(A: ptr[DT], B: ptr[DT], C: ptr[ACC], K: i32, BN: constexpr):
    rows = arange(0, BM)
    cols = arange(0, BN)
    kk = arange(0, 64)
    acc = zeros((BM, BN), ACC)
    for k0 in range(0, K, 64):
        a = load(A + rows[:, None] * K + k0 + kk[None, :])
        b = load(B + (k0 + kk)[:, None] * BN + cols[None, :])
        acc = dot(a, b, acc)
    store(C + rows[:, None] * BN + cols[None, :], acc)
"""


def tile_dot_ptx(dt: str, acc: str, target: str = "sm_100a", bm: int = 128, nw: int = 4) -> str:
    src = TILE_DOT.replace("NW", str(nw)).replace("DT", dt).replace("ACC", acc).replace("BM", str(bm))
    kern = loads(src).k
    sig = {"A": ArgSpec(T.PointerType(T.scalar_type(dt)), True), "B": ArgSpec(T.PointerType(T.scalar_type(dt)), True),
           "C": ArgSpec(T.PointerType(T.scalar_type(acc)), True), "K": T.i32, "BN": 64}
    return kern.compile(sig, target=target, stop_after="ptx").ptx


def test_tile_sparse_dot_runs_on_tcgen05():
    """sparse_gemm_tile.spk with a 128-row tile: sparse_dot becomes tcgen05.mma.sp (K = 64: two
    instructions, selector 0 then 1 on one metadata column) with the metadata words stored into
    TMEM; a 64-row tile keeps the portable path."""
    kern = sp.load(TILE_SPARSE).sparse_gemm_tile
    sig = {p.name: ArgSpec(p.annotation, True) for p in kern.params if p.annotation is not T.CONSTEXPR}
    ck = kern.compile({**sig, "BM": 128, "BN": 64, "BK": 64}, target="sm_100a")
    ir = IR(ck.llvm)
    calls = ir.calls("llvm.nvvm.tcgen05.mma.sp.shared")
    assert [int(c[3][1]) for c in calls] == [_idesc(0, 0, 1, 64, 0), _idesc(0, 0, 1, 64, 1)]
    assert len({ir.resolve(c[5][1]) for c in calls}) == 1  # both read the same column
    assert "tcgen05.st.sync.aligned.32x32b.x2.b32" in ck.ptx  # the (128, 2) metadata words
    assert "tcgen05.commit" in ck.ptx and "mbarrier.inval" in ck.ptx and "mma.sp::ordered_metadata" not in ck.ptx
    assert re.search(r"\b0 bytes lmem", ck.info_log)
    small = kern.compile({**sig, "BM": 64, "BN": 64, "BK": 64}, target="sm_100a", stop_after="ptx").ptx
    assert "tcgen05.mma" not in small


@pytest.mark.parametrize("dt,acc,target,tcgen05", [("f16", "f32", "sm_100a", True), ("e4m3", "f32", "sm_110a", True),
                                                   ("i8", "i32", "sm_100a", True), ("i8", "i32", "sm_103a", False)])
def test_tile_dot_runs_on_tcgen05_where_the_kind_exists(dt, acc, target, tcgen05):
    ptx = tile_dot_ptx(dt, acc, target)
    assert ("tcgen05.mma.cta_group::1" in ptx) == tcgen05
    assert "tcgen05.mma.sp" not in ptx


def test_tile_dot_shapes_without_a_tcgen05_form_stay_portable():
    """M = 32 has no cta_group::1 MMA (PTX ISA: M = 64 or 128); 2 warps cannot reach every TMEM
    lane quarter (warp w accesses lanes 32·(w % 4)..). Dense M = 64: tests/backend/test_blackwell_tile.py."""
    assert "tcgen05.mma" not in tile_dot_ptx("f16", "f32", bm=32)
    assert "tcgen05.mma" not in tile_dot_ptx("f16", "f32", nw=2)

