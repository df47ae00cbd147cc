"""Kernels and inputs where the interpreter once computed other numbers than the GPU code: the sign
of a zero from ``maximum`` / ``minimum`` and the ``max`` / ``min`` reductions (PTX ``max`` / ``min``
order ``+0.0 > -0.0``), the flush to zero of ``sigmoid``'s ``rcp.approx.ftz`` and of ``atomic_add``
on f32 (``atom.global.add.f32``), and integer -> bf16 conversions, which must round once. The CPU
tests (tests/frontend/test_interpreter_hw_agreement.py) check the interpreter against values
computed here independently; the GPU tests (tests/gpu/test_interpreter_hw_agreement_gpu.py) run
the same kernels compiled and compare them with the interpreter bit for bit."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

import sparsile as sp

NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
         "e4m3": ml_dtypes.float8_e4m3fn}

MINMAX_SRC = """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], MX: ptr[{t}], MN: ptr[{t}], RELU: ptr[{t}], RMX: ptr[{t}], RMN: ptr[{t}]):
    i = arange(0, 8)
    a = load(A + i)
    b = load(B + i)
    store(MX + i, maximum(a, b))
    store(MN + i, minimum(a, b))
    store(RELU + i, maximum(a, 0.0))
    z = reshape(a, (4, 2))
    store(RMX + arange(0, 4), max(z, axis=1))
    store(RMN + arange(0, 4), min(z, axis=1))
"""

MINMAX_A = [-0.0, 0.0, -0.0, 0.0, -0.0, np.nan, 1.0, -0.0]
MINMAX_B = [0.0, -0.0, -0.0, 0.0, np.nan, -0.0, -0.0, -1.0]


def minmax_inputs(t: str) -> tuple[np.ndarray, ...]:
    """(a, b, and five outputs poisoned with 7) for :data:`MINMAX_SRC` of element type ``t``."""
    dt = NUMPY[t]
    a, b = np.array(MINMAX_A, np.float64).astype(dt), np.array(MINMAX_B, np.float64).astype(dt)
    return (a, b, *(np.full(n, 7.0, np.float64).astype(dt) for n in (8, 8, 8, 4, 4)))


def minmax_expected() -> dict[str, list[float]]:
    """The values :data:`MINMAX_SRC` stores, by output, with PTX's rule that ``+0.0 > -0.0`` and a
    NaN operand gives the other one (PTX ISA 9.1, §9.7.3.11 / §9.7.3.12), written out by hand."""
    return {
        "max": [0.0, 0.0, -0.0, 0.0, -0.0, -0.0, 1.0, -0.0],
        "min": [-0.0, -0.0, -0.0, 0.0, -0.0, -0.0, -0.0, -1.0],
        "relu": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        # rows of a: (-0, 0), (-0, 0), (-0, NaN), (1, -0)
        "rmax": [0.0, 0.0, -0.0, 1.0],
        "rmin": [-0.0, -0.0, -0.0, -0.0],
    }


SIGMOID_SRC = """
@kernel
def k(X: ptr[f32], Y: ptr[f32], YB: ptr[bf16]):
    i = arange(0, 8)
    x = load(X + i)
    store(Y + i, sigmoid(x))
    store(YB + i, sigmoid(x.to(bf16)))
"""

SIGMOID_X = [-87.5, -87.9, -88.5, -100.0, -87.0, -86.0, -80.0, 0.0]
"""Inputs around -87.34, where the exact sigmoid crosses 2**-126: below it the GPU's
``rcp.approx.ftz.f32`` flushes the subnormal result to 0."""


def sigmoid_exact(x: float) -> float:
    """``1 / (1 + e**-x)`` in float64 (far more precise than an f32 ulp)."""
    return 1.0 / (1.0 + float(np.exp(np.float64(-x))))


ATOMIC_SRC = """
@kernel
def k(P: ptr[f32], V: ptr[f32], OLD: ptr[f32]):
    i = arange(0, 8)
    store(OLD + i, atomic_add(P + i, load(V + i)))
"""

TINY = float(np.float32(1e-39))  # an f32 subnormal
ATOMIC_P = [TINY, 1.0, 0.0, -3 * TINY, 1.5e-38, 2.0, -TINY, 5.0]
ATOMIC_V = [0.0, TINY, 2 * TINY, 0.0, -1.4e-38, 3.0, -TINY, -5.0]
ATOMIC_NEW = [0.0, 1.0, 0.0, 0.0, 0.0, 5.0, -0.0, 0.0]
"""What ``atom.global.add.f32`` leaves in memory: subnormal inputs and results flushed to a zero
of their sign (PTX ISA 9.1, §9.7.13.5 "atom"): ``TINY + 0`` is ``0 + 0``, ``1.5e-38 - 1.4e-38``
is a subnormal sum flushed to 0, ``-TINY + -TINY`` is ``-0 + -0 = -0``."""


def atomic_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(memory, values to add, old values poisoned with 7) for :data:`ATOMIC_SRC`."""
    return (np.array(ATOMIC_P, np.float32), np.array(ATOMIC_V, np.float32), np.full(8, 7.0, np.float32))


