"""The block-scaled sparse GEMM (stdlib/kernels/sparse_gemm_sm100_mx.spk) on every target that has
kind::mxf8f6f4 (sm_100a, sm_103a, sm_110a): a cubin through nvJitLink with no local memory, PTX
that ptxas accepts, and SASS (nvdisasm) with the block-scaled UTCQMMAs carrying the instruction
descriptors written by hand from PTX ISA Table 43, the scale-factor copies (UTCCP 4x32dp128bit) and
the metadata copies (128dp128bit). Nothing of it ran on a Blackwell GPU (docs/blackwell.md §8)."""

from __future__ import annotations

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
from sparsile.frontend.ir import types as T
from sparsile.frontend.sema.core import ArgSpec
from sparsile.target.targets import get_target
from sparsile.tests.golden_ptx import check_golden
from sparsile.tests.support import compile_stdlib

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
TARGETS = ("sm_100a", "sm_103a", "sm_110a")


def compiled(target: str, bn: int = 128):
    return compile_stdlib("sparse_gemm_sm100_mx.spk", "sparse_gemm_mxf8", target, BN=bn, STAGES=2 if bn == 256 else 3)


def idesc(n: int, sf: int) -> int:
    """Table 43: sparse (bit 2), B scale id 4-5, e4m3 A/B (0), N>>3 at 17, UE8M0 at 23, M>>7 at 27,
    A scale id 29-30."""
    return (1 << 2) | (sf << 4) | ((n >> 3) << 17) | (1 << 23) | ((128 >> 7) << 27) | (sf << 29)


@pytest.mark.parametrize("target", TARGETS)
def test_compiles_to_a_cubin_without_local_memory(target):
    ck = compiled(target)
    assert elf_sm_arch(ck.cubin) == get_target(target).sm and elf_is_arch_specific(ck.cubin) is True
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == 4  # one stage of K = 256: four sparse instructions of K = 64
    assert all("tcgen05.mma.sp.cta_group::1.kind::mxf8f6f4.block_scale.block32" in ln for ln in mma)
    assert ck.ptx.count("tcgen05.cp.cta_group::1.32x128b.warpx4") == 2  # A and B scale atoms (BN = 128)
    assert ck.ptx.count("tcgen05.cp.cta_group::1.128x128b") == 2  # two metadata atoms


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("target", TARGETS)
def test_ptxas_accepts_the_ptx(target):
    proc = assemble_with_ptxas(compiled(target).ptx, get_target(target))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(nvdisasm_path() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("target,bn", [(t, 128) for t in TARGETS] + [("sm_100a", 256)])
def test_sass_shows_the_block_scaled_utc_mmas(target, bn):
    sass = nvdisasm_sass(compiled(target, bn).cubin)
    assert sass is not None
    mma = [ln for ln in sass.splitlines() if re.search(r"\bUTC\w*MMA\b", ln)]
    assert len(mma) == 4 and all("UTCQMMA" in ln and "idesc" in ln for ln in mma)
    # the block-scaled form: a trailing TMEM operand (the A/B scale addresses as one register pair)
    # after the descriptor, which the unscaled UTCQMMA of sparse_gemm_sm100.spk does not have
    assert all(re.search(r"idesc\[UR\d+\], tmem\[UR\d+\]", ln) for ln in mma), mma
    immediates = {int(x, 16) for x in re.findall(r"\bUMOV UR\d+, (0x[0-9a-f]+)", sass)}
    want = {idesc(bn, sf) for sf in range(4)}
    assert want <= immediates, sorted(hex(x) for x in immediates)
    assert len(re.findall(r"UTCCP\.T\.S\.4x32dp128bit", sass)) == 1 + bn // 128  # A atom, B atoms
    assert len(re.findall(r"UTCCP\.T\.S\.128dp128bit", sass)) == 2
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_bn_must_be_whole_scale_atoms():
    kern = sp.load(KERNELS / "sparse_gemm_sm100_mx.spk").sparse_gemm_mxf8
    sig = {p.name: ArgSpec(p.annotation, True) for p in kern.params if p.annotation is not T.CONSTEXPR}
    with pytest.raises(CompileError, match="multiple of 128"):
        kern.compile({**sig, "BN": 64}, target="sm_100a", stop_after="ir")


def test_not_on_targets_without_tcgen05():
    with pytest.raises(CompileError) as info:
        compiled("sm_90a")
    assert any(d.code == "SP0602" for d in info.value.diagnostics)


def test_mx_kernel_ptx_matches_the_golden_snapshot():
    """Reviewed by reading: scale atoms copied with `tcgen05.cp.32x128b.warpx4`, the block-scaled
    sparse MMAs with per-step scale ids in their instruction descriptors."""
    check_golden(compiled("sm_100a").ptx, "sparse_gemm_sm100_mx.sm_100a.ptx")
