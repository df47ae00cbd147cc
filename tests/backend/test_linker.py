"""Tests for backend/toolchain/linker.py: nvJitLink linking, cubin inspection, optional ptxas/nvdisasm."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from sparsile.backend.toolchain import linker as K
from sparsile.backend.toolchain.llvm_to_ptx import llvm_ir_to_ptx
from sparsile.frontend.diagnostics import CompileError, InternalError
from sparsile.target.targets import TARGETS, get_target

VADD_IR = """
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
define ptx_kernel void @vadd(ptr addrspace(1) %a, ptr addrspace(1) %b, ptr addrspace(1) %c) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %blk = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %base = mul i32 %blk, 128
  %i = add i32 %base, %t
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %i
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %i
  %x = load float, ptr addrspace(1) %pa
  %y = load float, ptr addrspace(1) %pb
  %s = fadd float %x, %y
  store float %s, ptr addrspace(1) %pc
  ret void
}
"""

BAD_PTX = """.version 8.8
.target sm_90a
.address_size 64
.visible .entry k()
{
  bogus.instr %r1;
  ret;
}
"""


@pytest.fixture(scope="module")
def vadd_ptx() -> dict[str, str]:
    return {name: llvm_ir_to_ptx(VADD_IR, target) for name, target in TARGETS.items()}


@pytest.mark.parametrize("name", ["sm_80", "sm_90a", "sm_100a"])
def test_vector_add_links_to_a_cubin(name, vadd_ptx):
    target = get_target(name)
    result = K.ptx_to_cubin(vadd_ptx[name], target)
    assert K.is_cuda_elf(result.cubin)
    assert K.elf_sm_arch(result.cubin) == target.sm
    assert f"Compiling entry function 'vadd' for '{name}'" in result.info_log
    assert "registers" in result.info_log


@pytest.mark.parametrize("name", list(TARGETS))
def test_sm_decoding_for_every_target(name, vadd_ptx):
    """The e_flags / .nv.compat encoding documented in linker.py holds for every target."""
    target = TARGETS[name]
    cubin = K.ptx_to_cubin(vadd_ptx[name], target, verbose=False).cubin
    assert (cubin[7], cubin[8]) == (0x41, 8)  # EI_OSABI, EI_ABIVERSION of the current CUDA ELF ABI
    assert K.elf_sm_arch(cubin) == target.sm
    assert K.elf_is_arch_specific(cubin) is target.arch_specific


def test_non_verbose_link_has_quiet_log(vadd_ptx):
    result = K.ptx_to_cubin(vadd_ptx["sm_90a"], get_target("sm_90a"), verbose=False, opt_level=0)
    assert K.is_cuda_elf(result.cubin)
    assert "Compiling entry function" not in result.info_log


@pytest.mark.skipif(not K.ptxas_available(), reason="ptxas not installed")
@pytest.mark.parametrize("name", ["sm_80", "sm_90a", "sm_100a", "sm_110a"])
def test_ptxas_accepts_the_same_ptx(name, vadd_ptx):
    proc = K.assemble_with_ptxas(vadd_ptx[name], get_target(name))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not K.ptxas_available(), reason="ptxas not installed")
def test_ptxas_rejects_bad_ptx():
    proc = K.assemble_with_ptxas(BAD_PTX, get_target("sm_90a"))
    assert proc.returncode != 0
    assert "bogus" in proc.stderr


def test_bad_ptx_gives_sp0610_with_log():
    with pytest.raises(CompileError) as info:
        K.ptx_to_cubin(BAD_PTX, get_target("sm_90a"), name="bad.ptx")
    diag = info.value.diagnostics[0]
    assert diag.code == "SP0610"
    assert "bad.ptx" in diag.message and "sm_90a" in diag.message
    assert any("bogus" in note for note in diag.notes)
    assert "Traceback" not in str(info.value)


def test_arch_specific_ptx_is_not_forward_compatible(vadd_ptx):
    """§7: sm_90a PTX does not compile for sm_100a; sm_100f PTX does compile for sm_103a."""
    with pytest.raises(CompileError) as info:
        K.ptx_to_cubin(vadd_ptx["sm_90a"], get_target("sm_100a"))
    assert info.value.codes == ["SP0610"]
    assert any("future architecture" in note for note in info.value.diagnostics[0].notes)
    cubin = K.ptx_to_cubin(vadd_ptx["sm_100f"], get_target("sm_103a")).cubin
    assert K.elf_sm_arch(cubin) == 103


def test_unknown_arch_option_is_a_diagnostic(vadd_ptx):
    fake = dataclasses.replace(get_target("sm_90a"), nvjitlink_arch="-arch=sm_999")
    with pytest.raises(CompileError) as info:
        K.ptx_to_cubin(vadd_ptx["sm_90a"], fake)
    assert info.value.codes == ["SP0610"]
    assert "refused the options" in info.value.diagnostics[0].message


def test_bad_opt_level():
    with pytest.raises(InternalError):
        K.ptx_to_cubin(BAD_PTX, get_target("sm_90a"), opt_level=7)


def test_missing_nvjitlink_is_a_diagnostic(monkeypatch, tmp_path):
    from sparsile.backend.toolchain import nvjitlink

    monkeypatch.setenv(nvjitlink.ENV_LIBRARY, str(tmp_path / "libnvJitLink.so.missing"))
    nvjitlink._load.cache_clear()
    try:
        with pytest.raises(CompileError) as info:
            K.ptx_to_cubin(BAD_PTX, get_target("sm_90a"))
    finally:
        nvjitlink._load.cache_clear()
    assert info.value.codes == ["SP0611"]
    assert "libnvJitLink.so.missing" in info.value.diagnostics[0].message
    assert "nvidia-nvjitlink" in info.value.diagnostics[0].help


def test_nvjitlink_version():
    major, minor = K.nvjitlink_version()
    assert major >= 12 and minor >= 0


def test_is_cuda_elf_rejects_other_files(vadd_ptx):
    assert not K.is_cuda_elf(b"")
    assert not K.is_cuda_elf(b"\x7fELF" + bytes(60))
    assert not K.is_cuda_elf(vadd_ptx["sm_90a"].encode())
    with open(sys.executable, "rb") as f:  # a host ELF: right magic, wrong machine
        host = f.read(64)
    assert not K.is_cuda_elf(host)
    with pytest.raises(ValueError):
        K.elf_sm_arch(host)


def test_nvdisasm(vadd_ptx, monkeypatch):
    cubin = K.ptx_to_cubin(vadd_ptx["sm_90a"], get_target("sm_90a")).cubin
    if K.nvdisasm_path() is not None:
        sass = K.nvdisasm_sass(cubin)
        assert sass is not None
        assert ".target\tsm_90a" in sass or ".target sm_90a" in sass
        assert "EXIT" in sass
        assert K.nvdisasm_sass(b"not a cubin") is None
    monkeypatch.setattr(K, "nvdisasm_path", lambda: None)
    assert K.nvdisasm_sass(cubin) is None


@pytest.mark.gpu
def test_compiling_does_not_initialize_the_cuda_driver():
    """With its own cache nvJitLink would call cuInit (185 ms on the H200 host) and load libcuda in
    a process that only compiles; sparsile links with -no-cache (K.NO_CACHE)."""
    import os
    import subprocess
    from pathlib import Path

    code = (
        "import sys, sparsile\n"
        "k = sparsile.load(sys.argv[1]).kernels['vector_add']\n"
        "k.compile('x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32', target='sm_90a')\n"
        "print(any('libcuda.so' in line for line in open('/proc/self/maps')))\n")
    example = Path(__file__).resolve().parents[2] / "examples" / "vector_add.spk"
    proc = subprocess.run([sys.executable, "-c", code, str(example)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPARSILE_CACHE_DIR": "off"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


SETMAXNREG_PTX = """.version 8.7
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p)
.maxntid 384, 1, 1
.minnctapersm 1
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<3>;
  .reg .pred %p<2>;
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 128;
  @%p1 bra PRODUCER;
  setmaxnreg.inc.sync.aligned.u32 240;
  bra.uni DONE;
