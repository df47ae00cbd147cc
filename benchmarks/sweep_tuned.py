"""Correctness of every configuration of the shipped tuned tables, against float64 with poisoned
outputs (the ``--tuned`` section of sweep_sparse_gemm.py, which runs it; docs/autotune.md has the
tables).

Each table entry becomes a :class:`Case` and runs through the path its readers take:

- ``dtype MxNxK`` entries of ``tuned/<gpu>.json``: ``sparse_matmul``'s, ``tuning.run_with_table``
  on the planned :class:`~sparsile.stdlib.kernels.gemm.SparseMatmul` (the table's lookup must give
  the entry's config);
- ``linear-<dtype> MxNxK`` entries (M out features, N = T tokens): ``plan_sparse_linear``, which
  reads the shipped table of the current GPU itself; where it did not take the entry (another GPU,
  another table, the interpreter) the config is applied with ``linear_tuning.with_linear_config``
  (``via`` says which);
- entries of ``tuned/decode-<gpu>.json``: ``plan_sparse_decode(..., table=)``, which takes an entry
  of the current device and SM count only; elsewhere (and in the interpreter) the entry's split-K,
  stages and reduction are passed explicitly, which the plan resolves the same way.

Operands are those of the sweep (random, 2:4-pruned weight compressed on the host); each output is
poisoned (NaN, or a sentinel for integers) before the launch and compared with the sweep's
per-dtype ``bound`` (half an ulp of the output type plus the accumulation error). Where torch and a
CUDA device are there (``operand_device``), the random operands, the float64 references and the
comparisons are made with torch on the GPU: on the host the largest weights (57344 x 8192) took
about a minute each to draw and prune, which bounded how many entries one GPU session could check.
The kernels still get host arrays, as a user's numpy call would give them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_sparse_gemm import (
    K_ALIGN,
    ROOT,
    as_f64,
    bound,
    compressed,
    host_b,
    host_type,
    host_weight,
    matmul_f64,
    padded,
)
from torch_timing import prune_24

TUNED = ROOT / "stdlib" / "kernels" / "tuned"
GEMM_TABLE = TUNED / "h200.json"
DECODE_TABLE = TUNED / "decode-h200.json"
KINDS = ("gemm", "linear", "decode")
SENTINEL = np.iinfo(np.int32).min
CHUNK_ROWS = 2048  # rows compared at a time (the largest outputs have 470 M elements)


@dataclass(frozen=True)
class Case:
    """One table entry to check: ``n`` is C's N for the GEMM, the tokens T for the layer and decode."""

    kind: str
    dtype: str
    m: int
    n: int
    k: int
    config: Any  # gemm_config.GemmConfig (gemm, linear) or decode_tuning.DecodeCandidate
    key: str


@dataclass
class Row:
    """The outcome of one case (``note``: why it failed, or how the config was applied)."""

    case: Case
    via: str = ""
    max_err: float = float("nan")
    max_ref: float = float("nan")
    unwritten: int = 0
    ok: bool = False
    note: str = ""
    seconds: float = 0.0
    phases: tuple[float, float, float] = (0.0, 0.0, 0.0)  # seconds making operands, running, comparing


@dataclass(frozen=True)
class Weight:
    """A pruned weight: compressed values and metadata words (K padded), and its float64 copy (a
    numpy array, or a torch tensor on the device the operands were made on)."""

    values: np.ndarray
    meta: np.ndarray
    f64: Any
    kp: int


@dataclass
class Tables:
    """The two tables (mappings, as read from their files) the cases come from."""

    gemm: Mapping[str, Any] = field(default_factory=dict)
    decode: Mapping[str, Any] = field(default_factory=dict)


