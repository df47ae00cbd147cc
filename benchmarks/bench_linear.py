"""A 2:4-sparse linear layer in PyTorch on the GPU: ``sparsile.torch.SparseLinear`` (eager, CUDA
graph replay, torch.compile) against dense ``F.linear``, torch's ``to_sparse_semi_structured``
(cuSPARSELt) and ``torch._cslt_sparse_mm`` with the algorithm ``_cslt_sparse_mm_search`` picks, on
the layer shapes of Llama-3 8B and 70B, in one run, one table (markdown on stdout; ``--json FILE``).

    python benchmarks/bench_linear.py --quick                   # every shape, T in {1, 16, 256}
    python benchmarks/bench_linear.py --shapes 8B --tokens 1 4 16 --dtypes bf16
    python benchmarks/bench_linear.py --dtypes bf16 --json linear.json --max-seconds 200

Most of a run's time outside the measurements is ``SparseLinear.from_dense`` (pruning and compressing
on the host, slowest for e4m3 and the 70B gate_up weight of 470 M values) and the torch.compile of
each layer; ``--max-seconds`` starts no new shape after the limit, ``--variants`` drops contenders.

y = x @ W.T with x (T, K) bf16 (f16 rows: f16) and W (N, K) pruned to 2:4 by magnitude; every
contender gets the same pruned weight. e4m3 rows: the weight is quantized with per-output-channel
scales and x per token; the dense anchor is ``torch._scaled_mm`` with rowwise scales (per-tensor
where rowwise is refused) on x quantized beforehand, so its time is the GEMM alone while
SparseLinear's includes its own per-token quantization of x (a conservative comparison;
``--fp8-dense-quantize`` puts a torch-ops quantization into the anchor's time instead).

Columns (µs per call):
  wall     host-inclusive time: N back-to-back calls, then one synchronize, divided by N (median of
           several such blocks); a host-bound call shows its host cost here, a GPU-bound one its
           kernel time. Dense F.linear and eager SparseLinear take their blocks in turn (one of
           each, then again), so both meet the host at the same speeds
  best     the fastest of those blocks: what a call costs when no other process on the host takes
           the CPU from it (the GPU machine's host is shared: the same dense F.linear call measured
           20-70 µs per call in the medians of one session's runs); the targets use it, for dense
           and SparseLinear alike; with ``--passes P`` the fastest block of P passes over the table
  host     the Python/launch side alone: the same N calls timed up to the last return, before the
           synchronize
  kern     kernel time: torch.profiler CUDA device time of all kernels one call launches
  ovh      best - kern (the host overhead not hidden behind the kernel), of eager SparseLinear and,
           for comparison on the same host, of dense F.linear
  graph    CUDA graph replay: R calls captured in one graph, replayed back to back, time / R
           (kernel time plus the gaps between kernels; no Python). The R calls use one weight, which
           stays in the 50 MB L2 between calls when it fits (``--l2 warm``, the default); ``--l2 cold``
           rotates them over copies of the weight that together take at least 3 x L2 (at most 8
           copies), so each call streams its weight from HBM as a model's layers do (the decode
           tuning times its candidates so: docs/autotune.md)
  cslt     kernel time of ``torch._cslt_sparse_mm`` with the searched algorithm (e4m3: x quantized
           beforehand, so the quantization is not in it)
  x/dense  speedups: the dense time / this time (eager: wall; best: best; graph: graph; kern: kern)
  err      max |y - ref| / max |ref| of eager SparseLinear (in parentheses: of the dense anchor), ref =
           x @ W_pruned.T in float64 (e4m3 rows: mostly the quantization error, for both)
Targets (issue 12), at T <= 16 on every shape: ovh <= 8 µs; eager best <= dense best; graph >= 1.5x
dense under the same graph method.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import (  # a sibling script, not a package
    environment,
    first_line,
    graph_reps,
    graph_time,
    host_probe_us,
    kernel_time,
    positive,
    profile_calls,
    prune_24,
    quantize_rows_e4m3,
    raise_dynamo_limits,
    relative_error,
    time_calls,
    time_calls_interleaved,
    torch_layer_missing,
)


@dataclass(frozen=True)
class Shape:
    """A linear layer: N output features, K input features."""

    model: str
    layer: str
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.model} {self.layer}"


SHAPES = (Shape("8B", "qkv", 6144, 4096), Shape("8B", "o", 4096, 4096), Shape("8B", "gate_up", 28672, 4096),
          Shape("8B", "down", 4096, 14336), Shape("70B", "qkv", 10240, 8192), Shape("70B", "o", 8192, 8192),
          Shape("70B", "gate_up", 57344, 8192), Shape("70B", "down", 8192, 28672))
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_TOKENS = (1, 16, 256)
DTYPES = ("bf16", "f16", "e4m3")


def activation_dtype(dtype: str) -> Any:
    """The 16-bit torch type of x, y and the dense weight for a row of ``dtype`` (bf16 for e4m3)."""
    import torch

    return torch.float16 if dtype == "f16" else torch.bfloat16
VARIANTS = ("eager", "graph", "compile", "semi", "cslt")
SMALL_T = 16  # the targets apply at T <= SMALL_T
EAGER_QX = ("rule", "always", "never")
MAX_OVERHEAD_US = 8.0
MIN_GRAPH_SPEEDUP = 1.5
DEVICE = "cuda"  # the tests run the Python side on "cpu" with the GPU-only timers replaced


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=None, metavar="SEL",
                    help="8B, 70B, a layer (qkv, o, gate_up, down) or MODEL:LAYER e.g. 70B:down (default: all)")
    ap.add_argument("--tokens", nargs="+", type=positive, default=None, help=f"T values (default {TOKENS})")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["bf16", "e4m3"],
                    help="default: bf16 e4m3 (f16 runs the f16 kernel against f16 F.linear and cuSPARSELt)")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                    help="what to run besides dense and eager SparseLinear, which always run (graph: both "
                         "replayed from CUDA graphs; compile: torch.compile(SparseLinear); semi, cslt: cuSPARSELt)")
    ap.add_argument("--quick", action="store_true", help=f"T in {QUICK_TOKENS} unless --tokens is given")
    ap.add_argument("--compile-max-tokens", type=positive, default=SMALL_T,
                    help="run the torch.compile variant only up to this T (each compile costs seconds)")
    ap.add_argument("--fp8-dense-quantize", action="store_true",
                    help="e4m3: count the per-token quantization of x (torch ops) in the dense anchor's time "
                         "(default: x is quantized beforehand, the anchor is _scaled_mm alone)")
    ap.add_argument("--blocks", type=positive, default=7, help="timed blocks per measurement (median taken)")
    ap.add_argument("--passes", type=positive, default=1,
                    help=f"time the eager blocks of dense and SparseLinear at T <= {SMALL_T} again in this many "
                         "passes over the whole table (each pass rebuilds the layers), so that a stretch of "
                         "seconds in which the shared host runs slowly cannot take every block of a row; 'best' "
                         "is then the fastest block of any pass, for dense and SparseLinear alike, and the "
                         "targets are also printed for the first pass alone")
    ap.add_argument("--l2", choices=("warm", "cold"), default="warm",
                    help="graph column: every replayed call on one weight (warm: it may stay in L2) or rotating "
                         "over copies totalling 3 x L2 (cold: from HBM, as in a model)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new case after this many seconds (the table keeps the rows measured)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the rows as JSON")
    ap.add_argument("--host-diag", action="store_true",
                    help="also a table of what the host did while the rows were timed: a fixed pure-Python "
                         "workload's time per row (the host's speed), the calling thread's CPU share of each "
                         "timed block, garbage collections; and a cProfile of the eager call of every row whose "
                         f"overhead misses {MAX_OVERHEAD_US:g} µs at T <= {SMALL_T}")
    ap.add_argument("--eager-qx", choices=EAGER_QX, default="rule",
                    help="e4m3 eager calls at T <= 64: the one launch that quantizes x in the kernel where the "
                         "layer's rule says (rule, the default: quantizes_in_kernel), at any T x N x K (always: "
                         "still not where it does not fit or needs more K shares than two launches), or never "
                         "(the quantizer and the GEMM); to measure the rule")
    args = ap.parse_args(argv)
    try:
        args.shape_list = select_shapes(args.shapes)
    except ValueError as e:
        ap.error(str(e))
    args.token_list = tuple(args.tokens) if args.tokens else (QUICK_TOKENS if args.quick else TOKENS)
    return args


def select_shapes(selectors: list[str] | None) -> tuple[Shape, ...]:
    """The shapes named by ``--shapes`` selectors, in table order; ValueError for a selector that names none."""
    if not selectors:
        return SHAPES
    chosen: set[Shape] = set()
    for sel in selectors:
        model, _, layer = sel.partition(":")
        hits = [s for s in SHAPES if (s.model == model and (not layer or s.layer == layer))
                or (not layer and s.layer == model)]
        if not hits:
            names = ", ".join(f"{s.model}:{s.layer}" for s in SHAPES)
            raise ValueError(f"--shapes {sel!r} names no shape; use 8B, 70B, a layer or one of {names}")
        chosen.update(hits)
    return tuple(s for s in SHAPES if s in chosen)


# ------------------------------------------------------------------------------------------------
# timing


def sync() -> None:
    """Wait for the device (``torch.cuda.synchronize``; nothing on the CPU)."""
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# operands and contenders


GRAPH_L2 = {"warm": "one weight: L2-warm where it fits",
            "cold": "rotating over weight copies of at least 3 x L2: from HBM"}
L2_BYTES = 50 * 2 ** 20  # the H200's L2
MAX_COPIES = 8


def copies_for_cold_l2(weight_bytes: int, most: int | None = MAX_COPIES) -> int:
    """How many copies of a weight of ``weight_bytes`` take at least 3 x L2 together (1 to ``most``;
    None: as many as that takes)."""
    copies = max(1, -(-3 * L2_BYTES // max(1, weight_bytes)))
    return copies if most is None else min(most, copies)


def rotating(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """A call that runs ``calls`` in turn, one per call (captured into a graph: each captured call
    binds the next one's weight)."""
    turn = [0]

    def call() -> Any:
        fn = calls[turn[0] % len(calls)]
        turn[0] += 1
        return fn()

    return call


def tensor_bytes(*tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def make_sparse_linear(linear: Any, dtype: str) -> Any:
    """``SparseLinear.from_dense(linear, dtype=...)``: None for bf16 and f16 (the layer's own dtype);
    for e4m3 the name "e4m3" first, then ``torch.float8_e4m3fn``."""
    import torch

    from sparsile.torch import SparseLinear

    if dtype != "e4m3":
        return SparseLinear.from_dense(linear)
    try:
        return SparseLinear.from_dense(linear, dtype="e4m3")
    except (TypeError, ValueError, KeyError):
        return SparseLinear.from_dense(linear, dtype=torch.float8_e4m3fn)


def cslt_search(compressed: Any, dense_b: Any, **kw: Any) -> int:
    """The algorithm id ``torch._cslt_sparse_mm_search`` picks (its result is an int, or a tuple
    starting with it in some torch versions); 0 where the search is unavailable."""
    import torch

    search = getattr(torch, "_cslt_sparse_mm_search", None)
    if search is None:
        return 0
    found = search(compressed, dense_b, **kw)
    return int(found[0] if isinstance(found, tuple | list) else found)


class Contenders:
    """Everything measured on one (shape, dtype): built once, then called for each T."""

    def __init__(self, shape: Shape, dtype: str, variants: tuple[str, ...], errors: dict[str, str],
                 quantize_in_dense: bool = False, l2: str = "warm") -> None:
        import torch

        self.dtype, self.errors, self.quantize_in_dense = dtype, errors, quantize_in_dense
        gen = torch.Generator(device=DEVICE).manual_seed(shape.n * 31 + shape.k)
        half = activation_dtype(dtype)
        w = prune_24(torch.randn(shape.n, shape.k, device=DEVICE, generator=gen).to(half))
        self.w = w
        self.linear = torch.nn.Linear(shape.k, shape.n, bias=False, device=DEVICE, dtype=half)
        with torch.no_grad():
            self.linear.weight.copy_(w)
        self.sparse = self.compiled = self.semi = self.cslt = None
        self.fp8_rowwise = True
        if dtype == "e4m3":
            self.w8, self.sw = quantize_rows_e4m3(w)  # sw (N, 1)
        started = time.perf_counter()
        self.sparse = self._try("eager", lambda: make_sparse_linear(self.linear, dtype))
        self.build_s = time.perf_counter() - started  # SparseLinear.from_dense: prune, compress, encode
        if self.sparse is not None and "compile" in variants:
            self.compiled = self._try("compile", lambda: torch.compile(self.sparse, fullgraph=True, dynamic=True))
        if dtype != "e4m3" and "semi" in variants:
            from torch.sparse import to_sparse_semi_structured

            self.semi = self._try("semi", lambda: to_sparse_semi_structured(w))
        if "cslt" in variants:
            self.cslt = self._try("cslt", lambda: torch._cslt_compress(self.w8 if dtype == "e4m3" else w))
        self.cold = l2 == "cold" and "graph" in variants
        self.dense_copies: list[Contenders] = []  # --l2 cold: contenders on copies of the weights
        self.sparse_copies: list[Any] = []
        if self.cold:
            import copy

            dense_bytes = tensor_bytes(self.w8 if dtype == "e4m3" else w)
            for _ in range(copies_for_cold_l2(dense_bytes) - 1):
                twin = copy.copy(self)
                twin.w = w.clone()
                if dtype == "e4m3":
                    twin.w8, twin.sw = self.w8.clone(), self.sw.clone()
                self.dense_copies.append(twin)
            if self.sparse is not None:
                sparse_bytes = tensor_bytes(*self.sparse.buffers())
                self.sparse_copies = [copy.deepcopy(self.sparse) for _ in range(copies_for_cold_l2(sparse_bytes) - 1)]

    def _try(self, what: str, build: Callable[[], Any]) -> Any:
        try:
            return build()
        except Exception as e:  # a contender that cannot be built is reported, the others still run
            self.errors[what] = first_line(e)
            return None

    def dense(self, x: Any) -> Callable[[], Any]:
        import torch
        import torch.nn.functional as F

        if self.dtype != "e4m3":
            return lambda: F.linear(x, self.w)
        sw_row = self.sw.reshape(1, -1)
        one = torch.ones((), device=DEVICE)
        pre8, pre_sx = quantize_rows_e4m3(x)

        def fp8() -> Any:
            x8, sx = quantize_rows_e4m3(x) if self.quantize_in_dense else (pre8, pre_sx)
            if self.fp8_rowwise:
                return torch._scaled_mm(x8, self.w8.T, scale_a=sx, scale_b=sw_row, out_dtype=torch.bfloat16)
            y = torch._scaled_mm(x8, self.w8.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return y * (sx * sw_row)  # per-tensor GEMM, scales applied after (rowwise refused)

        if self.fp8_rowwise:
            try:
                fp8()
            except RuntimeError as e:
                self.fp8_rowwise = False
                self.errors["dense fp8"] = f"rowwise _scaled_mm refused, per-tensor used: {first_line(e)}"
        return fp8

    def cslt_call(self, x: Any) -> Callable[[], Any]:
        """``torch._cslt_sparse_mm(W_compressed, x.T)`` with the searched algorithm (e4m3: x quantized
        first, bf16 out). Where cuSPARSELt refuses x.T as it is, a contiguous copy and then x padded to
        a multiple of 16 tokens (as torch's semi-structured tensors do) are tried; the note says which."""
        import torch

        kw: dict[str, Any] = {}
        if self.dtype == "e4m3":
            x, _ = quantize_rows_e4m3(x)
            kw["out_dtype"] = torch.bfloat16
        pad = -x.shape[0] % 16
        padded = torch.cat([x, x.new_zeros(pad, x.shape[1])]) if pad else x
        tries = [("x.T", x.T), ("x.T contiguous", x.T.contiguous())]
        if pad:
            tries.append((f"x padded to {padded.shape[0]} tokens, .T contiguous", padded.T.contiguous()))
        refused = []
        for name, b in tries:
            try:
                alg = cslt_search(self.cslt, b, **kw)
                torch._cslt_sparse_mm(self.cslt, b, alg_id=alg, **kw)
            except RuntimeError as e:
                refused.append(f"{name}: {first_line(e)}")
                continue
            if refused:
                self.errors[f"cslt T={x.shape[0]}"] = f"ran with {name} after refusals ({'; '.join(refused)})"
            return lambda: torch._cslt_sparse_mm(self.cslt, b, alg_id=alg, **kw)
        raise RuntimeError("cuSPARSELt refused every layout: " + "; ".join(refused))


# ------------------------------------------------------------------------------------------------
# one case


def measure(label: str, fn: Callable[[], Any], row: dict[str, Any], errors: dict[str, str], *,
            blocks: int, wall: bool = True, graph: bool = False, graph_fn: Callable[[], Any] | None = None,
            timed: Any = None) -> None:
    """Fill ``row[label + '_wall' / '_host' / '_kern' / '_graph']``; an exception goes to ``errors``.
    ``graph_fn``: what the graph captures instead of ``fn`` (``--l2 cold``: a rotation over copies);
    ``timed``: the host-inclusive :class:`Timing` already measured (interleaved with a contender's)."""
    try:
        if wall:
            t = timed if timed is not None else time_calls(fn, sync, blocks=blocks)
            row[f"{label}_wall"], row[f"{label}_host"], row[f"{label}_best"] = t.wall, t.host, t.wall_best
            row[f"{label}_cpu"], row[f"{label}_gc"] = t.cpu_share, t.gc_runs
        row[f"{label}_kern"] = kernel_time(fn)
        if graph:
            row[f"{label}_graph"] = graph_time(graph_fn or fn, graph_reps(row[f"{label}_kern"]), blocks)
    except Exception as e:
        errors[label] = first_line(e)


def row_input(c: Contenders, shape: Shape, t: int) -> Any:
    """The row's activations x (T, K): the same in every pass (seeded by T)."""
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(t)
    return torch.randn(t, shape.k, device=DEVICE, generator=gen).to(activation_dtype(c.dtype))


def bench_case(c: Contenders, shape: Shape, t: int, args: argparse.Namespace) -> dict[str, Any]:
    errors = dict(c.errors)
    row: dict[str, Any] = {"model": shape.model, "layer": shape.layer, "n": shape.n, "k": shape.k, "t": t,
                           "dtype": c.dtype, "errors": errors, "from_dense_s": c.build_s}
    if args.host_diag:
        row["probe"] = host_probe_us()
    x = row_input(c, shape, t)
    ref = x.double() @ c.w.double().T
    dense = eager = None
    try:
        dense = c.dense(x)
        row["dense_err"] = relative_error(dense(), ref)
    except Exception as e:
        errors["dense"] = first_line(e)
        dense = None
    if c.sparse is not None:
        try:
            y = c.sparse(x)
            row["err"] = relative_error(y, ref)
            row["out_dtype"] = str(y.dtype).removeprefix("torch.")
            if tuple(y.shape) != (t, shape.n):
                errors["eager"] = f"output shape {tuple(y.shape)}, expected {(t, shape.n)}"
        except Exception as e:
            errors["eager"] = first_line(e)
        if "eager" not in errors:
            def eager() -> Any:
                return c.sparse(x)
    # dense and eager SparseLinear, compared with each other, are timed in alternating blocks
    timed: list[Any] = [None, None]
    if dense is not None and eager is not None:
        try:
            timed = time_calls_interleaved([dense, eager], sync, blocks=args.blocks)
        except Exception as e:
            errors["interleaved"] = first_line(e)
    if dense is not None:
        try:
            dense_graph = rotating([dense, *(twin.dense(x) for twin in c.dense_copies)]) if c.cold else None
            measure("dense", dense, row, errors, blocks=args.blocks, graph="graph" in args.variants,
                    graph_fn=dense_graph, timed=timed[0])
        except Exception as e:
            errors["dense"] = first_line(e)
    if eager is not None:
        sl_graph = rotating([lambda layer=layer: layer(x) for layer in (c.sparse, *c.sparse_copies)]) \
            if c.cold else None
        measure("sl", eager, row, errors, blocks=args.blocks, graph="graph" in args.variants, graph_fn=sl_graph,
                timed=timed[1])
    del ref
    if c.compiled is not None and t <= args.compile_max_tokens:
        measure("compile", lambda: c.compiled(x), row, errors, blocks=args.blocks)
    if c.semi is not None:
        import torch.nn.functional as F

        measure("semi", lambda: F.linear(x, c.semi), row, errors, blocks=args.blocks)
    if c.cslt is not None:
        try:
            measure("cslt", c.cslt_call(x), row, errors, blocks=args.blocks, wall=False)
        except Exception as e:
            errors["cslt"] = first_line(e)
    for key, note in c.errors.items():  # notes the contenders added during this case
        errors.setdefault(key, note)
    derive(row)
    if args.host_diag and eager is not None and t <= SMALL_T and row.get("sl_ovh", 0.0) > MAX_OVERHEAD_US:
        row["sl_profile"] = profile_calls(eager, sync, calls=1000, top=12)  # (bench_case runs under inference_mode)
        row["probe_after"] = host_probe_us()
    return row


def derive(row: dict[str, Any]) -> None:
    """The row's overheads (best - kern) and speedups (dense / SparseLinear) from its times."""
    for label in ("sl", "dense"):  # dense's own overhead too: what torch's call costs on this host
        if f"{label}_kern" in row and f"{label}_best" in row:
            row[f"{label}_ovh"] = row[f"{label}_best"] - row[f"{label}_kern"]
    for mode in ("wall", "best", "graph", "kern"):
        if row.get(f"sl_{mode}") and row.get(f"dense_{mode}"):
            row[f"speedup_{mode}"] = row[f"dense_{mode}"] / row[f"sl_{mode}"]


def retime_eager(c: Contenders, shape: Shape, t: int, row: dict[str, Any], blocks: int) -> None:
    """One more pass (``--passes``) of the interleaved eager blocks of dense and SparseLinear on the row's
    input: each label's fastest block of every pass goes to ``row[label + '_best_passes']``, its fastest
    of all to ``row[label + '_best']``; overheads and speedups follow."""
    x = row_input(c, shape, t)
    dense = c.dense(x)

    def eager() -> Any:
        return c.sparse(x)

    for label, timing in zip(("dense", "sl"), time_calls_interleaved([dense, eager], sync, blocks=blocks),
                             strict=True):
        bests = row.setdefault(f"{label}_best_passes", [row[f"{label}_best"]])
        bests.append(timing.wall_best)
        row[f"{label}_best"] = min(bests)
    derive(row)


def retime_passes(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Passes 2..``--passes`` over the rows at T <= SMALL_T that have both eager timings (layers rebuilt
    per shape and dtype as in the first pass; no graph, compile or cuSPARSELt contenders)."""
    import torch

    todo: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["t"] <= SMALL_T and "sl_best" in r and "dense_best" in r:
            todo.setdefault((r["dtype"], f"{r['model']} {r['layer']}"), []).append(r)
    shapes = {s.name: s for s in args.shape_list}
    for p in range(2, args.passes + 1):
        for (dtype, name), group in todo.items():
            with torch.no_grad():
                c = Contenders(shapes[name], dtype, (), {}, args.fp8_dense_quantize, "warm")
            if c.sparse is None:
                continue
            for r in group:
                try:  # (as in the first pass, a contender's exception is a note: the row keeps the passes it has)
                    with torch.inference_mode():
                        retime_eager(c, shapes[name], r["t"], r, args.blocks)
                except Exception as e:
                    r["errors"][f"pass {p}"] = first_line(e)
            del c
            torch.cuda.empty_cache()


def format_passes(rows: list[dict[str, Any]]) -> str:
    """``--passes``: each re-timed row's fastest eager block per pass, dense and SparseLinear."""
    lines = ["| shape | T | dtype | dense best per pass | SL best per pass | SL kern | SL ovh (fastest) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "sl_best_passes" in r:
            passes = [" / ".join(f"{v:.1f}" for v in r[f"{label}_best_passes"]) for label in ("dense", "sl")]
            lines.append(f"| {r['model']} {r['layer']} | {r['t']} | {r['dtype']} | {passes[0]} | {passes[1]} | "
                         f"{r.get('sl_kern', float('nan')):.1f} | {r.get('sl_ovh', float('nan')):.1f} |")
    return "\n".join(lines)


DIAG_COLUMNS = (("probe µs", "probe"), ("SL host", "sl_host"), ("SL ovh", "sl_ovh"), ("SL cpu", "sl_cpu"),
                ("SL gc", "sl_gc"), ("dense host", "dense_host"), ("dense ovh", "dense_ovh"),
                ("dense cpu", "dense_cpu"), ("dense gc", "dense_gc"), ("probe after", "probe_after"))


def format_diag(rows: list[dict[str, Any]]) -> str:
    """``--host-diag``: per row the host probe, the timed blocks' CPU share and collections, SL and dense."""
    lines = ["| shape | T | dtype | " + " | ".join(name for name, _ in DIAG_COLUMNS) + " |",
             "|" + "---|" * (3 + len(DIAG_COLUMNS))]
    for r in rows:
        cells = [f"{r['model']} {r['layer']}", str(r["t"]), r["dtype"]]
        for _, key in DIAG_COLUMNS:
            v = r.get(key)
            cells.append("-" if v is None else (str(v) if key.endswith("_gc") else f"{v:.2f}" if key.endswith("_cpu")
                                                 else f"{v:.1f}"))
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.get("sl_profile"):
            lines.append(f"\ncProfile of the eager call, {r['model']} {r['layer']} T={r['t']} {r['dtype']}:\n"
                         + r["sl_profile"])
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# report


COLUMNS = (("shape", None), ("N×K", None), ("T", None), ("dtype", None),
           ("dense wall", "dense_wall"), ("dense best", "dense_best"), ("dense kern", "dense_kern"),
           ("dense ovh", "dense_ovh"), ("dense graph", "dense_graph"),
           ("SL wall", "sl_wall"), ("SL best", "sl_best"), ("SL host", "sl_host"), ("SL kern", "sl_kern"),
           ("SL ovh", "sl_ovh"),
           ("SL graph", "sl_graph"), ("SL compile wall", "compile_wall"),
           ("semi wall", "semi_wall"), ("semi kern", "semi_kern"), ("cslt kern", "cslt_kern"),
           ("eager/dense", "speedup_wall"), ("best/dense", "speedup_best"), ("graph/dense", "speedup_graph"),
           ("kern/dense", "speedup_kern"),
           ("err (dense)", "err"))


def table_header() -> str:
    names = [name for name, _ in COLUMNS]
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def format_row(r: dict[str, Any]) -> str:
    cells = [f"{r['model']} {r['layer']}", f"{r['n']}×{r['k']}", str(r["t"]), r["dtype"]]
    for _, key in COLUMNS[4:]:
        v = r.get(key)
        if v is None:
            cells.append("-")
        elif key == "err":
            cells.append(f"{v:.1e}" + (f" ({r['dense_err']:.1e})" if r.get("dense_err") is not None else ""))
        elif key.startswith("speedup"):
            cells.append(f"{v:.2f}x")
        else:
            cells.append(f"{v:.1f}")
    return "| " + " | ".join(cells) + " |"


def check_targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """The three issue-12 targets over the rows with T <= 16: (target, met (None: not measured), detail)."""
    small = [r for r in rows if r["t"] <= SMALL_T]
    out: list[tuple[str, bool | None, str]] = []

    def judge(name: str, key: str, ok: Callable[[float], bool], worst: Callable[..., Any], unit: str) -> None:
        got = [r for r in small if r.get(key) is not None]
        if not got:
            out.append((name, None, "not measured"))
            return
        bad = [r for r in got if not ok(r[key])]
        w = worst(got, key=lambda r: r[key])
        detail = (f"{len(got) - len(bad)}/{len(got)} rows; worst {w[key]:.2f}{unit} at {w['model']} {w['layer']} "
                  f"T={w['t']} {w['dtype']}")
        out.append((name, not bad, detail))

    judge(f"eager host overhead <= {MAX_OVERHEAD_US:g} µs over kernel time (T <= {SMALL_T})", "sl_ovh",
          lambda v: v <= MAX_OVERHEAD_US, max, " µs")
    judge(f"eager no slower than dense, fastest blocks (T <= {SMALL_T})", "speedup_best", lambda v: v >= 1.0, min,
          "x")
    judge(f"CUDA graph >= {MIN_GRAPH_SPEEDUP}x dense, both replayed from CUDA graphs (T <= {SMALL_T})", "speedup_graph",
          lambda v: v >= MIN_GRAPH_SPEEDUP, min, "x")
    return out


def format_targets(results: list[tuple[str, bool | None, str]]) -> str:
    mark = {True: "PASS", False: "FAIL", None: "n/a "}
    return "\n".join(f"- [{mark[ok]}] {name}: {detail}" for name, ok, detail in results)


def requirements_missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    return torch_layer_missing()


def set_eager_qx(mode: str) -> None:
    """Replace the layer's rule for one-launch eager e4m3 calls (``_kernels.quantizes_in_kernel``)
    by "always" or "never"; "rule" keeps it. Records are built after this, so they all follow it."""
    if mode == "rule":
        return
    from sparsile.integrations.torch import _kernels

    _kernels.quantizes_in_kernel = (lambda t, n, k: True) if mode == "always" else (lambda t, n, k: False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = requirements_missing()
    if missing is not None:
        print(f"bench_linear needs an NVIDIA GPU, torch and sparsile.torch: {missing}", file=sys.stderr)
        return 3  # (the sparsile CLI's exit status for what this machine or installation lacks)
    import torch

    if "compile" in args.variants:
        raise_dynamo_limits()
    set_eager_qx(args.eager_qx)
    started = time.perf_counter()
    env = environment()
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print(f"shapes {', '.join(s.name for s in args.shape_list)}; T {list(args.token_list)}; dtypes {args.dtypes}; "
          f"variants {args.variants}; eager e4m3 one launch: {args.eager_qx}\n", flush=True)
    print(table_header(), flush=True)
    rows: list[dict[str, Any]] = []
    stopped = None
    for dtype in args.dtypes:
        for shape in args.shape_list:
            if args.max_seconds is not None and time.perf_counter() - started > args.max_seconds:
                stopped = f"stopped after {args.max_seconds:g} s (--max-seconds) before {shape.name} {dtype}"
                break
            build_errors: dict[str, str] = {}
            with torch.no_grad():  # built as a user would build a model; run under inference_mode
                contenders = Contenders(shape, dtype, tuple(args.variants), build_errors, args.fp8_dense_quantize,
                                        args.l2)
            for t in args.token_list:
                with torch.inference_mode():
                    row = bench_case(contenders, shape, t, args)
                rows.append(row)
                print(format_row(row), flush=True)
            del contenders
            if "compile" in args.variants:
                torch._dynamo.reset()  # drop the compiled entries of this shape's modules
            torch.cuda.empty_cache()
        if stopped:
            break
    print("\nµs per call. wall: N back-to-back calls + 1 sync, / N, median of blocks; host: the same up to the last "
          "return; kern: torch.profiler CUDA time of one call's kernels; graph: replay of R calls captured in one "
          f"CUDA graph, / R ({GRAPH_L2[args.l2]}); "
          "best: the fastest block's wall; ovh = SL best - SL kern; x/dense = dense time / SL time.")
    built = {(r["model"], r["layer"], r["dtype"]): r["from_dense_s"] for r in rows}
    if built:
        slowest = max(built, key=built.get)
        print(f"SparseLinear.from_dense took {sum(built.values()):.1f} s for {len(built)} layers (slowest "
              f"{' '.join(slowest)}: {built[slowest]:.1f} s); not part of any time above.")
    notes = sorted({f"{r['dtype']} {k}: {v}" for r in rows for k, v in r["errors"].items()})
    if notes:
        print("notes:\n" + "\n".join(f"- {n}" for n in notes))
    if stopped:
        print(stopped)
    if args.host_diag:
        print("\nhost diagnostics (cpu: the calling thread's CPU time / wall time of the timed calls, median block; "
              "gc: collections during the blocks; probe: µs of a fixed pure-Python workload before the row, "
              "'probe after' after a missing row's profile):\n" + format_diag(rows))
    first_pass = None
    if args.passes > 1 and not stopped:
        first_pass = check_targets(rows)
        retime_passes(rows, args)
        print(f"\neager blocks re-timed in {args.passes} passes (µs; each pass's fastest block; 'best', the "
              "overheads and the targets below take the fastest of all passes):\n" + format_passes(rows))
        print("\ntargets, first pass alone:\n" + format_targets(first_pass))
    targets = check_targets(rows)
    print("\ntargets:\n" + format_targets(targets))
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"env": env, "args": sys.argv[1:] if argv is None else argv, "rows": rows,
                                         "targets": targets, "targets_first_pass": first_pass,
                                         "stopped": stopped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
