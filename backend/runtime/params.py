"""The kernel's parameters as the launcher sees them: the parameter kinds (pointer, scalar,
constexpr, array-only, derived; tensor maps are ``tensormap.TensorMapParam``), the
:class:`ParamSpec`, the binding of a call's positional and keyword arguments
(:class:`ArgumentBinder`), and the parameter buffer the driver reads (:class:`ParamBuffer`).
Pure Python: unit-tested without a GPU."""

from __future__ import annotations

import ctypes
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ...frontend.diagnostics import InternalError, LaunchError
from ...frontend.ir import types as T
from ...frontend.sema.constexpr_dtypes import dtype_constexpr
from ...frontend.sema.consts import typed_constant
from ...frontend.sema.jit_globals import numpy_scalar_constant
from .codes import ARG_COUNT, ARG_KEYWORD, ARG_SHAPE
from .dtypes import dtype_info

if TYPE_CHECKING:
    from .arrays import ArrayInfo


@dataclass(frozen=True)
class PointerParam:
    """``ptr[dtype]``: passed as a 64-bit device address. ``aligned16``: the specialization
    assumed the address is a multiple of 16; ``readonly``: the kernel never stores through it (a
    host array is then not copied back); ``contiguous``: device arrays must be dense row-major."""

    name: str
    dtype: str
    aligned16: bool = False
    readonly: bool = False
    contiguous: bool = True
    kind: ClassVar[str] = "pointer"
    slot: ClassVar[tuple[int, int]] = (8, 8)


@dataclass(frozen=True)
class ScalarParam:
    """An integer or float scalar passed by value. ``divisible_by``: the specialization assumed
    the value is a multiple of it (1 = no assumption)."""

    name: str
    dtype: str
    divisible_by: int = 1
    kind: ClassVar[str] = "scalar"

    @property
    def slot(self) -> tuple[int, int]:
        size = dtype_info(self.dtype).itemsize
        return size, size


@dataclass(frozen=True)
class ConstexprParam:
    """A compile-time parameter: not passed to the kernel. The caller may omit it; if ``value``
    is set, a given argument must equal it (the kernel was specialized for that value)."""

    name: str
    value: Any = None
    kind: ClassVar[str] = "constexpr"


def constexpr_equal(value: Any, expected: Any) -> bool:
    """Whether a constexpr argument is the value a kernel was specialized (or a launch prepared)
    for: equal, and of the same kind element by element (``2`` is not ``2.0`` nor ``True``, ``0.0``
    is not ``-0.0``: each is another specialization, as in ``frontend/sema/specialize.py``; a numpy
    scalar is a typed constant of its own type, ``np.int8(3)`` neither ``3`` nor ``np.int16(3)``
    but the same as ``sp.i8(3)`` (``np.True_`` is ``True``), a list its tuple); a comparison that
    raises or gives no truth value counts as unequal."""
    try:
        return _same_constexpr(value, expected)
    except Exception:
        return False


@dataclass(frozen=True)
class _Typed:
    """A typed constant as sema has it (frontend/sema/specialize.py): its language type and value."""

    type_name: str
    value: bool | int | float


def _typed(v: Any) -> Any:
    """``v`` with a typed constant, ``sp.i8(3)`` or ``np.int8(3)`` (one constant: the i8 3), as
    :class:`_Typed`, a bool one (``np.True_``) as Python's bool, a dtype spelled otherwise
    (``np.float16``, ``np.dtype("float16")``, ``ml_dtypes.bfloat16``) as the language's type
    (``sp.f16``: one specialization, ``frontend/sema/specialize.py``); another value as it is. Raises
    for a typed constant that has no value (``sp.i8(1e300)``): unequal to any."""
    if isinstance(v, T.TypedConstant):
        c = typed_constant(v)
    elif isinstance(v, np.generic) and not isinstance(v, str | bytes) and not isinstance(v, np.bool_):
        c = numpy_scalar_constant(v)
        if c is None:  # a NumPy type the language has none for (np.complex64): its own kind
            return v
    else:
        dtype = dtype_constexpr(v)  # np.float16, np.dtype("float16"): sp.f16, as specialization takes them
        return v if dtype is None else dtype
    return bool(c.value) if c.dtype.is_bool else _Typed(c.dtype.name, c.value)


