"""Tuning the torch layer's tiled kernel (``sparse_linear_<t>``: T > 64 tokens on sm_90a) per shape.

The layer runs the sparse GEMM's pipeline with an epilogue and stores its tile transposed (Y is
tokens x out features), so the tile, ring and split-K that suit ``sparse_matmul`` do not always suit
it: with the sparse GEMM's tuned choice, 6144 x 1024 x 4096 took 86 µs in the layer against 73 µs
with the planned heuristics (tenth session, benchmarks/RESULTS.md). So the layer has entries of
its own in the same table file, keyed ``linear-<dtype> MxNxK`` (M out features, N = T tokens, K in
features), which :func:`~.linear.plan_sparse_linear` reads (``linear.tuned_config``).

:func:`tune_sparse_linear` times the same config space as the sparse GEMM's
(:func:`~.tuning.config_space`: BN, STAGES, split-K, CTA pairs; not its tail splits, which the
layer's plans do not have: :func:`layer_space`) with the same checks and timing
(:func:`~.tuning.tune_plan`: each config's y, poisoned first, against the planned default's; one
replay of a CUDA graph of ten calls). ``sparsile tune --linear`` is its command line; docs/autotune.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from ...frontend.diagnostics import LaunchError
from .arrays import empty_array
from .decode import DECODE_MAX_T
from .gemm_choice import KERNELS, KernelChoice
from .gemm_config import DEFAULT_GROUP_M, DEFAULT_STAGES, GemmConfig
from .linear import plan_sparse_linear
from .linear_plan import SparseLinearPlan
from .tuning import (
    SP_BAD_SHAPE,
    TuneTarget,
    config_space,
    finished_table,
    pair_grid,
    parse_shape,
    progress_printer,
    table_key,
    tune_plan,
)

LINEAR_PREFIX = "linear-"
"""The dtype prefix of the layer's table entries (``linear-bf16 6144x256x4096``)."""


def layer_space(choice: KernelChoice, m: int, n: int, k: int, sms: int) -> list[GemmConfig]:
    """The configs the layer's tuner times: :func:`~.tuning.config_space` without tail splits,
    stream-K and INFLIGHT (the ``sparse_linear_<t>`` kernels have no such constexpr)."""
    return config_space(choice, m, n, k, sms, tails=False, inflight=False, l2=False)


def default_linear_config(plan: SparseLinearPlan) -> GemmConfig:
    """The config the planned heuristics chose for ``plan``."""
    return GemmConfig(plan.bn, plan.stages or DEFAULT_STAGES, plan.split_k, plan.pair > 0,
                      plan.group_m or DEFAULT_GROUP_M)


def with_linear_config(plan: SparseLinearPlan, config: GemmConfig, sms: int, interpret: bool = False
                       ) -> SparseLinearPlan:
    """``plan`` with ``config``'s BN, STAGES, GROUP_M, split-K (a new f32 workspace if needed) and
    CTA pairs. The layer has no tail split and no stream-K kernel (ValueError for a config with one);
    INFLIGHT is not applied (its kernels have no such constexpr)."""
    if config.tail_split or config.streamk:
        raise ValueError(f"the torch layer's kernels have no tail split and no stream-K kernel, got {config}")
    workspace = plan.workspace
    if config.split_k > 1 and (workspace is None or int(workspace.shape[0]) != config.split_k):
        workspace = empty_array(plan.x, (config.split_k, plan.t, plan.m), "float32", interpret)
    pair = pair_grid(plan.m, plan.t, config.bn, sms) if config.pair and config.split_k == 1 else 0
    return dataclasses.replace(plan, bn=config.bn, split_k=config.split_k, pair=pair, stages=config.stages,
                               group_m=config.group_m, workspace=workspace if config.split_k > 1 else None)


LINEAR_TARGET = TuneTarget(default_linear_config, with_linear_config,
                           lambda plan, config, interpret: plan.run(interpret),
                           lambda plan: (plan.m, plan.t, plan.k_padded),
                           lambda plan: f"{LINEAR_PREFIX}{plan.choice.operand} {plan.m}x{plan.t}x{plan.k}")


def tune_sparse_linear(shapes: Iterable[Any], *, dtypes: Iterable[str] = ("bf16",),
                       warmup: int = 10, rep: int = 50, out: str | os.PathLike[str] | None = None,
                       benchmarker: Callable[..., float] | None = None, stderr: TextIO | None = None,
                       progress: bool | None = None, device: int | None = None) -> dict[str, Any]:
    """Tune the layer's tiled kernel for every (M, N = T, K) shape (a tuple or ``"MxNxK"``) with
    T > 64 and dtype on one GPU (random weights pruned and compressed on the GPU, random x;
    no epilogue); return the
    table ``{"format", "gpu", "compiler", "entries": {"linear-bf16 MxNxK": entry}}`` and merge it into
    ``out`` if given (the entries the file holds for other shapes of the same GPU, the sparse GEMM's
    included, are kept). Shapes with T <= 64 run the decode kernel, whose table is
    ``decode-<gpu>.json``: they are skipped (said on ``stderr``). ``device``: the GPU's ordinal
    (default sparsile's current device, whatever torch's): the operands are made, the configs timed
    and the table named there (:mod:`.tune_device`)."""
    parsed = [parse_shape(shape) for shape in shapes]  # "MxNxK" or (M, N, K); SP0778 otherwise
    dtypes = list(dtypes)
    for d in dtypes:
        if d not in KERNELS or d in ("s8", "tf32"):
            raise LaunchError(SP_BAD_SHAPE, f"no sparse linear kernel for dtype {d!r}", help="one of bf16, f16, e4m3")
    import torch

    from ...backend import runtime
    from .graph_timing import graph_bench
    from .sparsity_gpu import compress_gpu
    from .tune_device import timer, torch_on, tuning_ordinal

    ordinal = tuning_ordinal(device)
    err, say = progress_printer(stderr, progress)
    sms = runtime.current_device(ordinal).sm_count
    entries: dict[str, Any] = {}
    bench = timer(benchmarker, ordinal, graph_bench)
    with torch_on(ordinal) as cuda:
        for dtype in dtypes:
            for m, t, k in parsed:
                if t <= DECODE_MAX_T:  # said whether or not progress is printed: the table will lack it
                    print(f"sparsile tune --linear: {m}x{t}x{k} skipped (T <= {DECODE_MAX_T} runs the decode "
                          f"kernel, tuned by benchmarks/tune_decode.py)", file=err, flush=True)
                    continue
                gen = torch.Generator(device=cuda).manual_seed(m * 31 + t * 7 + k)
                values, meta = compress_gpu(torch.randn(m, k, device=cuda, generator=gen), dtype, "sm90")
                x = torch.randn(t, k, device=cuda, generator=gen)
                x = x.to(torch.bfloat16 if dtype != "f16" else torch.float16)
                if dtype == "e4m3":
                    x = (x.float().clamp(-448, 448)).to(torch.float8_e4m3fn)
                # num_sms: the planned heuristics for this GPU, not a table's choice (the default to beat)
                base = plan_sparse_linear(values, meta.data, x, kernel="gemm", num_sms=sms,
                                          out_dtype="bfloat16" if dtype == "e4m3" else None)
                entries[table_key(LINEAR_PREFIX + dtype, m, t, k)] = tune_plan(
                    base, sms, bench, warmup=warmup, rep=rep, space=layer_space, say=say,
                    target=LINEAR_TARGET)
    return finished_table(entries, out, ordinal)
