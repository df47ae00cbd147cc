"""The mutation fuzzer's tile cap (tests/fuzz/gen_mutate.py, docs/testing.md): a mutant whose tiles
grow past 2**17 elements (up to SP0344's 2**20) has the sizes it drew halved until they fit; every
other mutant is exactly what it was drawn as."""

from __future__ import annotations

import types

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


TILE_NOT_DRAWN = '''
@kernel(num_warps=4)
def k(x: ptr[f32], out: ptr[f32], n: i32, S: constexpr, BLOCK: constexpr):
    offs = arange(0, BLOCK)
    v = load(x + offs, mask=offs < n, other=0.0)
    store(out + offs, v * S, mask=offs < n)
'''
"""A program whose tile (2**18 elements) is over the cap before any mutation: a large value the
mutator draws (``S``, ``other=``) does not size it."""


@pytest.mark.parametrize("mseed", [13, 70, 105])
def test_a_drawn_value_that_sizes_no_tile_is_kept(monkeypatch: pytest.MonkeyPatch, mseed: int) -> None:
    """Halving the drawn values does not shrink the tile: the mutant is returned as drawn (it had
    its ``S = 65536`` or ``other=1048576`` halved to 1, its source or constexprs changed with no
    ``cap`` step, the step text still naming the drawn value)."""
    program = types.SimpleNamespace(source=TILE_NOT_DRAWN, consts={"S": 3, "BLOCK": 2**18}, grid=(1, 1, 1))
    monkeypatch.setattr(gen_mutate, "generate", lambda gen, seed: program)
    capped = gen_mutate.make_mutant("plain", 0, mseed)
    monkeypatch.setattr(gen_mutate, "TILE_CAP", gen_mutate.MAX_TILE)
    drawn = gen_mutate.make_mutant("plain", 0, mseed)
    assert largest_tile(drawn) == 2**18 and any(v in " ".join(drawn.steps) for v in ("65536", "1048576", "4096"))
    assert (capped.source, capped.consts, capped.steps) == (drawn.source, drawn.consts, drawn.steps)
