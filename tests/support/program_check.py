"""Running generated programs (tests/support/program_gen.py) and comparing their outputs: exact
outputs bit for bit (any NaN matches any NaN), order-dependent float sums within their bound. The
CPU test checks the interpreter against the numpy reference; the GPU test checks the compiled
kernel against the interpreter and reports every mismatch of a run in one message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import sparsile as sp

from .program_gen import Program, generate

Launch = Callable[[Any, tuple[int, ...], list[Any]], None]
"""``launch(kernel, grid, args)``: run the kernel on the arguments in place."""


def interpret(kernel: Any, grid: tuple[int, ...], args: list[Any]) -> None:
    """Launch in the CPU interpreter."""
    kernel.interpret[grid](*args)


def gpu(kernel: Any, grid: tuple[int, ...], args: list[Any]) -> None:
    """Launch on the GPU (numpy arrays are copied in and back by the launch path)."""
    kernel[grid](*args)


def kernel_of(program: Program) -> Any:
    """The program's kernel, loaded from its text."""
    return sp.loads(program.source, f"progfuzz_{program.seed}.spk").kernels["k"]


def ordered(kernel: Any, args: dict[str, Any]) -> list[Any]:
    """The arguments by name, in the kernel's parameter order."""
    return [args[p.name] for p in kernel.params]


def run(program: Program, launch: Launch, seed: int) -> dict[str, np.ndarray]:
    """The output arrays after launching ``program`` on its inputs of ``seed`` with ``launch``."""
    args = program.inputs(seed)
    kernel = kernel_of(program)
    launch(kernel, program.grid, ordered(kernel, args))
    names = list(program.outputs) + (["HIST"] if program.hist_dtype else []) + list(program.atomic_bufs)
    return {n: np.asarray(args[n]).reshape(-1) for n in names}


def mismatches(got: dict[str, np.ndarray], want: dict[str, np.ndarray], tols: dict[str, np.ndarray],
               scale: float = 1.0) -> list[str]:
    """What differs between two runs' outputs: one line per output naming up to four elements.
    Elements with a nonzero bound in ``tols`` may differ by ``scale`` times it."""
    out = []
    for name, w in want.items():
        g = got[name]
        if g.dtype.kind in "iub":
            bad = np.flatnonzero(g != w)
        else:
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            with np.errstate(invalid="ignore"):
                same_bits = g.view(f"u{g.dtype.itemsize}") == w.view(f"u{w.dtype.itemsize}")
                ok = same_bits | (np.isnan(gf) & np.isnan(wf)) | (np.abs(gf - wf) <= scale * tols[name])
            bad = np.flatnonzero(~ok)
        if bad.size:
            idx = bad[:4]
            out.append(f"{name} ({g.dtype}): {bad.size} elements differ, at {idx.tolist()}: got "
                       f"{g[idx].tolist()}, want {w[idx].tolist()}")
    return out


def check_against_reference(program: Program, seed: int) -> list[str]:
    """The interpreter's outputs against the numpy reference evaluator, for each value of the
    program's ``constexpr`` ``K`` (one kernel specialized twice)."""
    out = []
    for variant in program.variants():
        want, tols = variant.reference(variant.inputs(seed))
        out += [f"K={variant.consts.get('K')}: {d}" for d in mismatches(run(variant, interpret, seed), want, tols)]
    return out


def compile_programs(programs: list[Any], target: str | None = None) -> None:
    """Every program compiled for ``target`` (default: this GPU's) in worker processes, into the
    compile cache (``differential``'s ``prepare`` on the GPU)."""
    import os

    from sparsile.driver.compile_pool import Specialization, compile_specializations

    if target is None:
        from sparsile.backend import runtime
        from sparsile.target.targets import target_for_capability

        target = target_for_capability(*runtime.current_device().compute_capability).name
    specs = []
    for p in programs:
        kernel = kernel_of(p)
        args = p.inputs(p.seed)
        names = [q.name for q in kernel.params if q.name not in p.consts]
        specs.append(Specialization.of_launch(kernel, tuple(args[n] for n in names), dict(p.consts)))
    compile_specializations(specs, target, jobs=min(16, os.cpu_count() or 1), timeout=120)


def differential(seeds: list[int], launch: Launch, *, prepare: Callable[[list[Program]], None] | None = None,
                 gen: Callable[[int], Any] = generate) -> list[str]:
    """Each seed's program run by ``launch`` against the interpreter (order-dependent sums within
    twice their bound: both are within it of the exact value); a report per failing program, with
    its seed and source, so one run triages every mismatch. ``prepare`` sees every program first
    (the GPU test compiles them in parallel there). ``gen`` builds a seed's program (program_gen's
    :func:`generate`, or program_gen_sparse's :func:`generate_sparse`)."""
    programs = [v for seed in seeds for v in gen(seed).variants()]
    if prepare is not None:
        prepare(programs)
    reports = []
    for program in programs:
        try:
            want = run(program, interpret, program.seed)
            _, tols = program.reference(program.inputs(program.seed))
            got = run(program, launch, program.seed)
            diffs = mismatches(got, want, tols, scale=2.0)
        except Exception as e:  # a compile or launch error is a finding too
            diffs = [f"{type(e).__name__}: {e}"]
        if diffs:
            reports.append(f"--- seed {program.seed}, K={program.consts.get('K')}:\n" + "\n".join(diffs) + "\n"
                           + program.source)
    return reports
