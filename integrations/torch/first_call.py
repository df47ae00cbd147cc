"""``warm_up(model)``: compile the kernels a sparsified model's first calls need, eager and traced
by torch.compile, ahead of them and in parallel (docs/torch.md, "Compiling ahead of the first call").

An eager call of a :class:`~.linear.SparseLinear` on CUDA builds a launch record per token count T
(``_kernels.LaunchRecord``): it plans the call (``plan_sparse_linear``) and prepares each launch,
which compiles every kernel specialization the plan names on first use (about 1 s each for the
sparse GEMM: benchmarks/RESULTS.md), one after another. :func:`first_call_launches` lists the
launches those records plan for a weight and T (the same planner calls with the same arguments:
the main plan, the one-launch eager variants, the e4m3 quantizer), :func:`warm_up` compiles their
distinct specializations in worker processes (driver/compile_pool.py: llvmlite serializes every
LLVM call of a process behind one lock, so threads would overlap little). The compiled kernels
land in the compile cache (memory and ``SPARSILE_CACHE_DIR``); the first call then finds them
there. No kernel is launched; without a GPU the kernels are compiled for ``target`` (default sm_90a).
A call traced by torch.compile runs the custom op instead (``ops.run_record``), whose records plan
otherwise (no PDL; an e4m3 x quantized apart, then a record of the fp8 x): ``traced=True`` lists
those.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...driver.compile_pool import CompileTimeout, Specialization, compile_specializations
from ...stdlib.kernels.arrays import host_tensors_as_device
from ...stdlib.kernels.decode import DECODE_REDUCE_ENV
from ...stdlib.kernels.linear_args import is_gated
from ..errors import SP_WARM_UP, SP_WARM_UP_TIMEOUT, IntegrationError
from ._kernels import (
    EAGER_REDUCE_MAX_T,
    OUT_DTYPES,
    RECORD_QUANTIZE_MAX_T,
    SM90_WORDS,
    glu_in_kernel,
    k_shares,
    kernel_api,
    passes_through,
    pdl_wanted,
    quantizes_in_kernel,
)
from .linear import SparseLinear
from .weight import Weight, tracked_tensors

Launch = tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]


@dataclass
class WarmUpReport:
    """What :func:`warm_up` did: the distinct kernel specializations its layers' first calls need
    (``kernels``: kernel name and constexprs, in the order found), how many it compiled and how many
    the compile cache already held, the seconds it took, and the targets it compiled for (``target``:
    one name, or several joined by ", " where the layers' GPUs differ)."""

    kernels: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    compiled: int = 0
    cached: int = 0
    seconds: float = 0.0
    target: str = ""
    layers: int = 0

    def __str__(self) -> str:
        return (f"warm_up: {len(self.kernels)} kernel specializations for {self.layers} layers on {self.target} "
                f"({self.compiled} compiled, {self.cached} already cached) in {self.seconds:.2f} s")


def _warm_error(message: str, help: str) -> IntegrationError:
    return IntegrationError(SP_WARM_UP, message, help=help)


def _check_tokens(tokens: Any) -> tuple[int, ...]:
    items = (tokens,) if isinstance(tokens, int) else tokens
    try:
        out = tuple(items)
    except TypeError:
        out = None
    if not out or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in out):
        raise _warm_error(f"tokens must be a positive integer or a non-empty sequence of them, got {tokens!r}",
                          "the token counts (rows of x) the first calls will have, e.g. tokens=(1, 16, 512)")
    return tuple(dict.fromkeys(out))


def _check_jobs(jobs: Any) -> int:
    if jobs is None:
        return os.cpu_count() or 1
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise _warm_error(f"jobs must be a positive integer or None, got {jobs!r}",
                          "the worker processes that compile at once; None: one per CPU core")
    return jobs


