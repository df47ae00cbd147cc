"""Programmatic dependent launch for the decode kernel (issue 13, item 3) on the GPU: consecutive
decode calls replayed from a CUDA graph, with and without ``pdl=True``, against dense
``F.linear``, at Llama-3 8B and 70B layer shapes.

    python benchmarks/bench_pdl.py                       # bf16, 8 shapes, T 1 16 64
    python benchmarks/bench_pdl.py --shapes 8B:qkv 70B:o --tokens 16

Each case rotates over copies of the weight (3x the 50 MB L2 in all), so every call streams its
weight from HBM as a model's layers do. Two arrangements:

* "back to back": the graph holds only the layer's calls (the decode kernel follows itself: with
  PDL the next call streams its first ring of weight boxes while the previous one finishes);
* "after a kernel": each call follows a copy kernel that writes its x (``x.copy_``), as a layer
  follows the norm or activation that produced its input; the copy is timed alone and subtracted.

µs per call = one graph replay / calls. HBM % = the bytes a call must move (values N·K/2, metadata
N·K/8 for 16-bit types, x and y; dense: the whole weight) over its time, of 4.8 TB/s. Every PDL
result is checked bit for bit against the plain launch's before it is timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # (N_out, K)
    "8B:qkv": (6144, 4096), "8B:o": (4096, 4096), "8B:gate_up": (28672, 4096), "8B:down": (4096, 14336),
    "70B:qkv": (10240, 8192), "70B:o": (8192, 8192), "70B:gate_up": (57344, 8192), "70B:down": (8192, 28672),
}
HBM = 4.8e12


class Calls:
    """``run(stream=)``: the next of ``calls`` (a rotation over weight copies), each optionally
    after ``before()`` (the copy kernel that writes x)."""

    def __init__(self, calls: list, before=None):
        self.items, self.before, self.next = calls, before, 0
        self.calls = len(calls) * max(1, 12 // len(calls))

    def __call__(self, stream=None):
        if self.before is not None:
            self.before()
        item = self.items[self.next % len(self.items)]
        self.next += 1
        return item.run(stream=stream) if hasattr(item, "run") else item(stream=stream)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--max-seconds", type=float, default=240.0)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT.parent))
    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.decode_tuning import weight_copies
    from sparsile.stdlib.kernels.graph_timing import graph_bench
    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu

    if not torch.cuda.is_available():
        sys.exit("bench_pdl.py needs a CUDA GPU")
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"gpu {torch.cuda.get_device_name()} | torch {torch.__version__} | {now}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    start = time.time()
    bench = lambda run: graph_bench(run, warmup=args.warmup, rep=args.rep) * 1e3  # noqa: E731
    for name in args.shapes:
        n, k = SHAPES[name]
        dense_w = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
        values, meta = compress_gpu(dense_w.float(), "bf16", "sm90")
        meta = meta.data
        extra = max(0, min(7, -(-150 * 2**20 // dense_w.nbytes) - 1))  # 3x the L2 in all
        dense_copies = [dense_w] + [dense_w.clone() for _ in range(extra)]
        for t in args.tokens:
            if time.time() - start > args.max_seconds:
                print(f"stopped before {name} T={t} (--max-seconds)")
                break
            x = torch.randn(t, k, device="cuda", generator=gen).to(torch.bfloat16)
            x_src = x.clone()
            y = torch.full((t, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            plain = plan_sparse_decode(values, meta, x, out=y)
            copies = weight_copies(plain)
            plans = {p: [dataclasses.replace(plain, pdl=p)] + [dataclasses.replace(plain, values=v, meta=m, pdl=p)
                                                                for v, m in copies] for p in (False, True)}
            plans[False][0].run()
            ref = y.clone()
            y.fill_(float("nan"))
            plans[True][0].run()
            torch.cuda.synchronize()
            same = bool(torch.equal(y, ref))
            need = n * k // 2 * 2 + n * k // 8 + t * k * 2 + t * n * 2
            dense_need = n * k * 2 + t * k * 2 + t * n * 2
            dense_calls = [lambda stream=None, w=w, x=x: F.linear(x, w) for w in dense_copies]
            copy = lambda x=x, x_src=x_src: x.copy_(x_src)  # noqa: E731
            r = {"shape": name, "t": t, "config": str(plain.config), "bit_equal": same}
            r["dense"] = bench(Calls(dense_calls))
            r["plain"] = bench(Calls(plans[False]))
            r["pdl"] = bench(Calls(plans[True])) if same else float("nan")
            r["copy"] = bench(Calls([lambda stream=None: None], copy))
            r["dense_after"] = bench(Calls(dense_calls, copy)) - r["copy"]
            r["plain_after"] = bench(Calls(plans[False], copy)) - r["copy"]
            r["pdl_after"] = bench(Calls(plans[True], copy)) - r["copy"] if same else float("nan")
            r["hbm_plain"], r["hbm_pdl"] = (need / (r[v] * 1e-6) / HBM * 100 for v in ("plain", "pdl"))
            r["hbm_dense"] = dense_need / (r["dense"] * 1e-6) / HBM * 100
            rows.append(r)
            print(f"{name} T={t}: dense {r['dense']:.2f} plain {r['plain']:.2f} pdl {r['pdl']:.2f} µs "
                  f"(after a kernel: {r['dense_after']:.2f} / {r['plain_after']:.2f} / {r['pdl_after']:.2f})"
                  f"{'' if same else '  PDL RESULT DIFFERS'}", flush=True)
    print()
    print("| shape | N×K | T | config | dense µs | plain µs | PDL µs | PDL gain | HBM % dense / plain / PDL | "
          "dense/PDL | after a kernel: dense / plain / PDL µs | dense/PDL after | PDL = plain bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n, k = SHAPES[r["shape"]]
        print(f"| {r['shape']} | {n}×{k} | {r['t']} | {r['config'].replace('DecodeConfig', '')} | {r['dense']:.2f} | "
              f"{r['plain']:.2f} | {r['pdl']:.2f} | {r['plain'] / r['pdl']:.2f}x | {r['hbm_dense']:.0f} / "
              f"{r['hbm_plain']:.0f} / {r['hbm_pdl']:.0f} | {r['dense'] / r['pdl']:.2f}x | {r['dense_after']:.2f} / "
              f"{r['plain_after']:.2f} / {r['pdl_after']:.2f} | {r['dense_after'] / r['pdl_after']:.2f}x | "
              f"{'yes' if r['bit_equal'] else 'NO'} |")
    print("\nµs per call from one CUDA-graph replay of 12+ calls over weight copies (HBM-cold); 'after a kernel': "
          "each call follows x.copy_ (its time, measured alone, subtracted).")
    if any(not r["bit_equal"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