def read_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A table file's JSON (its readers check the format)."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def table_cases(tables: Tables) -> tuple[list[Case], list[str]]:
    """Every entry of both tables as a Case, ordered by weight size (cases sharing a weight next to
    each other: a bounded run covers the small shapes first), and the entry names that are no valid
    entry (their readers ignore or reject them: each counts as a failure)."""
    from sparsile.stdlib.kernels.decode_tuning import load_decode_table, parse_key, token_tile
    from sparsile.stdlib.kernels.gemm_config import GemmConfig
    from sparsile.stdlib.kernels.linear_tuning import LINEAR_PREFIX
    from sparsile.stdlib.kernels.tuning import load_gemm_table

    cases: list[Case] = []
    bad: list[str] = []
    if tables.gemm:
        for name, entry in load_gemm_table(tables.gemm).items():
            try:
                dtype, shape = name.split(" ")
                m, n, k = (int(v) for v in shape.split("x"))
                config = GemmConfig.from_json(entry["config"])
            except (ValueError, KeyError, TypeError) as e:
                bad.append(f"{name!r}: not 'dtype MxNxK' with a config ({e})")
                continue
            kind = "linear" if dtype.startswith(LINEAR_PREFIX) else "gemm"
            cases.append(Case(kind, dtype.removeprefix(LINEAR_PREFIX), m, n, k, config, name))
    if tables.decode:
        for name, cand in load_decode_table(tables.decode).items():  # SP0862 / SP0863 on a bad table
            _, _, dtype, n_out, k, bn = parse_key(name)
            tokens = tables.decode["entries"][name].get("tokens", bn)
            if type(tokens) is not int or token_tile(tokens) != bn:
                bad.append(f"{name!r}: tokens {tokens!r} are not in the token tile bn{bn}")
                continue
            cases.append(Case("decode", dtype, n_out, tokens, k, cand, name))
    cases.sort(key=lambda c: (c.m * c.k, c.m, c.dtype, KINDS.index(c.kind), c.n))
    return cases, bad


TORCH_TYPES = {"f16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn"}
"""The operand types the torch path draws (the tuned tables' types); others are drawn on the host."""


