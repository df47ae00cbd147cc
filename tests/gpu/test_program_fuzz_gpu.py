"""Random valid programs (tests/support/program_gen.py) compiled and run on the GPU against the
interpreter: exact outputs bit for bit (any NaN matches any NaN), order-dependent float sums and
dots within twice their error bound. Every mismatch of the run is reported in one message with the
program's seed and source (``generate(seed)`` rebuilds it). The programs compile first, in worker
processes (driver/compile_pool.py). ``SPARSILE_PROGFUZZ_INTERPRET=1`` swaps the launch for the
interpreter (the CPU test runs this body that way), ``SPARSILE_PROGFUZZ_N`` sets how many."""

from __future__ import annotations

import os

import pytest

from sparsile.tests.support.program_check import compile_programs, differential, gpu, interpret

pytestmark = pytest.mark.gpu

N_PROGRAMS = int(os.environ.get("SPARSILE_PROGFUZZ_N", "300"))


def test_random_programs_match_the_interpreter_on_the_gpu() -> None:
    on_cpu = os.environ.get("SPARSILE_PROGFUZZ_INTERPRET") == "1"
    reports = differential(list(range(N_PROGRAMS)), interpret if on_cpu else gpu,
                           prepare=None if on_cpu else compile_programs)
    head = f"{len(reports)} of {N_PROGRAMS} programs differ from the interpreter:\n\n"
    assert not reports, head + "\n\n".join(reports)

