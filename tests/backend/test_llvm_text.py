"""LLVM literals of float constants (backend/lower/llvm_text.py): a value beyond the type's range is
its infinity (rounded to nearest, as the conversion at run time), without a numpy overflow warning.

Found by the generated-program mutation fuzzer (scripts/fuzz_mutants.py runs with warnings as
errors): ``load(P_f16, mask=m, other=1e30)`` compiled with "RuntimeWarning: overflow encountered in
cast" from the f16 literal (the f32 one already silenced it), and the interpreter's constant
warned the same way (an internal error where warnings are errors)."""

from __future__ import annotations

import math
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


def _bf16_bits(x: float) -> int:
    """The bits of ``x`` rounded once to bf16, to nearest even (IEEE 754), in exact arithmetic: the
    reference, independent of numpy and ml_dtypes."""
    from fractions import Fraction

    mag = Fraction(abs(x))
    exp = max(math.floor(math.log2(abs(x))), -126)  # (bf16 has f32's exponent range; subnormals below)
    ulp = Fraction(2) ** (exp - 7)
    q = round(mag / ulp) * ulp  # (round of a Fraction: half to even)
    top = (2 - Fraction(2) ** -7) * Fraction(2) ** 127
    bits = 0x7F80 if q > top else int(np.array(float(q), np.float32).view(np.uint32)) >> 16
    return bits | (0x8000 if x < 0 else 0)


BF16_NEAR_TIES = [
    1 + 2**-8 + 2**-40,  # just above a tie: up (through f32 it is the tie, and even is down)
    1 + 3 * 2**-8 - 2**-40,  # just below a tie: down (through f32: the tie, even is up)
    1 + 2**-8,  # the tie itself: to even
    2**24 + 2**16 + 1,  # (f64_to_bf16's docstring: the GPU host's ml_dtypes made it 2**24)
    -(1 + 2**-8 + 2**-40),
    3.3961775e38,  # below bf16 max + half an ulp: bf16 max (through f32 it rounds up to infinity)
    -3.3961775e38,
    3.3961776e38,  # above it: infinity
]

SRC_BF16 = """
@kernel
def k(X: ptr[bf16], O: ptr[bf16], n: i32):
    offs = arange(0, 16)
    store(O + offs, load(X + offs, mask=offs < n, other={other!r}))
"""


@pytest.mark.parametrize("value", BF16_NEAR_TIES)
def test_a_bf16_constant_is_rounded_once_in_the_literal_and_the_interpreter(value: float) -> None:
    """A bf16 constant is the double rounded once to nearest even, as ``cvt.rn.bf16.f64`` and the
    interpreter's casts (numerics.f64_to_bf16) round it. The interpreter's ``arith.constant``
    filled a bf16 array from the Python float, which rounds through f32 (twice): ``other=1 + 2**-8
    + 2**-40`` read 1.0 in the interpreter and 1.0078125 on the GPU, and 3.3961775e38 infinity
    instead of bf16 max; the LLVM literal relied on ml_dtypes' scalar conversion, which rounds
    through f32 in some versions."""
    import ml_dtypes

    want = _bf16_bits(value)
    assert float_literal(value, "bfloat") == f"0xR{want:04X}"
    src = SRC_BF16.format(other=value)
    assert f"0xR{want:04X}" in compile_src(src, stop_after="llvm", cache=False).llvm
    x = np.random.default_rng(7).uniform(-2, 2, 16).astype(ml_dtypes.bfloat16)
    out = np.full(16, np.nan, ml_dtypes.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sp.loads(src, "case.spk").k.interpret[(1,)](x, out, np.int32(5))
    assert out[:5].view(np.uint16).tolist() == x[:5].view(np.uint16).tolist()
    assert out[5:].view(np.uint16).tolist() == [want] * 11
