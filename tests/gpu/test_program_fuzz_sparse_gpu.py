"""Random sparse-core programs (tests/support/program_gen_sparse.py: ``sparse_dot`` loops with masked
and tensor-tile operands and epilogues, 3-D ``tensor`` tiles at ragged edges) compiled and run on the
GPU against the interpreter: exact outputs bit for bit, sparse_dot results within twice their error
bound. Every mismatch of the run is reported in one message with the program's seed and source
(``generate_sparse(seed)`` rebuilds it). The programs compile first, in worker processes.
``SPARSILE_PROGFUZZ_INTERPRET=1`` swaps the launch for the interpreter (the CPU test runs this body
that way), ``SPARSILE_PROGFUZZ_N`` sets how many."""

from __future__ import annotations

import os

import pytest

from sparsile.tests.support.program_check import compile_programs, differential, gpu, interpret
from sparsile.tests.support.program_gen_sparse import generate_sparse

pytestmark = pytest.mark.gpu

N_PROGRAMS = int(os.environ.get("SPARSILE_PROGFUZZ_N", "120"))


def test_random_sparse_programs_match_the_interpreter_on_the_gpu() -> None:
    on_cpu = os.environ.get("SPARSILE_PROGFUZZ_INTERPRET") == "1"
    reports = differential(list(range(N_PROGRAMS)), interpret if on_cpu else gpu,
                           prepare=None if on_cpu else compile_programs, gen=generate_sparse)
    head = f"{len(reports)} of {N_PROGRAMS} sparse programs differ from the interpreter:\n\n"
    assert not reports, head + "\n\n".join(reports)
