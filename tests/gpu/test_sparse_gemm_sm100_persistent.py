"""The persistent Blackwell sparse GEMM (stdlib/kernels/sparse_gemm_sm100_persistent.spk).

Interpreter runs (always): every kind against ``sparse_matmul_reference`` (float64) on random
2:4 / 1:2 operands with C poisoned first, always with FEWER programs than tiles so that each
program loops over several tiles, reuses both TMEM accumulator buffers and carries the ring's
slot/phase counter across tiles; ragged M, N, K; K of one step and of many; uneven tile counts
per program, one program for everything, more programs than tiles. A missing arrival or a wrong
phase parity must be reported as a deadlock quickly, not hang. The ``gpu`` tests run on a
Blackwell GPU and skip elsewhere: none was available, they have never run (docs/blackwell.md)."""

from __future__ import annotations

import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import sparsile as sp
from sparsile.frontend.interp.values import InterpreterError
from sparsile.stdlib import sparsity as S
from sparsile.tests.support.foreign_arch import blackwell as blackwell  # a fixture

KERNEL = Path(__file__).resolve().parents[2] / "stdlib" / "kernels" / "sparse_gemm_sm100_persistent.spk"
HOST = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "e4m3": ml_dtypes.float8_e4m3fn,
        "i8": np.int8}
TOOLKIT = {"i8": "s8"}
BN = {"f16": 128, "bf16": 128, "tf32": 128, "e4m3": 192, "i8": 192}  # the kernels' defaults
ATOM_K = {"f16": 128, "bf16": 128, "tf32": 64, "e4m3": 128, "i8": 128}  # BK: one metadata atom
POISON_I32 = -0x21524111


@pytest.fixture(scope="module")
def persistent():
    return sp.load(KERNEL)


def operands(dtype: str, m: int, n: int, k: int, seed: int):
    """Compressed A (M, K/2), "tcgen05" metadata as the (-1, 4) view the kernel's TMA reads, B
    (N x K), the float64 reference and sum |a||b| (the scale of accumulation errors)."""
    rng = np.random.default_rng(seed)
    if dtype == "i8":
        a, b = rng.integers(-90, 90, (m, k)).astype(np.int8), rng.integers(-90, 90, (n, k)).astype(np.int8)
    else:
        a = rng.standard_normal((m, k)).astype(np.float32).astype(HOST[dtype])
        b = rng.standard_normal((n, k)).astype(np.float32).astype(HOST[dtype])
    dt = TOOLKIT.get(dtype, dtype)
    vals, idx = S.compress(S.prune(a, dt), dt)
    meta = S.encode_metadata(idx, "tcgen05", dt, k=k)
    ref = S.sparse_matmul_reference(vals, meta, b.T)
    dense = S.decompress(vals, meta).astype(np.float64)
    assert np.count_nonzero(dense) > dense.size // 3 and np.count_nonzero(b) > b.size // 2  # not all zero
    return vals, np.asarray(meta.data).reshape(-1, 4), b, ref, np.abs(dense) @ np.abs(b.astype(np.float64)).T


