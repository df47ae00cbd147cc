"""Acceptance of the persistent Blackwell sparse GEMM (stdlib/kernels/sparse_gemm_sm100_persistent.spk):
every kind x legal target (sm_100a; sm_103a and sm_110a where the kind exists) compiles to PTX
that ptxas accepts and to a cubin through nvJitLink with no local memory; the SASS (nvdisasm)
shows the UTC MMAs of one K step with the sparse instruction descriptors computed by hand from
docs/hardware.md §1.3; the epilogue gives the accumulator buffer back right after its last
``tcgen05.ld``; the TMEM budget (2 accumulators + metadata slots <= 512 columns) is enforced at
compile time; a golden PTX snapshot. No Blackwell GPU ran any of this (docs/blackwell.md)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import (
    assemble_with_ptxas,
    elf_is_arch_specific,
    elf_sm_arch,
    nvdisasm_path,
    nvdisasm_sass,
    ptxas_available,
)
from sparsile.frontend.diagnostics import CompileError
from sparsile.target.targets import get_target
from sparsile.tests.golden_ptx import check_golden
from sparsile.tests.support import compile_stdlib, signature

KERNEL = Path(__file__).resolve().parents[2] / "stdlib" / "kernels" / "sparse_gemm_sm100_persistent.spk"
TARGETS = ("sm_100a", "sm_103a", "sm_110a")
DTYPES = ("f16", "bf16", "tf32", "e4m3", "i8")
# (A/B type code, D type code, N of the default BN, MMA instructions per K step): docs/hardware.md
# §1.3 (f16 0 / bf16 1 / tf32 2 / e4m3 0 / s8 1; D f32 1, s32 2); one K step is one metadata atom
# (128 K for 16-bit and 8-bit, 64 for tf32) = 4 instructions of K 32 / 16, or 2 of K 64.
CONFIG = {"f16": (0, 1, 128, 4), "bf16": (1, 1, 128, 4), "tf32": (2, 1, 128, 4), "e4m3": (0, 1, 192, 2),
          "i8": (1, 2, 192, 2)}
SASS_MMA = {"f16": "UTCHMMA", "bf16": "UTCHMMA", "tf32": "UTCHMMA", "e4m3": "UTCQMMA", "i8": "UTCIMMA"}
PTX_KIND = {"f16": "f16", "bf16": "f16", "tf32": "tf32", "e4m3": "f8f6f4", "i8": "i8"}
CASES = [(d, t) for d in DTYPES for t in TARGETS if not (d == "i8" and t == "sm_103a")]


@functools.cache
def module(src: str | None = None):
    return sp.load(KERNEL) if src is None else sp.loads(src, name="variant")


def compile_kernel(dtype: str, target: str, src: str | None = None, **constexprs):
    kern = getattr(module(src), f"sparse_gemm_{dtype}")
    return kern.compile(signature(kern, aligned=True, **constexprs), target=target)


def compiled(dtype: str, target: str):
    return compile_stdlib("sparse_gemm_sm100_persistent.spk", f"sparse_gemm_{dtype}", target)


def idesc(dtype: str, selector: int) -> int:
    a, d, n, _ = CONFIG[dtype]
    return selector | (1 << 2) | (d << 4) | (a << 7) | (a << 10) | ((n >> 3) << 17) | (128 >> 4 << 24)


@pytest.mark.parametrize("dtype,target", CASES)
def test_compiles_to_a_cubin_without_local_memory(dtype, target):
    ck = compiled(dtype, target)
    assert elf_sm_arch(ck.cubin) == get_target(target).sm and elf_is_arch_specific(ck.cubin) is True
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == CONFIG[dtype][3]
    assert all(f"tcgen05.mma.sp.cta_group::1.kind::{PTX_KIND[dtype]}.collector::a::discard" in ln for ln in mma)
    for op in ("tcgen05.alloc", "tcgen05.relinquish_alloc_permit", "tcgen05.dealloc", "tcgen05.commit",
               "tcgen05.cp.cta_group::1.128x128b", "tcgen05.ld.sync.aligned.32x32b", "elect.sync",
               "tcgen05.fence::before_thread_sync", "%nctaid.x", "cp.async.bulk.tensor.2d.global.shared::cta"):
        assert op in ck.ptx, op
    # one allocation of 512 columns: 2 accumulators of BN + 4 metadata slots of 4 columns > 256
    alloc = re.search(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[[^]]+\], (%r\d+);", ck.ptx)
    assert alloc and re.search(rf"mov\.b32\s+{alloc.group(1)}, 512;", ck.ptx)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("dtype,target", [c for c in CASES if c[1] == "sm_100a"] +
                         [("bf16", "sm_103a"), ("e4m3", "sm_103a"), ("i8", "sm_110a"), ("tf32", "sm_110a")])
def test_ptxas_accepts_the_ptx(dtype, target):
    proc = assemble_with_ptxas(compiled(dtype, target).ptx, get_target(target))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(nvdisasm_path() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("dtype,target", CASES)
def test_sass_shows_the_utc_mma_with_our_descriptors(dtype, target):
    sass = nvdisasm_sass(compiled(dtype, target).cubin)
    assert sass is not None
    mma = [ln for ln in sass.splitlines() if re.search(r"\bUTC\w*MMA\b", ln)]
    assert len(mma) == CONFIG[dtype][3]
    assert all(SASS_MMA[dtype] in ln and "gdesc" in ln and "idesc" in ln for ln in mma)
    immediates = {int(x, 16) for x in re.findall(r"\bUMOV UR\d+, (0x[0-9a-f]+)", sass)}
    want = {idesc(dtype, s) for s in ((0, 1) if dtype in ("f16", "bf16", "tf32") else (0,))}
    assert want <= immediates, sorted(hex(x) for x in immediates)
    assert not {w & ~0b111 for w in want} & immediates  # the dense twin of the descriptor is absent
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert "UTCCP" in sass


def test_i8_is_refused_on_sm_103a():
    with pytest.raises(CompileError) as info:
        compiled("i8", "sm_103a")
    assert info.value.diagnostics[0].code == "SP0602"


def test_the_accumulator_buffer_is_released_right_after_its_last_load():
    """In the epilogue: every ``tmem.load`` slice of the tile, then the fence and the arrival on
    acc_empty, before the last slice is converted and stored; the stored tile keeps the layout
    tcgen05.ld produced (seed 002: no conversion)."""
    ir = compiled("f16", "sm_100a").ir
    assert "convert_layout" not in ir
    lines = ir.splitlines()
    loads = [i for i, ln in enumerate(lines) if "tmem.load" in ln]
    arrive = [i for i, ln in enumerate(lines) if "mbarrier.arrive" in ln]
    assert len(loads) == 128 // 64 and len(arrive) == 1
    assert loads[-1] < arrive[0] and "tcgen05.fence_before" in lines[arrive[0] - 2] + lines[arrive[0] - 1]
    stores = [i for i, ln in enumerate(lines) if "smem.store" in ln]
    assert stores[0] < loads[-1] < arrive[0] < stores[-1]  # slice 0 stored before the last load


def test_the_mma_warp_addresses_the_accumulator_by_tile_parity():
    """The accumulator operand of the MMAs is ``acc_t[i % 2]`` (a run-time stage index), and both
    acc barriers are waited on with run-time parities."""
    ir = compiled("f16", "sm_100a").ir
    assert re.search(r"tmem\.index %\w+, %\w+", ir)
    assert len(re.findall(r"mbarrier\.wait", ir)) == 4  # producer empty, MMA full + acc_empty, epilogue acc_full


@pytest.mark.parametrize("dtype,bn", [("f16", 256), ("e4m3", 256)])
def test_two_accumulators_and_the_metadata_must_fit_tmem(dtype, bn):
    """2 x 256 accumulator columns + 16 metadata columns > 512: SP0540 when compiled."""
    with pytest.raises(CompileError) as info:
        compile_kernel(dtype, "sm_100a", BN=bn)
    d = info.value.diagnostics[0]
    assert d.code == "SP0540" and "512 columns" in d.message


def test_a_wide_n_tile_that_fits_compiles():
    """BN = 224 for i8 (2 x 224 + 16 = 464 of 512 columns; 7 epilogue slices of 32 i32 columns):
    compiles, one instruction of N = 224 per K-step half (docs/hardware.md §1.2: N step 16)."""
    ck = compile_kernel("i8", "sm_100a", BN=224, STAGES=3)
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == 2
    assert len(re.findall(r"tcgen05\.ld\.sync\.aligned\.32x32b", ck.ptx)) >= 224 // 32


def test_epilogue_slices_must_divide_the_n_tile():
    with pytest.raises(CompileError) as info:
        compile_kernel("f16", "sm_100a", BN=96)
    assert "EPI_N" in info.value.diagnostics[0].message


def test_persistent_ptx_matches_the_golden_snapshot():
    ptx = compiled("f16", "sm_100a").ptx
    check_golden(ptx, "sparse_gemm_sm100_persistent_f16.sm_100a.ptx")
