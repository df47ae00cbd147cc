"""Acceptance of the shipped Blackwell kernels (stdlib/kernels/{sparse,dense}_gemm_sm100.spk):
every kernel x kind x legal target (sm_100a; sm_103a and sm_110a where the kind exists) compiles
to PTX that ptxas accepts and to a cubin through nvJitLink; the SASS (nvdisasm) shows the UTC MMA
instructions with the sparse instruction descriptors the compiler computed, and no local memory.
No Blackwell GPU ran any of this (docs/blackwell.md)."""

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
from sparsile.tests.support import compile_stdlib

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
TARGETS = ("sm_100a", "sm_103a", "sm_110a")
DTYPES = ("f16", "bf16", "tf32", "e4m3", "i8")
# (A type code, D type code, N per instruction, MMAs per K step) of the default configurations;
# instruction descriptor per docs/hardware.md §1.3 (A/B code at 7 and 10, D at 4, N>>3 at 17, M>>4 at 24)
CONFIG = {
    ("sparse", "f16"): (0, 1, 128, 4), ("sparse", "bf16"): (1, 1, 128, 4), ("sparse", "tf32"): (2, 1, 128, 4),
    ("sparse", "e4m3"): (0, 1, 256, 2), ("sparse", "i8"): (1, 2, 256, 2),
    ("dense", "f16"): (0, 1, 256, 4), ("dense", "bf16"): (1, 1, 256, 4), ("dense", "tf32"): (2, 1, 128, 4),
    ("dense", "e4m3"): (0, 1, 256, 4), ("dense", "i8"): (1, 2, 256, 4),
}
SASS_MMA = {"f16": "UTCHMMA", "bf16": "UTCHMMA", "tf32": "UTCHMMA", "e4m3": "UTCQMMA", "i8": "UTCIMMA"}
PTX_KIND = {"f16": "f16", "bf16": "f16", "tf32": "tf32", "e4m3": "f8f6f4", "i8": "i8"}
CASES = [(s, d, t) for s in ("sparse", "dense") for d in DTYPES for t in TARGETS if not (d == "i8" and t == "sm_103a")]


@functools.cache
def module(which: str):
    return sp.load(KERNELS / f"{which}_gemm_sm100.spk")


def compiled(which: str, dtype: str, target: str):
    return compile_stdlib(f"{which}_gemm_sm100.spk", f"{which}_gemm_{dtype}", target)


def idesc(which: str, dtype: str, selector: int) -> int:
    a, d, n, _ = CONFIG[(which, dtype)]
    return selector | (int(which == "sparse") << 2) | (d << 4) | (a << 7) | (a << 10) | ((n >> 3) << 17) | (8 << 24)


def selectors(which: str, dtype: str) -> tuple[int, ...]:
    return (0, 1) if which == "sparse" and dtype in ("f16", "bf16", "tf32") else (0,)


@pytest.mark.parametrize("which,dtype,target", CASES)
def test_compiles_to_a_cubin_without_local_memory(which, dtype, target):
    ck = compiled(which, dtype, target)
    sm = get_target(target).sm
    assert elf_sm_arch(ck.cubin) == sm and elf_is_arch_specific(ck.cubin) is True
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    sp_ = ".sp" if which == "sparse" else ""
    assert mma and all(f"tcgen05.mma{sp_}.cta_group::1.kind::{PTX_KIND[dtype]}.collector::a::discard" in ln
                       for ln in mma)
    assert len(mma) == CONFIG[(which, dtype)][3]
    for op in ("tcgen05.alloc", "tcgen05.relinquish_alloc_permit", "tcgen05.dealloc", "tcgen05.commit",
               "tcgen05.ld.sync.aligned.32x32b", "elect.sync", "cp.async.bulk.tensor.2d.global.shared::cta"):
        assert op in ck.ptx, op
    assert ("tcgen05.cp.cta_group::1.128x128b" in ck.ptx) == (which == "sparse")


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("which,dtype,target", [c for c in CASES if c[2] == "sm_100a"] +
                         [("sparse", "f16", "sm_103a"), ("sparse", "i8", "sm_110a")])
def test_ptxas_accepts_the_ptx(which, dtype, target):
    proc = assemble_with_ptxas(compiled(which, dtype, target).ptx, get_target(target))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(nvdisasm_path() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("which,dtype,target", CASES)
def test_sass_shows_the_utc_mma_with_our_descriptors(which, dtype, target):
    sass = nvdisasm_sass(compiled(which, dtype, target).cubin)
    assert sass is not None
    mma = [ln for ln in sass.splitlines() if re.search(r"\bUTC\w*MMA\b", ln)]
    assert len(mma) == CONFIG[(which, dtype)][3]
    assert all(SASS_MMA[dtype] in ln and "gdesc" in ln and "idesc" in ln for ln in mma)
    immediates = {int(x, 16) for x in re.findall(r"\bUMOV UR\d+, (0x[0-9a-f]+)", sass)}
    want = {idesc(which, dtype, s) for s in selectors(which, dtype)}
    assert want <= immediates, sorted(hex(x) for x in immediates)
    if which == "sparse":  # every idesc the MMAs use has the sparse bit: the dense twin value is absent
        assert not {w & ~0b111 for w in want} & immediates
    assert not re.search(r"\b(LDL|STL)\b", sass)
    assert "UTCCP" in sass if which == "sparse" else "UTCCP" not in sass


def test_i8_is_refused_where_the_kind_does_not_exist():
    with pytest.raises(CompileError) as info:
        compiled("sparse", "i8", "sm_103a")
    d = info.value.diagnostics[0]
    assert d.code == "SP0602" and "kind::i8" in d.message and "sm_100a, sm_110a" in (d.help or "")


def test_accumulator_goes_to_shared_memory_without_a_conversion():
    """Seed 002: the epilogue stores the tile tcgen05.ld produced (cast to f16) straight into the
    swizzled shared buffer the TMA store reads; no layout conversion is written or inserted."""
    ir = compiled("sparse", "f16", "sm_100a").ir
    assert "convert_layout" not in ir
    lines = ir.splitlines()
    loads = [i for i, ln in enumerate(lines) if "tmem.load" in ln]
    assert len(loads) == 2  # BN / EPI_N slices
    for i in loads:
        lay = lines[i].split("#", 1)[1]
        assert "arith.cast" in lines[i + 1] and lines[i + 1].split("#", 1)[1] == lay
        assert "smem.store" in lines[i + 2]


# ------------------------------------------------------------------------------------------------
# Golden PTX snapshots (reviewed by reading; regenerate deliberately with SPARSILE_UPDATE_GOLDEN=1)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f16", "e4m3", "i8"])
def test_sparse_gemm_ptx_matches_the_golden_snapshot(dtype):
    ptx = compiled("sparse", dtype, "sm_100a").ptx
    check_golden(ptx, f"sparse_gemm_sm100_{dtype}.sm_100a.ptx")