def operand_device() -> str | None:
    """``cuda:N`` when torch and a CUDA device are there (operands, references and comparisons on
    the GPU), else None (numpy on the host). N is sparsile's current device (``use_device``), whose
    SM count and tuned table the sweep reads (:func:`_sms`), whatever torch's current device
    (stdlib/kernels/tune_device.py)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from sparsile.backend import runtime

    return f"cuda:{runtime.devices.default_ordinal}"


def padded_k(dtype: str, k: int) -> int:
    """K rounded up to the kernels' K alignment for ``dtype``."""
    return -(-k // K_ALIGN[dtype]) * K_ALIGN[dtype]


def make_weight(dtype: str, m: int, k: int, rng: np.random.Generator, device: str | None = None) -> Weight:
    """A random weight as the sweep makes it (sweep_sparse_gemm.make); ``device``: drawn, pruned
    and kept in float64 by torch there (:func:`torch_weight`)."""
    if device is not None and dtype in TORCH_TYPES:
        return torch_weight(dtype, m, k, rng, device)
    kp = padded_k(dtype, k)
    w = host_weight(dtype, m, k, rng)
    values, meta = compressed(padded(w, kp), dtype)
    return Weight(values, meta, padded(as_f64(dtype, w), kp), kp)


def torch_normal(rows: int, k: int, kp: int, rng: np.random.Generator, device: str) -> Any:
    """A normal float32 (rows, kp) tensor on ``device``, zero beyond column k (the K padding), drawn by a
    generator seeded from ``rng`` (the sweep stays reproducible)."""
    import torch

    t = torch.zeros((rows, kp), dtype=torch.float32, device=device)
    gen = torch.Generator(device=device).manual_seed(int(rng.integers(2 ** 62)))
    t[:, :k] = torch.randn((rows, k), generator=gen, device=device)
    return t


def to_host(t: Any) -> np.ndarray:
    """A torch tensor as a numpy array of the sweep's host type (bf16 and e4m3 through ml_dtypes)."""
    import torch

    names = {torch.bfloat16: ("bf16", torch.int16), torch.float8_e4m3fn: ("e4m3", torch.uint8)}
    if t.dtype in names:
        name, bits = names[t.dtype]
        return t.view(bits).cpu().numpy().view(host_type(name))
    return t.cpu().numpy()


def torch_weight(dtype: str, m: int, k: int, rng: np.random.Generator, device: str) -> Weight:
    """:func:`make_weight` by torch on ``device``: a normal (m, K padded) weight, zero beyond k, keeping
    the 2 largest magnitudes of every 4 (the padding's groups keep zeros), rounded to ``dtype``;
    compressed on the host from that rounded copy, and its float64 copy left on the device."""
    import torch

    kp = padded_k(dtype, k)
    rounded = prune_24(torch_normal(m, k, kp, rng, device)).to(getattr(torch, TORCH_TYPES[dtype]))
    values, meta = compressed(to_host(rounded), dtype)
    return Weight(values, meta, rounded.to(torch.float64), kp)


def make_b(dtype: str, n: int, k: int, kp: int, rng: np.random.Generator, device: str | None = None
           ) -> tuple[np.ndarray, Any]:
    """A random (n, kp) operand, zero beyond column k: the host array the kernels get and its float64
    copy (a torch tensor on ``device`` where one is given and torch draws ``dtype``)."""
    if device is None or dtype not in TORCH_TYPES:
        b = padded(host_b(dtype, n, k, rng), kp)
        return b, as_f64(dtype, b)
    import torch

    rounded = torch_normal(n, k, kp, rng, device).to(getattr(torch, TORCH_TYPES[dtype]))
    return to_host(rounded), rounded.to(torch.float64)


def reference(w64: Any, b64: Any) -> Any:
    """C = W @ B^T in float64: with torch where the operands are torch tensors, else numpy's (or
    torch's on a GPU: sweep_sparse_gemm.matmul_f64)."""
    if isinstance(w64, np.ndarray):
        return matmul_f64(w64, b64.T)
    return w64 @ b64.T


def _poison(x: Any) -> None:
    if x is not None:
        x[...] = np.nan if "float" in str(x.dtype) else SENTINEL


def _sms(interpret: bool) -> int:
    from sparsile.stdlib.kernels.gemm import H200_SMS

    if interpret:
        return H200_SMS
    from sparsile.backend import runtime

    return runtime.current_device().sm_count


def run_gemm(case: Case, w: Weight, b: np.ndarray, tables: Tables, interpret: bool) -> tuple[Any, str]:
    """C of ``case`` as ``sparse_matmul`` computes it with the table (poisoned first); (C, via)."""
    from sparsile.stdlib.kernels.gemm import plan_sparse_matmul
    from sparsile.stdlib.kernels.tuning import find, index_table, load_gemm_table, run_with_table

    # the tiled kernel, which the table's entries configure (sparse_matmul runs the decode kernel at N <= 64)
    plan = plan_sparse_matmul(w.values, w.meta, b, dtype=case.dtype, interpret=interpret, target="sm_90a",
                              kernel="gemm")
    found = find(index_table(load_gemm_table(tables.gemm)), case.dtype, plan.m, plan.n, plan.k)
    if found != case.config:
        raise LookupError(f"the table's lookup for {plan.m}x{plan.n}x{plan.k} gives {found}, not the entry")
    _poison(plan.out)
    _poison(plan.workspace)
    if not run_with_table(plan, table=tables.gemm, interpret=interpret):
        raise LookupError("run_with_table launched nothing (no entry, or a CTA-pair one without persistence)")
    return plan.out, "table"


def run_linear(case: Case, w: Weight, x: np.ndarray, interpret: bool) -> tuple[Any, str]:
    """y of ``case`` through ``plan_sparse_linear`` (the shipped table of this GPU, when it gives
    the entry's config), else the config applied with ``with_linear_config``; (y, via)."""
    from sparsile.stdlib.kernels.linear import plan_sparse_linear
    from sparsile.stdlib.kernels.linear_tuning import default_linear_config, with_linear_config

    plan = plan_sparse_linear(w.values, w.meta, x, interpret=interpret, target="sm_90a", kernel="gemm")
    via = "shipped"
    if interpret or default_linear_config(plan) != case.config:
        plan, via = with_linear_config(plan, case.config, _sms(interpret), interpret), "explicit"
    _poison(plan.out)
    _poison(plan.workspace)
    return plan.run(interpret), via


def _normal(cand: Any) -> Any:
    """A candidate as a plan resolves it (no reduction without a split)."""
    return cand if cand.split_k > 1 else replace(cand, reduce="launch")


def run_decode(case: Case, w: Weight, x: np.ndarray, tables: Tables, interpret: bool) -> tuple[Any, str]:
    """y of ``case`` through ``plan_sparse_decode(..., table=)`` where the entry applies to this
    device, else with its split-K, stages, reduction, row slab and persistent kernel given explicitly;
    (y, via)."""
    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.decode_tuning import default_candidate  # what a plan runs

    plan = plan_sparse_decode(w.values, w.meta, x, interpret=interpret, table=tables.decode)
    via = "table"
    if not (plan.config.source.startswith("table") and default_candidate(plan) == _normal(case.config)):
        c = case.config
        plan = plan_sparse_decode(w.values, w.meta, x, interpret=interpret, split_k=c.split_k, stages=c.stages,
                                  reduce=c.reduce, bm=c.bm, persistent=c.persistent)
        via = "explicit"
    if default_candidate(plan) != _normal(case.config):
        raise LookupError(f"the plan runs {default_candidate(plan)}, not the entry's config")
    _poison(plan.out)
    _poison(plan.workspace)
    return plan.run(interpret), via


def compare(out: Any, ref: Any, dtype: str, absprod: Any, k: int) -> tuple[float, float, int, bool]:
    """(max |out - ref|, max |ref|, unwritten elements, within the bound everywhere) of an output
    against its float64 reference (numpy, or a torch tensor: compared on its device), by blocks of
    rows; NaN / the sentinel count as unwritten."""
    host = np.asarray(out.cpu() if hasattr(out, "cpu") else out)
    if host.shape != tuple(ref.shape):
        raise ValueError(f"the output is {host.shape}, the reference {tuple(ref.shape)}")
    on = (lambda a: a) if isinstance(ref, np.ndarray) else torch_block(ref.device)
    err_max = ref_max = 0.0
    unwritten, ok = 0, True
    for r in range(0, ref.shape[0], CHUNK_ROWS):
        part, want = on(host[r:r + CHUNK_ROWS]), ref[r:r + CHUNK_ROWS]
        missing = part == SENTINEL if "int" in str(host.dtype) else part.isnan() if hasattr(part, "isnan") \
            else np.isnan(part.astype(np.float32))
        unwritten += int(missing.sum())
        got = part.astype(np.float64) if isinstance(part, np.ndarray) else part.double()
        got[missing] = float("nan")
        err = abs(got - want)
        absp = absprod[r:r + CHUNK_ROWS] if absprod is not None else 0 * want
        ok &= bool((err <= bound(dtype, want, absp, k, str(host.dtype))).all())  # NaN never is
        finite = err[~missing]
        err_max = max(err_max, float(finite.max()) if finite.shape[0] else 0.0)
        ref_max = max(ref_max, float(abs(want).max()))
    return err_max, ref_max, unwritten, ok and unwritten == 0


def torch_block(device: Any) -> Callable[[np.ndarray], Any]:
    """A host block of an output as a torch tensor on ``device`` (bf16 and e4m3 by their bits)."""
    import torch

    def block(part: np.ndarray) -> Any:
        name = str(part.dtype)
        if name == "bfloat16":
            return torch.from_numpy(np.ascontiguousarray(part).view(np.int16)).to(device).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(part)).to(device)

    return block