def _constexpr_kind(v: Any) -> type | str:
    if isinstance(v, bool | np.bool_):
        return bool
    if isinstance(v, _Typed):  # np.int8(3) is i8's 3, not Python's 3
        return v.type_name
    if isinstance(v, np.generic) and not isinstance(v, str | bytes):
        return type(v)
    if isinstance(v, numbers.Integral):
        return int
    if isinstance(v, float | np.floating):
        return float
    return tuple if isinstance(v, list) else type(v)


def _same_constexpr(value: Any, expected: Any) -> bool:
    value, expected = _typed(value), _typed(expected)
    kind = _constexpr_kind(value)
    if kind != _constexpr_kind(expected):
        return False
    if kind is tuple:
        return len(value) == len(expected) and all(_same_constexpr(a, b) for a, b in zip(value, expected))
    if isinstance(kind, str):
        return _same_constexpr(value.value, expected.value)  # (by float bits: i8's 3 is not 3.0)
    if kind is float or (issubclass(kind, np.generic) and not issubclass(kind, np.integer)):
        value, expected = float(value), float(expected)
        if value != value:  # NaN: the value a kernel compiled for NaN was given again
            return expected != expected
        return bool(value == expected) and math.copysign(1.0, value) == math.copysign(1.0, expected)
    return bool(value == expected)


@dataclass(frozen=True)
class ArrayParam:
    """An array argument the kernel does not receive itself: only parameters derived from it
    (shapes, strides, tensor maps) are passed. Checked and staged like a pointer argument."""

    name: str
    dtype: str
    readonly: bool = False
    contiguous: bool = False
    kind: ClassVar[str] = "array"


@dataclass(frozen=True)
class DerivedParam:
    """A kernel parameter the launcher fills in from another argument's array: its ``shape`` or
    ``stride`` (in elements) along ``dim`` (negative counts from the end). Not a user argument."""

    name: str
    source: str
    attribute: str  # "shape" | "stride"
    dim: int
    dtype: str = "i32"
    kind: ClassVar[str] = "derived"

    @property
    def slot(self) -> tuple[int, int]:
        size = dtype_info(self.dtype).itemsize
        return size, size


@dataclass(frozen=True)
class ParamSpec:
    """The kernel's parameters in declaration order. ``user_params``: what the caller passes
    (everything but derived parameters); ``kernel_params``: what the kernel receives
    (everything but constexpr and array-only parameters), each with a slot in the parameter
    buffer. Tensor-map parameters are :class:`sparsile.backend.runtime.tensormap.TensorMapParam` (kind
    ``"tensormap"``); one with a ``source`` is derived from that argument's array."""

    params: tuple[Any, ...]
    kernel_name: str = "kernel"

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        names = [p.name for p in self.params]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InternalError(f"parameter spec of `{self.kernel_name}` repeats {', '.join(dupes)}")
        by_name = {p.name: p for p in self.params}
        for p in self.params:
            if p.kind not in ("pointer", "scalar", "constexpr", "derived", "tensormap", "array"):
                raise InternalError(f"unknown parameter kind {p.kind!r} for `{p.name}`")
            if p.kind != "constexpr":
                dtype_info(p.dtype)
            if p.kind == "scalar" and p.dtype in ("e4m3", "e5m2"):
                raise InternalError(f"scalar parameter `{p.name}` cannot be {p.dtype}")
            if not is_derived(p):
                continue
            src = by_name.get(p.source)
            if src is None or is_derived(src) or src.kind not in ("pointer", "tensormap", "array"):
                raise InternalError(f"derived parameter `{p.name}` must read an array argument (pointer, "
                                    f"array or tensor map), not `{p.source}`")
            if p.kind == "derived" and (p.attribute not in ("shape", "stride")
                                        or dtype_info(p.dtype).category not in ("int", "uint")):
                raise InternalError(f"derived parameter `{p.name}` must read a shape or stride into an integer")
            if p.kind == "tensormap" and src.kind == "tensormap":
                raise InternalError(f"tensor map `{p.name}` cannot be derived from another tensor map")

    @property
    def user_params(self) -> tuple[Any, ...]:
        return tuple(p for p in self.params if not is_derived(p))

    @property
    def kernel_params(self) -> tuple[Any, ...]:
        return tuple(p for p in self.params if p.kind not in ("constexpr", "array"))


