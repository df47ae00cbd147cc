"""Stream-K plans of the sm_90a sparse GEMM (``sparse_gemm_sm90_streamk.spk``): the (tile, K step)
work of C split evenly over a grid of one CTA per SM.

With one CTA per tile, C's tiles take ``ceil(tiles / SMs)`` waves and the last is part-full: 6144 x
512 in 128 x 256 tiles is 96 tiles, so 36 of the H200's 132 SMs idle for the whole launch (it ran at
0.88x cuSPARSELt, benchmarks/RESULTS.md, twenty-third session). The tail split (``gemm_tail.py``)
helps where C has at least one whole wave; stream-K also where it has less. Each CTA streams
``units // ctas`` units of MK K steps (to within one), tile after tile; the tiles that runs share
are added by the last CTA to arrive through a workspace of two f32 tiles per CTA and one arrival
counter per tile (zeroed here once, re-zeroed by the kernel). One launch; the kernel reads the
metadata words by TMA, so it applies where the ``_mt`` kernels do (:func:`~.gemm.metadata_by_tma`),
for f16, bf16 and e4m3 operands, with C of the kernel's own type (float16).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arrays import empty_array, zeros_array
from .gemm import BM, SparseMatmul, metadata_by_tma

STREAMK_FILE = Path(__file__).resolve().parent / "sparse_gemm_sm90_streamk.spk"
STREAMK_OPERANDS = ("f16", "bf16", "e4m3")
MAX_PRODUCT = 2 ** 31 - 1
"""The kernel computes ``p * units``, ``(u + 1) * P`` (at most units x CTAs) and nothing larger in
32-bit integers (``owner``: ``((u + 1) * P - 1) // units``)."""


def streamk_module() -> Any:
    """The loaded ``sparse_gemm_sm90_streamk.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(STREAMK_FILE)


def streamk_units(m: int, n: int, k_steps: int, bn: int, mk: int) -> int:
    """The (tile, MK K steps) units of an M x N C of BM x ``bn`` tiles over ``k_steps`` steps."""
    return -(-m // BM) * -(-n // bn) * -(-k_steps // mk)


def streamk_ctas(units: int, sms: int) -> int:
    """The grid: one CTA per SM, at most one per unit; 0 where the kernel's 32-bit arithmetic would
    overflow (:data:`MAX_PRODUCT`)."""
    ctas = max(1, min(sms, units))
    return ctas if (units + 1) * ctas <= MAX_PRODUCT else 0


def metadata_steps(choice: Any) -> int:
    """MK: the K steps one metadata box covers (two where a step has two words per row)."""
    return 2 if choice.block_k // 32 == 2 else 1


@dataclass(frozen=True, eq=False)
class StreamKMatmul:
    """A sparse GEMM on the stream-K kernel: ``plan``'s operands and C (its BN), ``ctas`` CTAs,
    ``workspace`` (2 x ctas, BM x BN) f32 and ``counters`` (one zeroed int32 per tile)."""

    plan: SparseMatmul
    ctas: int
    workspace: Any
    counters: Any

    @property
    def out(self) -> Any:
        return self.plan.out

    @property
    def kernel(self) -> Any:
        return getattr(streamk_module(), f"{self.plan.choice.kernel}_streamk")

    @property
    def grid(self) -> tuple[int]:
        return (self.ctas,)

    def arguments(self) -> tuple[Any, ...]:
        p = self.plan
        return (p.values, p.meta, p.b, p.out, self.workspace, self.counters, p.m, p.n, p.k_padded, p.n)

    def run(self, interpret: bool = False, **constexprs: Any) -> Any:
        """Launch (``constexprs``: a tuned config's STAGES and GROUP_M) and return C."""
        launch = self.kernel.interpret[self.grid] if interpret else self.kernel[self.grid]
        launch(*self.arguments(), BN=self.plan.bn, **constexprs)
        return self.out

    def compile(self, target: str = "sm_90a") -> Any:
        """The CompiledKernel for ``target``."""
        return self.kernel[self.grid].compile_for(target, *self.arguments(), BN=self.plan.bn)


def streamk_plan(plan: SparseMatmul, sms: int, interpret: bool = False) -> StreamKMatmul | None:
    """``plan`` (its BN as planned) on the stream-K kernel over ``sms`` SMs, or None where it does
    not apply: another operand type, metadata words the kernel cannot read by TMA, C of another
    type than float16, the ping-pong kernel, an empty C or K (no units), or a problem too large for
    its 32-bit unit arithmetic."""
    choice = plan.choice
    if (choice.operand not in STREAMK_OPERANDS or plan.out_dtype not in ("", choice.out_dtype)
            or plan.pingpong_ctas or not (plan.m and plan.n and plan.k_padded)
            or not metadata_by_tma(choice.operand, plan.meta)):
        return None
    steps = -(-plan.k_padded // choice.block_k)
    units = streamk_units(plan.m, plan.n, steps, plan.bn, metadata_steps(choice))
    ctas = streamk_ctas(units, sms)
    if not ctas:
        return None
    counters = zeros_array(plan.b, (-(-plan.m // BM) * -(-plan.n // plan.bn),), "int32", interpret)
    work = empty_array(plan.b, (2 * ctas, BM * plan.bn), "float32", interpret)
    base = dataclasses.replace(plan, split_k=1, workspace=None, pair_ctas=0)
    return StreamKMatmul(base, ctas, work, counters)