def check_case(case: Case, tables: Tables, rng: np.random.Generator, weights: dict[tuple[str, int, int], Weight],
               interpret: bool = False, device: str | None = None) -> Row:
    """Run one case with poisoned outputs and compare it with float64. ``weights`` caches the
    weight of the last (dtype, M, K) (a test may place a corrupted one there); ``device``: where
    torch makes the operands, references and comparisons (None: numpy on the host)."""
    from sparsile.frontend.diagnostics import SparsileError

    start = time.perf_counter()
    row = Row(case)
    try:
        w = weights.get((case.dtype, case.m, case.k))
        if w is None:
            weights.clear()  # one weight at a time: the largest take gigabytes in float64
            w = weights[case.dtype, case.m, case.k] = make_weight(case.dtype, case.m, case.k, rng, device)
        b, bf = make_b(case.dtype, case.n, case.k, w.kp, rng, device if not isinstance(w.f64, np.ndarray) else None)
        made = time.perf_counter()
        if case.kind == "gemm":
            out, row.via = run_gemm(case, w, b, tables, interpret)
        elif case.kind == "linear":
            out, row.via = run_linear(case, w, b, interpret)
        else:
            out, row.via = run_decode(case, w, b, tables, interpret)
        ran = time.perf_counter()
        ref = reference(w.f64, bf)  # C (M, N); the layer's y (T, M) is its transpose (a view)
        absprod = reference(abs(w.f64), abs(bf)) if case.dtype == "e4m3" else None
        if case.kind != "gemm":
            ref, absprod = ref.T, (absprod.T if absprod is not None else None)
        row.max_err, row.max_ref, row.unwritten, row.ok = compare(out, ref, case.dtype, absprod, w.kp)
        row.phases = (made - start, ran - made, time.perf_counter() - ran)
    except (SparsileError, LookupError, ValueError) as e:  # a config that does not plan, compile or run
        row.note = str(e).split("\n", 1)[0]
    row.seconds = time.perf_counter() - start
    return row