def warmed_layers(model: nn.Module, traced: bool = False) -> list[SparseLinear]:
    """The layers whose eager calls build launch records: every :class:`SparseLinear` of ``model``
    (``model`` itself included) that runs its own kernel, the fused layers of the projection groups
    (``fuse_projections_``) in place of their members, and for a fused MLP (``glu=True``) its gated
    layer alone: the gated forward replaces the calls of its group's fused layer, and the gated
    layer's own launches are those of its twin's pre-activations where the kernel does not apply
    the activation (:func:`first_call_launches`), so neither is listed (they held kernels no first
    call compiles). ``traced``: those whose calls traced by torch.compile build records of the
    custom op instead: a group's fused layer (a fused MLP's gated layer instead) only where the
    group fuses in traces (``fuse_projections_(traced=True)``), else its members, each its own op."""
    from .training import SemiSparseLinear

    found: dict[int, SparseLinear] = {}
    for module in model.modules():
        glu = getattr(module.__dict__.get("forward"), "__self__", None)
        if hasattr(glu, "layers") and hasattr(glu, "linear"):  # a fused MLP's GatedForward
            if not traced or glu.group.traced:
                found.setdefault(id(glu.linear), glu.linear)
        if not isinstance(module, SparseLinear) or isinstance(module, SemiSparseLinear):
            continue
        fused = module.__dict__.get("_fused")
        if fused is not None and fused[0].fused is not None and (fused[0].traced or not traced):
            gated = fused[0].glu is not None and fused[0].glu.installed()  # (its calls: the gated layer's)
            if not gated:
                found.setdefault(id(fused[0].fused), fused[0].fused)
            continue
        found.setdefault(id(module), module)
    return list(found.values())


def _plan_launches(api: Any, w: Weight, x: torch.Tensor, y: torch.Tensor, scale_x: torch.Tensor | None,
                   out_dtype: torch.dtype, activation: str | None, **options: Any) -> tuple[Any, list[Launch]]:
    options = {k: v for k, v in options.items() if v is not None}  # (None: the planner's default)
    plan = api.plan_sparse_linear(w.values, w.meta, x, bias=w.bias, activation=activation, scale_x=scale_x,
                                  scale_w=w.scale_w, out_dtype=OUT_DTYPES[out_dtype], out=y, **SM90_WORDS, **options)
    return plan, plan.launches()


def first_call_launches(layer: SparseLinear, tokens: int, x_dtype: torch.dtype = torch.bfloat16,
                        target: str | None = None, *, traced: bool = False) -> list[Launch]:
    """The launches (kernel, grid, args, constexprs) whose kernels an eager CUDA call of ``layer`` on
    ``tokens`` rows of x in ``x_dtype`` compiles: those of the plans its launch record makes
    (``_kernels.LaunchRecord``, through the same ``kernel_api().plan_sparse_linear`` calls), the
    quantizer of an e4m3 layer included; the one-launch eager variants only where the record makes
    them (its main plan takes x and y as they are: not for a plan that pads x). ``traced``: those of
    a call traced by torch.compile (or captured into a CUDA graph after torch's warm-up) instead,
    through the custom op (``ops.run_record``: a record of the op's cache, which plans without PDL;
    an e4m3 x quantized by ``quantize_per_token`` first, then a record of the fp8 x and its scales,
    as an eager call of more than RECORD_QUANTIZE_MAX_T tokens). The arrays are the layer's own
    weight and empty x and y on its device; on the CPU they are planned as a GPU's tensors
    (``arrays.host_tensors_as_device``), but the plans are those of a GPU-less host (no tuned table
    unless a GPU is visible), for ``target`` (default the planner's: the GPU's, else sm_90a)."""
    on_host = layer._bound().values.device.type != "cuda"
    with host_tensors_as_device() if on_host else contextlib.nullcontext():
        return _record_launches(layer, tokens, x_dtype, target, traced)


def _record_pdl(layer: SparseLinear, w: Weight, traced: bool) -> bool:
    """Whether the record of a call plans with PDL: ``RecordCache.run``'s choice, for the layer's own
    cache (SPARSILE_PDL=1: constant weights) or, traced, the custom op's (``ops.RECORDS``)."""
    from .ops import RECORDS  # (ops imports linear, which this module imports first)

    cache = RECORDS if traced else layer.__dict__.get("_records")
    return (getattr(cache, "pdl", False) and pdl_wanted(w.values.device)
            and tracked_tensors(w) is not None)


