"""The decode kernel's configuration (sparse_decode_sm90.spk): row slab, token tile, K step, ring
depth, K split and CTAs per SM, as the untabled heuristic chooses them for a weight and a token
count on the H200 (the decode table, stdlib/kernels/tuned/decode-h200.json, overrides them), with the
shared-memory and register limits they must fit (docs/hopper.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...frontend.layout.gf2 import next_power_of_two
from .arrays import bad_input

if TYPE_CHECKING:
    from .gemm_choice import KernelChoice

DECODE_BM = 128           # weight rows per CTA by default: two consumer warpgroups of 64
DECODE_BMS = (128, 64, 256)  # the row slabs a CTA may own: 64 is one consumer warpgroup (5 warps), twice the CTAs;
# 256 is four (17 warps), each step's x then serving twice the weight rows (for T >= BM256_MIN_TILE)
BM256_MIN_TILE = 32
"""The smallest token tile for which the decode tuner times 256-row slabs: from 32 tokens a step's x
(BN x BK) is half the size of a 128-row slab's values or more, and a 256-row slab halves the x
that the grid reads per weight byte."""
DECODE_MAXNREG = 112  # the decode kernels' @kernel(maxnreg=...): 9 warps would allow 168
SUBPARTITION_REGISTERS = 16 * 1024  # 32-bit registers of each of an SM's 4 sub-partitions (sm_90)
SMEM_PER_SM = 228 * 1024  # H200 shared memory per SM; a CTA may use 227 KB, 1 KB is reserved per CTA
SMEM_PER_CTA = 227 * 1024
MAX_STAGES = 8
HEURISTIC_BM64_MAX_T = 16  # the most tokens for which the untabled heuristic takes 64-row slabs
TWO_CTA_MIN_STAGES = 4
"""The shallowest ring for which the heuristic sizes the decode kernel for two CTAs per SM. Only
64-token tiles of 128-row slabs have steps so large (34-36 KB) that half an SM holds just three:
there all sixteen bf16 / f16 entries the H200 tuner wrote for the Llama-3 8B / 70B weights at
T = 64 chose one CTA per SM with 4-7 stages over the two CTAs of 3 stages, by 1.00-1.27x (HBM-cold,
twenty-first session, benchmarks/RESULTS.md)."""
MAX_SPLIT = 16
QX_SCRATCH = 1024
"""Shared memory the kernel that quantizes x (sparse_decode_e4m3_qx) holds beyond its ring and its
resident x: the scales and their reciprocals (2 x BN f32) and the compiler's scratch of its
cross-warp reduction, at most 512 bytes as compiled (test_decode_qx.py checks the bound)."""
QX_MIN_STAGES = 4
"""The ring depth the kernel that quantizes x takes at least, where it fits (``resident_x_config``).
The tables' depths are the two-launch kernel's, whose ring also carries x: 2 stages on 28672 x
4096, where the one launch then took 25.8 µs at T = 1 against 22.9 for the two launches. With 4
stages it took 21.4 µs (H200, graph replay from HBM, benchmarks/RESULTS.md, eighteenth session)."""


@dataclass(frozen=True)
class DecodeConfig:
    """The decode kernel's compile-time choices for one problem."""

    bn: int          # token tile: T rounded up to a power of two, 8..64 (the wgmma N)
    bk: int          # K elements per pipeline step (128 for 16-bit operands, 256 for e4m3)
    stages: int      # ring depth
    split_k: int     # CTAs along K
    ctas_per_sm: int  # the occupancy the shared-memory budget was sized for
    source: str = "heuristic"  # where split_k / stages came from: "heuristic", "explicit", "table:<file>"
    bm: int = DECODE_BM  # weight rows per CTA (DECODE_BMS): 64 halves the slab and doubles the CTAs
    xsteps: int = 0  # > 0: 16-bit x quantized by the kernel into a resident buffer of this many K steps
    persist: int = 0  # > 0: the persistent kernel (PERSIST) on this many CTAs, each streaming several slabs
    glu: bool = False  # a gated activation: an f32 (bm, bn) buffer for the epilogue's exchange of row halves

    def stage_bytes(self, elem_bytes: int) -> int:
        """Bytes one pipeline step moves: values, metadata words, x (not when x is resident)."""
        bm = self.bm
        x = 0 if self.xsteps else self.bn * self.bk * elem_bytes
        return bm * self.bk // 2 * elem_bytes + bm * (self.bk // 32) * 4 + x

    def smem_bytes(self, elem_bytes: int) -> int:
        """The kernel's shared memory: the ring and its two barriers per stage; with resident x
        (``xsteps``) also that buffer (one e4m3 byte per element) and :data:`QX_SCRATCH`; with
        ``glu`` the gated epilogue's f32 tile."""
        ring = self.stages * (self.stage_bytes(elem_bytes) + 16)
        return ring + (self.xsteps * self.bn * self.bk + QX_SCRATCH if self.xsteps else 0) + self.glu_bytes

    @property
    def glu_bytes(self) -> int:
        """The gated epilogue's exchange buffer (f32, bm x bn) and 128 bytes for its alignment (after
        the resident x's scales it was placed 64 bytes further than their sum), 0 without ``glu``."""
        return self.bm * self.bn * 4 + 128 if self.glu else 0

    @property
    def num_warps(self) -> int:
        """The CTA's warps: a consumer warpgroup per 64 rows and the producer warp."""
        return self.bm // 16 + 1

    @property
    def maxnreg(self) -> int:
        """The registers per thread the kernel is compiled for: the kernels' own 112, lowered to what
        this CTA's warps fit in (:func:`register_cap`)."""
        return min(DECODE_MAXNREG, register_cap(self.num_warps))


