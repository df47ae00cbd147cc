"""Launch arguments: the kernel's parameter kinds, array/scalar conversion, checks and packing.

Everything here is pure Python (no CUDA calls), so that it is unit-tested without a GPU; the
device limits it checks against are passed in as data (:class:`sparsile.backend.runtime.DeviceInfo`
or any object with the same attributes). :mod:`sparsile.backend.runtime` drives it.

Where arrays come from
    * numpy arrays and other **host** memory (a CPU torch tensor, a CPU DLPack export) are copied
      to the device before the launch and back after it (unless the parameter is read-only); the
      launch then synchronizes. A launcher built with ``allow_host_copies=False`` refuses them.
    * torch CUDA tensors, ``__cuda_array_interface__`` objects (CuPy, Numba, torch) and
      ``__dlpack__`` objects on a CUDA device (torch, JAX, CuPy) are used **in place**.
    * a Python int is taken as a raw device address (no checks possible).

Launch error codes (raised as :class:`~sparsile.frontend.diagnostics.LaunchError`):

======  ===================================================================
SP0701  wrong number of arguments (missing or too many)
SP0702  unknown keyword argument, or a value given twice
SP0703  pointer argument of the wrong dtype (or a dtype the language lacks)
SP0704  pointer not 16-byte aligned although the kernel was specialized for it
SP0705  non-contiguous array where contiguity is required
SP0706  host memory where device memory is required
SP0707  array on another device (or a non-CUDA device)
SP0708  argument of an unsupported kind (not an array / not a number)
SP0709  scalar out of range for its type, or violating a specialization (divisibility)
SP0710  grid: zero, negative, non-integer or beyond the device limits
SP0711  block: more threads than the device or the compiled kernel allows
SP0712  shared memory beyond the device's opt-in limit
SP0713  cluster dimensions invalid for the device or the grid
SP0714  tensor-map description violates a TMA rule (``tensormap.py``)
SP0715  a CUDA driver call failed (``runtime.CudaError``)
SP0716  no usable GPU / CUDA driver
SP0717  invalid ``stream=`` argument
SP0718  constexpr argument differs from the value the kernel was compiled for
SP0719  read-only array passed to a parameter the kernel writes
SP0720  array rank/shape does not match what the kernel parameter needs
SP0721  kernel name not found in the loaded module
SP0722  parameter annotation the launcher cannot pass (``frontend/sema/specialize.py``)
SP0723  constexpr argument of a kind that cannot be a compile-time constant
SP0724  malformed ahead-of-time signature (``name=type`` / ``name=value`` items)
SP0750  host arrays that overlap without being the same memory, one of them written (copies would
        hide the writes from each other)
======  ===================================================================
"""

from __future__ import annotations

import ctypes
import math
import numbers
import operator
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import numpy as np

from ...frontend.diagnostics import InternalError, LaunchError
from . import dlpack

if TYPE_CHECKING:
    from . import DeviceInfo

ARG_COUNT = "SP0701"
ARG_KEYWORD = "SP0702"
ARG_DTYPE = "SP0703"
ARG_ALIGNMENT = "SP0704"
ARG_CONTIGUOUS = "SP0705"
ARG_HOST_MEMORY = "SP0706"
ARG_DEVICE = "SP0707"
ARG_KIND = "SP0708"
ARG_RANGE = "SP0709"
GRID = "SP0710"
BLOCK = "SP0711"
SHARED_MEMORY = "SP0712"
CLUSTER = "SP0713"
TENSOR_MAP = "SP0714"
DRIVER = "SP0715"
NO_GPU = "SP0716"
STREAM = "SP0717"
CONSTEXPR = "SP0718"
READ_ONLY = "SP0719"
ARG_SHAPE = "SP0720"
KERNEL_NOT_FOUND = "SP0721"
ARG_OVERLAP = "SP0750"

# ---------------------------------------------------------------------------------------------
# dtypes


@dataclass(frozen=True)
class DTypeInfo:
    """One element type of the language: its size, class, numpy spelling and scalar packing
    (``struct`` format; bf16 is packed by hand)."""

    name: str
    bits: int
    category: str  # "int", "uint", "float", "bool"
    numpy_name: str
    struct_format: str

    @property
    def itemsize(self) -> int:
        return self.bits // 8


