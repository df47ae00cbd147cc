"""The explicit-level Hopper sparse GEMM (stdlib/kernels/sparse_gemm_sm90.spk) on the GPU against a
float64 reference, random 2:4 operands, poisoned outputs; the same kernel in the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sparsile as sp
from sparsile.stdlib import sparsity as S

KERNELS = Path(__file__).resolve().parents[2] / "stdlib" / "kernels"


def operands(m: int, n: int, k: int, seed: int, dtype: str = "f16"):
    import ml_dtypes

    host = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    rng = np.random.default_rng(seed)
    w = S.prune_2_4(rng.standard_normal((m, k)).astype(np.float32)).astype(host)
    vals, idx = S.compress(w, dtype)
    meta = np.asarray(S.encode_metadata(idx, "sm90", dtype).data)
    b = rng.standard_normal((n, k)).astype(host)
    ref = w.astype(np.float64) @ b.astype(np.float64).T
    return vals, meta, b, ref


def run(kernel, m, n, k, seed, interpret=False, dtype="f16", programs=None, **cfg):
    """``programs``: a grid of that many CTAs (persistent: fewer CTAs than tiles)."""
    vals, meta, b, ref = operands(m, n, k, seed, dtype)
    c = np.full((m, n), np.nan, np.float16)
    bm, bn = cfg.get("BM", 128), cfg.get("BN", 256)
    grid = (programs or ((m + bm - 1) // bm) * ((n + bn - 1) // bn),)
    launch = kernel.interpret[grid] if interpret else kernel[grid]
    launch(vals, meta, b, c, m, n, k, meta.shape[1], n, **cfg)
    return c, ref


def check(c, ref, k, abs_products=None, acc_bits=23, instr_k=32):
    """Output rounding to f16 plus accumulation error. Hopper's fp8 MMAs keep about 14 mantissa
    bits in the accumulator (DeepSeek-V3 report, §3.3.2) and may truncate at each of the K/instr_k
    sequential MMA accumulations: at most 2^-13 of the partial sum (<= sum |a||b|) each time."""
    assert not np.isnan(c).any(), "unwritten output elements"
    err = np.abs(c.astype(np.float64) - ref)
    if abs_products is None:
        acc_term = 1e-3 * np.sqrt(k)
    else:
        acc_term = (k // instr_k) * 2.0 ** -(acc_bits - 1) * abs_products + 1e-3
    bound = 2.0 ** -10 * np.abs(ref) + acc_term
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


@pytest.fixture(scope="module")
def mod():
    return sp.load(KERNELS / "sparse_gemm_sm90.spk")


@pytest.mark.parametrize("m,n,k", [(200, 130, 192), (64, 96, 64), (130, 40, 256), (70, 200, 320)])
def test_interpreter_matches_reference(mod, m, n, k):
    """K steps odd (3, 5), one, and even (4): the consumer's main loop is unrolled by two, with a
    tail step when the count is odd."""
    c, ref = run(mod.sparse_gemm_f16, m, n, k, 0, interpret=True)
    check(c, ref, k)


@pytest.mark.parametrize("programs,m,n,k,bn", [(2, 300, 200, 192, 64), (3, 260, 130, 128, 64), (1, 130, 70, 96, 32)])
def test_interpreter_persistent_grid_matches_reference(mod, programs, m, n, k, bn):
    """Fewer CTAs than tiles (6, 6 and 6 tiles): each CTA runs several tiles, with its ring slots
    and phases carried on across them (odd and even K-step counts per tile)."""
    c, ref = run(mod.sparse_gemm_f16, m, n, k, 1, interpret=True, programs=programs, BN=bn)
    check(c, ref, k)


def pair_grid(m: int, n: int, bm: int = 128, bn: int = 256) -> int:
    """One CTA per tile of the pair kernel: the 2BM x BN tiles, two CTAs each."""
    return 2 * ((m + 2 * bm - 1) // (2 * bm)) * ((n + bn - 1) // bn)


@pytest.mark.parametrize("m,n,k,programs,bn", [
    (200, 130, 192, None, 64),   # 2 x 3 pair tiles; the second pair row's lower CTA is past M
    (300, 70, 128, None, 32),    # M tiles 3: the last pair's second CTA computes only zeros
    (260, 130, 256, 2, 64),      # one persistent pair, 2 x 3 pair tiles, even K-step count
])
def test_interpreter_pair_kernel_matches_reference(mod, m, n, k, programs, bn):
    """CTA pairs share B (each loads half and multicasts it; both release each stage on both CTAs'
    barriers) with the rest of the kernel unchanged."""
    c, ref = run(mod.sparse_gemm_f16_pair, m, n, k, 3, interpret=True, programs=programs or pair_grid(m, n, bn=bn),
                 BN=bn)
    check(c, ref, k)


@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_bf16_tma", 200, 136, 192, 2, 64),       # 2 x 3 tiles on 2 CTAs: the staging tile reused
    ("sparse_gemm_bf16_tma", 130, 40, 128, None, 32),     # rows and columns past M and N clipped by the store
    ("sparse_gemm_f16_pair_tma", 300, 72, 128, None, 32),  # the last pair's second CTA is past M
    ("sparse_gemm_bf16_pair_tma", 260, 136, 256, 2, 64),   # one persistent pair, 2 x 3 pair tiles
])
def test_interpreter_tma_store_epilogue_matches_reference(mod, kernel, m, n, k, programs, bn):
    """The TMA-store epilogue (C a tensor map; the tile staged in shared memory and stored by TMA
    while the next tile's MMAs run): each CTA waits for its previous store before it overwrites the
    staging tile, and before it exits."""
    dtype = "f16" if "_f16_" in kernel else "bf16"
    grid = programs or (pair_grid(m, n, bn=bn) if "pair" in kernel else None)
    c, ref = run(getattr(mod, kernel), m, n, k, 7, interpret=True, dtype=dtype, programs=grid, BN=bn)
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,m,n,k,programs", [("sparse_gemm_bf16_pair_tma", 1000, 2000, 1024, None),
                                                   ("sparse_gemm_f16_pair_tma", 4096, 4096, 4096, 132),
                                                   ("sparse_gemm_bf16_tma", 1000, 600, 768, 7)])
def test_sparse_gemm_tma_store_epilogue(mod, kernel, m, n, k, programs):
    dtype = "f16" if "_f16_" in kernel else "bf16"
    grid = programs or (pair_grid(m, n) if "pair" in kernel else None)
    c, ref = run(getattr(mod, kernel), m, n, k, 9, dtype=dtype, programs=grid)
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,programs", [("f16", 1000, 2000, 1024, None), ("f16", 4096, 4096, 4096, None),
                                                  ("bf16", 1000, 600, 768, None), ("f16", 1000, 2000, 1024, 132),
                                                  ("f16", 1000, 2000, 1024, 2)])
def test_sparse_gemm_pair(mod, dtype, m, n, k, programs):
    c, ref = run(getattr(mod, f"sparse_gemm_{dtype}_pair"), m, n, k, 5, dtype=dtype,
                 programs=programs or pair_grid(m, n))
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 7, 132])
def test_sparse_gemm_persistent_grid(mod, programs):
    """The same kernel with fewer CTAs than its 8 x 8 = 64 tiles (1, 7) and with more (132: the
    CTAs past the last tile compute nothing)."""
    c, ref = run(mod.sparse_gemm_f16, 1000, 2000, 1024, 2, programs=programs)
    check(c, ref, 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(128, 128, 64), (256, 256, 512), (200, 130, 192), (1000, 1000, 1024),
                                   (4096, 4096, 4096)])
def test_sparse_gemm_f16(mod, m, n, k):
    c, ref = run(mod.sparse_gemm_f16, m, n, k, m + n + k)
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("bf16", 1000, 600, 768), ("e4m3", 1000, 600, 1024),
                                         ("bf16", 4096, 512, 4096)])
def test_sparse_gemm_dtypes(mod, dtype, m, n, k):
    c, ref = run(getattr(mod, f"sparse_gemm_{dtype}"), m, n, k, 7, dtype=dtype)
    if dtype == "e4m3":
        absprod = _abs_products(m, n, k, 7, dtype)
        check(c, ref, k, absprod, acc_bits=14, instr_k=64)
    else:
        check(c, ref, k)


def _abs_products(m, n, k, seed, dtype):
    import ml_dtypes

    host = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[dtype]
    rng = np.random.default_rng(seed)
    w = S.prune_2_4(rng.standard_normal((m, k)).astype(np.float32)).astype(host)
    b = rng.standard_normal((n, k)).astype(host)
    return np.abs(w.astype(np.float64)) @ np.abs(b.astype(np.float64)).T


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(256, 256, 512), (1000, 600, 1024)])
def test_sparse_gemm_s8_tf32(mod, m, n, k):
    """s8 exactly; tf32 against the inputs as the MMA reads them (truncated to tf32)."""
    from sparsile.tests.support import load_script

    sweep = load_script("benchmarks/sweep_sparse_gemm.py", "sweep")
    rng = np.random.default_rng(5)
    for dtype, out_dt, bn in (("s8", np.int32, 256), ("tf32", np.float32, 128)):
        vals, meta, b, ref, absprod, kp = sweep.make(dtype, m, n, k, rng)
        c = np.full((m, n), -(2**31) if dtype == "s8" else np.nan, out_dt)
        getattr(mod, f"sparse_gemm_{dtype}")[(((m + 127) // 128) * ((n + bn - 1) // bn),)](
            vals, meta, b, c, m, n, kp, meta.shape[1], n, BN=bn)
        assert (np.abs(c.astype(np.float64) - ref) <= sweep.bound(dtype, ref, absprod, kp)).all(), dtype


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [dict(BN=128, STAGES=4), dict(BN=256, STAGES=3), dict(BN=64, STAGES=2, GROUP_M=2),
                                 dict(BN=16, STAGES=4)])
def test_sparse_gemm_configs(mod, cfg):
    c, ref = run(mod.sparse_gemm_f16, 1000, 600, 768, 3, **cfg)
    check(c, ref, 768)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(128, 256, 64), (1000, 700, 1024), (2048, 2048, 2048)])
def test_dense_gemm_f16(m, n, k):
    dense = sp.load(KERNELS / "dense_gemm_sm90.spk")
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)
    dense.dense_gemm_f16[(((m + 127) // 128) * ((n + 255) // 256),)](a, b, c, m, n, k, n)
    check(c, a.astype(np.float64) @ b.astype(np.float64).T, k)


def tf32_probe_operands():
    """A (1:2 sparse) and B whose kept values carry bits below tf32's 10 mantissa bits: rows 0-63
    hold 1 + 3*2^-12 (0.75 of a tf32 ulp: rounding gives 1 + 2^-10, truncation 1), rows 64-127
    1 + 2^-11 (a tie); B's rows 64-127 also hold 1 + 3*2^-12. K = 64, so C = 32 * a' * b'."""
    a = np.ones((128, 64), np.float32)
    a[:64] = 1 + 3 * 2.0 ** -12
    a[64:] = 1 + 2.0 ** -11
    w = S.prune_1_2(a)
    b = np.ones((128, 64), np.float32)
    b[64:] = 1 + 3 * 2.0 ** -12
    vals, idx = S.compress(w, "tf32")
    return vals, np.asarray(S.encode_metadata(idx, "sm90", "tf32").data), b


def run_tf32_probe(launch):
    vals, meta, b = tf32_probe_operands()
    c = np.full((128, 128), np.nan, np.float32)
    launch(vals, meta, b, c, 128, 128, 64, meta.shape[1], 128, BN=128)
    return c


def test_interpreter_reads_tf32_as_the_h200_does(mod):
    """The H200 drops the low 13 bits of f32 data a tf32 wgmma reads (test below): every product
    is exactly 1, so C = 32 everywhere; rounding would have given 32.03125 and 32.0625."""
    c = run_tf32_probe(mod.sparse_gemm_tf32.interpret[(1,)])
    assert (c == 32.0).all()


@pytest.mark.gpu
def test_tf32_wgmma_truncates_f32_inputs(mod):
    """Measured on the H200 (2026-11-30): 1 + 3*2^-12 is read as 1, not rounded to 1 + 2^-10."""
    c = run_tf32_probe(mod.sparse_gemm_tf32[(1,)])
    assert (c == 32.0).all(), np.unique(c)


def run_split_k(mod, m, n, k, split, interpret, bn=64, seed=4, **cfg):
    """The sparse GEMM with SPLIT_K shares into an f32 workspace (poisoned), then splitk_reduce."""
    vals, meta, b, ref = operands(m, n, k, seed)
    work = np.full((split, m, n), np.nan, np.float32)
    c = np.full((m, n), np.nan, np.float16)
    grid = (((m + 127) // 128) * ((n + bn - 1) // bn), split)
    gemm = mod.sparse_gemm_f16_splitk.interpret[grid] if interpret else mod.sparse_gemm_f16_splitk[grid]
    gemm(vals, meta, b, work, m, n, k, meta.shape[1], n, BN=bn, SPLIT_K=split, **cfg)
    red_grid = ((m * n + 1023) // 1024,)
    red = mod.splitk_reduce.interpret[red_grid] if interpret else mod.splitk_reduce[red_grid]
    red(work, c, m * n, SPLIT_K=split)
    return work, c, ref


@pytest.mark.parametrize("m,n,k,split", [(130, 70, 320, 2), (64, 64, 448, 3), (200, 40, 128, 3)])
def test_interpreter_split_k_matches_reference(mod, m, n, k, split):
    """Shares of 3+2, 3+3+1 and 1+1+0 K steps (an empty share writes zeros); every workspace
    element is written."""
    work, c, ref = run_split_k(mod, m, n, k, split, interpret=True)
    assert not np.isnan(work).any()
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,split", [(1000, 128, 4096, 4), (4096, 128, 14336, 4), (300, 200, 640, 3)])
def test_sparse_gemm_split_k(mod, m, n, k, split):
    work, c, ref = run_split_k(mod, m, n, k, split, interpret=False, bn=128)
    assert not np.isnan(work).any()
    check(c, ref, k)


# ------------------------------------------------------------------------------------------------
# INFLIGHT = 1: one sparse MMA group in flight across K steps (three metadata register sets, the K
# loop unrolled by three, each stage released one step later; `k_steps_in_flight`). The interpreter
# runs the MMAs synchronously, so these check the step and remainder logic and the ring's arrivals
# (a missing or extra release deadlocks or corrupts a persistent CTA's later tiles); the legality
# pass and the PTX check below cover the metadata registers, the GPU tests the rest.


@pytest.mark.parametrize("dtype,m,n,k,bn", [
    ("f16", 200, 130, 64, 64),    # 1 K step: only the remainder, no release before the final wait
    ("bf16", 70, 40, 96, 32),     # 2 K steps, the last half zero-filled: both remainder steps
    ("f16", 130, 70, 160, 64),    # 3: one round of the unrolled loop, no remainder
    ("bf16", 64, 96, 224, 64),    # 4: one round and one remainder step
    ("f16", 100, 50, 288, 32),    # 5: one round and two remainder steps
    ("f16", 130, 200, 448, 64),   # 7: two rounds and one remainder step
    ("e4m3", 130, 70, 640, 64),   # BK = 128: 5 K steps
])
def test_interpreter_inflight_matches_reference(mod, dtype, m, n, k, bn):
    c, ref = run(getattr(mod, f"sparse_gemm_{dtype}"), m, n, k, 11, interpret=True, dtype=dtype, BN=bn, INFLIGHT=1)
    check(c, ref, k)


@pytest.mark.parametrize("programs,m,n,k,bn", [(2, 300, 200, 192, 64), (3, 260, 130, 128, 64),
                                               (1, 130, 70, 320, 32), (2, 200, 130, 64, 64)])
def test_interpreter_inflight_persistent_grid_matches_reference(mod, programs, m, n, k, bn):
    """Fewer CTAs than tiles, K-step counts 3, 2, 5 and 1 per tile: the ring slots and phases run on
    across a CTA's tiles, so a stage released twice or never shows in its next tile."""
    c, ref = run(mod.sparse_gemm_f16, m, n, k, 12, interpret=True, programs=programs, BN=bn, INFLIGHT=1)
    check(c, ref, k)


@pytest.mark.parametrize("kernel,m,n,k,programs,bn", [
    ("sparse_gemm_f16_pair", 200, 130, 192, None, 64),     # each stage released on both CTAs (multicast)
    ("sparse_gemm_f16_pair", 260, 130, 256, 2, 64),        # one persistent pair, 4 K steps
    ("sparse_gemm_bf16_tma", 200, 136, 160, 2, 64),        # TMA-store epilogue, persistent
])
def test_interpreter_inflight_variants_match_reference(mod, kernel, m, n, k, programs, bn):
    dtype = "f16" if "_f16_" in kernel else "bf16"
    grid = programs or (pair_grid(m, n, bn=bn) if "pair" in kernel else None)
    c, ref = run(getattr(mod, kernel), m, n, k, 13, interpret=True, dtype=dtype, programs=grid, BN=bn, INFLIGHT=1)
    check(c, ref, k)


@pytest.mark.parametrize("m,n,k,split", [(130, 70, 320, 2), (64, 64, 448, 3), (200, 40, 128, 3)])
def test_interpreter_inflight_split_k_matches_reference(mod, m, n, k, split):
    """Shares of 3+2, 3+3+1 and 1+1+0 K steps: a share of none waits for nothing and releases nothing."""
    work, c, ref = run_split_k(mod, m, n, k, split, interpret=True, INFLIGHT=1)
    assert not np.isnan(work).any()
    check(c, ref, k)


def _loop_blocks(blocks):
    """Indices of the PTX basic blocks that lie on a cycle (a loop body)."""
    index = {b.label: i for i, b in enumerate(blocks)}

    def reaches(src: int, dst: int) -> bool:
        seen, todo = set(), [src]
        while todo:
            i = todo.pop()
            for s in blocks[i].successors:
                j = index[s]
                if j == dst:
                    return True
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return False

    return {i for i in range(len(blocks)) if reaches(i, i)}


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16", "sparse_gemm_f16", "sparse_gemm_e4m3", "sparse_gemm_f16_pair"])
def test_inflight_ptx_keeps_one_group_in_flight(kernel):
    """The K loop waits with `wgmma.wait_group 1` (three steps per iteration, two more in the
    remainder, one `wait_group 0` per tile), and no register a sparse wgmma in flight reads as
    metadata is written before the wait that retires it, checked on the PTX's control-flow graph
    (backend/toolchain/ptx_inflight.py). Without INFLIGHT the kernel waits for every group."""
    from sparsile.backend.toolchain.ptx_inflight import entry_blocks, metadata_hazards
    from sparsile.tests.support import compile_stdlib

    ptx = compile_stdlib("sparse_gemm_sm90.spk", kernel, "sm_90a", stop_after="ptx", INFLIGHT=1).ptx
    assert ptx.count("wgmma.wait_group.sync.aligned 1;") == 5 and ptx.count("wgmma.wait_group.sync.aligned 0;") == 1
    blocks = entry_blocks(ptx)
    in_loops = _loop_blocks(blocks)
    waits = [i for i, b in enumerate(blocks) for st in b.statements if st.text == "wgmma.wait_group.sync.aligned 1"]
    assert len(waits) == 5 and all(i in in_loops for i in waits)
    assert metadata_hazards(ptx) == []
    default = compile_stdlib("sparse_gemm_sm90.spk", kernel, "sm_90a", stop_after="ptx").ptx
    assert "wgmma.wait_group.sync.aligned 1;" not in default


def test_inflight_schedule_reloading_a_set_too_early_is_sp0370():
    """The compiler holds the schedule to its rule: with set a reloaded before the wait that
    retires the MMA reading it (one line moved up), the kernel is SP0370 at that reload (the load
    of `load_meta`, inlined), naming the set."""
    from sparsile.frontend.diagnostics import CompileError
    from sparsile.tests.support import signature

    text = (KERNELS / "sparse_gemm_sm90.spk").read_text()
    step_b = "    acc = step_in_flight(a_s, b_s, full, empty, acc, meta_b, g + 1, 1, STAGES, RELEASE, PER)\n"
    reload_a = "    meta_a = load_meta(E, rows, wcols, k + 3, m16, lde, KW)\n"
    assert text.count(step_b + reload_a) == 1
    broken = sp.loads(text.replace(step_b + reload_a, reload_a + step_b), "broken.spk", path=KERNELS / "broken.spk")
    kern = broken.sparse_gemm_bf16
    with pytest.raises(CompileError) as info:
        kern.compile(signature(kern, INFLIGHT=1), target="sm_90a", stop_after="ir")
    (d,) = info.value.diagnostics
    load_line = 1 + text[:text.index("    return load(E + rows[:, None] * lde")].count("\n")
    assert (d.code, d.span.line) == ("SP0370", load_line) and "`meta_a`" in d.message


@pytest.mark.parametrize("kernel", ["sparse_gemm_bf16", "sparse_gemm_e4m3"])
def test_inflight_assembles_without_spills_or_serialized_wgmma(kernel):
    """nvJitLink (the path these kernels take): no spills, no local memory, and ptxas keeps the
    MMAs asynchronous (no "wgmma serialized" info, C7510)."""
    from sparsile.tests.support import compile_stdlib

    ck = compile_stdlib("sparse_gemm_sm90.spk", kernel, "sm_90a", INFLIGHT=1)
    assert "0 bytes spill stores" in ck.info_log and "0 bytes lmem" in ck.info_log
    assert "C7510" not in ck.info_log and "serialized" not in ck.info_log


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,programs", [
    ("f16", 1000, 2000, 1024, None), ("bf16", 1000, 600, 768, None), ("f16", 200, 130, 192, None),
    ("bf16", 4096, 4096, 4096, None), ("f16", 1000, 2000, 1088, 7),   # 17 K steps (2 in the remainder), persistent
    ("f16", 128, 256, 64, None),                                       # one K step
])
def test_sparse_gemm_inflight(mod, dtype, m, n, k, programs):
    c, ref = run(getattr(mod, f"sparse_gemm_{dtype}"), m, n, k, 21, dtype=dtype, programs=programs, INFLIGHT=1)
    check(c, ref, k)


@pytest.mark.gpu
def test_sparse_gemm_inflight_e4m3(mod):
    m, n, k = 1000, 600, 1024
    c, ref = run(mod.sparse_gemm_e4m3, m, n, k, 22, dtype="e4m3", INFLIGHT=1)
    check(c, ref, k, _abs_products(m, n, k, 22, "e4m3"), acc_bits=14, instr_k=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,programs", [("f16", 1000, 2000, 1024, None), ("bf16", 4096, 4096, 4096, 132)])
def test_sparse_gemm_pair_inflight(mod, dtype, m, n, k, programs):
    c, ref = run(getattr(mod, f"sparse_gemm_{dtype}_pair"), m, n, k, 23, dtype=dtype,
                 programs=programs or pair_grid(m, n), INFLIGHT=1)
    check(c, ref, k)


# ------------------------------------------------------------------------------------------------
# the ping-pong schedule (sparse_gemm_sm90_pingpong.spk; interpreter tests in tests/stdlib/test_gemm_pingpong.py).
# Its register budgets (setmaxnreg) need the whole-program ptxas: run these with SPARSILE_PTXAS=<ptxas> (or the
# nvidia-cuda-nvcc wheel installed) to test the kernel as it is meant to run; without one nvJitLink drops them
# (warning SP0612) and the kernel runs on the 168 registers of its 384-thread launch.


@pytest.fixture(scope="module")
def pingpong():
    return sp.load(KERNELS / "sparse_gemm_sm90_pingpong.spk")


def _sm_count() -> int:
    from sparsile.backend import runtime

    return runtime.current_device().sm_count


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,programs,cfg", [
    ("f16", 1000, 2000, 1024, None, {}),           # 8 x 16 = 128 tiles, one per CTA: warpgroup 1 idle
    ("bf16", 1000, 600, 768, 7, {}),               # 8 x 5 = 40 tiles on 7 CTAs: 5-6 each, odd and even
    ("f16", 1000, 2000, 1056, 3, {"BN": 64}),      # ragged K: the last BK=64 step half zero-filled (16-byte rows)
    ("bf16", 4096, 4096, 4096, None, {}),          # 1024 tiles on one CTA per SM
    ("f16", 4096, 4096, 4096, None, {"BM": 64, "BN": 256, "STAGES": 5}),
    ("bf16", 4096, 4096, 4096, None, {"BK": 128, "STAGES": 4}),
])
def test_sparse_gemm_pingpong(pingpong, dtype, m, n, k, programs, cfg):
    cfg = {"BN": 128, **cfg}
    tiles = -(-m // cfg.get("BM", 128)) * -(-n // cfg["BN"])
    kernel = getattr(pingpong, f"sparse_gemm_{dtype}_pingpong")
    c, ref = run(kernel, m, n, k, m + k, dtype=dtype, programs=programs or min(tiles, _sm_count()), **cfg)
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k,programs,cfg", [
    ("bf16", 1000, 600, 768, 7, {}),                        # 12 K steps per tile, several tiles per CTA
    ("f16", 1000, 2000, 1056, 3, {"BN": 64}),               # 17 K steps, the last ragged
    ("bf16", 4096, 4096, 4096, None, {"BK": 128, "STAGES": 4}),
])
def test_sparse_gemm_pingpong_inflight(pingpong, dtype, m, n, k, programs, cfg):
    """INFLIGHT = 1: each warpgroup keeps one sparse MMA group in flight within its turn."""
    cfg = {"BN": 128, **cfg}
    tiles = -(-m // cfg.get("BM", 128)) * -(-n // cfg["BN"])
    kernel = getattr(pingpong, f"sparse_gemm_{dtype}_pingpong")
    c, ref = run(kernel, m, n, k, m + k, dtype=dtype, programs=programs or min(tiles, _sm_count()), INFLIGHT=1,
                 **cfg)
    check(c, ref, k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("f16", 3000, 700, 2048), ("bf16", 3000, 700, 2048),
                                         ("bf16", 8192, 8192, 8192), ("f16", 8192, 8192, 8192)])