def _record_launches(layer: SparseLinear, tokens: int, x_dtype: torch.dtype, target: str | None,
                     traced: bool = False) -> list[Launch]:
    """:func:`first_call_launches`, planned (the same choices as ``LaunchRecord._plan``)."""
    api = kernel_api()
    w = layer._bound()
    activation = w.activation
    device = w.values.device
    if is_gated(activation) and (target not in (None, "sm_90a") or not glu_in_kernel(tokens, device)):
        activation = None  # the pre-activations, gated by torch
    t, k = tokens, layer.in_features
    out_dtype = layer.out_dtype or x_dtype
    rows = int(w.values.shape[0])
    y = torch.empty((t, w.out_features if activation == w.activation else rows), dtype=out_dtype, device=device)
    reduce_eagerly = t <= EAGER_REDUCE_MAX_T and os.environ.get(DECODE_REDUCE_ENV) is None
    # SPARSILE_PDL=1: a layer's records plan with PDL (the GEMM) and TRIGGER (the quantizer) on sm_90+
    pdl = _record_pdl(layer, w, traced)
    planning = {"target": target, "pdl": True if pdl else None}  # (None: not passed)
    launches: list[Launch] = []
    if w.scale_w is None:  # 16-bit weights: x cast to the weight's type
        x = torch.zeros((t, k), dtype=w.values.dtype, device=device)  # (zeros: a plan may read x, to cast it)
        plan, main = _plan_launches(api, w, x, y, None, out_dtype, activation, **planning)
        launches += main
        # the record's eager variant, where its launches are prepared (x and y taken as they are)
        if passes_through(main, x, y) and len(main) > 1 and reduce_eagerly and hasattr(plan, "reduces_in_kernel"):
            _, one = _plan_launches(api, w, x, y, None, out_dtype, activation, reduce="kernel", **planning)
            launches += one if len(one) == 1 else []
        return launches
    from ...stdlib.kernels.quantize_e4m3 import quantize_module, quantize_options

    x16 = torch.zeros((t, k), dtype=x_dtype, device=device)
    xq = torch.zeros((t, k), dtype=torch.float8_e4m3fn, device=device)
    static = layer.input_scale
    quantizing = t <= RECORD_QUANTIZE_MAX_T and not traced  # the record quantizes x (else quantize_per_token)
    trigger = {"TRIGGER": 1} if pdl and quantizing else {}  # (the record's own quantizer)
    if static is not None:  # a static input scale: its quantizer (eager; traced, torch's operations), the GEMM
        return launches + _static_launches(api, w, static.detach(), x16, xq, y, out_dtype, activation, planning,
                                           {} if traced else trigger, quantizing, reduce_eagerly, traced)
    sx = torch.ones((t,), dtype=torch.float32, device=device)
    quantizer = (quantize_module().quantize_e4m3_per_token, (t,), (x16, xq, sx, k, k, k), quantize_options(k))
    launches.append((*quantizer[:3], {**quantizer[3], **trigger}))
    plan, main = _plan_launches(api, w, xq, y, sx, out_dtype, activation, **planning)
    launches += main
    if not quantizing:  # quantized into fresh buffers per call, then the record of the fp8 x and its scales
        if passes_through(main, xq, y, sx) and len(main) > 1 and reduce_eagerly and hasattr(plan, "reduces_in_kernel"):
            _, one = _plan_launches(api, w, xq, y, sx, out_dtype, activation, reduce="kernel", **planning)
            launches += one if len(one) == 1 else []  # (traced: split-K reduced in the kernel up to 16 tokens)
        return launches
    if not passes_through(main, xq, y, sx):  # a padded plan: calls quantize x per call (quantize_per_token)
        return launches + ([quantizer] if trigger else [])  # (its quantizer has no TRIGGER)
    if quantizes_in_kernel(t, rows, k):  # one launch of the decode kernel quantizing x itself
        try:
            qplan, one = _plan_launches(api, w, x16, y, None, out_dtype, activation, **planning,
                                        **({"reduce": "kernel"} if reduce_eagerly else {}))
        except ValueError:  # (SparsityError: not planned for this T or target; the record keeps two launches)
            qplan, one = None, []
        if getattr(qplan, "quantizes_x", False) and len(one) == 1 and k_shares(qplan) <= k_shares(plan):
            launches += one  # (compiled when the record prepares it, even where it then reads a copy of x)
            if passes_through(one, x16, y):
                return launches
    if len(main) > 1 and reduce_eagerly and hasattr(plan, "reduces_in_kernel"):
        _, one = _plan_launches(api, w, xq, y, sx, out_dtype, activation, reduce="kernel", **planning)
        launches += one if len(one) == 1 else []
    return launches


