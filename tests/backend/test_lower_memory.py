"""Global loads and stores (backend/lower/memory.py): predicated accesses and their ``other`` values.

Found by the generated-program mutation fuzzer (scripts/fuzz_mutants.py): a masked load of a
``ptr[bool]`` with an ``other=`` value packed the i1 ``other`` with ``bitcast i1 to i8``, which LLVM
refuses (an internal error for any `load(P, mask=m, other=...)` of bools)."""

from __future__ import annotations

import re

import pytest

from sparsile.tests.support.compile import compile_src

BOOL_LOAD = """
@kernel
def k(X: ptr[bool], O: ptr[{out}], n: i32):
    offs = arange(0, {n})
    x = load(X + offs{scalar}, mask=offs{scalar} < n, other={other})
    store(O + offs{scalar}, x.to({out}){mask})
"""


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [16, 128, 512])
@pytest.mark.parametrize("other", ["True", "False", "3", "-0.0"])
def test_a_masked_bool_load_with_other_compiles(target: str, n: int, other: str) -> None:
    ptx = compile_src(BOOL_LOAD.format(n=n, other=other, out="f16", scalar="", mask=""), target).ptx
    assert re.search(r"@%p\d+ ld\.global(\.v\d)?\.b(8|16|32)", ptx), ptx


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_masked_scalar_bool_load_with_other_compiles(target: str) -> None:
    src = BOOL_LOAD.format(n=16, other="True", out="i32", scalar="[0]", mask="")
    src = src.replace("offs[0]", "3")
    ptx = compile_src(src, target).ptx
    assert re.search(r"@%p\d+ ld\.global\.b(8|16)", ptx), ptx
