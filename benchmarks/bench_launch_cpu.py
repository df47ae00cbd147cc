"""The CPU part of ``kernel[grid](...)``'s launch path, without a GPU (issue 12).

    python benchmarks/bench_launch_cpu.py [--rounds 7] [--target-ms 50] [--profile CASE] [--top 25]

A fake device stands in for the GPU, as in tests/backend/test_prepared.py: each kernel is compiled
for sm_90a for real (no GPU needed), its launcher is built on a fake loaded function, and the
launch itself (``cuLaunchKernel``) is a Python no-op returning success. Every row times the public
path, ``kernel[grid](x, y, out, n, BLOCK=1024)`` (after a first call that compiled it and filed its
fast entry), with arrays that stand in for device arrays:

  torch stand-ins     a ``torch.Tensor`` subclass over CPU memory that says it is a CUDA tensor on
                      device 0 at a made-up device address (its other methods are torch's own C
                      ones, though a subclass's attribute reads cost ~150 ns against ~50 ns)
  DeviceBuffers       sparsile's ``DeviceBuffer`` objects at made-up addresses (nothing allocated)

The rows run in order in one process, so the first row is the process's first launch of a torch
tensor class (before ``is_torch_type`` chose a class's extractor on first sight, its fast entry read
the first tensor through the generic path). Rows also give a call passing the run-time ``n`` by
keyword, which takes the full path every time
(bind, specialize, the launcher's lookup and argument conversion), a ``prepare()``d launch of the
same kernel, and the fake launch alone (the floor under every row; on a GPU a real
``cuLaunchKernel`` replaces it). Times are µs per call over
``--rounds`` rounds of about ``--target-ms`` each: min and median (a shared machine: the min is
the cleaner number), and the Python-level function calls of one call (``sys.setprofile``; the
stand-ins' own methods count, the lambda of the row does not): a machine-independent measure.
``--profile CASE`` prints the cProfile of that row's calls instead.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_launch import SOURCE  # (a sibling script: the same empty kernel and vector add)

SCALE = 1.0
"""Read by the ``@jit`` vector add below: a captured Python global, checked at every launch."""

N = 1024
BASE = 0x7F00_0000_0000
"""The made-up device address of the first stand-in array (each next one 64 KiB further)."""


def fake_device() -> Callable[..., Any]:
    """Route launches to a fake H200 (kernels compile for sm_90a for real; the launch is a no-op
    returning success). Returns the no-op launch."""
    from sparsile.backend import runtime
    from sparsile.backend.runtime import devices
    from sparsile.driver import fast_launch, launch, prepared
    from sparsile.driver.compiler import compile_cached
    from sparsile.frontend.interp.host_arrays import stored_params

    info = runtime.DeviceInfo(ordinal=0, name="fake H200", compute_capability=(9, 0), sm_count=132,
                              max_shared_per_block=49152, max_shared_per_block_optin=232448,
                              max_threads_per_block=1024, max_block_dims=(1024, 1024, 64),
                              max_grid_dims=(2**31 - 1, 65535, 65535), max_cluster_size=8, l2_size=52428800)
    attrs = runtime.FunctionAttributes(1024, 0, 48128, 32, 0, 0, 80, 90, (0, 0, 0))
    module = SimpleNamespace(device=info, context_key=None, _state="state", activate=lambda force=False: None)
    ok = (devices.SUCCESS,)

    def no_op_launch(*args: Any) -> tuple[Any]:
        return ok

    def build(kernel: Any, bindings: Any, key: Any, target: Any, options: Any, ordinal: Any = None) -> Any:
        ck = compile_cached(kernel, bindings, key, target, options)
        stores = stored_params(kernel.ir_for(bindings, key, options))
        spec = launch.param_spec(kernel, bindings, ck.params, stores)
        fn = SimpleNamespace(module=module, attributes=attrs, handle=0x500, set_max_dynamic_shared=lambda n: None)
        launcher = runtime.Launcher(fn, spec, num_warps=ck.num_warps, cluster=ck.cluster, pdl=ck.pdl)
        launcher._launch_kernel = no_op_launch  # the fake cuLaunchKernel
        launcher.spec_has_tensormaps = any(p.kind == "tensormap" for p in spec.params)
        launcher.written = stores
        launcher.captures = kernel.captures_for(bindings, key, options)
        return launcher

    setattr(devices, "_has_gpu", True)  # noqa: B010 (the fake device: the driver is never initialized)
    runtime.current_device = lambda ordinal=None: info
    launch._build_launcher = build
    fast_launch.torch_current_stream = lambda ordinal: 0
    prepared.torch_stream_getter = lambda ordinal: int  # (a C call, as torch's raw-stream getter is)
    return no_op_launch


def torch_stand_ins(count: int) -> list[Any]:
    """``count`` float32 tensors of N elements that say they are CUDA tensors on device 0."""
    import torch

    class StandIn(torch.Tensor):
        is_cuda = True
        __torch_function__ = torch._C._disabled_torch_function_impl  # torch's methods at C speed

        def get_device(self) -> int:
            return 0

    out = []
    for i in range(count):
        t = torch.Tensor._make_subclass(StandIn, torch.empty(N))
        t.data_ptr = (BASE + i * 0x10000).__int__  # a C call returning the made-up address
        out.append(t)
    return out


def device_buffers(count: int) -> list[Any]:
    """``count`` DeviceBuffers of N float32 at made-up addresses (nothing allocated)."""
    from sparsile.backend.runtime import DeviceBuffer

    out = []
    for i in range(count):
        b = DeviceBuffer.__new__(DeviceBuffer)
        b.ptr, b.nbytes, b.dtype, b.shape, b.device = BASE + i * 0x10000, 4 * N, "f32", (N,), 0
        out.append(b)
    return out


def jit_vadd() -> Any:
    """The vector add as a ``@jit`` kernel made in a function: it reads ``sp`` from the closure and
    SCALE from the module (its captures are checked per launch)."""
    import sparsile as sp

    @sp.jit
    def vadd_jit(x: sp.ptr[sp.f32], y: sp.ptr[sp.f32], out: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr):
        offs = sp.program_id(0) * BLOCK + sp.arange(0, BLOCK)
        m = offs < n
        sp.store(out + offs, sp.load(x + offs, mask=m) * SCALE + sp.load(y + offs, mask=m), mask=m)

    return vadd_jit


def cases(no_op_launch: Callable[..., Any]) -> list[tuple[str, Callable[[], Any]]]:
    """(name, call) of every row; each call launched once already (compiled, fast entry filed)."""
    import sparsile as sp

    module = sp.loads(SOURCE, "bench_launch_cpu.spk")
    empty, vadd = module.kernels["empty"], module.kernels["vadd"]
    jit = jit_vadd()
    x, y, out = torch_stand_ins(3)
    bx, by, bout = device_buffers(3)
    grid = (1,)
    prepared: list[Any] = []  # (prepared after the kernel[grid] rows' first calls, as bench_launch.py does)
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("empty, torch stand-ins: kernel[grid]", lambda: empty[grid](x, N)),
        ("vadd, torch stand-ins: kernel[grid]", lambda: vadd[grid](x, y, out, N, BLOCK=N)),
        ("vadd, torch stand-ins: prepare()d", lambda: prepared[0](x, y, out, N)),
        ("vadd, DeviceBuffers: kernel[grid]", lambda: vadd[grid](bx, by, bout, N, BLOCK=N)),
        ("vadd @jit (captures), torch stand-ins: kernel[grid]", lambda: jit[grid](x, y, out, N, BLOCK=N)),
        ("vadd, torch stand-ins, n= by keyword (full path)", lambda: vadd[grid](x, y, out, n=N, BLOCK=N)),
        ("the fake cuLaunchKernel alone", lambda: no_op_launch(0, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0)),
    ]
    for name, call in rows:  # (in order: the first is the process's first launch of a torch tensor)
        if not prepared and "prepare()d" in name:
            prepared.append(vadd[grid].prepare(x, y, out, N, BLOCK=N))
        call()
    return rows


def python_calls(call: Callable[[], Any]) -> int:
    """The Python-level function calls of one ``call()`` (itself not counted; C calls neither):
    a count that does not depend on the machine."""
    count = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            count[0] += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return count[0] - 1


def timed(call: Callable[[], Any], rounds: int, target_s: float) -> tuple[float, float]:
    """(min, median) µs per call over ``rounds`` rounds of about ``target_s`` each."""
    number = 100
    while True:
        t = timeit.timeit(call, number=number)
        if t >= target_s / 4 or number >= 10**7:
            break
        number *= 4
    number = max(1, int(number * target_s / max(t, 1e-9)))
    per = [s / number * 1e6 for s in timeit.repeat(call, number=number, repeat=rounds)]
    return min(per), statistics.median(per)


def package_commit() -> str:
    """The commit of the sparsile checkout imported (the one measured), or where it lies when it is no
    git checkout."""
    import sparsile

    where = Path(sparsile.__file__).resolve().parent
    try:
        return subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(where)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the CPU cost of kernel[grid](...) on a fake device")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per row (min and median reported)")
    ap.add_argument("--target-ms", type=float, default=50.0, help="about how long one round runs")
    ap.add_argument("--profile", metavar="CASE", help="cProfile the first row whose name contains CASE")
    ap.add_argument("--top", type=int, default=25, help="profile lines printed")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.target_ms <= 0:
        ap.error("--rounds must be positive, --target-ms above 0")
    os.environ.setdefault("SPARSILE_CACHE_DIR", "off")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench_launch_cpu needs torch (its CPU build is enough)", file=sys.stderr)
        return 2
    rows = cases(fake_device())
    if args.profile:
        name, call = next(((n, c) for n, c in rows if args.profile in n), (None, None))
        if call is None:
            ap.error(f"no row named like {args.profile!r}")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20000):
            call()
        profile.disable()
        print(f"{name}: 20000 calls")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        return 0
    print(f"kernel[grid] on a fake device (CPU only), {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, sparsile {package_commit()}; µs per call over {args.rounds} rounds")
    width = max(len(n) for n, _ in rows)
    print(f"{'case':<{width}}  {'min us':>7} {'median us':>9} {'py calls':>8}")
    for name, call in rows:
        lo, med = timed(call, args.rounds, args.target_ms / 1e3)
        print(f"{name:<{width}}  {lo:>7.2f} {med:>9.2f} {python_calls(call):>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
