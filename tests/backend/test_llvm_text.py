"""LLVM literals of float constants (backend/lower/llvm_text.py): a value beyond the type's range is
its infinity (rounded to nearest, as the conversion at run time), without a numpy overflow warning.

Found by the generated-program mutation fuzzer (scripts/fuzz_mutants.py runs with warnings as
errors): ``load(P_f16, mask=m, other=1e30)`` compiled with "RuntimeWarning: overflow encountered in
cast" from the f16 literal (the f32 one already silenced it), and the interpreter's constant
warned the same way (an internal error where warnings are errors)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import sparsile as sp
from sparsile.backend.lower.llvm_text import float_literal
from sparsile.tests.support.compile import compile_src


@pytest.mark.parametrize(("value", "ty", "want"), [
    (1e30, "half", "0xH7C00"), (-1e30, "half", "0xHFC00"), (65504.0, "half", "0xH7BFF"),
    (1e300, "bfloat", "0xR7F80"), (-1e300, "bfloat", "0xRFF80"), (1e300, "float", "0x7FF0000000000000"),
])
def test_an_out_of_range_float_literal_is_infinity_without_a_warning(value: float, ty: str, want: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float_literal(value, ty) == want


SRC = """
@kernel
def k(X: ptr[{t}], O: ptr[{t}], n: i32):
    offs = arange(0, 16)
    store(O + offs, load(X + offs, mask=offs < n, other={other}))
"""


@pytest.mark.parametrize(("t", "other"), [("f16", "1e30"), ("f16", "-1e30"), ("bf16", "1e300")])
def test_a_load_of_f16_with_a_huge_other_compiles_and_reads_infinity(t: str, other: str) -> None:
    src = SRC.format(t=t, other=other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for target in ("sm_90a", "sm_80"):
            assert "ld.global" in compile_src(src, target, cache=False).ptx
    dt = sp.frontend.ir.types.numpy_dtype(sp.frontend.ir.types.SCALAR_TYPES[t])
    x = np.random.default_rng(0).uniform(-2, 2, 16).astype(dt)
    out = np.full(16, 7, dt)
    with warnings.catch_warnings():  # the interpreter's constant too
        warnings.simplefilter("error")
        sp.loads(src, "case.spk").k.interpret[(1,)](x, out, np.int32(5))
    want = np.inf if not other.startswith("-") else -np.inf
    assert out[:5].tolist() == x[:5].tolist() and out[5:].astype(np.float64).tolist() == [want] * 11
