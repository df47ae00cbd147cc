"""``sparse_linear(..., target="sm_100a")``: the fused-epilogue linear layer on the persistent
Blackwell sparse GEMM (``sparse_linear_<t>`` of ``sparse_gemm_sm100_persistent.spk``).

The operands are prepared as for :func:`~.gemm_sm100.plan_sparse_matmul_sm100` ("tcgen05"
metadata, K padded to 16-byte rows, the launch K within the metadata atoms); the epilogue warps
then apply the same ``linear_epilogue`` as the Hopper kernels and store y (T, N_out) row-major with
plain stores (docs/hopper.md, "The sparse_linear kernels"). There is no split-K on Blackwell.

Not run on a Blackwell GPU (none was available): checked in the interpreter and compiled for
sm_100a (tests/stdlib/test_linear_api_sm100.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .gemm_sm100 import BM, KERNELS_SM100, KernelChoiceSm100, checked_sm100_operands, persistent_grid
from .gemm_sm100 import kernel_module as sm100_module
from .linear_plan import SparseLinearPlan

LINEAR_KERNELS_SM100: dict[str, KernelChoiceSm100] = {name: KERNELS_SM100[name] for name in ("f16", "bf16", "e4m3")}
"""Operand types with a Blackwell ``sparse_linear_<t>`` kernel."""


def blackwell_operands(values: Any, meta: Any, x: Any, target: str, interpret: bool, meta_format: str | None = None
                       ) -> tuple[KernelChoiceSm100, Any, Any, Any, int, int, int, int, int]:
    """(choice, values, words, x, N_out, T, K, K x is padded to, K to launch with). ``meta_format``
    "sm90": ``meta`` is a raw array of "sm90" words (what ``sparsile.torch`` layers keep), validated
    and re-encoded in the "tcgen05" format here (docs/sparse-metadata.md §4, §5); a raw array is
    otherwise taken as "tcgen05" words."""
    from ..sparsity import MetadataBuffer, validate_metadata
    from .gemm_choice import resolve_kernel_choice

    choice = resolve_kernel_choice(values, meta, None, LINEAR_KERNELS_SM100, "Blackwell", takes_dtype=False)
    if meta_format == "sm90" and not isinstance(meta, MetadataBuffer):
        m, k = int(values.shape[0]), int(x.shape[-1])
        meta = validate_metadata(meta, "sm90", choice.operand, m=m, k=k)
    _, values, words, xc, m, t, k, k_launch = checked_sm100_operands(values, meta, x, target, choice.operand,
                                                                      interpret)
    return choice, values, words, xc, m, t, k, int(xc.shape[1]), k_launch


@dataclass(frozen=True, eq=False)
class SparseLinearPlanSm100(SparseLinearPlan):
    """A :class:`~.linear_plan.SparseLinearPlan` of the persistent Blackwell kernel: one launch of
    ``min(#tiles, num_sms)`` programs (``launches()``, ``run``, ``rebind`` as there)."""

    target: str = "sm_100a"
    k_launch: int = 0
    num_sms: int = 148

    @property
    def kernel(self) -> Any:
        return getattr(sm100_module(True), f"sparse_linear_{self.choice.operand}")

    @property
    def grid(self) -> tuple[int]:  # type: ignore[override]
        return (persistent_grid(-(-self.m // BM) * -(-self.t // self.bn), self.num_sms),)

    def arguments(self) -> tuple[Any, ...]:
        """(A, E, B, Y, Bias, SW, SX, M, N, K, ldy)."""
        return (self.values, self.meta, self.x, self.out, *self._epilogue_pointers(), self.m, self.t, self.k_launch,
                self.m)

    def constexprs(self) -> dict[str, Any]:
        return {"BN": self.bn, **self._epilogue_constexprs()}

    def launches(self) -> list[tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]]:
        if self.m and self.t and self.k_launch == 0:  # no K: the epilogue of zero sums only
            return [(self.reduce_kernel, self.reduce_grid, self.reduce_arguments(), self.reduce_constexprs())]
        return super().launches()

    def compile(self, target: str | None = None) -> list[Any]:
        return super().compile(target or self.target)
