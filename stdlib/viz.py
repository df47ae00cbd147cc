"""Pictures of where logical elements live in hardware: text, PNG and SVG.

The core is generic, so that the layout algebra can draw any layout with it: a *placement* maps a
hardware position ``(y, x)`` (a TMEM lane and nibble column, a thread and register slot, ...) to
the logical ``(row, group)`` it holds. Cells are coloured by logical row (hue) and K group
(lightness) and labelled ``row,group``.

* :func:`render_placement` -> text (always available);
* :func:`save_placement` -> PNG or SVG by file suffix (needs matplotlib, imported lazily; a clear
  SP0816 error says how to install it);
* :func:`metadata_picture` draws one sparse-metadata format (docs/hardware.md §1.4, §4.2):
  "tcgen05" as TMEM lanes x nibble columns, "sm90" as warpgroup threads x register nibbles,
  "logical" as rows x groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..install_hints import install_hint
from .sparsity.dtypes import OperandType, operand_type
from .sparsity.errors import SP_VIZ_BAD_REQUEST, SP_VIZ_UNAVAILABLE, SparsityError
from .sparsity.layouts import check_format
from .sparsity.placement import hardware_placement, thread_placement

Cells = Mapping[tuple[int, int], tuple[int, int]]

MATPLOTLIB_REQUIREMENT = "matplotlib>=3.8"
"""What PNG and SVG pictures need (pyproject's ``viz`` extra)."""
EMPTY = "."
"""Text for a hardware position that holds nothing (padding, or an unused thread)."""


def _extent(cells: Cells) -> tuple[int, int]:
    if not cells:
        raise SparsityError(SP_VIZ_BAD_REQUEST, "nothing to draw: the placement has no cells",
                            help="pass a mapping from (y, x) positions to (row, group) pairs")
    return max(y for y, _ in cells) + 1, max(x for _, x in cells) + 1


def render_placement(cells: Cells, row_label: str = "y", col_label: str = "x", title: str = "", *,
                     col_group: int = 8, max_rows: int | None = None, max_cols: int | None = None) -> str:
    """A text grid: one line per y, one ``row,group`` label per x (``.`` where nothing lives),
    with ``|`` between groups of ``col_group`` columns (8 nibbles = one 32-bit word)."""
    rows, cols = _extent(cells)
    shown_rows = rows if max_rows is None else min(rows, max_rows)
    shown_cols = cols if max_cols is None else min(cols, max_cols)
    labels = {pos: f"{r},{g}" for pos, (r, g) in cells.items()}
    width = max(len(EMPTY), *(len(text) for text in labels.values()))
    gutter = max(len(row_label), len(str(shown_rows - 1)))

    def line(items: list[str]) -> str:
        parts = []
        for x, item in enumerate(items):
            if x and col_group > 1 and x % col_group == 0:
                parts.append("|")
            parts.append(item.rjust(width))
        return " ".join(parts).rstrip()

    out = [title] if title else []
    header = [str(x) if col_group <= 1 or x % col_group == 0 else "" for x in range(shown_cols)]
    out.append(f"{row_label.rjust(gutter)} \\ {col_label}")
    out.append(f"{'':>{gutter}}   {line(header)}".rstrip())
    for y in range(shown_rows):
        items = [labels.get((y, x), EMPTY) for x in range(shown_cols)]
        out.append(f"{y:>{gutter}} : {line(items)}")
    if shown_rows < rows or shown_cols < cols:
        out.append(f"({rows} x {cols} positions, {shown_rows} x {shown_cols} shown)")
    return "\n".join(out)


def _matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as exc:
        raise SparsityError(SP_VIZ_UNAVAILABLE, "drawing PNG or SVG pictures needs matplotlib, which is not installed",
                            help=f"{install_hint('viz', MATPLOTLIB_REQUIREMENT)}; render_placement() gives text "
                                 "without it") from exc
    return Figure, Rectangle


def _colour(row: int, group: int) -> tuple[float, float, float]:
    """Hue by logical row (20 distinct hues), lightness by K group (4 steps)."""
    palette = [
        (0.12, 0.47, 0.71), (1.0, 0.50, 0.05), (0.17, 0.63, 0.17), (0.84, 0.15, 0.16), (0.58, 0.40, 0.74),
        (0.55, 0.34, 0.29), (0.89, 0.47, 0.76), (0.50, 0.50, 0.50), (0.74, 0.74, 0.13), (0.09, 0.75, 0.81),
    ]
    base = palette[row % len(palette)]
    dark = (row // len(palette)) % 2
    lift = 0.15 * (group % 4) + (0.0 if dark else 0.1)
    return tuple(min(1.0, c * (0.8 if dark else 1.0) + (1.0 - c) * lift) for c in base)


def save_placement(cells: Cells, path: str | Path, row_label: str = "y", col_label: str = "x",
                   title: str = "", *, col_group: int = 8, annotate: bool | None = None) -> Path:
    """Draw ``cells`` to ``path`` (``.png`` or ``.svg``): one rectangle per position, coloured by
    logical row and K group, labelled ``row,group`` when the grid is small enough (or when
    ``annotate`` says so), with heavier lines between groups of ``col_group`` columns."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise SparsityError(SP_VIZ_BAD_REQUEST, f"cannot tell the picture format of {path.name!r}",
                            help="use a file name ending in .png or .svg")
    rows, cols = _extent(cells)
    figure_cls, rectangle = _matplotlib()
    if annotate is None:
        annotate = rows * cols <= 64 * 64
    fig = figure_cls(figsize=(min(40.0, 1.5 + 0.45 * cols), min(60.0, 1.2 + 0.28 * rows)))
    ax = fig.add_subplot(1, 1, 1)
    for (y, x), (row, group) in cells.items():
        ax.add_patch(rectangle((x, y), 1, 1, facecolor=_colour(row, group), edgecolor="white", linewidth=0.3))
        if annotate:
            ax.text(x + 0.5, y + 0.5, f"{row},{group}", ha="center", va="center", fontsize=5)
    if col_group:
        for x in range(0, cols + 1, col_group):
            ax.axvline(x, color="black", linewidth=0.8)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xlabel(col_label)
    ax.set_ylabel(row_label)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    return path


def metadata_placement(fmt: str, dtype: str | OperandType, m: int, k: int, *,
                       spsel: int = 0) -> tuple[dict[tuple[int, int], tuple[int, int]], str, str]:
    """(cells, row label, column label) of a metadata format, for drawing."""
    fmt = check_format(fmt)
    op = operand_type(dtype)
    if fmt == "sm90":
        return thread_placement(op, m, k, spsel), "thread", "8·k-step + nibble"
    if fmt == "tcgen05":
        return hardware_placement(fmt, op, m, k), "TMEM lane", "8·column + nibble"
    return hardware_placement(fmt, op, m, k), "row", "group"


def metadata_picture(fmt: str, dtype: str | OperandType, m: int, k: int, path: str | Path | None = None,
                     *, spsel: int = 0, max_rows: int | None = None, max_cols: int | None = None) -> str:
    """Text picture of where format ``fmt`` puts the metadata of an (m, k) ``dtype`` operand;
    also drawn to ``path`` (PNG/SVG) when given. Labels are ``row,group`` of the logical operand."""
    op = operand_type(dtype)
    cells, row_label, col_label = metadata_placement(fmt, op, m, k, spsel=spsel)
    title = f"{fmt} metadata, {op.name} ({op.width_class}, {op.pattern.name}), m={m}, k={k}"
    if fmt == "sm90" and op.interleaved:
        title += f", spsel={spsel}"
    if path is not None:
        save_placement(cells, path, row_label, col_label, title, col_group=8 if fmt != "logical" else 0)
    return render_placement(cells, row_label, col_label, title, col_group=8 if fmt != "logical" else 0,
                            max_rows=max_rows, max_cols=max_cols)
