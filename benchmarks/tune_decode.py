"""Tune the decode kernel of ``sparse_linear`` (T <= 64 tokens) on this GPU and write its table.

    python benchmarks/tune_decode.py -o stdlib/kernels/tuned/decode-h200.json       # Llama-3-8B, ~2 min
    python benchmarks/tune_decode.py --shapes 4096x4096 --tokens 16 --max-seconds 30 -o /tmp/decode.json

For each shape (N_out x K), dtype and token tile (BN: T rounded up to a power of two from 8; the
largest ``--tokens`` value of each tile is timed) every candidate of
``stdlib/kernels/decode_tuning.py``'s ``candidate_space`` (split-K, STAGES, split-K reduction) is
timed with CUDA events, its output checked against the heuristic default's, and the fastest kept.
Prints shape, T, the default's and the best time, the best config and the speedup; ``-o`` writes the
table (``sparsile-sparse-decode-table/1``), which ``plan_sparse_decode`` reads from
``$SPARSILE_DECODE_TABLE`` or ``stdlib/kernels/tuned/decode-<gpu>.json`` (docs/autotune.md).
``--max-seconds``: no new problem starts after that long (the table lists those left out).
"""

from __future__ import annotations

import argparse
import sys

LLAMA3_8B = ("4096x4096", "1024x4096", "14336x4096", "4096x14336", "6144x4096", "28672x4096")
"""Llama-3-8B's projections as transformers builds them (q / o, k / v, gate / up, down), then the fused
qkv and gate_up of benchmarks/bench_linear.py."""


def main(argv: list[str] | None = None) -> int:
    """Parse the options, tune, print the table; 0, 2 on a bad option, 3 without a GPU."""
    from sparsile.frontend.diagnostics import SparsileError
    from sparsile.stdlib.kernels.decode_tuning import check_sweep_inputs, tune_sparse_decode

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--shapes", nargs="+", default=list(LLAMA3_8B), help="N_out x K (default: Llama-3-8B)")
    ap.add_argument("--tokens", nargs="+", type=int, default=[16, 1, 4, 8, 32, 64],
                    help="token counts; their tiles are tuned in this order (default: batch 16 and 1 first)")
    ap.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "f16", "e4m3"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=150.0)
    ap.add_argument("--no-graph", action="store_true",
                    help="time the plain launches (default: replays of a CUDA graph of ten calls)")
    ap.add_argument("-o", "--out", help="write (merge into) this JSON table")
    ap.add_argument("-v", "--verbose", action="store_true", help="a line per problem while tuning")
    ap.add_argument("--device", type=int, default=None,
                    help="the GPU to tune on (default: sparsile's current one, cuda:0 unless use_device chose another)")
    args = ap.parse_args(argv)
    from sparsile.backend import runtime

    try:
        check_sweep_inputs(args.shapes, args.tokens, args.dtype)
        if not runtime.has_gpu():
            print("tune_decode.py: no GPU here (the sweep times the decode kernel on the current GPU)",
                  file=sys.stderr)
            return 3
        table = tune_sparse_decode(args.shapes, args.tokens, dtypes=args.dtype, warmup=args.warmup, rep=args.rep,
                                   max_seconds=args.max_seconds, out=args.out, device=args.device,
                                   **({"benchmarker": None} if args.no_graph else {}),
                                   say=(lambda text: print(text, file=sys.stderr, flush=True)) if args.verbose
                                   else (lambda text: None))
    except SparsileError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"{table['gpu']} ({table['sms']} SMs), {table['seconds']} s")
    print(f"{'key':44} {'T':>3} {'default us':>10} {'best us':>8}  {'best config':34} speedup  (default config)")
    for key, e in table["entries"].items():
        best = " ".join(f"{k}={v}" for k, v in e["config"].items())
        default = " ".join(f"{k}={v}" for k, v in e["default"].items())
        print(f"{key:44} {e['tokens']:>3} {e['default_us']:>10.2f} {e['us']:>8.2f}  {best:34} "
              f"{e['default_us'] / e['us']:6.2f}x  ({default}; {len(e['skipped'])} skipped)")
    if table["left_out"]:
        print(f"left out after --max-seconds {args.max_seconds}: {', '.join(table['left_out'])}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
