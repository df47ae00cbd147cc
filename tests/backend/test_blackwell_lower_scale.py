"""Lowering of block-scaled tcgen05.mma (kind::mxf8f6f4 ``.block_scale``) and of scale-factor copies
(backend/lower/blackwell_mma.py, frontend/ops/tmem_scales.py).

Golden values are written by hand from the PTX ISA, not taken from the implementation:

* instruction descriptor, Table 43 of PTX ISA 9.7.16.4.2 (= docs/hardware.md §1.3 "block-scaled"):
  sparse bit 2, B scale id 4-5, A type 7-9, B type 10-12, N>>3 at 17, scale type UE8M0 = 1 at 23,
  M>>7 at 27-28, A scale id 29-30;
* the scale-factor id of K step ks is the byte ``ks % 4`` of the TMEM word; the scale column is
  ``(ks // 4)·group + ...`` (one 4-column atom per 128 rows and 4 blocks; stdlib/blockscale.py);
* the copy: ``tcgen05.cp.32x128b.warpx4`` per 512-byte atom, no swizzle, SBO = 128 B, bit 46.

The emitted LLVM IR is resolved back to TMEM columns and compared with those values.
"""

from __future__ import annotations

import functools
import re
import textwrap

import pytest

from sparsile.backend.lower.blackwell_mma import mma_plan
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.tests import support

compile_src = functools.partial(support.compile_src, target="sm_100a", stop_after="llvm", aligned=True)


def kernel(body: str) -> str:
    lines = textwrap.dedent(body).strip("\n").split("\n")
    return "@kernel(num_warps=4)\ndef k():\n" + "\n".join("    " + ln for ln in lines) + "\n"


def idesc(n: int, sf: int, sparse: bool, a: int = 0, b: int = 0, m: int = 128) -> int:
    """PTX ISA Table 43, bit by bit."""
    return (int(sparse) << 2) | (sf << 4) | (a << 7) | (b << 10) | ((n >> 3) << 17) | (1 << 23) | ((m >> 7) << 27) \
        | (sf << 29)


