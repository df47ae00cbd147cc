"""The tagged metadata buffer that encoders return and launchers check."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import OperandType, operand_type
from .layouts import pad_sizes


@dataclass(frozen=True, eq=False)
class MetadataBuffer:
    """Sparse metadata in one format, tagged with what it was encoded for.

    ``data`` is the array a kernel consumes (uint32 words for "sm90"/"tcgen05", the uint8 index
    array for "logical"); ``fmt`` and ``dtype`` (canonical operand name) say how it was laid out,
    and ``m``, ``k`` are the logical, unpadded operand sizes. A launcher compares the tag with what
    the kernel was compiled for (:func:`validate_metadata`), which catches metadata encoded for
    another operand width, the mistake an untagged array cannot reveal. ``np.asarray(buffer)``
    gives ``data``.

    The buffer is immutable, ``data`` included: it is held as a read-only view, because launchers
    validate the words once per buffer and keep one device copy of them (``gemm_operands``), so an
    edit in place would reach neither check nor GPU. To change metadata, encode a new buffer (or
    ``MetadataBuffer(buffer.data.copy(), ...)`` after editing the copy).
    """

    data: np.ndarray
    fmt: str
    dtype: str
    m: int
    k: int

    def __post_init__(self) -> None:
        if isinstance(self.data, np.ndarray) and self.data.flags.writeable:
            frozen = self.data.view()
            frozen.flags.writeable = False
            object.__setattr__(self, "data", frozen)

    @property
    def operand(self) -> OperandType:
        return operand_type(self.dtype)

    @property
    def width_class(self) -> str:
        return self.operand.width_class

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def padded(self) -> tuple[int, int]:
        """(Mp, Kp): the operand sizes this buffer covers after padding."""
        return pad_sizes(self.fmt, self.operand, self.m, self.k)

    def __array__(self, dtype: object = None, copy: bool | None = None) -> np.ndarray:
        if dtype is None:
            return self.data.copy() if copy else self.data
        return self.data.astype(dtype, copy=bool(copy) or self.data.dtype != np.dtype(dtype))

    def __repr__(self) -> str:
        return (f"MetadataBuffer(fmt={self.fmt!r}, dtype={self.dtype!r}, m={self.m}, k={self.k}, "
                f"shape={self.shape}, data.dtype={self.data.dtype})")
