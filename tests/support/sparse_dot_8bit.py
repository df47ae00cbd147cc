"""An 8-bit ``sparse_dot`` kernel at one warpgroup (BM = 64, num_warps = 4: the sm_90a wgmma path)
with A and B of any two 8-bit types that may mix (e4m3/e5m2, i8/u8), its operands and a float64
reference, shared by tests/backend/test_wgmma_mixed_8bit.py (PTX, SASS, interpreter) and
tests/gpu/test_sparse_dot_8bit_gpu.py (the GPU).

On sm_90a the instruction must name both operand types (``.e4m3.e5m2``, ``.s8.u8``): with A's type
for both, B's bytes were read as A's format (u8 as s8, e5m2 as e4m3; sparse fuzzer seeds 27, 31)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .program_gen import NP, convert

PAIRS_8BIT = [(a, b) for fam in (("e4m3", "e5m2"), ("i8", "u8")) for a in fam for b in fam]
"""Every (A, B) element-type pair an 8-bit sparse_dot takes (frontend/ops/dot.py MIXABLE_OPERANDS)."""
PTX_8BIT = {"e4m3": "e4m3", "e5m2": "e5m2", "i8": "s8", "u8": "u8"}
SASS_8BIT = {"e4m3": "E4M3", "e5m2": "E5M2", "i8": "S8", "u8": "U8"}
TOOLKIT = {"e4m3": "e4m3", "e5m2": "e5m2", "i8": "s8", "u8": "u8"}
INT_POISON = -0x3C3C3C3D
"""What an i32 output holds before the kernel writes it (no product of the test's operands)."""

SOURCE = """
@kernel(num_warps=4)
def k(A: ptr[{at}], E: ptr[u32], B: ptr[{bt}], C: ptr[{acc}], N: i32, K: i32,
      BM: constexpr, BN: constexpr, BK: constexpr):
    rm = program_id(0) * BM + arange(0, BM)
    rn = program_id(1) * BN + arange(0, BN)
    acc = zeros((BM, BN), {acc})
    for k0 in range(0, K, BK):
        ka = k0 // 2 + arange(0, BK // 2)
        ke = k0 // 32 + arange(0, BK // 32)
        kb = k0 + arange(0, BK)
        a = load(A + rm[:, None] * (K // 2) + ka[None, :])
        e = load(E + rm[:, None] * (K // 32) + ke[None, :])
        b = load(B + kb[:, None] * N + rn[None, :])
        acc = sparse_dot(a, e, b, acc)
    store(C + rm[:, None] * N + rn[None, :], acc)
"""


def acc_type(at: str) -> str:
    """The accumulator of an 8-bit sparse_dot: i32 for integers, f32 for fp8."""
    return "i32" if at in ("i8", "u8") else "f32"


def source(at: str, bt: str) -> str:
    """The kernel text for A of ``at`` and B of ``bt`` (a (K, N) N-contiguous B, as the fuzzer's)."""
    return SOURCE.format(at=at, bt=bt, acc=acc_type(at))


def _values(rng: np.random.Generator, t: str, shape: tuple[int, int]) -> np.ndarray:
    """Random finite values of ``t`` over its whole range (u8 above 127, negative i8, fp8 of both
    signs and varied exponents): a B read in another 8-bit format gives other numbers."""
    if t in ("i8", "u8"):
        lo, hi = (-128, 128) if t == "i8" else (0, 256)
        return rng.integers(lo, hi, shape).astype(NP[t])
    x = rng.standard_normal(shape) * 2.0
    x.flat[0] = x.flat[0] or 1.0
    return convert(x, "f64", t)


def operands(at: str, bt: str, m: int, n: int, k: int, seed: int) -> dict[str, Any]:
    """The kernel's arguments (A compressed 2:4 with "sm90" metadata from the project's toolkit, B
    (k, n), C poisoned) and, under ``"want"`` / ``"tol"``, the float64 reference and its bound
    (``"dense"``: the decompressed A in float64)."""
    from sparsile.stdlib.sparsity import compress, encode_metadata

    rng = np.random.default_rng(seed)
    dense = _values(rng, at, (m, k))
    values, indices = compress(dense, TOOLKIT[at], prune=True)
    meta = np.ascontiguousarray(np.asarray(encode_metadata(indices, "sm90", TOOLKIT[at]).data), np.uint32)
    idx = np.asarray(indices)  # (m, k / 4, 2): the kept positions of each chunk of four
    cols = 4 * np.arange(k // 4)[None, :, None] + idx
    pruned = np.zeros((m, k), np.float64)
    pruned[np.arange(m)[:, None, None], cols] = np.asarray(values).astype(np.float64).reshape(idx.shape)
    b = _values(rng, bt, (k, n))
    b64 = b.astype(np.float64)
    want = pruned @ b64
    mag = np.abs(pruned) @ np.abs(b64)
    if acc_type(at) == "i32":
        c = np.full((m, n), INT_POISON, np.int32)
        tol = np.zeros((m, n))
    else:
        c = np.full((m, n), np.nan, np.float32)
        # f32 sums in any order, plus the ~14 accumulator bits of Hopper's fp8 MMAs (program_gen_sparse)
        tol = (k * 2.0**-23 + (k / 32 + 1) * 2.0**-13) * mag
    return {"A": np.ascontiguousarray(values), "E": meta, "B": b, "C": c, "N": n, "K": k, "want": want,
            "tol": tol, "dense": pruned}


def check(c: np.ndarray, want: np.ndarray, tol: np.ndarray) -> None:
    """Every element written and within ``tol`` of the float64 reference (exact for integers)."""
    got = np.asarray(c).astype(np.float64)
    assert not np.isnan(got).any(), "unwritten (poisoned) outputs"
    bad = np.flatnonzero(np.abs(got - want) > tol)
    assert bad.size == 0, (f"{bad.size} of {got.size} elements differ, at {bad[:4].tolist()}: got "
                           f"{got.reshape(-1)[bad[:4]].tolist()}, want {want.reshape(-1)[bad[:4]].tolist()}")
