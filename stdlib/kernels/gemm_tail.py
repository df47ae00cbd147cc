"""The tail split of the sm_90a sparse GEMM: whole waves of unsplit tiles, then the last, part-full
wave's rows split along K.

The tiled kernels run one CTA per SM (the CTA-pair kernel one cluster per two SMs), so C's tiles
take ``ceil(tiles / slots)`` rounds of a tile's time each. Where the last round is part-full, its
idle SMs are lost: 8B qkv at T = 1024 (6144 x 1024 x 4096, BN 256) has 192 tiles on the H200's 132
SMs, 1.45 waves run as two, and it ran at 72 % of the rate the same weight reaches at T = 4096
(benchmarks/RESULTS.md, twentieth and twenty-second sessions). A :class:`TailSplitMatmul` runs rows [0, head_rows) of C,
the most whole row blocks whose tiles fit in whole rounds (the head), as before, then the other
rows (the tail) with K split ``split`` ways (the ``_splitk`` kernel, then ``splitk_reduce``), so
that the tail's CTAs fill at most one wave at 1 / split of a tile's time. That is the
"data-parallel + split-K" hybrid of stream-K, done by the plan with the kernels as they are: the
head and the tail are row views of A, the metadata words (whole 16-row groups:
docs/sparse-metadata.md §4) and C. It costs two more launches (the tail's GEMM and its reduction)
and the tail's f32 partial sums, so the tuner decides (``GemmConfig.tail_split``, docs/autotune.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .arrays import empty_array
from .gemm import BM, SparseMatmul, has_pair_kernel, pair_grid

TAIL_SPLITS = (2, 4)
"""The K splits of the tail that the tuner times."""
TAIL_MIN_STEPS = 4
"""K steps each share of the tail keeps at least (a share pays a pipeline fill and its partial sums)."""


def head_rows(m: int, n: int, bn: int, sms: int, pair: bool = False) -> int:
    """The rows of an M x N C whose tiles fill whole rounds of the kernel on ``sms`` SMs: BM x
    ``bn`` tiles on one CTA per SM, or (``pair``) 2 BM x ``bn`` tiles on one cluster of two CTAs per
    two SMs; the most whole row blocks of at most ``floor(tiles / slots) * slots`` tiles. 0 where C
    has less than one round or no tail: its rows are then all head or all tail."""
    unit, slots = (2 * BM, sms // 2) if pair else (BM, sms)
    if m <= 0 or n <= 0 or slots < 1:
        return 0
    row_tiles = -(-n // bn)
    rounds = -(-m // unit) * row_tiles // slots
    rows = rounds * slots // row_tiles * unit
    return rows if 0 < rows < m else 0


def tail_tiles(m: int, n: int, bn: int, sms: int, pair: bool = False) -> int:
    """The BM x ``bn`` tiles of the tail that :func:`head_rows` leaves (0 where there is no head)."""
    rows = head_rows(m, n, bn, sms, pair)
    return -(-(m - rows) // BM) * -(-n // bn) if rows else 0


def tail_splits(m: int, n: int, k_steps: int, bn: int, sms: int, pair: bool = False) -> list[int]:
    """The splits of :data:`TAIL_SPLITS` that apply to this C: there is a head, the tail's CTAs
    (tiles x split) fit in one wave, and every share keeps :data:`TAIL_MIN_STEPS` K steps."""
    tiles = tail_tiles(m, n, bn, sms, pair)
    return [s for s in TAIL_SPLITS if tiles and tiles * s <= sms and k_steps // s >= TAIL_MIN_STEPS]


@dataclass(frozen=True, eq=False)
class TailSplitMatmul:
    """A sparse GEMM as two plans over row views of one C: ``head`` (unsplit, one CTA per tile or
    CTA pairs) and ``tail`` (split-K into its own workspace, then ``splitk_reduce``)."""

    head: SparseMatmul
    tail: SparseMatmul
    out: Any  # the whole C, which head.out and tail.out view

    @property
    def parts(self) -> tuple[SparseMatmul, SparseMatmul]:
        return (self.head, self.tail)

    @property
    def workspace(self) -> Any:
        """The tail's f32 partial sums (split, tail rows, N)."""
        return self.tail.workspace

    def run(self, interpret: bool = False, **constexprs: Any) -> Any:
        """Launch the head, then the tail (``constexprs``: a tuned config's STAGES and GROUP_M for
        both); returns C."""
        self.head.run(interpret, **constexprs)
        self.tail.run(interpret, **constexprs)
        return self.out

    def compile(self, target: str = "sm_90a") -> tuple[Any, Any]:
        """The CompiledKernels of the head's and the tail's GEMM launches for ``target``."""
        return (self.head.compile(target), self.tail.compile(target))


def tail_split_plan(plan: SparseMatmul, split: int, pair: bool, sms: int, interpret: bool = False
                    ) -> TailSplitMatmul | None:
    """``plan`` (its BN as planned) as a head of whole rounds (``pair``: on CTA pairs) and a tail
    split ``split`` ways, or None where that does not apply: ``split`` is not one of
    :func:`tail_splits` for this C on ``sms`` SMs, C is not the kernel's own store type (the head
    would need partial sums too), or ``pair`` for an operand type without the CTA-pair kernel."""
    converts = plan.out_dtype not in ("", plan.choice.out_dtype)
    if converts or plan.pingpong_ctas or (pair and not has_pair_kernel(plan.choice)):
        return None
    steps = -(-plan.k_padded // plan.choice.block_k)
    if split not in tail_splits(plan.m, plan.n, steps, plan.bn, sms, pair):
        return None
    h = head_rows(plan.m, plan.n, plan.bn, sms, pair)
    head = dataclasses.replace(plan, m=h, values=plan.values[:h], meta=plan.meta[:h], out=plan.out[:h], split_k=1,
                               workspace=None, pair_ctas=pair_grid(h, plan.n, plan.bn, sms) if pair else 0)
    work = empty_array(plan.b, (split, plan.m - h, plan.n), plan.choice.partial_dtype, interpret)
    tail = dataclasses.replace(plan, m=plan.m - h, values=plan.values[h:], meta=plan.meta[h:], out=plan.out[h:],
                               split_k=split, workspace=work, pair_ctas=0)
    return TailSplitMatmul(head, tail, plan.out)
