"""Issue 3, acceptance 1: the examples compile to cubin for sm_80, sm_90a and sm_100a on a machine
without a GPU; the cubin is a CUDA ELF for that SM made by nvJitLink, and ptxas (when present)
accepts the same PTX."""

from __future__ import annotations

from pathlib import Path

import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import assemble_with_ptxas, elf_sm_arch, is_cuda_elf, ptxas_available
from sparsile.driver.compiler import compile_kernel
from sparsile.frontend.ir import types as T
from sparsile.target.targets import get_target

ROOT = Path(__file__).resolve().parents[2]
P32 = T.PointerType(T.f32)
EXAMPLES = [
    ("vector_add.spk", "vector_add", {"x": P32, "y": P32, "out": P32, "n": T.i32, "BLOCK": 1024}),
    ("softmax.spk", "softmax", None),
    ("transpose.spk", "transpose", None),
]


def _signature(kernel) -> dict:
    sig = {}
    for p in kernel.params:
        if p.annotation is T.CONSTEXPR:
            sig[p.name] = p.default if p.has_default else 64
        else:
            sig[p.name] = p.annotation
    return sig


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("file,name,sig", EXAMPLES)
def test_example_compiles(target, file, name, sig):
    kernel = getattr(sp.load(ROOT / "examples" / file), name)
    ck = compile_kernel(kernel, sig or _signature(kernel), target=target)
    assert is_cuda_elf(ck.cubin)
    assert elf_sm_arch(ck.cubin) == get_target(target).sm
    assert ck.ptx.lstrip().startswith("//") and f".target {target}" in ck.ptx
    if ptxas_available():
        res = assemble_with_ptxas(ck.ptx, get_target(target))
        assert res.returncode == 0, res.stderr


def test_kernel_compile_takes_a_signature_text():
    """``kernel.compile`` accepts the CLI's signature syntax as well as a dict."""
    kernel = sp.load(ROOT / "examples" / "vector_add.spk").vector_add
    ck = kernel.compile("x=ptr[f32], y=ptr[f32], out=ptr[f32], n=i32, BLOCK=256", target="sm_90a")
    assert elf_sm_arch(ck.cubin) == 90
    same = kernel.compile({"x": P32, "y": P32, "out": P32, "n": T.i32, "BLOCK": 256}, target="sm_90a")
    other = kernel.compile({"x": P32, "y": P32, "out": P32, "n": T.i32, "BLOCK": 1024}, target="sm_90a")
    assert ck.ptx == same.ptx != other.ptx


def test_kernel_compile_rejects_a_signature_of_another_kind():
    from sparsile.frontend.diagnostics import LaunchError

    kernel = sp.load(ROOT / "examples" / "vector_add.spk").vector_add
    with pytest.raises(LaunchError) as err:
        kernel.compile(["x"], target="sm_90a")
    assert err.value.code == "SP0724" and "must be a dict or a text" in str(err.value)