INT_BF16_SRC = """
@kernel
def k(X: ptr[{s}], Y: ptr[bf16]):
    i = arange(0, 8)
    store(Y + i, load(X + i).to(bf16))
"""


def int_bf16_inputs(s: str) -> np.ndarray:
    """Integers of type ``s`` (i32, u32, i64, u64) just above a tie between two bf16 values, whose
    rounding through f32 first lands on the tie and goes to even (the wrong neighbour); and exact
    values, ties and negatives."""
    bits = {"i32": 31, "u32": 32, "i64": 63, "u64": 64}[s]
    top = bits - 1
    vals = [2**24 + 2**16 + 1, 2**(top - 1) + 2**(top - 9) + 1, 2**24 + 2**16, 2**24 + 3 * 2**16, 7, 0,
            2**25 + 2**17 + 2**16 + 1, 2**(top - 1) + 2**(top - 8) - 1]
    if s[0] == "i":
        vals[4], vals[5] = -(2**24 + 2**16 + 1), -(2**(top - 1) + 2**(top - 9) + 1)
    return np.array(vals, {"i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64}[s])


def round_to_bf16(v: int) -> float:
    """The integer ``v`` rounded once to bf16 (8 significant bits), to nearest, ties to even: exact
    rational arithmetic, independent of numpy and ml_dtypes."""
    if v == 0:
        return 0.0
    sign, m = (-1 if v < 0 else 1), abs(v)
    e = m.bit_length() - 8  # keep the 8 leading bits
    if e <= 0:
        return float(v)
    q, r = divmod(m, 2**e)
    half = Fraction(r, 2**e)
    if half > Fraction(1, 2) or (half == Fraction(1, 2) and q % 2 == 1):
        q += 1
    return float(sign * q * 2**e)


def kernel(src: str) -> sp.Kernel:
    """The kernel ``k`` of ``src``."""
    return sp.loads(src, "case.spk").kernels["k"]


DOT_SRC = """
@kernel
def k(A: ptr[{t}], B: ptr[{t}], C: ptr[{acc}]):
    r = arange(0, 16)
    kk = arange(0, 64)
    c = arange(0, 16)
    a = load(A + r[:, None] * 64 + kk[None, :])
    b = load(B + kk[:, None] * 16 + c[None, :])
    acc = zeros((16, 16), {acc})
    store(C + r[:, None] * 16 + c[None, :], dot(a, b, acc))
"""
"""A 16 x 64 x 16 tile ``dot``: with f16 operands and an f16 accumulator (f16 partial sums past
65504), and with f32 operands (rounded to tf32 by ``cvt.rna``)."""


def f16_overflow_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, C poisoned) whose K-partial sums leave f16's range while the totals are small: the
    first 16 K columns of even output columns add 16 x 8192 = 131072 (inf in f16), the next 16
    take it back, the rest add 32 x 0.25. The tile ``dot`` carries the accumulator in f32 and rounds
    once: 8.0 there (odd columns: partial sums of +-16, total 8.0 too)."""
    a = np.ones((16, 64), np.float16)
    b = np.full((64, 16), 0.25, np.float16)
    b[:16, 0::2], b[16:32, 0::2] = 8192.0, -8192.0
    b[:16, 1::2], b[16:32, 1::2] = 1.0, -1.0
    return a, b, np.full((16, 16), np.nan, np.float16)


TF32_X = 1 + 3 * 2.0**-12
"""An f32 value whose low 13 bits make ``cvt.rna`` (1 + 2**-10) and truncation (1) differ."""


def tf32_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A, B, C poisoned): A has one ``TF32_X`` per row (column = row), the rest 0; B is the identity
    padded to 64 rows scaled by ``TF32_X``'s row: C[i, i] = rna(TF32_X) = 1 + 2**-10 (truncation would
    give 1), off the diagonal 0."""
    a = np.zeros((16, 64), np.float32)
    a[np.arange(16), np.arange(16)] = TF32_X
    b = np.zeros((64, 16), np.float32)
    b[np.arange(16), np.arange(16)] = 1.0
    return a, b, np.full((16, 16), np.nan, np.float32)
