"""Text pictures of layouts and the cell mapping handed to sparsile.stdlib.viz."""

from __future__ import annotations

import pytest

from sparsile.frontend.layout.library import (
    blocked,
    mma_sp_fragment,
    smem_tile,
    tmem_accumulator,
    tmem_sparse_metadata,
    wgmma_sparse_metadata,
)
from sparsile.frontend.layout.pictures import hardware_label, layout_picture, placement_cells


def grid(picture: str) -> list[list[str]]:
    """Cells of a picture (skipping the two header lines and the column index line)."""
    rows = []
    for line in picture.splitlines()[3:]:
        if line.startswith("("):
            continue
        rows.append(line.split()[1:])
    return rows


def test_mma_accumulator_picture_labels_thread_and_register():
    cells = grid(layout_picture(mma_sp_fragment("c")))
    assert len(cells) == 16 and all(len(r) == 8 for r in cells)
    # docs/hardware.md §4.4: c0,c1 = (g, 2t..2t+1); c2,c3 = (g+8, ..)
    for m in range(16):
        for n in range(8):
            g, t = m % 8, n // 2
            assert cells[m][n] == f"t{4 * g + t}:r{2 * (m // 8) + n % 2}"


def test_tmem_metadata_picture_shows_lane_column_and_nibble():
    cells = grid(layout_picture(tmem_sparse_metadata(128, 32, "f16"), max_rows=16))
    assert cells[0][:5] == ["L0:c0.0", "L0:c0.1", "L0:c0.2", "L0:c0.3", "L8:c0.0"]
    assert cells[8][0] == "L0:c0.4"  # row 8 shares the cell of row 0, high half


def test_replication_and_unused_positions():
    picture = layout_picture(wgmma_sparse_metadata("f16", 0), max_rows=2)
    assert grid(picture)[0][0] == "t0:r0.0*"  # the other thread pair holds an ignored copy
    half = layout_picture(tmem_accumulator(64, 8))
    assert "L16" not in half  # unused lanes are not part of the tensor
    assert grid(half)[16][0] == "L32:c0"
    small = blocked((4,), (1,), (32,), (1,), (0,))
    assert grid(layout_picture(small)) == [["t0:r0*", "t1:r0*", "t2:r0*", "t3:r0*"]]


def test_picture_truncates_and_labels_smem():
    picture = layout_picture(smem_tile(64, 64, 16, "128B"), max_rows=4, max_cols=10, title="A tile")
    assert picture.splitlines()[0] == "A tile"
    assert "(showing 4 of 64 rows and 10 of 64 columns)" in picture
    cells = grid(picture)
    assert cells[1][0] == "o72"  # row 1, chunk 0 lands at chunk 1 (128B swizzle)
    assert hardware_label(smem_tile(8, 8, 16, "none"), {"offset": 5}) == "o5"


@pytest.mark.parametrize("layout", [mma_sp_fragment("a"), tmem_sparse_metadata(128, 64, "tf32"),
                                    tmem_accumulator(64, 16), smem_tile(16, 64, 16, "64B")])
def test_placement_cells_agree_with_apply(layout):
    cells = placement_cells(layout)
    names = [n for n in layout.out_names if n != "unused"]
    expected = 1
    for n in names:
        expected *= layout.out_size(n)
    assert len(cells) == expected or "reg" in layout.in_names
    for (y, x), (row, col) in cells.items():
        if "col" in layout.in_names:        # TMEM: y = lane, x = sub + S*col
            s = layout.in_size("sub")
            point = {"lane": y, "col": x // s, "sub": x % s}
            got = layout.apply(**{k: v for k, v in point.items() if k in layout.in_names})
        elif "offset" in layout.in_names:   # SMEM: x = offset
            got = layout.apply(offset=x)
        else:                               # registers: y = lane + 32*warp, x = sub + S*reg
            s = layout.in_size("sub")
            got = layout.apply(**{k: v for k, v in
                                  {"lane": y % 32, "warp": y // 32, "reg": x // s, "sub": x % s}.items()
                                  if k in layout.in_names})
        flat_row = 0
        for n in names[:-1]:
            flat_row = flat_row * layout.out_size(n) + got[n]
        assert (flat_row, got[names[-1]]) == (row, col)


def test_placement_cells_feed_stdlib_viz():
    viz = pytest.importorskip("sparsile.stdlib.viz")
    render = getattr(viz, "render_placement", None)
    if render is None:
        pytest.skip("sparsile.stdlib.viz has no render_placement yet")
    cells = placement_cells(tmem_sparse_metadata(128, 32, "f16"))
    text = render(cells, "lane", "column", "f16 metadata in TMEM")
    assert isinstance(text, str) and text
