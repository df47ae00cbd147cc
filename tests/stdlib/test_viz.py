"""Placement pictures: text, PNG/SVG files, and the error without matplotlib."""

from __future__ import annotations

import sys

import pytest

from sparsile.stdlib import viz
from sparsile.stdlib.sparsity import SparsityError


def test_render_placement_text():
    cells = {(0, 0): (0, 0), (0, 1): (8, 0), (1, 0): (0, 4)}
    text = viz.render_placement(cells, "lane", "slot", "demo", col_group=0)
    lines = text.splitlines()
    assert lines[0] == "demo"
    assert lines[-2].split(":")[1].split() == ["0,0", "8,0"]
    assert lines[-1].split(":")[1].split() == ["0,4", "."]


def test_render_placement_truncates():
    cells = {(y, x): (y, x) for y in range(10) for x in range(10)}
    text = viz.render_placement(cells, max_rows=3, max_cols=4, col_group=2)
    assert "(10 x 10 positions, 3 x 4 shown)" in text
    assert "|" in text


def test_empty_placement_is_an_error():
    with pytest.raises(SparsityError) as info:
        viz.render_placement({})
    assert info.value.code == "SP0817"


def test_metadata_picture_tcgen05_f16_shows_row_pairs():
    text = viz.metadata_picture("tcgen05", "f16", 16, 32)
    lane0 = next(line for line in text.splitlines() if line.strip().startswith("0 :"))
    assert lane0.split(":")[1].split() == ["0,0", "0,1", "0,2", "0,3", "8,0", "8,1", "8,2", "8,3"]
    lane8 = next(line for line in text.splitlines() if line.strip().startswith("8 :"))
    assert lane8.split(":")[1].split()[:4] == ["0,4", "0,5", "0,6", "0,7"]


@pytest.mark.parametrize("fmt, dtype", [("sm90", "f16"), ("sm90", "e4m3"), ("tcgen05", "e2m1"),
                                        ("tcgen05", "tf32"), ("logical", "u8")])
def test_metadata_picture_every_format(fmt, dtype):
    text = viz.metadata_picture(fmt, dtype, 16, 256, max_rows=4)
    assert fmt in text.splitlines()[0] and dtype in text.splitlines()[0]
    assert "0,0" in text


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_save_placement_files(tmp_path, suffix):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"meta{suffix}"
    text = viz.metadata_picture("sm90", "f16", 16, 32, path)
    assert "0,0" in text
    assert path.exists() and path.stat().st_size > 1000
    if suffix == ".svg":
        assert path.read_text().lstrip().startswith("<?xml")


def test_bad_suffix(tmp_path):
    with pytest.raises(SparsityError) as info:
        viz.save_placement({(0, 0): (0, 0)}, tmp_path / "x.jpg")
    assert info.value.code == "SP0817"


def test_missing_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(SparsityError) as info:
        viz.save_placement({(0, 0): (0, 0)}, tmp_path / "x.png")
    assert info.value.code == "SP0816"
    assert info.value.message == "drawing PNG or SVG pictures needs matplotlib, which is not installed"
    # installs as README.md does, from the checkout (the viz extra), or matplotlib alone
    assert info.value.help == ("install matplotlib>=3.8: `pip install -e '.[viz]'` in the sparsile checkout, or "
                               "`pip install 'matplotlib>=3.8'`; render_placement() gives text without it")
    assert "0,0" in viz.metadata_picture("logical", "f16", 1, 4)  # text still works