def check(dtype: str, c: np.ndarray, ref: np.ndarray, absprod: np.ndarray, k: int, gpu: bool = False) -> None:
    """Integers exactly. Floats: f32 accumulation (K·2^-23·Σ|ab|), tf32 inputs (2^-9·Σ|ab|), on a
    GPU a possibly narrower fp8 accumulator, then one rounding to f16 (2^-11 relative, plus the
    subnormal spacing)."""
    if dtype == "i8":
        np.testing.assert_array_equal(c.astype(np.int64), ref.astype(np.int64))
        return
    assert not np.isnan(c).any(), "unwritten output elements"
    acc = max(k, 1) * 2.0 ** -23 * absprod
    if dtype == "tf32":
        acc = acc + 2.0 ** -9 * absprod
    if gpu and dtype == "e4m3":
        acc = acc + (k // 64 + 1) * 2.0 ** -13 * absprod
    bound = acc + 2.0 ** -11 * (np.abs(ref) + acc) + 2.0 ** -24
    err = np.abs(c.astype(np.float64) - ref)
    assert (err <= bound).all(), f"max error {err.max()} (bound there {bound.flat[err.argmax()]})"


def tiles(m: int, n: int, bn: int) -> int:
    return -(-m // 128) * -(-n // bn)


def run(mod, dtype: str, m: int, n: int, k: int, programs: int, seed: int = 0, interpret: bool = True, **cfg):
    vals, meta, b, ref, absprod = operands(dtype, m, n, k, seed)
    c = np.full((m, n), POISON_I32, np.int32) if dtype == "i8" else np.full((m, n), np.nan, np.float16)
    kern = getattr(mod, f"sparse_gemm_{dtype}")
    (kern.interpret if interpret else kern)[(programs,)](vals, meta, b, c, m, n, k, **cfg)
    return c, ref, absprod


DTYPES = ["f16", "bf16", "tf32", "e4m3", "i8"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fewer_programs_than_tiles_many_k_steps(persistent, dtype):
    """6 tiles on 2 programs: each computes 3 tiles (buffer 0, 1, then 0 again) of 3 K steps."""
    m, n, k = 334, 2 * BN[dtype] - 24, 3 * ATOM_K[dtype] - 32  # ragged M, N and K (rows of 16-byte units)
    assert tiles(m, n, BN[dtype]) == 6
    c, ref, absprod = run(persistent, dtype, m, n, k, programs=2, seed=11)
    check(dtype, c, ref, absprod, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_k_step_uneven_tiles_per_program(persistent, dtype):
    """7 tiles on 3 programs (3, 2, 2 tiles), K within one metadata atom (one K step per tile)."""
    m, n, k = 7 * 128 - 5, BN[dtype] - 8, ATOM_K[dtype] // 2 + 16 * (2 if ATOM_K[dtype] > 64 else 1)
    assert tiles(m, n, BN[dtype]) == 7
    c, ref, absprod = run(persistent, dtype, m, n, k, programs=3, seed=12)
    check(dtype, c, ref, absprod, k)


@pytest.mark.parametrize("programs,cfg", [
    (1, dict(STAGES=2)),                   # one program, 5 tiles x 5 K steps through a 2-stage ring
    (2, dict(STAGES=3, GROUP_M=2)),        # 3 stages (ring phases out of step with tiles), groups of 2
    (3, dict(BN=64, STAGES=4, GROUP_M=1)),  # narrow N tiles, column-major tile order
    (9, dict(STAGES=2)),                   # more programs than tiles: the extra ones compute nothing
])
def test_configurations(persistent, programs, cfg):
    m, n, k = 300, 264 if cfg.get("BN") != 64 else 152, 5 * 128 - 32
    c, ref, absprod = run(persistent, "f16", m, n, k, programs=programs, seed=13 + programs, **cfg)
    check("f16", c, ref, absprod, k)


def test_result_does_not_depend_on_the_number_of_programs(persistent):
    """The same tiles are computed whichever program takes them: bit-identical C for 1, 2, 5 programs."""
    outs = [run(persistent, "bf16", 260, 296, 256, programs=p, seed=5)[0] for p in (1, 2, 5)]
    for c in outs[1:]:
        np.testing.assert_array_equal(c.view(np.uint16), outs[0].view(np.uint16))


# ------------------------------------------------------------------------------------------------
# A broken protocol is reported as a deadlock, quickly
# ------------------------------------------------------------------------------------------------
def mutated(old: str, new: str):
    src = KERNEL.read_text()
    assert src.count(old) == 1, old
    return sp.loads(src.replace(old, new), name="mutated", path=KERNEL)  # its imports resolve beside it


DEADLOCK = {"SP0782": "deadlock: every partition waits"}
RACE_OR_DEADLOCK = {**DEADLOCK, "SP0791": "`tma.load` overwrites shared memory that the `tcgen05."}


@pytest.mark.parametrize("old,new,faults", [
    # the epilogue never hands the accumulator back: the MMA warp waits for it at the third tile
    ("                mbarrier.arrive(acc_empty[b])\n", "                pass\n", DEADLOCK),
    # the MMA warp waits for the first phase of acc_empty instead of passing its fresh state
    ("mbarrier.wait(acc_empty[b], ((i // 2) & 1) ^ 1)", "mbarrier.wait(acc_empty[b], (i // 2) & 1)", DEADLOCK),
    # the producer's ring phase does not carry across tiles (k instead of the global counter): its wait
    # passes a phase early, so, as the threads interleave, its TMA load overwrites a stage an MMA still
    # reads (the race, SP0791) or the ring stalls (the deadlock)
    ("mbarrier.wait(empty[s], ((it // STAGES) & 1) ^ 1)", "mbarrier.wait(empty[s], ((k // STAGES) & 1) ^ 1)",
     RACE_OR_DEADLOCK),
])
def test_a_broken_protocol_is_reported_as_a_deadlock_or_a_race(old, new, faults):
    mod = mutated(old, new)
    vals, meta, b, _, _ = operands("f16", 384, 256, 256, 3)  # 6 tiles of 2 K steps on one program
    c = np.full((384, 256), np.nan, np.float16)
    start = time.monotonic()
    with pytest.raises(InterpreterError) as info:
        mod.sparse_gemm_f16.interpret[(1,)](vals, meta, b, c, 384, 256, 256, STAGES=3)
    assert info.value.code in faults and info.value.message.startswith(faults[info.value.code]), str(info.value)
    assert time.monotonic() - start < 10  # detected, not timed out (the backstop timeout is 20 s)


# ------------------------------------------------------------------------------------------------
# On a Blackwell GPU (never run: no such GPU was available)
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m,n,k", [("f16", 128, 128, 128), ("f16", 1000, 1000, 1024), ("bf16", 1000, 600, 768),
                                         ("tf32", 500, 300, 512), ("e4m3", 1000, 600, 1024), ("i8", 1000, 700, 1024),
                                         ("f16", 4096, 4096, 4096)])
def test_persistent_sparse_gemm_on_blackwell(blackwell, persistent, dtype, m, n, k):
    if dtype == "i8" and blackwell.compute_capability == (10, 3):
        pytest.skip("kind::i8 does not exist on sm_103")
    programs = min(tiles(m, n, BN[dtype]), blackwell.sm_count)
    c, ref, absprod = run(persistent, dtype, m, n, k, programs, seed=m + n + k, interpret=False)
    check(dtype, c, ref, absprod, k, gpu=True)


@pytest.mark.gpu
def test_persistent_with_few_programs_on_blackwell(blackwell, persistent):
    """Many tiles per CTA on the hardware: 3 CTAs for 64 tiles, ring and buffers reused 20+ times."""
    c, ref, absprod = run(persistent, "f16", 1024, 1024, 512, 3, seed=7, interpret=False)
    check("f16", c, ref, absprod, 512, gpu=True)
