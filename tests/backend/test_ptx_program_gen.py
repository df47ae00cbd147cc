"""Integer-only programs of the program generator (tests/support/program_gen.py) executed as PTX on
the CPU (tests/backend/ptx_exec.py) against the interpreter, bit for bit: expression trees, loops,
branches on run-time scalars, reductions (lanes, warps through shared memory and barriers) and
atomics together, as the GPU differential test runs them (tests/gpu/test_program_fuzz_gpu.py).

The generator draws float types too (the executor knows no float instruction), so the programs here
are drawn with a ``random.Random`` whose ``choice`` among type names leaves the float ones out
(:class:`IntegerRandom`); programs that still use floats are skipped. Seeded: the same programs in
every run."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

import sparsile as sp
from sparsile.tests.backend.ptx_exec import run_grid
from sparsile.tests.support import program_gen as pg
from sparsile.tests.support.compile import signature
from sparsile.tests.support.program_check import differential

PROGRAMS = 12
"""How many integer-only programs (the first ones of seeds 0, 1, ...): about 6 s."""
_FLOAT_SOURCE = re.compile(r"\b(f16|bf16|f32|f64|e4m3|e5m2)\b|\bdot\(|"
                           r"\b(exp|exp2|log|log2|sqrt|sin|cos|tanh|floor|ceil|erf|sigmoid|rsqrt)\(")


class IntegerRandom(random.Random):
    """A seeded ``random.Random`` whose ``choice`` among names that include float types picks among
    the others (the generator's type draws), and is unchanged otherwise."""

    def choice(self, seq: Sequence[Any]) -> Any:
        if isinstance(seq, list | tuple) and any(isinstance(x, str) and x in pg.FLOATS for x in seq):
            rest = [x for x in seq if not (isinstance(x, str) and x in pg.FLOATS)]
            if rest:
                return super().choice(rest)
        return super().choice(seq)


def integer_program(seed: int) -> pg.Program:
    return pg.generate_from(IntegerRandom(seed), seed)


def is_integer_only(p: pg.Program) -> bool:
    types = [*p.inputs_dt, *(s.dtype for s in p.outputs.values()), *p.scalars.values(), *p.atomic_bufs.values()]
    return not _FLOAT_SOURCE.search(p.source) and all(t in pg.INTS for t in types) \
        and (p.hist_dtype is None or p.hist_dtype in pg.INTS)


def ptx_launch(kernel: Any, grid: tuple[int, ...], args: list[Any]) -> None:
    """program_check's launch, as the kernel's PTX for sm_90a executed on the CPU."""
    consts = {p.name: a for p, a in zip(kernel.params, args, strict=True) if p.annotation is sp.constexpr}
    c = kernel.compile(signature(kernel, **consts), target="sm_90a", cache=False)
    rt = [a for p, a in zip(kernel.params, args, strict=True) if p.annotation is not sp.constexpr]
    run_grid(c.ptx, 32 * c.num_warps, grid, [a if isinstance(a, np.ndarray) else int(a) for a in rt],
             smem_bytes=c.smem_bytes)


def test_integer_programs_ptx_match_the_interpreter() -> None:
    seeds = [s for s in range(200) if is_integer_only(integer_program(s))][:PROGRAMS]
    assert len(seeds) == PROGRAMS
    sources = "\n".join(integer_program(s).source for s in seeds)
    assert "atomic_" in sources and "argm" in sources and "sum(" in sources  # (what the executor adds)
    reports = differential(seeds, ptx_launch, gen=integer_program)
    assert not reports, f"{len(reports)} of {PROGRAMS} programs differ:\n\n" + "\n".join(reports)


def test_a_launch_that_does_nothing_is_reported() -> None:
    """The comparison sees the outputs: a launch leaving them poisoned differs."""
    seed = next(s for s in range(200) if is_integer_only(integer_program(s)))
    assert differential([seed], lambda kernel, grid, args: None, gen=integer_program)