DTYPES: dict[str, DTypeInfo] = {d.name: d for d in (
    DTypeInfo("bool", 8, "bool", "bool", "<?"),
    DTypeInfo("i8", 8, "int", "int8", "<b"), DTypeInfo("u8", 8, "uint", "uint8", "<B"),
    DTypeInfo("i16", 16, "int", "int16", "<h"), DTypeInfo("u16", 16, "uint", "uint16", "<H"),
    DTypeInfo("i32", 32, "int", "int32", "<i"), DTypeInfo("u32", 32, "uint", "uint32", "<I"),
    DTypeInfo("i64", 64, "int", "int64", "<q"), DTypeInfo("u64", 64, "uint", "uint64", "<Q"),
    DTypeInfo("f16", 16, "float", "float16", "<e"), DTypeInfo("bf16", 16, "float", "bfloat16", "<H"),
    DTypeInfo("f32", 32, "float", "float32", "<f"), DTypeInfo("tf32", 32, "float", "float32", "<f"),
    DTypeInfo("f64", 64, "float", "float64", "<d"),
    DTypeInfo("e4m3", 8, "float", "float8_e4m3fn", "<B"), DTypeInfo("e5m2", 8, "float", "float8_e5m2", "<B"),
)}

_ARRAY_DTYPE_ALIASES = {"tf32": "f32"}
"""tf32 values live in f32 storage, so a ``ptr[tf32]`` takes an f32 array."""

_NUMPY_NAMES = {d.numpy_name: d.name for d in DTYPES.values() if d.name != "tf32"}
_numpy_dtype_cache: dict[np.dtype, str | None] = {}


def dtype_info(name: str) -> DTypeInfo:
    try:
        return DTYPES[name]
    except KeyError:
        raise InternalError(f"unknown dtype {name!r} in a launcher parameter spec") from None


def numpy_dtype(name: str) -> np.dtype:
    """The host dtype holding values of ``name`` (ml_dtypes for bf16 and the 8-bit floats)."""
    info = dtype_info(name)
    if info.numpy_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, info.numpy_name))
    return np.dtype(info.numpy_name)


def dtype_from_numpy(dt: np.dtype) -> str | None:
    """The language dtype of a numpy (or ml_dtypes) dtype, or None."""
    try:
        return _numpy_dtype_cache[dt]
    except KeyError:
        pass
    dt = np.dtype(dt)
    name = _NUMPY_NAMES.get(dt.name) if dt.isnative or dt.itemsize == 1 else None
    _numpy_dtype_cache[dt] = name
    return name


_TORCH_NAMES = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16",
                "torch.float64": "f64", "torch.int8": "i8", "torch.uint8": "u8", "torch.int16": "i16",
                "torch.uint16": "u16", "torch.int32": "i32", "torch.uint32": "u32", "torch.int64": "i64",
                "torch.uint64": "u64", "torch.bool": "bool", "torch.float8_e4m3fn": "e4m3",
                "torch.float8_e5m2": "e5m2"}
_torch_dtype_cache: dict[Any, tuple[str | None, str]] = {}


def _torch_dtype(torch_dtype: Any) -> tuple[str | None, str]:
    """``(language dtype or None, readable label)`` of a torch dtype, cached."""
    try:
        return _torch_dtype_cache[torch_dtype]
    except KeyError:
        text = str(torch_dtype)
        entry = _torch_dtype_cache[torch_dtype] = (_TORCH_NAMES.get(text), text.removeprefix("torch."))
        return entry


def dtype_from_torch(torch_dtype: Any) -> str | None:
    """The language dtype of a torch dtype (by its ``str``, so torch need not be imported)."""
    return _torch_dtype(torch_dtype)[0]


def array_dtype_matches(param_dtype: str, array_dtype: str | None) -> bool:
    return array_dtype == _ARRAY_DTYPE_ALIASES.get(param_dtype, param_dtype)


# ---------------------------------------------------------------------------------------------
# Scalars


