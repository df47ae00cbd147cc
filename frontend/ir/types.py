"""The type system of the kernel language.

Values are scalars (:class:`ScalarType`, :class:`PointerType`), tiles (:class:`TileType`: a
power-of-two-shaped block of scalars or pointers, distributed over the threads of a program by a
layout chosen at layout inference), global tensors (:class:`TensorType`: pointer, shape and strides
given at launch), or references into on-chip memory (:class:`SmemType`, :class:`TmemType`,
:class:`BarrierType`). Compile-time constants never become IR values: sema folds them.

Promotion rules (``docs/language.md`` §Types repeats them):

1. A Python literal is *weakly typed*: ``x + 1`` keeps the type of ``x`` (an int literal next to a
   float value becomes that float type; a float literal next to an int value gives ``f32``).
2. Two integer types: the wider width wins; at equal width, signed + unsigned is unsigned (C).
3. Two float types: the wider wins; ``f16`` with ``bf16`` gives ``f32``; 8-bit floats promote to
   ``f16`` with ``f16`` and to ``bf16`` with ``bf16`` (and to ``f32`` otherwise).
4. Integer with float: the float type (``i32 + f16`` is ``f16``).
5. ``bool`` behaves as an integer of width 1 in arithmetic (promoted to ``i32``).
6. ``/`` on integers gives ``f32``; ``//`` and ``%`` on integers round toward zero (C, PTX, Triton),
   both at compile time and at run time, so folding never changes a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np


class Type:
    """Base of all types. Types are immutable and compared by value."""

    def __str__(self) -> str:  # pragma: no cover - overridden
        return self.__class__.__name__


@dataclass(frozen=True)
class ScalarType(Type):
    """A scalar element type: ``kind`` is ``"int"``, ``"uint"``, ``"float"`` or ``"bool"``."""

    name: str
    kind: str
    bits: int

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint", "bool")

    @property
    def is_signed(self) -> bool:
        return self.kind == "int"

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def bytes(self) -> int:
        return max(1, self.bits // 8)

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self)

    def __str__(self) -> str:
        return self.name

    def __call__(self, value: bool | int | float) -> TypedConstant:
        """``u8(250)`` evaluated by Python (a @jit kernel's constexpr default, a constexpr argument, a
        module constant a @jit kernel reads): the typed constant, which sema converts as the same
        ``u8(250)`` in a kernel (docs/language.md rule 8). A NumPy (or ml_dtypes) bool, integer or
        float of at most 64 bits is taken as its Python number, which holds it exactly
        (``f32(np.float32(1.5))`` was a constant no kernel could use, SP0329)."""
        if isinstance(value, np.generic) and value.dtype.kind in "biuf" and value.dtype.itemsize <= 8:
            value = value.item()
        return TypedConstant(value, self)


@dataclass(frozen=True)
class TypedConstant:
    """``dtype(value)`` written in Python: the typed constant a kernel sees (its value converted to
    ``dtype`` by sema, frontend/sema/consts.py, ``typed_constant``)."""

    value: bool | int | float
    dtype: ScalarType

    def __repr__(self) -> str:
        return f"{self.dtype}({self.value!r})"


bool_ = ScalarType("bool", "bool", 1)
i8 = ScalarType("i8", "int", 8)
i16 = ScalarType("i16", "int", 16)
i32 = ScalarType("i32", "int", 32)
i64 = ScalarType("i64", "int", 64)
u8 = ScalarType("u8", "uint", 8)
u16 = ScalarType("u16", "uint", 16)
u32 = ScalarType("u32", "uint", 32)
u64 = ScalarType("u64", "uint", 64)
f16 = ScalarType("f16", "float", 16)
bf16 = ScalarType("bf16", "float", 16)
f32 = ScalarType("f32", "float", 32)
f64 = ScalarType("f64", "float", 64)
tf32 = ScalarType("tf32", "float", 32)
e4m3 = ScalarType("e4m3", "float", 8)
e5m2 = ScalarType("e5m2", "float", 8)

SCALAR_TYPES: dict[str, ScalarType] = {
    t.name: t for t in (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64, tf32, e4m3, e5m2)
}
# Accepted spellings in kernels (``float16`` as in numpy/torch, ``int1`` as in Triton).
ALIASES: dict[str, ScalarType] = {
    "int1": bool_, "int8": i8, "int16": i16, "int32": i32, "int64": i64,
    "uint8": u8, "uint16": u16, "uint32": u32, "uint64": u64,
    "float16": f16, "bfloat16": bf16, "float32": f32, "float64": f64,
    "float8_e4m3": e4m3, "float8e4nv": e4m3, "float8_e4m3fn": e4m3, "float8_e5m2": e5m2, "float8e5": e5m2,
    "s8": i8, "s32": i32,
}


def scalar_type(name: str) -> ScalarType | None:
    return SCALAR_TYPES.get(name) or ALIASES.get(name)


def numpy_dtype(t: ScalarType) -> np.dtype:
    """The host dtype that holds values of ``t`` (``ml_dtypes`` for bf16 and 8-bit floats; tf32 is
    held as float32)."""
    import ml_dtypes

    table = {
        "bool": np.dtype(np.bool_), "i8": np.dtype(np.int8), "i16": np.dtype(np.int16),
        "i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "u8": np.dtype(np.uint8),
        "u16": np.dtype(np.uint16), "u32": np.dtype(np.uint32), "u64": np.dtype(np.uint64),
        "f16": np.dtype(np.float16), "f32": np.dtype(np.float32), "f64": np.dtype(np.float64),
        "tf32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
        "e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "e5m2": np.dtype(ml_dtypes.float8_e5m2),
    }
    return table[t.name]


def from_numpy_dtype(dt: np.dtype) -> ScalarType | None:
    """The scalar type of a host array's dtype, or None if the language has no such type."""
    dt = np.dtype(dt)
    name = dt.name
    table = {
        "bool": bool_, "int8": i8, "int16": i16, "int32": i32, "int64": i64, "uint8": u8,
        "uint16": u16, "uint32": u32, "uint64": u64, "float16": f16, "float32": f32, "float64": f64,
        "bfloat16": bf16, "float8_e4m3fn": e4m3, "float8_e5m2": e5m2,
    }
    return table.get(name)


