"""The Hopper sparse GEMM with its metadata streamed by TMA (stdlib/kernels/sparse_gemm_sm90_mt.spk):
the kernels in the interpreter against float64 with a poisoned C (odd and even K-step counts, a
tile's last odd step whose metadata box reaches past K, persistent and CTA-pair grids, e4m3's one
box per step), and the compile for sm_90a: the two K steps' metadata words are one 16-byte shared
load per thread, and no metadata is read from global memory. The H200 runs are in
tests/gpu/test_sparse_gemm_sm90.py."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S
from sparsile.tests.support import compile_stdlib

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"
HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}


@pytest.fixture(scope="module")
def mod():
    return sp.load(KERNELS / "sparse_gemm_sm90_mt.spk")


def operands(m: int, n: int, k: int, seed: int, dtype: str):
    """Random non-zero 2:4 operands (values; metadata words padded to a multiple of 4 columns, as
    the TMA's 16-byte row stride needs; b) and the float64 product and sum |a||b|."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.5, 2.0, (m, k)) * rng.choice((-1.0, 1.0), (m, k))  # no zeros
    w = S.prune_2_4(dense.astype(np.float32)).astype(HOST[dtype])
    vals, idx = S.compress(w, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data)
    meta = np.pad(meta, ((0, 0), (0, -meta.shape[1] % 4)), constant_values=0x44444444)
    b = (rng.uniform(0.5, 2.0, (n, k)) * rng.choice((-1.0, 1.0), (n, k))).astype(HOST[dtype])
    a64, b64 = w.astype(np.float64), b.astype(np.float64)
    return vals, meta, b, a64 @ b64.T, np.abs(a64) @ np.abs(b64).T


def check(c: np.ndarray, ref: np.ndarray, abs_products: np.ndarray, k: int, dtype: str) -> None:
    """f16 rounding of C (2^-11 relative) plus f32 accumulation (K·2^-23·Σ|ab|); e4m3 adds Hopper's
    ~14-bit accumulator ((K/64 + 1)·2^-13·Σ|ab|, as tests/stdlib/test_gemm_api.py)."""
    assert not np.isnan(c.astype(np.float64)).any(), "unwritten output elements"
    acc = k * 2.0 ** -23 * abs_products
    if dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * abs_products
    err = np.abs(c.astype(np.float64) - ref)
    bound = acc + 2.0 ** -11 * (np.abs(ref) + acc) + 2.0 ** -24
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_bf16_mt", 200, 130, 192, 4, 64),   # 2 x 3 tiles on 4 CTAs; 3 K steps: the last box reaches past K
    ("sparse_gemm_bf16_mt", 130, 40, 64, 1, 32),     # one K step only (its box's second half unused); 2 tiles, 1 CTA
    ("sparse_gemm_bf16_mt", 70, 70, 256, 2, 64),     # 4 K steps: two boxes of two steps
    ("sparse_gemm_f16_pair_mt", 300, 70, 320, 2, 64),  # a pair over 2 x 2 double tiles; 5 K steps
    ("sparse_gemm_bf16_pair_mt", 520, 40, 128, 4, 32),  # two pairs; the last pair's second half below M
    ("sparse_gemm_e4m3_pair_mt", 260, 40, 384, 2, 64),  # BK 128: one box per step, 3 steps
])
def test_kernel_matches_float64(mod, kernel, m, n, k, programs, bn):
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    getattr(mod, kernel).interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BN=bn)
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16_pair_mt", "sparse_gemm_e4m3_pair_mt"])
def test_metadata_comes_from_shared_memory(kernel):
    """No metadata load from global memory is left in the consumers; bf16 reads both K steps'
    words of its row in one 16-byte shared load (the two slices of the box, merged)."""
    ptx = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a").ptx
    assert not re.search(r"ld\.global", ptx)
    if kernel.startswith("sparse_gemm_bf16"):
        assert re.search(r"ld\.shared\.v4\.b32", ptx)
    assert "wgmma.mma_async.sp" in ptx


L2_HINTS = [{"L2A": "evict_first"}, {"L2B": "evict_last"}, {"L2A": "evict_first", "L2B": "evict_last"}]