def _static_launches(api: Any, w: Weight, static: torch.Tensor, x16: torch.Tensor, xq: torch.Tensor, y: torch.Tensor,
                     out_dtype: torch.dtype, activation: str | None, planning: dict[str, Any], trigger: dict[str, int],
                     quantizing: bool, reduce_eagerly: bool, traced: bool) -> list[Launch]:
    """:func:`first_call_launches` of an e4m3 layer with a static input scale: an eager call's static
    quantizer (``quantize_e4m3_static``: the record's first launch up to RECORD_QUANTIZE_MAX_T tokens,
    with TRIGGER under PDL, else ``quantize_with_scale``'s), then the GEMM of the e4m3 x with the
    per-tensor scale, and its one-launch split-K variant where the record makes it; traced, the GEMM
    alone (x quantized by torch's operations, which inductor compiles)."""
    from ...stdlib.kernels.quantize_e4m3 import quantize_module, static_options

    t, k = (int(s) for s in x16.shape)
    launches: list[Launch] = []
    if not traced:
        launches.append((quantize_module().quantize_e4m3_static, (t,), (x16, xq, static, k, k, k),
                         {**static_options(k), **trigger}))
    plan, main = _plan_launches(api, w, xq, y, static, out_dtype, activation, **planning)
    launches += main
    if passes_through(main, xq, y, static) and len(main) > 1 and reduce_eagerly and hasattr(plan, "reduces_in_kernel"):
        _, one = _plan_launches(api, w, xq, y, static, out_dtype, activation, reduce="kernel", **planning)
        launches += one if len(one) == 1 else []
    if quantizing and trigger and not passes_through(main, xq, y, static):  # a padded plan: quantize_with_scale's
        launches.append((quantize_module().quantize_e4m3_static, (t,), (x16, xq, static, k, k, k), static_options(k)))
    return launches


def distinct_specializations(launches: Iterable[Launch]) -> list[tuple[Launch, Specialization]]:
    """Each launch of ``launches`` that compiles a specialization no earlier one compiles (same
    kernel, same specialization key), with that specialization."""
    seen: set[tuple[int, tuple]] = set()
    out = []
    for launch in launches:
        kernel, _, args, constexprs = launch
        spec = Specialization.of_launch(kernel, args, constexprs)
        if (id(kernel), spec.key) not in seen:
            seen.add((id(kernel), spec.key))
            out.append((launch, spec))
    return out


def layer_target(layer: SparseLinear) -> str:
    """The target a layer's first calls compile for: that of the GPU its weight lives on (the
    current one for a layer on the CPU, as its plans are: stdlib/kernels/plan_device.py), sm_90a
    without a GPU."""
    from ...backend import runtime
    from ...stdlib.kernels.plan_device import arrays_ordinal
    from ...target.targets import target_for_capability

    if not runtime.has_gpu():
        return "sm_90a"
    return target_for_capability(*runtime.current_device(arrays_ordinal(layer._bound().values)).compute_capability).name


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
        raise _warm_error(f"timeout must be a positive number of seconds or None, got {timeout!r}",
                          "the most seconds one kernel's compile may take in a worker process; None: no limit")
    return float(timeout)


WARM_UP_CALLS = {"eager": (False,), "traced": (True,), "both": (False, True)}
"""``warm_up``'s ``calls``: whose first calls it compiles for, as the ``traced`` flags of
:func:`first_call_launches`: eager calls, calls traced by torch.compile (the custom op's records,
CUDA graphs included), or both (the default: for Llama-3-8B's shapes of
benchmarks/bench_first_call.py, 67 specializations against the eager calls' 64)."""


def _check_calls(calls: Any) -> tuple[bool, ...]:
    modes = WARM_UP_CALLS.get(calls) if isinstance(calls, str) else None
    if modes is None:
        raise _warm_error(f"calls must be 'eager', 'traced' or 'both', got {calls!r}",
                          "'eager': the model's eager calls; 'traced': its calls under torch.compile; "
                          "'both' (the default): either")
    return modes


