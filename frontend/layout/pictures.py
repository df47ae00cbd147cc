"""Pictures of layouts: a text grid of the logical tensor labelled with the hardware position
holding each element, and a cell mapping for ``sparsile.stdlib.viz``.

Labels by kind of layout (detected from the input dims):

- registers (``reg``/``lane``/``warp``): ``t37:r2`` = thread 37 (``lane + 32·warp``), register 2
  (``r2.5`` adds the sub-word position 5; ``@b1`` the CTA);
- tensor memory (``col``): ``L17:c3`` = TMEM lane 17, column 3 (``c3.5`` adds the position in
  the 32-bit cell; ``@x1`` the CTA of the pair);
- shared memory (``offset``): ``o130``;
- anything else: ``name=value`` pairs.

An element held by several hardware positions (replication) shows its first holder with ``*``;
an element no position holds shows ``.``.  This module does not depend on ``viz``: it only
produces plain data (strings and dicts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .hardware_dims import BLOCK, COL, CTA, LANE, OFFSET, REG, SUB, WARP
from .layouts import UNUSED_DIM, LinearLayout


def _kind(layout: LinearLayout) -> str:
    names = set(layout.in_names)
    if OFFSET in names:
        return "smem"
    if COL in names:
        return "tmem"
    if names & {REG, WARP} or names == {LANE}:
        return "registers"
    return "generic"


def hardware_label(layout: LinearLayout, point: dict[str, int]) -> str:
    """The short label of one hardware point of ``layout`` (see the module docstring)."""
    kind = _kind(layout)
    if kind == "smem":
        return f"o{point[OFFSET]}"
    sub = f".{point[SUB]}" if layout.in_size(SUB) > 1 else ""
    if kind == "tmem":
        cta = f"@x{point[CTA]}" if layout.in_size(CTA) > 1 else ""
        return f"L{point.get(LANE, 0)}:c{point.get(COL, 0)}{sub}{cta}"
    if kind == "registers":
        thread = point.get(LANE, 0) + layout.in_size(LANE) * point.get(WARP, 0)
        block = f"@b{point[BLOCK]}" if layout.in_size(BLOCK) > 1 else ""
        return f"t{thread}:r{point.get(REG, 0)}{sub}{block}"
    return ",".join(f"{n}={v}" for n, v in point.items())


def _logical_grid(layout: LinearLayout) -> tuple[list[str], int, int]:
    """Logical dims (without ``unused``), number of grid rows and columns (last dim = columns)."""
    dims = [(n, s) for n, s in layout.out_dims if n != UNUSED_DIM]
    if not dims:
        return [], 1, 1
    cols = dims[-1][1]
    rows = 1
    for _, s in dims[:-1]:
        rows *= s
    return [n for n, _ in dims], rows, cols


def _holders(layout: LinearLayout) -> tuple[np.ndarray, np.ndarray, list[str], int, int]:
    """For every logical grid cell: the flat input index of its first holder (-1: none) and the
    number of holders."""
    names, rows, cols = _logical_grid(layout)
    table = layout.table().reshape(-1, len(layout.out_dims))
    out_names = list(layout.out_names)
    keep = np.ones(len(table), dtype=bool)
    if UNUSED_DIM in out_names:
        keep = table[:, out_names.index(UNUSED_DIM)] == 0
    flat = np.zeros(len(table), dtype=np.int64)
    for n in names:
        flat = flat * layout.out_size(n) + table[:, out_names.index(n)]
    first = np.full(rows * cols, -1, dtype=np.int64)
    count = np.zeros(rows * cols, dtype=np.int64)
    idx = np.nonzero(keep)[0]
    np.add.at(count, flat[idx], 1)
    # first holder = smallest input index: assign in reverse so the smallest wins
    first[flat[idx[::-1]]] = idx[::-1]
    return first, count, names, rows, cols


def _solver(layout: LinearLayout) -> tuple[list[tuple[int, int, int]], list[int], list[int]]:
    """GF(2) elimination of the layout's matrix: (image basis as (pivot bit, vector, input
    combination) with distinct pivots, the kernel in reduced echelon form (highest bit first),
    output bit offsets). Input bits are numbered as the flat row-major input index of
    :func:`_point` (first dim most significant), outputs as the dims in order, first lowest."""
    out_shift = _out_offsets(layout)
    columns: list[tuple[int, int]] = []  # (image, input bit)
    in_shift = 0
    for (_, size), row in reversed(list(zip(layout.in_dims, layout.bases, strict=True))):
        for b, basis in enumerate(row):
            image = 0
            for c, sh in zip(basis, out_shift, strict=True):
                image |= c << sh
            columns.append((image, 1 << (in_shift + b)))
        in_shift += size.bit_length() - 1
    image_basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (vector, input combination)
    kernel: list[int] = []
    for v, combo in columns:
        while v:
            top = v.bit_length() - 1
            if top not in image_basis:
                image_basis[top] = (v, combo)
                break
            w, c = image_basis[top]
            v, combo = v ^ w, combo ^ c
        else:
            kernel.append(combo)
    reduced: dict[int, int] = {}  # kernel in reduced echelon form: pivot bit -> vector
    for k in kernel:
        for top in sorted(reduced, reverse=True):
            if k >> top & 1:
                k ^= reduced[top]
        if k:
            top = k.bit_length() - 1
            for t in list(reduced):
                if reduced[t] >> top & 1:
                    reduced[t] ^= k
            reduced[top] = k
    basis = [(top, v, c) for top, (v, c) in image_basis.items()]
    return sorted(basis, reverse=True), [reduced[t] for t in sorted(reduced, reverse=True)], out_shift


def _out_offsets(layout: LinearLayout) -> list[int]:
    shifts, s = [], 0
    for _, size in layout.out_dims:
        shifts.append(s)
        s += size.bit_length() - 1
    return shifts


def _first_holder(solver: tuple[list[tuple[int, int, int]], list[int], list[int]],
                  target: int) -> tuple[int, int]:
    """(smallest flat input index mapping to the flat output ``target``, number of such inputs);
    (-1, 0) when no input does."""
    basis, kernel, _ = solver
    x = 0
    for top, v, c in basis:
        if target >> top & 1:
            target, x = target ^ v, x ^ c
    if target:
        return -1, 0
    for k in kernel:  # reduced echelon: clearing each pivot bit in turn gives the minimum
        if x >> (k.bit_length() - 1) & 1:
            x ^= k
    return x, 1 << len(kernel)


def _shown_holders(layout: LinearLayout, names: list[str], cols: int, shown_r: int, shown_c: int
                   ) -> tuple[list[list[int]], list[list[int]]]:
    """First holder and holder count of each shown cell, found by solving the layout's linear
    system per cell (never enumerating the layout: a 2-row picture of a huge layout is cheap)."""
    solver = _solver(layout)
    shifts = dict(zip(layout.out_names, solver[2], strict=True))
    sizes = [layout.out_size(n) for n in names]
    first = [[-1] * shown_c for _ in range(shown_r)]
    count = [[0] * shown_c for _ in range(shown_r)]
    for r in range(shown_r):
        base, rest = 0, r
        for n, size in zip(reversed(names[:-1]), reversed(sizes[:-1]), strict=True):
            base |= (rest % size) << shifts[n]
            rest //= size
        for c in range(shown_c):
            target = base | (c << shifts[names[-1]]) if names else base
            first[r][c], count[r][c] = _first_holder(solver, target)
    return first, count


def _point(layout: LinearLayout, flat_index: int) -> dict[str, int]:
    """Input point of a row-major flat index over the input dims (first dim slowest)."""
    point = {}
    for name, size in reversed(layout.in_dims):
        point[name] = flat_index % size
        flat_index //= size
    return dict(reversed(list(point.items())))


def layout_picture(layout: LinearLayout, *, title: str | None = None, max_rows: int = 64,
                   max_cols: int = 32) -> str:
    """A text grid of the logical tensor (rows = all but the last logical dim, flattened
    row-major; columns = the last dim), each cell showing its hardware position."""
    names, rows, cols = _logical_grid(layout)
    shown_r, shown_c = min(rows, max_rows), min(cols, max_cols)
    first, count = _shown_holders(layout, names, cols, shown_r, shown_c)
    cells = []
    for r in range(shown_r):
        row = []
        for c in range(shown_c):
            if first[r][c] < 0:
                row.append(".")
            else:
                label = hardware_label(layout, _point(layout, first[r][c]))
                row.append(label + ("*" if count[r][c] > 1 else ""))
        cells.append(row)
    width = max([len(x) for row in cells for x in row] + [len(str(shown_c - 1))])
    row_w = len(str(rows - 1))
    lines = []
    head = title or f"layout over {' x '.join(f'{n}:{layout.out_size(n)}' for n in names)}"
    lines.append(head)
    lines.append(f"rows: {' x '.join(names[:-1]) or '-'}; columns: {names[-1] if names else '-'}; "
                 "* = replicated, . = not held")
    lines.append(" " * (row_w + 1) + " ".join(f"{c:>{width}}" for c in range(shown_c)))
    for r, row in enumerate(cells):
        lines.append(f"{r:>{row_w}} " + " ".join(f"{x:>{width}}" for x in row))
    if shown_r < rows or shown_c < cols:
        lines.append(f"(showing {shown_r} of {rows} rows and {shown_c} of {cols} columns)")
    return "\n".join(lines)


def _default_axes(layout: LinearLayout) -> tuple[list[str], list[str]]:
    kind = _kind(layout)
    present = set(layout.in_names)
    if kind == "registers":
        return [d for d in (LANE, WARP, BLOCK) if d in present], [d for d in (SUB, REG) if d in present]
    if kind == "tmem":
        return [d for d in (LANE, CTA) if d in present], [d for d in (SUB, COL) if d in present]
    if kind == "smem":
        return [], [OFFSET]
    names = list(layout.in_names)
    return names[1:2], names[:1]


def placement_cells(layout: LinearLayout, y_dims: Sequence[str] | None = None,
                    x_dims: Sequence[str] | None = None) -> dict[tuple[int, int], tuple[int, int]]:
    """``{(y, x): (row, col)}``: hardware position to logical position, for
    ``sparsile.stdlib.viz.render_placement``/``save_placement``.

    ``y``/``x`` flatten ``y_dims``/``x_dims`` with the first listed dim fastest (defaults:
    registers y = thread ``lane + 32·warp``, x = ``sub + S·reg``; TMEM y = lane, x = ``sub + S·col``;
    SMEM y = 0, x = offset).  ``row`` flattens all logical dims but the last row-major, ``col`` is
    the last.  Unused TMEM positions are left out.
    """
    dy, dx = _default_axes(layout)
    y_dims = list(y_dims) if y_dims is not None else dy
    x_dims = list(x_dims) if x_dims is not None else dx
    names, _, _ = _logical_grid(layout)
    table = layout.table()
    out_names = list(layout.out_names)
    cells: dict[tuple[int, int], tuple[int, int]] = {}
    for index in np.ndindex(*[s for _, s in layout.in_dims]):
        point = dict(zip(layout.in_names, index))
        image = table[index]
        if UNUSED_DIM in out_names and image[out_names.index(UNUSED_DIM)]:
            continue

        def flat(dims: Sequence[str], point: dict[str, int] = point) -> int:
            v, scale = 0, 1
            for d in dims:
                v += point.get(d, 0) * scale
                scale *= layout.in_size(d)
            return v

        row = 0
        for n in names[:-1]:
            row = row * layout.out_size(n) + int(image[out_names.index(n)])
        col = int(image[out_names.index(names[-1])]) if names else 0
        cells[(flat(y_dims), flat(x_dims))] = (row, col)
    return cells


__all__ = ["hardware_label", "layout_picture", "placement_cells"]
