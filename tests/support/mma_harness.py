"""The tile GEMMs of the warp-level MMA tests (backend/lower/mma.py): their source, kernels,
operands and the metadata padding. Used by tests/gpu/test_mma_sp_gpu.py (interpreter and GPU runs)
and tests/backend/test_lower_mma.py (PTX, ptxas and SASS of the same kernels)."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

import sparsile as sp

HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
        "e5m2": ml_dtypes.float8_e5m2, "i8": np.int8}
SPK_TYPE = {"f16": "f16", "bf16": "bf16", "tf32": "f32", "e4m3": "e4m3", "e5m2": "e5m2", "i8": "i8"}
TOOLKIT = {"i8": "s8"}
PAD_WORD = 0x44444444  # chunks keeping elements (0, 1) of zero values (docs/sparse-metadata.md)


def kernel_source(dtype: str, sparse: bool, acc: str | None = None) -> str:
    """A tile GEMM ``C = A @ B^T`` (B stored N x K), C in the accumulator type (f32, i32 for i8,
    or ``acc``), BM x BN x BK tiles."""
    t = SPK_TYPE[dtype]
    acc = acc or ("i32" if dtype == "i8" else "f32")
    per_word = 16 if dtype == "tf32" else 32
    if sparse:
        params = f"A: tensor[{t}, 2], E: tensor[u32, 2], B: tensor[{t}, 2], C: tensor[{acc}, 2]"
        body = f"""        a = A.load_tile((m0, k * (BK // 2)), (BM, BK // 2))
        e = E.load_tile((m0, k * (BK // {per_word})), (BM, BK // {per_word}))
        b = B.load_tile((n0, k * BK), (BN, BK))
        acc = sparse_dot(a, e, trans(b), acc)"""
    else:
        params = f"A: tensor[{t}, 2], B: tensor[{t}, 2], C: tensor[{acc}, 2]"
        body = """        a = A.load_tile((m0, k * BK), (BM, BK))
        b = B.load_tile((n0, k * BK), (BN, BK))
        acc = dot(a, trans(b), acc)"""
    return f"""
@kernel(num_warps=4)
def gemm({params}, BM: constexpr = 64, BN: constexpr = 64, BK: constexpr = 64):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros((BM, BN), {acc})
    K = B.shape[1]
    for k in range(0, cdiv(K, BK)):
{body}
    C.store_tile((m0, n0), acc)
"""


def make_kernel(dtype: str, sparse: bool, anchored: bool = False, acc: str | None = None):
    """``anchored`` adds a comment so the compile cache keeps the two builds apart."""
    src = kernel_source(dtype, sparse, acc) + ("# accumulator anchored in the MMA layout\n" if anchored else "")
    return sp.loads(src, f"mma_{dtype}_{'sparse' if sparse else 'dense'}.spk").gemm


@contextlib.contextmanager
def mma_hooks(enabled: bool):
    """Compile with backend/lower/mma.py's target hooks (the accumulator anchored in the MMA
    fragment layout: no round trip through shared memory), as compiler.hooks_for would
    choose them for these targets once wired."""
    from sparsile.backend.lower.mma import HOOKS
    from sparsile.driver import compiler

    if not enabled:
        yield
        return
    real = compiler.hooks_for
    compiler.hooks_for = lambda target: HOOKS if target.name in WARP_MMA_TARGETS else real(target)
    try:
        yield
    finally:
        compiler.hooks_for = real


WARP_MMA_TARGETS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_120", "sm_121")


def operands(dtype: str, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "i8":
        return rng.integers(-90, 90, (m, k)).astype(np.int8), rng.integers(-90, 90, (n, k)).astype(np.int8)
    return (rng.standard_normal((m, k)).astype(np.float32).astype(HOST[dtype]),
            rng.standard_normal((n, k)).astype(np.float32).astype(HOST[dtype]))


def padded_meta(meta: np.ndarray, m: int, k: int, bm: int, bk: int, per_word: int) -> np.ndarray:
    """The "sm90" word matrix padded to whole BM x BK tiles with the valid padding word (the
    kernel reads whole metadata tiles; a zero word would be the undefined nibble 0x0)."""
    rows = -(-m // bm) * bm
    cols = -(-k // bk) * bk // per_word
    out = np.full((rows, cols), PAD_WORD, np.uint32)
    out[:meta.shape[0], :meta.shape[1]] = meta
    return out
