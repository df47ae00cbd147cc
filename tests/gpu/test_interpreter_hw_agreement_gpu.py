"""The GPU and the interpreter agree bit for bit where they once parted ways (the kernels of
tests/support/hw_agreement_cases.py; the CPU side is tests/frontend/test_interpreter_hw_agreement.py):
the sign of zeros from ``maximum`` / ``minimum`` / ``max`` / ``min`` (PTX orders +0.0 > -0.0), the
flush to zero of ``sigmoid`` and of an f32 ``atomic_add``, and integer -> bf16 rounding once."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from sparsile.tests.support.hw_agreement_cases import (
    ATOMIC_NEW,
    ATOMIC_SRC,
    DOT_SRC,
    INT_BF16_SRC,
    MINMAX_SRC,
    SIGMOID_SRC,
    SIGMOID_X,
    atomic_inputs,
    f16_overflow_inputs,
    int_bf16_inputs,
    kernel,
    minmax_expected,
    minmax_inputs,
    round_to_bf16,
    tf32_inputs,
)

pytestmark = pytest.mark.gpu


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    u = np.dtype(f"u{a.dtype.itemsize}")
    assert a.view(u).tolist() == b.view(u).tolist(), (a, b)


@pytest.mark.parametrize("t", ["f32", "f64", "f16", "bf16", "e4m3"])
def test_signed_zeros_of_max_and_min_match_the_interpreter(t: str) -> None:
    gpu, ref = minmax_inputs(t), minmax_inputs(t)
    k = kernel(MINMAX_SRC.format(t=t))
    k[(1,)](*gpu)
    k.interpret[(1,)](*ref)
    for g, r in zip(gpu[2:], ref[2:], strict=True):
        _same_bits(g, r)
    want = minmax_expected()
    got = gpu[2].astype(np.float64)
    assert np.signbit(got).tolist() == np.signbit(np.array(want["max"])).tolist()


def test_sigmoid_flush_matches_the_interpreter() -> None:
    x = np.array(SIGMOID_X, np.float32)
    k = kernel(SIGMOID_SRC)
    y_gpu, yb_gpu = np.full(8, 7.0, np.float32), np.full(8, 7.0, ml_dtypes.bfloat16)
    y_ref, yb_ref = y_gpu.copy(), yb_gpu.copy()
    k[(1,)](x, y_gpu, yb_gpu)
    k.interpret[(1,)](x, y_ref, yb_ref)
    assert (y_gpu[:4] == 0).all() and (y_ref[:4] == 0).all()  # flushed in both
    # the GPU's sigmoid is rcp.approx(1 + ex2.approx(-x * log2(e))) (backend/lower/elementwise.py): the
    # f32 product's rounding (half an ulp of |x| log2(e)) moves the result by up to |x| * 2**-24 relatively
    # (log2(e) ln(2) = 1), ex2.approx and rcp.approx by a few ulp more (measured on an H100: 2.6e-6 at x = -87.5)
    bound = (np.abs(x[4:]).astype(np.float64) + 4) * 2.0**-24
    rel = np.abs(y_gpu[4:].astype(np.float64) - y_ref[4:]) / np.abs(y_ref[4:].astype(np.float64))
    assert (rel <= bound).all(), (rel, bound)
    np.testing.assert_allclose(yb_gpu.astype(np.float32), yb_ref.astype(np.float32), rtol=2.0**-7)


def test_f32_atomic_add_flush_matches_the_interpreter() -> None:
    k = kernel(ATOMIC_SRC)
    gpu, ref = atomic_inputs(), atomic_inputs()
    k[(1,)](*gpu)
    k.interpret[(1,)](*ref)
    _same_bits(gpu[0], ref[0])  # memory after the add
    _same_bits(gpu[2], ref[2])  # the old values
    assert gpu[0].astype(np.float64).tolist() == ATOMIC_NEW


@pytest.mark.parametrize("s", ["i32", "u32", "i64", "u64"])
def test_integer_to_bf16_matches_the_interpreter(s: str) -> None:
    x = int_bf16_inputs(s)
    k = kernel(INT_BF16_SRC.format(s=s))
    gpu = np.full(8, 7.0, np.float32).astype(ml_dtypes.bfloat16)
    ref = gpu.copy()
    k[(1,)](x, gpu)
    k.interpret[(1,)](x, ref)
    _same_bits(gpu, ref)
    assert gpu.astype(np.float64).tolist() == [round_to_bf16(int(v)) for v in x]


def test_f64_to_bf16_matches_the_interpreter() -> None:
    """f64 -> bf16 rounds once on the GPU (``cvt.rn.bf16.f64``, or the round-to-odd sequence below
    sm_90) and in the interpreter: values just above a bf16 tie that rounding through f32 moves onto it."""
    x = np.array([2.0**24 + 2**16 + 1, 1.0 + 2**-8 + 2**-40, -(2.0**100) * (1 + 2**-8 + 2**-35), 3.3961e38,
                  2.0**-134 * (1 + 2**-30), 1e39, -1.5, 2.0**-140 * (1 + 2**-8 + 2**-31)], np.float64)
    k = kernel(INT_BF16_SRC.format(s="f64"))
    gpu = np.full(8, 7.0, np.float32).astype(ml_dtypes.bfloat16)
    ref = gpu.copy()
    k[(1,)](x, gpu)
    k.interpret[(1,)](x, ref)
    _same_bits(gpu, ref)
    assert gpu.astype(np.float64)[0] == 2.0**24 + 2**17


def test_f16_accumulator_of_a_tile_dot_matches_the_interpreter() -> None:
    """f16 partial sums past 65504 (131072 after K = 16): the tile dot carries the accumulator in f32
    and rounds once, on the GPU and in the interpreter (8.0 everywhere, no inf)."""
    k = kernel(DOT_SRC.format(t="f16", acc="f16"))
    a, b, gpu = f16_overflow_inputs()
    ref = gpu.copy()
    k[(1,)](a, b, gpu)
    k.interpret[(1,)](a, b, ref)
    _same_bits(gpu, ref)
    assert (gpu == 8.0).all()


def test_tf32_rounding_of_a_tile_dot_matches_the_interpreter() -> None:
    """f32 operands whose low 13 bits make cvt.rna (1 + 2**-10) and truncation (1) differ."""
    k = kernel(DOT_SRC.format(t="f32", acc="f32"))
    a, b, gpu = tf32_inputs()
    ref = gpu.copy()
    k[(1,)](a, b, gpu)
    k.interpret[(1,)](a, b, ref)
    _same_bits(gpu, ref)
    assert np.diag(gpu).tolist() == [1 + 2.0**-10] * 16
