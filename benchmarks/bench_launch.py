"""Host-inclusive time per launch: ``kernel[grid](...)``, a prepared launch, Triton, torch, and the
sparse GEMM through ``plan.run()`` against a prepared launch (issue 12 item 3).

    python benchmarks/bench_launch.py [--calls 200] [--repeats 15] [--tokens 16] [--features 4096]

Needs an NVIDIA GPU and torch (triton, when importable, is measured too). Each row is timed by
``torch_timing.time_calls`` (shared with bench_linear.py): ``--repeats`` blocks of back-to-back
calls (about 20 ms, at most ``--calls``, so the launch queue does not fill), each followed by
``torch.cuda.synchronize()`` *outside* the timed calls, never inside. Two numbers per row, medians
over the blocks:

  enqueue µs    host time per call until the last call returned (what Python costs per call)
  µs/call       host time per call including the final synchronize (host-inclusive: at least the
                kernel's own time once the GPU is the slower side)

Rows: an empty kernel and a vector add (1024 f32) through ``kernel[grid]``, ``prepare()``,
Triton and torch.add, and the floor: one bare ``cuLaunchKernel`` (cuda.bindings, and libcuda
through ctypes as the launch paths call it) with the parameters already packed; the bf16 sparse
GEMM (W: features x features 2:4, x: tokens x features) through ``sparse_matmul`` (plans every
call), ``kernel[grid]`` on a plan built once, ``plan.run()``, the prepared launch, and dense
``F.linear`` for scale; ``sparse_linear`` (y = x @ W.T in bf16, the kernel a torch layer runs)
through ``plan.run()`` and its launches prepared once. Prepared outputs are checked equal to
``plan.run()``'s.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_timing import time_calls  # noqa: E402  (a sibling script, not a package)

SOURCE = """
@kernel
def empty(x: ptr[f32], n: i32):
    pass

@kernel
def vadd(x: ptr[f32], y: ptr[f32], out: ptr[f32], n: i32, BLOCK: constexpr):
    offs = program_id(0) * BLOCK + arange(0, BLOCK)
    m = offs < n
    store(out + offs, load(x + offs, mask=m) + load(y + offs, mask=m), mask=m)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="host time per launch: kernel[grid], prepare(), triton, torch")
    ap.add_argument("--calls", type=int, default=200, help="most calls per timed block")
    ap.add_argument("--repeats", type=int, default=15, help="timed blocks (the median is reported)")
    ap.add_argument("--tokens", type=int, default=16, help="T of the sparse GEMM (x is T x features)")
    ap.add_argument("--features", type=int, default=4096, help="the GEMM weight is features x features")
    ap.add_argument("--no-gemm", action="store_true", help="skip the sparse GEMM rows")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1 or args.tokens < 1 or args.features < 64 or args.features % 64:
        ap.error("--calls, --repeats, --tokens must be positive; --features a multiple of 64")
    return args


def timed(fn: Callable[[], Any], calls: int, repeats: int) -> tuple[float, float]:
    """(median enqueue µs per call, median host-inclusive µs per call) through the shared
    ``torch_timing.time_calls`` (blocks of at most ``calls`` calls, synchronize outside them)."""
    import torch

    for _ in range(min(calls, 100)):  # warm-up: compiles, fast entries, tensor maps
        fn()
    t = time_calls(fn, torch.cuda.synchronize, blocks=repeats, target_s=0.02, max_calls=calls)
    return t.host, t.wall


def check_same(run: Callable[[], Any], prepared: Callable[[], Any], out: Any, what: str) -> None:
    """Exit unless ``prepared()`` writes into ``out`` (poisoned first) exactly what ``run()`` did."""
    import torch

    expected = run().clone()
    out.fill_(float("nan"))
    prepared()
    torch.cuda.synchronize()
    if not torch.equal(out, expected):
        raise SystemExit(f"{what}: the prepared launch disagrees with plan.run()")


def triton_kernels() -> tuple[Any, Any] | None:
    """Triton's empty and add kernels, or None when triton is not importable."""
    try:
        import triton
        import triton.language as tl
    except Exception:
        return None

    @triton.jit
    def empty(x, n):
        pass

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    return empty, add


