"""backend/lower/mma.py: tile-level dot / sparse_dot on warp-level mma.sync / mma.sp for sm_80+.

Compiles the tile GEMMs of tests/gpu/test_mma_sp_gpu.py and the shipped sparse_gemm_tile.spk to
cubins (nvJitLink), checks the instructions in the PTX, ptxas, no local memory, SASS HMMA/IMMA
(when nvdisasm is installed), target gating and the portable fallback. Numerics need a GPU
(tests/gpu/test_mma_sp_gpu.py)."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower.mma import MmaInstr, padded_words, select_instr, warp_split
from sparsile.backend.toolchain.linker import assemble_with_ptxas, nvdisasm_path, nvdisasm_sass, ptxas_available
from sparsile.frontend.diagnostics import CompileError
from sparsile.frontend.ir import types as T
from sparsile.stdlib import sparsity as S
from sparsile.target.targets import get_target
from sparsile.tests.support import ROOT
from sparsile.tests.support import mma_harness as H

INSTR = {  # (dtype, sparse) -> the instruction the PTX must contain
    ("f16", False): "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    ("bf16", False): "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    ("tf32", False): "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    ("i8", False): "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
    ("e4m3", False): "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
    ("f16", True): "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32",
    ("bf16", True): "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32",
    ("tf32", True): "mma.sp::ordered_metadata.sync.aligned.m16n8k16.row.col.f32.tf32.tf32.f32",
    ("i8", True): "mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.s32.s8.s8.s32",
    ("e4m3", True): "mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.f32.e4m3.e4m3.f32",
}
INSTR_K = {("f16", False): 16, ("bf16", False): 16, ("tf32", False): 8, ("i8", False): 32, ("e4m3", False): 32}
SASS_OP = {"f16": "HMMA", "bf16": "HMMA", "tf32": "HMMA", "i8": "IMMA", "e4m3": "QMMA"}
CASES = [(d, s, "sm_80") for d in ("f16", "bf16", "tf32", "i8") for s in (False, True)] + \
        [("e4m3", s, "sm_89") for s in (False, True)] + [("f16", True, "sm_90"), ("bf16", False, "sm_86")]


@functools.cache
def compiled(dtype: str, sparse: bool, target: str, bm: int = 64, bn: int = 64, bk: int = 64):
    m = n = 128
    k = 128
    a, b = H.operands(dtype, m, n, k, 0)
    out = np.zeros((m, n), np.int32 if dtype == "i8" else np.float32)
    kern = H.make_kernel(dtype, sparse)
    cfg = {"BM": bm, "BN": bn, "BK": bk}
    if sparse:
        dt = H.TOOLKIT.get(dtype, dtype)
        vals, idx = S.compress(S.prune(a, dt), dt)
        meta = np.asarray(S.encode_metadata(idx, "sm90", dt).data)
        return kern[(2, 2)].compile_for(target, vals, meta, b, out, **cfg)
    return kern[(2, 2)].compile_for(target, a, b, out, **cfg)


@pytest.mark.parametrize("dtype,sparse,target", CASES)
def test_ptx_uses_the_warp_mma(dtype, sparse, target):
    ck = compiled(dtype, sparse, target)
    instrs = re.findall(r"\bmma[.\w:]+", ck.ptx)
    assert instrs and set(instrs) == {INSTR[dtype, sparse]}
    # 64x64 tile, 4 warps: each warp owns one 16-row slab (8 n8 tiles), BK=64 -> 64/instr_k steps
    instr_k = INSTR_K[dtype, False] * (2 if sparse else 1)
    assert len(instrs) == 8 * (64 // instr_k)
    if sparse:
        assert all(ln.rstrip().endswith(", 0x0;") for ln in ck.ptx.splitlines() if "mma.sp" in ln)
    assert not re.search(r"\b(ld|st)\.local\b", ck.ptx)
    assert "0 bytes lmem" in ck.info_log or "lmem" not in ck.info_log


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("dtype,sparse,target", CASES[:4] + CASES[8:])
def test_ptxas_accepts_and_no_spills(dtype, sparse, target):
    proc = assemble_with_ptxas(compiled(dtype, sparse, target).ptx, get_target(target), extra_args=("-v",))
    assert proc.returncode == 0, proc.stderr
    assert "0 bytes spill stores" in proc.stderr and "0 bytes stack frame" in proc.stderr, proc.stderr


@pytest.mark.skipif(nvdisasm_path() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("dtype,sparse,target", CASES)
def test_sass_shows_tensor_core_mma(dtype, sparse, target):
    sass = nvdisasm_sass(compiled(dtype, sparse, target).cubin)
    assert sass is not None
    mma = [ln for ln in sass.splitlines() if re.search(r"\b[HIQ]MMA\b|\b[HIQ]MMA\.", ln)]
    assert mma and all(SASS_OP[dtype] in ln for ln in mma)
    assert all((".SP" in ln) == sparse for ln in mma)
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_stdlib_tile_kernel_uses_mma_sp_on_sm80():
    kern = sp.load(ROOT / "stdlib" / "kernels" / "sparse_gemm_tile.spk").sparse_gemm_tile
    rng = np.random.default_rng(2)
    w = S.prune_2_4(rng.standard_normal((128, 128)).astype(np.float16))
    vals, idx = S.compress(w)
    meta = np.asarray(S.encode_metadata(idx, "sm90", "f16").data)
    b = rng.standard_normal((128, 128)).astype(np.float16)
    c = np.zeros((128, 128), np.float16)
    ck = kern[(2, 2)].compile_for("sm_80", vals, meta, b, c)
    assert "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32" in ck.ptx
    assert "wgmma" not in ck.ptx and ck.cubin


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("launch", [False, True], ids=["cli", "arrays"])
def test_stdlib_tile_kernel_has_no_spills_on_sm80(launch):
    """The shipped sparse_gemm_tile.spk at its default config (64 x 64 x 64, 4 warps) for sm_80, as
    ``sparsile compile --target sm_80 --emit ptx`` gives it and as a launch on arrays specializes it:
    ptxas -v reports no spills and no stack frame (ptxas 13.0: 201 registers, the largest part of
    them 71 loop-invariant 64-bit shared-memory addresses of the MMA operand staging, hoisted out of
    the K loop; 128 x 64 and 64 x 128 tiles or BK = 128 spill: docs/ampere.md)."""
    kern = sp.load(ROOT / "stdlib" / "kernels" / "sparse_gemm_tile.spk").sparse_gemm_tile
    if launch:
        rng = np.random.default_rng(3)
        w = S.prune_2_4(rng.standard_normal((128, 128)).astype(np.float16))
        vals, idx = S.compress(w)
        meta = np.asarray(S.encode_metadata(idx, "sm90", "f16").data)
        b = rng.standard_normal((128, 128)).astype(np.float16)
        ptx = kern[(2, 2)].compile_for("sm_80", vals, meta, b, np.zeros((128, 128), np.float16)).ptx
    else:
        ptx = kern.compile({}, target="sm_80", stop_after="ptx", cache=False).ptx
    assert "mma.sp::ordered_metadata" in ptx
    proc = assemble_with_ptxas(ptx, get_target("sm_80"), extra_args=("-v",))
    assert proc.returncode == 0, proc.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in proc.stderr, proc.stderr
    assert "0 bytes stack frame" in proc.stderr, proc.stderr


def test_other_targets_keep_their_paths():
    """sm_90a keeps wgmma; the warp-level path is not chosen there."""
    ptx = compiled("f16", True, "sm_90a").ptx
    assert "wgmma.mma_async.sp" in ptx and "mma.sp::ordered_metadata" not in ptx


def test_fp8_below_sm89_is_a_diagnostic():
    with pytest.raises(CompileError) as info:
        compiled("e4m3", True, "sm_80")
    d = info.value.diagnostics[0]
    assert d.code == "SP0620" and "sm_89" in d.message
    # not `.to(f16)` in the kernel: that conversion is refused on sm_80 too (SP0577)
    assert ".to(" not in d.help and "on the host" in d.help


def test_shapes_that_do_not_split_fall_back_to_the_portable_path():
    """BM = BN = 16 with 4 warps: one row tile and two column tiles do not split over 4 warps;
    the portable FMA loop runs (no MMA), and it still compiles."""
    ck = compiled("f16", False, "sm_80", 16, 16, 64)
    assert "mma." not in ck.ptx and "fma.rn.f32" in ck.ptx


def test_other_tile_configurations_compile():
    for bm, bn, bk in ((128, 128, 64), (32, 64, 32), (16, 32, 64)):
        for sparse in (False, True):
            ck = compiled("f16", sparse, "sm_80", bm, bn, bk)
            split = warp_split(bm, bn, 4)
            assert split is not None
            assert ck.ptx.count("mma.") == split.tiles_m * split.tiles_n * (bk // (32 if sparse else 16))
            assert "0 bytes lmem" in ck.info_log


# ------------------------------------------------------------------------------------------ units
def test_select_instr_gating():
    sm80, sm89, sm90 = get_target("sm_80"), get_target("sm_89"), get_target("sm_90")
    assert select_instr(sm80, T.f16, T.f16, T.f32, True) == MmaInstr("f16", "f16", "f32", True, 32, 2)
    assert select_instr(sm80, T.f32, T.f32, T.f32, False) == MmaInstr("tf32", "tf32", "f32", False, 8, 1)
    assert select_instr(sm80, T.u8, T.i8, T.i32, True) == MmaInstr("u8", "s8", "s32", True, 64, 4)
    assert select_instr(sm80, T.e4m3, T.e4m3, T.f32, False) is None
    assert select_instr(sm89, T.e4m3, T.e5m2, T.f32, True) == MmaInstr("e4m3", "e5m2", "f32", True, 64, 4)
    assert select_instr(sm90, T.f16, T.f16, T.f16, False) is not None  # f16 acc: carried as f32
    assert select_instr(sm90, T.f16, T.bf16, T.f32, False) is None


def test_instruction_text_and_constraints():
    sp_f16 = select_instr(get_target("sm_80"), T.f16, T.f16, T.f32, True)
    assert sp_f16 is not None
    assert sp_f16.text() == ("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
                             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9, $10, $11}, {$12, $13, $14, $15}, $16, 0x0;")
    assert sp_f16.constraints().split(",") == ["=f"] * 4 + ["r"] * 8 + ["f"] * 4 + ["r"]
    dense_i8 = select_instr(get_target("sm_80"), T.i8, T.i8, T.i32, False)
    assert dense_i8 is not None
    assert dense_i8.constraints().split(",") == ["=r"] * 4 + ["r"] * 6 + ["r"] * 4


@pytest.mark.parametrize("words", [1, 4, 8, 16, 20, 32, 33, 64])
def test_padded_rows_are_bank_conflict_free(words):
    """8 rows x 4 consecutive words (one fragment load of a warp) hit 32 different banks."""
    s = padded_words(words)
    assert s >= words
    banks = {(g * s + t) % 32 for g in range(8) for t in range(4)}
    assert len(banks) == 32


def test_warp_split():
    s = warp_split(64, 64, 4)
    assert s is not None and (s.wm, s.wn, s.tiles_m, s.tiles_n) == (4, 1, 1, 8)
    s = warp_split(16, 32, 4)
    assert s is not None and (s.wm, s.wn, s.tiles_m, s.tiles_n) == (1, 4, 1, 1)
    assert warp_split(16, 16, 4) is None and warp_split(24, 64, 4) is None and warp_split(64, 12, 4) is None


# ------------------------------------------------------------------------------------------ anchored accumulator
def test_acc_layout_is_the_c_fragment_tiling():
    """Register c + 4(j + tiles_n·i) of lane (g, t) in warp w is element c of C tile
    (w % wm + wm·i, w // wm + wn·j): row g + 8(c>>1), column 2t + (c&1) (§4.4)."""
    from sparsile.backend.lower.mma import acc_layout

    for m, n, warps in ((64, 64, 4), (128, 128, 4), (16, 32, 4), (32, 64, 8)):
        lay = acc_layout(m, n, warps)
        split = warp_split(m, n, warps)
        assert lay is not None and split is not None
        for w in range(warps):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for i in range(split.tiles_m):
                    for j in range(split.tiles_n):
                        for c in range(4):
                            r = c + 4 * (j + split.tiles_n * i)
                            got = lay.apply(reg=r, lane=lane, warp=w)
                            row = 16 * (w % split.wm + split.wm * i) + g + 8 * (c >> 1)
                            col = 8 * (w // split.wm + split.wn * j) + 2 * t + (c & 1)
                            assert (got["dim0"], got["dim1"]) == (row, col)
    assert acc_layout(48, 64, 4) is None  # 3 row tiles: not a power of two


@pytest.mark.parametrize("dtype,sparse", [("f16", True), ("i8", False), ("tf32", True)])
def test_anchored_accumulator_skips_the_shared_memory_round_trip(dtype, sparse):
    """With lower_mma's hooks (as backend/lower/hooks.py would choose them) the accumulator stays
    in the C fragment registers: two barriers per dot instead of three, less shared memory."""
    with H.mma_hooks(True):
        kern = H.make_kernel(dtype, sparse, anchored=True)
        m = n = k = 128
        a, b = H.operands(dtype, m, n, k, 0)
        out = np.zeros((m, n), np.int32 if dtype == "i8" else np.float32)
        if sparse:
            dt = H.TOOLKIT.get(dtype, dtype)
            vals, idx = S.compress(S.prune(a, dt), dt)
            meta = np.asarray(S.encode_metadata(idx, "sm90", dt).data)
            ck = kern[(2, 2)].compile_for("sm_80", vals, meta, b, out)
        else:
            ck = kern[(2, 2)].compile_for("sm_80", a, b, out)
    plain = compiled(dtype, sparse, "sm_80")
    assert ck.ptx.count("mma.") == plain.ptx.count("mma.")
    assert ck.ptx.count("bar.sync") == plain.ptx.count("bar.sync") - 1
    assert ck.smem_bytes < plain.smem_bytes
    assert "0 bytes lmem" in ck.info_log


@pytest.mark.parametrize("anchored", [False, True])
def test_f16_accumulator_compiles_with_f32_mmas(anchored):
    """An f16 ``acc`` goes through f32 MMAs (the f16-accumulator mma forms are not used)."""
    with H.mma_hooks(anchored):
        kern = H.make_kernel("f16", True, anchored=anchored, acc="f16")
        a, b = H.operands("f16", 128, 128, 128, 0)
        vals, idx = S.compress(S.prune(a, "f16"), "f16")
        meta = np.asarray(S.encode_metadata(idx, "sm90", "f16").data)
        ck = kern[(2, 2)].compile_for("sm_80", vals, meta, b, np.zeros((128, 128), np.float16))
    assert set(re.findall(r"\bmma[.\w:]+", ck.ptx)) == {INSTR["f16", True]}
    assert "cvt.rn.f16.f32" in ck.ptx and "0 bytes lmem" in ck.info_log


@pytest.mark.parametrize("target", ["sm_87", "sm_120", "sm_121"])
def test_other_warp_mma_targets(target):
    ck = compiled("bf16", True, target)
    assert INSTR["bf16", True] in ck.ptx and ck.cubin