@pytest.mark.parametrize("hints", L2_HINTS)
@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_bf16_mt", 200, 130, 192, 4, 64),
    ("sparse_gemm_f16_pair_mt", 300, 70, 320, 2, 64),
])
def test_l2_hints_leave_the_result_alone(mod, kernel, m, n, k, programs, bn, hints):
    """L2A / L2B (eviction priorities of the producer's loads) change where lines stay in L2, not
    what is computed: the interpreter gives the same C, against float64."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    getattr(mod, kernel).interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BN=bn, **hints)
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16_mt", "sparse_gemm_bf16_pair_mt"])
def test_l2_hints_reach_the_copies(kernel):
    """The weight's copies (values, metadata) carry L2A's policy and B's (multicast in the pair
    kernel) L2B's: one ``createpolicy.fractional`` each, each copy with ``.L2::cache_hint``; without
    hints neither appears."""
    plain = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a").ptx
    assert "createpolicy" not in plain and "cache_hint" not in plain
    hinted = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a", L2A="evict_first", L2B="evict_last").ptx
    copies = [ln for ln in hinted.splitlines() if "cp.async.bulk.tensor" in ln]
    assert len(copies) == 3 and all(".L2::cache_hint" in ln for ln in copies)
    assert hinted.count("createpolicy.fractional.L2::evict_first.b64") == 2
    assert hinted.count("createpolicy.fractional.L2::evict_last.b64") == 1
    if "_pair" in kernel:
        assert any(".multicast::cluster.L2::cache_hint" in ln for ln in copies)
    only_b = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a", L2B="evict_last").ptx
    assert sum(".L2::cache_hint" in ln for ln in only_b.splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,m,n,k,programs", [
    ("sparse_gemm_bf16_mt", 1000, 600, 768, None),
    ("sparse_gemm_bf16_pair_mt", 4096, 4096, 4160, 132),
])
def test_l2_hints_on_the_gpu_match_float64(mod, kernel, m, n, k, programs):
    """On the H200: the kernels with both L2 hints (the PTX ``test_l2_hints_reach_the_copies`` checks),
    C poisoned with NaN."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    pair = "_pair" in kernel
    tiles = -(-m // (256 if pair else 128)) * -(-n // 256) * (2 if pair else 1)
    getattr(mod, kernel)[(programs or tiles,)](vals, meta, b, c, m, n, k, meta.shape[1], n, L2A="evict_first",
                                               L2B="evict_last")
    check(c, ref, absp, k, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,m,n,k,programs", [
    ("sparse_gemm_bf16_pair_mt", 1000, 2000, 1024, None),   # a CTA pair per double tile
    ("sparse_gemm_bf16_pair_mt", 4096, 4096, 4160, 132),    # persistent pairs; 65 K steps: the last box past K
    ("sparse_gemm_f16_pair_mt", 2000, 1000, 1984, 132),     # 31 K steps, ragged M and N
    ("sparse_gemm_bf16_mt", 1000, 600, 768, None),          # one CTA per tile
    ("sparse_gemm_bf16_mt", 4096, 4096, 4096, 132),         # persistent
    ("sparse_gemm_e4m3_pair_mt", 1000, 600, 1024, None),    # one box per K step
])
@pytest.mark.parametrize("inflight", [0, 1])
def test_kernel_on_the_gpu_matches_float64(mod, kernel, m, n, k, programs, inflight):
    """On the H200 (the tensor maps of the metadata encoded by the launcher), C poisoned with NaN;
    INFLIGHT = 1 too (one MMA group in flight, two metadata register sets)."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    pair = "_pair" in kernel
    tiles = -(-m // (256 if pair else 128)) * -(-n // 256) * (2 if pair else 1)
    getattr(mod, kernel)[(programs or tiles,)](vals, meta, b, c, m, n, k, meta.shape[1], n, INFLIGHT=inflight)
    check(c, ref, absp, k, dtype)


def split_k_mt(mod, dtype, m, n, k, split, interpret):
    """``sparse_gemm_<t>_splitk_mt`` on a (tiles, split) grid into an f32 workspace, the shares added
    on the host in float64: (C, ref, sum |a||b|)."""
    vals, meta, b, ref, absp = operands(m, n, k, m + k, dtype)
    w = np.full((split, m, n), np.nan, np.float32)
    kernel = getattr(mod, f"sparse_gemm_{dtype}_splitk_mt")
    grid = (-(-m // 128) * -(-n // 128), split)
    (kernel.interpret[grid] if interpret else kernel[grid])(vals, meta, b, w, m, n, k, meta.shape[1], n, BN=128,
                                                           SPLIT_K=split)
    return w.astype(np.float64).sum(axis=0), ref, absp


# bf16: 64 steps in 5 shares of 13 (before the fix the second share's box started 8 bytes into a
# 16-byte piece of the row, which faulted on the H200); now shares of 14, 14, 14, 14, 8. e4m3: 33
# steps in 3 shares of 11, one box per step (16 bytes).
ODD_SHARES = [("bf16", 1000, 128, 4096, 5), ("e4m3", 700, 64, 4224, 3)]


@pytest.mark.parametrize("dtype,m,n,k,split", [("bf16", 300, 100, 640, 3), ("bf16", 200, 64, 1664, 4),
                                               ("e4m3", 200, 64, 1152, 2)])
def test_split_k_shares_start_at_even_steps(mod, dtype, m, n, k, split):
    """bf16: 10 steps in 3 shares (4, 4, 2), 26 steps in 4 (8, 8, 8, 2); every share starts at an
    even step, so its metadata boxes start 16-byte aligned in their rows; the shares add up to C.
    e4m3: 9 steps in 2 shares (5, 4), one box per step."""
    c, ref, absp = split_k_mt(mod, dtype, m, n, k, split, interpret=True)
    check(c, ref, absp, k, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,split", ODD_SHARES)
def test_split_k_shares_on_the_gpu(mod, dtype, m, n, k, split):
    """The split-K _mt kernels on the H200 with share counts that once made a box start 8 bytes
    into a 16-byte piece (CUDA_ERROR_ILLEGAL_INSTRUCTION); the shares' sum against float64. Its pass
    on the H200 is why gemm.META_TMA_SPLIT_K is on."""
    c, ref, absp = split_k_mt(mod, dtype, m, n, k, split, interpret=False)
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_bf16_mt", 200, 130, 192, 4, 64),     # 3 K steps: a pair, then the last odd step
    ("sparse_gemm_bf16_mt", 130, 40, 64, 1, 32),       # one K step (the tail only), 2 tiles on 1 CTA
    ("sparse_gemm_f16_mt", 70, 70, 320, 1, 64),        # 5 steps; 2 tiles on one CTA: the ring runs on
    ("sparse_gemm_bf16_pair_mt", 520, 40, 256, 4, 32),  # pairs, 4 steps
    ("sparse_gemm_e4m3_pair_mt", 260, 40, 384, 2, 64),  # one box per step (MK = 1), 3 steps
])
def test_in_flight_kernel_matches_float64(mod, kernel, m, n, k, programs, bn):
    """INFLIGHT = 1 on the _mt kernels (one MMA group in flight, two metadata register sets read
    from the stages): odd and even step counts, several tiles per CTA, pairs, e4m3; C poisoned."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    getattr(mod, kernel).interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BN=bn, INFLIGHT=1)
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16_pair_mt", "sparse_gemm_e4m3_pair_mt"])
def test_in_flight_kernel_compiles_without_serialized_mmas(kernel):
    """INFLIGHT = 1 compiles for sm_90a (the SP0370 analysis accepts the two register sets): the
    consumers wait with wgmma.wait_group 1, and no metadata comes from global memory."""
    ptx = compile_stdlib("sparse_gemm_sm90_mt.spk", kernel, "sm_90a", INFLIGHT=1).ptx
    assert "wgmma.wait_group.sync.aligned 1;" in ptx and not re.search(r"ld\.global", ptx)


