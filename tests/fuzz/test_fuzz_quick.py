"""A bounded, deterministic run of the mutation fuzzer (the long run is scripts/fuzz.py): mutants of
every shipped ``.spk`` through ``sparsile check``, and a few through compilation to PTX, must end
in a result or a located diagnostic, never an internal error or a traceback."""

from __future__ import annotations

import collections

import pytest

from .mutate import SOURCES, mutant
from .runner import DIAGNOSTIC, OK, run_check, run_compile, targets_for

HEAVY = "sparse_gemm_sm90.spk"  # 13 kernels: ten times the others' check time
CHECK_MUTANTS = 200
HEAVY_MUTANTS = 6
COMPILE_MUTANTS = [("vector_add.spk", 1), ("vector_add.spk", 2), ("softmax.spk", 2), ("transpose.spk", 2),
                   ("transpose.spk", 3), ("sparse_gemm_tile.spk", 3), ("sparse_gemm_tile.spk", 5)]
"""Mutants that compile to PTX (seeds 2, 3, 5) or not (seed 1) with this mutator."""


def test_mutants_through_check_end_in_a_result_or_a_diagnostic() -> None:
    outcomes: collections.Counter[str] = collections.Counter()
    bad = []
    light = [p for p in SOURCES if p.name != HEAVY]
    heavy = [p for p in SOURCES if p.name == HEAVY]
    jobs = [(light[s % len(light)], s) for s in range(CHECK_MUTANTS - HEAVY_MUTANTS)]
    jobs += [(heavy[0], s) for s in range(HEAVY_MUTANTS)]
    for path, seed in jobs:
        text, what = mutant(path, seed)
        outcome, detail = run_check(text, path.name, path.parent)
        outcomes[outcome] += 1
        if outcome not in (OK, DIAGNOSTIC):
            bad.append(f"{path.name}:{seed}:check ({what}): {outcome}\n{detail}")
    assert not bad, "\n\n".join(bad[:3])
    # the mutations reach both ends: some mutants still check, most are refused with a diagnostic
    assert outcomes[OK] > 0 and outcomes[DIAGNOSTIC] > CHECK_MUTANTS // 2, outcomes


@pytest.mark.parametrize(("name", "seed"), COMPILE_MUTANTS)
def test_mutants_compiled_to_ptx_end_in_a_result_or_a_diagnostic(name: str, seed: int) -> None:
    path = next(p for p in SOURCES if p.name == name)
    text, what = mutant(path, seed)
    outcome, detail = run_compile(text, targets_for(name), name, home=path.parent)
    assert outcome in (OK, DIAGNOSTIC), f"{name}:{seed}:compile ({what}): {outcome}\n{detail}"


def test_mutants_are_reproducible_from_file_and_seed() -> None:
    path = SOURCES[0]
    assert mutant(path, 7) == mutant(path, 7)
    assert mutant(path, 7) != mutant(path, 8)
