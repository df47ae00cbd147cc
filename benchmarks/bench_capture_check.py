"""What the captured-values check costs a launch (CPU, no GPU needed).

    python benchmarks/bench_capture_check.py [--reps 200000]

Before reusing a cached kernel, ``kernel[grid]`` and ``kernel.interpret`` check that every Python
value the kernel captured is unchanged (frontend/sema/captures.py; docs/language.md, "What a kernel
captures, and when it is recompiled"). Printed, in ns per call (best of 5 runs):

  check N      ``CaptureSet.still_valid()`` of a kernel that captured N constants (and `sp`)
  lookup       ``driver.launch.cached_launcher`` (the launch path's cache lookup and the check)
               for a kernel capturing 3 names, against a bare dict lookup of the same key
  bind         ``kernel.bind`` (specialization: the rest of the launch path's host work)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import timeit
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kernel_with_globals(n: int) -> object:
    """A @jit kernel (written to a temporary file: @jit reads its source) reading ``n`` globals."""
    import importlib.util

    names = [f"C{i}" for i in range(n)]
    src = "import sparsile as sp\n" + "".join(f"{c} = {i}.5\n" for i, c in enumerate(names)) + textwrap.dedent(f"""
        @sp.jit
        def k(x: sp.ptr[sp.f32], n: sp.i32, BLOCK: sp.constexpr = 16):
            offs = sp.arange(0, BLOCK)
            sp.store(x + offs, sp.load(x + offs, mask=offs < n) * ({' + '.join(names) or '1.0'}), mask=offs < n)
        """)
    path = Path(tempfile.mkdtemp()) / f"captures_{n}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.k


def per_call(stmt: object, reps: int) -> float:
    return min(timeit.repeat(stmt, number=reps, repeat=5)) / reps * 1e9  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200000)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT.parent))
    os.environ.setdefault("SPARSILE_CACHE_DIR", "off")
    import numpy as np

    from sparsile.driver.launch import cached_launcher

    x = np.zeros(16, np.float32)
    for n in (1, 3, 10):
        k = kernel_with_globals(n)
        _, bindings, key = k.bind((x, 16), {})
        caps = k.ir_entry(bindings, key)[1]
        print(f"check {n:<2} ({len(caps)} places)  {per_call(caps.still_valid, args.reps):8.0f} ns")
    k = kernel_with_globals(2)  # `sp` and two constants
    _, bindings, key = k.bind((x, 16), {})
    launcher = types.SimpleNamespace(captures=k.captures_for(bindings, key))
    cached_launcher(k, key, 0, lambda: launcher)
    plain = {(key, 0): launcher}
    lookup = per_call(lambda: cached_launcher(k, key, 0, lambda: launcher), args.reps)
    bare = per_call(lambda: plain.get((key, 0)), args.reps)
    print(f"lookup ({len(launcher.captures)} places)  {lookup:8.0f} ns  (a bare dict lookup: {bare:.0f} ns)")
    print(f"bind              {per_call(lambda: k.bind((x, 16), {}), args.reps // 10):8.0f} ns")


if __name__ == "__main__":
    main()
