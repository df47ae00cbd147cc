"""One launch configuration of the sm_90a sparse GEMM (:class:`GemmConfig`) and its JSON form.

What the tuners vary (BN, STAGES, split-K, the CTA-pair kernel, GROUP_M, a tail split, stream-K,
INFLIGHT, the L2 hints), the rules that tie them together (ValueError for a combination no kernel
takes), and the ``config`` of an entry of the tuned tables (docs/autotune.md). The tuners
(:mod:`.tuning`, :mod:`.linear_tuning`) build and time them; ``sparse_matmul`` and ``sparse_linear``
launch with a table's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_STAGES = 4  # the kernels' STAGES default (sparse_gemm_sm90.spk)
DEFAULT_GROUP_M = 16


@dataclass(frozen=True)
class GemmConfig:
    """One launch configuration of the sm_90a sparse GEMM."""

    bn: int
    stages: int = DEFAULT_STAGES
    split_k: int = 1
    pair: bool = False
    group_m: int = DEFAULT_GROUP_M
    tail_split: int = 0  # > 1: whole waves unsplit (pair: CTA pairs), the last wave's rows split K this many ways
    streamk: bool = False  # the stream-K kernel (gemm_streamk.py): every SM an even share of the (tile, K step) work
    inflight: bool = False  # INFLIGHT=1: one sparse MMA group kept in flight across K steps (no split-K, no tail split)
    l2: bool = False  # L2 hints: the weight's loads evict-first, B's evict-last (L2_HINTS; no split-K, no tail split)

    def __post_init__(self) -> None:
        if self.tail_split and (self.tail_split < 2 or self.split_k != 1):
            raise ValueError(f"tail_split must be 0 or at least 2 with split_k 1, got tail_split={self.tail_split} "
                             f"split_k={self.split_k}")
        if self.streamk and (self.split_k != 1 or self.pair or self.tail_split):
            raise ValueError(f"streamk takes split_k 1, no pair and no tail_split, got {self}")
        if self.inflight and (self.split_k != 1 or self.tail_split or self.streamk):
            raise ValueError(f"INFLIGHT takes split_k 1, no tail_split and no streamk (the kernels with one MMA group "
                             f"in flight store C themselves), got {self}")
        if self.l2 and (self.split_k != 1 or self.tail_split or self.streamk):
            raise ValueError(f"L2 takes split_k 1, no tail_split and no streamk (the hints are the unsplit GEMM "
                             f"kernels' constexprs), got {self}")

    def to_json(self) -> dict[str, Any]:
        return {"BN": self.bn, "STAGES": self.stages, "split_k": self.split_k, "pair": self.pair,
                "GROUP_M": self.group_m, **({"tail_split": self.tail_split} if self.tail_split else {}),
                **({"streamk": True} if self.streamk else {}), **({"INFLIGHT": 1} if self.inflight else {}),
                **({"L2": 1} if self.l2 else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GemmConfig:
        return cls(int(data["BN"]), int(data.get("STAGES", DEFAULT_STAGES)), int(data.get("split_k", 1)),
                   bool(data.get("pair", False)), int(data.get("GROUP_M", DEFAULT_GROUP_M)),
                   int(data.get("tail_split", 0)), bool(data.get("streamk", False)), _flag(data.get("INFLIGHT", 0)),
                   _flag(data.get("L2", 0), "L2"))

    def __str__(self) -> str:
        return (f"BN={self.bn} STAGES={self.stages} split_k={self.split_k} pair={int(self.pair)} "
                f"GROUP_M={self.group_m}" + (f" tail_split={self.tail_split}" if self.tail_split else "")
                + (" streamk" if self.streamk else "") + (" INFLIGHT=1" if self.inflight else "")
                + (" L2" if self.l2 else ""))


def _flag(value: Any, name: str = "INFLIGHT") -> bool:
    """A table's 0 / 1 (or false / true) flag ``name``; ValueError for anything else."""
    if value not in (0, 1) or type(value) not in (int, bool):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return bool(value)
