"""The stream-K decode kernel against the decode table's choice, timed as the tuner times them.

    python benchmarks/bench_decode_streamk.py --shapes 28672x4096 10240x8192 --tokens 64 16 --dtype bf16

For each weight (N_out x K) and token count: the plan ``plan_sparse_decode`` makes (the shipped
table's entry, else the heuristic), then the stream-K kernel at that plan's row slab and at each ring
depth that fits, each timed as ``tune_decode.py`` times candidates (replays of a CUDA graph of ten
calls rotating over copies of the weight of 3 x L2, so the weight comes from HBM) and each output
(poisoned first) checked against the table plan's. Prints one line per candidate: µs, the
effective bandwidth on the compressed weight's bytes, and the stream-K grid.
"""

from __future__ import annotations

import argparse
import dataclasses


def main(argv: list[str] | None = None) -> int:
    import torch

    from sparsile.stdlib.kernels.decode import plan_sparse_decode
    from sparsile.stdlib.kernels.decode_tuning import (
        Rotation,
        _poison,
        candidate_space,
        covering_every_slab,
        default_candidate,
        graph_bench,
        weight_copies,
        with_candidate,
    )
    from sparsile.stdlib.kernels.gemm import KERNELS
    from sparsile.stdlib.kernels.sparsity_gpu import compress_gpu
    from sparsile.stdlib.kernels.tuning import f32_copy, matches_reference, reference_tolerance

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--shapes", nargs="+", default=["28672x4096", "10240x8192", "6144x4096", "57344x8192"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[64, 16])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "e4m3"])
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'weight':>12} {'T':>3} {'candidate':<44} {'us':>8} {'TB/s':>6} {'grid':>5}  check")
    for shape in args.shapes:
        m, k = (int(v) for v in shape.split("x"))
        values, meta = compress_gpu(torch.randn(m, k, device="cuda", generator=gen), args.dtype, "sm90")
        for t in args.tokens:
            x = torch.randn(t, k, device="cuda", generator=gen).to(getattr(torch, KERNELS[args.dtype].torch_dtype))
            plan = plan_sparse_decode(values, meta.data, x)
            default = default_candidate(plan)
            base = covering_every_slab(plan)
            copies = weight_copies(base)
            _poison(base.out)
            ref = f32_copy(base.run())
            tol = reference_tolerance(ref)
            b = base.base
            streamk = [c for c in candidate_space(m, base.k_padded, t, b.choice.elem_bytes, sms)
                       if c.streamk and c.bm == default.bm]
            weight_bytes = int(values.nbytes) + int(meta.data.nbytes)
            for cand in [default, *streamk]:
                p = base if cand == default else with_candidate(base, cand, sms)
                _poison(p.out)
                ok = matches_reference(p.run(), ref, tol)
                run = Rotation([p] + [dataclasses.replace(p, values=v, meta=w) for v, w in copies], cand)
                us = graph_bench(run, warmup=5, rep=20) * 1e3
                label = ("table: " if cand == default else "") + str(cand)
                print(f"{shape:>12} {t:>3} {label:<44} {us:8.2f} {weight_bytes / us / 1e6:6.2f} "
                      f"{p.grid[0]:>5}  {'ok' if ok else 'WRONG'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
