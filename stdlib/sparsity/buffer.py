"""The tagged metadata buffer that encoders return and launchers check."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .dtypes import OperandType, operand_type
from .errors import SparsityError
from .hostarray import as_host_array, plain_array
from .layouts import pad_sizes

_OWNED: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
"""The read-only word arrays this module made (by ``id``): a buffer built over one of them (another
tag of a buffer's words, ``dataclasses.replace``) shares it without a copy, as nobody can write it."""


def _frozen(words: np.ndarray) -> np.ndarray:
    """A read-only view of ``words`` (an array nobody else holds), ``words`` and the arrays it views
    made read-only too so that numpy refuses to make the view writable again; the view is remembered
    as one this module made."""
    chain: list[np.ndarray] = [words]
    while isinstance(chain[-1].base, np.ndarray):
        chain.append(chain[-1].base)
    for array in reversed(chain):  # the owner first: a view's flag follows its base's
        array.flags.writeable = False
    view = words.view()
    _OWNED[id(view)] = view
    return view


def _is_array_object(x: object) -> bool:
    """An array of a library other than numpy (torch, cupy, JAX...): a DLPack, CUDA-array or numpy
    array-protocol producer. Lists and other objects are left to validation."""
    return any(hasattr(x, name) for name in ("__dlpack__", "__cuda_array_interface__", "__array_interface__",
                                             "__array__"))


def adopt_words(data: np.ndarray, fmt: str, dtype: str, m: int, k: int) -> MetadataBuffer:
    """A :class:`MetadataBuffer` over ``data`` without copying it: for an encoder handing over words it
    has just made and keeps no other reference to (a caller's array must go through the
    constructor, which copies it)."""
    return MetadataBuffer(_frozen(data) if isinstance(data, np.ndarray) else data, fmt, dtype, m, k)


@dataclass(frozen=True, eq=False)
class MetadataBuffer:
    """Sparse metadata in one format, tagged with what it was encoded for.

    ``data`` is the array a kernel consumes (uint32 words for "sm90"/"tcgen05", the uint8 index
    array for "logical"); ``fmt`` and ``dtype`` (canonical operand name) say how it was laid out,
    and ``m``, ``k`` are the logical, unpadded operand sizes. A launcher compares the tag with what
    the kernel was compiled for (:func:`validate_metadata`), which catches metadata encoded for
    another operand width, the mistake an untagged array cannot reveal. ``np.asarray(buffer)``
    gives ``data``.

    The buffer is immutable, ``data`` included, and owns its words: launchers validate the words
    once per buffer and keep one device copy of them (``gemm_operands``), so an edit would reach
    neither check nor GPU. A hand-built ``MetadataBuffer(words, ...)`` therefore copies ``words``
    (the caller's array stays the caller's: editing it later changes nothing here; byte-swapped
    words, ``dtype('>u4')``, are copied in the machine's byte order) and holds a read-only view of
    the copy, which numpy refuses to make writable again; words of another array
    type (a torch tensor, a CUDA one too, a cupy or JAX array) are copied to the host the same way.
    The encoders hand over words they made without a copy (:func:`adopt_words`). To change
    metadata, edit a copy (``np.asarray(buffer, copy=True)``) and tag it anew.
    """

    data: np.ndarray
    fmt: str
    dtype: str
    m: int
    k: int

    def __post_init__(self) -> None:
        data = self.data
        if not isinstance(data, np.ndarray) and _is_array_object(data):
            try:  # (a torch tensor's words stayed the caller's: an edit after a call met stale copies)
                data = as_host_array(data, "metadata")
            except SparsityError:  # kept as given: validation says what it is (as for a list or None)
                return
        if isinstance(data, np.ndarray) and _OWNED.get(id(data)) is not data:
            data = plain_array(data, "metadata")  # (native byte order: readers view the words as uint32)
            object.__setattr__(self, "data", _frozen(np.array(data, copy=True, order="K")))

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
