"""The consumer schedule of the Hopper sparse GEMM: ``schedule=`` of ``plan_sparse_matmul`` /
``sparse_matmul`` (stdlib/kernels/gemm.py).

* ``"default"`` (or None): the kernels of ``sparse_gemm_sm90.spk``, whose two consumer warpgroups
  share each 128 x BN tile (64 rows each), one CTA per tile or CTA pairs (docs/hopper.md §2).
* ``"pingpong"``: the kernels of ``sparse_gemm_sm90_pingpong.spk``: a persistent grid of
  min(tiles, SMs) CTAs whose consumer warpgroups take alternate whole 128 x BN tiles (BN <= 128)
  and take turns on the tensor cores, so that one warpgroup's epilogue overlaps the other's MMAs
  (docs/hopper.md, "The ping-pong schedule"). f16 and bf16 operands, float16 C, no split-K,
  always persistent.
  Not yet timed on a GPU, hence not the default.

A schedule that is not one of these, or that the call cannot use, is SP0865.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ..sparsity import SparsityError

SP_SCHEDULE = "SP0865"
SCHEDULES = ("default", "pingpong")
PINGPONG_FILE = Path(__file__).resolve().parent / "sparse_gemm_sm90_pingpong.spk"
PINGPONG_BM = 128
"""Rows of C per ping-pong tile: one warpgroup's two m64 wgmma blocks (the kernels' default BM)."""
PINGPONG_MAX_BN = 128
"""Widest N tile at BM = 128: the f32 accumulator of a warpgroup is BM x BN / 128 = 128 registers
per thread; at BN = 256 ptxas spills about 16 KB per thread even under the 232-register budget."""
PINGPONG_OPERANDS = ("f16", "bf16")


def checked_schedule(schedule: Any, operand: str, target: str, split_k: int | None, converts: bool,
                     persistent: bool = True) -> str:
    """``schedule`` as one of :data:`SCHEDULES` ("default" for None), after checking that this call
    can use it: SP0865 for an unknown schedule, or for "pingpong" with another target than sm_90a,
    another operand type than f16/bf16, split-K, a C type other than float16 (``converts``), or
    ``persistent=False`` (its grid is persistent by design)."""
    if schedule is None:
        return "default"
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise SparsityError(SP_SCHEDULE, f"unknown sparse GEMM schedule {schedule!r}",
                            help=f"schedule is one of {', '.join(map(repr, SCHEDULES))} (None: 'default')")
    if schedule == "default":
        return schedule
    why = None
    if target != "sm_90a":
        why = f"target {target} (the ping-pong kernels are Hopper kernels: sm_90a)"
    elif operand not in PINGPONG_OPERANDS:
        why = f"{operand} operands (ping-pong kernels exist for {', '.join(PINGPONG_OPERANDS)})"
    elif split_k is not None and (type(split_k) is not int or split_k != 1):
        why = f"split_k={split_k} (a ping-pong warpgroup computes a tile's whole K)"
    elif converts:
        why = "out_dtype other than float16 (the ping-pong kernels store float16 C)"
    elif not persistent:
        why = "persistent=False (its warpgroups alternate over the tiles of a persistent CTA)"
    if why is not None:
        raise SparsityError(SP_SCHEDULE, f"the ping-pong schedule is not available for {why}",
                            help="leave schedule unset (the default kernels), or change the call")
    return schedule


@functools.cache
def pingpong_module() -> Any:
    """The loaded ``sparse_gemm_sm90_pingpong.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(PINGPONG_FILE)


def pingpong_block_n(default_bn: int) -> int:
    """BN of the ping-pong kernel: the default kernel's choice (the next power of two of N),
    capped at :data:`PINGPONG_MAX_BN`."""
    return min(default_bn, PINGPONG_MAX_BN)


def pingpong_ctas(m: int, n: int, bn: int, sms: int) -> int:
    """The persistent grid: one CTA per SM, or one per tile when C has fewer tiles than SMs."""
    tiles = -(-m // PINGPONG_BM) * -(-n // bn)
    return max(1, min(tiles, sms))
