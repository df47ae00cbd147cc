"""Memory-bound kernels on the GPU: GB/s of vector add and row softmax at large sizes, next to torch
in the same run, and the host overhead of a launch from Python.

    python benchmarks/bench_elementwise.py [--quick] [--iters 50] [--block 1024] [--no-overhead]

Needs an NVIDIA GPU and torch (the comparison and the device arrays; our kernels get the torch
tensors in place). Kernel times are CUDA-event times over --iters back-to-back launches after a
warm-up, so at these sizes they are memory time; GB/s counts the bytes a kernel must move (vector
add: read x and y, write out; softmax: read x, write out), the same for both contenders.

Launch overhead (host µs per launch of a tiny kernel, measured as the wall time of many launches
followed by one synchronize):
  driver        ``cuLaunchKernel`` with prebuilt parameters (``backend.runtime.measure_launch_overhead``)
  launcher      our Launcher with raw addresses / DeviceBuffers / torch tensors (same function)
  kernel[grid]  a ``@jit`` kernel called as users do: argument binding, specialization lookup, launch
  torch         ``torch.add(x, y, out=out)`` on 1 element
  triton        a Triton add kernel ``kernel[(1,)](...)``, when triton is importable
Targets (issue 3): at least 0.85x torch's GB/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import event_time_us  # a sibling script, not a package

ROOT = Path(__file__).resolve().parents[1]

VECTOR_SIZES = (1 << 20, 1 << 24, 1 << 26, 1 << 28)  # f32 elements; 2^28 = 1 GiB per array
QUICK_VECTOR_SIZES = (1 << 20, 1 << 24)
LARGE_BYTES = 64 << 20  # "large sizes" (issue 3): rows moving at least this much memory
SOFTMAX_SHAPES = ((65536, 512), (32768, 1024), (16384, 2048), (8192, 4096), (4096, 8192))  # (rows, cols) f32
QUICK_SOFTMAX_SHAPES = ((32768, 1024), (8192, 4096))
TARGET_RATIO = 0.85


@dataclass(frozen=True)
class SoftmaxConfig:
    """Launch parameters of examples/softmax.spk for one row length: BLOCK covers a whole row (the
    kernel's rule), ROWS rows per program keep a tile near 4096 elements, warps grow past that."""

    block: int
    rows: int
    num_warps: int

    def grid(self, n_rows: int) -> tuple[int]:
        return (-(-n_rows // self.rows),)


def softmax_config(n_cols: int) -> SoftmaxConfig:
    block = 16
    while block < n_cols:
        block *= 2
    rows = max(1, min(16, 4096 // block))
    num_warps = min(16, max(4, block * rows // 1024))
    return SoftmaxConfig(block, rows, num_warps)


def gbps(nbytes: int, micros: float) -> float:
    """Bytes per microsecond to GB/s (10^9 bytes per second)."""
    return nbytes / micros / 1e3


def vector_add_bytes(n: int) -> int:
    return 3 * 4 * n


def softmax_bytes(rows: int, cols: int) -> int:
    return 2 * 4 * rows * cols


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="GB/s of vector add and softmax next to torch; launch overhead")
    ap.add_argument("--quick", action="store_true", help="two sizes of each kernel")
    ap.add_argument("--iters", type=int, default=50, help="timed launches per measurement")
    ap.add_argument("--block", type=int, default=1024, help="BLOCK of the vector add kernel (a power of two)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="vector add sizes (elements)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the launch overhead measurements")
    ap.add_argument("--overhead-launches", type=int, default=2000, help="launches per overhead measurement")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.overhead_launches < 1:
        ap.error("--iters and --overhead-launches must be positive")
    if args.block < 16 or args.block & (args.block - 1):
        ap.error("--block must be a power of two >= 16")
    if args.sizes is not None and any(s < 1 for s in args.sizes):
        ap.error("--sizes must be positive")
    return args


def vector_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    if args.sizes:
        return tuple(args.sizes)
    return QUICK_VECTOR_SIZES if args.quick else VECTOR_SIZES


def softmax_shapes(args: argparse.Namespace) -> tuple[tuple[int, int], ...]:
    return QUICK_SOFTMAX_SHAPES if args.quick else SOFTMAX_SHAPES


# ------------------------------------------------------------------------------------------------
# timing (GPU)


def device_time_us(fn: Callable[[], Any], iters: int) -> float:
    """Mean CUDA-event time per call of ``fn`` over ``iters`` back-to-back calls, after 5 warm-up calls."""
    return event_time_us(fn, iters, warmup=5)


def host_time_us(fn: Callable[[], Any], launches: int) -> float:
    """Host wall time per call of ``fn`` over ``launches`` calls and one final synchronize."""
    import torch

    for _ in range(min(launches, 100)):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(launches):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / launches * 1e6


# ------------------------------------------------------------------------------------------------
# the measurements


@dataclass(frozen=True)
class Row:
    kernel: str
    size: str
    nbytes: int
    ours_us: float
    torch_us: float
    max_err: float

    @property
    def ratio(self) -> float:
        return self.torch_us / self.ours_us


def bench_vector_add(module: Any, sizes: tuple[int, ...], block: int, iters: int) -> list[Row]:
    import torch

    rows = []
    for n in sizes:
        x = torch.randn(n, device="cuda")
        y = torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        ref = torch.empty_like(x)
        launch = module.vector_add[(-(-n // block),)]

        def ours(x=x, y=y, out=out, n=n, launch=launch) -> None:
            launch(x, y, out, n, BLOCK=block)

        ours_us = device_time_us(ours, iters)
        torch_us = device_time_us(lambda x=x, y=y, ref=ref: torch.add(x, y, out=ref), iters)
        err = (out - (x + y)).abs().max().item()
        rows.append(Row("vector_add", f"{n}", vector_add_bytes(n), ours_us, torch_us, err))
        del x, y, out, ref
    return rows


def bench_softmax(module: Any, shapes: tuple[tuple[int, int], ...], iters: int) -> list[Row]:
    import torch

    rows = []
    for n_rows, n_cols in shapes:
        cfg = softmax_config(n_cols)
        x = torch.randn(n_rows, n_cols, device="cuda")
        out = torch.empty_like(x)
        launch = module.softmax[cfg.grid(n_rows)]

        def ours(x=x, out=out, n_rows=n_rows, n_cols=n_cols, launch=launch, cfg=cfg) -> None:
            launch(x, out, n_rows, n_cols, n_cols, BLOCK=cfg.block, ROWS=cfg.rows, num_warps=cfg.num_warps)

        ours_us = device_time_us(ours, iters)
        torch_us = device_time_us(lambda x=x: torch.softmax(x, dim=1), iters)
        err = (out - torch.softmax(x, dim=1)).abs().max().item()
        size = f"{n_rows}x{n_cols} (BLOCK {cfg.block}, ROWS {cfg.rows}, {cfg.num_warps} warps)"
        rows.append(Row("softmax", size, softmax_bytes(n_rows, n_cols), ours_us, torch_us, err))
        del x, out
    return rows


def launch_overheads(module: Any, launches: int) -> dict[str, float | None]:
    """Host µs per launch of a one-element kernel, ours at every level and the others'."""
    import torch

    from sparsile.backend.runtime import measure_launch_overhead

    base = measure_launch_overhead(launches)
    x, y, out = (torch.zeros(1, device="cuda") for _ in range(3))
    ours = module.vector_add[(1,)]
    result: dict[str, float | None] = {
        "driver": base.driver_us,
        "launcher (raw addresses)": base.launcher_int_us,
        "launcher (DeviceBuffers)": base.launcher_buffer_us,
        "launcher (torch tensors)": base.launcher_torch_us,
        "kernel[grid] (torch tensors)": host_time_us(lambda: ours(x, y, out, 1, BLOCK=128), launches),
        "torch.add (1 element)": host_time_us(lambda: torch.add(x, y, out=out), launches),
    }
    add = triton_add_kernel()
    result["triton kernel[grid]"] = (host_time_us(lambda: add[(1,)](x, y, out, 1, BLOCK=128), launches)
                                     if add is not None else None)
    return result


def triton_add_kernel() -> Any:
    """Triton's add kernel for the launch comparison, or None when triton is not importable."""
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    return add


# ------------------------------------------------------------------------------------------------
# report


def format_rows(rows: list[Row]) -> str:
    lines = [f"{'kernel':<11} {'size':<46} {'sparsile us':>11} {'GB/s':>7} {'torch us':>9} {'GB/s':>7} "
             f"{'vs torch':>8} {'max err':>8}"]
    for r in rows:
        lines.append(f"{r.kernel:<11} {r.size:<46} {r.ours_us:>11.1f} {gbps(r.nbytes, r.ours_us):>7.0f} "
                     f"{r.torch_us:>9.1f} {gbps(r.nbytes, r.torch_us):>7.0f} {r.ratio:>8.2f} {r.max_err:>8.1e}")
    return "\n".join(lines)


def format_overheads(overheads: dict[str, float | None]) -> str:
    return "\n".join(f"  {name:<30} {'-' if us is None else f'{us:.2f}':>8} us" for name, us in overheads.items())


def requirements_missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (it is the comparison and provides the device arrays)"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    from sparsile.backend.runtime import has_gpu

    if not has_gpu():
        return "sparsile sees no NVIDIA GPU"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = requirements_missing()
    if missing is not None:
        print(f"bench_elementwise needs an NVIDIA GPU and torch: {missing}", file=sys.stderr)
        return 3  # (the sparsile CLI's exit status for what this machine or installation lacks)
    import torch

    import sparsile

    vector = sparsile.load(ROOT / "examples" / "vector_add.spk")
    softmax = sparsile.load(ROOT / "examples" / "softmax.spk")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, --iters {args.iters}")
    rows = bench_vector_add(vector, vector_sizes(args), args.block, args.iters)
    rows += bench_softmax(softmax, softmax_shapes(args), args.iters)
    print(format_rows(rows))
    worst = min(r.ratio for r in rows)
    print(f"worst ratio to torch: {worst:.2f} (target {TARGET_RATIO})")
    large = [r for r in rows if r.nbytes >= LARGE_BYTES]
    if large and len(large) < len(rows):
        print(f"worst ratio at large sizes (>= {LARGE_BYTES >> 20} MiB moved; the smaller rows take a few us of "
              f"memory time and measure launch overhead): {min(r.ratio for r in large):.2f}")
    if not args.no_overhead:
        print("launch overhead, host us per launch:")
        print(format_overheads(launch_overheads(vector, args.overhead_launches)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
