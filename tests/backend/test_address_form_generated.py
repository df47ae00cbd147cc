"""The constant-offset address form (backend/lower/address_form.py) on generated programs: every
register of every pointer tile of a few random kernels of both program generators, for sm_90a and
sm_80, under run-time values near the i32 wrap (program ids, row strides, scalars), is the
interpreter's address at its coordinates (tests/backend/address_fuzz.py; a sweep over many seeds:
``python -m sparsile.tests.backend.address_fuzz --seeds A:B``, docs/testing.md)."""

from __future__ import annotations

import pytest

from sparsile.backend.lower import memory
from sparsile.tests.backend.address_fuzz import Tally, check_program, scenarios
from sparsile.tests.support.program_gen import generate
from sparsile.tests.support.program_gen_sparse import generate_sparse

PLAIN = (1, 3, 7, 12, 19, 37)
SPARSE = (2, 5, 6)


def test_generated_programs_every_register_address_is_the_interpreters() -> None:
    """A fixed set of seeds: no mismatch, and the check does check (pointer tiles in loops among
    them, every scenario, both targets)."""
    tally = Tally()
    for seed in PLAIN:
        check_program("plain", seed, tally)
    for seed in SPARSE:
        check_program("sparse", seed, tally)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.programs == len(PLAIN) + len(SPARSE)
    assert tally.tiles >= 150 and tally.compiles >= 30, tally.line()
    assert tally.skipped <= tally.tiles // 4, tally.line()


def test_the_scenarios_reach_the_wrap() -> None:
    """The scenarios put program ids and strides next to 2**31 (a 1-D program, a 2-D one with a row
    stride, a sparse GEMM with a run-time ``LDA``)."""
    names = {s[0] for s in scenarios(generate(3), 3)}
    assert {"generated", "pid", "stride", "scalars"} <= names
    pid = next(s for s in scenarios(generate(3), 3) if s[0] == "pid")
    assert {p[0] * 8 for p in pid[2]} == {(1 << 31) - 8, 1 << 31}  # program_id(0) * R, R = 8
    sparse = scenarios(generate_sparse(5), 5)
    stride = next(s for s in sparse if s[0] == "stride")
    assert stride[1]["M"] == 1 and abs(stride[1]["LDA"]) >= 1 << 22


@pytest.mark.parametrize("gen, seed", [("plain", 19), ("sparse", 5)])
def test_the_sweep_sees_a_wrong_plan(monkeypatch: pytest.MonkeyPatch, gen: str, seed: int) -> None:
    """The sweep itself: where the plan swaps two registers' constant offsets, a generated program
    (the sparse one: its pointer tiles inside the K loop) is reported."""
    orig = memory.address_plan

    def swapped(*a: object) -> list[tuple[int, int]] | None:
        plan = orig(*a)
        if plan is not None and len(plan) > 2:
            plan[1], plan[2] = plan[2], plan[1]
        return plan

    monkeypatch.setattr(memory, "address_plan", swapped)
    tally = Tally()
    check_program(gen, seed, tally, ("sm_90a",))
    assert any("IR addresses" in f for f in tally.failures), tally.line()
