"""Issue 15 item 7: ``sparsile layout`` draws only the shown cells (it used to build the layout's
whole table: 12.5 s and 3.7 GB for a 2-row picture, MemoryError tracebacks for huge layouts), and
refuses absurd arguments as usage errors."""

from __future__ import annotations

import io
import random
import tracemalloc

import numpy as np
import pytest

from sparsile.cli import EXIT_OK, EXIT_USAGE, main
from sparsile.frontend.layout import library as L
from sparsile.frontend.layout.layouts import UNUSED_DIM, LinearLayout
from sparsile.frontend.layout.pictures import _first_holder, _solver, layout_picture


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), stdout=out, stderr=err), out.getvalue(), err.getvalue()


def _reference(layout: LinearLayout) -> dict[tuple[int, ...], tuple[int, int]]:
    """(first holder, holder count) of each logical point, by enumerating the whole layout."""
    table = layout.table().reshape(-1, len(layout.out_dims))
    names = list(layout.out_names)
    found: dict[tuple[int, ...], tuple[int, int]] = {}
    for i, row in enumerate(table):
        if UNUSED_DIM in names and row[names.index(UNUSED_DIM)]:
            continue
        key = tuple(int(v) for n, v in zip(names, row, strict=True) if n != UNUSED_DIM)
        first, count = found.get(key, (i, 0))
        found[key] = (first, count + 1)
    return found


def _random_layout(rng: random.Random) -> LinearLayout:
    ins = {d: [(rng.randrange(8), rng.randrange(4), rng.randrange(2)) for _ in range(rng.randint(0, 3))]
           for d in ("reg", "lane", "warp")[:rng.randint(1, 3)]}
    return LinearLayout.from_bases(ins, [("a", 8), ("b", 4), (UNUSED_DIM, 2)])


def test_solver_matches_enumeration() -> None:
    rng = random.Random(7)
    layouts = [_random_layout(rng) for _ in range(200)]
    layouts += [L.wgmma_accumulator(64), L.smem_tile(64, 64, 16), L.wgmma_sparse_metadata("e4m3"),
                L.blocked([16, 32], [1, 4], [4, 8], [2, 2], [1, 0])]
    for layout in layouts:
        ref = _reference(layout)
        solver = _solver(layout)
        names = [n for n in layout.out_names if n != UNUSED_DIM]
        shifts = dict(zip(layout.out_names, solver[2], strict=True))
        for point in np.ndindex(*[layout.out_size(n) for n in names]):
            target = 0
            for n, v in zip(names, point, strict=True):
                target |= int(v) << shifts[n]
            assert _first_holder(solver, target) == ref.get(tuple(point), (-1, 0)), (layout, point)


def test_two_rows_of_a_huge_layout_are_cheap() -> None:
    layout = L.tmem_accumulator(128, 1 << 22)  # the whole table: 2^29 points, several GB
    tracemalloc.start()
    try:
        text = layout_picture(layout, max_rows=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
    lines = text.splitlines()
    assert lines[3].split()[:3] == ["0", "L0:c0", "L0:c1"] and lines[4].split()[:3] == ["1", "L1:c0", "L1:c1"]
    assert lines[-1] == "(showing 2 of 128 rows and 32 of 4194304 columns)"


def test_cli_draws_a_layout_of_2_to_the_40_rows() -> None:
    code, out, err = run("layout", "smem_tile(1099511627776, 64, 16)", "--max-rows", "2")
    assert code == EXIT_OK, err
    assert out.splitlines()[-1] == "(showing 2 of 1099511627776 rows and 32 of 64 columns)"


@pytest.mark.parametrize(("argv", "message"), [
    (["layout", "smem_tile(9223372036854775808, 64, 16)"],
     "error: `smem_tile` argument 9223372036854775808 is too large: layout sizes go up to 2**62\n"),
    (["layout", "blocked([64, 2**70], [1, 1], [1, 32], [1, 4], [1, 0])"],
     "error: layout constructor arguments must be literals (numbers, strings, tuples)\n"),
    (["layout", "blocked([64, 18446744073709551616], [1, 1], [1, 32], [1, 4], [1, 0])"],
     "error: `blocked` argument 18446744073709551616 is too large: layout sizes go up to 2**62\n"),
])
def test_huge_arguments_are_usage_errors(argv: list[str], message: str) -> None:
    code, _, err = run(*argv)
    assert code == EXIT_USAGE and err == message


@pytest.mark.parametrize("rows", ["0", "-3", "4097", "many"])
def test_max_rows_out_of_range_is_usage(rows: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run("layout", "wgmma_accumulator(64)", "--max-rows", rows)
    assert code == EXIT_USAGE
    assert "sparsile layout: error: argument --max-rows: " in capsys.readouterr().err
