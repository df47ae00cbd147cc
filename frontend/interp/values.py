"""Run-time values of the interpreter.

Scalars and tiles are numpy arrays (0-d for scalars) of the host dtype of their element type
(``ml_dtypes`` for bf16 and 8-bit floats). Pointers are :class:`PtrVal`: a buffer plus element
offsets, so that every load and store is bounds-checked against the buffer the pointer came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..spans import Span


class InterpreterError(Exception):
    """A run-time fault found by the interpreter (out-of-bounds access, failed assert)."""

    def __init__(self, message: str, span: Span | None = None, program: tuple[int, ...] | None = None):
        where = f"{span}: " if span is not None and span.line > 0 else ""
        prog = f" (program {program})" if program is not None else ""
        super().__init__(f"{where}{message}{prog}")
        self.span = span
        self.program = program


@dataclass(eq=False)
class Buffer:
    """A kernel argument's memory: a flat host array that loads and stores index."""

    name: str
    data: np.ndarray  # 1-D view


@dataclass(eq=False)
class PtrVal:
    """A pointer (``off`` 0-d) or a tile of pointers into ``buf``; offsets are in elements."""

    buf: Buffer
    off: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.off.shape


@dataclass(eq=False)
class TensorVal:
    """A global tensor argument: a buffer viewed with a shape and element strides."""

    buf: Buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
