"""Tuning the Hopper sparse GEMM (``sparse_matmul``) per shape, and the tables of tuned choices.

A :class:`~.gemm_config.GemmConfig` is what the planning of :mod:`.gemm` fixes by heuristics: the N
tile (BN), the pipeline depth (STAGES), split-K shares and the CTA-pair kernel (BM is 128, the two
consumer warpgroups of the sm_90a kernel, and is not tuned). :func:`tune_sparse_matmul` times every config
of :func:`config_space` for each shape on the current GPU (one replay of a CUDA graph of ten calls,
timed with CUDA events: ``graph_timing.graph_bench``, so that a small kernel's time is not its
host launch time, nor a split-K reduction charged a second host launch), checks
each one's C against the planned default's, and returns a table (written with ``out=``; the
``sparsile tune`` command line does the same). :func:`sparse_matmul_tuned` launches with a
table's choice. Tables ship in ``stdlib/kernels/tuned/`` (``h200.json``); docs/autotune.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from ...driver.autotune import printing_requested
from ...driver.autotune_cache import compiler_version, write_table
from ...frontend.diagnostics import CompileError, InternalError, LaunchError
from .arrays import deliver_result, device_ordinal, empty_array, fill
from .gemm import (
    BM,
    H200_SMS,
    SparseMatmul,
    has_pair_kernel,
    pair_grid,
    plan_sparse_matmul,
    takes_decode,
)
from .gemm_choice import KERNELS, KernelChoice
from .gemm_config import DEFAULT_STAGES, GemmConfig
from .gemm_streamk import STREAMK_OPERANDS, StreamKMatmul, streamk_plan
from .gemm_tail import TailSplitMatmul, tail_split_plan, tail_splits

TABLE_FORMAT = "sparsile-sparse-gemm-table/1"
TUNED_DIR = Path(__file__).resolve().parent / "tuned"
SP_BAD_SHAPE = "SP0778"
SP_BAD_GEMM_TABLE = "SP0779"
TUNED_TABLE_ENV = "SPARSILE_TUNED_TABLE"
"""Set to "0" to ignore the shipped tables (``sparse_matmul`` and ``sparse_linear`` then keep their
planned heuristics; a benchmark's before / after)."""


def default_config(plan: SparseMatmul) -> GemmConfig:
    """The config :func:`~.gemm.plan_sparse_matmul`'s heuristics chose for ``plan``."""
    return GemmConfig(plan.bn, DEFAULT_STAGES, plan.split_k, plan.pair_ctas > 0)


INFLIGHT_OPERANDS = ("e4m3",)
"""Operand types whose tuning space has INFLIGHT twins by default: on the H200 one sparse MMA group
kept in flight took e4m3 8192³ (CTA pairs, metadata by TMA, STAGES 5) from 582 to 559 µs, where bf16
tied and f16 gained 2 % (benchmarks/RESULTS.md, twentieth and twenty-sixth sessions)."""
L2_OPERANDS = ("f16", "bf16")
"""Operand types whose tuning space has the L2-hinted configs (:data:`L2_HINTS`): on the H200 they
made 28672 x 256 x 4096 and 10240 x 256 x 8192 bf16 4-6 % faster, 57344 x 256 x 8192 7 % slower and
8192³ no faster or slower (benchmarks/RESULTS.md, thirty-first session), so the tuner decides per shape."""
L2_HINTS = {"L2A": "evict_first", "L2B": "evict_last"}
"""The constexprs of an ``l2`` config: the weight's TMA loads (values, metadata) evict-first, B's
evict-last (``tma.load``'s ``cache=``; sparse_gemm_sm90.spk's ``producer``)."""


def config_space(choice: KernelChoice, m: int, n: int, k: int, sms: int, tails: bool = True,
                 streamk: bool = False, inflight: bool | None = None, l2: bool | None = None) -> list[GemmConfig]:
    """The configs worth timing for an (M, N, K) problem: BN from the planned one down to a quarter
    of it (at least 16), STAGES 3 to 5, split-K 1, 2, 4, 8 while every share keeps 4 K steps and C
    has fewer tiles than the SMs, and the CTA-pair kernel (no split-K) when C has a tile per SM; at
    STAGES 4 and 5 the tail splits of :func:`~.gemm_tail.tail_splits` (with and without CTA pairs
    for the head) where C's last wave is part-full, unless ``tails`` is False (the torch layer's
    space: its plans have no tail split). ``streamk`` (off by default: on the H200 it took 1.27-1.65x
    the table's choice's time on every shape timed, docs/autotune.md) adds the stream-K kernel
    there too (BN the planned one or half of it, f16 / bf16 / e4m3). ``inflight`` (None: for the
    operand types of :data:`INFLIGHT_OPERANDS`) adds at STAGES 4 and 5 each unsplit config again with
    one MMA group kept in flight (INFLIGHT=1). ``l2`` (None: for the operand types of
    :data:`L2_OPERANDS`) adds at STAGES 4 and 5 each unsplit config again with the L2 hints."""
    if inflight is None:
        inflight = choice.operand in INFLIGHT_OPERANDS
    if l2 is None:
        l2 = choice.operand in L2_OPERANDS
    twins = [flag for flag, on in (("inflight", inflight), ("l2", l2)) if on]  # the unsplit configs' twins
    top = choice.block_n(n)
    bns = [b for b in (top, top // 2, top // 4) if b >= 16]
    steps = -(-k // choice.block_k)
    has_pair = has_pair_kernel(choice)
    out = []
    for bn in bns:
        tiles = -(-m // BM) * -(-n // bn)
        splits = [s for s in (1, 2, 4, 8) if s == 1 or (steps // s >= 4 and tiles < sms)]
        for stages in (3, 4, 5):
            out += [GemmConfig(bn, stages, s) for s in splits]
            if has_pair and tiles >= sms:
                out.append(GemmConfig(bn, stages, 1, True))
            for flag in twins if stages >= 4 else ():
                out.append(GemmConfig(bn, stages, **{flag: True}))
                if has_pair and tiles >= sms:
                    out.append(GemmConfig(bn, stages, 1, True, **{flag: True}))
            if stages >= 4 and tails:
                out += tail_variants(GemmConfig(bn, stages), m, n, steps, sms, has_pair)
                if streamk and choice.operand in STREAMK_OPERANDS and bn >= top // 2 and tiles % sms:
                    out.append(GemmConfig(bn, stages, streamk=True))
    return out


def tail_variants(config: GemmConfig, m: int, n: int, k_steps: int, sms: int, has_pair: bool) -> list[GemmConfig]:
    """``config`` (unsplit) with each tail split of :func:`~.gemm_tail.tail_splits` for this C, its
    head on one CTA per tile and (where the kernel has a CTA-pair twin) on CTA pairs, each where it
    applies; [] where C's last wave is full or the tail's CTAs do not fit one wave."""
    return [dataclasses.replace(config, split_k=1, pair=pair, tail_split=t, inflight=False, l2=False)
            for pair in ((False, True) if has_pair else (False,))
            for t in tail_splits(m, n, k_steps, config.bn, sms, pair)]


def with_config(plan: SparseMatmul, config: GemmConfig, sms: int, interpret: bool = False
                ) -> SparseMatmul | TailSplitMatmul | StreamKMatmul:
    """``plan`` relaunched with ``config``'s BN, split-K and CTA pairs (a new workspace if needed);
    with a tail split, the :class:`~.gemm_tail.TailSplitMatmul` of it where it applies to this C on
    ``sms`` SMs (:func:`~.gemm_tail.tail_split_plan`), else the config unsplit: a table entry found
    for another N (the nearby rule) whose last wave is full, or whose tail does not fit one wave;
    with stream-K, the :class:`~.gemm_streamk.StreamKMatmul` of it where the stream-K kernel takes
    it (:func:`~.gemm_streamk.streamk_plan`), else the config on the other kernels."""
    if config.streamk:
        streamed = streamk_plan(dataclasses.replace(plan, bn=config.bn), sms, interpret)
        if streamed is not None:
            return streamed
        config = dataclasses.replace(config, streamk=False)
    if config.tail_split:
        split = tail_split_plan(dataclasses.replace(plan, bn=config.bn), config.tail_split, config.pair, sms,
                                interpret)
        if split is not None:
            return split
        config = dataclasses.replace(config, tail_split=0)
    workspace = plan.workspace
    if config.split_k > 1 and (workspace is None or int(workspace.shape[0]) != config.split_k):
        workspace = empty_array(plan.b, (config.split_k, plan.m, plan.n), plan.choice.partial_dtype, interpret)
    # a CTA-pair config for an operand type without the pair kernel (a hand-written entry): one CTA per tile
    pair = pair_grid(plan.m, plan.n, config.bn, sms) if config.pair and has_pair_kernel(plan.choice) else 0
    return dataclasses.replace(plan, bn=config.bn, split_k=config.split_k, pair_ctas=pair,
                               workspace=workspace if config.split_k > 1 else None)


def launch(plan: SparseMatmul | TailSplitMatmul | StreamKMatmul, config: GemmConfig, interpret: bool = False) -> Any:
    """Run ``plan`` (already :func:`with_config`) with ``config``'s STAGES, GROUP_M, INFLIGHT and L2 hints;
    returns C."""
    unsplit = isinstance(plan, SparseMatmul) and not plan.partials
    flight = {"INFLIGHT": 1} if config.inflight and unsplit else {}
    hints = L2_HINTS if config.l2 and unsplit else {}
    return plan.run(interpret, STAGES=config.stages, GROUP_M=config.group_m, **flight, **hints)


# ------------------------------------------------------------------------------------------------
# tables
def table_key(dtype: str, m: int, n: int, k: int) -> str:
    return f"{dtype} {m}x{n}x{k}"


def load_gemm_table(table: Any) -> dict[str, Any]:
    """A table's entries from a mapping (a :func:`tune_sparse_matmul` result) or a JSON file;
    LaunchError SP0779 when it is not one."""
    source = "the table"
    if isinstance(table, str | os.PathLike):
        source = f"`{os.fspath(table)}`"
        try:
            table = json.loads(Path(table).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise LaunchError(SP_BAD_GEMM_TABLE, f"cannot read the sparse GEMM table {source}: "
                                                 f"{getattr(e, 'strerror', None) or e}") from None
    if not (isinstance(table, Mapping) and table.get("format") == TABLE_FORMAT
            and isinstance(table.get("entries"), Mapping)):
        raise LaunchError(SP_BAD_GEMM_TABLE, f"{source} is not a sparse GEMM table (format {TABLE_FORMAT!r})",
                          help="write one with `sparsile tune` or sparsile.tune(shapes, out=PATH)")
    return dict(table["entries"])


TableIndex = dict[tuple[str, int, int], list[tuple[int, GemmConfig]]]
"""A table's configs by (dtype, M, K), each list sorted by N."""


def index_table(entries: Mapping[str, Any]) -> TableIndex:
    """The entries of a table by (dtype, M, K) (names that are no ``dtype MxNxK`` are ignored)."""
    index: TableIndex = {}
    for name, entry in entries.items():
        parts = name.split(" ")
        try:
            m, n, k = (int(v) for v in parts[1].split("x"))
            config = GemmConfig.from_json(entry["config"])
        except (IndexError, ValueError, KeyError, TypeError):
            continue
        index.setdefault((parts[0], m, k), []).append((n, config))
    for rows in index.values():
        rows.sort(key=lambda row: row[0])
    return index


def lookup(entries: Mapping[str, Any], dtype: str, m: int, n: int, k: int) -> GemmConfig | None:
    """The table's config for an (M, N, K) problem: the entry of the same dtype, M and K whose N is
    the smallest at least ``n`` (else the largest), or None."""
    return find(index_table(entries), dtype, m, n, k)


def find(index: TableIndex, dtype: str, m: int, n: int, k: int, nearby: bool = False) -> GemmConfig | None:
    """:func:`lookup` in an :func:`index_table` (what a launch does: no parsing). ``nearby``: only an
    entry whose N is less than twice ``n`` (or the largest, for an ``n`` beyond it): a config tuned
    at N = 256 is not taken for N = 65, whose planned tile is half as wide."""
    rows = index.get((dtype, m, k))
    if not rows:
        return None
    en, config = next(((en, c) for en, c in rows if en >= n), rows[-1])
    return None if nearby and en >= n and en >= 2 * n else config


@dataclass(frozen=True)
class TableGpu:
    """The GPU a shipped table was tuned on: its name, architecture (``sm_90``) and SM count."""

    name: str
    arch: str
    sms: int


SHIPPED_TABLE_GPUS: dict[str, TableGpu] = {"h200.json": TableGpu("NVIDIA H200", "sm_90", 132)}
"""Where each shipped table was tuned. A GPU with no table of its own borrows the one tuned on a GPU
of the same architecture and SM count (tile shapes, stages and CTA pairs are choices about the SMs;
the borrower differs in memory bandwidth): on an H100 (sm_90, 132 SMs) the H200's table ran the
Llama-3 8B rows with T >= 256 and 8192³ 1.00-1.47x faster than the planned heuristics, which were
slower than cuBLAS dense on 6144 x 256 x 4096 (benchmarks/RESULTS.md, fortieth session)."""


def shipped_table(gpu: str, arch: str | None = None, sms: int | None = None) -> Path | None:
    """``tuned/<gpu>.json`` for a GPU name (``NVIDIA H200`` -> ``h200.json``) if it ships; else,
    given the GPU's ``arch`` and ``sms``, the shipped table of a GPU with the same two
    (:data:`SHIPPED_TABLE_GPUS`); else None."""
    slug = gpu.lower().removeprefix("nvidia ").replace(" ", "-")
    path = TUNED_DIR / f"{slug}.json"
    if path.is_file():
        return path
    borrowed = (TUNED_DIR / file for file, origin in SHIPPED_TABLE_GPUS.items()
                if (origin.arch, origin.sms) == (arch, sms))
    return next((path for path in borrowed if path.is_file()), None)


@functools.cache
def _shipped_index(gpu: str, arch: str | None = None, sms: int | None = None) -> TableIndex:
    path = shipped_table(gpu, arch, sms)
    return index_table(load_gemm_table(path)) if path is not None else {}


def shipped_config(dtype: str, m: int, n: int, k: int, nearby: bool = False, ordinal: int | None = None
                   ) -> GemmConfig | None:
    """The shipped table's config (:func:`find`, ``nearby`` as there) for an (M, N, K) problem on
    CUDA device ``ordinal`` (default: the current one; a plan's is the device its arrays live on,
    :func:`~.arrays.device_ordinal`): the GPU's own table, else one borrowed (:func:`shipped_table`);
    or None: no table ships for it, no entry fits, or SPARSILE_TUNED_TABLE=0."""
    if os.environ.get(TUNED_TABLE_ENV, "1") == "0":
        return None
    from ...backend import runtime

    if not runtime.has_gpu():
        return find(_shipped_index("cpu"), dtype, m, n, k, nearby)
    device = runtime.current_device(ordinal)
    return find(_shipped_index(device.name, device.arch, device.sm_count), dtype, m, n, k, nearby)


def run_with_table(plan: SparseMatmul, *, persistent: bool = True, table: Any = None, interpret: bool = False,
                   sms: int | None = None) -> bool:
    """Launch ``plan`` with ``table``'s choice for its shape (default: the shipped table of the GPU
    its arrays live on, read once) and return True; False, launching nothing, when the table has no
    entry for it (:func:`find` with ``nearby``: none tuned at an N of twice this one or more) or only
    a CTA-pair one and ``persistent`` is False. ``sparse_matmul`` calls this."""
    from ...backend import runtime

    ordinal = device_ordinal(plan.b)
    # nearby: a config tuned at N = 256 is no choice for N = 64 (on the H200 it took 22 µs where the
    # planned split-K default takes 11 µs, 6144 x 64 x 4096 bf16: benchmarks/RESULTS.md, twentieth session)
    if table is None:
        config = shipped_config(plan.choice.operand, plan.m, plan.n, plan.k, nearby=True, ordinal=ordinal)
    else:
        config = find(index_table(load_gemm_table(table)), plan.choice.operand, plan.m, plan.n, plan.k, nearby=True)
    if config is None or (config.pair and not persistent):
        return False
    sms = sms or (H200_SMS if interpret else runtime.current_device(ordinal).sm_count)
    launch(with_config(plan, config, sms, interpret), config, interpret)
    return True


def sparse_matmul_tuned(values: Any, meta: Any, b: Any, *, table: Any = None, out: Any = None,
                        dtype: str | None = None) -> Any:
    """:func:`~.gemm.sparse_matmul` on sm_90a with ``table``'s choice for this shape (default: the
    shipped table of the current GPU), or the planned default where the table has none."""
    plan = plan_sparse_matmul(values, meta, b, out=out, dtype=dtype, target="sm_90a", kernel="gemm")
    if plan.k_padded == 0:
        fill(plan.out, 0)
    elif not run_with_table(plan, table=table):
        plan.run()
    return deliver_result(plan.out, out, b)


# ------------------------------------------------------------------------------------------------
# tuning
def shape_dims(shape: Any) -> tuple[int, ...]:
    """The integers of a tuple / list or of a text ``"AxBxC"`` (``,`` also separates); () when
    some part is no integer (the callers check the count and signs)."""
    if isinstance(shape, str):
        parts: Iterable[Any] = shape.lower().replace(",", "x").split("x")
    else:
        parts = shape if isinstance(shape, tuple | list) else ()
    try:
        return tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        return ()


MAX_SHAPE_SIZE = 2**31 - 1
"""The largest M, N or K :func:`parse_shape` takes: the GEMM kernels take them as i32."""


def parse_shape(shape: Any) -> tuple[int, int, int]:
    """(M, N, K) from a tuple or ``"MxNxK"`` (M out features, N tokens, K in features)."""
    dims = shape_dims(shape)
    if len(dims) != 3 or min(dims) < 1:
        raise LaunchError(SP_BAD_SHAPE, f"a shape to tune must be M x N x K (three positive integers), found "
                                        f"{shape!r}", help='e.g. "8192x512x8192" or (8192, 512, 8192): M = out '
                                                           "features, N = tokens, K = in features")
    if max(dims) > MAX_SHAPE_SIZE:
        raise LaunchError(SP_BAD_SHAPE, f"a shape to tune has sizes up to 2**31 - 1, found {shape!r}",
                          help="the kernels take M, N and K as i32")
    return dims  # type: ignore[return-value]


def f32_copy(x: Any) -> Any:
    """A float32 copy of a torch or numpy output (the comparison of configs)."""
    return x.float().clone() if hasattr(x, "clone") else np.asarray(x).astype(np.float32)


def reference_tolerance(ref: Any) -> float:
    """How far a config's output may be from the default config's ``ref`` (a :func:`f32_copy`):
    2 % of the largest |ref|. Configs differ in the order of the f32 sums (split-K shares, K
    steps), which moves a 16-bit output by at most an ulp or so (0.4-0.8 % of a value), while a
    wrong tile, share or reduction is off by the size of the values themselves."""
    return 2e-2 * (float(abs(ref).max()) or 1.0)


def matches_reference(out: Any, ref: Any, tol: float) -> bool:
    """Whether every element of ``out`` is within ``tol`` of ``ref`` (NaN, e.g. a poisoned element
    left unwritten, never is)."""
    return bool((abs(f32_copy(out) - ref) <= tol).all())


@dataclass(frozen=True)
class TuneTarget:
    """How :func:`tune_plan` handles one kind of plan: its planned default config, the plan with
    another config, the launch (returns the output), its (M, N, K) and name. The default target is
    ``sparse_matmul``'s (:data:`GEMM_TARGET`); ``linear_tuning`` has the torch layer's."""

    default: Callable[[Any], GemmConfig]
    configure: Callable[..., Any]   # (plan, config, sms, interpret) -> plan
    launch: Callable[..., Any]      # (plan, config, interpret) -> output
    dims: Callable[[Any], tuple[int, int, int]]  # (M, N, K of the launch) for the config space
    name: Callable[[Any], str]


GEMM_TARGET = TuneTarget(default_config, lambda plan, config, sms, interpret: with_config(plan, config, sms, interpret),
                         lambda plan, config, interpret: launch(plan, config, interpret),
                         lambda plan: (plan.m, plan.n, plan.k_padded),
                         lambda plan: f"{plan.choice.operand} {plan.m}x{plan.n}x{plan.k}")


class _Launch:
    """One config's launch as a benchmarker times it: ``run()`` or ``run(stream=...)`` (the launches
    follow torch's current stream, which a graph benchmarker sets); ``config`` says which."""

    def __init__(self, target: TuneTarget, plan: Any, config: GemmConfig, interpret: bool):
        self.target, self.plan, self.config, self.interpret = target, plan, config, interpret

    def __call__(self, stream: Any = None) -> Any:
        return self.target.launch(self.plan, self.config, self.interpret)


def tune_plan(base: Any, sms: int, bench: Callable[..., float], *, warmup: int = 10, rep: int = 50,
              space: Callable[..., list[GemmConfig]] = config_space, interpret: bool = False,
              say: Callable[..., None] = lambda text, end="\n": None, target: TuneTarget = GEMM_TARGET
              ) -> dict[str, Any]:
    """Time the planned default and ``space``'s configs for one planned problem; its table entry
    ``{"config", "us", "default", "default_us", "skipped"}``. Each config's C (poisoned first) must
    match the default's within 2 % of the largest |C|, else it is skipped as wrong; configs that do
    not compile or launch are skipped with the reason. ``interpret`` runs in the interpreter (the
    CPU tests, with a fake ``bench``). ``target``: the kind of plan (default: sparse_matmul's)."""
    default = target.default(base)
    ref = f32_copy(target.launch(base, default, interpret))
    tol = reference_tolerance(ref)
    timings: dict[GemmConfig, float] = {}
    skipped: dict[str, str] = {}
    errors: list[Exception] = []
    candidates = [default] + [c for c in space(base.choice, *target.dims(base), sms) if c != default]
    what = target.name(base)
    for i, config in enumerate(candidates):
        say(f"\rsparsile tune {what} [{i + 1}/{len(candidates)}] {config}\x1b[K", end="")
        try:
            plan = target.configure(base, config, sms, interpret)
            for poisoned in (plan.out, getattr(plan, "workspace", None)):  # so are the partial sums
                if poisoned is not None:
                    poisoned[...] = float("nan") if "float" in str(poisoned.dtype) else -12345
            if not matches_reference(target.launch(plan, config, interpret), ref, tol):
                skipped[str(config)] = "wrong result against the default config"
                continue
            run = _Launch(target, plan, config, interpret)
            timings[config] = float(bench(run, warmup=warmup, rep=rep, stream=None))
        except (CompileError, LaunchError) as e:
            skipped[str(config)] = str(e).split("\n", 1)[0]
            errors.append(e)
    if not timings:
        say("")
        if errors:
            raise errors[0]
        raise InternalError(f"no config of the sparse GEMM for {what} gave the default config's C")
    best = min(timings, key=lambda c: timings[c])
    say(f"\rsparsile tune {what}: {best} {timings[best] * 1e3:.1f} us (default "
        f"{timings.get(default, float('nan')) * 1e3:.1f} us)\x1b[K")
    return {"config": best.to_json(), "us": round(timings[best] * 1e3, 2), "default": default.to_json(),
            "default_us": round(timings[default] * 1e3, 2) if default in timings else None, "skipped": skipped}


def runs_the_decode_kernel(dtype: str, m: int, n: int, k: int) -> bool:
    """Whether sparse_matmul runs the decode kernel for this problem on sm_90a (N <= 64, f16 / bf16 /
    e4m3: :func:`~.gemm.takes_decode`), so that an entry of the tiled kernels' table would never be
    read: ``sparsile tune`` skips it (the decode kernel has its own table, benchmarks/tune_decode.py)."""
    return takes_decode(None, KERNELS[dtype], m, n, k, "sm_90a", None, None)


def tune_sparse_matmul(shapes: Iterable[Any], *, dtypes: Iterable[str] = ("bf16", "f16"), warmup: int = 10,
                       rep: int = 50, out: str | os.PathLike[str] | None = None,
                       benchmarker: Callable[..., float] | None = None, stderr: TextIO | None = None,
                       progress: bool | None = None, space: Callable[..., list[GemmConfig]] = config_space,
                       device: int | None = None) -> dict[str, Any]:
    """Tune every shape and dtype on one GPU with :func:`tune_plan` (random operands, pruned
    and compressed on the GPU by ``compress_gpu``); return the table ``{"format", "gpu", "compiler",
    "entries": {"bf16 MxNxK": entry}}`` and write it to ``out`` if given (atomically, keeping the
    entries the file holds for other shapes of the same GPU). A progress line and one line per shape
    go to ``stderr`` when ``progress`` (default: when it is a terminal or SPARSILE_AUTOTUNE_PRINT=1).
    Shapes that sparse_matmul runs on the decode kernel (:func:`runs_the_decode_kernel`) are skipped.
    ``device``: the GPU's ordinal (default sparsile's current device, whatever torch's): the operands
    are made, the configs timed and the table named there (:mod:`.tune_device`).
    """
    import torch

    from ...backend import runtime
    from .graph_timing import graph_bench
    from .sparsity_gpu import compress_gpu
    from .tune_device import timer, torch_on, tuning_ordinal

    parsed = [parse_shape(s) for s in shapes]
    dtypes = list(dtypes)
    for d in dtypes:
        if d not in KERNELS:
            raise LaunchError(SP_BAD_SHAPE, f"no sparse GEMM kernel for dtype {d!r}", help=f"one of {sorted(KERNELS)}")
    ordinal = tuning_ordinal(device)
    _, say = progress_printer(stderr, progress)
    sms = runtime.current_device(ordinal).sm_count
    entries: dict[str, Any] = {}
    bench = timer(benchmarker, ordinal, graph_bench)
    with torch_on(ordinal) as cuda:
        for dtype in dtypes:
            tdt = getattr(torch, KERNELS[dtype].torch_dtype)
            for m, n, k in parsed:
                if runs_the_decode_kernel(dtype, m, n, k):
                    say(f"{table_key(dtype, m, n, k)}: skipped: sparse_matmul runs the decode kernel at N <= 64 "
                        "(tune it with benchmarks/tune_decode.py)")
                    continue
                gen = torch.Generator(device=cuda).manual_seed(m * 31 + n * 7 + k)
                spread = 20.0 if dtype == "s8" else 1.0  # s8: integers beyond 0 and +-1
                values, meta = compress_gpu(torch.randn(m, k, device=cuda, generator=gen) * spread, dtype, "sm90")
                b = (torch.randn(n, k, device=cuda, generator=gen) * spread).to(tdt)
                base = plan_sparse_matmul(values, meta.data, b, target="sm_90a", kernel="gemm")
                entries[table_key(dtype, m, n, k)] = tune_plan(base, sms, bench, warmup=warmup, rep=rep,
                                                               space=space, say=say)
    return finished_table(entries, out, ordinal)


def progress_printer(stderr: TextIO | None, progress: bool | None) -> tuple[TextIO, Callable[..., None]]:
    """(the stream a tuner reports on: ``stderr`` or sys.stderr, and ``say(text, end="\\n")``, which
    prints there only when ``progress``: by default when it is a terminal or SPARSILE_AUTOTUNE_PRINT=1)."""
    err = stderr or sys.stderr
    if progress is None:
        progress = printing_requested() or bool(getattr(err, "isatty", lambda: False)())

    def say(text: str, end: str = "\n") -> None:
        if progress:
            print(text, end=end, file=err, flush=True)
    return err, say


def finished_table(entries: dict[str, Any], out: str | os.PathLike[str] | None, ordinal: int | None = None
                   ) -> dict[str, Any]:
    """The table of ``entries`` for GPU ``ordinal`` (the one tuned on; default the current one) and
    the compiler, merged into the file ``out`` when given (:func:`merged_table` of the file as it is
    under its lock, written atomically: two runs writing one file keep each other's entries;
    driver/autotune_cache.py ``write_table``)."""
    from ...backend.runtime.bench import device_name

    table = {"format": TABLE_FORMAT, "gpu": device_name(ordinal), "compiler": compiler_version(), "entries": entries}
    if out is not None:
        path = Path(out)
        write_table(path, lambda: merged_table(path, table), table)
    return table


def merged_table(path: Path, table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with the entries of the table already at ``path`` for other shapes kept, when that
    one is a table of the same GPU (so a long list of shapes can be tuned in several runs)."""
    try:
        old = load_gemm_table(path) if path.is_file() else {}
        same_gpu = json.loads(path.read_text(encoding="utf-8")).get("gpu") == table["gpu"] if old else False
    except (LaunchError, OSError, ValueError):
        return table
    return {**table, "entries": {**old, **table["entries"]}} if same_gpu else table
