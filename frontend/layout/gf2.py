"""The bit arithmetic under the linear-layout algebra (``layouts.py``): power-of-two extents, with
the :class:`LayoutError` (a ``ValueError`` carrying an ``SP04xx`` code) that layout code raises, and
linear algebra over GF(2) on Python ints used as bit vectors (Gaussian elimination in
:class:`GF2Span`; Triton's LinearLayout, arXiv 2505.23819, §3).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..diagnostics import SparsileError


class LayoutError(SparsileError, ValueError):
    """A layout that cannot be built or an operation whose operands do not fit (codes SP04xx)."""


def log2_exact(n: int, what: str = "size") -> int:
    """``log2(n)`` for a positive power of two ``n``; :class:`LayoutError` SP0401 otherwise."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1 or n & (n - 1):
        raise LayoutError("SP0401", f"{what} must be a positive power of two, found {n!r}",
                          help="pad the extent to the next power of two (see padded_shape)")
    return int(n).bit_length() - 1


def next_power_of_two(n: int) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):  # 64.5 used to pass as 64
        raise LayoutError("SP0401", f"an extent must be an integer, found {n!r}")
    if n < 1:
        raise LayoutError("SP0401", f"extent must be positive, found {n}")
    return 1 << (int(n) - 1).bit_length()


def padded_shape(shape: Iterable[int]) -> tuple[int, ...]:
    """Each extent rounded up to a power of two: the shape a layout of ``shape`` is built over."""
    return tuple(next_power_of_two(s) for s in shape)


def is_power_of_two(n: int) -> bool:
    return isinstance(n, (int, np.integer)) and n >= 1 and not (n & (n - 1))


# --------------------------------------------------------------------------------------------
# GF(2) linear algebra on Python ints (bit vectors)
# --------------------------------------------------------------------------------------------

class GF2Span:
    """Incremental Gaussian elimination over GF(2).

    Columns are added in order; independent ones become pivots.  :meth:`solve` expresses a
    vector as an XOR of *pivot* columns (earliest independent columns), returned as a bit mask
    over column indices, or ``None`` when the vector is outside the span.
    """

    def __init__(self, columns: Iterable[int] = ()):
        self._rows: list[tuple[int, int, int]] = []  # (pivot bit, reduced vector, column mask)
        self.pivots: list[int] = []
        self._count = 0
        for c in columns:
            self.add(c)

    def _reduce(self, v: int) -> tuple[int, int]:
        combo = 0
        for pivot, vec, mask in self._rows:
            if v >> pivot & 1:
                v ^= vec
                combo ^= mask
        return v, combo

    def add(self, column: int) -> bool:
        """Add the next column; True if it was independent of the previous ones."""
        index = self._count
        self._count += 1
        v, combo = self._reduce(column)
        if v == 0:
            return False
        pivot = v.bit_length() - 1
        mask = combo ^ (1 << index)
        # keep rows fully reduced on their pivots so that _reduce works in one pass
        new_rows = []
        for p, vec, m in self._rows:
            if vec >> pivot & 1:
                vec ^= v
                m ^= mask
            new_rows.append((p, vec, m))
        new_rows.append((pivot, v, mask))
        self._rows = new_rows
        self.pivots.append(index)
        return True

    @property
    def rank(self) -> int:
        return len(self._rows)

    def contains(self, v: int) -> bool:
        return self._reduce(v)[0] == 0

    def solve(self, v: int) -> int | None:
        rest, combo = self._reduce(v)
        return combo if rest == 0 else None

    def basis(self) -> list[int]:
        """A fully reduced basis of the span (reduced row echelon form), highest pivot first."""
        return [vec for _, vec, _ in sorted(self._rows, key=lambda r: -r[0])]


def gf2_rank(columns: Iterable[int]) -> int:
    return GF2Span(columns).rank


def bit_list(v: int) -> list[int]:
    """Positions of the set bits of ``v``, lowest first."""
    out = []
    i = 0
    while v:
        if v & 1:
            out.append(i)
        v >>= 1
        i += 1
    return out


__all__ = ["GF2Span", "LayoutError", "bit_list", "gf2_rank", "is_power_of_two", "log2_exact", "next_power_of_two",
           "padded_shape"]
