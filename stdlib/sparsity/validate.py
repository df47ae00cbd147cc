"""Checking a metadata buffer against what a kernel expects, before it reaches the GPU.

What is rejected, each with its own SP08xx code:

* a buffer tagged with another format (SP0810) or another operand width class (SP0809): e.g.
  metadata formatted for 16-bit operands handed to an 8-bit kernel. Its words are all valid
  nibbles, so only the tag (or the shape) can reveal it, which is why encoders return a tagged
  :class:`MetadataBuffer`;
* a raw array whose shape is not the one (fmt, dtype, m, k) requires (SP0805), naming the operand
  types whose shape it does have;
* the wrong element type (SP0806);
* undefined nibbles (SP0807): 0x0, 0x5, 0xA, 0xF (an index used twice; PTX ISA 9.7.15.6.1 and
  9.7.14.6.1, docs/hardware.md §3), and for tf32 anything but 0x4 and 0xE (PTX ISA
  9.7.16.10.8.1). A tf32 buffer full of other 2:4 codes is reported as formatted for another
  width (SP0809);
* unordered pairs (SP0808), idx0 > idx1: ``mma.sp::ordered_metadata`` requires order and the
  encoders never produce them. With ``allow_unordered=True`` they pass for "sm90" (wgmma.sp only
  forbids the four undefined values) and only 0x6 passes for "tcgen05", the one unordered value
  the tcgen05 text lists (PTX ISA 9.7.16.10.8.2; docs/hardware.md §3 advises against it).

Padding is checked too: the hardware reads it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .buffer import MetadataBuffer
from .dtypes import OPERAND_TYPES, WIDTH_CLASSES, OperandType, class_members, operand_type
from .errors import (
    SP_META_ELEMENT_TYPE,
    SP_META_SHAPE,
    SP_MISSING_SIZE,
    SP_UNDEFINED_NIBBLE,
    SP_UNORDERED_PAIR,
    SP_WRONG_FORMAT,
    SP_WRONG_WIDTH,
    SparsityError,
)
from .hostarray import as_host_array, checked_flag, checked_size
from .indexrules import check_index_values, require_index_shape, require_index_type
from .layouts import check_format, check_supported, metadata_shape, nibbles_from_words, word_position

UNDEFINED_NIBBLES = (0x0, 0x5, 0xA, 0xF)
UNORDERED_NIBBLES = (0x1, 0x2, 0x3, 0x6, 0x7, 0xB)
ORDERED_NIBBLES = (0x4, 0x8, 0xC, 0x9, 0xD, 0xE)
TF32_NIBBLES = (0x4, 0xE)
TCGEN05_UNORDERED_NIBBLES = (0x6,)

_SCAN_HALVES = 1 << 16
"""16-bit halves looked up per step of :func:`_words_valid` (the index temporaries stay in cache)."""


def _class_phrase(op: OperandType) -> str:
    return f"{op.width_class} operands ({', '.join(class_members(op.width_class))})"


def check_tag(meta: MetadataBuffer, fmt: str | None, dtype: str | OperandType | None,
              m: int | None, k: int | None) -> None:
    """Check that a metadata buffer's tag (format, operand width class, M x K) matches what the
    caller expects (``None``: anything); raises ``SparsityError`` otherwise. The bits are not read."""
    if fmt is not None and check_format(fmt) != meta.fmt:
        raise SparsityError(SP_WRONG_FORMAT,
                            f"metadata is in the {meta.fmt!r} format but {fmt!r} is expected",
                            help=f"encode it with encode_metadata(indices, {fmt!r}, dtype={meta.dtype!r})")
    if dtype is not None:
        want = operand_type(dtype)
        have = meta.operand
        if want.width_class != have.width_class:
            raise SparsityError(
                SP_WRONG_WIDTH,
                f"metadata formatted for {_class_phrase(have)} used with a {want.width_class} kernel "
                f"({want.name}); the {meta.fmt} layout differs between operand widths",
                help=f"re-encode with encode_metadata(indices, {meta.fmt!r}, dtype={want.name!r})",
            )
    for name, want_size, have_size in (("m", m, meta.m), ("k", k, meta.k)):
        if want_size is not None and int(want_size) != have_size:
            raise SparsityError(SP_MISSING_SIZE,
                                f"metadata was encoded for an operand with {name} = {have_size}, "
                                f"but {name} = {want_size} is expected",
                                help="encode the metadata of the operand the kernel is launched with")


def _matching_types(fmt: str, shape: tuple[int, ...], m: int, k: int) -> list[str]:
    """Width classes whose ``fmt`` metadata for (m, k) has ``shape`` (to explain a mismatch)."""
    found = []
    for width_class in WIDTH_CLASSES:
        op = OPERAND_TYPES[class_members(width_class)[0]]
        if fmt == "sm90" and width_class == "4-bit":
            continue
        if metadata_shape(fmt, op, m, k) == shape:
            found.append(f"{width_class} ({', '.join(class_members(width_class))})")
    return found


def _check_array(data: np.ndarray, fmt: str, op: OperandType, m: int, k: int) -> np.ndarray:
    if fmt == "logical":  # (the rules encode_metadata applies too: :mod:`.indexrules`)
        require_index_shape(data, op, m, k)
        require_index_type(data)
        return data
    expected = metadata_shape(fmt, op, m, k)
    if tuple(data.shape) != expected:
        others = _matching_types(fmt, tuple(data.shape), m, k)
        hint = f"; that is the shape of {fmt} metadata for {' and '.join(others)} operands" if others else ""
        raise SparsityError(
            SP_META_SHAPE,
            f"{fmt} metadata for a {m}x{k} {op.name} operand must have shape {expected}, found "
            f"{tuple(data.shape)}{hint}",
            help=f"encode it with encode_metadata(indices, {fmt!r}, dtype={op.name!r}) for this operand",
        )
    if data.dtype.kind not in "iu" or data.dtype.itemsize != 4:
        raise SparsityError(SP_META_ELEMENT_TYPE, f"{fmt} metadata must be uint32 words, found {data.dtype}",
                            help="pass the array produced by encode_metadata() (or its .data)")
    if data.dtype == np.uint32 and data.flags.c_contiguous:
        return data
    return np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("=")).view(np.uint32)  # (the words' values)


def _where(fmt: str, op: OperandType, m: int, k: int, row: int, chunk: int) -> str:
    g = op.group
    text = f"row {row}, group {chunk} (K {g * chunk}..{g * chunk + g - 1})"
    if fmt != "logical":
        index, slot = word_position(fmt, op, row, chunk)
        text += f", word {list(index)} bits {4 * slot}..{4 * slot + 3}"
    if row >= m or chunk >= -(-k // g):
        text += " (padding)"
    return text


def _first(mask: np.ndarray) -> tuple[int, int, int]:
    hits = np.argwhere(mask)
    return int(hits[0][0]), int(hits[0][1]), len(hits)


def _check_nibbles(grid: np.ndarray, fmt: str, op: OperandType, m: int, k: int, allow_unordered: bool) -> None:
    def fail(code: str, mask: np.ndarray, what: str, help: str) -> SparsityError:
        row, chunk, count = _first(mask)
        nibble = int(grid[row, chunk])
        more = f" ({count - 1} more such nibbles)" if count > 1 else ""
        return SparsityError(code, f"{what} 0x{nibble:X} at {_where(fmt, op, m, k, row, chunk)}{more}", help=help)

    if op.width_class == "tf32":
        bad = ~np.isin(grid, TF32_NIBBLES)
        if bad.any():
            if np.isin(grid, ORDERED_NIBBLES).all():
                raise fail(SP_WRONG_WIDTH, bad,
                           "metadata looks formatted for 2:4 operands (16-bit or 8-bit), not tf32: nibble", help=(
                               f"re-encode with encode_metadata(indices, {fmt!r}, dtype='tf32'); tf32 chunks "
                               "only use 0x4 (keep element 0) and 0xE (keep element 1)"))
            raise fail(SP_UNDEFINED_NIBBLE, bad, "undefined tf32 metadata nibble",
                       help="tf32 (1:2) nibbles must be 0x4 or 0xE (PTX ISA 9.7.16.10.8.1)")
        return
    undefined = np.isin(grid, UNDEFINED_NIBBLES)
    if undefined.any():
        raise fail(SP_UNDEFINED_NIBBLE, undefined, "undefined metadata nibble",
                   help="0x0, 0x5, 0xA and 0xF name one index twice; an all-zero chunk is 0x4 (0,1). "
                        "Re-encode with encode_metadata()")
    unordered = np.isin(grid, UNORDERED_NIBBLES)
    if not allow_unordered:
        if unordered.any():
            raise fail(SP_UNORDERED_PAIR, unordered,
                       f"unordered metadata nibble (idx0 > idx1) in {fmt} metadata:",
                       help="store idx0 < idx1 (mma.sp::ordered_metadata requires it); pass "
                            "allow_unordered=True only for a consumer that accepts unordered pairs")
    elif fmt == "tcgen05":
        not_listed = unordered & ~np.isin(grid, TCGEN05_UNORDERED_NIBBLES)
        if not_listed.any():
            raise fail(SP_UNDEFINED_NIBBLE, not_listed,
                       "metadata nibble not defined for tcgen05.mma.sp (only 0x6 of the unordered pairs is):",
                       help="store idx0 < idx1")


def accepted_nibbles(op: OperandType, fmt: str, allow_unordered: bool) -> frozenset[int]:
    """The nibble values :func:`validate_metadata` accepts in ``fmt`` words of ``op`` operands."""
    if op.width_class == "tf32":
        return frozenset(TF32_NIBBLES)
    if not allow_unordered:
        return frozenset(ORDERED_NIBBLES)
    if fmt == "sm90":
        return frozenset(range(16)) - frozenset(UNDEFINED_NIBBLES)
    return frozenset(ORDERED_NIBBLES) | frozenset(TCGEN05_UNORDERED_NIBBLES)


@lru_cache(maxsize=8)
def _half_table(accepted: frozenset[int]) -> np.ndarray:
    """65536 booleans: entry h is True when all four nibbles of the 16-bit value h are accepted."""
    ok = np.zeros(16, dtype=bool)
    ok[list(accepted)] = True
    halves = np.arange(1 << 16, dtype=np.uint32)
    table = ok[halves & 0xF] & ok[(halves >> 4) & 0xF] & ok[(halves >> 8) & 0xF] & ok[halves >> 12]
    table.flags.writeable = False
    return table


def _words_valid(words: np.ndarray, accepted: frozenset[int]) -> bool:
    """Whether every nibble of every word (padding included) is in ``accepted``: a table lookup per
    16-bit half, in cache-sized steps. Only a buffer that fails it is unpacked into the nibble grid
    (:func:`_check_nibbles`), which locates the first bad nibble for the message."""
    table = _half_table(accepted)
    halves = np.ascontiguousarray(words, dtype=np.uint32).reshape(-1).view(np.uint16)
    for start in range(0, halves.size, _SCAN_HALVES):
        if not table[halves[start:start + _SCAN_HALVES]].all():
            return False
    return True


def validate_metadata(meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None,
                      m: int | None = None, k: int | None = None, *,
                      allow_unordered: bool = False) -> MetadataBuffer:
    """Check ``meta`` against the format, operand type and sizes a kernel expects; return it as a
    tagged :class:`MetadataBuffer`.

    ``meta`` is a :class:`MetadataBuffer` (its tag is compared with ``fmt``/``dtype``/``m``/``k``
    where given) or a raw array (then ``fmt`` and ``dtype`` are required, and ``m`` and ``k`` too
    except for "logical", where they default to the array's). Raises :class:`SparsityError`.
    """
    data, fmt, op, m, k = checked_metadata(meta, fmt, dtype, m, k, allow_unordered=allow_unordered)
    if isinstance(meta, MetadataBuffer) and meta.data is data:
        return meta
    return MetadataBuffer(data, fmt, op.name, m, k)


def checked_metadata(meta: Any, fmt: str | None = None, dtype: str | OperandType | None = None,
                     m: int | None = None, k: int | None = None, *,
                     allow_unordered: bool = False) -> tuple[np.ndarray, str, OperandType, int, int]:
    """:func:`validate_metadata`'s checks without the buffer it returns (whose constructor copies
    a raw array's words): (the checked host words, format, operand type, m, k). For a launch that
    checks raw host words on every call (``sparse_matmul`` with raw words, the interpreter)."""
    allow_unordered = checked_flag(allow_unordered, "allow_unordered")  # ("no" would loosen the check)
    if isinstance(meta, MetadataBuffer):
        checked_size(meta.m, "MetadataBuffer.m")  # a tag built by hand: its sizes and words checked
        checked_size(meta.k, "MetadataBuffer.k")  # as a raw array's are
        check_tag(meta, fmt, dtype, m, k)
        fmt, op, m, k = meta.fmt, meta.operand, meta.m, meta.k
        data = meta.data if isinstance(meta.data, np.ndarray) else as_host_array(meta.data, "metadata")
    else:
        if fmt is None or dtype is None:
            raise SparsityError(SP_MISSING_SIZE, "a raw metadata array needs fmt= and dtype= to be checked",
                                help="pass the MetadataBuffer returned by encode_metadata(), or give "
                                     "fmt, dtype, m and k")
        fmt = check_format(fmt)
        op = operand_type(dtype)
        data = as_host_array(meta, "metadata")
        if fmt == "logical":
            require_index_shape(data, op)  # (rank and slots, before the sizes are read from it)
            m = data.shape[0] if m is None else m
            k = data.shape[1] * op.group if k is None else k
        if m is None or k is None:
            raise SparsityError(SP_MISSING_SIZE,
                                f"a raw {fmt} metadata array needs the operand sizes m= and k=",
                                help="pass m and k of the sparse operand (logical, unpadded)")
    check_supported(fmt, op)
    m, k = checked_size(m, "m"), checked_size(k, "k")
    data = _check_array(data, fmt, op, m, k)
    if fmt == "logical":
        check_index_values(data, op, allow_unordered=allow_unordered)
        data = np.ascontiguousarray(data, dtype=np.uint8)
    elif not _words_valid(data, accepted_nibbles(op, fmt, allow_unordered)):
        _check_nibbles(nibbles_from_words(data, fmt, op), fmt, op, m, k, allow_unordered)
    return data, fmt, op, m, k
