"""The decode kernel of ``sparse_linear`` (T <= 64 tokens): a 2:4 weight stream at HBM speed.

At decode the compressed weight (N_out x K/2 values and N_out x K/8 bytes of 16-bit metadata) is
nearly all the traffic, so ``sparse_decode_sm90.spk`` (its docstring has the pipeline) gives each
CTA a 128-row slab of the weight (or 64 rows, one consumer warpgroup: twice the CTAs without a
K split, which a tuned table picks for weights of few rows) and streams it with wide TMA steps
that carry the **values, the metadata words and x together** (one ``full`` barrier per step),
several steps in flight per CTA, two CTAs per SM, and splits K over CTAs when the slabs alone do
not fill the GPU. The f32 partial sums of a split are added by ``splitk_reduce_linear``
(sparse_gemm_sm90.spk), which applies the same epilogue as the shipped kernels: bias, activation,
scales, output type, transposed store.

It is the **default** of ``plan_sparse_linear`` / ``sparse_linear`` (and so of ``SparseLinear``)
for T <= 64 on sm_90a: measured on the H200 it is 1.16-1.33x faster than the tiled
``sparse_linear_<t>`` kernels there (docs/hopper.md). ``kernel="gemm"`` or
``SPARSILE_DECODE_KERNEL=0`` keeps the tiled kernels; an explicit ``split_k`` (1-16) is honoured.
Split-K, ring depth and reduction come from a tuned table where one has an entry for the problem
(``$SPARSILE_DECODE_TABLE`` or ``tuned/decode-<gpu>.json``: :mod:`.decode_tuning`, docs/autotune.md),
else from :func:`choose_decode_config`.
``sparse_matmul`` runs it too at N <= 64 (``plan_sparse_decode(..., feature_major=True)``: C = (M, N)
stored by the kernel, FM=1; :func:`~.gemm.takes_decode`).
``plan_sparse_decode`` returns a :class:`SparseDecodePlan` with the interface of
:class:`~.linear_plan.SparseLinearPlan` (``launches()``, ``run()``, ``compile()``, ``rebind()``).

e4m3 weights with an f16 / bf16 x and no ``scale_x``: the plan takes ``sparse_decode_e4m3_qx``,
which quantizes x per token itself (the bits of ``quantize_per_token_e4m3``), one launch, where
the CTA's K share of x fits in shared memory next to the weight ring (:func:`resident_x_config`);
SP0852 where it does not.

A gated activation (``"swiglu"`` or ``"geglu"``, only here): the weight's rows are a gated MLP's
gate rows then up rows, y (T, N_out / 2) = silu(gate) * up or gelu_tanh(gate) * up, each CTA
streaming matching halves (docs/hopper.md, "The gated epilogue: SwiGLU and GeGLU"); its exchange
buffer is reserved beside the ring (``DecodeConfig.glu``).

Every argument is checked by :func:`~.linear.plan_sparse_linear` (same codes); the decode plan then
re-pads K to its step (BK = 128 elements for f16/bf16, 256 for e4m3) and the metadata words to
whole CTA slabs (rows: a multiple of BM, filled with ``0x44444444``, the code of two zero values)
so that every TMA box of metadata is in bounds and well formed; for Llama-style shapes (N_out a
multiple of 128, K of 256) nothing is copied. ``plan_sparse_decode(..., tiled=True)`` copies the
weight once into the tiled layout of :func:`tile_for_decode`, where every TMA box of the kernel is
one contiguous run of memory (plan once, ``rebind`` per call).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import (
    array_kind,
    bad_input,
    check_split_workspace,
    cupy_device,
    empty_array,
    pad_columns,
    plain_int,
    zeros_array,
)
from .decode_config import (  # noqa: F401 (re-exported: callers import the decode plan's sizes from here)
    BM256_MIN_TILE,
    DECODE_BM,
    DECODE_BMS,
    DECODE_MAXNREG,
    HEURISTIC_BM64_MAX_T,
    MAX_SPLIT,
    MAX_STAGES,
    QX_MIN_STAGES,
    QX_SCRATCH,
    SMEM_PER_CTA,
    SMEM_PER_SM,
    SUBPARTITION_REGISTERS,
    TWO_CTA_MIN_STAGES,
    DecodeConfig,
    choose_decode_config,
    heuristic_bm,
    persistent_ctas,
    register_cap,
    resident_x_config,
    x_rows,
)
from .gemm import kernel_module
from .linear_args import is_gated
from .linear_plan import SparseLinearPlan
from .plan_device import plans_on_arrays

SP_DECODE = "SP0860"
"""A kernel choice sparse_linear does not have, or a call the decode kernel cannot take."""

DECODE_FILE = Path(__file__).resolve().parent / "sparse_decode_sm90.spk"
DECODE_ENV = "SPARSILE_DECODE_KERNEL"
"""Set to 0 to keep plan_sparse_linear on the tiled kernels for T <= DECODE_MAX_T on sm_90a (the
decode kernel is the default there)."""
DECODE_MAX_T = 64
DECODE_REDUCE_ENV = "SPARSILE_DECODE_REDUCE"
"""Set to "kernel" to let the last CTA of each tile add the split-K partial sums (plan_sparse_decode's
reduce), or "launch" (the default)."""
REDUCE_MODES = ("launch", "kernel")
EMPTY_META_WORD = 0x44444444  # eight nibbles 0x4: kept positions 0 and 1 (of zero values)
KERNEL_CHOICES = ("auto", "gemm", "decode")


@functools.cache
def decode_module() -> Any:
    """The loaded ``sparse_decode_sm90.spk`` module (parsed once per process)."""
    from ...driver.module import load

    return load(DECODE_FILE)


def check_kernel_choice(kernel: str | None, caller: str = "sparse_linear") -> None:
    """SP0860 for a ``kernel=`` of sparse_linear / sparse_matmul (``caller``) that is none of
    :data:`KERNEL_CHOICES`."""
    if kernel is not None and kernel not in KERNEL_CHOICES:
        raise bad_input(f"unknown {caller} kernel {kernel!r}",
                        help="kernel is None / 'auto' (the default choice), 'gemm' or 'decode'", code=SP_DECODE)


def wants_decode(kernel: str | None, t: int, target: str) -> bool:
    """Whether plan_sparse_linear plans the decode kernel: ``kernel="decode"``, or ``kernel``
    None / "auto" unless ``SPARSILE_DECODE_KERNEL=0``; only for T <= 64 tokens on sm_90a (other
    cases keep the tiled kernels, also when "decode" is asked for)."""
    check_kernel_choice(kernel)
    if kernel == "gemm" or target != "sm_90a" or not 1 <= t <= DECODE_MAX_T:
        return False
    return kernel == "decode" or os.environ.get(DECODE_ENV, "1") != "0"


def split_workspace(home: Any, split_k: int, m: int, t: int, feature_major: bool, interpret: bool) -> Any:
    """The f32 split-K partial sums of a decode plan: (split_k, T, N_out), feature-major (split_k,
    N_out, T); None without a split."""
    if split_k == 1:
        return None
    return empty_array(home, (split_k, m, t) if feature_major else (split_k, t, m), "float32", interpret)


def padded_to(x: Any, rows: int, cols: int, fill: int = 0) -> Any:
    """2-D ``x`` extended to (rows, cols), new elements of bit pattern ``fill`` (``x`` itself when it
    fits)."""
    have_r, have_c = (int(s) for s in x.shape)
    if (have_r, have_c) == (rows, cols):
        return x
    if array_kind(x) in ("torch", "torch-cpu"):
        import torch

        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        fill = fill - (1 << 32) if ints is torch.int32 and fill >= 1 << 31 else fill
        out = torch.full((rows, cols), fill, dtype=ints, device=x.device)
        out[:have_r, :have_c] = x.view(ints)
        return out.view(x.dtype)
    if array_kind(x) == "cupy":
        import cupy as xp
    else:
        import numpy as xp
    ints = xp.dtype(f"u{x.dtype.itemsize}")
    with cupy_device(x):
        out = xp.full((rows, cols), fill, dtype=ints)
        out[:have_r, :have_c] = x.view(ints)
    return out.view(x.dtype)


def slab_words(words: Any, m: int, bm: int, cols: int) -> Any:
    """The metadata words of an N_out = ``m`` weight padded to whole slabs (rows: a multiple of
    max(128, ``bm``)) and ``cols`` words a row, with the code of two zero values."""
    slab = max(DECODE_BM, bm)
    return padded_to(words, -(-m // slab) * slab, cols, EMPTY_META_WORD)


def tile_for_decode(x: Any, bm: int, cols: int) -> Any:
    """The tiled layout of the decode kernel (``TILED=1``): ``x`` (slabs * bm, steps * cols) as
    (slabs * steps * bm, cols), box (slab i, step k) at rows (i * steps + k) * bm.., so that each
    TMA box of the kernel is one contiguous run of memory (a copy of ``x``)."""
    rows, total = (int(s) for s in x.shape)
    slabs, steps = rows // bm, total // cols
    if array_kind(x) in ("torch", "torch-cpu"):
        import torch

        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        t = x.view(ints).reshape(slabs, bm, steps, cols).permute(0, 2, 1, 3).contiguous()
        return t.view(slabs * steps * bm, cols).view(x.dtype)
    xp = np
    if array_kind(x) == "cupy":
        import cupy as xp
    with cupy_device(x):
        return xp.ascontiguousarray(x.reshape(slabs, bm, steps, cols).transpose(0, 2, 1, 3)).reshape(-1, cols)


@dataclass(frozen=True, eq=False)
class SparseDecodePlan:
    """One checked sparse_linear call on the decode kernel: ``base`` is the checked
    :class:`~.linear_plan.SparseLinearPlan` (operands, epilogue vectors, output), re-padded here.

    ``launches()``: ``sparse_decode_<t>`` on grid (cdiv(N_out, config.bm), split_k), then with split-K
    ``splitk_reduce_linear`` over the f32 ``workspace`` (split_k, T, N_out). e4m3 weights with 16-bit
    x (``quantizes_x``): ``sparse_decode_e4m3_qx`` reads x as passed and quantizes it itself; with
    split-K reduced by the second launch, it hands that launch the per-token scales in
    ``x_scales`` (T,) f32."""

    base: Any          # the SparseLinearPlan of the shipped path (the checks and operands)
    config: DecodeConfig
    values: Any        # (N_out, k_padded / 2); tiled: (slabs * steps * bm, bk / 2)
    meta: Any          # (cdiv(N_out, 128) * 128, k_padded / 32) uint32; tiled: (rows / bm * steps * bm, bk / 32)
    x: Any             # (T, k_padded)
    k_padded: int      # K rounded up to config.bk
    workspace: Any = None
    tiled: bool = False  # values and meta in the tiled layout (tile_for_decode)
    counters: Any = None  # reduce="kernel": one zeroed int32 per row tile (the kernel re-zeroes it)
    pdl: bool = False  # launched with programmatic dependent launch (plan_sparse_decode)
    x_scales: Any = None  # quantizes_x with split-K reduced by splitk_reduce_linear: the scales the kernel writes
    feature_major: bool = False  # out is C = (N_out, T) (sparse_matmul's), the workspace (split_k, N_out, T): FM=1

    @property
    def out(self) -> Any:
        return self.base.out

    @property
    def interpret(self) -> bool:
        return self.base.interpret

    @property
    def weight_operands(self) -> tuple[Any, Any, Any, Any]:
        """(values, metadata words, bias, scale_w) as the launches read them (as
        :attr:`SparseLinearPlan.weight_operands`; values and words padded or tiled here)."""
        return (self.values, self.meta, self.base.bias, self.base.scale_w)

    @property
    def reduces_in_kernel(self) -> bool:
        return self.counters is not None and self.config.split_k > 1

    @property
    def quantizes_x(self) -> bool:
        """x is 16-bit, for e4m3 weights: the kernel quantizes it per token (one launch, no scale_x)."""
        return self.config.xsteps > 0

    @property
    def kernel(self) -> Any:
        name = "sparse_decode_reduce_" if self.reduces_in_kernel else "sparse_decode_"
        return getattr(decode_module(), name + self.base.choice.operand + ("_qx" if self.quantizes_x else ""))

    @property
    def grid(self) -> tuple[int, int]:
        if self.config.persist:
            return (self.config.persist, 1)
        return (-(-self.base.m // self.config.bm), self.config.split_k)

    @property
    def ldy(self) -> int:
        """The output's row stride: N_out for y = (T, N_out) (half the weight's rows for a gated activation),
        T for the feature-major C = (N_out, T)."""
        return self.base.t if self.feature_major else self.base.out_features

    @property
    def ld_workspace(self) -> int:
        """The split-K workspace's row stride: the weight's rows (one partial sum per row, gated
        activations too), T feature-major."""
        return self.base.t if self.feature_major else self.base.m

    def arguments(self) -> tuple[Any, ...]:
        """(A, E, B, Y, Bias, SW, SX, M, N, K, ldy) of the decode kernel; quantizes_x: (A, E, X, Y,
        Bias, SW, SX, M, N, K, KX, ldx, ldy), X the caller's (T, K) x."""
        b = self.base
        partial = self.config.split_k > 1 and not self.reduces_in_kernel  # Y is the workspace
        sizes = (b.m, b.t, self.k_padded, *((b.k, b.k) if self.quantizes_x else ()),
                 self.ld_workspace if partial else self.ldy)
        bias, sw, sx = b._epilogue_pointers()
        if self.reduces_in_kernel:  # (A, E, B, Y, W, Count, Bias, SW, SX, M, N, K, ldy); quantizes_x: no SX
            vectors = (bias, sw) if self.quantizes_x else (bias, sw, sx)
            return (self.values, self.meta, self.x, b.out, self.workspace, self.counters, *vectors, *sizes)
        if self.config.split_k > 1:  # partial sums; quantizes_x: the scales at SX
            w = self.workspace
            return (self.values, self.meta, self.x, w, w, w, self.x_scales if self.quantizes_x else w, *sizes)
        return (self.values, self.meta, self.x, b.out, bias, sw, sx, *sizes)

    def constexprs(self) -> dict[str, Any]:
        c = self.config
        common = {"BN": c.bn, "BK": c.bk, "STAGES": c.stages, **({"TILED": 1} if self.tiled else {}),
                  **({"BM": c.bm, "num_warps": c.num_warps} if c.bm != DECODE_BM else {}),
                  **({"maxnreg": c.maxnreg} if c.maxnreg != DECODE_MAXNREG else {}),
                  **({"XSTEPS": c.xsteps, "XROWS": x_rows(self.base.t)} if self.quantizes_x else {}), **self._pdl(),
                  **({"FM": 1} if self.feature_major else {}), **({"PERSIST": 1} if c.persist else {})}
        epilogue = self.base._epilogue_constexprs()
        if self.quantizes_x:  # the kernel applies its own scales
            del epilogue["SCALE_X"]
        if self.reduces_in_kernel:
            return {**common, "SPLIT_K": c.split_k, **epilogue}
        if c.split_k > 1:
            return {**common, "SPLIT_K": c.split_k}
        return {**common, **epilogue}

    def launches(self) -> list[tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]]:
        """Every launch, in order, as (kernel, grid, positional args, constexprs)."""
        b = self.base
        main = (self.kernel, self.grid, self.arguments(), self.constexprs())
        if self.config.split_k == 1 or self.reduces_in_kernel:
            return [main]
        bias, sw, sx = b._epilogue_pointers()
        epilogue = b._epilogue_constexprs()
        if self.quantizes_x:  # the scales the decode kernel wrote
            sx, epilogue = self.x_scales, {**epilogue, "SCALE_X": 2}
        reduce = (kernel_module().splitk_reduce_linear, (-(-b.out_features * b.t // 1024),),
                  (self.workspace, b.out, bias, sw, sx, b.m, b.t, self.ldy),
                  {"SPLIT_K": self.config.split_k, **epilogue, "BLOCK": 1024, **self._pdl(),
                   **({"FM": 1} if self.feature_major else {})})
        return [main, reduce]

    def _pdl(self) -> dict[str, Any]:
        """The kernel's PDL constexpr and the launch option (docs/language.md, "Programmatic
        dependent launch"): both or neither (a kernel launched with pdl=True must wait, SP0590)."""
        return {"PDL": 1, "pdl": True} if self.pdl else {}

    # the same as SparseLinearPlan's: they only use launches(), interpret and out
    run = SparseLinearPlan.run
    compile = SparseLinearPlan.compile

    def rebind(self, x: Any, out: Any = None, *, scale_x: Any = None) -> SparseDecodePlan:
        """This plan for a new ``x`` (and ``out``, ``scale_x``) of the same shape and dtype (SP0853
        otherwise), without re-checking the weight; the workspace is shared with this plan (and
        ``x_scales``). quantizes_x: x is used as passed (made contiguous), and a scale_x is SP0852."""
        base = self.base.rebind(x, out, scale_x=scale_x)
        xk = base.x if self.quantizes_x else pad_columns(base.x, self.k_padded)
        return dataclasses.replace(self, base=base, x=xk)


@plans_on_arrays
def plan_sparse_decode(values: Any, meta: Any, x: Any, *, split_k: int | None = None, num_sms: int | None = None,
                       interpret: bool = False, tiled: bool = False, stages: int | None = None,
                       reduce: str | None = None, table: Any = None, pdl: bool = False, bm: int | None = None,
                       feature_major: bool = False, persistent: bool | None = None, **linear: Any) -> Any:
    """Check the arguments as :func:`~.linear.plan_sparse_linear` does and plan the decode kernel
    (``linear``: bias, activation, scale_x, scale_w, out_dtype, out). Problems it does not cover
    (K = 0, no tokens) get the shipped plan. ``split_k`` overrides the split (1..16), ``stages``
    the ring depth (2..8, within the 227 KB of shared memory a CTA may use). ``tiled``:
    copy the weight into the tiled layout (:func:`tile_for_decode`: every TMA box one contiguous
    run) once, here; plan once and ``rebind`` per call to keep that copy. ``reduce`` (split-K only):
    "launch" (the default, or ``SPARSILE_DECODE_REDUCE``) adds the partial sums in a second launch
    (``splitk_reduce_linear``); "kernel" lets the last CTA of each tile add them
    (``reduce_in_kernel`` of sparse_decode_sm90.spk, through a per-tile arrival counter the plan
    zeroes once and the kernel re-zeroes): one launch per call, the same result bit for bit (the
    shares are added in the same order), 1-3 µs more kernel time on the H200 at up to 16 tokens
    (docs/hopper.md): worth it where the host's launch costs more (sparsile.torch's eager calls).
    Plans sharing a workspace (``rebind``) share the counters too: run them on one stream.
    ``pdl``: launch with programmatic dependent launch (sm_90+): a launch may start while the
    kernel before it in the stream runs, streaming the first ring of weight boxes before it waits
    for that kernel (``pdl.wait()``), and lets the next such launch start as soon as all its CTAs
    run. Only for a weight no kernel writes while the plan is in use (docs/language.md).
    ``bm``: the weight rows per CTA, 128 (two consumer warpgroups) or 64 (one; twice the CTAs
    without splitting K, for weights of few rows). Unset, with ``split_k`` and ``stages`` unset too and
    no table entry: :func:`heuristic_bm`; unset with either given: 128.
    ``persistent``: the persistent kernel (PERSIST of sparse_decode_sm90.spk): a grid of at most the
    resident CTA slots (CTAs per SM x SMs), each CTA streaming its slabs one after another through
    one ring, so that no wave of CTAs is left part-full and a slab's epilogue overlaps the next
    slab's loads; no split-K (split_k unset: 1; an explicit split_k above 1 is SP0860), no x quantized
    by the kernel, no PDL (SP0860 when asked for with either). Unset: the table's choice ("persistent"
    in an entry's config) where the plan can take it (not with pdl or 16-bit x for e4m3 weights: the
    entry's split and stages on the other kernel then), else off.
    ``feature_major`` (``sparse_matmul``'s route for N <= 64): the output is C = (N_out, T), row-major
    (``out`` of that shape), x the (T, K) operand b; M, T and K must not be 0 (sparse_matmul handles
    those cases itself).

    Without ``split_k``, ``stages`` and ``bm`` a tuned table decides them (and ``reduce``, unless given or
    set by ``SPARSILE_DECODE_REDUCE``) where it has an entry for this device, dtype, N_out, K and
    token tile: ``table`` (a path or a table mapping; False: none), else ``$SPARSILE_DECODE_TABLE``,
    else the shipped ``tuned/decode-<gpu>.json`` (:mod:`.decode_tuning`, docs/autotune.md); the
    plan's ``config.source`` says which ("heuristic", "explicit", "table:<file>")."""
    from .linear import plan_sparse_linear, planned_sm_count

    split_k, num_sms, stages, bm = (plain_int(v) for v in (split_k, num_sms, stages, bm))  # numpy integers too
    if not isinstance(pdl, bool):
        raise bad_input(f"pdl of the decode kernel must be True or False, got {pdl!r}", code=SP_DECODE)
    if persistent is not None and not isinstance(persistent, bool):
        raise bad_input(f"persistent of the decode kernel must be True, False or None, got {persistent!r}",
                        code=SP_DECODE)
    if reduce is not None:
        reduce_mode(reduce)  # checked whatever the split (it was read only for split-K plans)
    base = plan_sparse_linear(values, meta, x, interpret=interpret, target="sm_90a", num_sms=num_sms,
                              split_k=1, kernel="gemm", _quantized_in_kernel=True, _feature_major=feature_major,
                              **linear)
    if split_k is not None and (not isinstance(split_k, int) or isinstance(split_k, bool)
                                or not 1 <= split_k <= MAX_SPLIT):
        raise bad_input(f"split_k of the decode kernel must be an integer from 1 to {MAX_SPLIT}, got {split_k!r}")
    if bm is not None and (type(bm) is not int or bm not in DECODE_BMS):
        raise bad_input(f"bm of the decode kernel must be one of {', '.join(map(str, DECODE_BMS))}, got {bm!r}",
                        help="128: two consumer warpgroups per CTA; 64: one, and twice the CTAs; 256: four, "
                        "each step's x serving twice the rows", code=SP_DECODE)
    bad_stages = stages is not None and (not isinstance(stages, int) or isinstance(stages, bool)
                                         or not 2 <= stages <= MAX_STAGES)
    if base.k_padded == 0 or base.m == 0 or base.t == 0:  # (after the arguments' checks: a shipped plan)
        if bad_stages:  # (the range only: no ring to measure)
            raise bad_input(f"stages of the decode kernel must be an integer from 2 to {MAX_STAGES} whose ring fits "
                            f"in {SMEM_PER_CTA // 1024} KB of shared memory, got {stages!r}")
        if feature_major:  # the base plan would store y = (T, N_out)
            raise bad_input(f"a feature-major decode plan needs M, N and K above 0, got {base.m} x {base.t} x {base.k}",
                            help="sparse_matmul handles empty problems without a launch", code=SP_DECODE)
        return base
    if is_gated(base.activation) and (tiled or feature_major):
        raise bad_input(f"the decode kernel's gated epilogue ({base.activation!r}) takes neither a tiled weight "
                        "nor a feature-major output",
                        help="plan it with tiled=False", code=SP_DECODE)
    if base.t > DECODE_MAX_T:
        raise bad_input(f"the decode kernel takes at most {DECODE_MAX_T} tokens, got {base.t}",
                        help="plan it with plan_sparse_linear (kernel unset or 'gemm') for more tokens", code=SP_DECODE)
    sms = num_sms or planned_sm_count(interpret)
    asked = (split_k, stages)  # the caller's, which the resident x's rule keeps
    source = "heuristic" if split_k is None and stages is None and bm is None else "explicit"
    found = None
    if source == "heuristic" and table is not False:
        from .decode_tuning import SP_TABLE_ENTRY, table_choice

        found = table_choice(base.choice.operand, base.m, base.k, base.t, interpret, table, num_sms)
        if found is not None:
            split_k, stages, bm, source = found[0].split_k, found[0].stages, found[0].bm, found[1]
            if persistent is None:  # the table's persistent kernel where this plan can run it (entries are
                # timed without pdl, on x of the weight's type: 16-bit x for e4m3 weights keeps the other kernel)
                persistent = found[0].persistent and not pdl and not base.quantizes_x
            if reduce is None and os.environ.get(DECODE_REDUCE_ENV) is None:
                reduce = found[0].reduce
    if persistent and asked[0] is None and not base.quantizes_x:  # the persistent kernel takes no split: not
        split_k = 1  # the heuristic's or a (non-persistent) table entry's
    if source == "heuristic":  # (no table entry either)
        bm = heuristic_bm(base.m, base.t, sms)
    cfg = choose_decode_config(base.m, base.t, base.k_padded, base.choice, sms, split_k,
                               None if bad_stages else stages, bm or DECODE_BM, is_gated(base.activation))
    eb = base.choice.elem_bytes
    if cfg.glu and not pairs_rows_in_kernel(cfg, reduce):  # no exchange buffer to reserve beside the ring
        cfg = choose_decode_config(base.m, base.t, base.k_padded, base.choice, sms, cfg.split_k,
                                   None if bad_stages else stages, cfg.bm, False)
    while found is not None and cfg.glu and cfg.stages > 2 and cfg.smem_bytes(eb) > SMEM_PER_CTA:
        # the table's depth was tuned without the gated epilogue's buffer: the deepest ring beside it
        cfg = choose_decode_config(base.m, base.t, base.k_padded, base.choice, sms, cfg.split_k, cfg.stages - 1,
                                   cfg.bm, True)
    if base.quantizes_x and not bad_stages:
        cfg = resident_x_config(base, cfg, *asked)
        if cfg.glu and not pairs_rows_in_kernel(cfg, reduce):  # (a split it chose: as above)
            cfg = dataclasses.replace(cfg, glu=False)
    too_big = cfg.smem_bytes(eb) > SMEM_PER_CTA
    if too_big and found is not None:  # the table's entry, not the caller, asked for these stages
        raise bad_input(f"the decode table ({source}) gives {found[0]} for {base.m} x {base.k}, "
                        f"{base.t} tokens: {stages} stages do not fit in {SMEM_PER_CTA // 1024} KB of "
                        "shared memory", help="tune the table again (benchmarks/tune_decode.py) or "
                        "remove that entry", code=SP_TABLE_ENTRY)
    if bad_stages or too_big:
        raise bad_input(f"stages of the decode kernel must be an integer from 2 to {MAX_STAGES} whose ring fits in "
                        f"{SMEM_PER_CTA // 1024} KB of shared memory, got {stages!r}",
                        help=f"one step takes {cfg.stage_bytes(base.choice.elem_bytes)} bytes here")
    if persistent:
        if cfg.split_k != 1 or cfg.xsteps or pdl:
            raise bad_input("the persistent decode kernel takes no split-K, no x it quantizes itself and no pdl, got "
                            f"split_k={cfg.split_k}" + (", 16-bit x for e4m3 weights" if cfg.xsteps else "")
                            + (", pdl=True" if pdl else ""), code=SP_DECODE,
                            help="plan it with split_k=1 and pdl=False (e4m3 weights: quantize x first), or "
                            "without persistent")
        cfg = dataclasses.replace(cfg, persist=persistent_ctas(base.m, cfg, sms))
    cfg = dataclasses.replace(cfg, source=source)
    check_split_workspace(cfg.split_k, base.m, base.t, "fewer tokens at a time")
    k_padded = -(-base.k_padded // cfg.bk) * cfg.bk
    # whole 128-row slabs for 128 and 64 rows per CTA (64 divides them): untiled copies of the weight
    # are then the same for every plan of it (sparsile.torch refreshes a record's copies from a plan of
    # one token, and builds a new record where their shapes differ); whole 256-row slabs for 256, so
    # that no metadata box reaches beyond the words (TMA's zero fill is the undefined code 0x0); a
    # tiled copy's arrangement depends on cfg.bm
    words = slab_words(base.meta, base.m, cfg.bm, k_padded // 32)
    if tiled:
        vals = tile_for_decode(padded_to(base.values, int(words.shape[0]), k_padded // 2), cfg.bm, cfg.bk // 2)
        words = tile_for_decode(words, cfg.bm, cfg.bk // 32)
    else:
        vals = pad_columns(base.values, k_padded // 2)
    xk = base.x if cfg.xsteps else pad_columns(base.x, k_padded)  # the kernel quantizing x reads it as it is
    work = split_workspace(x, cfg.split_k, base.m, base.t, feature_major, interpret)
    counters = scales = None
    if cfg.split_k > 1 and reduce_mode(reduce) == "kernel":
        counters = zeros_array(x, (-(-base.m // cfg.bm),), "int32", interpret)  # one per CTA row tile
    elif cfg.split_k > 1 and cfg.xsteps:  # the per-token scales, from the kernel to the reduce launch
        scales = empty_array(x, (base.t,), "float32", interpret)
    return SparseDecodePlan(base, cfg, vals, words, xk, k_padded, work, bool(tiled), counters, pdl, scales,
                            bool(feature_major))


def pairs_rows_in_kernel(cfg: DecodeConfig, reduce: str | None) -> bool:
    """Whether the decode kernel pairs the gate and up rows of a gated activation itself (and
    allocates the exchange tile ``DecodeConfig.glu`` reserves): without a split, or with split-K
    reduced in the kernel; the partial sums of a split reduced by a second launch are paired there."""
    return cfg.split_k == 1 or reduce_mode(reduce) == "kernel"


def reduce_mode(reduce: str | None) -> str:
    """``reduce`` checked (SP0860), else the environment's choice, else "launch"."""
    mode = reduce if reduce is not None else os.environ.get(DECODE_REDUCE_ENV, "launch")
    if mode not in REDUCE_MODES:
        raise bad_input(f"reduce of the decode kernel must be 'launch' or 'kernel', got {mode!r}",
                        help="'launch': a second kernel adds the split-K partial sums; 'kernel': the last CTA does",
                        code=SP_DECODE)
    return mode