def test_idesc_bits_by_hand():
    assert idesc(256, 0, True) == 0x08C00004
    assert idesc(128, 3, False) == 0x68A00030


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------
def test_plan_sparse_block_scaled():
    """Sparse e4m3, M = 128, N = 256, K = 512: 8 instructions of logical K 64; metadata two columns
    per instruction (selector 0, reserved for mx kinds); scale block = K step: byte ks % 4 of the
    scale words, the second group of 4 blocks one atom (A: 4 columns, B: 8 columns for N = 256) on."""
    plan = mma_plan(T.e4m3, T.e4m3, T.f32, 128, 256, 512, True, 256, 16, block_scale=True)
    assert [i.idesc for i in plan] == [idesc(256, ks % 4, True) for ks in range(8)]
    assert [(i.meta_col, i.selector) for i in plan] == [(2 * ks, 0) for ks in range(8)]
    assert [(i.a_scale_col, i.b_scale_col) for i in plan] == [(4 * (ks // 4), 8 * (ks // 4)) for ks in range(8)]


def test_plan_dense_block_scaled_over_m_and_n_tiles():
    """Dense, M = 256 (two M tiles) x N = 384 (256 + 128) x K = 128 (4 steps of 32), e5m2 x e4m3:
    M tile mt reads A scale columns 4·mt (its own atom), N tile n0 the B columns from n0 / 32."""
    plan = mma_plan(T.e5m2, T.e4m3, T.f32, 256, 384, 128, False, 384, block_scale=True)
    want = [(ks, mt, n0, idesc(nsz, ks, False, a=1, b=0), 4 * mt, n0 // 32)
            for ks in range(4) for mt in range(2) for n0, nsz in ((0, 256), (256, 128))]
    assert [(i.k_step, i.m_tile, i.n_start, i.idesc, i.a_scale_col, i.b_scale_col) for i in plan] == want


def test_plan_without_scales_is_unchanged():
    plan = mma_plan(T.e4m3, T.e4m3, T.f32, 128, 256, 128, True, 256, 4)
    assert all(i.a_scale_col is None and i.b_scale_col is None for i in plan)
    assert plan[0].idesc == 0x08400004 | (1 << 4)  # kind::f8f6f4 table: D = f32 at bits 4-5, M>>4 at 24


# ------------------------------------------------------------------------------------------------
# The emitted LLVM IR
# ------------------------------------------------------------------------------------------------
DEF = re.compile(r"^\s*(%[\w.]+) = (.*)$")
ARG_SPLIT = re.compile(r", (?=ptr |i64 |i32 |i1 )")


class IR:
    """Follows constant ``add`` offsets of TMEM addresses back to their root."""

    def __init__(self, text: str):
        self.text = text
        self.defs = {m.group(1): m.group(2) for m in (DEF.match(ln) for ln in text.splitlines()) if m}

    def offset(self, v: str) -> int:
        off = 0
        while True:
            if re.fullmatch(r"-?\d+", v):
                return off + int(v)
            rhs = self.defs.get(v, "")
            m = re.fullmatch(r"inttoptr i32 (\S+) to ptr addrspace\(6\)", rhs)
            if m:
                v = m.group(1)
                continue
            m = re.fullmatch(r"(?:add|or disjoint) i32 (\S+), (-?\d+)", rhs)
            if m:
                v, off = m.group(1), off + int(m.group(2))
                continue
            return off  # the kernel's TMEM base (loaded from shared memory)

    def smem_offset_and_fields(self, v: str) -> tuple[int, int]:
        rhs = self.defs[v]
        z, fields = re.fullmatch(r"or i64 (\S+), (\d+)", rhs).groups()
        a = re.fullmatch(r"zext i32 (\S+) to i64", self.defs[z]).group(1)
        s = re.fullmatch(r"and i32 (\S+), 16383", self.defs[a]).group(1)
        addr = re.fullmatch(r"lshr i32 (\S+), 4", self.defs[s]).group(1)
        _, off = re.fullmatch(r"add i32 (\S+), (\S+)", self.defs[addr]).groups()
        return self.offset(off), int(fields)

    def calls(self, name: str) -> list[list[str]]:
        out = []
        for ln in self.text.splitlines():
            m = re.search(rf"call void @{re.escape(name)}\((.*)\)", ln)
            if m:
                out.append([a.rsplit(" ", 1)[1] for a in ARG_SPLIT.split(m.group(1))])
        return out


SPARSE = kernel("""\
a_s = smem.alloc(e4m3, (128, 256), swizzle=128)
b_s = smem.alloc(e4m3, (256, 512), swizzle=128)
acc = tmem.alloc(f32, (128, 256))
meta = tmem.alloc(u32, (128, 16), kind="meta", meta_dtype=e4m3)
sa = tmem.alloc(u32, (128, 8), kind="scale")
sb = tmem.alloc(u32, (128, 16), kind="scale")
tcgen05.mma(a_s, b_s, acc, a_meta=meta, a_scale=sa, b_scale=sb, accumulate=False)
""")


def test_emitted_sparse_mma_operands():
    """Placement: acc columns [0, 256), metadata [256, 272), A scales [272, 280), B scales [280, 296)."""
    ir = IR(compile_src(SPARSE).llvm)
    calls = ir.calls("llvm.nvvm.tcgen05.mma.sp.shared.mxf8f6f4.block_scale.block32")
    assert len(calls) == 8
    for ks, (d, _a, _b, desc, en, meta, sa, sb, cg, coll) in enumerate(calls):
        assert ir.offset(d) == 0 and ir.offset(meta) == 256 + 2 * ks
        assert int(desc) == idesc(256, ks % 4, True)
        assert (ir.offset(sa), ir.offset(sb)) == (272 + 4 * (ks // 4), 280 + 8 * (ks // 4))
        assert en == ("false" if ks == 0 else "true") and (cg, coll) == ("1", "0")
    assert "llvm.nvvm.tcgen05.mma.sp.shared(" not in ir.text  # no unscaled form beside it


def test_emitted_dense_mma_and_ptx():
    """Dense K = 256: 8 instructions of K 32, two groups of 4 scale blocks (same columns as above)."""
    src = SPARSE.replace("(256, 512), swizzle", "(256, 256), swizzle").replace("a_meta=meta, ", "")
    ck = compile_src(src, stop_after="ptx")
    ir = IR(ck.llvm)
    calls = ir.calls("llvm.nvvm.tcgen05.mma.shared.mxf8f6f4.block_scale.block32")
    assert [int(c[3]) for c in calls] == [idesc(256, ks % 4, False) for ks in range(8)]
    assert [(ir.offset(c[5]), ir.offset(c[6])) for c in calls] == [(272 + 4 * (ks // 4), 280 + 8 * (ks // 4))
                                                                   for ks in range(8)]
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == 8 and all("tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32" in ln for ln in mma)


COPY = kernel("""\
s_s = smem.alloc(u32, (3, 32, 4))
t_s = smem.alloc(u32, (64, 4))
sa = tmem.alloc(u32, (128, 12), kind="scale")
sb = tmem.alloc(u32, (128, 8), kind="scale")
tcgen05.copy(s_s, sa)
tcgen05.copy(t_s, sb)
""")


def test_scale_copy_atoms_descriptors_and_columns():
    """One tcgen05.cp.32x128b.warpx4 per 512-byte atom: atom i to columns 4i of the view; the source
    descriptor: no swizzle (61-63 = 0), SBO = 128 B (8 lines of 16 B) at 32-45, LBO 0, bit 46; start
    address the atom's (buffers are 1024-aligned; the first sits at 1024, after the TMEM address slot)."""
    ck = compile_src(COPY, stop_after="ptx")
    ir = IR(ck.llvm)
    calls = ir.calls("llvm.nvvm.tcgen05.cp.32x128b_warpx4.cg1")
    fields = (128 >> 4) << 32 | 1 << 46
    got = [(ir.offset(t), *ir.smem_offset_and_fields(d)) for t, d in calls]
    assert got == [(0, 1024, fields), (4, 1536, fields), (8, 2048, fields), (12, 3072, fields), (16, 3584, fields)]
    assert ck.ptx.count("tcgen05.cp.cta_group::1.32x128b.warpx4") == 5 and "elect.sync" in ck.ptx


@pytest.mark.parametrize("target", ["sm_90a", "sm_120a"])
def test_gated_by_target(target):
    with pytest.raises(CompileError) as info:
        compile_src(COPY.replace("tcgen05.copy(t_s, sb)", "tcgen05.mma(a_s, b_s, acc, a_scale=sa, b_scale=sb)")
                    .replace("s_s = ", "a_s = smem.alloc(e4m3, (128, 128), swizzle=128)\n    b_s = smem.alloc(e4m3, "
                             "(128, 128), swizzle=128)\n    acc = tmem.alloc(f32, (128, 128))\n    s_s = "),
                    target=target)
    assert info.value.diagnostics[0].code == "SP0602"
