"""Random valid programs (tests/support/program_gen.py) compiled and run on the GPU against the
interpreter: exact outputs bit for bit (any NaN matches any NaN), order-dependent float sums and
dots within twice their error bound. Every mismatch of the run is reported in one message with the
program's seed and source (``generate(seed)`` rebuilds it). The programs compile first, in worker
processes (driver/compile_pool.py). ``SPARSILE_PROGFUZZ_INTERPRET=1`` swaps the launch for the
interpreter (the CPU test runs this body that way), ``SPARSILE_PROGFUZZ_N`` sets how many."""

from __future__ import annotations

import os

import pytest

from sparsile.tests.support.program_check import differential, gpu, interpret, kernel_of
from sparsile.tests.support.program_gen import Program

pytestmark = pytest.mark.gpu

N_PROGRAMS = int(os.environ.get("SPARSILE_PROGFUZZ_N", "300"))


def _compile_all(programs: list[Program], target: str | None = None) -> None:
    """Every program compiled for ``target`` (this GPU's) in worker processes, into the compile cache."""
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


def test_random_programs_match_the_interpreter_on_the_gpu() -> None:
    on_cpu = os.environ.get("SPARSILE_PROGFUZZ_INTERPRET") == "1"
    reports = differential(list(range(N_PROGRAMS)), interpret if on_cpu else gpu,
                           prepare=None if on_cpu else _compile_all)
    head = f"{len(reports)} of {N_PROGRAMS} programs differ from the interpreter:\n\n"
    assert not reports, head + "\n\n".join(reports)

