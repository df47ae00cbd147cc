"""Whether an array's own elements share memory, from its shape and byte strides: the one test the
interpreter (a written argument, SP0750) and the standard library (an ``out=``, SP0804) ask. A copy
back into such an array keeps one of the values written to each shared address, silently."""

from __future__ import annotations

import numpy as np

EXACT_OVERLAP_CHECK = 1 << 22
"""Elements up to which :func:`self_overlapping` compares every element's address when the strides
alone do not show the elements apart (an ``as_strided`` view); a larger such array is taken as
overlapping."""


def self_overlapping(shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether two elements of an array of ``shape`` and ``byte_strides`` (any sign) share a byte.
    Any array made by slicing, transposing or reversing a dense one passes the first test (each
    stride, smallest first, reaches past everything the smaller ones span); others (``as_strided``)
    are decided element by element up to :data:`EXACT_OVERLAP_CHECK` elements, beyond which they
    count as overlapping."""
    if any(n == 0 for n in shape):
        return False
    dims = sorted((abs(int(st)), int(n)) for n, st in zip(shape, byte_strides, strict=True) if n > 1)
    reach = itemsize
    for stride, n in dims:
        if stride < reach:
            break
        reach += stride * (n - 1)
    else:
        return False
    if np.prod([n for _, n in dims], dtype=np.float64) > EXACT_OVERLAP_CHECK:
        return True
    offsets = np.zeros(1, np.int64)
    for stride, n in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * stride).reshape(-1)
    offsets.sort()
    return bool((np.diff(offsets) < itemsize).any())
