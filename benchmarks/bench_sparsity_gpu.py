"""The GPU sparsity toolkit (stdlib/kernels/sparsity_24.spk) against the host toolkit.

Target (issue 14): prune + compress + encode of a 57344 x 8192 bf16 weight on the H200 in <= 5 ms,
at >= 70 % of HBM bandwidth on the bytes read and written. For each shape the script times, with
CUDA events (mean of ``--repeats`` back-to-back calls after a warm-up that compiles the kernels):

* ``compress_gpu(w, dtype, fmt)`` (prune + compress + encode, one kernel): reads M·K elements,
  writes M·K/2 values and the metadata words; timed twice: back-to-back calls, and the same call
  replayed from a CUDA graph (the "kernel" column: GPU time without the Python side, which
  dominates the small shapes);
* ``decompress_gpu(values, meta)`` (validation kernel + decompression kernel);
* ``validate_metadata_gpu(meta)`` alone;
* ``prune_transposable_gpu(w)`` (the best transposable 2:4 pattern of every 4x4 block: reads and
  writes M·K elements; compute-bound: 90 patterns scored in f64 per block);

(``compress_gpu`` does not synchronize, so back-to-back calls overlap the Python work of one call
with the kernel of the previous one; ``validate_metadata_gpu`` and ``decompress_gpu`` read the
count of bad nibbles back, one synchronization per call; on the small shapes the Python side of a
call may dominate) and prints the time, the bandwidth on the bytes moved, its share of the H200's 4.8 TB/s, and the
host toolkit's ``compress(w, dtype, prune=True)`` + ``encode_metadata`` time on the same weight
(best of ``--host-repeats``). Every GPU result is checked bit for bit against the host's::

    python benchmarks/bench_sparsity_gpu.py                       # bf16, sm90, the default shapes
    python benchmarks/bench_sparsity_gpu.py --dtypes bf16 e4m3 --fmt tcgen05
    python benchmarks/bench_sparsity_gpu.py --shapes 57344x8192 --no-host
    python benchmarks/bench_sparsity_gpu.py --sweep --shapes 57344x8192   # program shapes of the fused kernel
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import event_time_us  # a sibling script, not a package

H200_BYTES_PER_S = 4.8e12
TARGET_SHAPE, TARGET_MS, TARGET_SHARE = (57344, 8192), 5.0, 0.70

SHAPES = {
    (57344, 8192): "Llama-3-70B gate+up (fused)",
    (28672, 8192): "Llama-3-70B gate / up",
    (8192, 28672): "Llama-3-70B down",
    (14336, 4096): "Llama-3-8B gate / up",
    (4096, 14336): "Llama-3-8B down",
    (4096, 4096): "Llama-3-8B q / o",
}


def _events_ms(fn, repeats: int) -> float:
    """Milliseconds per call between CUDA events, after one warm-up call (it compiles)."""
    return event_time_us(fn, repeats, warmup=1) / 1e3


def _graph_ms(fn, repeats: int) -> float:
    """The GPU time of one ``fn()`` without its Python side: ``fn`` captured once in a CUDA graph
    (sparsile launches follow torch's current stream, capture included) and the graph replayed
    ``repeats`` times between CUDA events. NaN when ``fn`` cannot be captured (it synchronizes)."""
    import torch

    fn()  # warm-up: compiles on the first call
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # any capture failure means "not measurable this way"
        return float("nan")
    return _events_ms(graph.replay, repeats)


def bench_shape(m: int, k: int, dtype: str, fmt: str, repeats: int, host_repeats: int) -> dict[str, float]:
    import torch

    from sparsile.stdlib import sparsity as S
    from sparsile.stdlib.kernels import sparsity_gpu as G

    op = S.operand_type(dtype)
    torch.manual_seed(0)
    dense = torch.randn(m, k, device="cuda")
    if dtype == "s8":
        w = (dense * 40).clamp(-127, 127).to(torch.int8)
    else:
        w = dense.to(getattr(torch, G._TORCH_DTYPES[dtype]))
    values, meta = G.compress_gpu(w, dtype, fmt)
    elem = op.host_dtype.itemsize
    meta_bytes = 4 * int(np.prod(meta.shape))
    row = {"compress_ms": _events_ms(lambda: G.compress_gpu(w, dtype, fmt), repeats),
           "kernel_ms": _graph_ms(lambda: G.compress_gpu(w, dtype, fmt), repeats)}
    row["compress_bytes"] = m * k * elem * 1.5 + meta_bytes
    row["decompress_ms"] = _events_ms(lambda: G.decompress_gpu(values, meta), repeats)
    row["decompress_bytes"] = m * k * elem * 1.5 + meta_bytes * 2
    row["validate_ms"] = _events_ms(lambda: G.validate_metadata_gpu(meta), repeats)
    row["validate_bytes"] = meta_bytes
    row["transposable_ms"] = _events_ms(lambda: G.prune_transposable_gpu(w), max(1, repeats // 4))
    host = S.as_host_array(w)
    ref_values, ref_indices = S.compress(host, dtype, prune=True)
    ref_meta = S.encode_metadata(ref_indices, fmt, dtype, k=k)
    got = S.as_host_array(values)
    row["identical"] = float(np.array_equal(np.ascontiguousarray(got).view(np.uint8), ref_values.view(np.uint8))
                             and np.array_equal(meta.to_host().data, ref_meta.data))
    if host_repeats:
        best = float("inf")
        for _ in range(host_repeats):
            t0 = time.perf_counter()
            _, indices = S.compress(host, dtype, prune=True)
            S.encode_metadata(indices, fmt, dtype, k=k)
            best = min(best, time.perf_counter() - t0)
        row["host_ms"] = best * 1e3
    return row


SWEEP = ((8, 32, 8), (4, 32, 4), (16, 32, 16), (32, 32, 32), (8, 32, 4), (16, 32, 8), (16, 16, 8), (32, 8, 8))
"""(WR, WC, num_warps) program shapes tried by --sweep (words per program: rows x columns). At least
one word row per warp (more warps than rows would repeat the work). With the interleaved "sm90"
words, word rows L and L + 8 hold the two halves (32 bytes each) of the same 64-byte run of every
weight row: WR = 8 gives a program one half of each run (its neighbour program the other), WR >= 16
both; (16, 16, 8) and (32, 8, 8) keep 8 chunks per thread with whole runs per program."""


def sweep(m: int, k: int, dtype: str, fmt: str, repeats: int) -> None:
    """Time compress_gpu for each program shape of SWEEP (checked bit for bit each time)."""
    import torch

    from sparsile.stdlib import sparsity as S
    from sparsile.stdlib.kernels import sparsity_gpu as G

    w = torch.randn(m, k, device="cuda").to(getattr(torch, G._TORCH_DTYPES[dtype]))
    elem = S.operand_type(dtype).host_dtype.itemsize
    ref = None
    default = (G.WR, G.WC, G.NUM_WARPS)
    try:
        for G.WR, G.WC, G.NUM_WARPS in SWEEP:
            values, meta = G.compress_gpu(w, dtype, fmt)
            got = (S.as_host_array(values).view(np.uint8), meta.to_host().data)
            ref = ref or got
            same = np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])
            ms = _events_ms(lambda: G.compress_gpu(w, dtype, fmt), repeats)
            moved = m * k * elem * 1.5 + 4 * int(np.prod(meta.shape))
            print(f"  WR={G.WR:<3} WC={G.WC:<3} num_warps={G.NUM_WARPS:<3} {ms:7.3f} ms {moved / ms / 1e6:7.0f} GB/s "
                  f"{100 * moved / (ms / 1e3) / H200_BYTES_PER_S:4.0f}%  {'same' if same else 'DIFFERENT'}")
    finally:
        G.WR, G.WC, G.NUM_WARPS = default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"])
    parser.add_argument("--fmt", default="sm90", choices=("sm90", "tcgen05"))
    parser.add_argument("--shapes", nargs="+", default=[f"{m}x{k}" for m, k in SHAPES])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--host-repeats", type=int, default=1)
    parser.add_argument("--no-host", action="store_true", help="skip the host toolkit timing")
    parser.add_argument("--sweep", action="store_true", help="time the fused kernel's program shapes instead")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_sparsity_gpu needs torch with CUDA")
        return 2
    if not torch.cuda.is_available():
        print("bench_sparsity_gpu needs a CUDA GPU")
        return 2
    if args.sweep:
        for dtype in args.dtypes:
            for text in args.shapes:
                m, k = (int(v) for v in text.lower().split("x"))
                print(f"sweep {text} {dtype} {args.fmt}:")
                sweep(m, k, dtype, args.fmt, args.repeats)
        return 0
    print(f"GPU: {torch.cuda.get_device_name()}; % of HBM = share of {H200_BYTES_PER_S / 1e12:.1f} TB/s on the bytes "
          f"read + written; metadata format {args.fmt}")
    print("compress: back-to-back calls (Python side included); kernel: the same call replayed from a CUDA "
          "graph (GPU time only), with its %HBM")
    head = (f"{'shape':>12} {'dtype':>5} {'what':<24} {'compress':>10} {'GB/s':>7} {'%HBM':>5} {'kernel':>10} "
            f"{'%HBM':>5} {'decompress':>10} {'GB/s':>7} {'validate':>9} {'transp.':>9} {'host':>9} {'speedup':>8} "
            f"{'bit-identical':>13}")
    print(head)
    ok = True
    for dtype in args.dtypes:
        for text in args.shapes:
            m, k = (int(v) for v in text.lower().split("x"))
            r = bench_shape(m, k, dtype, args.fmt, args.repeats, 0 if args.no_host else args.host_repeats)
            gbs = r["compress_bytes"] / r["compress_ms"] / 1e6
            share = r["compress_bytes"] / (r["compress_ms"] / 1e3) / H200_BYTES_PER_S
            dgbs = r["decompress_bytes"] / r["decompress_ms"] / 1e6
            host = f"{r['host_ms']:.0f} ms" if "host_ms" in r else "-"
            speed = f"{r['host_ms'] / r['compress_ms']:.0f}x" if "host_ms" in r else "-"
            kshare = r["compress_bytes"] / (r["kernel_ms"] / 1e3) / H200_BYTES_PER_S
            print(f"{text:>12} {dtype:>5} {SHAPES.get((m, k), ''):<24} {r['compress_ms']:>7.3f} ms {gbs:>7.0f} "
                  f"{100 * share:>4.0f}% {r['kernel_ms']:>7.3f} ms {100 * kshare:>4.0f}% {r['decompress_ms']:>7.3f} ms "
                  f"{dgbs:>7.0f} {r['validate_ms']:>6.3f} ms {r['transposable_ms']:>6.3f} ms {host:>9} {speed:>8} "
                  f"{'yes' if r['identical'] else 'NO':>13}")
            ok &= bool(r["identical"])
            if (m, k) == TARGET_SHAPE and dtype == "bf16":
                verdict = r["compress_ms"] <= TARGET_MS and share >= TARGET_SHARE
                print(f"  target {m}x{k} bf16: <= {TARGET_MS} ms and >= {100 * TARGET_SHARE:.0f}% of HBM: "
                      f"{'PASS' if verdict else 'FAIL'} ({r['compress_ms']:.3f} ms, {100 * share:.0f}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