def floors(prepared: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The floor under every launch path: one ``cuLaunchKernel`` of the prepared empty kernel with
    its parameters already packed, through cuda.bindings and through libcuda directly (ctypes)."""
    from cuda.bindings import driver

    from sparsile.backend.runtime import cudalib

    launcher = prepared.launcher
    fn, (bx, by, bz), address = launcher.function.handle, launcher.block, prepared._buffer.address
    out = [("bare cuLaunchKernel (cuda.bindings)",
            lambda: driver.cuLaunchKernel(fn, 1, 1, 1, bx, by, bz, 0, 0, address, 0))]
    lib = cudalib.library()
    if lib is not None:
        handle = int(fn)
        out.append(("bare cuLaunchKernel (ctypes)", lambda: lib.cuLaunchKernel(handle, 1, 1, 1, bx, by, bz, 0, 0,
                                                                                  address, 0)))
    return out


def small_kernel_rows(calls: int, repeats: int) -> list[tuple[str, str, float, float]]:
    import torch

    import sparsile as sp

    module = sp.loads(SOURCE, "bench_launch.spk")
    empty, vadd = module.kernels["empty"], module.kernels["vadd"]
    n = 1024
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out, ref = torch.empty_like(x), torch.empty_like(x)
    rows = []

    def row(case: str, how: str, fn: Callable[[], Any]) -> None:
        rows.append((case, how, *timed(fn, calls, repeats)))

    row("empty", "kernel[grid]", lambda: empty[(1,)](x, n))
    prepared_empty = empty[(1,)].prepare(x, n)
    row("empty", "prepare()d launch", lambda: prepared_empty(x, n))
    for how, bare in floors(prepared_empty):
        row("empty", how, bare)
    row("vector add 1024", "kernel[grid]", lambda: vadd[(1,)](x, y, out, n, BLOCK=n))
    prepared_add = vadd[(1,)].prepare(x, y, out, n, BLOCK=n)
    row("vector add 1024", "prepare()d launch", lambda: prepared_add(x, y, out, n))
    torch.add(x, y, out=ref)
    torch.cuda.synchronize()
    if not torch.equal(out, ref):
        raise SystemExit("vector add: the prepared launch disagrees with torch.add")
    tri = triton_kernels()
    if tri is not None:
        t_empty, t_add = tri
        row("empty", "triton kernel[grid]", lambda: t_empty[(1,)](x, n))
        row("vector add 1024", "triton kernel[grid]", lambda: t_add[(1,)](x, y, out, n, BLOCK=n))
    row("vector add 1024", "torch.add(out=)", lambda: torch.add(x, y, out=ref))
    return rows


def gemm_rows(tokens: int, features: int, calls: int, repeats: int) -> list[tuple[str, str, float, float]]:
    import torch
    import torch.nn.functional as F

    from sparsile.stdlib.kernels import plan_sparse_matmul, prune_and_compress, sparse_matmul
    from sparsile.stdlib.kernels.gemm import kernel_module

    g = torch.Generator().manual_seed(0)
    w = torch.randn(features, features, generator=g).cuda()
    x = torch.randn(tokens, features, generator=g).cuda().to(torch.bfloat16)
    values, meta = prune_and_compress(w, "bf16")
    # the tiled kernel's launch paths (at T <= 64 sparse_matmul itself would run the decode kernel)
    plan = plan_sparse_matmul(values, meta, x, kernel="gemm")
    args, constexprs = plan.arguments(), plan._constexprs()
    main = plan.kernel[plan.grid].prepare(*args, **constexprs)
    reduce = None
    if plan.split_k > 1:
        mn = plan.m * plan.n
        reduce = kernel_module().splitk_reduce[(-(-mn // 1024),)].prepare(plan.workspace, plan.out, mn,
                                                                           SPLIT_K=plan.split_k)

    def prepared() -> None:
        main(*args)
        if reduce is not None:
            reduce(plan.workspace, plan.out, plan.m * plan.n)

    def grid_call() -> None:
        plan.kernel[plan.grid](*args, **constexprs)
        if plan.split_k > 1:
            mn = plan.m * plan.n
            kernel_module().splitk_reduce[(-(-mn // 1024),)](plan.workspace, plan.out, mn, SPLIT_K=plan.split_k)

    check_same(plan.run, prepared, plan.out, "sparse GEMM")
    split = f" split_k={plan.split_k}" if plan.split_k > 1 else ""
    case = f"sparse GEMM (tiled) bf16 T={tokens} {features}x{features}{split}"
    dense = w.to(torch.bfloat16)
    rows = []
    for how, fn in (("sparse_matmul(kernel='gemm')", lambda: sparse_matmul(values, meta, x, kernel="gemm")),
                    ("kernel[grid], plan built once", grid_call),
                    ("plan.run()", plan.run),
                    ("prepare()d launch", prepared),
                    ("dense F.linear", lambda: F.linear(x, dense))):
        rows.append((case, how, *timed(fn, calls, repeats)))
    rows += linear_rows(values, meta, x, calls, repeats)
    return rows


def linear_rows(values: Any, meta: Any, x: Any, calls: int, repeats: int) -> list[tuple[str, str, float, float]]:
    """sparse_linear (y = x @ W.T, bf16 out, the kernel a torch layer runs): plan.run() against its
    launches prepared once (checked equal)."""
    from sparsile.stdlib.kernels import plan_sparse_linear

    plan = plan_sparse_linear(values, meta, x)
    steps = [(kernel[grid].prepare(*args, **cx), args) for kernel, grid, args, cx in plan.launches()]

    def prepared() -> None:
        for launch, args in steps:
            launch(*args)

    check_same(plan.run, prepared, plan.out, "sparse_linear")
    base = getattr(plan, "base", plan)  # a decode plan (T <= 64) wraps the checked SparseLinearPlan
    split_k = plan.config.split_k if hasattr(plan, "config") else plan.split_k
    kernel_name = plan.launches()[0][0].name
    case = f"sparse_linear bf16 T={base.t} {base.m}x{base.k} {kernel_name}" + \
        (f" split_k={split_k}" if split_k > 1 else "")
    return [(case, how, *timed(fn, calls, repeats)) for how, fn in (("plan.run()", plan.run),
                                                                         ("prepare()d launches", prepared))]


def format_rows(rows: list[tuple[str, str, float, float]]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [f"{'case':<{width}}  {'launched through':<30} {'enqueue us':>10} {'us/call':>9}"]
    for case, how, enqueue, inclusive in rows:
        lines.append(f"{case:<{width}}  {how:<30} {enqueue:>10.2f} {inclusive:>9.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_launch needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_launch needs an NVIDIA GPU", file=sys.stderr)
        return 2
    rows = small_kernel_rows(args.calls, args.repeats)
    if not args.no_gemm:
        rows += gemm_rows(args.tokens, args.features, args.calls, args.repeats)
    print(f"{torch.cuda.get_device_name()}: host time per call, median of {args.repeats} blocks "
          f"(synchronize outside the timed calls)")
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
