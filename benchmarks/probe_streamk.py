"""Why the stream-K sparse GEMM (stdlib/kernels/sparse_gemm_sm90_streamk.spk) is slower than the
table's kernel: the kernel at several grid sizes, beside two variants that take its parts away.

    python benchmarks/probe_streamk.py [--shapes 8192x512x8192 8192x256x8192]
    ncu --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,\\
        lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed \\
        python benchmarks/probe_streamk.py --ncu

Per bf16 problem (BN 256, STAGES 5, GROUP_M 16), kernel µs from the CUDA profiler and the error
against float64 (C poisoned first):

  table        sparse_matmul as called (the shipped table's choice)
  plain        the _mt kernel, one CTA per tile
  stream-K     the stream-K kernel on P CTAs: the SM count, the tile count (one whole tile each),
               twice the tile count where it fits (half a tile each, at K = 0 or K / 2), and
               120, 100, 66 (runs that cross tiles at other K steps)
  no fix-up    its shared tiles stored as they are instead of added (wrong sums: timing only)
  no sum       the parts stored, fenced and counted, but not added (wrong sums: timing only)

The variants are the kernel's source with one line changed, loaded from text beside it (no file is
written). ``--ncu`` runs each launch once inside a profiler range instead of timing it.
Measured on the H200: benchmarks/RESULTS.md, twenty-fourth session.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse_gemm import profile_kernel_time, pruned_operands

FIX_UP = ("            fix_up(acc, C, W, Count, t, first // per_tile, per_tile, units, m0, n0, M, N, ldc, BM, BN)",
          "            store(C + rows[:, None] * ldc + cols[None, :], acc, mask=(rows[:, None] < M) & "
          "(cols[None, :] < N))")
SUM = ("    if arrived == c1 - c0:", "    if arrived < 0:")


def variants() -> dict[str, object]:
    """The kernel's module with its fix-up replaced by a plain store, and without the sum."""
    import sparsile as sp
    from sparsile.stdlib.kernels.gemm_streamk import STREAMK_FILE

    source = STREAMK_FILE.read_text(encoding="utf-8")
    out = {}
    for name, (old, new) in (("no fix-up", FIX_UP), ("no sum", SUM)):
        if old not in source:
            raise SystemExit(f"the kernel's source changed: cannot make the {name} variant")
        out[name] = sp.loads(source.replace(old, new), name, path=STREAMK_FILE.parent / f"_{name}.spk")
    return out


def probe(m: int, n: int, k: int, ncu: bool) -> None:
    import torch

    from sparsile.stdlib.kernels.gemm import BM, plan_sparse_matmul, sparse_matmul
    from sparsile.stdlib.kernels.gemm_config import GemmConfig
    from sparsile.stdlib.kernels.tuning import launch, with_config

    o = pruned_operands("bf16", m, n, k, seed=0)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    base = plan_sparse_matmul(o["values"], o["meta"], o["b"], out=c, target="sm_90a", kernel="gemm")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = -(-m // BM) * -(-n // 256)
    rows = [("table", lambda: sparse_matmul(o["values"], o["meta"], o["b"], out=c))]
    plain = GemmConfig(256, 5, group_m=16)
    one_per_tile = with_config(base, plain, sms)
    rows.append(("plain", lambda: launch(one_per_tile, plain)))
    streamk = GemmConfig(256, 5, group_m=16, streamk=True)
    mods = variants()
    grids = {sms, tiles, 120, 100, 66} | ({2 * tiles} if 2 * tiles <= sms else set())
    for ctas in sorted(grids, reverse=True):
        planned = with_config(base, streamk, ctas)
        rows.append((f"stream-K P={planned.ctas}", lambda p=planned: launch(p, streamk)))
        for name, mod in mods.items():  # each on counters of its own ("no sum" never re-zeroes them)
            own = with_config(base, streamk, ctas)
            kern = getattr(mod, f"{own.plan.choice.kernel}_streamk")
            rows.append((f"  {name} P={own.ctas}",
                         lambda p=own, kern=kern: kern[p.grid](*p.arguments(), BN=256, STAGES=5, GROUP_M=16)))
    print(f"bf16 {m}x{n}x{k}: {tiles} tiles of 128 x 256, {sms} SMs", flush=True)
    for name, fn in rows:
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        err = ((c.float() - o["ref"]).abs().max() / o["scale"]).item()
        if ncu:
            torch.cuda.cudart().cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"  {name:<22} err {err:.1e}", flush=True)
        else:
            print(f"  {name:<22} {profile_kernel_time(fn, 20):8.1f} µs  err {err:.1e}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["8192x512x8192", "8192x256x8192"], help="MxNxK, bf16")
    ap.add_argument("--ncu", action="store_true", help="one launch each in a profiler range, untimed")
    args = ap.parse_args(argv)
    for shape in args.shapes:
        m, n, k = (int(v) for v in shape.split("x"))
        probe(m, n, k, args.ncu)


if __name__ == "__main__":
    main()
