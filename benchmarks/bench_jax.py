"""sparsile.jax on the GPU: the cost of a sparsile kernel inside ``jax.jit`` against ``jnp.dot`` of the
same shape, the Python (GIL) time of the FFI handler per call, and a profiler check that the call
path copies nothing between device and host.

    python benchmarks/bench_jax.py [--quick] [--iters 200] [--profile-dir /tmp/sparsile-jax-trace]

Needs jax with a CUDA plugin and an NVIDIA GPU. For each (tokens T, in features K, out features N):

  sparse   ``jax.jit(layer)`` with ``layer = SparseLinear.from_dense(w, "bf16")``: the fused sparse linear
           kernel (one custom call, two with split-K), y (T, N) in bf16
  dense    ``jax.jit(lambda x, w: jnp.dot(x, w.T))`` with the pruned weight dense, bf16
  µs/call  wall time of --iters back-to-back calls, then one ``block_until_ready`` (the queue stays
           full: large shapes measure the GPU, tiny ones the host)
  handler  the time spent in the Python FFI handler per slow call after the first (compiling) one
           (it holds the GIL), from ``ffi.STATS``;
           calls the native fast path served (integrations/jax/native.py) hold no GIL and are not
           timed: they count in ``fast``
  fast / slow  custom-call executions served by the native fast path / by the Python handler during
           the timed sparse calls (``native.counts()``; all slow with ``SPARSILE_JAX_NATIVE=0``)
  busy     µs/call again while another Python thread spins, sparse and jnp.dot: the Python handler
           must win the GIL back (the native fast path does not take it), but so must JAX's own
           dispatch, which releases it per call (on the CPU backend a spinning thread already turns a
           14 µs jnp.dot call into 114 µs)

The profiler check runs the largest shape under ``jax.profiler.trace`` and counts the events of the
trace: XLA's executions of ``sparsile_call``, the sparsile kernels on the device (by the names of
the kernels the layer's plans launched), and the device memcpys: a device-to-host copy would show
as ``MemcpyDtoH`` (none is expected; the one transfer of the result is made after the trace ends).
It also prints the distinct device event names containing "sparse", so that a kernel-name mismatch
is visible. The exit status is 2 when a copy is seen.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SHAPES = ((1, 64, 128), (16, 4096, 4096), (256, 4096, 4096), (2048, 4096, 4096), (8192, 8192, 8192))
QUICK_SHAPES = ((1, 64, 128), (256, 4096, 4096))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="two shapes only")
    p.add_argument("--iters", type=int, default=200, help="calls per timing")
    p.add_argument("--profile-dir", default="/tmp/sparsile-jax-trace", help="where the profiler trace goes")
    return p.parse_args(argv)


def shapes(args: argparse.Namespace) -> tuple[tuple[int, int, int], ...]:
    return QUICK_SHAPES if args.quick else SHAPES


def _squash(name: str) -> str:
    return name.lower().replace(" ", "").replace("_", "")


def classify_events(names: Iterable[str], kernels: Iterable[str]) -> dict[str, int]:
    """Counts of the trace's event names: device-to-host and host-to-device copies, events of the
    sparsile ``kernels`` (the names of the kernels launched), and XLA's executions of the
    ``sparsile_call`` custom calls."""
    wanted = [_squash(k) for k in kernels]
    out = {"dtoh": 0, "htod": 0, "sparsile_kernels": 0, "ffi_calls": 0}
    for name in names:
        low = _squash(name)
        if low.startswith("sparsilecall"):
            out["ffi_calls"] += 1
        elif "memcpy" in low and ("dtoh" in low or "devicetohost" in low):
            out["dtoh"] += 1
        elif "memcpy" in low and ("htod" in low or "hosttodevice" in low):
            out["htod"] += 1
        elif any(k in low for k in wanted):
            out["sparsile_kernels"] += 1
    return out


def sparse_names(names: Iterable[str]) -> list[str]:
    """The distinct event names containing "sparse" (sorted)."""
    return sorted({n for n in names if "sparse" in n.lower()})


def launched_kernels() -> list[str]:
    """The PTX entry names of every kernel the process's sparsile.jax plans loaded."""
    from sparsile.integrations.jax import ffi as spffi

    return sorted({launcher.function.name for plan in list(spffi._plans.values())
                   for launcher in list(getattr(plan, "_launchers", {}).values())})


def per_call_us(fn: Callable[[], Any], iters: int) -> float:
    """Wall µs per call of ``iters`` back-to-back calls followed by one wait for the last result."""
    for _ in range(5):
        fn().block_until_ready()
    start = time.perf_counter()
    for _ in range(iters - 1):
        fn()
    fn().block_until_ready()
    return (time.perf_counter() - start) / iters * 1e6


