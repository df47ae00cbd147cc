"""Tuning the decode kernel of ``sparse_linear`` (:mod:`.decode`) per shape, and its tables.

:func:`choose_decode_config` picks split-K and the ring depth by a heuristic that was never timed;
:func:`tune_sparse_decode` times every :class:`DecodeCandidate` of :func:`candidate_space` (split-K
1..16, STAGES 2 up to what fits, both split-K reductions) for each (N_out, K, token tile) on the
current GPU with CUDA events (backend/runtime/bench.py), checks each one's output against the
heuristic's, and returns a table ``sparsile-sparse-decode-table/1`` (``benchmarks/tune_decode.py``
writes one). ``plan_sparse_decode`` consults a table: ``$SPARSILE_DECODE_TABLE`` when set, else the
shipped ``tuned/decode-<gpu>.json``, an entry applying only to the exact device name and SM count,
dtype, N_out, K and token tile (docs/autotune.md, "The decode table").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...frontend.diagnostics import CompileError, LaunchError
from .decode import (
    BM256_MIN_TILE,
    DECODE_BM,
    DECODE_BMS,
    MAX_SPLIT,
    MAX_STAGES,
    REDUCE_MODES,
    SMEM_PER_CTA,
    DecodeConfig,
    SparseDecodePlan,
    choose_decode_config,
    persistent_ctas,
    slab_words,
    split_workspace,
)
from .graph_timing import GRAPH_CALLS, graph_bench
from .tuning import TUNED_DIR, f32_copy, matches_reference, reference_tolerance, shape_dims

TABLE_FORMAT = "sparsile-sparse-decode-table/1"
TABLE_ENV = "SPARSILE_DECODE_TABLE"
"""A decode table's path; it replaces the shipped table of the GPU (an empty value: no table)."""
SP_TABLE_READ = "SP0861"     # the table file cannot be read or is no JSON
SP_TABLE_FORMAT = "SP0862"   # not a decode table (format, entries)
SP_TABLE_ENTRY = "SP0863"    # an entry of a wrong key or config
SP_TUNE_INPUT = "SP0864"     # a shape, token count or dtype the sweep cannot take
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_WAVES = 4  # split-K candidates keep the grid within 4 x the resident CTA slots (2 per SM)
TUNE_DTYPES = ("bf16", "f16", "e4m3")
ENTRY_HELP = ('an entry is "DEVICE/SMS DTYPE NxK bnB": {"config": {"split_k", "stages", "reduce", "bm", '
              '"persistent"}}')
"""SP0863's help: an entry's name and the keys of its config (docs/autotune.md)."""


@dataclass(frozen=True)
class DecodeCandidate:
    """What a decode table fixes for one problem: split-K, ring depth and split-K reduction."""

    split_k: int
    stages: int
    reduce: str = "launch"
    bm: int = DECODE_BM  # weight rows per CTA (an entry without "bm": 128)
    persistent: bool = False  # the persistent kernel (no split-K; an entry without "persistent": False)

    def to_json(self) -> dict[str, Any]:
        return {"split_k": self.split_k, "stages": self.stages, "reduce": self.reduce, "bm": self.bm,
                **({"persistent": True} if self.persistent else {})}

    @classmethod
    def from_json(cls, data: Any) -> DecodeCandidate:
        """The candidate of a table entry's ``config``; ValueError when it is not a valid one."""
        if not isinstance(data, Mapping):
            raise ValueError("config is not an object")
        split, stages, reduce = data.get("split_k"), data.get("stages"), data.get("reduce", "launch")
        bm, persistent = data.get("bm", DECODE_BM), data.get("persistent", False)
        if type(split) is not int or not 1 <= split <= MAX_SPLIT:
            raise ValueError(f"split_k must be an integer from 1 to {MAX_SPLIT}, got {split!r}")
        if type(stages) is not int or not 2 <= stages <= MAX_STAGES:
            raise ValueError(f"stages must be an integer from 2 to {MAX_STAGES}, got {stages!r}")
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce must be 'launch' or 'kernel', got {reduce!r}")
        if type(bm) is not int or bm not in DECODE_BMS:
            raise ValueError(f"bm must be one of {', '.join(map(str, DECODE_BMS))}, got {bm!r}")
        if type(persistent) is not bool or (persistent and split != 1):
            raise ValueError(f"persistent must be true (with split_k 1) or false, got {persistent!r}")
        return cls(split, stages, reduce, bm, persistent)

    def __str__(self) -> str:
        return (f"split_k={self.split_k} stages={self.stages}" + (f" reduce={self.reduce}" if self.split_k > 1 else "")
                + (f" bm={self.bm}" if self.bm != DECODE_BM else "") + (" persistent" if self.persistent else ""))


