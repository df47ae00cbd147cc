"""Operand types of sparse MMA and the structured-sparsity rule each one follows.

Four width classes (PTX ISA 9.7.16.10.8 "Sparse Matrices", docs/hardware.md §1.2 and §3):

==========  ===================  ===========  ===========  ======================  ==============
class       dtypes               pattern      chunk (G)    one MMA instruction K   2 KB TMEM atom
==========  ===================  ===========  ===========  ======================  ==============
16-bit      f16, bf16            2:4          4 elements   32                      K = 128
tf32        tf32 (alias f32)     1:2          2 elements   16                      K = 64
8-bit       e4m3, e5m2, s8, u8   2:4          4 elements   64                      K = 128
4-bit       e2m1                 4:8 in pairs 8 elements   128                     K = 256
==========  ===================  ===========  ===========  ======================  ==============

Every chunk is described by one 4-bit nibble. For 2:4 its bits [1:0] and [3:2] are the positions
of the two kept elements; for 4:8 in pairs they are positions of two kept 2-element pairs; for 1:2
the hardware treats a tf32 chunk as a 2:4 chunk of 16-bit halves, so 0x4 keeps element 0 and 0xE
keeps element 1 (docs/hardware.md §3).

Host arrays use numpy's float16/float32/int8/uint8 and ml_dtypes' bfloat16, float8_e4m3fn,
float8_e5m2 and float4_e2m1fn (one 4-bit value per byte, in the low nibble).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import SP_UNKNOWN_DTYPE, SparsityError


@dataclass(frozen=True)
class Pattern:
    """A structured-sparsity rule: in every chunk of ``group`` consecutive elements along K, keep
    ``keep`` units of ``unit`` consecutive elements (PTX ISA 9.7.16.10.8.1-3)."""

    name: str
    group: int
    unit: int
    keep: int

    @property
    def units(self) -> int:
        """Units per chunk: the range of one logical index (4 for 2:4 and 4:8 pairs, 2 for 1:2)."""
        return self.group // self.unit

    @property
    def kept_elements(self) -> int:
        """Elements stored per chunk: always half the chunk."""
        return self.keep * self.unit


PATTERN_2_4 = Pattern("2:4", group=4, unit=1, keep=2)
PATTERN_1_2 = Pattern("1:2", group=2, unit=1, keep=1)
PATTERN_4_8_PAIRS = Pattern("4:8 in pairs", group=8, unit=2, keep=2)


@dataclass(frozen=True)
class OperandType:
    """One operand type of a sparse MMA and everything the metadata formats need to know about it.

    ``width_class`` is "16-bit", "tf32", "8-bit" or "4-bit"; operand types of one class share every
    metadata layout. ``instr_k`` is the logical K of one sparse MMA instruction and ``atom_k`` the
    logical K covered by one 2 KB (128 lanes x 4 columns) TMEM metadata atom (docs/hardware.md
    §1.2, §1.4). ``magnitude`` says how to read |x| from the element's bits: "sign-magnitude"
    (floats: clear the sign bit), "twos-complement" (s8) or "unsigned" (u8).
    """

    name: str
    width_class: str
    host_dtype: np.dtype
    pattern: Pattern
    instr_k: int
    atom_k: int
    bits: int
    magnitude: str

    @property
    def group(self) -> int:
        return self.pattern.group

    @property
    def chunks_per_instr(self) -> int:
        """Metadata nibbles per row per MMA instruction: 8 (16-bit, tf32) or 16 (8-bit, 4-bit)."""
        return self.instr_k // self.pattern.group

    @property
    def chunks_per_atom(self) -> int:
        """Nibbles per row of one tcgen05 atom: 4 columns x 8 nibbles = 32 for every class."""
        return self.atom_k // self.pattern.group

    @property
    def interleaved(self) -> bool:
        """True for 16-bit and tf32, whose 32-bit metadata word holds rows r and r+8 (§1.4, §4.2);
        8-bit and 4-bit words hold 8 nibbles of one row."""
        return self.width_class in ("16-bit", "tf32")

    @property
    def storage_dtype(self) -> np.dtype:
        """The unsigned integer type with the host element's size, used to work on raw bits."""
        return np.dtype(f"u{self.host_dtype.itemsize}")

    @property
    def magnitude_mask(self) -> int:
        """Bits of the magnitude of a sign-magnitude element (the sign bit cleared)."""
        return (1 << (self.bits - 1)) - 1

    def __str__(self) -> str:
        return self.name


