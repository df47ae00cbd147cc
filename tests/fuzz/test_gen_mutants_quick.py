"""A fixed set of mutants of generated programs (tests/fuzz/gen_mutate.py; the long sweep is
scripts/fuzz_mutants.py) compiled to PTX: for sm_90a in this process, and for sm_80 in a worker
subprocess under a memory limit (the oldest target, where most features must be refused before LLVM
could abort the process on them). Each must end in PTX or a well-formed diagnostic; numpy warnings are
errors. The set covers every mutation kind, both generators, both outcomes, and the mutants that found
bugs (``BUGS``)."""

from __future__ import annotations

import io
import warnings

import pytest

from sparsile.frontend.diagnostics import CompileError, Diagnostic
from sparsile.frontend.spans import SourceFile, Span
from sparsile.target.targets import TARGETS
from sparsile.tests.support.scripts import load_script

from .gen_mutate import ALL_TARGETS, MUTATIONS, make_mutant
from .gen_runner import DIAGNOSTIC, OK, compile_mutant, diagnostic_problem

BUGS = {
    "plain:36:186": "a masked load of ptr[bool] with other=: 'bitcast i1 to i8' (backend/lower/memory.py)",
    "plain:864:1864": "trans(1): a 0-d tile, 'scalars have no layout' (frontend/ops/shape.py)",
    "sparse:215:2215": "other=1e30 on an f16 load: a numpy overflow warning (backend/lower/llvm_text.py)",
    "plain:726:3726": "an f16 constant beyond 65504 (llvm_text.py, the interpreter's arith.constant)",
}
COVER = ["plain:14:134", "plain:22:142", "sparse:21:141", "sparse:7:127", "sparse:9:129", "plain:0:40",
         "sparse:5:125", "plain:6:6", "plain:12:52", "sparse:25:105", "plain:10:50", "plain:10:130",
         "plain:30:70", "plain:32:72", "sparse:17:57", "sparse:37:77"]
"""Mutants chosen to reach every mutation kind with each outcome (ok, diagnostic) at sm_90a."""
MUTANTS = [*BUGS, *COVER]


def mutant(spec: str):
    gen, seed, mseed = spec.split(":")
    return make_mutant(gen, int(seed), int(mseed))


def test_mutants_compiled_for_sm_90a_end_in_ptx_or_a_well_formed_diagnostic() -> None:
    outcomes = {}
    kinds = set()
    for spec in MUTANTS:
        m = mutant(spec)
        kinds |= {s.split(":")[0] for s in m.steps}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            outcome, detail, _ = compile_mutant(m, ("sm_90a",))
        assert outcome in (OK, DIAGNOSTIC), f"{spec} ({'; '.join(m.steps)}): {outcome}\n{detail}\n{m.source}"
        outcomes[spec] = outcome
    assert set(outcomes.values()) == {OK, DIAGNOSTIC}
    assert kinds == set(MUTATIONS), set(MUTATIONS) - kinds


def test_mutants_compiled_for_sm_80_in_a_worker_subprocess_end_in_ptx_or_a_diagnostic() -> None:
    fuzz = load_script("scripts/fuzz_mutants.py", "fuzz_mutants_script")
    w = fuzz.Worker(3, mem_gb=6)
    bad, outcomes = [], set()
    try:
        for spec in MUTANTS:
            res = w.run({"spec": spec, "stage": "compile", "targets": ["sm_80"]}, timeout=60)
            outcomes.add(res["outcome"])
            if res["outcome"] not in (OK, DIAGNOSTIC):
                bad.append(f"{spec}: {res['outcome']}\n{res['detail']}")
    finally:
        w.close()
    assert not bad, "\n\n".join(bad)
    assert outcomes == {OK, DIAGNOSTIC}


def test_the_sweep_reports_a_dead_worker_as_a_crash() -> None:
    fuzz = load_script("scripts/fuzz_mutants.py", "fuzz_mutants_script")
    log = io.StringIO()
    counts = fuzz.sweep(["plain:0:40"], 1, 3, timeout=60, mem_gb=0.05, interpret=False, log=log)
    assert dict(counts["compile"]) == {"crash": 1}, log.getvalue()
    assert "BUG crash [compile] --replay plain:0:40" in log.getvalue()


def test_mutants_are_reproducible_and_the_target_list_is_the_table() -> None:
    a, b = mutant("plain:3:17"), mutant("plain:3:17")
    assert (a.source, a.consts, a.targets, a.steps) == (b.source, b.consts, b.targets, b.steps)
    assert mutant("plain:3:18").source != a.source or mutant("plain:3:18").consts != a.consts
    assert list(ALL_TARGETS) == list(TARGETS)
    assert load_script("scripts/fuzz_mutants.py", "fuzz_mutants_script").N_TARGETS == len(TARGETS)


SOURCE = "@kernel\ndef k(O: ptr[f32]):\n    store(O, 1.0)\n"


@pytest.mark.parametrize(("line", "col", "problem"), [
    (0, 0, "no span"), (9, 1, "outside the source"), (2, 40, "outside the source"), (2, 5, None)])
def test_a_diagnostic_must_point_inside_the_source(line: int, col: int, problem: str | None) -> None:
    span = Span(SourceFile("mutant.spk", SOURCE), line, col, line, col + 1)
    got = diagnostic_problem(CompileError([Diagnostic("SP0301", "a message", span)]), SOURCE)
    assert (got is None) if problem is None else (problem in got), got


def test_a_diagnostic_needs_a_catalog_code_and_a_message() -> None:
    span = Span(SourceFile("mutant.spk", SOURCE), 2, 1, 2, 4)
    assert "SP9999" in diagnostic_problem(CompileError([Diagnostic("SP9999", "a message", span)]), SOURCE)
    assert diagnostic_problem(CompileError([Diagnostic("SP0301", " ", span)]), SOURCE) is not None
