"""Where a decode step of the Llama-3-8B-shaped model spends its GPU time: the kernels of a few
decode steps (``bench_llama``'s Decoder, one CUDA graph per step, or eager) under torch.profiler,
summed by kernel name per step, for dense and the sparse models side by side.

    python benchmarks/profile_llama_step.py --layers 32 --batches 1 16 --models dense sparsile-fused

Prints, per batch: the wall time of a step, the kernel time summed per step, the number of kernels
per step, and the kernels that take the most time per step in any model (name shortened), so the
part of a step that sparse projections cannot shorten is visible.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_llama  # a sibling script, not a package
from torch_timing import positive


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=positive, default=32)
    ap.add_argument("--batches", nargs="+", type=positive, default=[1, 16])
    ap.add_argument("--models", nargs="+", choices=bench_llama.MODELS, default=["dense", "sparsile-fused"])
    ap.add_argument("--attention", choices=bench_llama.ATTENTIONS, default="sdpa-gqa",
                    help="as bench_llama's (sdpa: transformers' own)")
    ap.add_argument("--mode", choices=("graph", "eager"), default="graph")
    ap.add_argument("--prompt", type=positive, default=128)
    ap.add_argument("--steps", type=positive, default=8, help="decode steps profiled")
    ap.add_argument("--top", type=positive, default=25, help="kernel names listed")
    ap.add_argument("--ops", action="store_true",
                    help="also profile eager steps with their torch ops and input shapes (GPU time by op)")
    return ap.parse_args(argv)


def short(name: str, width: int = 70) -> str:
    name = name.replace("void ", "").split("(")[0]
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_steps(decoder: Any, steps: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(wall ms per step, {kernel name: (µs per step, launches per step)}) over ``steps`` decode steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        decoder.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        decoder.step()
    torch.cuda.synchronize()
    wall_ms = 1e3 * (time.perf_counter() - t) / steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            decoder.step()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            k = kernels[short(ev.name)]
            k[0] += ev.device_time / steps
            k[1] += 1 / steps
    return wall_ms, {name: (us, round(n)) for name, (us, n) in kernels.items()}


def print_ops(model: Any, name: str, batch: int, prompt: Any, args: argparse.Namespace) -> None:
    """torch.profiler's table of the torch ops of ``args.steps`` eager decode steps by GPU time, with
    their input shapes: which op of the model a kernel of the step belongs to."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    decoder = bench_llama.Decoder(model, batch, args.prompt + 2 * args.steps + 8, "eager")
    decoder.prepare(prompt)
    decoder.prefill(prompt)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(args.steps):
            decoder.step()
        torch.cuda.synchronize()
    print(f"\n{name}, batch {batch}: torch ops of {args.steps} eager decode steps by GPU time")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_device_time_total", row_limit=args.top,
                                                             max_name_column_width=40, max_shapes_column_width=70))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = bench_llama.requirements_missing()
    if missing is not None:
        print(f"profile_llama_step needs an NVIDIA GPU, torch, transformers and sparsile.torch: {missing}",
              file=sys.stderr)
        return 3  # (the sparsile CLI's exit status for what this machine or installation lacks)
    import torch

    config = bench_llama.llama3_config(args.layers, args.attention)
    bench_args = argparse.Namespace(layers=args.layers, models=args.models)
    with torch.no_grad():
        models = bench_llama.build_models(bench_args, config)
    with torch.inference_mode():
        for batch in args.batches:
            g = torch.Generator(device="cuda").manual_seed(batch)
            prompt = torch.randint(0, config.vocab_size, (batch, args.prompt), device="cuda", generator=g)
            results = {}
            for name in args.models:
                if name not in models:
                    continue
                decoder = bench_llama.Decoder(models[name], batch, args.prompt + 3 * args.steps + 8, args.mode)
                decoder.prepare(prompt)
                decoder.prefill(prompt)
                results[name] = profile_steps(decoder, args.steps)
                if args.ops:
                    print_ops(models[name], name, batch, prompt, args)
                del decoder
                torch.cuda.empty_cache()
            print(f"\n### batch {batch}, {args.mode} decode steps ({args.layers} layers)\n")
            names = list(results)
            print("| | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 1) + "|")
            print("| wall ms / step | " + " | ".join(f"{results[n][0]:.3f}" for n in names) + " |")
            print("| kernel ms / step | " + " | ".join(f"{sum(u for u, _ in results[n][1].values()) / 1e3:.3f}"
                                                     for n in names) + " |")
            print("| kernels / step | " + " | ".join(f"{sum(c for _, c in results[n][1].values())}" for n in names)
                  + " |")
            every = {k for n in names for k in results[n][1]}
            ranked = sorted(every, key=lambda k: -max(results[n][1].get(k, (0.0, 0))[0] for n in names))
            print("\n| kernel (µs per step, launches) | " + " | ".join(names) + " |")
            print("|---" * (len(names) + 1) + "|")
            for k in ranked[: args.top]:
                cells = [results[n][1].get(k) for n in names]
                print(f"| `{k}` | " + " | ".join(f"{c[0]:.1f} ({c[1]})" if c else "-" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