def check_tables(tables: Tables, *, kinds: tuple[str, ...] = KINDS, skip: int = 0, entries: int | None = None,
                 max_seconds: float | None = None, interpret: bool = False, seed: int = 2026,
                 say: Callable[[str], None] = print, dtypes: tuple[str, ...] | None = None,
                 device: str | None = None) -> tuple[list[Row], list[str], int]:
    """Check the tables' cases of ``kinds`` (and ``dtypes``, None: all) in order after the first
    ``skip``: at most ``entries`` of them, none started after ``max_seconds``. Returns (rows, the
    invalid entries, how many cases after ``skip`` were left out). ``device``: where torch makes the
    operands, references and comparisons (:func:`operand_device`; None: numpy on the host)."""
    cases, bad = table_cases(tables)
    cases = [c for c in cases if c.kind in kinds and (dtypes is None or c.dtype in dtypes)][skip:]
    rng = np.random.default_rng(seed)
    weights: dict[tuple[str, int, int], Weight] = {}
    rows: list[Row] = []
    start = time.perf_counter()
    for case in cases[:entries]:
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
        rows.append(check_case(case, tables, rng, weights, interpret, device))
        say(format_row(rows[-1]))
    return rows, bad, len(cases) - len(rows)


HEADER = (f"{'kind':>6} {'dtype':>5} {'M':>6} {'N':>6} {'K':>6} {'config':<44} {'via':>8} {'max |err|':>10} "
          f"{'max |ref|':>10} {'unwritten':>9} {'make/run/check s':>16} result")


def format_row(row: Row) -> str:
    """One line of the summary table."""
    c = row.case
    phases = "/".join(f"{t:.1f}" for t in row.phases)
    line = (f"{c.kind:>6} {c.dtype:>5} {c.m:>6} {c.n:>6} {c.k:>6} {c.config!s:<44} {row.via:>8} "
            f"{row.max_err:>10.3e} {row.max_ref:>10.3e} {row.unwritten:>9} {phases:>16} {'ok' if row.ok else 'FAIL'}")
    return line + (f"  ({row.note})" if row.note else "")


def report(rows: list[Row], bad: list[str], left: int, skip: int = 0) -> int:
    """Print the summary table; the number of failures (a failed case or an invalid entry)."""
    print()
    print(HEADER)
    for row in rows:
        print(format_row(row))
    for name in bad:
        print(f"invalid table entry {name}: FAIL")
    failures = sum(not r.ok for r in rows) + len(bad)
    print(f"tuned configs: {len(rows) - sum(not r.ok for r in rows)} passed, {failures} failed"
          + (f", {skip} skipped" if skip else "")
          + (f", {left} not run (--entries / --max-seconds: go on with --skip {skip + len(rows)})" if left else "")
          + f", {sum(r.seconds for r in rows):.0f} s")
    return failures
