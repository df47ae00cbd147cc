"""The linear address form of generic ``load_tile`` / ``store_tile`` boxes (backend/lower/tile_address.py)
on generated programs: every register of every box of a few random kernels of the sparse program
generator (3-D tensors read and written at boxes hanging over every edge), for sm_90a and sm_80,
under run-time values near the i32 wrap, with the linear form forced on every box it applies to
(``linear_above=0``: the generated boxes are small), is in bounds exactly where the interpreter's
element is and there at its address (tests/backend/address_fuzz.py; a sweep: ``python -m
sparsile.tests.backend.address_fuzz --gen sparse --seeds A:B --linear-above 0``)."""

from __future__ import annotations

from typing import Any

import pytest

from sparsile.backend.lower import tile_address
from sparsile.tests.backend.address_fuzz import Tally, check_program

SEEDS = (0, 3, 4, 8, 11)


def test_generated_boxes_every_register_is_the_interpreters() -> None:
    """A fixed set of seeds: no mismatch, and the check does check boxes in the linear form."""
    tally = Tally()
    for seed in SEEDS:
        check_program("sparse", seed, tally, linear_above=0)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.boxes >= 20 and tally.linear >= 10, tally.line()
    assert tile_address.LINEAR_ABOVE == 128  # (restored)


def test_the_sweep_sees_a_wrong_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep itself: a linear form that swaps two registers' pointers is reported."""
    orig = tile_address.linear_tile_addresses

    def swapped(*a: Any) -> tuple[list, list]:
        ptrs, preds = orig(*a)
        if len(ptrs) > 2:
            ptrs[1], ptrs[2] = ptrs[2], ptrs[1]
        return ptrs, preds

    monkeypatch.setattr(tile_address, "linear_tile_addresses", swapped)
    tally = Tally()
    for seed in SEEDS:
        check_program("sparse", seed, tally, ("sm_90a",), linear_above=0)
    assert any("IR addresses" in f for f in tally.failures), tally.line()