def _int_range(info: DTypeInfo) -> tuple[int, int]:
    if info.category == "bool":
        return 0, 1
    if info.category == "uint":
        return 0, (1 << info.bits) - 1
    return -(1 << (info.bits - 1)), (1 << (info.bits - 1)) - 1


def _bf16_bits(value: float) -> int:
    """Round-to-nearest-even f64 -> bf16 bit pattern (one rounding step: exact rational
    arithmetic via the f64's integer mantissa would be needed only for f64 ties that f32 cannot
    hold; going through f32 first would double-round, so the rounding is done on the f64 bits)."""
    if math.isnan(value):
        return 0x7FC0
    bits64 = struct.unpack("<Q", struct.pack("<d", value))[0]
    sign = (bits64 >> 63) & 1
    magnitude = abs(value)
    if magnitude == 0.0:
        return sign << 15
    if math.isinf(magnitude):
        return (sign << 15) | 0x7F80
    mantissa, exponent = math.frexp(magnitude)  # magnitude = mantissa * 2**exponent, 0.5 <= m < 1
    if exponent > 128:  # >= 2**128: beyond every finite bf16 even before rounding
        return (sign << 15) | 0x7F80
    # bf16: 8 significant bits for normals (exponent >= -125), fewer for subnormals.
    e_min = -125
    precision = 8 if exponent >= e_min else 8 - (e_min - exponent)
    if precision < 0:  # below half the smallest subnormal (2**-134): rounds to zero
        return sign << 15
    scaled = mantissa * (1 << precision)  # exact in f64
    rounded = round(scaled)  # Python rounds half to even
    if rounded == 0:
        return sign << 15
    result = math.ldexp(rounded, exponent - precision)
    if result > 3.3895313892515355e38:  # above the largest finite bf16 after rounding
        return (sign << 15) | 0x7F80
    f32_bits = struct.unpack("<I", struct.pack("<f", result))[0]  # exact: result fits in bf16
    return (sign << 15) | ((f32_bits >> 16) & 0x7FFF)


def encode_scalar(dtype: str, value: Any, name: str = "value") -> bytes:
    """The little-endian bytes of ``value`` as a kernel scalar of ``dtype``, with the range and
    kind checks of the launcher (SP0708 not a number, SP0709 out of range)."""
    info = dtype_info(dtype)
    if info.category == "float":
        number = _to_float(value, name, dtype)
        if dtype == "bf16":
            bits = _bf16_bits(number)
            if bits & 0x7FFF == 0x7F80 and math.isfinite(number):
                raise _overflow(name, value, dtype)
            return struct.pack("<H", bits)
        if dtype in ("e4m3", "e5m2"):
            raise LaunchError(ARG_KIND, f"argument `{name}`: 8-bit float scalars ({dtype}) cannot be "
                              "kernel parameters", "pass the value as f16 or f32 and convert in the kernel")
        try:
            return struct.pack(info.struct_format, number)
        except OverflowError:
            raise _overflow(name, value, dtype) from None
    number = _to_int(value, name, dtype)
    low, high = _int_range(info)
    if not low <= number <= high:
        raise LaunchError(ARG_RANGE, f"argument `{name}` = {number} does not fit in {dtype} "
                          f"(range {low}..{high})", f"pass a value in {low}..{high}")
    return struct.pack(info.struct_format, number)


def _to_int(value: Any, name: str, dtype: str) -> int:
    if isinstance(value, (float, complex, np.floating)):
        raise LaunchError(ARG_KIND, f"argument `{name}` expects an integer ({dtype}), got "
                          f"{type(value).__name__} {value!r}", "pass an int (round it explicitly)")
    try:
        return operator.index(value)
    except TypeError:
        raise LaunchError(ARG_KIND, f"argument `{name}` expects an integer ({dtype}), got "
                          f"{_describe_value(value)}") from None


