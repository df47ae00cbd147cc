"""Acceptance of the 2-CTA Blackwell sparse GEMM (stdlib/kernels/sparse_gemm_sm100_2cta.spk):
every kind x legal target (sm_100a; sm_103a and sm_110a where the kind exists) compiles to a
cubin through nvJitLink and to PTX ptxas accepts; the PTX carries the cluster shape and only
``.cta_group::2`` tcgen05 forms; the SASS (nvdisasm) shows the pair MMAs (``UTC*MMA.2CTA``) with
the M = 256 instruction descriptors the compiler computed, pair copies and multicast commits,
TMA loads with the pair qualifier, and no local memory. No Blackwell GPU ran any of this."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
DTYPES = ("f16", "bf16", "e4m3", "i8")
# (A/B type code, D type code) per docs/hardware.md §1.3; default BN = 256 = the pair's N; K step 128
CODES = {"f16": (0, 1), "bf16": (1, 1), "e4m3": (0, 1), "i8": (1, 2)}
MMAS_PER_STEP = {"f16": 4, "bf16": 4, "e4m3": 2, "i8": 2}
SASS_MMA = {"f16": "UTCHMMA", "bf16": "UTCHMMA", "e4m3": "UTCQMMA", "i8": "UTCIMMA"}
PTX_KIND = {"f16": "f16", "bf16": "f16", "e4m3": "f8f6f4", "i8": "i8"}
CASES = [(d, t) for d in DTYPES for t in TARGETS if not (d == "i8" and t == "sm_103a")]


def compiled(dtype: str, target: str):
    return compile_stdlib("sparse_gemm_sm100_2cta.spk", f"sparse_gemm_{dtype}", target)


def idesc(dtype: str, selector: int) -> int:
    ab, d = CODES[dtype]
    return selector | (1 << 2) | (d << 4) | (ab << 7) | (ab << 10) | ((256 >> 3) << 17) | ((256 >> 4) << 24)


@pytest.mark.parametrize("dtype,target", CASES)
def test_compiles_to_a_cluster_cubin_without_local_memory(dtype, target):
    ck = compiled(dtype, target)
    assert elf_sm_arch(ck.cubin) == get_target(target).sm and elf_is_arch_specific(ck.cubin) is True
    assert re.search(r"\b0 bytes lmem", ck.info_log) and "0 bytes spill stores" in ck.info_log
    assert ck.cluster == (2, 1, 1) and ".reqnctapercluster 2, 1, 1" in ck.ptx
    mma = [ln for ln in ck.ptx.splitlines() if "tcgen05.mma" in ln]
    assert len(mma) == MMAS_PER_STEP[dtype]
    assert all(f"tcgen05.mma.sp.cta_group::2.kind::{PTX_KIND[dtype]}.collector::a::discard" in ln for ln in mma)
    assert "cta_group::1" not in ck.ptx  # ptxas rejects a kernel mixing the groups
    for form in ("tcgen05.alloc.cta_group::2", "tcgen05.dealloc.cta_group::2", "tcgen05.cp.cta_group::2.128x128b",
                 "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64",
                 "mbarrier::complete_tx::bytes.cta_group::2", "mapa.shared::cluster", "barrier.cluster.wait"):
        assert form in ck.ptx, form


@pytest.mark.skipif(not ptxas_available(), reason="ptxas is not installed")
@pytest.mark.parametrize("dtype,target", [(d, "sm_100a") for d in DTYPES] + [("f16", "sm_103a"), ("i8", "sm_110a")])
def test_ptxas_accepts_the_ptx(dtype, target):
    proc = assemble_with_ptxas(compiled(dtype, target).ptx, get_target(target))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(nvdisasm_path() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("dtype,target", CASES)
def test_sass_shows_pair_mmas_with_our_descriptors(dtype, target):
    sass = nvdisasm_sass(compiled(dtype, target).cubin)
    assert sass is not None
    mma = [ln for ln in sass.splitlines() if re.search(r"\bUTC\w*MMA\b", ln)]
    assert len(mma) == MMAS_PER_STEP[dtype]
    assert all(f"{SASS_MMA[dtype]}.2CTA" in ln and "gdesc" in ln and "idesc" in ln for ln in mma)
    immediates = {int(x, 16) for x in re.findall(r"\bUMOV UR\d+, (0x[0-9a-f]+)", sass)}
    want = {idesc(dtype, s) for s in ((0, 1) if dtype in ("f16", "bf16") else (0,))}
    assert want <= immediates, sorted(hex(x) for x in immediates)
    assert not {w & ~0b111 for w in want} & immediates  # sparse bit set on every descriptor used
    assert "UTCCP" in sass and re.search(r"UTCCP\S*\.2CTA", sass)
    assert re.search(r"UTCBAR\S*\.2CTA\S*\.MULTICAST", sass)
    assert re.search(r"UTMALDG\.2D\.2CTA", sass)
    assert not re.search(r"\b(LDL|STL)\b", sass)


def test_i8_is_refused_where_the_kind_does_not_exist():
    with pytest.raises(CompileError) as info:
        compiled("i8", "sm_103a")
    d = info.value.diagnostics[0]
    assert d.code == "SP0602" and "kind::i8" in d.message


def test_pair_kernel_is_refused_on_hopper():
    with pytest.raises(CompileError) as info:
        compiled("f16", "sm_90a")
    assert {d.code for d in info.value.diagnostics} == {"SP0602"}


def test_pair_kernel_ptx_matches_the_golden_snapshot():
    """Reviewed by reading: cluster barriers around the pair TMEM allocation, the even CTA's elected
    thread issuing `tcgen05.mma.cta_group::2` and the multicast commit."""
    check_golden(compiled("f16", "sm_100a").ptx, "sparse_gemm_sm100_2cta_f16.sm_100a.ptx")