def _op(name: str, width_class: str, host: object, pattern: Pattern, instr_k: int, atom_k: int,
        bits: int, magnitude: str = "sign-magnitude") -> OperandType:
    return OperandType(name, width_class, np.dtype(host), pattern, instr_k, atom_k, bits, magnitude)


OPERAND_TYPES: dict[str, OperandType] = {
    op.name: op
    for op in (
        _op("f16", "16-bit", np.float16, PATTERN_2_4, 32, 128, 16),
        _op("bf16", "16-bit", ml_dtypes.bfloat16, PATTERN_2_4, 32, 128, 16),
        _op("tf32", "tf32", np.float32, PATTERN_1_2, 16, 64, 32),
        _op("e4m3", "8-bit", ml_dtypes.float8_e4m3fn, PATTERN_2_4, 64, 128, 8),
        _op("e5m2", "8-bit", ml_dtypes.float8_e5m2, PATTERN_2_4, 64, 128, 8),
        _op("s8", "8-bit", np.int8, PATTERN_2_4, 64, 128, 8, "twos-complement"),
        _op("u8", "8-bit", np.uint8, PATTERN_2_4, 64, 128, 8, "unsigned"),
        _op("e2m1", "4-bit", ml_dtypes.float4_e2m1fn, PATTERN_4_8_PAIRS, 128, 256, 4),
    )
}
"""Every operand type by canonical name."""

ALIASES = {"f32": "tf32", "float16": "f16", "bfloat16": "bf16", "float32": "tf32", "int8": "s8",
           "uint8": "u8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn": "e2m1"}
"""Other spellings accepted for an operand type (f32 means tf32: the tensor core reads f32 as tf32)."""

WIDTH_CLASSES = ("16-bit", "tf32", "8-bit", "4-bit")

_BY_HOST_DTYPE = {op.host_dtype: op for op in reversed(OPERAND_TYPES.values())}


SPELLING_HINTS = {"fp16": "f16", "half": "f16", "bfloat": "bf16", "fp32": "f32", "fp8": "e4m3", "float8": "e4m3",
                  "e4m3fn": "e4m3", "fp4": "e2m1"}
"""Names sparsile does not take, with the one meant most often. "fp8" is refused rather than taken
as e4m3 (weights' fp8 in vLLM and torchao; e5m2 is fp8 too): the help suggests 'e4m3'."""


def spelling_hint(name: object) -> str | None:
    """``did you mean 'f16'?`` for a name of :data:`SPELLING_HINTS` (any case), else None."""
    meant = SPELLING_HINTS.get(name.strip().lower()) if isinstance(name, str) else None
    if meant is None:
        return None
    other = " (fp8 is e4m3 or e5m2; weights' fp8 is e4m3, float8_e4m3fn)" if meant == "e4m3" else ""
    return f"did you mean {meant!r}?{other}"


def dtype_object_name(dtype: object) -> str | None:
    """The name of a torch or numpy dtype object ("float16", "bfloat16", "float8_e4m3fn"), else None."""
    kind = type(dtype)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        return np.dtype(dtype).name
    return None


def operand_type(dtype: str | OperandType | object) -> OperandType:
    """The :class:`OperandType` named ``dtype`` ("f16", "bf16", "tf32" or "f32", "e4m3", "e5m2",
    "s8", "u8", "e2m1", or a name of :data:`ALIASES`), or of a torch / numpy dtype object of such a
    name (torch.float16, np.float16, torch.float8_e4m3fn); raises SP0801 for anything else."""
    if isinstance(dtype, OperandType):
        return dtype
    name = dtype if isinstance(dtype, str) else dtype_object_name(dtype)
    if name is not None:
        key = name.strip().lower()
        key = ALIASES.get(key, key)
        if key in OPERAND_TYPES:
            return OPERAND_TYPES[key]
    hint = spelling_hint(dtype)
    raise SparsityError(
        SP_UNKNOWN_DTYPE,
        f"unknown sparse operand dtype {dtype!r}",
        help=(f"{hint}; " if hint else "") + "use one of " + ", ".join(repr(n) for n in OPERAND_TYPES)
        + " ('f32' is an alias of 'tf32'; the numpy and torch names such as 'float16' work too)",
    )


def operand_type_of_array(array: np.ndarray) -> OperandType | None:
    """The operand type whose host dtype is ``array.dtype`` (float32 gives tf32), or None."""
    return _BY_HOST_DTYPE.get(array.dtype)


def class_members(width_class: str) -> tuple[str, ...]:
    """The operand type names of one width class, e.g. ("f16", "bf16") for "16-bit"."""
    return tuple(op.name for op in OPERAND_TYPES.values() if op.width_class == width_class)