def register_cap(num_warps: int) -> int:
    """The most registers per thread with which a CTA of ``num_warps`` warps can launch on Hopper:
    its warps are spread over the SM's 4 sub-partitions of 16 K registers each, so one sub-partition
    holds ceil(num_warps / 4) of them, and a thread's registers are allocated in units of 8
    (docs/hopper.md, "Why 168 registers"). 17 warps (256-row slabs): 5 per sub-partition, 96."""
    per_warp = SUBPARTITION_REGISTERS // -(-num_warps // 4) // 32
    return min(255, per_warp // 8 * 8)


def two_ctas_fit(bm: int) -> bool:
    """Whether two CTAs of ``bm``-row slabs can share an SM's registers: not 256-row slabs, whose
    17 warps each hold up to 96 registers per thread (:func:`register_cap`), 52 K of the 64 K."""
    return bm != 256


def persistent_ctas(m: int, cfg: DecodeConfig, sms: int) -> int:
    """The persistent kernel's grid for N_out = ``m``: one CTA per slab, at most the resident CTA slots."""
    return min(-(-m // cfg.bm), cfg.ctas_per_sm * sms)


def choose_decode_config(m: int, t: int, k: int, choice: KernelChoice, sms: int,
                         split_k: int | None = None, stages: int | None = None, bm: int = DECODE_BM,
                         glu: bool = False) -> DecodeConfig:
    """Tile, ring and split for N_out = ``m``, T = ``t``, K = ``k`` on ``sms`` SMs.

    Two CTAs per SM when at least :data:`TWO_CTA_MIN_STAGES` steps fit in half the shared memory
    (keeps ~2 x 3 steps in flight per SM: Little's law wants ~30 KB at 4.8 TB/s and ~700 ns), else
    one CTA with a deeper ring. K is split so that the grid has about one CTA per SM (``sms // tiles``
    shares), with at least two steps per share: the H200 sweep of ten Llama-3 8B / 70B shapes
    (stdlib/kernels/tuned/decode-h200.json, benchmarks/RESULTS.md) found the best split at or
    below that in every case but one (6144 x 4096 at 16 tokens), and filling both CTA slots of
    every SM with shares (twice the split) 1.02-1.13x slower: more shares add partial sums to
    write and reduce without adding bandwidth. ``split_k`` / ``stages`` override the choice (for
    tuning on the GPU); the occupancy follows from the stages. ``bm``: the rows of weight per CTA
    (128 unless a table or the caller says 64 or 256). ``glu``: room for the gated epilogue's
    buffer is kept beside the ring."""
    eb = choice.elem_bytes
    bn = 8
    while bn < t:
        bn *= 2
    bk = 128 if eb == 2 else 256
    probe = DecodeConfig(bn, bk, 1, 1, 1, bm=bm, glu=glu)
    stage = probe.stage_bytes(eb)
    per_cta = SMEM_PER_SM // 2 - 1024 - 1024 - probe.glu_bytes  # reserved + barriers and alignment
    two_fit = two_ctas_fit(bm)
    forced = stages
    stages, ctas = per_cta // stage, 2
    if stages < TWO_CTA_MIN_STAGES or not two_fit:
        stages, ctas = (SMEM_PER_SM - 2048 - probe.glu_bytes) // stage, 1
    stages = max(2, min(MAX_STAGES, stages))
    if forced is not None:
        stages = forced
        ctas = 2 if two_fit and stages * (stage + 16) <= per_cta else 1
    tiles = -(-m // bm)
    steps = -(-k // bk)
    if split_k is None:
        split_k = max(1, min(sms // max(tiles, 1), steps // 2, MAX_SPLIT))
    return DecodeConfig(bn, bk, stages, split_k, ctas, bm=bm, glu=glu)


def x_rows(t: int) -> int:
    """The token rows the kernel that quantizes x reads and quantizes (XROWS): T rounded up to a
    power of two, which may be below BN (8 at least), so that T = 1 keeps every thread of its
    prologue busy on the one row."""
    return next_power_of_two(t)


def heuristic_bm(m: int, t: int, sms: int) -> int:
    """The weight rows per CTA of a plan no table entry or caller decides: 64 where the 64-row
    slabs of N_out = ``m`` fit in one wave of ``sms`` CTAs and T = ``t`` is at most
    :data:`HEURISTIC_BM64_MAX_T`, else 128. On the H200 the tuner chose 64-row slabs for every bf16
    and e4m3 weight of up to 8192 rows at T <= 16 (1.01-1.22x over 128-row slabs with split-K,
    HBM-cold graph timing) and 128 for every weight of 14336 rows or more, where the 64-row slabs
    take more than one wave. At T = 64 a 64-row slab reads x once per 64 rows instead of 128, and
    on weights of large K that cost more than the slabs gained (5120 x 13824: 0.82x at T = 64, 0.93x
    at T = 32, where smaller K still gained 1.02-1.14x); up to T = 16 every measured weight was
    0.98-1.13x (benchmarks/bench_decode_heuristic.py, benchmarks/RESULTS.md, sixteenth session)."""
    return 64 if t <= HEURISTIC_BM64_MAX_T and -(-m // 64) <= sms else DECODE_BM


def resident_x_config(base: Any, cfg: DecodeConfig, split_k: int | None, stages: int | None) -> DecodeConfig:
    """``cfg`` (the table's, the heuristic's or the caller's choice, as for e4m3 x) for the kernel
    that quantizes 16-bit x itself and keeps its K share resident in shared memory
    (``sparse_decode_e4m3_qx``): unchanged where the ring and the resident x fit in a CTA's 227 KB
    (:meth:`DecodeConfig.smem_bytes`), else the smallest K split from cfg's up (at most
    :data:`MAX_SPLIT`, and the K steps) at which they fit with a ring of 2 or more stages. The ring
    is the deepest that fits up to cfg's depth or :data:`QX_MIN_STAGES`, whichever is more: the
    consumers quantize x before their first MMA, and only the ring's stages stream meanwhile. A
    ``split_k`` or ``stages`` the caller gave is kept. SP0852 where nothing fits: then x must be
    quantized first (quantize_per_token_e4m3)."""
    steps = -(-base.k_padded // cfg.bk)
    eb = base.choice.elem_bytes
    splits = [cfg.split_k] if split_k is not None else range(cfg.split_k, max(cfg.split_k, min(MAX_SPLIT, steps)) + 1)
    deepest = max(cfg.stages, QX_MIN_STAGES)
    for split in splits:
        for depth in [cfg.stages] if stages is not None else range(deepest, 1, -1):
            fitted = dataclasses.replace(cfg, split_k=split, stages=depth, xsteps=-(-steps // split))
            if fitted.smem_bytes(eb) <= SMEM_PER_CTA:
                two = two_ctas_fit(fitted.bm) and 2 * (fitted.smem_bytes(eb) + 1024) <= SMEM_PER_SM
                return dataclasses.replace(fitted, ctas_per_sm=2 if two else 1)
    from .linear import SP_LINEAR_FP8_INPUT

    fixed = "".join(f", {name}={v}" for name, v in (("split_k", split_k), ("stages", stages)) if v is not None)
    raise bad_input(f"e4m3 weights with x of {base.x_dtype}: the decode kernel quantizes x itself only where its "
                    f"share of x fits in shared memory next to the weight ring, and {base.t} tokens of K = {base.k} "
                    f"do not (bm={cfg.bm}{fixed})", code=SP_LINEAR_FP8_INPUT,
                    help="quantize x with quantize_per_token_e4m3(x) and pass its scale as scale_x (two launches)")
