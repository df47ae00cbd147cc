"""The plan of one ``sparse_linear`` call on sm_90a (:class:`SparseLinearPlan`): its kernel launches
as data, ready to run, to compile, or to rebind to a new ``x`` of the same shape.

:func:`~.linear.plan_sparse_linear` checks the arguments and builds one; the Blackwell plan
(:class:`~.linear_sm100.SparseLinearPlanSm100`) and the decode kernel's (:mod:`.decode`) share its
interface. The launches are ``sparse_linear_<t>`` (``_pair`` on CTA pairs, ``_mt`` where the
metadata goes by TMA) or, with split-K, the f32 partial sums followed by ``splitk_reduce_linear``,
which applies the epilogue while adding them (docs/hopper.md). :func:`linear_output` is the array a
plan writes y (or sparse_matmul's C) into.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .arrays import cast_operand, output_array, pad_columns, placed_array
from .gemm import BM, kernel_module, metadata_by_tma, sm90_kernel
from .gemm_choice import KernelChoice
from .linear_args import SP_LINEAR_REBIND, X16_DTYPES, bias_or_scale, check_e4m3_x, is_gated, linear_error

REDUCE_BLOCK = 1024
STAGE_Y_ENV = "SPARSILE_LINEAR_STAGE_Y"
"""Set to 1 to stage the epilogue's y through shared memory in the sm_90a sparse_linear kernels
(``STAGE_Y``): y^T is written into a (BN, BM) buffer of y's type and leaves in 16-byte rows of
features, instead of 2-byte stores from the accumulator's layout. Only where the buffer fits next
to the pipeline ring (no split-K). Off by default: checked against float64 on the H200, and
slower there at T = 1024 (0.77-0.86x in the layer; its ~750 bytes of spills cost more than the
16-byte stores gain, and the direct transposed store was not a bottleneck: benchmarks/RESULTS.md,
fourteenth session)."""


@dataclass(frozen=True, eq=False)
class SparseLinearPlan:
    """One checked sparse_linear call: its launches as data, ready to run, compile or rebind.

    ``launches()`` lists ``(kernel, grid, args, constexprs)``: one launch of ``sparse_linear_<t>``
    (``_pair`` for large outputs), or with split-K the partial sums into the f32 ``workspace``
    (SPLIT_K, T, N_out) followed by ``splitk_reduce_linear``, which applies the epilogue. Each is
    launched as ``kernel[grid](*args, **constexprs)``.
    """

    choice: KernelChoice
    m: int            # the weight's rows, the kernel's M: the output features (N_out), or twice them (gated)
    t: int            # tokens: the kernel's N
    k: int            # K of x before padding
    k_padded: int     # K of the padded values and x (16-byte rows); the Hopper launch K
    values: Any
    meta: Any
    x: Any            # (T, k_padded), contiguous, in the operand type
    x_shape: tuple[int, int]  # x as passed: (T, K)
    x_dtype: str              # x's dtype as passed
    out: Any          # (T, N_out) row-major, out_dtype
    out_dtype: str
    bias: Any
    scale_w: Any
    scale_x: Any
    activation: str
    modes: tuple[int, int, int]  # BIAS, SCALE_W, SCALE_X
    bn: int
    split_k: int = 1
    workspace: Any = None
    pair: int = 0     # > 0: the CTA-pair kernel on that many CTAs
    interpret: bool = False
    stages: int | None = None   # STAGES and GROUP_M of a tuned table's choice (None: the kernel's defaults)
    group_m: int | None = None
    feature_major: bool = False  # out is (N_out, T): only the base of a feature-major decode plan (sparse_matmul's C)

    @property
    def weight_operands(self) -> tuple[Any, Any, Any, Any]:
        """(values, metadata words, bias, scale_w) as the launches read them: the caller's arrays,
        or the copies made when the plan was built (padded, re-encoded, converted), which a caller
        that writes its weight in place refreshes by copying a new plan's operands into them."""
        return (self.values, self.meta, self.bias, self.scale_w)

    @property
    def quantizes_x(self) -> bool:
        """e4m3 weights with 16-bit x: the base of a decode plan whose kernel quantizes x itself
        (:mod:`.decode`); ``x`` is then the caller's (T, K), neither cast nor padded."""
        return self.choice.operand == "e4m3" and self.x_dtype in X16_DTYPES

    @property
    def kernel(self) -> Any:
        """The main kernel (``sparse_linear_<t>``, ``_pair``; their ``_mt`` twin where the metadata can
        go by TMA: :func:`~.gemm.metadata_by_tma`)."""
        return sm90_kernel(f"sparse_linear_{self.choice.operand}{'_pair' if self.pair else ''}", self.choice.operand,
                           self.meta, self.split_k)

    @property
    def grid(self) -> tuple[int, int]:
        if self.pair:
            return (self.pair, 1)
        return (-(-self.m // BM) * -(-self.t // self.bn), self.split_k)

    def _epilogue_pointers(self) -> tuple[Any, Any, Any]:
        """Bias, SW, SX: the vectors, or 0 for those the epilogue leaves out (its constexprs say so
        and it never reads them; an integer rather than a placeholder array is fixed once in a
        prepared launch, where an alias of ``out`` would be re-checked on every call)."""
        return (0 if self.bias is None else self.bias, 0 if self.scale_w is None else self.scale_w,
                0 if self.scale_x is None else self.scale_x)

    @property
    def out_features(self) -> int:
        """The output's features: the weight's rows, or half of them for a gated activation."""
        return self.m // 2 if is_gated(self.activation) else self.m

    def _epilogue_constexprs(self) -> dict[str, Any]:
        bias, sw, sx = self.modes
        return {"BIAS": bias, "ACT": self.activation, "SCALE_W": sw, "SCALE_X": sx}

    def arguments(self) -> tuple[Any, ...]:
        """The main kernel's positional arguments: (A, E, B, Y, Bias, SW, SX, M, N, K, lde, ldy)."""
        lde = int(self.meta.shape[1])
        if self.split_k > 1:
            w = self.workspace
            return (self.values, self.meta, self.x, w, w, w, w, self.m, self.t, self.k_padded, lde, self.m)
        return (self.values, self.meta, self.x, self.out, *self._epilogue_pointers(), self.m, self.t,
                self.k_padded, lde, self.m)

    def constexprs(self) -> dict[str, Any]:
        """The main kernel's compile-time arguments."""
        tuned = {name: v for name, v in (("STAGES", self.stages), ("GROUP_M", self.group_m)) if v is not None}
        if self.split_k > 1:
            return {"BN": self.bn, "SPLIT_K": self.split_k, **tuned}
        staged = self.staged_y()
        return {"BN": self.bn, **tuned, **self._epilogue_constexprs(), **({"STAGE_Y": staged} if staged else {})}

    def staged_y(self) -> Any:
        """The element type of the epilogue's shared-memory staging of y (``STAGE_Y``), or None:
        only with ``SPARSILE_LINEAR_STAGE_Y=1``, without split-K, and where the (BN, BM) buffer fits
        next to the ring of STAGES x (A and B tiles)."""
        if os.environ.get(STAGE_Y_ENV) != "1" or self.split_k > 1:
            return None
        from ...frontend.ir import types as T
        from ...target.targets import get_target

        y_type = {"float16": T.f16, "bfloat16": T.bf16, "float32": T.f32}[self.out_dtype]
        eb = self.choice.elem_bytes
        bk = 128 if eb == 1 else 64  # the kernels' BK: one 128-byte row of A and B per step
        meta = BM * 16 if metadata_by_tma(self.choice.operand, self.meta) else 0  # the _mt kernels' boxes
        ring = (self.stages or 4) * ((BM * bk // 2 + self.bn * bk) * eb + meta)
        staged = self.bn * BM * y_type.bits // 8
        fits = ring + staged + 1024 <= get_target("sm_90a").resources.max_smem_per_block_optin
        return y_type if fits else None

    @property
    def reduce_kernel(self) -> Any:
        return kernel_module().splitk_reduce_linear

    @property
    def reduce_grid(self) -> tuple[int]:
        return (-(-self.m * self.t // REDUCE_BLOCK),)

    def reduce_arguments(self) -> tuple[Any, ...]:
        """splitk_reduce_linear's positional arguments: (W, Y, Bias, SW, SX, M, N, ldy)."""
        return (self.workspace, self.out, *self._epilogue_pointers(), self.m, self.t, self.out_features)

    def reduce_constexprs(self) -> dict[str, Any]:
        return {"SPLIT_K": self.split_k, **self._epilogue_constexprs(), "BLOCK": REDUCE_BLOCK}

    def launches(self) -> list[tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]]:
        """Every launch, in order, as (kernel, grid, positional args, constexprs)."""
        if self.m == 0 or self.t == 0:
            return []
        reduce = (self.reduce_kernel, self.reduce_grid, self.reduce_arguments(), self.reduce_constexprs())
        if self.k_padded == 0:  # no K: only the epilogue, of a zero workspace
            return [reduce]
        main = (self.kernel, self.grid, self.arguments(), self.constexprs())
        return [main, reduce] if self.split_k > 1 else [main]

    def run(self, interpret: bool | None = None, stream: Any = None) -> Any:
        """Launch every step (``kernel[grid](*args, stream=stream, **constexprs)``, so ``stream``
        and its default are those of a kernel launch), or run them in the CPU interpreter (default:
        as planned); returns ``out``."""
        interpret = self.interpret if interpret is None else interpret
        for kernel, grid, args, constexprs in self.launches():
            if interpret:
                kernel.interpret[grid](*args, **constexprs)
            else:
                kernel[grid](*args, stream=stream, **constexprs)
        return self.out

    def compile(self, target: str = "sm_90a") -> list[Any]:
        """Compile every launch for ``target`` (no GPU needed); the CompiledKernels."""
        return [kernel[grid].compile_for(target, *args, **cx) for kernel, grid, args, cx in self.launches()]

    def rebind(self, x: Any, out: Any = None, *, scale_x: Any = None) -> SparseLinearPlan:
        """This plan for a new ``x`` (and ``out``, ``scale_x``) of the same shape and dtype: the
        weight, its metadata, bias and scale_w are not looked at again. ``out`` None: a new array;
        ``scale_x`` None keeps the plan's. The split-K workspace is shared with this plan. This,
        not ``run()`` again, is how new activations reach a plan: ``x`` is cast and padded here
        where the kernel needs it, so a plan holding such a copy never sees an edit of the x it was
        made with (nor does one of the weight's padded or converted copies: plan again)."""
        shape = tuple(int(s) for s in getattr(x, "shape", ()))
        dtype = str(getattr(x, "dtype", "")).removeprefix("torch.")
        if shape != self.x_shape or dtype != self.x_dtype:
            raise linear_error(SP_LINEAR_REBIND, f"the plan is for x of shape {self.x_shape} {self.x_dtype}, got "
                               f"{shape} {dtype}", "plan again with plan_sparse_linear for another shape or dtype")
        xh = placed_array(x, "x", self.interpret)
        if self.quantizes_x:
            check_e4m3_x(dtype, scale_x, True)
            xk = pad_columns(xh, self.k)
        else:
            xk = pad_columns(cast_operand(xh, self.choice), self.k_padded)
        reads = (self.values, self.meta, self.bias, self.scale_w, self.scale_x if scale_x is None else scale_x)
        y = linear_output(out, self.t, self.out_features, self.out_dtype, x, self.interpret, self.feature_major,
                          reads)  # every array the launches read: the scale_x kept when none is given too
        changes: dict[str, Any] = {"x": xk, "out": y}
        if scale_x is not None:
            sx, mode = bias_or_scale(scale_x, "scale_x", self.t, x, self.interpret, ("float32",))
            changes["scale_x"] = sx
            changes["modes"] = (self.modes[0], self.modes[1], mode)
        return dataclasses.replace(self, **changes)


def linear_output(out: Any, t: int, m: int, dtype: str, home: Any, interpret: bool,
                  feature_major: bool = False, reads: tuple[Any, ...] = ()) -> Any:
    """``out`` when the kernel can write it in place, else a new (T, N_out) array of ``dtype``
    (``feature_major``: sparse_matmul's C, (N_out, T))."""
    if feature_major:
        return output_array(out, (m, t), dtype, f"C is (M, N) in {dtype}", home, interpret, reads)
    return output_array(out, (t, m), dtype, "y is (tokens, out features) in out_dtype (default: x's dtype)", home,
                        interpret, reads)
