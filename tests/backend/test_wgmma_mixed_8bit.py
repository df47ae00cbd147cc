"""8-bit ``sparse_dot`` on the sm_90a wgmma path with A and B of different 8-bit types
(tests/support/sparse_dot_8bit.py): the instruction names both operand types (``.e4m3.e5m2``,
``.s8.u8``; it named A's twice, so B's bytes were read in A's format: sparse fuzzer seeds 27 and 31
on an H100), ptxas and the SASS agree, and the interpreter matches the float64 reference, which tells
a B read in A's format apart (so tests/gpu/test_sparse_dot_8bit_gpu.py can see the defect)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.toolchain.linker import nvdisasm_path, nvdisasm_sass, ptxas_available
from sparsile.tests.support import sparse_dot_8bit as S

WGMMA = re.compile(r"wgmma\.mma_async\.sp\.sync\.aligned\.m64n(\d+)k(\d+)\.(\w+)\.(\w+)\.(\w+) ")


def launch_args(at: str, bt: str, bn: int, bk: int, n: int = 16, k: int = 256) -> tuple[object, dict, list]:
    kern = sp.loads(S.source(at, bt), "case.spk").kernels["k"]
    ops = S.operands(at, bt, 64, n, k, 7)
    consts = {"BM": 64, "BN": bn, "BK": bk}
    return kern, ops, [ops[p.name] if p.name in ops else consts[p.name] for p in kern.params]


@pytest.mark.parametrize("bk", [64, 128])
@pytest.mark.parametrize("bn", [8, 16])
@pytest.mark.parametrize("at,bt", S.PAIRS_8BIT)
def test_wgmma_names_the_type_of_each_operand(at: str, bt: str, bn: int, bk: int) -> None:
    kern, _, args = launch_args(at, bt, bn, bk)
    ptx = kern[(1, 16 // bn)].compile_for("sm_90a", *args).ptx
    found = WGMMA.findall(ptx)
    assert len(found) == bk // 64, ptx  # one m64nNk64 instruction per 64 of K
    acc = "s32" if at in ("i8", "u8") else "f32"
    assert set(found) == {(str(bn), "64", acc, S.PTX_8BIT[at], S.PTX_8BIT[bt])}


@pytest.mark.skipif(not ptxas_available() or nvdisasm_path() is None, reason="needs ptxas and nvdisasm")
@pytest.mark.parametrize("at,bt", S.PAIRS_8BIT)
def test_sass_reads_b_in_its_own_format(at: str, bt: str) -> None:
    kern, _, args = launch_args(at, bt, 8, 128)
    ck = kern[(1, 2)].compile_for("sm_90a", *args)
    sass = nvdisasm_sass(ck.cubin)
    assert sass is not None
    kind = "I" if at in ("i8", "u8") else "Q"
    mmas = re.findall(rf"\b{kind}GMMA\.SP\.64x8x64\.(?:F32\.)?(\w+)\.(\w+) ", sass)
    assert mmas and set(mmas) == {(S.SASS_8BIT[at], S.SASS_8BIT[bt])}, sass


@pytest.mark.parametrize("at,bt", S.PAIRS_8BIT)
def test_interpreter_matches_the_float64_reference(at: str, bt: str) -> None:
    kern, ops, args = launch_args(at, bt, 8, 128)
    kern.interpret[(1, 2)](*args)
    S.check(ops["C"], ops["want"], ops["tol"])


@pytest.mark.parametrize("at,bt", [(a, b) for a, b in S.PAIRS_8BIT if a != b])
def test_the_reference_tells_b_read_in_a_format_apart(at: str, bt: str) -> None:
    """What the GPU computed before the fix (B's bytes in A's format) fails the check."""
    _, ops, _ = launch_args(at, bt, 8, 128)
    a_dtype = np.asarray(ops["A"]).dtype
    wrong_b = np.asarray(ops["B"]).view(a_dtype).astype(np.float64)
    with pytest.raises(AssertionError, match="elements differ"):
        S.check(ops["dense"] @ wrong_b, ops["want"], ops["tol"])
