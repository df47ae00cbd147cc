"""The tile size limit (SP0344, 2**20 elements as Triton's ``TRITON_MAX_TENSOR_NUMEL``): reported at
the user's line in a ``.spk`` file and in an ``@sparsile.jit`` function, with its fix; a tile of
exactly 2**20 elements is accepted (docs/language.md, "Tiles, shapes and broadcasting", says what
such a tile costs to compile)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import sparsile as sp
from sparsile.driver.compiler import compile_kernel

SPK = """\
@kernel
def k(x: ptr[f32], out: ptr[f16], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    store(out + offs, load(x + offs, mask=offs < n).to(f16), mask=offs < n)
"""
SIG = "x=ptr[f32], out=ptr[f16], n=i32, BLOCK={}"


def test_spk_tile_over_the_limit_is_sp0344_at_its_line() -> None:
    k = sp.loads(SPK, "limit.spk").kernels["k"]
    with pytest.raises(sp.CompileError) as info:
        compile_kernel(k, SIG.format(1 << 21), stop_after="ir", cache=False)
    d = info.value.diagnostics[0]
    assert d.code == "SP0344"
    assert d.message == "a tile of shape (2097152,) has 2097152 elements; the limit is 1048576 (2**20)"
    assert d.help == "split the work over more programs or a loop"
    assert (d.span.source.name, d.span.line, d.span.col) == ("limit.spk", 3, 36)  # the `arange`
    assert "limit.spk:3:36" in str(info.value)


def test_spk_tile_at_the_limit_compiles() -> None:
    k = sp.loads(SPK, "limit.spk").kernels["k"]
    ck = compile_kernel(k, SIG.format(1 << 20), stop_after="ir", cache=False)
    assert "arange {end=1048576, start=0} : tile<1048576xi32>" in ck.ir


def test_jit_tile_over_the_limit_is_sp0344_at_its_line() -> None:
    @sp.jit
    def big(x, out, n, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        sp.store(out + offs, sp.load(x + offs, mask=offs < n), mask=offs < n)

    x = np.ones(16, np.float32)
    with pytest.raises(sp.CompileError) as info:
        big.ir(x, x, 16, BLOCK=1 << 21)
    lines, first = inspect.getsourcelines(test_jit_tile_over_the_limit_is_sp0344_at_its_line)
    want_line = first + next(i for i, ln in enumerate(lines) if "sp.arange(0, BLOCK)" in ln)
    want_col = lines[want_line - first].index("sp.arange(0, BLOCK)") + 1
    d = info.value.diagnostics[0]
    assert d.code == "SP0344"
    assert d.message == "a tile of shape (2097152,) has 2097152 elements; the limit is 1048576 (2**20)"
    assert d.help == "split the work over more programs or a loop"
    assert (d.span.file_line, d.span.file_col) == (want_line, want_col)
    assert f"test_tile_limit.py:{want_line}:{want_col}" in str(info.value)
    assert big.ir(x, x, 16, BLOCK=1 << 20)  # exactly 2**20 elements: accepted