@dataclass(frozen=True)
class PointerType(Type):
    """A pointer to ``elem`` in the global address space."""

    elem: ScalarType
    space: str = "global"

    def __str__(self) -> str:
        return f"ptr[{self.elem}]"


@dataclass(frozen=True)
class TileType(Type):
    """A tile: ``shape`` (each dimension a power of two) of ``elem`` (a scalar or pointer type)."""

    elem: ScalarType | PointerType
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def with_elem(self, elem: ScalarType | PointerType) -> TileType:
        return TileType(elem, self.shape)

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"tile<{dims}x{self.elem}>"


@dataclass(frozen=True)
class TensorType(Type):
    """A global tensor of ``rank`` dimensions: a pointer plus shape and strides given at launch.
    The launcher builds TMA tensor maps for the boxes the kernel reads and writes."""

    elem: ScalarType
    rank: int

    def __str__(self) -> str:
        return f"tensor[{self.elem}, {self.rank}]"


@dataclass(frozen=True)
class SmemType(Type):
    """A buffer in shared memory: ``shape`` of ``elem`` with a ``swizzle`` span in bytes (0 = none).
    ``pitch``: for a view narrower than its buffer's rows (a slice of an unswizzled buffer along its
    last dimension), the elements from one row to the next; 0 when the rows are contiguous."""

    elem: ScalarType
    shape: tuple[int, ...]
    swizzle: int = 0
    pitch: int = 0

    @property
    def strided(self) -> bool:
        """Whether the view's rows are not contiguous (a slice along the last dimension): what the
        hardware reads or writes as whole rows (TMA boxes, MMA descriptors) cannot take it."""
        return len(self.shape) >= 2 and bool(self.pitch) and self.pitch != self.shape[-1]

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.elem.bits // 8

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        sw = f", swizzle={self.swizzle}" if self.swizzle else ""
        pitch = f", pitch={self.pitch}" if self.strided else ""
        return f"smem<{dims}x{self.elem}{sw}{pitch}>"


