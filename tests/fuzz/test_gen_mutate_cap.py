"""The mutation fuzzer's tile cap (tests/fuzz/gen_mutate.py, docs/testing.md): a mutant whose tiles
grow past 2**17 elements (up to SP0344's 2**20) has the sizes it drew halved until they fit; every
other mutant is exactly what it was drawn as."""

from __future__ import annotations

import pytest

from sparsile.tests.fuzz import gen_mutate
from sparsile.tests.fuzz.gen_runner import largest_tile


@pytest.mark.parametrize("spec", [("sparse", 156, 2656), ("plain", 283, 2283)])
def test_a_mutant_with_a_huge_tile_is_capped(spec: tuple[str, int, int]) -> None:
    """The two sweep timeouts of docs/testing.md (a 1 x 65536 x 16 box, a 2**20-element tile):
    their drawn size is halved to 2**17 elements, and the step says so."""
    m = gen_mutate.make_mutant(*spec)
    assert largest_tile(m) == gen_mutate.TILE_CAP
    assert m.steps[-1].startswith("cap: halved to")
    assert "1048576 -> 131072" in m.steps[-1]


def test_other_mutants_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutants of both generators drawn with and without the cap: the same text, constexprs and
    steps, except the capped ones, whose drawn tiles are over 2**17 elements."""
    specs = [(gen, ms % 500, ms) for gen in ("plain", "sparse") for ms in (*range(2250, 2300), *range(2630, 2680))]
    capped = [gen_mutate.make_mutant(*s) for s in specs]
    cap = gen_mutate.TILE_CAP
    monkeypatch.setattr(gen_mutate, "TILE_CAP", gen_mutate.MAX_TILE)
    drawn = [gen_mutate.make_mutant(*s) for s in specs]
    changed = 0
    for c, d in zip(capped, drawn, strict=True):
        if (c.source, c.consts, c.steps) != (d.source, d.consts, d.steps):
            changed += 1
            size = largest_tile(d)
            assert size is not None and cap < size <= gen_mutate.MAX_TILE, d.name
            assert c.steps[:-1] == d.steps and c.steps[-1].startswith("cap:")
    assert changed >= 2  # (plain:283:2283 and sparse:156:2656 among them)