def _to_float(value: Any, name: str, dtype: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        return float(value)
    raise LaunchError(ARG_KIND, f"argument `{name}` expects a number ({dtype}), got {_describe_value(value)}")


def _overflow(name: str, value: Any, dtype: str) -> LaunchError:
    return LaunchError(ARG_RANGE, f"argument `{name}` = {value!r} overflows {dtype}",
                       "pass a smaller value, or use a wider scalar type in the kernel")


def scalar_writer(p: Any, offset: int, view: Any) -> Callable[[Any, Any], None]:
    """A converter ``(value, call)`` packing scalar parameter ``p`` (a :class:`ScalarParam`) into
    ``view[offset:]``: Python ints and floats in range are packed directly, anything else goes
    through :func:`encode_scalar` (which raises SP0708/SP0709); an integer the specialization
    assumed divisible is checked (SP0709)."""
    name, dtype, divisor = p.name, p.dtype, p.divisible_by
    info = DTYPES[dtype]
    size = info.itemsize
    packer = struct.Struct(info.struct_format)
    if info.category in ("int", "uint"):
        low, high = _int_range(info)

        def convert_int(value: Any, call: Any) -> None:
            if type(value) is not int or not low <= value <= high:
                view[offset:offset + size] = encode_scalar(dtype, value, name)  # checks and raises
                value = int(value)
            if divisor > 1:
                check_divisible(name, value, divisor)
            packer.pack_into(view, offset, value)

        return convert_int
    if dtype in ("f32", "tf32", "f64"):
        def convert_float(value: Any, call: Any) -> None:
            if type(value) is float:
                try:
                    packer.pack_into(view, offset, value)
                    return
                except OverflowError:
                    pass
            view[offset:offset + size] = encode_scalar(dtype, value, name)

        return convert_float

    def convert_other(value: Any, call: Any) -> None:
        view[offset:offset + size] = encode_scalar(dtype, value, name)

    return convert_other


def _describe_value(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"


# ---------------------------------------------------------------------------------------------
# Parameter kinds and the parameter spec


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


# ---------------------------------------------------------------------------------------------
# Describing array arguments

HOST = -1
"""``ArrayInfo.device`` of host memory."""
UNKNOWN_DEVICE = -2
"""A CUDA pointer whose device must be asked from the driver (``__cuda_array_interface__``)."""
FOREIGN_DEVICE = -3
"""Memory of a non-CUDA device (MPS, ROCm, XLA...)."""
ANY_DEVICE = -4
"""CUDA managed memory: usable from every device."""


class ArrayInfo(NamedTuple):
    """What the launcher needs to know about an array argument (a NamedTuple: cheap to build on
    every launch). ``strides`` are in elements; ``host`` is a numpy view of host memory (the
    source/target of the copies) or None for device memory; ``stream`` is the producer stream a
    ``__cuda_array_interface__`` asks us to order after; ``keepalive`` holds a DLPack capsule."""

    ptr: int
    dtype: str | None
    dtype_label: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    contiguous: bool
    device: int
    device_label: str
    readonly: bool
    source: str
    stream: int | None = None
    host: np.ndarray | None = None
    keepalive: Any = None

    @property
    def nbytes(self) -> int:
        itemsize = DTYPES[self.dtype].itemsize if self.dtype else 0
        return math.prod(self.shape) * itemsize


def is_c_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major dense (strides in elements); extents of 1 may carry any stride."""
    expected = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent == 0:
            return True
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def host_view(ptr: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A writable numpy view of dense row-major host memory at ``ptr``."""
    dt = numpy_dtype(_ARRAY_DTYPE_ALIASES.get(dtype, dtype))
    count = math.prod(shape)
    if count == 0 or ptr == 0:
        return np.empty(shape, dtype=dt)
    raw = (ctypes.c_ubyte * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def _describe_numpy(arr: np.ndarray, stream: int) -> ArrayInfo:
    itemsize = arr.itemsize or 1
    label = arr.dtype.name if arr.dtype.isnative else f"{arr.dtype.name} (byte-swapped)"
    return ArrayInfo(arr.ctypes.data, dtype_from_numpy(arr.dtype), label, arr.shape,
                     tuple(s // itemsize for s in arr.strides), arr.flags.c_contiguous, HOST, "host",
                     not arr.flags.writeable, "numpy array", None, arr)


def _describe_torch(t: Any, stream: int) -> ArrayInfo:
    dtype, label = _torch_dtype(t.dtype)
    if t.is_cuda:
        index = t.get_device()
        return ArrayInfo(t.data_ptr(), dtype, label, tuple(t.shape), tuple(t.stride()), t.is_contiguous(),
                         index, f"cuda:{index}", False, "torch tensor")
    device = t.device
    if device.type != "cpu":
        return ArrayInfo(t.data_ptr(), dtype, label, tuple(t.shape), tuple(t.stride()), t.is_contiguous(),
                         FOREIGN_DEVICE, str(device), False, "torch tensor")
    shape, contiguous = tuple(t.shape), t.is_contiguous()
    view = host_view(t.data_ptr(), dtype, shape) if contiguous and dtype else None
    return ArrayInfo(t.data_ptr(), dtype, label, shape, tuple(t.stride()), contiguous, HOST, "cpu",
                     False, "CPU torch tensor", None, view, t)


def is_torch_type(cls: type) -> bool:
    """Whether instances of ``cls`` are described as torch tensors."""
    return _extractors.get(cls) is _describe_torch


def torch_device_pointer(t: Any, device: int, dtype: str, contiguous: bool) -> int | None:
    """The launcher's fast path for a torch tensor: its data pointer when it is a CUDA tensor on
    ``device`` of language dtype ``dtype`` (and dense when ``contiguous``), else None (the
    caller then takes the general path, which also produces the error message)."""
    if t.is_cuda and t.get_device() == device and _torch_dtype(t.dtype)[0] == dtype and (
            not contiguous or t.is_contiguous()):
        return t.data_ptr()
    return None


def _describe_cai(obj: Any, stream: int) -> ArrayInfo:
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # e.g. torch raises for bfloat16: DLPack describes those
        if hasattr(type(obj), "__dlpack__"):
            return _describe_dlpack(obj, stream)
        raise
    if cai.get("mask") is not None:
        raise LaunchError(ARG_KIND, f"masked {type(obj).__name__} arrays are not supported")
    dt = np.dtype(cai["typestr"])
    dtype = dtype_from_numpy(dt)
    if dtype is None and hasattr(type(obj), "__dlpack__"):
        return _describe_dlpack(obj, stream)
    shape = tuple(int(s) for s in cai["shape"])
    ptr, readonly = cai["data"]
    itemsize = dt.itemsize or 1
    byte_strides = cai.get("strides")
    if byte_strides is None:
        strides, contiguous = dlpack.compact_strides(shape), True
    else:
        strides = tuple(int(s) // itemsize for s in byte_strides)
        contiguous = all(int(s) % itemsize == 0 for s in byte_strides) and is_c_contiguous(shape, strides)
    return ArrayInfo(int(ptr or 0), dtype, dt.name, shape, strides, contiguous, UNKNOWN_DEVICE, "cuda",
                     bool(readonly), f"{type(obj).__name__} (__cuda_array_interface__)", cai.get("stream"))


def _describe_dlpack(obj: Any, stream: int) -> ArrayInfo:
    try:
        t = dlpack.from_object(obj, stream)
    except (dlpack.DLPackError, BufferError, RuntimeError, ValueError) as exc:
        raise LaunchError(ARG_KIND, f"could not read {type(obj).__name__} through DLPack: {exc}") from None
    contiguous = is_c_contiguous(t.shape, t.strides)
    source = f"{type(obj).__name__} (DLPack)"
    if t.is_host:
        view = host_view(t.data, t.dtype, t.shape) if contiguous and t.dtype else None
        return ArrayInfo(t.data, t.dtype, t.dtype_label, t.shape, t.strides, contiguous, HOST,
                         t.device_label, t.readonly, source, None, view, (t.capsule, obj))
    if t.device_type == dlpack.DEVICE_CUDA:
        device = t.device_id
    elif t.device_type == dlpack.DEVICE_CUDA_MANAGED:
        device = ANY_DEVICE
    else:
        device = FOREIGN_DEVICE
    return ArrayInfo(t.data, t.dtype, t.dtype_label, t.shape, t.strides, contiguous, device, t.device_label,
                     t.readonly, source, None, None, t.capsule)


def _not_an_array(value: Any, stream: int) -> ArrayInfo | None:
    # Objects may carry the protocol as an instance attribute (a common Numba-docs pattern).
    if hasattr(value, "__cuda_array_interface__"):
        return _describe_cai(value, stream)
    return None


_extractors: dict[type, Callable[[Any, int], ArrayInfo | None]] = {}


def _choose_extractor(cls: type) -> Callable[[Any, int], ArrayInfo | None]:
    if issubclass(cls, np.ndarray):
        return _describe_numpy
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(cls, torch.Tensor):
        return _describe_torch
    if hasattr(cls, "__cuda_array_interface__"):
        return _describe_cai
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _describe_dlpack
    return _not_an_array


def register_array_type(cls: type, extractor: Callable[[Any, int], ArrayInfo | None]) -> None:
    """Describe instances of exactly ``cls`` with ``extractor`` (the runtime registers its
    ``DeviceBuffer`` this way, skipping the generic protocols)."""
    _extractors[cls] = extractor


def describe_array(value: Any, stream: int = 0) -> ArrayInfo | None:
    """Describe an array-like argument, or None if ``value`` is not one. ``stream`` is the launch
    stream handle (DLPack producers order their pending work before it)."""
    cls = type(value)
    extractor = _extractors.get(cls)
    if extractor is None:
        extractor = _extractors[cls] = _choose_extractor(cls)
    return extractor(value, stream)


# ---------------------------------------------------------------------------------------------
# Checks on array arguments


def check_array_argument(name: str, dtype: str, info: ArrayInfo, *, device: int, allow_host: bool,
                         writes: bool, aligned16: bool = False, contiguous: bool = True) -> None:
    """All checks of an array passed for a ``ptr[dtype]`` (or tensor-map) parameter of a kernel
    that runs on CUDA device ``device``; raises the first violation."""
    if not array_dtype_matches(dtype, info.dtype):
        expected = dtype_info(_ARRAY_DTYPE_ALIASES.get(dtype, dtype)).numpy_name
        raise LaunchError(ARG_DTYPE, f"argument `{name}` expects a pointer to {dtype}, got a "
                          f"{info.dtype_label} {info.source}", f"convert it to {expected} first")
    if info.readonly and writes:
        raise LaunchError(READ_ONLY, f"argument `{name}` is a read-only {info.source}, but the kernel "
                          "writes through it", "pass a writable copy")
    if info.device == HOST:
        if not allow_host:
            raise LaunchError(ARG_HOST_MEMORY, f"argument `{name}` is a {info.source} in host memory, but "
                              "this launcher uses device memory in place only",
                              "move it to the GPU first (torch: x.cuda(), cupy: cupy.asarray(x)) or build "
                              "the launcher with allow_host_copies=True")
        if not info.contiguous or info.host is None:
            raise LaunchError(ARG_CONTIGUOUS, f"argument `{name}` is a non-contiguous host array; host "
                              "arrays are copied to the device and must be C-contiguous",
                              "pass np.ascontiguousarray(x) (and copy results back yourself)")
        return
    if info.device == FOREIGN_DEVICE:
        raise LaunchError(ARG_DEVICE, f"argument `{name}` lives on {info.device_label}, not on a CUDA "
                          "device", "move it to the CUDA device the kernel runs on")
    if info.device >= 0 and info.device != device:
        raise LaunchError(ARG_DEVICE, f"argument `{name}` is on cuda:{info.device} but the kernel runs on "
                          f"cuda:{device}", f"move it to cuda:{device} (or load the kernel on "
                          f"cuda:{info.device})")
    if contiguous and not info.contiguous:
        raise LaunchError(ARG_CONTIGUOUS, f"argument `{name}` is not contiguous (shape {info.shape}, "
                          f"strides {info.strides} elements)", "pass a contiguous copy (x.contiguous())")
    if aligned16 and info.ptr % 16:
        raise LaunchError(ARG_ALIGNMENT, f"argument `{name}` points to {info.ptr:#x}, which is not "
                          "16-byte aligned, but the kernel was specialized assuming 16-byte alignment",
                          "pass an array whose data starts on a 16-byte boundary (a fresh allocation, "
                          "or a slice at a multiple of 16 bytes)")


def _byte_range(a: np.ndarray) -> tuple[int, int]:
    """(first byte, one past the last byte) of the memory a numpy array spans."""
    lo = hi = a.__array_interface__["data"][0]
    if a.size == 0:
        return lo, hi
    for n, st in zip(a.shape, a.strides, strict=True):
        lo, hi = lo + min(0, (n - 1) * st), hi + max(0, (n - 1) * st)
    return lo, hi + a.itemsize


def shared_host_copy(staged: Sequence[tuple[str, np.ndarray, bool]], name: str, host: np.ndarray,
                     writes: bool) -> int | None:
    """Where the host array ``host`` (argument ``name``) goes among the host arrays
    already staged for this launch, ``(name, array, written)`` each: the index of one covering the
    very same bytes (share its device copy, as the GPU would share the memory), or None (a copy of
    its own). Bytes shared only in part, with either written, are LaunchError SP0750: two copies
    would hide the writes through one from the other, and the last copied back would win."""
    lo, hi = _byte_range(host)
    for i, (other, array, written) in enumerate(staged):
        a, b = _byte_range(array)
        if hi > lo and (a, b) == (lo, hi) and (array.strides == host.strides or (array.flags.c_contiguous
                                               and host.flags.c_contiguous)):
            return i
        if a < hi and lo < b and (writes or written):
            raise LaunchError(ARG_OVERLAP, f"host arrays `{other}` and `{name}` overlap in memory but are not "
                              "the same array, and the kernel writes "
                              f"`{name if writes else other}`; each host array is copied to the device on "
                              "its own, so the writes would be lost",
                              "pass the same array for both, or separate arrays (e.g. `y.copy()`)")
    return None


def check_divisible(name: str, value: int, divisor: int) -> None:
    if divisor > 1 and value % divisor:
        raise LaunchError(ARG_RANGE, f"argument `{name}` = {value} is not a multiple of {divisor}, but the "
                          f"kernel was specialized assuming it is",
                          "pass a multiple, or recompile the kernel for this value")


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


# ---------------------------------------------------------------------------------------------
# Grid, block, shared memory, cluster, stream


def _dims(value: Any, what: str, code: str) -> tuple[int, int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        items = [int(value)]
    elif isinstance(value, Sequence) and not isinstance(value, str) and 1 <= len(value) <= 3:
        items = list(value)
    else:
        raise LaunchError(code, f"{what} must be an int or a tuple of 1 to 3 ints, got "
                          f"{_describe_value(value)}")
    for item in items:
        if not isinstance(item, numbers.Integral) or isinstance(item, bool):
            raise LaunchError(code, f"{what} {tuple(items)} contains the non-integer {item!r}")
    dims = [int(i) for i in items] + [1] * (3 - len(items))
    return dims[0], dims[1], dims[2]


def normalize_grid(grid: Any, limits: DeviceInfo) -> tuple[int, int, int]:
    """``grid`` as ``(x, y, z)``, checked against the device's maximum grid dimensions."""
    dims = _dims(grid, "grid", GRID)
    for axis, (n, most) in enumerate(zip(dims, limits.max_grid_dims)):
        if n < 1:
            raise LaunchError(GRID, f"grid {dims} has {n} blocks along {'xyz'[axis]}; every dimension "
                              "must be at least 1", "launch nothing instead of a zero-sized grid")
        if n > most:
            raise LaunchError(GRID, f"grid {dims} exceeds the device limit along {'xyz'[axis]} "
                              f"({n} > {most} on {limits.name})",
                              "use a persistent kernel or move work to another grid dimension")
    return dims


def normalize_block(block: Any, limits: DeviceInfo, kernel_max_threads: int | None = None
                    ) -> tuple[int, int, int]:
    """``block`` as ``(x, y, z)``, checked against the device and the compiled kernel's maximum
    threads per block (lower than the device's when the kernel uses many registers)."""
    dims = _dims(block, "block", BLOCK)
    for axis, (n, most) in enumerate(zip(dims, limits.max_block_dims)):
        if n < 1 or n > most:
            raise LaunchError(BLOCK, f"block {dims} has {n} threads along {'xyz'[axis]}; the device "
                              f"allows 1..{most}")
    threads = math.prod(dims)
    if threads > limits.max_threads_per_block:
        raise LaunchError(BLOCK, f"block {dims} has {threads} threads; {limits.name} allows at most "
                          f"{limits.max_threads_per_block} per block", "use fewer warps")
    if kernel_max_threads is not None and threads > kernel_max_threads:
        raise LaunchError(BLOCK, f"block {dims} has {threads} threads, but the compiled kernel can run at "
                          f"most {kernel_max_threads} per block (register usage)",
                          "use fewer warps or reduce register pressure")
    return dims


def check_shared_memory(static_bytes: int, dynamic_bytes: int, limits: DeviceInfo) -> None:
    if dynamic_bytes < 0 or static_bytes < 0:
        raise LaunchError(SHARED_MEMORY, f"shared memory sizes must be >= 0 (static {static_bytes}, "
                          f"dynamic {dynamic_bytes})")
    total = static_bytes + dynamic_bytes
    if total > limits.max_shared_per_block_optin:
        raise LaunchError(SHARED_MEMORY, f"the kernel needs {total} bytes of shared memory per block "
                          f"({static_bytes} static + {dynamic_bytes} dynamic), but {limits.name} allows at "
                          f"most {limits.max_shared_per_block_optin}",
                          "use fewer pipeline stages or smaller tiles")


def check_cluster(cluster: Any, limits: DeviceInfo) -> tuple[int, int, int]:
    """Cluster dimensions, checked against the device (thread-block clusters need sm_90+ and at
    most ``max_cluster_size`` CTAs, 8 being the portable limit)."""
    dims = _dims(cluster, "cluster", CLUSTER)
    if min(dims) < 1:
        raise LaunchError(CLUSTER, f"cluster {dims} has a dimension below 1")
    size = math.prod(dims)
    if size > 1 and limits.max_cluster_size <= 1:
        major, minor = limits.compute_capability
        raise LaunchError(CLUSTER, f"{limits.name} (sm_{major}{minor}) does not support thread-block "
                          "clusters", "clusters need compute capability 9.0 or later")
    if size > limits.max_cluster_size:
        raise LaunchError(CLUSTER, f"cluster {dims} has {size} blocks; {limits.name} allows at most "
                          f"{limits.max_cluster_size}", "use a smaller cluster")
    return dims


def check_grid_fits_cluster(grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> None:
    for axis, (g, c) in enumerate(zip(grid, cluster)):
        if g % c:
            raise LaunchError(CLUSTER, f"grid {grid} is not a multiple of the cluster {cluster} along "
                              f"{'xyz'[axis]}", f"round the grid up to a multiple of {c} and mask the "
                              "extra blocks")


def stream_handle(stream: Any) -> int:
    """A ``CUstream`` handle as an int from None (legacy default stream, 0), an int, a driver
    ``CUstream``, a ``__cuda_stream__`` object (cuda.core), torch (``.cuda_stream``), CuPy
    (``.ptr``) or Numba (``.handle``) streams."""
    if stream is None:
        return 0
    handle: Any = None
    if isinstance(stream, numbers.Integral) and not isinstance(stream, bool):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = stream.__cuda_stream__()[1]
    elif hasattr(stream, "cuda_stream"):
        handle = stream.cuda_stream
    elif hasattr(stream, "ptr"):
        handle = stream.ptr
    elif hasattr(stream, "handle"):
        handle = stream.handle
        if isinstance(handle, ctypes.c_void_p):  # numba; None is its default stream
            handle = handle.value or 0
    elif type(stream).__name__ == "CUstream":  # cuda.bindings.driver.CUstream
        handle = int(stream)
    if not isinstance(handle, numbers.Integral) or isinstance(handle, bool) or handle < 0:
        raise LaunchError(STREAM, f"stream= expects a stream handle (int), a torch/CuPy/Numba stream or a "
                          f"CUstream, got {_describe_value(stream)}")
    return int(handle)
