"""The tail split of the sm_90a sparse GEMM: whole waves of unsplit tiles, then the last, part-full
wave's rows split along K.

The tiled kernels run one CTA per SM, so C's ``tiles`` BM x BN tiles take ``ceil(tiles / SMs)``
waves of a tile's time each. Where the last wave is part-full, its idle SMs are lost: 8B qkv at
T = 1024 (6144 x 1024 x 4096, BN 256) has 192 tiles on the H200's 132 SMs, 1.45 waves run as two,
and it ran at 72 % of the kernel's large-C rate (benchmarks/RESULTS.md, eighteenth and twenty-second
sessions). A plan with ``head_rows`` runs rows [0, head_rows) of C, which fill whole waves, as
before, then rows [head_rows, M), the tail, with K split ``split_k`` ways (``_splitk`` kernel, then
``splitk_reduce``), so that the tail's CTAs fill about one wave at 1 / split_k of a tile's time.
That is CUTLASS's "data-parallel + split-K" hybrid of stream-K, done by the plan with the kernels
as they are: the head and the tail are row slices of A, the metadata words (whole 16-row groups:
docs/sparse-metadata.md §4) and C, so no kernel changes. It costs one or two more launches and the
tail's f32 partial sums, so the tuner decides (``GemmConfig.tail_split``, docs/autotune.md).
"""

from __future__ import annotations

import dataclasses

from .gemm import BM, SparseMatmul

TAIL_SPLITS = (2, 4)
"""The K splits of the tail that the tuner times."""
TAIL_MIN_STEPS = 4
"""K steps each share of the tail keeps at least (a share pays a pipeline fill and its partial sums)."""


def head_rows(m: int, n: int, bn: int, sms: int) -> int:
    """The rows of an M x N C in BM x ``bn`` tiles that fill its whole waves of one CTA per SM on
    ``sms`` SMs (the most whole row blocks of at most ``floor(tiles / sms) * sms`` tiles); 0 where C
    has less than one wave or no tail: its rows are then all head or all tail."""
    row_tiles = -(-n // bn)
    tiles = -(-m // BM) * row_tiles
    waves = tiles // sms
    rows = waves * sms // row_tiles * BM
    return rows if 0 < rows < m else 0


def tail_tiles(m: int, n: int, bn: int, sms: int) -> int:
    """The tiles of the tail that :func:`head_rows` leaves (0 where there is no head)."""
    rows = head_rows(m, n, bn, sms)
    return -(-(m - rows) // BM) * -(-n // bn) if rows else 0


def tail_splits(m: int, n: int, k_steps: int, bn: int, sms: int) -> list[int]:
    """The splits of :data:`TAIL_SPLITS` worth timing for this C: there is a head, the tail's CTAs
    (tiles x split) fit in one wave, and every share keeps :data:`TAIL_MIN_STEPS` K steps."""
    tiles = tail_tiles(m, n, bn, sms)
    return [s for s in TAIL_SPLITS if tiles and tiles * s <= sms and k_steps // s >= TAIL_MIN_STEPS]


def tail_split_parts(plan: SparseMatmul) -> tuple[SparseMatmul, SparseMatmul]:
    """The head (rows [0, head_rows): unsplit, the plan's CTA pairs) and the tail (the other rows:
    split ``plan.split_k`` ways into ``plan.workspace``) of a tail-split plan, each a plan of its own
    over row views of the plan's values, metadata words and C."""
    h = plan.head_rows
    head = dataclasses.replace(plan, m=h, values=plan.values[:h], meta=plan.meta[:h], out=plan.out[:h], split_k=1,
                               workspace=None, head_rows=0)
    tail = dataclasses.replace(plan, m=plan.m - h, values=plan.values[h:], meta=plan.meta[h:], out=plan.out[h:],
                               pair_ctas=0, head_rows=0)
    return head, tail