def is_derived(param: Any) -> bool:
    """Derived parameters are filled in by the launcher, not passed by the caller."""
    return param.kind == "derived" or (param.kind == "tensormap" and getattr(param, "source", None) is not None)


# ---------------------------------------------------------------------------------------------
# Binding positional and keyword arguments

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class ArgumentBinder:
    """Maps ``(args, kwargs)`` onto the user parameters of a spec, like a Python call would."""

    def __init__(self, spec: ParamSpec):
        self.kernel_name = spec.kernel_name
        users = spec.user_params
        self.names: tuple[str, ...] = tuple(p.name for p in users)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.optional = tuple(p.kind == "constexpr" for p in users)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> Sequence[Any]:
        n = len(self.names)
        if not kwargs and len(args) == n:
            return args
        if len(args) > n:
            raise LaunchError(ARG_COUNT, f"kernel `{self.kernel_name}` takes {n} argument"
                              f"{'s' if n != 1 else ''} ({', '.join(self.names)}), got {len(args)}",
                              "remove the extra arguments")
        values = list(args) + [MISSING] * (n - len(args))
        for key, value in (kwargs or {}).items():
            i = self.index.get(key)
            if i is None:
                raise LaunchError(ARG_KEYWORD, f"kernel `{self.kernel_name}` has no parameter `{key}`",
                                  f"its parameters are: {', '.join(self.names)}")
            if values[i] is not MISSING:
                raise LaunchError(ARG_KEYWORD, f"argument `{key}` of kernel `{self.kernel_name}` is "
                                  "given both by position and by keyword")
            values[i] = value
        missing = [name for name, v, opt in zip(self.names, values, self.optional)
                   if v is MISSING and not opt]
        if missing:
            listed = ", ".join(f"`{m}`" for m in missing)
            raise LaunchError(ARG_COUNT, f"kernel `{self.kernel_name}` is missing argument"
                              f"{'s' if len(missing) > 1 else ''} {listed}",
                              f"its parameters are: {', '.join(self.names)}")
        return values


def derived_value(param: DerivedParam, info: ArrayInfo) -> int:
    """The shape or stride (elements) a :class:`DerivedParam` reads from its source array."""
    rank = len(info.shape)
    if not -rank <= param.dim < rank:
        raise LaunchError(ARG_SHAPE, f"argument `{param.source}` has rank {rank}, but the kernel reads "
                          f"its {param.attribute} along dimension {param.dim}")
    return (info.shape if param.attribute == "shape" else info.strides)[param.dim]


# ---------------------------------------------------------------------------------------------
# Parameter buffer


@dataclass(frozen=True)
class SlotLayout:
    """Byte offsets of the kernel parameters inside one buffer, each aligned to its own
    alignment (the driver reads parameter i from ``kernelParams[i]``, so the buffer layout is
    ours; the 64-byte alignment of a tensor map follows the CUtensorMap rule, docs/hardware.md §5.1)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int


def layout_slots(slots: Sequence[tuple[int, int]]) -> SlotLayout:
    offsets, offset = [], 0
    for size, align in slots:
        offset = (offset + align - 1) // align * align
        offsets.append(offset)
        offset += size
    return SlotLayout(tuple(offsets), tuple(size for size, _ in slots), offset)


class ParamBuffer:
    """Preallocated storage for the kernel parameters plus the ``void*`` array pointing at each
    slot; ``address`` is what ``cuLaunchKernel``'s ``kernelParams`` takes (an int)."""

    BASE_ALIGN = 64

    def __init__(self, layout: SlotLayout):
        self.layout = layout
        size = max(layout.total, 1)
        self._raw = (ctypes.c_ubyte * (size + self.BASE_ALIGN))()
        base = ctypes.addressof(self._raw)
        shift = (-base) % self.BASE_ALIGN
        self.base = base + shift
        self.view = memoryview(self._raw).cast("B")[shift:shift + size]
        count = max(len(layout.offsets), 1)
        self._pointers = (ctypes.c_void_p * count)(*[self.base + off for off in layout.offsets])
        self.address = ctypes.addressof(self._pointers) if layout.offsets else 0

    def slot_bytes(self, index: int) -> bytes:
        off = self.layout.offsets[index]
        return bytes(self.view[off:off + self.layout.sizes[index]])