PER_WARP_CASES = [
    ("sparse_gemm_bf16_mt", 200, 130, 192, 4, 64, 0),      # 3 K steps, 2 x 3 tiles on 4 CTAs
    ("sparse_gemm_f16_mt", 70, 70, 320, 1, 64, 1),         # 5 steps, two tiles on one CTA, one group in flight
    ("sparse_gemm_bf16_pair_mt", 520, 40, 256, 4, 32, 0),  # pairs: each warp arrives on both CTAs' barriers
    ("sparse_gemm_bf16_pair_mt", 300, 70, 320, 2, 64, 1),
    ("sparse_gemm_e4m3_pair_mt", 260, 40, 384, 2, 64, 0),  # one box per step
]


@pytest.mark.parametrize("kernel,m,n,k,programs,bn,inflight", PER_WARP_CASES)
def test_per_warp_release_matches_float64(mod, kernel, m, n, k, programs, bn, inflight):
    """PER = "warp": every consumer warp releases a stage with an arrival of its own (the `empty`
    barriers count warps). With a count left at one per warpgroup the producer would refill a stage
    a warpgroup still reads; the interpreter's ring then computes wrong sums or deadlocks."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k + 1, dtype)
    c = np.full((m, n), np.nan, np.float16)
    getattr(mod, kernel).interpret[(programs,)](vals, meta, b, c, m, n, k, meta.shape[1], n, BN=bn,
                                                INFLIGHT=inflight, PER="warp")
    check(c, ref, absp, k, dtype)


@pytest.mark.parametrize("per,named_barriers", [("warpgroup", True), ("warp", False)])
def test_per_warp_release_drops_the_named_barrier(per, named_barriers):
    """The per-warpgroup release synchronizes the warpgroup on a named barrier (bar.sync id, 128)
    before one thread arrives; the per-warp release has none in the K loop, only bar.warp.sync."""
    ptx = compile_stdlib("sparse_gemm_sm90_mt.spk", "sparse_gemm_bf16_pair_mt", "sm_90a", PER=per).ptx
    assert bool(re.search(r"bar\.sync\s+%r\d+, 128;", ptx)) == named_barriers
    assert ("bar.warp.sync" in ptx) == (not named_barriers)
    if per == "warp":  # only the first lane arrives: a branch on a predicate skips the arrivals, whose
        # lane test (tid & 31 == 0) the compiler hoisted out of the loop
        assert re.search(r"and\.b32\s+%r\d+, %r\d+, 31;", ptx)
        for after in ptx.split("bar.warp.sync -1;")[1:]:
            before_arrive = after.split("mbarrier.arrive")[0]
            assert re.search(r"@%p\d+ bra", before_arrive), "an arrival not guarded by the lane test"


def test_stage_release_unit_is_checked():
    """PER = "partition" would arrive once against `empty`'s count of one per warpgroup: a ring that
    never frees a stage (a hang). It is refused when the kernel is compiled."""
    from sparsile.frontend.diagnostics import CompileError

    with pytest.raises(CompileError) as err:
        compile_stdlib("sparse_gemm_sm90_mt.spk", "sparse_gemm_bf16_mt", "sm_90a", PER="partition")
    assert "SP0320" in str(err.value) and 'PER is "warpgroup" or "warp"' in str(err.value)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,m,n,k,programs", [
    ("sparse_gemm_bf16_pair_mt", 4096, 4096, 4160, 132),  # persistent pairs, 65 K steps
    ("sparse_gemm_f16_pair_mt", 2000, 1000, 1984, 132),   # ragged M and N
    ("sparse_gemm_bf16_mt", 1000, 600, 768, None),        # one CTA per tile
    ("sparse_gemm_e4m3_pair_mt", 1000, 600, 1024, None),
])
@pytest.mark.parametrize("inflight", [0, 1])
def test_per_warp_release_on_the_gpu(mod, kernel, m, n, k, programs, inflight):
    """PER = "warp" on the H200 against float64, C poisoned with NaN."""
    dtype = kernel.split("_")[2]
    vals, meta, b, ref, absp = operands(m, n, k, m + n + k, dtype)
    c = np.full((m, n), np.nan, np.float16)
    pair = "_pair" in kernel
    tiles = -(-m // (256 if pair else 128)) * -(-n // 256) * (2 if pair else 1)
    getattr(mod, kernel)[(programs or tiles,)](vals, meta, b, c, m, n, k, meta.shape[1], n, INFLIGHT=inflight,
                                                PER="warp")
    check(c, ref, absp, k, dtype)
