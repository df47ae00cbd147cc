"""Shape builtins on scalars (frontend/ops/shape.py): ``trans`` / ``permute`` of a scalar is the scalar,
``reshape`` of a scalar to ``()`` is the scalar, ``reshape`` of a tile to ``()`` is SP0319.

Found by the generated-program mutation fuzzer (scripts/fuzz_mutants.py, a stored value replaced by
``trans(1)``): these made a 0-d tile type, which layout inference met with "ValueError: scalars have
no layout", a traceback from the compiler's internals for every target."""

from __future__ import annotations

import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.diagnostics import CompileError
from sparsile.tests.support.compile import compile_src

SCALAR = """
@kernel
def k(O: ptr[f32], x: f32):
    y = {expr}
    store(O + arange(0, 4), y + 1.0)
"""


@pytest.mark.parametrize("expr", ["trans(x)", "permute(x)", "permute(x, ())", "reshape(x, ())", "trans(2.5)",
                                  "trans(reshape(x, ()))"])
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_a_scalar_through_a_shape_builtin_stays_a_scalar(expr: str, target: str) -> None:
    src = SCALAR.format(expr=expr)
    assert "st.global" in compile_src(src, target).ptx
    x = np.float32(0.3) if "2.5" not in expr else np.float32(2.5)
    out = np.full(4, np.nan, np.float32)
    sp.loads(src, "case.spk").k.interpret[(1,)](out, np.float32(0.3))
    assert out.tolist() == [float(np.float32(x) + np.float32(1.0))] * 4


def test_reshaping_a_tile_to_no_dimensions_is_sp0319_at_the_shape() -> None:
    src = SCALAR.format(expr="reshape(arange(0, 1), ())")
    with pytest.raises(CompileError) as e:
        compile_src(src, "sm_90a")
    err = e.value
    assert err.code == "SP0319"
    assert err.message == "cannot reshape (1,) (1 element) to (): a tile keeps at least one dimension"
    assert err.span.line == 4 and src.split("\n")[3][err.span.col - 1:err.span.end_col - 1] == "()"
    assert err.help is not None and "max(x, axis=0)" in err.help


def test_a_permutation_of_a_scalar_must_be_empty() -> None:
    with pytest.raises(CompileError) as e:
        compile_src(SCALAR.format(expr="permute(x, (0,))"), "sm_90a")
    assert e.value.code == "SP0319" and e.value.message == "(0,) is not a permutation of the 0 dimensions"