def token_tile(t: int) -> int:
    """The decode kernel's token tile (BN) for ``t`` tokens: a power of two from 8."""
    bn = 8
    while bn < t:
        bn *= 2
    return bn


def table_key(device: str, sms: int, dtype: str, n_out: int, k: int, bn: int) -> str:
    """An entry's name: ``"NVIDIA H200/132 bf16 4096x14336 bn16"``."""
    return f"{device}/{sms} {dtype} {n_out}x{k} bn{bn}"


# ------------------------------------------------------------------------------------------------
# tables
def load_decode_table(table: Any) -> dict[str, DecodeCandidate]:
    """A table's candidates by key from a mapping (a :func:`tune_sparse_decode` result) or a JSON
    file; LaunchError SP0861 (unreadable), SP0862 (no decode table) or SP0863 (a bad entry)."""
    source, where = "the table", ""
    if isinstance(table, str | os.PathLike):
        source = where = f"`{os.fspath(table)}`"
        import json

        try:
            table = json.loads(Path(table).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise LaunchError(SP_TABLE_READ, f"cannot read the decode table {source}: "
                                             f"{getattr(e, 'strerror', None) or e}",
                              help=f"fix or unset {TABLE_ENV}; write a table with benchmarks/tune_decode.py") from None
    if not (isinstance(table, Mapping) and table.get("format") == TABLE_FORMAT
            and isinstance(table.get("entries"), Mapping)):
        raise LaunchError(SP_TABLE_FORMAT, f"{source} is not a decode table (format {TABLE_FORMAT!r} with entries)",
                          help="write one with benchmarks/tune_decode.py")
    out: dict[str, DecodeCandidate] = {}
    for name, entry in table["entries"].items():
        try:
            parse_key(name)
            out[name] = DecodeCandidate.from_json(entry.get("config") if isinstance(entry, Mapping) else None)
        except ValueError as e:
            raise LaunchError(SP_TABLE_ENTRY, f"entry {name!r} of the decode table{' ' + where if where else ''}: {e}",
                              help=ENTRY_HELP) from None
    return out


def parse_key(name: Any) -> tuple[str, int, str, int, int, int]:
    """(device, sms, dtype, N_out, K, bn) of an entry name; ValueError when it is none."""
    try:
        device, rest = str(name).rsplit("/", 1)
        sms, dtype, shape, tile = rest.split(" ")
        n_out, k = (int(v) for v in shape.split("x"))
        if not tile.startswith("bn") or not device or dtype not in TUNE_DTYPES:
            raise ValueError
        return device, int(sms), dtype, n_out, k, int(tile[2:])
    except ValueError:
        raise ValueError(f"the name is not 'DEVICE/SMS DTYPE NxK bnB' (e.g. "
                         f"{table_key('NVIDIA H200', 132, 'bf16', 4096, 4096, 16)!r})") from None


def shipped_decode_table(device: str) -> Path | None:
    """``tuned/decode-<gpu>.json`` for a GPU name (``NVIDIA H200`` -> ``decode-h200.json``) if it ships."""
    slug = device.lower().removeprefix("nvidia ").replace(" ", "-")
    path = TUNED_DIR / f"decode-{slug}.json"
    return path if path.is_file() else None


@functools.cache
def _cached_table(path: str, mtime_ns: int) -> dict[str, DecodeCandidate]:
    return load_decode_table(path)


def active_table(device: str) -> Path | None:
    """The table plans consult on ``device``: ``$SPARSILE_DECODE_TABLE`` if set (empty: none), else
    the shipped one."""
    env = os.environ.get(TABLE_ENV)
    if env is not None:
        return Path(env) if env else None
    return shipped_decode_table(device)


def current_device(interpret: bool) -> tuple[str, int] | None:
    """(name, SM count) of the GPU a plan is for (the arrays' device, else the current one:
    :func:`~.plan_device.plan_gpu`); None in the interpreter (no table applies)."""
    if interpret:
        return None
    from ...backend import runtime
    from .plan_device import plan_gpu

    if not runtime.has_gpu():
        return None
    dev = plan_gpu()
    return dev.name, dev.sm_count


def table_choice(dtype: str, n_out: int, k: int, t: int, interpret: bool, table: Any = None,
                 num_sms: int | None = None) -> tuple[DecodeCandidate, str] | None:
    """The table's candidate for this problem on the current device and where it came from
    (``"table:<file>"``), or None. ``table``: a path or mapping instead of :func:`active_table`.
    A plan for another SM count than the device's (``num_sms``) takes no entry: entries were timed
    on the whole GPU."""
    device = current_device(interpret)
    if device is None or (num_sms is not None and num_sms != device[1]):
        return None
    if table is None:
        path = active_table(device[0])
        if path is None:
            return None
        if not path.is_file():  # read it to say why (SP0861)
            load_decode_table(path)
        entries, source = _cached_table(str(path), path.stat().st_mtime_ns), f"table:{path.name}"
    elif isinstance(table, str | os.PathLike):
        entries, source = load_decode_table(table), f"table:{Path(table).name}"
    else:
        entries, source = load_decode_table(table), "table"
    found = entries.get(table_key(device[0], device[1], dtype, n_out, k, token_tile(t)))
    return (found, source) if found is not None else None


# ------------------------------------------------------------------------------------------------
# the sweep
def candidate_space(m: int, k_padded: int, t: int, elem_bytes: int, sms: int) -> list[DecodeCandidate]:
    """The candidates worth timing for N_out = ``m``, K = ``k_padded`` (a multiple of the step):
    for each row slab of :data:`~.decode_config.DECODE_BMS`, split-K from :data:`SPLITS` keeping two K
    steps per share and the grid within :data:`MAX_WAVES` x the CTA slots of two per SM, every
    STAGES from 2 whose ring fits in a CTA's shared memory, and both reductions where there is a
    split; the persistent kernel (no split) where there are more slabs than SMs. 64-row slabs only
    where 128-row ones leave SMs without a CTA (fewer tiles than SMs);
    256-row slabs only from a token tile of :data:`~.decode_config.BM256_MIN_TILE`, where x is a large
    part of each step."""
    out = []
    for bm in DECODE_BMS:
        tiles = -(-m // bm)
        if bm == 64 and -(-m // DECODE_BM) >= sms:
            continue
        if bm == 256 and token_tile(t) < BM256_MIN_TILE:
            continue
        probe = DecodeConfig(token_tile(t), 128 if elem_bytes == 2 else 256, 1, 1, 1, bm=bm)
        steps = k_padded // probe.bk
        splits = [s for s in SPLITS if s == 1 or (steps // s >= 2 and tiles * s <= MAX_WAVES * 2 * sms)]
        stages = [s for s in range(2, MAX_STAGES + 1) if s * (probe.stage_bytes(elem_bytes) + 16) <= SMEM_PER_CTA]
        out += [DecodeCandidate(sp, st, r, bm) for sp in splits for st in stages
                for r in (REDUCE_MODES if sp > 1 else ("launch",))]
        if tiles > sms:  # more slabs than SMs: the persistent kernel leaves no wave part-full
            out += [DecodeCandidate(1, st, "launch", bm, True) for st in stages]
    return out


def default_candidate(plan: SparseDecodePlan) -> DecodeCandidate:
    """The candidate ``plan`` was planned with."""
    mode = "kernel" if plan.reduces_in_kernel else "launch"
    return DecodeCandidate(plan.config.split_k, plan.config.stages, mode, plan.config.bm, plan.config.persist > 0)


def with_candidate(plan: SparseDecodePlan, cand: DecodeCandidate, sms: int) -> SparseDecodePlan:
    """``plan`` relaunched with ``cand`` (its own workspace and arrival counters). A tiled plan's
    weight copy is laid out for its own row slab: LaunchError SP0864 for a candidate of another."""
    from .arrays import empty_array

    b = plan.base
    if plan.tiled and cand.bm != plan.config.bm:
        raise LaunchError(SP_TUNE_INPUT, f"a tiled decode plan of {plan.config.bm}-row slabs cannot run {cand}",
                          help="tune an untiled plan (tiled=False)")
    plan = covering_every_slab(plan)
    cfg = choose_decode_config(b.m, b.t, plan.k_padded, b.choice, sms, cand.split_k, cand.stages, cand.bm)
    cfg = dataclasses.replace(cfg, source="tuning", persist=persistent_ctas(b.m, cfg, sms) if cand.persistent else 0)
    work = split_workspace(plan.x, cand.split_k, b.m, b.t, plan.feature_major, b.interpret)
    counters = None
    if cand.split_k > 1 and cand.reduce == "kernel":
        counters = empty_array(plan.x, (-(-b.m // cand.bm),), "int32", b.interpret)
        counters[...] = 0
    return dataclasses.replace(plan, config=cfg, workspace=work, counters=counters)


def _poison(out: Any) -> None:
    out[...] = float("nan") if "float" in str(out.dtype) else -12345


L2_BYTES = 50 * 2 ** 20  # the L2 of the H100 / H200


class Rotation:
    """``run(stream=None)`` of one candidate: each call runs the next of ``plans`` (the same
    problem on copies of the weight), so that the timed calls stream the weight from HBM, as the
    layers of a model do, instead of from L2. ``calls``: how many calls a timed graph holds (a
    multiple of the copies)."""

    def __init__(self, plans: list[SparseDecodePlan], candidate: DecodeCandidate):
        self.plans, self.candidate, self.next = plans, candidate, 0
        self.calls = len(plans) * max(1, GRAPH_CALLS // len(plans))

    def __call__(self, stream: Any = None) -> Any:
        plan = self.plans[self.next % len(self.plans)]
        self.next += 1
        return plan.run(stream=stream)


def covering_every_slab(plan: SparseDecodePlan) -> SparseDecodePlan:
    """``plan`` with its untiled metadata words padded to whole slabs of the largest row slab
    (:data:`~.decode_config.DECODE_BMS`), as plan_sparse_decode pads them for that slab: a candidate of
    256-row slabs run on the words of a 128-row plan would read metadata boxes past them (TMA's
    zero fill, the undefined code 0x0)."""
    if plan.tiled:
        return plan
    return dataclasses.replace(plan, meta=slab_words(plan.meta, plan.base.m, max(DECODE_BMS), int(plan.meta.shape[1])))


def weight_copies(plan: SparseDecodePlan, cold_bytes: int = 3 * L2_BYTES) -> list[tuple[Any, Any]]:
    """Copies of ``plan``'s values and metadata, so that the weight and its copies take at least
    ``cold_bytes`` (at most 7 copies)."""
    size = int(plan.values.nbytes) + int(plan.meta.nbytes)
    extra = max(0, min(7, -(-cold_bytes // max(size, 1)) - 1))
    copy = (lambda a: a.clone()) if hasattr(plan.values, "clone") else (lambda a: a.copy())
    return [(copy(plan.values), copy(plan.meta)) for _ in range(extra)]


def tune_decode_plan(base: SparseDecodePlan, sms: int, bench: Callable[..., float], *, warmup: int = 10,
                     rep: int = 50, space: Callable[..., list[DecodeCandidate]] = candidate_space,
                     say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Time the planned (heuristic) default and ``space``'s candidates for one plan; its table
    entry ``{"config", "us", "default", "default_us", "tokens", "skipped"}``. Each candidate's
    output (poisoned first) must match the default's within :func:`~.tuning.reference_tolerance`,
    else it is skipped as wrong; candidates that do not compile or launch are skipped with the
    reason. ``bench(run, warmup=, rep=, stream=)`` gives milliseconds; ``run`` is a
    :class:`Rotation` over :func:`weight_copies` (``run.candidate`` says which candidate)."""
    default = default_candidate(base)
    base = covering_every_slab(base)
    copies = weight_copies(base)
    _poison(base.out)
    ref = f32_copy(base.run())
    tol = reference_tolerance(ref)
    b = base.base
    elem = b.choice.elem_bytes
    candidates = [default] + [c for c in space(b.m, base.k_padded, b.t, elem, sms) if c != default]
    timings: dict[DecodeCandidate, float] = {}
    skipped: dict[str, str] = {}
    for cand in candidates:
        try:
            plan = base if cand == default else with_candidate(base, cand, sms)
            _poison(plan.out)
            if not matches_reference(plan.run(), ref, tol):
                skipped[str(cand)] = "wrong result against the default config"
                continue
            run = Rotation([plan] + [dataclasses.replace(plan, values=v, meta=m) for v, m in copies], cand)
            timings[cand] = float(bench(run, warmup=warmup, rep=rep, stream=None))
        except (CompileError, LaunchError) as e:
            skipped[str(cand)] = str(e).split("\n", 1)[0]
    if default not in timings:
        raise LaunchError(SP_TUNE_INPUT, f"the heuristic config {default} of the decode kernel for "
                                         f"{b.m}x{base.k_padded} T={b.t} failed: {skipped.get(str(default))}")
    best = min(timings, key=lambda c: (timings[c], c != default))
    say(f"{b.choice.operand} {b.m}x{b.k} T={b.t}: {best} {timings[best] * 1e3:.2f} us (default {default} "
        f"{timings[default] * 1e3:.2f} us, {len(timings)} timed, {len(skipped)} skipped)")
    return {"config": best.to_json(), "us": round(timings[best] * 1e3, 3), "default": default.to_json(),
            "default_us": round(timings[default] * 1e3, 3), "tokens": b.t, "skipped": skipped}


def parse_decode_shape(shape: Any) -> tuple[int, int]:
    """(N_out, K) from a tuple or ``"NxK"``; LaunchError SP0864 otherwise."""
    dims = shape_dims(shape)
    if len(dims) != 2 or min(dims) < 1:
        raise LaunchError(SP_TUNE_INPUT, f"a decode shape to tune must be N_out x K (two positive integers), "
                                         f"found {shape!r}", help='e.g. "4096x14336" or (4096, 14336)')
    return dims  # type: ignore[return-value]


def check_sweep_inputs(shapes: Iterable[Any], tokens: Iterable[Any], dtypes: Iterable[str]
                       ) -> tuple[list[tuple[int, int]], dict[int, int], list[str]]:
    """Shapes, {token tile: the largest T of ``tokens`` in it} (tiles in the order ``tokens`` first
    names them), dtypes; LaunchError SP0864."""
    parsed = [parse_decode_shape(s) for s in shapes]
    tiles: dict[int, int] = {}
    for t in tokens:
        if type(t) is not int or not 1 <= t <= 64:
            raise LaunchError(SP_TUNE_INPUT, f"a token count to tune must be an integer from 1 to 64, got {t!r}",
                              help="the decode kernel serves T <= 64 tokens")
        tiles[token_tile(t)] = max(t, tiles.get(token_tile(t), 0))
    dts = list(dtypes)
    for d in dts:
        if d not in TUNE_DTYPES:
            raise LaunchError(SP_TUNE_INPUT, f"no decode kernel for dtype {d!r}", help=f"one of {list(TUNE_DTYPES)}")
    return parsed, tiles, dts


Problem = Callable[[str, int, int, int], SparseDecodePlan]
"""``problem(dtype, n_out, k, t)``: the heuristic plan of a random problem (what is tuned)."""


def gpu_problem(ordinal: int | None = None) -> Problem:
    """Random problems on GPU ``ordinal`` (default sparsile's current device): each weight pruned
    and compressed there once (``compress_gpu``), a new x per token count; planned without a table
    (for that GPU: the arrays' device)."""
    import torch

    from .decode import plan_sparse_decode
    from .gemm_choice import KERNELS
    from .sparsity_gpu import compress_gpu
    from .tune_device import tuning_ordinal

    cuda = f"cuda:{tuning_ordinal(ordinal)}"
    weights: dict[tuple[str, int, int], tuple[Any, Any]] = {}
    gen = torch.Generator(device=cuda).manual_seed(0)

    def problem(dtype: str, n_out: int, k: int, t: int) -> SparseDecodePlan:
        if (dtype, n_out, k) not in weights:
            values, meta = compress_gpu(torch.randn(n_out, k, device=cuda, generator=gen), dtype, "sm90")
            weights[dtype, n_out, k] = (values, meta.data)
        x = torch.randn(t, k, device=cuda, generator=gen).to(getattr(torch, KERNELS[dtype].torch_dtype))
        return plan_sparse_decode(*weights[dtype, n_out, k], x, table=False)
    return problem


def tune_sparse_decode(shapes: Iterable[Any], tokens: Iterable[int] = (16, 1, 4, 8, 32, 64), *,
                       dtypes: Iterable[str] = ("bf16",), warmup: int = 5, rep: int = 20,
                       max_seconds: float | None = None, out: str | os.PathLike[str] | None = None,
                       benchmarker: Callable[..., float] | None = graph_bench,
                       say: Callable[[str], None] = lambda text: None, problem: Problem | None = None,
                       device: int | tuple[str, int] | None = None) -> dict[str, Any]:
    """Tune each (token tile, dtype, shape) with :func:`tune_decode_plan` (T the largest of
    ``tokens`` in the tile; tiles in the order of ``tokens``); return the table ``{"format", "gpu",
    "sms", "compiler", "seconds", "left_out", "entries"}`` and write it to ``out`` if given
    (atomically, keeping the entries a decode table already there holds for other problems, read
    again under the file's lock at each write: sweeps writing one file at once keep each other's).
    ``max_seconds``: no new problem is started after that long (``left_out`` names them).
    ``benchmarker``: :func:`~.graph_timing.graph_bench` (default), None for ``do_bench`` of the
    plain launches, or one of the caller's, run with the tuned GPU as the current device
    (:func:`~.tune_device.timer`). ``device``: the GPU's ordinal (default sparsile's current device, whatever
    torch's): the problems are made, timed and keyed there (:mod:`.tune_device`); or, with
    ``problem``, the (name, SMs) the entries are keyed by (the CPU tests pass interpreter plans and
    a fake timer)."""
    from ...backend.runtime.bench import do_bench
    from ...driver.autotune_cache import compiler_version, write_table

    parsed, tiles, dts = check_sweep_inputs(shapes, tokens, dtypes)
    start = time.perf_counter()
    on_gpu: Any = contextlib.nullcontext()
    bench: Callable[..., float] = benchmarker or do_bench
    if not isinstance(device, tuple):
        from ...backend import runtime
        from .tune_device import timer, torch_on, tuning_ordinal

        ordinal = tuning_ordinal(device)
        dev = runtime.current_device(ordinal)
        device = (dev.name, dev.sm_count)
        # a caller's benchmarker sees the tuned GPU as current (graph_bench finds it itself)
        bench = graph_bench if benchmarker is graph_bench else \
            timer(benchmarker, ordinal, functools.partial(do_bench, device=ordinal))
        if problem is None:
            problem, on_gpu = gpu_problem(ordinal), torch_on(ordinal)
    make = problem or gpu_problem()
    entries: dict[str, Any] = {}
    left: list[str] = []

    def write(table: dict[str, Any]) -> None:
        """``table`` merged with the file's entries, read again under its lock (another sweep may
        have written the file since this one started)."""
        path = Path(out)
        write_table(path, lambda: merged(table, _decode_entries(path)), table)

    def result() -> dict[str, Any]:
        return {"format": TABLE_FORMAT, "gpu": device[0], "sms": device[1], "compiler": compiler_version(),
                "seconds": round(time.perf_counter() - start, 1), "left_out": left, "entries": entries}
    with on_gpu:
        for bn, t in tiles.items():
            for dtype in dts:
                for n_out, k in parsed:
                    key = table_key(*device, dtype, n_out, k, bn)
                    if max_seconds is not None and time.perf_counter() - start > max_seconds:
                        left.append(key)
                        continue
                    entries[key] = tune_decode_plan(make(dtype, n_out, k, t), device[1], bench,
                                                    warmup=warmup, rep=rep, say=say)
                    if out is not None:  # after each problem: a sweep cut short keeps what it found
                        write(result())
    table = result()
    if out is not None:
        write(table)
    return table


def merged(table: dict[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    """``table`` (one sweep's) with the ``kept`` entries of the file it is written to; its
    ``left_out`` then names only the problems the file has no entry for (a problem this sweep left
    out keeps an earlier sweep's entry)."""
    entries = {**kept, **table["entries"]}
    return {**table, "left_out": [key for key in table["left_out"] if key not in entries], "entries": entries}


def _decode_entries(path: Path) -> dict[str, Any]:
    """The entries of the decode table at ``path`` ({} when there is none, or it is no decode table)."""
    try:
        load_decode_table(path)
    except LaunchError:
        return {}
    import json

    return dict(json.loads(path.read_text(encoding="utf-8"))["entries"])