WARM_UP_TIMEOUT_S = 300.0
"""``warm_up``'s default ``timeout``: the most seconds a worker process may take over one kernel
specialization (one takes about 1 s: benchmarks/RESULTS.md, "First calls")."""


def warm_up(model: nn.Module, tokens: Any = (1, 16, 512), jobs: int | None = None, *,
            x_dtype: torch.dtype = torch.bfloat16, target: str | None = None,
            timeout: float | None = WARM_UP_TIMEOUT_S, calls: str = "both") -> WarmUpReport:
    """Compile, ahead of the first calls and ``jobs`` at a time (None: one worker process per CPU
    core; driver/compile_pool.py), the
    kernels that ``model``'s sparse layers' first calls on ``tokens`` rows of x (each count
    of ``tokens``; x in ``x_dtype``) would compile; nothing is launched. ``calls``: "eager" (the
    layers' own launch records), "traced" (the custom op's, under torch.compile and its CUDA
    graphs) or "both" (:data:`WARM_UP_CALLS`). ``target``: the GPU
    architecture to plan and compile for (default each layer's GPU's, else sm_90a). ``timeout``:
    the most seconds one kernel's compile may take (None: no limit); a worker process that takes
    longer is killed, a compile in this process (``jobs=1``, ``@jit`` kernels, no disk cache) is
    left running in its thread, and once the others are compiled SP0924 names the kernel. Returns a
    :class:`WarmUpReport`; SP0923 for bad arguments."""
    if not isinstance(model, nn.Module):
        raise _warm_error(f"warm_up needs an nn.Module, got {type(model).__name__}",
                          "pass the model sparsify_ converted")
    counts = _check_tokens(tokens)
    workers = _check_jobs(jobs)
    limit = _check_timeout(timeout)
    modes = _check_calls(calls)
    if x_dtype not in OUT_DTYPES:
        raise _warm_error(f"x_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {x_dtype!r}",
                          "the dtype of the activations the model's layers receive")
    layers = {traced: warmed_layers(model, traced) for traced in modes}
    if target is not None:
        from ...frontend.diagnostics import CompileError
        from ...target.targets import get_target, target_suggestion

        try:
            get_target(target)
        except CompileError:
            hint = target_suggestion(target) or "e.g. target=\"sm_90a\" (Hopper) "
            raise _warm_error(f"unknown target {target!r}", f"{hint}or leave it unset for the layers' GPU") from None
    start = time.perf_counter()
    by_target: dict[str, list[Launch]] = {}  # each layer's launches, compiled for its own GPU's target
    for traced, warmed in layers.items():
        for layer in warmed:
            by_target.setdefault(target or layer_target(layer), []).extend(
                launch for t in counts for launch in first_call_launches(layer, t, x_dtype, target, traced=traced))
    found = [(launch, spec, tgt) for tgt, launches in by_target.items()
             for launch, spec in distinct_specializations(launches)]
    todo = [(spec, tgt) for _, spec, tgt in found if not spec.cached(tgt)]
    report = WarmUpReport([(launch[0].name, dict(launch[3])) for launch, _, _ in found], len(todo),
                          len(found) - len(todo), 0.0, ", ".join(by_target) or target or "sm_90a",
                          len({id(layer) for warmed in layers.values() for layer in warmed}))
    try:
        compile_specializations([spec for spec, _ in todo], [tgt for _, tgt in todo], workers, limit)
    except CompileTimeout as e:
        names = "; ".join(f"{spec.kernel.name} {_constexprs(spec)} for {tgt}" for spec, tgt in e.hung)
        raise IntegrationError(
            SP_WARM_UP_TIMEOUT, f"warm_up: no compile of {names} finished within timeout={e.timeout:g} s "
            f"(its worker process was killed; the other {len(todo) - len(e.hung)} compiled)",
            help="its first call compiles it then; pass a larger timeout= (None: no limit) if the compile is "
                 "only slow, else report the kernel and these constexprs") from None
    report.seconds = time.perf_counter() - start
    return report


def _constexprs(spec: Specialization) -> dict[str, Any]:
    """The constexpr values a specialization binds (``BLOCK=...``), for a diagnostic."""
    return {name: b.value for name, b in spec.bindings.items() if hasattr(b, "value")}
