"""The float64 reference of a sparse_linear / sparse_matmul result and its bound, shared by the
property tests of the kernels (tests/stdlib/test_linear_properties.py), the torch layer and the JAX
integration; it needs no torch (a torch tensor is read as one only where torch is imported).

The reference is float64 from the pruned dense weight (``CompressedWeight.dense()``) and x as the
kernel multiplies it (cast to the weight's type, or quantized per token the way
``quantize_per_token_e4m3`` documents: :func:`quantize_e4m3_model`). The bound of
:func:`assert_matches`: f32 accumulation (K · 2^-23 · Σ|w||x|, plus Hopper's 14-bit fp8 accumulator
for e4m3), the f32 epilogue's few roundings, the activation's slope, half an ulp of y's type."""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from sparsile.stdlib.kernels.linear import reference_activation
from sparsile.stdlib.kernels.linear_args import GATED_ACTIVATIONS

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
      "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24}
SMALLEST = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134, "float32": 2.0 ** -150}
OVERFLOW = {"float16": 65520.0, "bfloat16": 2.0 ** 128 * (1 - 2.0 ** -9), "float32": 2.0 ** 128 * (1 - 2.0 ** -25)}
"""Magnitudes from which y's type rounds to ±inf (an f16 y of an e4m3 weight without scale_w can get there)."""
E4M3_MAX = 448.0
BAD_SPLIT_K = {"split_0": 0, "split_65": 65, "split_bool": True, "split_float": 2.0}
"""The bad-argument property tests' ``split_k`` mutations (kernels and JAX): each is refused."""
SLOPE = 1.13  # max |silu'|, |gelu_tanh'|


def host64(a: Any) -> np.ndarray:
    """``a`` (numpy, a torch CPU tensor, a JAX array) as a float64 numpy array."""
    torch = sys.modules.get("torch")  # a torch tensor exists only where torch is imported
    if torch is not None and isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).numpy()
    return np.asarray(a).astype(np.float64)


def quantize_e4m3_model(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x_q as float64, scale (T,) float64) as quantize_per_token_e4m3 documents, in f32."""
    x32 = x.astype(np.float32)
    amax = np.abs(x32).max(axis=1) if x32.shape[1] else np.zeros(x32.shape[0], np.float32)
    scale = np.maximum(amax / np.float32(E4M3_MAX), np.float32(1 / (E4M3_MAX * 512))).astype(np.float32)
    inv = (np.float32(1) / scale).astype(np.float32)
    q = np.clip(x32 * inv[:, None], -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float64), scale.astype(np.float64)


def as_vector(v: Any, n: int) -> np.ndarray | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return np.full(n, float(v))
    h = host64(v).reshape(-1)
    return np.broadcast_to(h, (n,)) if h.size == 1 else h


def assert_matches(y: Any, dense: np.ndarray, xk: np.ndarray, sx: np.ndarray | None, sw: np.ndarray | None,
                   bias: np.ndarray | None, act: str, out_dtype: str, e4m3: bool) -> None:
    """y (T, F) against float64 from the operands the kernel multiplies, within the bound of the
    module docstring (the reference from ``dense`` and ``xk``, float64)."""
    t, k = xk.shape
    m = dense.shape[0]
    scale = np.ones((t, m))
    if sw is not None:
        scale = scale * sw[None, :]
    if sx is not None:
        scale = scale * sx[:, None]
    pre = (xk @ dense.T) * scale + (0 if bias is None else bias[None, :])
    mags = (np.abs(xk) @ np.abs(dense).T) * np.abs(scale)
    acc = max(k, 1) * 2.0 ** -23 * mags + 2.0 ** -20 * (np.abs(pre) + 1.0)
    if e4m3:
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * mags
    if act in GATED_ACTIVATIONS:
        f = m // 2
        g, u, eg, eu = pre[:, :f], pre[:, f:], acc[:, :f], acc[:, f:]
        gate = reference_activation(g, GATED_ACTIVATIONS[act])
        ref = gate * u
        err = SLOPE * eg * np.abs(u) + np.abs(gate) * eu + SLOPE * eg * eu + 2.0 ** -20 * np.abs(ref)
    else:
        ref = reference_activation(pre, act)
        err = SLOPE * acc
    bound = err + HALF_ULP[out_dtype] * (np.abs(ref) + err) + SMALLEST[out_dtype]
    got = host64(y)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert not np.isnan(got).any(), "unwritten (NaN) outputs"
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - ref)
    overflows = np.isinf(got) & (np.sign(got) == np.sign(ref)) & (np.abs(ref) + bound >= OVERFLOW[out_dtype])
    diff[overflows] = 0.0
    worst = np.unravel_index(np.argmax(diff - bound), diff.shape) if diff.size else None
    assert (diff <= bound).all(), (f"{int((diff > bound).sum())} of {diff.size} off; worst at {worst}: "
                                   f"{got[worst]} against {ref[worst]} (bound {bound[worst]:.3g})")
