"""Plots of a ``bench_sparse_gemm.py --json FILE`` run: one PNG per layer shape (M x K), effective
TFLOP/s against T (= N, tokens) for sparsile (what sparse_matmul runs), cuSPARSELt with its default
and with its searched algorithm, and cuBLAS, one line style per dtype, so the crossover points show.
Prints the geometric means of sparsile's speed-up over cuSPARSELt (the faster of its two
algorithms) and over cuBLAS, per dtype and overall.

    python benchmarks/plot_gemm.py gemm.json --out plots/
    python benchmarks/plot_gemm.py gemm-8B.json gemm-70B.json --out plots/   # runs split by model

Needs matplotlib (the ``[viz]`` extra: ``pip install -e '.[viz]'`` in the checkout).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse_gemm import best_cslt, geomean, ours, speedups, tflops

# (label, the row's time in µs or None, colour)
CONTENDERS = (("sparsile", ours, "tab:red"), ("cuSPARSELt default", lambda r: r.get("cslt"), "tab:gray"),
              ("cuSPARSELt tuned", lambda r: r.get("cslt_tuned"), "tab:blue"),
              ("cuBLAS dense", lambda r: r.get("cublas"), "tab:green"))
STYLES = {"bf16": "-", "f16": "--", "e4m3": ":"}
ROW_FIELDS = ("dtype", "m", "n", "k", "sparsile")  # what every row of the JSON has


def shape_key(r: dict) -> str:
    """The file stem of a row's plot: ``8B-qkv_6144x4096`` for grid rows, ``M6144_K4096`` otherwise."""
    return f"{r['shape']}_{r['m']}x{r['k']}" if r.get("shape") else f"M{r['m']}_K{r['k']}"


def group_by_shape(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows by :func:`shape_key`, each group sorted by (dtype, T)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[shape_key(r)].append(r)
    return {key: sorted(g, key=lambda r: (r["dtype"], r["n"])) for key, g in groups.items()}


def summary(rows: list[dict]) -> list[str]:
    """Lines: per dtype and overall, the geometric mean and the minimum of sparsile's speed-up over
    cuSPARSELt (faster of default and tuned) and over cuBLAS, with the number of rows each covers."""
    lines = []
    for dtype in [*sorted({r["dtype"] for r in rows}), "all"]:
        sel = [r for r in rows if dtype in ("all", r["dtype"])]
        parts = []
        for key, label in (("vs_cslt", "vs cuSPARSELt (faster of default, tuned)"), ("vs_cublas", "vs cuBLAS")):
            values = [v for v in (speedups(r)[key] for r in sel) if v]
            if values:
                parts.append(f"{label}: geomean {geomean(values):.2f}x, min {min(values):.2f}x "
                             f"over {len(values)}/{len(sel)} rows")
            else:
                parts.append(f"{label}: not measured")
        lines.append(f"{dtype:>4}: " + "; ".join(parts))
    return lines


def import_pyplot():
    """matplotlib.pyplot on the Agg backend, or exit with how to install it."""
    try:
        import matplotlib
    except ImportError:
        from sparsile.install_hints import install_hint
        from sparsile.stdlib.viz import MATPLOTLIB_REQUIREMENT

        sys.exit(f"plot_gemm.py needs matplotlib: {install_hint('viz', MATPLOTLIB_REQUIREMENT)}")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_shape(plt, key: str, rows: list[dict], out: Path) -> Path:
    """One PNG: TFLOP/s against T (both axes log scale) for each contender and dtype of ``rows``."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for dtype in sorted({r["dtype"] for r in rows}):
        sel = [r for r in rows if r["dtype"] == dtype]
        for label, time_of, colour in CONTENDERS:
            points = [(r["n"], tflops(r, time_of(r))) for r in sel]
            points = [(t, f) for t, f in points if f]
            if points:
                ax.plot(*zip(*points, strict=True), STYLES.get(dtype, "-."), color=colour, marker="o", markersize=3,
                        label=f"{label} ({dtype})")
    r0 = rows[0]
    ax.set_xscale("log", base=2)  # T from 1 to 8192
    ticks = sorted({r["n"] for r in rows})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_yscale("log")  # decode (a few TFLOP/s) and prefill (hundreds) on one plot
    ax.set_xlabel("T (tokens, N)")
    ax.set_ylabel("effective TFLOP/s (2MNK / t), log scale")
    ax.set_title(f"{r0.get('shape') or 'GEMM'}: M = {r0['m']}, K = {r0['k']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    path = out / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path, nargs="+", help="the file(s) bench_sparse_gemm.py --json wrote (rows joined)")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for the PNGs (created)")
    return ap.parse_args(argv)


def load_rows(path: Path) -> list[dict]:
    """The ``rows`` of a bench_sparse_gemm.py JSON file; exits with a message on a bad file."""
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{path}: not a bench_sparse_gemm.py --json file ({type(e).__name__}: {e})")
    for i, r in enumerate(rows):
        lacking = [f for f in ROW_FIELDS if not isinstance(r, dict) or f not in r]
        if lacking:
            sys.exit(f"{path}: row {i} lacks {', '.join(lacking)} (not a bench_sparse_gemm.py --json file?)")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = [r for path in args.json for r in load_rows(path)]
    if not rows:
        print(f"{' '.join(map(str, args.json))}: no rows", file=sys.stderr)
        return 1
    plt = import_pyplot()
    args.out.mkdir(parents=True, exist_ok=True)
    for key, group in group_by_shape(rows).items():
        print(f"wrote {plot_shape(plt, key, group, args.out)}")
    missing = sum(1 for r in rows if best_cslt(r) is None)
    print("sparsile speed-up (time of the other / time of sparse_matmul's kernel):")
    print("\n".join(summary(rows)))
    if missing:
        print(f"({missing} rows without a cuSPARSELt time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