PRODUCER:
  setmaxnreg.dec.sync.aligned.u32 40;
DONE:
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  st.global.u32 [%rd2], %r1;
  ret;
}
"""
"""A warp-specialized entry that moves registers between warpgroups (PTX ISA, setmaxnreg): its
register count at entry is known (.maxntid with .minnctapersm), as whole-program ptxas needs."""


def test_nvjitlink_drops_setmaxnreg():
    """docs/hopper.md: nvJitLink compiles PTX as a relocatable unit (ptxas --compile-only), where
    ptxas ignores setmaxnreg (info C7504), with every option that could change it. If a future
    nvJitLink keeps it, this test fails and the kernels can use register reallocation."""
    sm90 = get_target("sm_90a")
    for extra in ((), ("-Xptxas=--extensible-whole-program",), ("-kernels-used=k",)):
        linked = K._library().link_ptx(SETMAXNREG_PTX.encode(), [sm90.nvjitlink_arch, "-O3", "-verbose", *extra],
                                       "k.ptx")
        assert "C7504" in linked.info_log, extra
        sass = K.nvdisasm_sass(linked.cubin)
        if sass is not None:
            assert "SETMAXREG" not in sass


@pytest.mark.skipif(not K.ptxas_available(), reason="ptxas is not installed (the PyPI wheel nvidia-cuda-nvcc has one)")
def test_whole_program_ptxas_keeps_setmaxnreg(tmp_path):
    """The same PTX through ptxas without --compile-only keeps it (USETMAXREG in the SASS)."""
    import subprocess

    src, out = tmp_path / "k.ptx", tmp_path / "k.cubin"
    src.write_text(SETMAXNREG_PTX)
    done = subprocess.run([K.ptxas_path(), "-arch=sm_90a", str(src), "-o", str(out)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "C7504" not in done.stdout + done.stderr
    sass = K.nvdisasm_sass(out.read_bytes())
    if sass is None:
        pytest.skip("nvdisasm is not installed")
    assert "USETMAXREG.TRY_ALLOC" in sass and "USETMAXREG.DEALLOC" in sass