def test_sparse_matmul_pingpong_schedule(dtype, m, n, k):
    """sparse_matmul(..., schedule="pingpong") on torch CUDA tensors, NaN-poisoned C, against the
    float64 product computed on the GPU (8192³ included: the size the schedule is for)."""
    import torch

    from sparsile.stdlib.kernels import prune_and_compress, sparse_matmul

    tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(m + k)
    w = torch.randn(m, k, device="cuda", generator=g)
    groups = w.view(m, k // 4, 4)
    keep = groups.abs().topk(2, dim=-1).indices  # 2:4 magnitude pruning, so that the float64 product is on the GPU
    w = (groups * torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)).view(m, k).to(tdt)
    x = torch.randn(n, k, device="cuda", generator=g).to(tdt)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    c = sparse_matmul(*prune_and_compress(w, dtype), x, schedule="pingpong", out=out)
    ref = w.double() @ x.double().T
    assert c is out and not c.isnan().any()
    err = (c.double() - ref).abs()
    assert (err <= 2.0 ** -10 * ref.abs() + 1e-3 * k ** 0.5).all(), f"max error {err.max().item()}"


def test_tma_store_epilogue_compiles_for_sm90a(mod):
    """At the shipped tile (128 x 256, four stages) the staging tile still fits the 227 KB an H200
    CTA may hold; the tile leaves by four TMA stores (one per 128-byte column panel), never by
    st.global; each thread's column pairs are one 32-bit shared store (docs/hopper.md)."""
    import re

    import ml_dtypes

    m = n = k = 1024
    args = (np.zeros((m, k // 2), ml_dtypes.bfloat16), np.zeros((m, k // 32), np.uint32),
            np.zeros((n, k), ml_dtypes.bfloat16), np.zeros((m, n), np.float16), m, n, k, k // 32, n)
    ck = mod.sparse_gemm_bf16_pair_tma[(8,)].compile_for("sm_90a", *args)
    assert ck.smem_bytes == 4 * (128 * 32 + 256 * 64) * 2 + 128 * 256 * 2 + 64  # + the barriers
    assert ck.smem_bytes + 1024 <= 227 * 1024  # + the static shared memory ptxas reports
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", ck.ptx)) == 4
    assert "st.global" not in ck.ptx and "cp.async.bulk.wait_group.read" in ck.ptx
    assert len(re.findall(r"st\.shared\.b32", ck.ptx)) == 64
