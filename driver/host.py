"""Host-side helpers a Triton user calls around a launch (``triton.next_power_of_2``); docs/language.md,
"Coming from Triton". ``sparsile.cdiv`` works on the host too (frontend/ops/core.py)."""

from __future__ import annotations

import numbers


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for ``n <= 1``), as ``triton.next_power_of_2``: the
    block size that covers ``n`` elements (tile dimensions are powers of two)."""
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise TypeError(f"next_power_of_2 needs an integer, found {n!r}")
    return 1 << max(0, int(n) - 1).bit_length()