@dataclass(frozen=True)
class TmemType(Type):
    """A region of tensor memory (Blackwell): ``shape`` (rows = lanes, columns) of ``elem``;
    ``kind`` says what it holds: ``"acc"``, ``"a"`` (packed operand), ``"meta"`` (sparse metadata
    for operands of ``meta_bits`` width) or ``"scale"``."""

    elem: ScalarType
    shape: tuple[int, ...]
    kind: str = "acc"
    meta_bits: int = 0

    def __str__(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        extra = f", meta{self.meta_bits}" if self.kind == "meta" else ""
        return f"tmem<{dims}x{self.elem}, {self.kind}{extra}>"


@dataclass(frozen=True)
class BarrierType(Type):
    """An array of ``count`` mbarriers in shared memory."""

    count: int = 1

    def __str__(self) -> str:
        return f"mbarrier[{self.count}]"


@dataclass(frozen=True)
class TokenType(Type):
    """An opaque value ordering asynchronous operations (e.g. a wgmma group)."""

    what: str = "token"

    def __str__(self) -> str:
        return f"!{self.what}"


@dataclass(frozen=True)
class ConstexprType(Type):
    """The annotation ``constexpr``: the parameter is a compile-time constant."""

    def __str__(self) -> str:
        return "constexpr"

    def __call__(self, value: Any) -> Any:
        """Triton's ``BLOCK = tl.constexpr(8)`` for a module constant, written ``sp.constexpr(8)``
        and evaluated by Python: the value itself (a kernel that reads it folds that constant)."""
        return value


CONSTEXPR = ConstexprType()


class NotAValueTypeError(TypeError):
    """:func:`element_type` of a type that has no elements (a tensor descriptor, a shared-memory
    buffer, an mbarrier): in sema, a user's argument of the wrong kind (SP0252 at the expression)."""

    def __init__(self, t: Type):
        self.type = t
        super().__init__(str(t))


def element_type(t: Type) -> ScalarType | PointerType:
    """The per-element type of a scalar, pointer or tile type (NotAValueTypeError otherwise)."""
    if isinstance(t, TileType):
        return t.elem
    if not isinstance(t, ScalarType | PointerType):
        raise NotAValueTypeError(t)
    return t


def shape_of(t: Type) -> tuple[int, ...]:
    return t.shape if isinstance(t, TileType) else ()


def with_shape(elem: ScalarType | PointerType, shape: tuple[int, ...]) -> Type:
    return TileType(elem, shape) if shape else elem


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


class Promotion:
    """Binary promotion of element types (rules 2-5 in the module docstring)."""

    _FLOAT_RANK: ClassVar[dict[str, int]] = {"e4m3": 0, "e5m2": 0, "f16": 1, "bf16": 1, "f32": 2, "tf32": 2,
                                             "f64": 3}

    @staticmethod
    def binary(a: ScalarType, b: ScalarType) -> ScalarType:
        if a == b:
            return i32 if a.is_bool else a
        if a.is_float and b.is_float:
            ra, rb = Promotion._FLOAT_RANK[a.name], Promotion._FLOAT_RANK[b.name]
            if ra == rb:  # f16 with bf16, e4m3 with e5m2, f32 with tf32
                return f32 if ra <= 2 else f64
            hi, _lo = (a, b) if ra > rb else (b, a)
            return hi
        if a.is_float:
            return a
        if b.is_float:
            return b
        # integers (bool counts as a 1-bit integer, promoted to i32)
        if a.is_bool and b.is_bool:
            return i32
        if a.is_bool:
            return b if b.bits >= 32 else Promotion.binary(i32, b)
        if b.is_bool:
            return a if a.bits >= 32 else Promotion.binary(a, i32)
        if a.bits != b.bits:
            return a if a.bits > b.bits else b
        return a if a.kind == "uint" else b

    @staticmethod
    def with_literal(t: ScalarType, value: object) -> ScalarType:
        """The type of ``t op literal`` (rule 1: literals are weakly typed)."""
        if isinstance(value, bool):
            return t if not t.is_bool else bool_
        if isinstance(value, int):
            return i32 if t.is_bool else t
        if isinstance(value, float):
            return t if t.is_float else f32
        return t


def literal_type(value: object) -> ScalarType:
    """The type a Python literal gets when it must become a value on its own: ``i32`` for an integer
    that fits, else ``i64``, else ``u64`` (``2**63`` to ``2**64 - 1``; an integer beyond both is
    reported against the nearer one: ``u64`` above, ``i64`` below)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return i32
        return u64 if value >= 2**63 else i64
    if isinstance(value, float):
        return f32
    raise TypeError(value)


def literals_type(values: tuple[object, ...]) -> ScalarType | None:
    """The one type that several untyped literals take together where nothing else gives a type
    (``where(c, 2**63, 1)``, the two branches of a run-time ``if``): ``f32`` when one is a float,
    ``bool`` when all are bools, else the first of ``i32``, ``i64`` and ``u64`` that holds every one
    (a bool counts as 0 or 1), so that each literal alone would get a type no wider (:func:`literal_type`).
    None when no integer type holds them all (``2**63`` with ``-1``)."""
    if any(isinstance(v, float) for v in values):
        return f32
    if all(isinstance(v, bool) for v in values):
        return bool_
    ints = [int(v) for v in values]  # type: ignore[call-overload]
    for t in (i32, i64, u64):
        if all(fits(v, t) for v in ints):
            return t
    return None


def fits(value: int, t: ScalarType) -> bool:
    """Whether the integer ``value`` is representable in the integer type ``t``."""
    if t.is_bool:
        return value in (0, 1)
    if t.kind == "uint":
        return 0 <= value < 2**t.bits
    return -(2 ** (t.bits - 1)) <= value < 2 ** (t.bits - 1)