def _busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def run_shape(t: int, k: int, n: int, iters: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from sparsile.integrations.jax import SparseLinear, native
    from sparsile.integrations.jax import ffi as spffi

    rng = np.random.default_rng(0)
    layer = SparseLinear.from_dense(rng.standard_normal((n, k)), "bf16")
    w = jnp.asarray(layer.dense())
    x = jnp.asarray(rng.standard_normal((t, k)), jnp.bfloat16)
    sparse = jax.jit(layer)
    dense = jax.jit(lambda x, w: jnp.dot(x, w.T))
    sparse(x).block_until_ready()  # the first call compiles and arms the plans (the slow path)
    calls, seconds = spffi.STATS["calls"], spffi.STATS["seconds"]
    before = native.counts()
    sparse_us = per_call_us(lambda: sparse(x), iters)
    after = native.counts()
    handler_us = (spffi.STATS["seconds"] - seconds) / max(1, spffi.STATS["calls"] - calls) * 1e6
    dense_us = per_call_us(lambda: dense(x, w), iters)
    stop = threading.Event()
    spinner = threading.Thread(target=_busy, args=(stop,), daemon=True)
    spinner.start()
    try:
        busy_us = per_call_us(lambda: sparse(x), max(20, iters // 4))
        dense_busy_us = per_call_us(lambda: dense(x, w), max(20, iters // 4))
    finally:
        stop.set()
        spinner.join()
    return {"sparse_us": sparse_us, "dense_us": dense_us, "handler_us": handler_us, "busy_us": busy_us,
            "dense_busy_us": dense_busy_us,
            "fast": after["fast"] - before["fast"], "slow": after["slow"] - before["slow"]}


def profile_check(t: int, k: int, n: int, directory: str) -> dict[str, Any]:
    import jax
    import numpy as np

    from sparsile.integrations.jax import SparseLinear

    rng = np.random.default_rng(0)
    layer = SparseLinear.from_dense(rng.standard_normal((n, k)), "bf16")
    x = jax.numpy.asarray(rng.standard_normal((t, k)), jax.numpy.bfloat16)
    f = jax.jit(layer)
    f(x).block_until_ready()
    with jax.profiler.trace(directory):
        for _ in range(10):
            y = f(x)
        y.block_until_ready()
    files = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    kernels = launched_kernels()
    reader = getattr(jax.profiler, "ProfileData", None)  # absent up to jax 0.5.3, None in 0.6.2
    if not files or reader is None:  # -1: not measured
        return {"dtoh": -1, "htod": -1, "sparsile_kernels": -1, "ffi_calls": -1, "kernels": kernels,
                "sparse_names": []}
    data = reader.from_file(files[-1])
    names = [event.name for plane in data.planes for line in plane.lines for event in line.events]
    return {**classify_events(names, kernels), "kernels": kernels, "sparse_names": sparse_names(names)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import jax

    if jax.default_backend() != "gpu":
        print(f"bench_jax needs jax with a CUDA backend (default backend: {jax.default_backend()})")
        return 1
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; bf16, y = x @ W.T, {args.iters} calls each")
    from sparsile.integrations.jax import native

    print(f"native fast path: {'on' if native.enabled() else 'off'} ({native.ENV})")
    print("| T x K x N | sparse µs/call | jnp.dot µs/call | sparse / dense | handler µs (GIL) "
          "| fast / slow calls | sparse µs, busy thread | jnp.dot µs, busy thread |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t, k, n in shapes(args):
        r = run_shape(t, k, n, args.iters)
        print(f"| {t} x {k} x {n} | {r['sparse_us']:.1f} | {r['dense_us']:.1f} | "
              f"{r['sparse_us'] / r['dense_us']:.2f} | {r['handler_us']:.1f} | {r['fast']} / {r['slow']} | "
              f"{r['busy_us']:.1f} | {r['dense_busy_us']:.1f} |")
    if native.DISABLED:
        print(f"plans left on the slow path: {native.DISABLED}")
    t, k, n = shapes(args)[-1]
    counts = profile_check(t, k, n, args.profile_dir)
    print(f"profiler ({t} x {k} x {n}, 10 calls): {counts['ffi_calls']} sparsile_call executions, "
          f"{counts['sparsile_kernels']} sparsile kernel events, {counts['dtoh']} device-to-host copies, "
          f"{counts['htod']} host-to-device copies")
    print(f"  kernels counted: {', '.join(counts['kernels']) or '(none loaded)'}")
    print(f"  device event names containing 'sparse': {', '.join(counts['sparse_names']) or '(none)'}")
    return 0 if counts["dtoh"] == 0 and (counts["ffi_calls"] > 0 or counts["sparsile_kernels"] > 0) else 2


if __name__ == "__main__":
    sys.exit(main())
